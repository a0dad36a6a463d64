//! The startup sweep: threads already blocked in a watched wait when plegwatch
//! starts become open waits at once.
//!
//! The kernel says, for free, which syscall a blocked thread is in
//! (`/proc/TID/syscall`, with its arguments) and where it sleeps
//! (`/proc/TID/stack`). A swept wait goes into the kernel's `INFLIGHT` map
//! flagged [`WAIT_BEFORE_ATTACH`], so the kernel's own `sys_exit` (or tail end)
//! closes it like any other. Its age is a lower bound: the time since the
//! thread last ran (`se.exec_start`), which is exact for a thread that has
//! slept since it blocked.

use crate::{
    observe::procfs::{self, SyscallState},
    syscalls::{Arg0, WATCHED},
};
use plegwatch_abi::{Wait, COMM_LEN, PATH_LEN, WAIT_BEFORE_ATTACH, WAIT_SWEPT_TAIL};
use std::fs;

/// A wait found by the sweep.
#[derive(Clone, Copy, Debug)]
pub struct Swept {
    pub wait: Wait,
    /// A umount2 in its task_work tail (flagged [`WAIT_SWEPT_TAIL`], counted by
    /// userspace in `TAIL_PENDING[1]`).
    pub tail: bool,
}

/// The watched waits among `blocked` (from [`blocked_threads`], taken once at start
/// for every source that seeds from it), aged by `clock`.
pub fn sweep(blocked: &[Blocked], clock: &AgeClock) -> Vec<Swept> {
    blocked.iter().filter_map(|b| check_thread(b, clock)).collect()
}

/// A thread blocked in a syscall, as `/proc/TID/syscall` says.
#[derive(Clone, Copy, Debug)]
pub struct Blocked {
    pub tgid: u32,
    pub tid: u32,
    pub nr: i64,
    pub args: [u64; 6],
}

/// Every thread in `/proc` (but `self_tgid`'s) blocked in a syscall now.
///
/// `/proc/TID/syscall` says `running` for a thread on CPU or waiting for one, and a
/// thread inside a long wait often is (a umount's sync wakes it at every page; on a
/// busy CPU it then waits its turn): those are looked at again, up to
/// [`RUNNING_LOOKS`] times [`RUNNING_PAUSE`] apart, until `/proc` says where they are.
pub fn blocked_threads(self_tgid: u32) -> Vec<Blocked> {
    let mut out = Vec::new();
    let mut running = Vec::new();
    let Ok(procs) = fs::read_dir("/proc") else {
        return out;
    };
    for p in procs.flatten() {
        let Some(tgid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if tgid == self_tgid {
            continue;
        }
        let Ok(tasks) = fs::read_dir(p.path().join("task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            match procfs::syscall(tid) {
                Some(SyscallState::In { nr, args }) => out.push(Blocked { tgid, tid, nr, args }),
                Some(SyscallState::Running) => running.push((tgid, tid)),
                _ => {}
            }
        }
    }
    for _ in 0..RUNNING_LOOKS {
        if running.is_empty() {
            break;
        }
        std::thread::sleep(RUNNING_PAUSE);
        running.retain(|&(tgid, tid)| match procfs::syscall(tid) {
            Some(SyscallState::In { nr, args }) => {
                out.push(Blocked { tgid, tid, nr, args });
                false
            }
            Some(SyscallState::Running) => true,
            _ => false,
        });
    }
    out
}

/// How often, and how far apart, [`blocked_threads`] looks again at the threads `/proc`
/// found on CPU (at start: 200 ms at most, while some thread stays on CPU).
const RUNNING_LOOKS: u32 = 20;
const RUNNING_PAUSE: std::time::Duration = std::time::Duration::from_millis(10);

/// Lower bounds of how long threads have been blocked, from the scheduler.
///
/// `se.exec_start` in `/proc/TID/sched` is when the thread last started
/// running, on the task clock of the CPU it ran on. That clock lags
/// CLOCK_MONOTONIC by the CPU's own irq and steal time, so each CPU has its
/// own offset; plegwatch measures it once per CPU by running there itself.
pub struct AgeClock {
    now_ns: u64,
    /// CLOCK_MONOTONIC ns minus task-clock ns, by CPU.
    offset_ns: std::collections::HashMap<u32, i128>,
}

/// Our own `se.exec_start` on `cpu`, and CLOCK_MONOTONIC right then.
fn sample_cpu(cpu: u32) -> Option<(f64, u64)> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET bounds-checks `cpu`.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    unsafe { libc::CPU_SET(cpu as usize, &mut set) };
    // SAFETY: our own thread, a valid set.
    if unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
        return None;
    }
    // SAFETY: no preconditions. Being scheduled anew restamps exec_start.
    unsafe { libc::sched_yield() };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() } as u32;
    let mono = crate::clock::monotonic_ns();
    let exec = procfs::exec_start_ms(tid)?;
    Some((exec, mono))
}

impl AgeClock {
    pub fn new(_self_tgid: u32, now_ns: u64) -> Self {
        let mut offset_ns = std::collections::HashMap::new();
        // SAFETY: a zeroed cpu_set_t is valid; filled by the kernel.
        let mut orig: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: our own thread, a valid buffer.
        if unsafe { libc::sched_getaffinity(0, size, &mut orig) } == 0 {
            for cpu in 0..libc::CPU_SETSIZE as u32 {
                // SAFETY: CPU_ISSET bounds-checks `cpu`.
                if unsafe { libc::CPU_ISSET(cpu as usize, &orig) } {
                    if let Some((exec_ms, mono)) = sample_cpu(cpu) {
                        offset_ns.insert(cpu, mono as i128 - (exec_ms * 1e6) as i128);
                    }
                }
            }
            // SAFETY: restores the set read above.
            unsafe { libc::sched_setaffinity(0, size, &orig) };
        }
        AgeClock { now_ns, offset_ns }
    }

    /// Moves "now" (the latest a start may be) to `now_ns`, keeping the per-CPU offsets.
    pub fn set_now(&mut self, now_ns: u64) {
        self.now_ns = now_ns;
    }

    /// CLOCK_MONOTONIC ns since when `tid` has not run: since it last started
    /// running (exact for a thread that slept since it blocked), or now when
    /// the kernel doesn't say (no CONFIG_SCHED_DEBUG).
    pub fn blocked_since_ns(&self, tid: u32) -> u64 {
        let since = (|| {
            let exec_ms = procfs::exec_start_ms(tid)?;
            let cpu = procfs::last_cpu(tid)?;
            let off = self.offset_ns.get(&cpu)?;
            u64::try_from((exec_ms * 1e6) as i128 + off).ok()
        })();
        since.unwrap_or(self.now_ns).clamp(1, self.now_ns)
    }

    /// The best lower bound of how long process `pid` has waited for
    /// something one of its threads asked for: since its most recently run
    /// sleeping thread last ran (a thread that ran later could have sent it).
    pub fn process_blocked_since_ns(&self, pid: u32) -> (u32, u64) {
        let tids: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| d.flatten().filter_map(|e| e.file_name().to_str()?.parse().ok()).collect())
            .unwrap_or_default();
        tids.into_iter()
            .filter(|t| matches!(procfs::state(*t), Some('S' | 'D')))
            .map(|t| (t, self.blocked_since_ns(t)))
            .max_by_key(|(_, s)| *s)
            .unwrap_or((pid, self.now_ns))
    }
}

fn check_thread(b: &Blocked, clock: &AgeClock) -> Option<Swept> {
    let (tgid, tid, nr, args) = (b.tgid, b.tid, b.nr, b.args);
    let slot = WATCHED.iter().position(|w| w.nr == nr)?;
    let w = &WATCHED[slot];
    let start_ns = clock.blocked_since_ns(tid);
    let tail =
        slot == plegwatch_abi::SLOT_UMOUNT2 as usize && procfs::kernel_stack(tid).is_some_and(|s| s.iter().any(|f| f == "task_work_run"));
    let mut comm = [0u8; COMM_LEN];
    if let Some(c) = procfs::comm(tid) {
        let n = c.len().min(COMM_LEN - 1);
        comm[..n].copy_from_slice(&c.as_bytes()[..n]);
    }
    let mut path = [0u8; PATH_LEN];
    if w.arg0 == Arg0::Path {
        if let Some(p) = procfs::read_user_string(tgid, args[0], PATH_LEN) {
            let n = p.len().min(PATH_LEN - 1);
            path[..n].copy_from_slice(&p.as_bytes()[..n]);
        }
    }
    Some(Swept {
        wait: Wait {
            start_ns,
            sys_exit_ns: if tail { start_ns } else { 0 },
            arg0: args[0],
            arg1: args[1],
            ret: 0,
            tgid,
            tid,
            nr: nr as u32,
            slot: slot as u32,
            flags: if tail { WAIT_BEFORE_ATTACH | WAIT_SWEPT_TAIL } else { WAIT_BEFORE_ATTACH },
            user_stack: -1,
            // No fsbase from /proc: swept waits carry no goroutine.
            g: 0,
            comm,
            path,
        },
        tail,
    })
}

/// Userspace's slot of the tail gate, `TAIL_PENDING[1]`: how many of the
/// `open` waits (the kernel's map, less those judged over) are tails the sweep
/// put there. The kernel counts every other tail itself, in slot 0.
pub fn swept_tails_open(open: &[Wait]) -> u64 {
    open.iter().filter(|w| w.flags & WAIT_SWEPT_TAIL != 0 && w.sys_exit_ns != 0).count() as u64
}

/// Whether a swept wait's thread is still in the same syscall. `/proc` says `running`
/// for a thread on CPU or waiting for one, which a thread woken inside its wait often is
/// (a umount's sync wakes it at every page): that is looked at again, up to
/// [`STILL_IN_LOOKS`] times [`STILL_IN_PAUSE`] apart, and a thread never seen out of it
/// is kept (the scans judge it later, see `on_cpu`).
pub fn still_in(w: &Wait) -> bool {
    for _ in 0..STILL_IN_LOOKS {
        match procfs::syscall(w.tid) {
            Some(SyscallState::Running) => std::thread::sleep(STILL_IN_PAUSE),
            Some(SyscallState::In { nr, .. }) => return nr as u32 == w.nr,
            _ => return false,
        }
    }
    true
}

/// How often, and how far apart, [`still_in`] looks at a thread `/proc` finds on CPU
/// (at start, once per swept wait so found: 100 ms at most each).
const STILL_IN_LOOKS: u32 = 20;
const STILL_IN_PAUSE: std::time::Duration = std::time::Duration::from_millis(5);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::ended::EndedWaits;

    fn wait(tid: u32, sys_exit_ns: u64, flags: u32) -> Wait {
        Wait {
            start_ns: 100,
            sys_exit_ns,
            arg0: 0,
            arg1: 0,
            ret: 0,
            tgid: tid,
            tid,
            nr: libc::SYS_umount2 as u32,
            slot: plegwatch_abi::SLOT_UMOUNT2,
            flags,
            user_stack: -1,
            g: 0,
            comm: [0; COMM_LEN],
            path: [0; PATH_LEN],
        }
    }

    #[test]
    fn userspace_counts_only_the_tails_the_sweep_put_in_the_map() {
        let map = [
            // Swept in its tail: userspace's to count.
            wait(1, 100, WAIT_BEFORE_ATTACH | WAIT_SWEPT_TAIL),
            // Swept inside umount2, whose tail the kernel then started: slot 0's.
            wait(2, 200, WAIT_BEFORE_ATTACH),
            // Swept, still inside the syscall: no tail yet.
            wait(3, 0, WAIT_BEFORE_ATTACH),
            // The kernel's own tail.
            wait(4, 300, 0),
        ];
        assert_eq!(swept_tails_open(&map), 1);
        assert_eq!(swept_tails_open(&[]), 0);
    }

    #[test]
    fn the_swept_tail_gate_closes_when_its_tails_are_gone_or_judged_over() {
        let mut ended = EndedWaits::default();
        let a = wait(1, 100, WAIT_BEFORE_ATTACH | WAIT_SWEPT_TAIL);
        let b = wait(2, 100, WAIT_BEFORE_ATTACH | WAIT_SWEPT_TAIL);
        let key = |w: &Wait| (w.tid, w.start_ns);
        assert_eq!(swept_tails_open(&ended.open(vec![a, b], key, 1)), 2);
        // The kernel closed a's tail at its thread's next syscall: one left.
        assert_eq!(swept_tails_open(&ended.open(vec![b], key, 2)), 1);
        // b's thread went back to user space without a syscall, or vanished:
        // /proc says it is over. Its entry stays in the map, but the gate
        // closes; it does not wait for a delete that may never come.
        ended.mark(key(&b));
        assert_eq!(swept_tails_open(&ended.open(vec![b], key, 3)), 0);
    }
}
