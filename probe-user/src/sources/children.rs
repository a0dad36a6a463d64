//! The child-wait source: threads blocked in `wait4`/`waitid` (the kernel's
//! `CHILD_WAITS` map, see probe-ebpf/src/children.rs), as graph facts. The
//! `/proc` lookups of pipes between a process and its children are in
//! `observe::pipes`.
//!
//! Each scan reads the map (a few entries: only threads blocked right now)
//! and resolves each wait's selector: a pid, a pidfd (to its pid, once per
//! wait), any child, a process group. Which of them become graph nodes is the
//! graph's call (`graph::children::matters`).
//!
//! Threads already blocked in `wait4`/`waitid` when plegwatch starts (CRI-O's
//! update holding a container's lock while its runtime is stopped) are found by
//! the startup sweep ([`ChildWaits::seed`]). They are kept here, not put in the
//! kernel's map: the map's gate is the kernel's own count of its entries, and
//! userspace does not write it. Each scan checks, in `/proc/TID/syscall`, that the
//! thread is still in the same call; once it is not (or the kernel saw it enter a
//! new one), the swept wait is over. A thread found on CPU is judged by
//! `sources::on_cpu`. Their start is a lower bound (the time since
//! the thread last ran), and their goroutine is the one the goroutine scan finds
//! on that thread ([`ChildWaits::note_goroutines`]).

use crate::graph::children::{ChildWaitFact, WaitTarget};
use crate::graph::model::{StartTiming, WaitKey};
use crate::observe::pipes;
use crate::observe::procfs::{self, SyscallState};
use crate::sources::on_cpu::OnCpu;
use crate::sources::sweep::{AgeClock, Blocked};
use aya::maps::{HashMap as BpfHashMap, MapData};
use plegwatch_abi::{ChildWait, CHILD_WAIT_WAIT4, P_ALL, P_PGID, P_PID, P_PIDFD, WNOHANG};
use std::collections::{HashMap, HashSet};

/// x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
const NR_WAIT4: i64 = libc::SYS_wait4;
const NR_WAITID: i64 = libc::SYS_waitid;

/// The record the kernel's enter probe would have made for a thread the sweep
/// found blocked in `wait4(pid, _, options, _)` or `waitid(which, id, _, options, _)`
/// (see probe-ebpf/src/children.rs); `None` for another syscall or a poll
/// (`WNOHANG`, which does not block: seen only in a race).
pub fn swept(b: &Blocked, start_ns: u64) -> Option<ChildWait> {
    let (which, id, options) = match b.nr {
        NR_WAIT4 => (CHILD_WAIT_WAIT4, b.args[0] as i32, b.args[2] as u32),
        NR_WAITID => (b.args[0] as u32, b.args[1] as i32, b.args[3] as u32),
        _ => return None,
    };
    (options & WNOHANG == 0).then_some(ChildWait { start_ns, g: 0, tgid: b.tgid, tid: b.tid, id, which, options, _pad: 0 })
}

/// Whether `tid` is still in the call `w` records (same syscall, same selector). A
/// thread `/proc` finds on CPU (woken by another child's change, or waiting for a CPU)
/// is kept until `on_cpu` proves it back in user space.
fn still_in(w: &ChildWait, on_cpu: &mut OnCpu, now_ns: u64) -> bool {
    let key = (w.tid, w.start_ns);
    let state = procfs::syscall(w.tid);
    if state == Some(SyscallState::Running) {
        return on_cpu.on_cpu(key, now_ns, procfs::cpu_use(w.tid), false).is_none();
    }
    on_cpu.off_cpu(&key);
    let Some(SyscallState::In { nr, args }) = state else { return false };
    let b = Blocked { tgid: w.tgid, tid: w.tid, nr, args };
    swept(&b, w.start_ns).is_some_and(|now| (now.which, now.id) == (w.which, w.id))
}

/// What a kernel record's selector means.
pub fn target_of(w: &ChildWait) -> Option<WaitTarget> {
    match w.which {
        CHILD_WAIT_WAIT4 => Some(match w.id {
            -1 => WaitTarget::Any,
            0 => WaitTarget::Group(0),
            p if p > 0 => WaitTarget::Pid(p as u32),
            g => WaitTarget::Group(g.unsigned_abs()),
        }),
        P_PID if w.id > 0 => Some(WaitTarget::Pid(w.id as u32)),
        P_ALL => Some(WaitTarget::Any),
        P_PGID => Some(WaitTarget::Group(w.id.max(0) as u32)),
        P_PIDFD if w.id >= 0 => Some(WaitTarget::Pidfd { fd: w.id as u32, pid: None }),
        _ => None,
    }
}

/// The kernel's child waits, read each scan.
pub struct ChildWaits {
    map: BpfHashMap<MapData, u32, ChildWait>,
    /// Pidfds resolved, by wait: a pidfd names one process for the wait's life.
    pidfds: HashMap<WaitKey, Option<u32>>,
    /// Waits the startup sweep found, while their threads are still in them.
    swept: Vec<ChildWait>,
    /// Swept waits whose thread the scans keep finding on CPU.
    on_cpu: OnCpu,
}

impl ChildWaits {
    pub fn new(map: BpfHashMap<MapData, u32, ChildWait>) -> Self {
        ChildWaits { map, pidfds: HashMap::new(), swept: Vec::new(), on_cpu: OnCpu::default() }
    }

    /// Takes the threads the startup sweep found blocked in `wait4`/`waitid` (once the
    /// kernel's probes are on, so that a wait begun after the look is the kernel's).
    /// Returns how many.
    pub fn seed(&mut self, blocked: &[Blocked], clock: &AgeClock) -> usize {
        self.swept = blocked.iter().filter_map(|b| swept(b, clock.blocked_since_ns(b.tid))).collect();
        self.swept.len()
    }

    /// The goroutine each thread in a system call runs (the goroutine scan of a
    /// probed Go process): a swept wait on one of them is that goroutine's.
    pub fn note_goroutines(&mut self, threads: &[(u32, u64, Option<u64>)]) {
        for w in self.swept.iter_mut().filter(|w| w.g == 0) {
            if let Some((_, g, _)) = threads.iter().find(|(t, _, _)| *t == w.tid) {
                w.g = *g;
            }
        }
    }

    /// Every thread blocked in `wait4`/`waitid` now.
    pub fn scan(&mut self) -> Vec<ChildWaitFact> {
        let kernel: Vec<ChildWait> = self.map.iter().filter_map(Result::ok).map(|(_, w)| w).collect();
        if !self.swept.is_empty() {
            let seen: HashSet<u32> = kernel.iter().map(|w| w.tid).collect();
            let (on_cpu, now_ns) = (&mut self.on_cpu, crate::clock::monotonic_ns());
            self.swept.retain(|w| {
                let keep = !seen.contains(&w.tid) && still_in(w, on_cpu, now_ns);
                if !keep {
                    on_cpu.off_cpu(&(w.tid, w.start_ns));
                }
                keep
            });
        }
        let swept = self.swept.iter().map(|w| (*w, StartTiming::LowerBound));
        let mut out = Vec::new();
        for (w, start) in kernel.into_iter().map(|w| (w, StartTiming::Exact)).chain(swept) {
            let Some(mut target) = target_of(&w) else { continue };
            let key = WaitKey::Kernel { tid: w.tid, start_ns: w.start_ns };
            if let WaitTarget::Pidfd { fd, .. } = target {
                let pid = *self.pidfds.entry(key).or_insert_with(|| pipes::pidfd_pid(w.tgid, fd));
                target = WaitTarget::Pidfd { fd, pid };
            }
            out.push(ChildWaitFact {
                key,
                tgid: w.tgid,
                tid: w.tid,
                g: (w.g != 0).then_some(w.g),
                target,
                syscall: if w.which == CHILD_WAIT_WAIT4 { "wait4" } else { "waitid" },
                start_ns: w.start_ns,
                start,
                stuck: None,
            });
        }
        self.pidfds.retain(|k, _| out.iter().any(|f| f.key == *k));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(which: u32, id: i32) -> ChildWait {
        ChildWait { which, id, ..Default::default() }
    }

    #[test]
    fn a_swept_thread_reads_as_the_kernels_record_would() {
        let b = |nr: i64, args: [u64; 6]| Blocked { tgid: 10, tid: 11, nr, args };
        // waitid(P_PIDFD, 7, infop, WEXITED): Go's os.(*Process).pidfdWait.
        let w = swept(&b(NR_WAITID, [3, 7, 0xc000, 4, 0, 0]), 99).expect("a waitid");
        assert_eq!((w.which, w.id, w.options, w.tgid, w.tid, w.start_ns, w.g), (P_PIDFD, 7, 4, 10, 11, 99, 0));
        assert_eq!(target_of(&w), Some(WaitTarget::Pidfd { fd: 7, pid: None }));
        // wait4(-1, status, 0, NULL): any child.
        let w = swept(&b(NR_WAIT4, [u64::MAX, 0x7ff0, 0, 0, 0, 0]), 5).expect("a wait4");
        assert_eq!(target_of(&w), Some(WaitTarget::Any));
        // A poll is no wait, and another syscall is nothing.
        assert_eq!(swept(&b(NR_WAIT4, [42, 0, u64::from(WNOHANG), 0, 0, 0]), 5), None);
        assert_eq!(swept(&b(libc::SYS_read, [3, 0, 0, 0, 0, 0]), 5), None);
    }

    #[test]
    fn selectors() {
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, 42)), Some(WaitTarget::Pid(42)));
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, -1)), Some(WaitTarget::Any));
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, 0)), Some(WaitTarget::Group(0)));
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, -77)), Some(WaitTarget::Group(77)));
        assert_eq!(target_of(&rec(P_PID, 42)), Some(WaitTarget::Pid(42)));
        assert_eq!(target_of(&rec(P_ALL, 0)), Some(WaitTarget::Any));
        assert_eq!(target_of(&rec(P_PIDFD, 5)), Some(WaitTarget::Pidfd { fd: 5, pid: None }));
        assert_eq!(target_of(&rec(9, 1)), None);
    }
}
