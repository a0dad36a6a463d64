//! The in-flight registry of umount2 and sync-family waits.
//!
//! A wait opens at the syscall's `sys_enter` tracepoint and, for every watched
//! syscall but umount2, closes at its `sys_exit`. umount2 is different: on
//! Linux 6.x the unmount's sync runs in task_work after `sys_exit_umount`
//! (`cleanup_mnt → deactivate_locked_super → sync_filesystem`), before the
//! thread gets back to user space. So a successful umount2 stays open in the
//! [`Phase::TaskWork`] phase until the same thread enters its next syscall
//! (`sys_enter`, gated by [`TAIL_PENDING`] so it costs one array read when no
//! tail is open) or exits (`sched_process_exit`).

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user_str_bytes},
    macros::{fexit, map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{FExitContext, RawTracePointContext, TracePointContext},
    EbpfContext as _,
};
use plegwatch_abi::{
    hist_bucket, EndReason, EventHeader, EventKind, Stat, Wait, WaitEnd, COMM_LEN, EVENTS_BYTES, HIST_BUCKETS, HIST_ENTRIES, INFLIGHT_MAX,
    PATH_LEN, SLOT_UMOUNT2, STAT_COUNT, WAIT_DETAILS_PENDING, WAIT_SWEPT_TAIL, WATCHED_SLOTS,
};

#[map]
pub(crate) static INFLIGHT: HashMap<u32, Wait> = HashMap::with_max_entries(INFLIGHT_MAX, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);
#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(STAT_COUNT, 0);
#[map]
static HIST: PerCpuArray<u64> = PerCpuArray::with_max_entries(HIST_ENTRIES, 0);
#[map]
static TAIL_PENDING: Array<u64> = Array::with_max_entries(2, 0);
/// Slot 0: how many [`INFLIGHT`] waits still lack their details (user stack,
/// comm, goroutine: [`WAIT_DETAILS_PENDING`]), so that a switch-out costs one
/// array read while none does. Kernel-owned; an entry carrying the flag is counted once.
#[map]
static DETAILS_PENDING: Array<u64> = Array::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static TRACER_TGID: u32 = 0;
#[unsafe(no_mangle)]
static REPORT_MIN_NS: u64 = 1_000_000_000;
#[unsafe(no_mangle)]
static WATCHED_NR: [u32; WATCHED_SLOTS] = [u32::MAX; WATCHED_SLOTS];
#[unsafe(no_mangle)]
static TASK_WORKS_OFF: u32 = u32::MAX;

/// Whether the current thread has task_work queued (`current->task_works` is not
/// NULL); `None` when the offset is unknown or the read fails.
#[inline(always)]
fn task_works_queued() -> Option<bool> {
    // SAFETY: a read-only global patched by the loader.
    let off = unsafe { core::ptr::read_volatile(&TASK_WORKS_OFF) };
    if off == u32::MAX {
        return None;
    }
    // SAFETY: a plain helper call; the task is only read through probe_read.
    let task = unsafe { aya_ebpf::helpers::bpf_get_current_task() } as *const u8;
    // SAFETY: bounds and faults are checked by the helper.
    let works = unsafe { aya_ebpf::helpers::bpf_probe_read_kernel(task.wrapping_add(off as usize) as *const u64) }.ok()?;
    Some(works != 0)
}

/// Offsets in the `syscalls:sys_enter_*` / `sys_exit_*` tracepoint records
/// (`/sys/kernel/tracing/events/syscalls/*/format`, stable since Linux 2.6.33).
const OFF_NR: usize = 8;
const OFF_ARG0: usize = 16;
const OFF_ARG1: usize = 24;
const OFF_RET: usize = 16;

#[inline(always)]
pub(crate) fn count(stat: Stat) {
    if let Some(p) = STATS.get_ptr_mut(stat as u32) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *p += 1 };
    }
}

/// Waits at least this long are worth a prompt record (the loader's `--warn`).
#[inline(always)]
pub(crate) fn report_min_ns() -> u64 {
    // SAFETY: a read-only global patched by the loader.
    unsafe { core::ptr::read_volatile(&REPORT_MIN_NS) }
}

#[inline(always)]
pub(crate) fn tracer_tgid() -> u32 {
    // SAFETY: a read-only global patched by the loader.
    unsafe { core::ptr::read_volatile(&TRACER_TGID) }
}

/// The syscall number in `slot` of `WATCHED_NR`.
#[inline(always)]
pub(crate) fn watched_nr(slot: u32) -> u32 {
    if slot as usize >= WATCHED_SLOTS {
        return u32::MAX;
    }
    // SAFETY: a read-only global patched by the loader; `slot` is in bounds.
    unsafe { core::ptr::read_volatile(&WATCHED_NR[slot as usize]) }
}

#[inline(always)]
fn slot_of(nr: u32) -> Option<u32> {
    let mut i = 0;
    while i < WATCHED_SLOTS {
        // SAFETY: a read-only global patched by the loader; `i` is in bounds.
        let w = unsafe { core::ptr::read_volatile(&WATCHED_NR[i]) };
        if w == nr {
            return Some(i as u32);
        }
        i += 1;
    }
    None
}

/// Adds `delta` to the kernel's count of umount2 waits in their task_work
/// tail, `TAIL_PENDING[0]`: +1 when `wait_exit` starts a tail, -1 when a delete
/// of a tail entry succeeds (the invariant is in the ABI's
/// `maps::TAIL_PENDING`). A tail the startup sweep put in the map already
/// ([`WAIT_SWEPT_TAIL`]) is userspace's to count, in slot 1, which the kernel
/// only reads.
#[inline(always)]
fn tail_pending_add(wait_flags: u32, delta: i64) {
    if wait_flags & WAIT_SWEPT_TAIL != 0 {
        return;
    }
    crate::gate::add(&TAIL_PENDING, 0, delta);
}

#[inline(always)]
fn tails_pending() -> bool {
    crate::gate::open(&TAIL_PENDING, 0) || crate::gate::open(&TAIL_PENDING, 1)
}

/// Whether some open wait still lacks its details ([`fill_at_sleep`]).
#[inline(always)]
pub(crate) fn details_pending() -> bool {
    crate::gate::open(&DETAILS_PENDING, 0)
}

/// Gives `tid`'s open wait its details, once: the user stack `take` returns,
/// the comm and the goroutine. Called by `sched_switch` as the thread sleeps
/// (`current` is that thread: its user registers and thread-local storage are
/// the syscall's), only while [`details_pending`].
///
/// Taking them here rather than at `sys_enter` means a wait that never sleeps
/// (an fsync on tmpfs, a sync with nothing dirty) walks no stack and reads
/// nothing: per `bpf_stats` (Linux 6.18, `fsync` on tmpfs), `wait_enter` ran
/// 1,035 ns per call with the stack walk at entry, 714 ns without it, and the
/// comm and goroutine reads were about 245 ns of the rest. A wait that
/// matters sleeps.
#[inline(always)]
pub(crate) fn fill_at_sleep(tid: u32, take: impl FnOnce() -> i32) {
    let Some(p) = INFLIGHT.get_ptr_mut(&tid) else { return };
    // SAFETY: `p` points at this thread's live entry, and only this thread
    // (running this program as it switches out) writes it now.
    let wait = unsafe { &mut *p };
    if wait.flags & WAIT_DETAILS_PENDING == 0 {
        return;
    }
    let id = take();
    if id < 0 {
        count(Stat::UserStackFailed);
    }
    wait.user_stack = id;
    wait.comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    wait.g = crate::gofuncs::current_g(wait.tgid);
    wait.flags &= !WAIT_DETAILS_PENDING;
    crate::gate::add(&DETAILS_PENDING, 0, -1);
}

/// Uncounts a removed entry that still waited for its details.
#[inline(always)]
fn details_removed(flags: u32) {
    if flags & WAIT_DETAILS_PENDING != 0 {
        crate::gate::add(&DETAILS_PENDING, 0, -1);
    }
}

/// Closes `wait`: histogram, and a [`WaitEnd`] record if it was long.
#[inline(always)]
fn finish(wait: &Wait, end_ns: u64, reason: EndReason) {
    let dur = end_ns.saturating_sub(wait.start_ns);
    let idx = wait.slot * HIST_BUCKETS + hist_bucket(dur);
    if let Some(p) = HIST.get_ptr_mut(idx) {
        // SAFETY: per-CPU slot.
        unsafe { *p += 1 };
    }
    if dur < report_min_ns() {
        return;
    }
    let rec = WaitEnd {
        header: EventHeader { kind: EventKind::WaitEnd as u32, _pad: 0 },
        start_ns: wait.start_ns,
        sys_exit_ns: wait.sys_exit_ns,
        end_ns,
        ret: wait.ret,
        tgid: wait.tgid,
        tid: wait.tid,
        nr: wait.nr,
        slot: wait.slot,
        reason: reason as u32,
        flags: wait.flags,
        // Still pending: it never slept; `current` is still its thread.
        comm: if wait.flags & WAIT_DETAILS_PENDING != 0 { bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]) } else { wait.comm },
    };
    if EVENTS.output::<WaitEnd>(&rec, 0).is_err() {
        count(Stat::RingbufFull);
    }
}

/// If `tid` has a wait in its task_work tail, closes it at `now`.
#[inline(always)]
fn close_tail(tid: u32, now: u64, reason: EndReason) {
    // SAFETY: the value is copied out before the entry is removed.
    let wait = match unsafe { INFLIGHT.get(&tid) } {
        Some(w) => *w,
        None => return,
    };
    if wait.sys_exit_ns == 0 {
        return;
    }
    if INFLIGHT.remove(&tid).is_ok() {
        tail_pending_add(wait.flags, -1);
        details_removed(wait.flags);
        finish(&wait, now, reason);
    }
}

/// `syscalls:sys_enter_{umount,sync,syncfs,fsync,fdatasync,sync_file_range}`.
///
/// Format (Linux 6.18, checked): `int __syscall_nr` at 8, then the arguments as
/// 8-byte fields from 16: umount2 `(char *name, int flags)`, fsync/fdatasync/
/// syncfs `(unsigned int fd)`, sync_file_range `(int fd, loff_t offset, loff_t
/// nbytes, unsigned int flags)`, sync `()`.
#[tracepoint]
pub fn wait_enter(ctx: TracePointContext) -> u32 {
    let _ = try_wait_enter(&ctx);
    0
}

fn try_wait_enter(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY: offsets from the tracepoint format above.
    let nr: i32 = unsafe { crate::ctxread::field(ctx, OFF_NR) };
    let Some(slot) = slot_of(nr as u32) else {
        return Ok(());
    };
    // Through a helper, not a direct read: `sys_enter_sync` has no arguments,
    // and a direct read past its record would make the attach fail.
    open_wait(nr as u32, slot, || (unsafe { ctx.read_at(OFF_ARG0) }.unwrap_or(0), unsafe { ctx.read_at(OFF_ARG1) }.unwrap_or(0)))
}

/// Opens the [`INFLIGHT`] wait of a watched syscall: `nr`, in `slot` of `WATCHED_NR`;
/// `args` reads its first two arguments.
#[inline(always)]
pub(crate) fn open_wait(nr: u32, slot: u32, args: impl FnOnce() -> (u64, u64)) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == tracer_tgid() {
        return Ok(());
    }
    let tid = pid_tgid as u32;
    // SAFETY: a plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // A wait still open here ended unseen (a tail whose sys_enter raced us).
    if tails_pending() {
        close_tail(tid, now, EndReason::Replaced);
    }
    let (arg0, arg1) = args();
    let mut wait = Wait {
        start_ns: now,
        sys_exit_ns: 0,
        arg0,
        arg1,
        ret: 0,
        tgid,
        tid,
        nr,
        slot,
        // The user stack is taken at the first sleep ([`fill_at_sleep`]).
        flags: WAIT_DETAILS_PENDING,
        user_stack: -1,
        g: 0,
        comm: [0u8; COMM_LEN],
        path: [0u8; PATH_LEN],
    };
    if slot == SLOT_UMOUNT2 {
        // Its sync runs later, in task_work: record where it sleeps.
        crate::offcpu::mark_interesting(tgid);
        // SAFETY: the helper bounds the read and checks the user pointer.
        if unsafe { bpf_probe_read_user_str_bytes(arg0 as *const u8, &mut wait.path) }.is_err() {
            count(Stat::PathReadFailed);
        }
    }
    // The common case is one insert; an entry left by an end that went unseen
    // is replaced, and counted in DETAILS_PENDING only if it was not already.
    let fresh = match INFLIGHT.insert(&tid, &wait, crate::gate::BPF_NOEXIST) {
        Ok(()) => true,
        Err(e) if e == -crate::gate::EEXIST => {
            // SAFETY: read-only peek before the replace.
            let was_pending = unsafe { INFLIGHT.get(&tid) }.is_some_and(|w| w.flags & WAIT_DETAILS_PENDING != 0);
            if INFLIGHT.insert(&tid, &wait, crate::gate::BPF_EXIST).is_err() {
                count(Stat::InflightFull);
                return Ok(());
            }
            !was_pending
        }
        Err(_) => {
            count(Stat::InflightFull);
            return Ok(());
        }
    };
    if fresh {
        crate::gate::add(&DETAILS_PENDING, 0, 1);
    }
    count(Stat::WaitsStarted);
    Ok(())
}

/// `syscalls:sys_exit_{umount,sync,syncfs,fsync,fdatasync,sync_file_range}`.
///
/// Format (Linux 6.18, checked): `int __syscall_nr` at 8, `long ret` at 16.
#[tracepoint]
pub fn wait_exit(ctx: TracePointContext) -> u32 {
    let _ = try_wait_exit(&ctx);
    0
}

fn try_wait_exit(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY: offset from the tracepoint format above.
    close_at_exit(unsafe { crate::ctxread::field(ctx, OFF_RET) })
}

/// The end of a watched syscall, which returned `ret`: closes its wait, or for a
/// umount2 with task_work queued, starts its tail.
#[inline(always)]
pub(crate) fn close_at_exit(ret: i64) -> Result<(), i64> {
    let tid = bpf_get_current_pid_tgid() as u32;
    let Some(p) = INFLIGHT.get_ptr_mut(&tid) else {
        return Ok(());
    };
    // SAFETY: a plain helper call.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: `p` points at this thread's live entry; only this thread writes it.
    let wait = unsafe { &mut *p };
    if wait.sys_exit_ns != 0 {
        return Ok(());
    }
    wait.ret = ret;
    // The unmount's sync is still to come, in task_work, unless none is queued (the
    // mount had other users, or a lazy unmount): then it ends here.
    if wait.slot == SLOT_UMOUNT2 && ret == 0 && task_works_queued() != Some(false) {
        wait.sys_exit_ns = now;
        tail_pending_add(wait.flags, 1);
        count(Stat::TailsStarted);
        return Ok(());
    }
    let copy = *wait;
    if INFLIGHT.remove(&tid).is_ok() {
        details_removed(copy.flags);
    }
    finish(&copy, now, EndReason::SysExit);
    Ok(())
}

/// Raw tracepoint `sys_enter`: `TP_PROTO(struct pt_regs *regs, long id)`
/// (Linux 6.18, checked). Closes a umount2 wait whose task_work tail is over,
/// since the thread is back from user space with a new syscall.
#[raw_tracepoint(tracepoint = "sys_enter")]
pub fn tail_end_raw(_ctx: RawTracePointContext) -> i32 {
    tail_end();
    0
}

/// fexit on `void task_work_run(void)` (kernel/task_work.c; checked on Debian's
/// 6.1.0-56 in a guest; this host's 6.18 refuses fexit): the thread has run its
/// queued task_work, the unmount's
/// `__cleanup_mnt` among it, and returns to user space. Fires only where task_work
/// ran (a last `fput`, an unmount), not on every syscall as [`tail_end_raw`] does,
/// and ends the tail when it ends, not at the thread's next syscall.
#[fexit(function = "task_work_run")]
pub fn tail_end_fexit(_ctx: FExitContext) -> i32 {
    tail_end();
    0
}

/// `raw_syscalls:sys_enter` (format: `long id` at 8, `unsigned long args[6]` at
/// 16; Linux 6.18, checked): the fallback for [`tail_end_raw`].
#[tracepoint]
pub fn tail_end_tp(_ctx: TracePointContext) -> u32 {
    tail_end();
    0
}

#[inline(always)]
fn tail_end() {
    if !tails_pending() {
        return;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: a plain helper call.
    close_tail(tid, unsafe { bpf_ktime_get_ns() }, EndReason::NextSyscall);
}

/// `sched:sched_process_exit`, fired by the exiting thread (format on Linux
/// 6.18: `char comm[16]` at 8, `pid_t pid` at 24, `int prio` at 28, `bool
/// group_dead` at 32). Closes whatever wait that thread still had open.
#[tracepoint]
pub fn thread_exit(ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = ctx.as_ptr();
    // SAFETY: copied out before removal.
    let Some(wait) = (unsafe { INFLIGHT.get(&tid) }).copied() else {
        return 0;
    };
    if INFLIGHT.remove(&tid).is_ok() {
        if wait.sys_exit_ns != 0 {
            tail_pending_add(wait.flags, -1);
        }
        details_removed(wait.flags);
        count(Stat::EndedByExit);
        // SAFETY: a plain helper call.
        finish(&wait, unsafe { bpf_ktime_get_ns() }, EndReason::ThreadExit);
    }
    0
}
