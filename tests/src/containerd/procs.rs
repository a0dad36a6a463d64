//! What `/proc` says about a containerd's shims and their threads.
//!
//! Shims outlive the `containerd` that started them (by design: containerd can restart), so a
//! daemon's own shims are found by their `-address` argument, which is its socket, and are
//! only ever signalled by PID.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};

/// `umount2` on x86-64: what `/proc/TID/syscall` starts with while a thread is in it, also
/// during the sync that runs in task_work after the syscall proper (machine-notes.md).
pub const SYS_UMOUNT2: u32 = 166;

/// A `containerd-shim*` process and the arguments containerd started it with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shim {
    pub pid: u32,
    /// `-id`: with CRI's grouping, the pod sandbox's id (one shim per pod).
    pub id: String,
    /// `-namespace`, e.g. `k8s.io`.
    pub namespace: String,
    /// `-address`: the socket of the containerd that started it.
    pub address: String,
}

/// A process's argv, or `None` if it is gone (or a kernel thread).
pub fn cmdline(pid: u32) -> Option<Vec<String>> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    if raw.is_empty() {
        return None;
    }
    Some(raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(|a| String::from_utf8_lossy(a).into_owned()).collect())
}

/// The PIDs of all processes.
pub fn pids() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// The shim `pid` is, if its argv says it is one.
pub fn shim(pid: u32) -> Option<Shim> {
    let argv = cmdline(pid)?;
    let name = Path::new(argv.first()?).file_name()?.to_str()?;
    if !name.starts_with("containerd-shim") {
        return None;
    }
    let arg = |flag: &str| {
        argv.iter()
            .position(|a| a == flag || a.trim_start_matches('-') == flag.trim_start_matches('-'))
            .and_then(|i| argv.get(i + 1))
            .cloned()
    };
    Some(Shim { pid, id: arg("-id")?, namespace: arg("-namespace").unwrap_or_default(), address: arg("-address")? })
}

/// Every running shim started by the containerd listening on `address` (its `-address`).
pub fn shims_of(address: &Path) -> Vec<Shim> {
    let address = address.to_string_lossy();
    pids().into_iter().filter_map(shim).filter(|s| s.address == address).collect()
}

/// A process's parent PID, from `/proc/PID/stat`.
pub fn ppid(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// A process's state letter (`R`, `S`, `D`, `Z`, ...), from `/proc/PID/stat`.
pub fn state(pid: u32) -> Option<char> {
    stat_fields(pid)?.first()?.chars().next()
}

/// A process's comm (`/proc/PID/comm`): for a script run through its `#!` line, the
/// script's file name.
pub fn comm(pid: u32) -> Option<String> {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
    Some(comm.trim_end_matches('\n').to_string())
}

/// The children of `parent` named `comm` that are stopped (state `T`), e.g. a `runc` frozen
/// with SIGSTOP under a shim.
pub fn stopped_children(parent: u32, comm_is: &str) -> Vec<u32> {
    pids()
        .into_iter()
        .filter(|&p| ppid(p) == Some(parent) && state(p) == Some('T'))
        .filter(|&p| comm(p).as_deref() == Some(comm_is))
        .collect()
}

/// Sends `signal` to `pid` if it is still a child of `parent` named `comm` (checked just
/// before, so that a reused PID is left alone); whether it was sent.
pub fn signal_child(pid: u32, parent: u32, comm_is: &str, signal: libc::c_int) -> bool {
    if ppid(pid) != Some(parent) || comm(pid).as_deref() != Some(comm_is) {
        return false;
    }
    // SAFETY: kill(2) by PID, of a process just checked to be `parent`'s child named `comm`.
    unsafe { libc::kill(pid as libc::pid_t, signal) == 0 }
}

/// Whether `pid` still runs: it exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    matches!(state(pid), Some(s) if s != 'Z' && s != 'X')
}

/// The fields of `/proc/PID/stat` after `(comm)`: state, ppid, ...
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// All descendants of `pid` (children, their children, ...), found by walking parent PIDs.
pub fn descendants(pid: u32) -> Vec<u32> {
    let parents: Vec<(u32, u32)> = pids().into_iter().filter_map(|p| Some((p, ppid(p)?))).collect();
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(parents.iter().filter(|(_, pp)| *pp == parent).map(|(p, _)| *p));
        i += 1;
    }
    found.remove(0);
    found
}

/// The thread ids of process `pid`.
pub fn threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect()
}

/// Where a thread is, as `/proc/PID/task/TID/syscall` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyscallState {
    /// Blocked (or stopped) inside syscall `nr`, including the task_work run on its way out.
    In(u32),
    /// Blocked outside any syscall (`-1 sp pc`).
    User,
    /// On a CPU right now: the kernel does not say where (`running`).
    Running,
    /// The thread is gone.
    Gone,
}

/// What `/proc/PID/task/TID/syscall` says now.
pub fn syscall_state(pid: u32, tid: u32) -> SyscallState {
    let Ok(line) = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")) else {
        return SyscallState::Gone;
    };
    match line.split_whitespace().next() {
        Some("running") => SyscallState::Running,
        Some(nr) => nr.parse().map_or(SyscallState::User, SyscallState::In),
        None => SyscallState::Gone,
    }
}

/// The syscall number thread `tid` of process `pid` is blocked in; `None` if it is in user
/// space, on a CPU (the kernel then does not say) or gone.
pub fn syscall_nr(pid: u32, tid: u32) -> Option<u32> {
    match syscall_state(pid, tid) {
        SyscallState::In(nr) => Some(nr),
        _ => None,
    }
}

/// What the kernel says about one thread at one moment.
#[derive(Clone, Debug)]
pub struct ThreadSnapshot {
    pub pid: u32,
    pub tid: u32,
    pub at: Instant,
    pub comm: String,
    /// `/proc/PID/task/TID/syscall`, e.g. `166 0x... 0x0 ...`.
    pub syscall: String,
    /// The `State:` line of `status`, e.g. `D (disk sleep)`.
    pub state: String,
    pub wchan: String,
    /// `/proc/PID/task/TID/stack`, innermost frame first.
    pub stack: String,
}

impl ThreadSnapshot {
    pub fn take(pid: u32, tid: u32) -> Result<Self> {
        let base = format!("/proc/{pid}/task/{tid}");
        let read = |name: &str| std::fs::read_to_string(format!("{base}/{name}")).with_context(|| format!("read {base}/{name}"));
        let status = read("status")?;
        Ok(Self {
            pid,
            tid,
            at: Instant::now(),
            comm: read("comm")?.trim().to_string(),
            syscall: read("syscall")?.trim().to_string(),
            state: status.lines().find_map(|l| l.strip_prefix("State:")).unwrap_or("?").trim().to_string(),
            wchan: read("wchan").unwrap_or_default().trim().to_string(),
            stack: read("stack").unwrap_or_default(),
        })
    }

    /// One line per frame, function names only: `folio_wait_bit ← ... ← do_syscall_64`.
    pub fn stack_line(&self) -> String {
        self.stack
            .lines()
            .filter_map(|l| l.split_whitespace().nth(1))
            .map(|f| f.split('+').next().unwrap_or(f))
            .collect::<Vec<_>>()
            .join(" ← ")
    }
}

/// The threads of `pid` in uninterruptible sleep (`D`) right now, with their stacks. Go
/// threads parked on a futex sleep interruptibly and are not listed.
pub fn blocked_threads(pid: u32) -> Vec<ThreadSnapshot> {
    threads(pid).into_iter().filter_map(|tid| ThreadSnapshot::take(pid, tid).ok()).filter(|s| s.state.starts_with('D')).collect()
}

impl ThreadSnapshot {
    /// The syscall number the thread is in, if any.
    pub fn syscall_nr(&self) -> Option<u32> {
        self.syscall.split_whitespace().next()?.parse().ok()
    }
}

/// One thread's stay in `umount2`, as seen by polling `/proc/TID/syscall`.
#[derive(Clone, Debug)]
pub struct UmountSpan {
    pub tid: u32,
    /// When the poll first and last saw the thread in syscall 166.
    pub first_seen: Instant,
    pub first_seen_wall: SystemTime,
    pub last_seen: Instant,
    /// Whether it was still in it when the watch stopped.
    pub open: bool,
    /// The thread as it was about [`UmountWatch::SNAPSHOT_AFTER`] into the wait (if it
    /// lasted that long): state, wchan, kernel stack.
    pub snapshot: Option<ThreadSnapshot>,
}

impl UmountSpan {
    /// `last_seen - first_seen`: the wait, give or take one poll period at each end.
    pub fn duration(&self) -> Duration {
        self.last_seen.duration_since(self.first_seen)
    }
}

/// Polls every thread of one process for `umount2` (syscall 166 in `/proc/TID/syscall`),
/// on a thread of its own, and times each stay. A read that finds the thread on a CPU
/// (`running`: the kernel then does not say where it is) neither opens nor closes a stay, nor
/// moves its `last_seen`. Stops when dropped or [`UmountWatch::stop`]ped.
pub struct UmountWatch {
    pid: u32,
    stop: Arc<AtomicBool>,
    spans: Arc<Mutex<Vec<UmountSpan>>>,
    poller: Option<JoinHandle<()>>,
}

impl UmountWatch {
    pub const POLL: Duration = Duration::from_millis(10);
    /// When, into a wait, the thread's state and stack are recorded.
    pub const SNAPSHOT_AFTER: Duration = Duration::from_millis(1500);

    pub fn start(pid: u32) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let spans = Arc::new(Mutex::new(Vec::new()));
        let poller = thread::Builder::new()
            .name(format!("umount-watch-{pid}"))
            .spawn({
                let stop = Arc::clone(&stop);
                let spans = Arc::clone(&spans);
                move || poll_umounts(pid, &stop, &spans)
            })
            .context("spawn the umount watch")?;
        Ok(Self { pid, stop, spans, poller: Some(poller) })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The stays seen so far (the open one with `open` set).
    pub fn spans(&self) -> Vec<UmountSpan> {
        self.spans.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The stay in umount2 currently open, if any.
    pub fn open_span(&self) -> Option<UmountSpan> {
        self.spans().into_iter().find(|s| s.open)
    }

    /// Waits up to `timeout` for a thread to be in umount2; returns its span.
    pub fn wait_open(&self, timeout: Duration) -> Option<UmountSpan> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(span) = self.open_span() {
                return Some(span);
            }
            if Instant::now() >= deadline {
                return None;
            }
            thread::sleep(Self::POLL);
        }
    }

    /// Waits up to `timeout` for no thread to be in umount2; whether none is.
    pub fn wait_closed(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + crate::timing::scaled(timeout);
        loop {
            if self.open_span().is_none() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            thread::sleep(Self::POLL);
        }
    }

    /// Stops polling and returns every stay seen.
    pub fn stop(mut self) -> Vec<UmountSpan> {
        self.halt();
        self.spans()
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
    }
}

impl Drop for UmountWatch {
    fn drop(&mut self) {
        self.halt();
    }
}

fn poll_umounts(pid: u32, stop: &AtomicBool, spans: &Mutex<Vec<UmountSpan>>) {
    // Index into `spans` of each thread's open stay.
    let mut open: BTreeMap<u32, usize> = BTreeMap::new();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let states: BTreeMap<u32, SyscallState> = threads(pid).into_iter().map(|tid| (tid, syscall_state(pid, tid))).collect();
        // Threads seen in umount2 now.
        let confirmed: Vec<u32> =
            states.iter().filter(|(_, state)| **state == SyscallState::In(SYS_UMOUNT2)).map(|(tid, _)| *tid).collect();
        let Ok(mut spans) = spans.lock() else { return };
        open.retain(|tid, &mut i| {
            let still = confirmed.contains(tid) || states.get(tid) == Some(&SyscallState::Running);
            if !still {
                spans[i].open = false;
            }
            still
        });
        for &tid in &confirmed {
            match open.get(&tid) {
                Some(&i) => {
                    let span = &mut spans[i];
                    span.last_seen = now;
                    if span.snapshot.is_none() && span.duration() >= UmountWatch::SNAPSHOT_AFTER {
                        span.snapshot = ThreadSnapshot::take(pid, tid).ok();
                    }
                }
                None => {
                    open.insert(tid, spans.len());
                    spans.push(UmountSpan {
                        tid,
                        first_seen: now,
                        first_seen_wall: SystemTime::now(),
                        last_seen: now,
                        open: true,
                        snapshot: None,
                    });
                }
            }
        }
        drop(spans);
        thread::sleep(UmountWatch::POLL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_not_a_shim_and_has_threads() {
        let me = std::process::id();
        assert_eq!(shim(me), None);
        assert!(threads(me).contains(&crate::gettid()));
        assert!(alive(me));
        assert_eq!(ppid(me), Some(std::os::unix::process::parent_id()));
    }

    #[test]
    fn a_stopped_child_is_found_and_continued() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let pid = child.id();
        let me = std::process::id();
        assert!(signal_child(pid, me, "sleep", libc::SIGSTOP));
        let deadline = Instant::now() + Duration::from_secs(5);
        while !stopped_children(me, "sleep").contains(&pid) && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(comm(pid).as_deref(), Some("sleep"));
        assert!(stopped_children(me, "sleep").contains(&pid));
        assert!(stopped_children(me, "runc").is_empty());
        assert!(!signal_child(pid, me, "runc", libc::SIGCONT), "wrong comm: not signalled");
        assert!(signal_child(pid, me, "sleep", libc::SIGCONT));
        while state(pid) == Some('T') && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        assert_ne!(state(pid), Some('T'));
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
