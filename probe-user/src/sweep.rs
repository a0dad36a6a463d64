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
    procfs::{self, SyscallState},
    syscalls::{Arg0, WATCHED},
};
use plegwatch_abi::{COMM_LEN, PATH_LEN, WAIT_BEFORE_ATTACH, Wait};
use std::fs;

/// A wait found by the sweep.
#[derive(Clone, Copy, Debug)]
pub struct Swept {
    pub wait: Wait,
    /// A umount2 in its task_work tail (counted in `TAIL_PENDING[1]`).
    pub tail: bool,
}

/// Sweeps every thread in `/proc` but those of `self_tgid`; `now_ns` is
/// CLOCK_MONOTONIC.
pub fn sweep(self_tgid: u32, now_ns: u64) -> Vec<Swept> {
    let clock = AgeClock::new(self_tgid, now_ns);
    blocked_threads(self_tgid).iter().filter_map(|b| check_thread(b, &clock)).collect()
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
pub fn blocked_threads(self_tgid: u32) -> Vec<Blocked> {
    let mut out = Vec::new();
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
            if let Some(SyscallState::In { nr, args }) = procfs::syscall(tid) {
                out.push(Blocked { tgid, tid, nr, args });
            }
        }
    }
    out
}

/// Lower bounds of how long threads have been blocked.
pub struct AgeClock {
    now_ns: u64,
    /// Our own thread is running, so its exec_start is "now" on the
    /// scheduler's task clock, which lags CLOCK_MONOTONIC by irq and steal time.
    clock_now_ms: Option<f64>,
}

impl AgeClock {
    pub fn new(self_tgid: u32, now_ns: u64) -> Self {
        AgeClock { now_ns, clock_now_ms: procfs::exec_start_ms(self_tgid) }
    }

    /// CLOCK_MONOTONIC ns since when `tid` has surely been blocked: since it
    /// last ran (exact for a thread that slept since it blocked), or now when
    /// the kernel doesn't say (no CONFIG_SCHED_DEBUG).
    pub fn blocked_since_ns(&self, tid: u32) -> u64 {
        let age_ns = match (self.clock_now_ms, procfs::exec_start_ms(tid)) {
            (Some(now), Some(last_ran)) if now > last_ran => ((now - last_ran) * 1e6) as u64,
            _ => 0,
        };
        self.now_ns.saturating_sub(age_ns).max(1)
    }
}

fn check_thread(b: &Blocked, clock: &AgeClock) -> Option<Swept> {
    let (tgid, tid, nr, args) = (b.tgid, b.tid, b.nr, b.args);
    let slot = WATCHED.iter().position(|w| w.nr == nr)?;
    let w = &WATCHED[slot];
    let start_ns = clock.blocked_since_ns(tid);
    let tail = slot == plegwatch_abi::SLOT_UMOUNT2 as usize
        && procfs::kernel_stack(tid).is_some_and(|s| s.iter().any(|f| f == "task_work_run"));
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
            flags: WAIT_BEFORE_ATTACH,
            _pad: 0,
            comm,
            path,
        },
        tail,
    })
}

/// Whether a swept wait's thread is still in the same syscall.
pub fn still_in(w: &Wait) -> bool {
    matches!(procfs::syscall(w.tid), Some(SyscallState::In { nr, .. }) if nr as u32 == w.nr)
}
