//! Pipes between a process and its children, from `/proc`: which pipe
//! inodes a process holds for reading (`/proc/PID/fd/N` → `pipe:[INO]`, the
//! access mode in `/proc/PID/fdinfo/N`'s `flags`), which of its children hold
//! the same inode for writing, and which of its threads are blocked in
//! `read()` on one (`/proc/TID/syscall`).
//!
//! Bounded: at most [`FDS_MAX`] fds of a process and [`CHILDREN_MAX`]
//! children are looked at. The caller caches the answer and asks only about
//! calls that have lasted a while.

use crate::graph::children::PipeLink;
use crate::observe::procfs::{self, SyscallState};
use std::{collections::HashMap, fs};

/// Most fds of one process looked at.
pub const FDS_MAX: usize = 1024;
/// Most children of one process looked at.
pub const CHILDREN_MAX: usize = 64;

const O_ACCMODE: u32 = 0o3;
const O_RDONLY: u32 = 0;
const O_WRONLY: u32 = 1;
const O_RDWR: u32 = 2;

/// The inode of a `pipe:[INO]` link target.
pub fn pipe_ino(link: &str) -> Option<u64> {
    link.strip_prefix("pipe:[")?.strip_suffix(']')?.parse().ok()
}

/// The `flags:` field (octal) of a `/proc/PID/fdinfo/N` text.
pub fn parse_fdinfo_flags(text: &str) -> Option<u32> {
    let v = text.lines().find_map(|l| l.strip_prefix("flags:"))?;
    u32::from_str_radix(v.trim(), 8).ok()
}

/// The `Pid:` field of a pidfd's `/proc/PID/fdinfo/N` (`-1` once the process is gone).
pub fn parse_fdinfo_pid(text: &str) -> Option<u32> {
    let v = text.lines().find_map(|l| l.strip_prefix("Pid:"))?;
    v.trim().parse::<i64>().ok().filter(|p| *p > 0).and_then(|p| u32::try_from(p).ok())
}

/// The process a pidfd of `pid` refers to.
pub fn pidfd_pid(pid: u32, fd: u32) -> Option<u32> {
    parse_fdinfo_pid(&fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?)
}

/// The pipe ends `pid` holds: (inode → fds open for reading, inode → fds open for writing).
type Ends = (HashMap<u64, Vec<u32>>, HashMap<u64, Vec<u32>>);

fn pipe_ends(pid: u32) -> Ends {
    let mut reads: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut writes: HashMap<u64, Vec<u32>> = HashMap::new();
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/fd")) else { return (reads, writes) };
    for e in dir.flatten().take(FDS_MAX) {
        let Some(fd) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Some(ino) = fs::read_link(e.path()).ok().and_then(|l| pipe_ino(l.to_str()?)) else { continue };
        let Some(flags) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok().and_then(|t| parse_fdinfo_flags(&t)) else {
            continue;
        };
        match flags & O_ACCMODE {
            O_RDONLY => reads.entry(ino).or_default().push(fd),
            O_WRONLY => writes.entry(ino).or_default().push(fd),
            O_RDWR => {
                reads.entry(ino).or_default().push(fd);
                writes.entry(ino).or_default().push(fd);
            }
            _ => {}
        }
    }
    for v in reads.values_mut().chain(writes.values_mut()) {
        v.sort_unstable();
    }
    (reads, writes)
}

/// The threads of `pid` blocked in `read`/`readv`/`pread64` on one of `fds`.
fn blocked_readers(pid: u32, fds: &[u32]) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(format!("/proc/{pid}/task")) else { return Vec::new() };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|tid| match procfs::syscall(*tid) {
            Some(SyscallState::In { nr, args }) => {
                matches!(nr, libc::SYS_read | libc::SYS_readv | libc::SYS_pread64) && fds.iter().any(|fd| u64::from(*fd) == args[0])
            }
            _ => false,
        })
        .collect()
}

/// A process's arguments (read within a deadline: it takes the process's `mmap_lock`).
fn argv(pid: u32) -> Vec<String> {
    super::bounded_read::cmdline(pid)
}

/// The pipes `pid` reads whose write end one of `children` holds.
pub fn child_pipes(pid: u32, children: &[u32]) -> Vec<PipeLink> {
    let (reads, _) = pipe_ends(pid);
    if reads.is_empty() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for &child in children.iter().take(CHILDREN_MAX) {
        let (_, writes) = pipe_ends(child);
        for (ino, writer_fds) in writes {
            let Some(reader_fds) = reads.get(&ino) else { continue };
            out.push(PipeLink {
                ino,
                child,
                reader_fds: reader_fds.clone(),
                writer_fds,
                blocked_readers: blocked_readers(pid, reader_fds),
                child_argv: argv(child),
            });
        }
    }
    out.sort_by_key(|l| (l.child, l.ino));
    out
}

/// When process `pid` started, on the CLOCK_MONOTONIC scale: its `starttime`
/// (field 22 of `/proc/PID/stat`, clock ticks since boot) against
/// CLOCK_BOOTTIME now, moved onto CLOCK_MONOTONIC now.
pub fn started_ns(pid: u32, monotonic_now_ns: u64) -> Option<u64> {
    let ticks = super::procfs::start_ticks(pid)?;
    // SAFETY: sysconf has no memory effects.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).ok().filter(|h| *h > 0)?;
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts) } != 0 {
        return None;
    }
    let boot_now = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
    let age = boot_now.saturating_sub(ticks.saturating_mul(1_000_000_000 / hz));
    Some(monotonic_now_ns.saturating_sub(age))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pipe_links_and_fdinfo() {
        assert_eq!(pipe_ino("pipe:[545421]"), Some(545421));
        assert_eq!(pipe_ino("socket:[1]"), None);
        assert_eq!(pipe_ino("/tmp/pipe:[1]"), None);
        let fdinfo = "pos:\t0\nflags:\t02000001\nmnt_id:\t15\nino:\t545421\n";
        assert_eq!(parse_fdinfo_flags(fdinfo).map(|f| f & O_ACCMODE), Some(O_WRONLY));
        assert_eq!(parse_fdinfo_flags("pos:\t0\nflags:\t02004000\n").map(|f| f & O_ACCMODE), Some(O_RDONLY));
        assert_eq!(parse_fdinfo_flags("pos: 0\n"), None);
        let pidfd = "pos:\t0\nflags:\t02000002\nmnt_id:\t16\nino:\t1063\nPid:\t4242\nNSpid:\t4242\n";
        assert_eq!(parse_fdinfo_pid(pidfd), Some(4242));
        assert_eq!(parse_fdinfo_pid("Pid:\t-1\n"), None);
    }

    /// Against this very process: a child writing a pipe we read is found.
    #[test]
    fn a_childs_pipe_is_found_in_proc() {
        use std::process::{Command, Stdio};
        let mut child = Command::new("sleep").arg("30").stdout(Stdio::piped()).spawn().expect("sleep runs");
        let me = std::process::id();
        // The inode of the very pipe made for the child's stdout: a process
        // started under a job server or a CI runner may inherit other pipes,
        // both ends of them, and the child inherits those too.
        let ino = {
            use std::os::fd::AsFd;
            use std::os::unix::fs::MetadataExt;
            let fd = child.stdout.as_ref().expect("stdout piped").as_fd().try_clone_to_owned().expect("dup");
            std::fs::File::from(fd).metadata().expect("fstat").ino()
        };
        // Under load the child may be found before its exec shows in /proc (its
        // cmdline still empty): wait for it, as plegwatch meets it later anyway.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while std::fs::read(format!("/proc/{}/cmdline", child.id())).map(|c| !c.starts_with(b"sleep")).unwrap_or(true)
            && std::time::Instant::now() < deadline
        {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let links = child_pipes(me, &[child.id()]);
        let _ = child.kill();
        let _ = child.wait();
        let l =
            links.iter().find(|l| l.child == child.id() && l.ino == ino).unwrap_or_else(|| panic!("no pipe {ino} to the child: {links:?}"));
        assert_eq!(l.writer_fds, vec![1]);
        assert_eq!(l.child_argv, ["sleep", "30"]);
        assert!(l.blocked_readers.is_empty());
    }
}
