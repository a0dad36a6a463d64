//! Threads blocked in `wait4`/`waitid` for a child: a parent waiting on a
//! process it started (a Go `exec.Cmd.Wait`, a shell's foreground job).
//!
//! Thin: an entry in [`CHILD_WAITS`] from `sys_enter` to `sys_exit` (or the
//! thread's exit), with the selector argument and, for probed Go targets, the
//! goroutine. Polls (`WNOHANG`, a reaper's `wait4(-1, WNOHANG)` at each
//! SIGCHLD) are not waits and are skipped. Userspace resolves the child and
//! decides whether the wait matters.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, tracepoint},
    maps::{Array, HashMap},
    programs::TracePointContext,
};
use plegwatch_abi::{ChildWait, Stat, CHILD_WAITS_MAX, CHILD_WAIT_WAIT4, WNOHANG};

use crate::waits::{count, tracer_tgid};

#[map]
static CHILD_WAITS: HashMap<u32, ChildWait> = HashMap::with_max_entries(CHILD_WAITS_MAX, 0);
#[map]
static CHILD_GATE: Array<u64> = Array::with_max_entries(1, 0);

/// x86-64 syscall numbers (arch/x86/entry/syscalls/syscall_64.tbl).
const NR_WAIT4: i32 = 61;
const NR_WAITID: i32 = 247;

/// Offsets in the records (formats below).
const OFF_NR: usize = 8;
const OFF_ARG0: usize = 16;
const OFF_ARG1: usize = 24;
const OFF_ARG2: usize = 32;
const OFF_ARG3: usize = 40;

/// `syscalls:sys_enter_wait4` and `syscalls:sys_enter_waitid`.
///
/// Formats (Linux 6.18, checked): `int __syscall_nr` at 8, then 8-byte
/// argument fields from 16. `wait4(pid_t upid, int *stat_addr, int options,
/// struct rusage *ru)`: `upid` at 16, `options` at 32 (record 48 bytes).
/// `waitid(int which, pid_t upid, struct siginfo *infop, int options, struct
/// rusage *ru)`: `which` at 16, `upid` at 24, `options` at 40 (record 56
/// bytes). Every read below (8 bytes at 16, 24, 32 and 40) lies inside both.
#[tracepoint]
pub fn child_wait_enter(ctx: TracePointContext) -> u32 {
    let _ = try_enter(&ctx);
    0
}

fn try_enter(ctx: &TracePointContext) -> Result<(), i32> {
    // SAFETY: offsets from the formats above, inside both records.
    let nr: i32 = unsafe { crate::ctxread::field(ctx, OFF_NR) };
    // Through the helper: direct loads here were lowered to byte loads from
    // a moved ctx pointer, which the verifier refuses ("modified ctx ptr").
    // wait4 and waitid are rare; the helper's cost does not matter.
    // SAFETY: as above; the helper checks the read.
    let arg = |off: usize| -> u64 { unsafe { ctx.read_at::<u64>(off) }.unwrap_or(0) };
    let (a0, a1, a2, a3) = (arg(OFF_ARG0), arg(OFF_ARG1), arg(OFF_ARG2), arg(OFF_ARG3));
    match nr {
        NR_WAIT4 => begin(CHILD_WAIT_WAIT4, a0 as i32, a2 as u32),
        NR_WAITID => begin(a0 as u32, a1 as i32, a3 as u32),
        _ => {}
    }
    Ok(())
}

/// The current thread begins a `wait4` (`which` [`CHILD_WAIT_WAIT4`]) or a `waitid`
/// (its `idtype`) for `id` with `options`; from [`child_wait_enter`] or the fentry
/// programs of [`crate::syscall_functions`].
#[inline(always)]
pub(crate) fn begin(which: u32, id: i32, options: u32) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == tracer_tgid() || options & WNOHANG != 0 {
        return;
    }
    let w = ChildWait {
        // SAFETY: a plain helper call.
        start_ns: unsafe { bpf_ktime_get_ns() },
        g: crate::gofuncs::current_g(tgid),
        tgid,
        tid: pid_tgid as u32,
        id,
        which,
        options,
        _pad: 0,
    };
    if crate::gate::insert_counted(&CHILD_WAITS, &w.tid, &w, &CHILD_GATE, 0).is_err() {
        count(Stat::ChildWaitsFull);
    }
}

/// `syscalls:sys_exit_wait4` and `syscalls:sys_exit_waitid` (format on Linux
/// 6.18: `int __syscall_nr` at 8, `long ret` at 16; neither is read). Ends
/// the thread's wait, whatever it returned.
#[tracepoint]
pub fn child_wait_exit(_ctx: TracePointContext) -> u32 {
    end();
    0
}

/// The current thread's `wait4`/`waitid` returned (or it exits).
#[inline(always)]
pub(crate) fn end() {
    forget(bpf_get_current_pid_tgid() as u32);
}

/// `sched:sched_process_exit`, fired by the exiting thread (format on Linux
/// 6.18: `char comm[16]` at 8, `pid_t pid` at 24; not read). Ends the wait of
/// a thread that exits without returning from it; one array read while no
/// thread waits.
#[tracepoint]
pub fn child_wait_gone(_ctx: TracePointContext) -> u32 {
    if crate::gate::open(&CHILD_GATE, 0) {
        forget(bpf_get_current_pid_tgid() as u32);
    }
    0
}

#[inline(always)]
fn forget(tid: u32) {
    if CHILD_WAITS.remove(&tid).is_ok() {
        crate::gate::add(&CHILD_GATE, 0, -1);
    }
}
