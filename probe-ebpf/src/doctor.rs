//! Programs that do nothing, one per program type, so that `plegwatch doctor`
//! can find out for real which types this kernel loads and attaches (a loaded
//! and attached program is the only honest answer; feature probes can pass
//! where a sandbox still refuses the attach).

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe, perf_event, raw_tracepoint, tracepoint, uprobe},
    programs::{BtfTracePointContext, FEntryContext, PerfEventContext, ProbeContext, RawTracePointContext, TracePointContext},
};

/// Tracepoint `sched:sched_process_fork` (any tracepoint would do).
#[tracepoint]
pub fn doctor_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

/// Raw tracepoint `sched_process_fork`.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn doctor_raw_tp(_ctx: RawTracePointContext) -> i32 {
    0
}

/// BTF tracepoint `sched_switch`: `TP_PROTO(bool preempt, struct task_struct
/// *prev, struct task_struct *next, unsigned int prev_state)` (Linux 6.18).
#[btf_tracepoint(function = "sched_switch")]
pub fn doctor_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

/// fentry on `vfs_fsync_range(struct file *file, loff_t start, loff_t end, int datasync)`.
#[fentry(function = "vfs_fsync_range")]
pub fn doctor_fentry(_ctx: FEntryContext) -> i32 {
    0
}

/// kprobe on `vfs_fsync_range` (same prototype as above).
#[kprobe]
pub fn doctor_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

/// uprobe on a function of plegwatch's own binary.
#[uprobe]
pub fn doctor_uprobe(_ctx: ProbeContext) -> u32 {
    0
}

/// Software CPU-clock perf event.
#[perf_event]
pub fn doctor_perf_event(_ctx: PerfEventContext) -> u32 {
    0
}
