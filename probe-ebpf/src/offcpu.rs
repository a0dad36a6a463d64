//! Off-CPU time in D state (uninterruptible sleep), by kernel stack, for the
//! processes that matter.
//!
//! At `sched_switch` the outgoing task is `current`: if it sleeps in D and its
//! process is in [`INTERESTING`] (kept by userspace: kubelet, containerd, shims,
//! runc, dbus-daemon, systemd, netlink users, the waiters plegwatch reports),
//! its kernel stack and the time go into [`OFFCPU_START`]. When it is switched
//! back in, the period is added to [`OFFCPU`], aggregated in the kernel by
//! (tgid, tid, stack); nothing is streamed per switch. Open periods stay in
//! [`OFFCPU_START`], so userspace sees a D sleep that has not ended.
//!
//! `sched_switch` runs at every context switch on the node, so both halves
//! return after one map read when there is nothing to do: the switch-out half
//! after the state test and the [`INTERESTING`] lookup, the switch-in half
//! after reading the [`OFFCPU_OPEN`] gate, before `next->pid` is read at all.
//! Every failure is counted in `STATS` (`OffcpuStartFull`, `OffcpuFull`,
//! `OffcpuStackFailed`); userspace prunes [`OFFCPU`] and [`STACKS`]
//! (`sources::offcpu::prune`).
//!
//! Map memory, as the kernel charges it (bpftool's `bytes_memlock`, Linux
//! 6.18 x86-64; hash maps are preallocated, each element a header of about
//! 64 B plus key and value):
//! - [`INTERESTING`]: 4,096 × ~80 B ≈ 321 KiB. One entry per process that
//!   matters (the runtime's processes, one per shim, plus umount2 callers and
//!   the processes being reported): a node with a few hundred pods has a few
//!   hundred.
//! - [`OFFCPU_START`]: 16,384 × ~88 B ≈ 1.4 MiB. One entry per thread of those
//!   processes that is in D right now. A hung filesystem can put every shim
//!   and containerd thread in D at once (thousands on a busy node): the size
//!   is that worst case, with room, and is the moment that matters most.
//! - [`OFFCPU`]: 16,384 × ~104 B ≈ 1.6 MiB. One entry per (process, thread,
//!   stack) that has slept in D; entries of processes that are gone are pruned
//!   every 30 s, so it holds the live threads' distinct D stacks.
//! - [`STACKS`]: 4,096 × ~1 KiB (127 frames × 8 B, plus a bucket) ≈ 4.2 MiB,
//!   the largest. Shared with the kernel-mutex waiters (`locks`) and the user
//!   stacks of watched waits (`waits`). Distinct stacks in use are a few
//!   hundred; the rest keeps hash collisions (which drop a stack:
//!   `bpf_get_stackid` without `BPF_F_REUSE_STACKID` refuses to overwrite one
//!   that is referenced) rare. Ids nothing references are pruned every 30 s.
//! - [`OFFCPU_OPEN`]: one `u64`.

use aya_ebpf::{
    bindings::BPF_F_USER_STACK,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map, tracepoint},
    maps::{Array, HashMap, StackTrace},
    programs::{tracing::StackIdContext as _, BtfTracePointContext, TracePointContext},
    EbpfContext as _,
};
use plegwatch_abi::{OffCpuKey, OffCpuStart, OffCpuVal, Stat, TASK_UNINTERRUPTIBLE};

use crate::waits::count;

/// tgid → 1 when marked by userspace, 2 when marked here because it started a
/// umount2 (whose task_work tail is what the D sleeps attribute).
#[map]
pub(crate) static INTERESTING: HashMap<u32, u8> = HashMap::with_max_entries(4_096, 0);

/// Marks a process whose D sleeps should be recorded from now on.
#[inline(always)]
pub(crate) fn mark_interesting(tgid: u32) {
    // SAFETY: read-only peek.
    if unsafe { INTERESTING.get(&tgid) }.is_none() {
        if INTERESTING.insert(&tgid, &2, 0).is_err() {
            count(Stat::InterestingFull);
        }
    }
}
#[map]
static OFFCPU_START: HashMap<u32, OffCpuStart> = HashMap::with_max_entries(16_384, 0);
#[map]
static OFFCPU: HashMap<OffCpuKey, OffCpuVal> = HashMap::with_max_entries(16_384, 0);
#[map]
pub(crate) static STACKS: StackTrace = StackTrace::with_max_entries(4_096, 0);
/// Slot 0: how many [`OFFCPU_START`] entries are open, so that a switch-in
/// costs one array read while none is.
#[map]
static OFFCPU_OPEN: Array<u64> = Array::with_max_entries(1, 0);

/// Byte offset of `pid` in `struct task_struct`, from the kernel's BTF at load
/// time (no CO-RE in Rust eBPF); 0 when unknown, and then the tp_btf program is
/// not used.
#[unsafe(no_mangle)]
pub(crate) static TASK_PID_OFF: u32 = 0;

#[inline(always)]
fn switch_out<C: StackIdContextExt>(ctx: &C, prev_state: u64) {
    if prev_state == 0 {
        // Preempted, not asleep.
        return;
    }
    if crate::waits::details_pending() {
        // Any sleep, D or not (a FUSE fsync waits interruptibly).
        crate::waits::fill_at_sleep(bpf_get_current_pid_tgid() as u32, || ctx.user_stack_id());
    }
    if prev_state & TASK_UNINTERRUPTIBLE == 0 {
        return;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: read-only peek.
    if unsafe { INTERESTING.get(&tgid) }.is_none() {
        return;
    }
    let tid = pid_tgid as u32;
    let stack_id = ctx.kernel_stack_id();
    if stack_id < 0 {
        count(Stat::OffcpuStackFailed);
    }
    // SAFETY: a plain helper call.
    let start = OffCpuStart { start_ns: unsafe { bpf_ktime_get_ns() }, stack_id, tgid };
    if crate::gate::insert_counted(&OFFCPU_START, &tid, &start, &OFFCPU_OPEN, 0).is_err() {
        count(Stat::OffcpuStartFull);
    }
}

/// Whether a switch-in can have anything to do: some D sleep is open. Read
/// before `next`'s pid, so that the common case costs one array read.
#[inline(always)]
fn any_open() -> bool {
    crate::gate::open(&OFFCPU_OPEN, 0)
}

/// Ends `next_tid`'s D sleep, if it was in one; call only when [`any_open`].
#[inline(always)]
fn switch_in(next_tid: u32) {
    // SAFETY: copied out before removal.
    let Some(start) = (unsafe { OFFCPU_START.get(&next_tid) }).copied() else { return };
    if OFFCPU_START.remove(&next_tid).is_err() {
        return;
    }
    crate::gate::add(&OFFCPU_OPEN, 0, -1);
    // SAFETY: a plain helper call.
    let delta = unsafe { bpf_ktime_get_ns() }.saturating_sub(start.start_ns);
    let key = OffCpuKey { tgid: start.tgid, tid: next_tid, stack_id: start.stack_id, _pad: 0 };
    match OFFCPU.get_ptr_mut(&key) {
        Some(v) => {
            // SAFETY: a live map value; lost updates between CPUs only blur a sum.
            let v = unsafe { &mut *v };
            v.total_ns += delta;
            v.count += 1;
            if delta > v.max_ns {
                v.max_ns = delta;
            }
        }
        None => {
            if OFFCPU.insert(&key, &OffCpuVal { total_ns: delta, count: 1, max_ns: delta }, 0).is_err() {
                count(Stat::OffcpuFull);
            }
        }
    }
}

/// A context whose kernel stack id can be taken (tracepoint or tp_btf).
trait StackIdContextExt {
    fn kernel_stack_id(&self) -> i32;
    /// `current`'s user stack, by frame pointers: whole for Go, often one
    /// frame for C built without them.
    fn user_stack_id(&self) -> i32;
}

impl StackIdContextExt for TracePointContext {
    fn kernel_stack_id(&self) -> i32 {
        self.get_stackid(&STACKS, 0).map(|id| id as i32).unwrap_or(-1)
    }
    fn user_stack_id(&self) -> i32 {
        self.get_stackid(&STACKS, BPF_F_USER_STACK as u64).map(|id| id as i32).unwrap_or(-1)
    }
}

impl StackIdContextExt for BtfTracePointContext {
    fn kernel_stack_id(&self) -> i32 {
        self.get_stackid(&STACKS, 0).map(|id| id as i32).unwrap_or(-1)
    }
    fn user_stack_id(&self) -> i32 {
        self.get_stackid(&STACKS, BPF_F_USER_STACK as u64).map(|id| id as i32).unwrap_or(-1)
    }
}

/// BTF tracepoint `sched_switch`: `TP_PROTO(bool preempt, struct task_struct
/// *prev, struct task_struct *next, unsigned int prev_state)` (Linux >= 5.18;
/// checked on 6.18). `next->pid` is read at [`TASK_PID_OFF`].
#[btf_tracepoint(function = "sched_switch")]
pub fn offcpu_switch_btf(ctx: BtfTracePointContext) -> i32 {
    let prev_state: u32 = ctx.arg(3);
    switch_out(&ctx, prev_state as u64);
    if !any_open() {
        return 0;
    }
    let next: *const u8 = ctx.arg(2);
    // SAFETY: a read-only global patched by the loader.
    let off = unsafe { core::ptr::read_volatile(&TASK_PID_OFF) };
    if off != 0 {
        // SAFETY: the helper checks the kernel pointer.
        if let Ok(pid) = unsafe { bpf_probe_read_kernel(next.wrapping_add(off as usize) as *const u32) } {
            switch_in(pid);
        }
    }
    let _ = ctx.as_ptr();
    0
}

/// Tracepoint `sched:sched_switch` (format on Linux 6.18: `prev_comm[16]` at 8,
/// `pid_t prev_pid` at 24, `long prev_state` at 32, `next_comm[16]` at 40,
/// `pid_t next_pid` at 56): the fallback when tp_btf or BTF is missing.
#[tracepoint]
pub fn offcpu_switch_tp(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from the format above.
    let prev_state: i64 = unsafe { ctx.read_at(32) }.unwrap_or(0);
    switch_out(&ctx, prev_state as u64);
    if !any_open() {
        return 0;
    }
    // SAFETY: offset from the format above.
    if let Ok(next_pid) = unsafe { ctx.read_at::<i32>(56) } {
        switch_in(next_pid as u32);
    }
    0
}
