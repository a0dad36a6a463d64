//! Reads of a process's `/proc` files that take its `mmap_lock`, bounded in time.
//!
//! `/proc/PID/cmdline` and `/proc/PID/maps` take the target's `mmap_lock` for
//! reading. When a thread of the target holds it across I/O that does not
//! complete (a page fault on a hung network mount, `mmap` behind a writer
//! waiting on a fault), every reader of those files waits too, for as long as
//! the I/O takes. Those are the processes plegwatch looks at: a read on the
//! scan loop would stop the scans of the very stall it reports.
//!
//! So each read runs on a thread of its own and is waited for up to a
//! deadline ([`DEADLINE`]). A read that misses it is left to finish on its
//! thread; until it returns, the same file of the same process is refused at
//! once (the loop pays the deadline once, not at every scan), and at most
//! [`MAX_STUCK`] reads may be outstanding in all.
//!
//! Hand-written: no crate bounds a blocking file read in time from synchronous
//! code. tokio's `spawn_blocking` with a timeout would, but only from a task,
//! and a stuck read would keep one of the runtime's blocking threads.

use std::{
    io,
    path::PathBuf,
    sync::{mpsc, Mutex},
    time::Duration,
};

/// How long the caller waits for one read.
pub const DEADLINE: Duration = Duration::from_millis(100);
/// Most reads outstanding (stuck past their deadline, or in progress) at once.
pub const MAX_STUCK: usize = 8;

/// The files being read now, by (process, file).
static IN_FLIGHT: Mutex<Vec<(u32, &'static str)>> = Mutex::new(Vec::new());
/// Reads that missed their deadline, since the start.
static TIMED_OUT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// `/proc/PID/FILE`'s bytes, or an error once `deadline` has passed.
pub fn proc_file(pid: u32, file: &'static str, deadline: Duration) -> io::Result<Vec<u8>> {
    read_within(PathBuf::from(format!("/proc/{pid}/{file}")), (pid, file), deadline)
}

/// How many reads missed their deadline since the start.
pub fn timed_out() -> u64 {
    TIMED_OUT.load(std::sync::atomic::Ordering::Relaxed)
}

/// Reads `path` on a thread of its own and waits up to `deadline`; `key` names
/// what is read, for refusing a second read while the first is stuck.
fn read_within(path: PathBuf, key: (u32, &'static str), deadline: Duration) -> io::Result<Vec<u8>> {
    {
        let mut in_flight = IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner());
        if in_flight.contains(&key) {
            return Err(io::Error::new(io::ErrorKind::WouldBlock, format!("an earlier read of {} has not returned yet", path.display())));
        }
        if in_flight.len() >= MAX_STUCK {
            return Err(io::Error::other(format!("{} reads of /proc have not returned: {} not read", in_flight.len(), path.display())));
        }
        in_flight.push(key);
    }
    let (tx, rx) = mpsc::sync_channel(1);
    let shown = path.display().to_string();
    let spawned = std::thread::Builder::new().name("proc-read".into()).spawn(move || {
        let read = std::fs::read(&path);
        IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner()).retain(|k| *k != key);
        // The caller may have given up: nobody to tell.
        let _ = tx.send(read);
    });
    if let Err(e) = spawned {
        IN_FLIGHT.lock().unwrap_or_else(|p| p.into_inner()).retain(|k| *k != key);
        return Err(io::Error::other(format!("no thread to read {shown}: {e}")));
    }
    match rx.recv_timeout(deadline) {
        Ok(read) => read,
        Err(_) => {
            TIMED_OUT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            tracing::warn!(
                file = %shown,
                deadline_ms = deadline.as_millis() as u64,
                "a /proc read did not return in time (the process's mmap_lock is held): left to finish on its own, not asked again until it does"
            );
            Err(io::Error::new(io::ErrorKind::TimedOut, format!("{shown} was not read within {} ms", deadline.as_millis())))
        }
    }
}

/// A process's arguments (`/proc/PID/cmdline`), empty when it could not be
/// read within [`DEADLINE`].
pub fn cmdline(pid: u32) -> Vec<String> {
    cmdline_within(pid, DEADLINE)
}

fn cmdline_within(pid: u32, deadline: Duration) -> Vec<String> {
    proc_file(pid, "cmdline", deadline)
        .map(|b| b.split(|c| *c == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
        .unwrap_or_default()
}

/// A process's mappings (`/proc/PID/maps`, read within [`DEADLINE`]), parsed
/// by the procfs crate.
pub fn maps(pid: u32) -> io::Result<::procfs::process::MemoryMaps> {
    maps_within(pid, DEADLINE)
}

fn maps_within(pid: u32, deadline: Duration) -> io::Result<::procfs::process::MemoryMaps> {
    let bytes = proc_file(pid, "maps", deadline)?;
    <::procfs::process::MemoryMaps as ::procfs::FromRead>::from_read(bytes.as_slice()).map_err(io::Error::other)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write as _;

    /// A FIFO nobody writes to blocks its reader in `open`, as a held
    /// `mmap_lock` blocks a reader of `cmdline`.
    #[test]
    fn a_stuck_read_is_given_up_then_refused_until_it_returns() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("fifo");
        rustix::fs::mkfifoat(rustix::fs::CWD, &fifo, rustix::fs::Mode::from_raw_mode(0o600)).expect("mkfifo");
        let key = (u32::MAX, "fifo");
        let before = timed_out();
        let first = read_within(fifo.clone(), key, Duration::from_millis(50));
        assert_eq!(first.as_ref().map_err(io::Error::kind).err(), Some(io::ErrorKind::TimedOut), "{first:?}");
        assert!(timed_out() > before);
        // Still stuck: refused at once, without a second thread.
        let again = read_within(fifo.clone(), key, Duration::from_secs(60));
        assert_eq!(again.as_ref().map_err(io::Error::kind).err(), Some(io::ErrorKind::WouldBlock), "{again:?}");
        // A writer comes: the stuck read returns, and the file can be read again.
        let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).expect("open the fifo for writing");
        w.write_all(b"hello").expect("write");
        drop(w);
        let until = std::time::Instant::now() + Duration::from_secs(60);
        while IN_FLIGHT.lock().unwrap().contains(&key) {
            assert!(std::time::Instant::now() < until, "the stuck read never returned");
            std::thread::sleep(Duration::from_millis(10));
        }
        let file = dir.path().join("plain");
        std::fs::write(&file, b"plain bytes").expect("write");
        assert_eq!(read_within(file, key, Duration::from_secs(60)).expect("read"), b"plain bytes");
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        // (A loaded machine may take longer than the loop's deadline: not what is tested.)
        let argv = cmdline_within(me, Duration::from_secs(60));
        assert_eq!(argv.first(), std::env::args().next().as_ref());
        let maps = maps_within(me, Duration::from_secs(60)).expect("maps");
        assert!(maps.iter().any(|m| m.perms.contains(::procfs::process::MMPermissions::EXECUTE)));
    }
}
