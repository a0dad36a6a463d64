//! The figures the scheduler reports: the summary at exit and the daemon's periodic
//! `status` snapshot, gathered from every source and the kernel's counters.

use super::scan_clock::ScanClock;
use crate::{
    clock::monotonic_ns,
    events::{RequestsSeen, Status, Summary},
    graph::incidents::Incidents,
    observe::procfs,
    sources::{gowatch::GoWatch, offcpu::OffCpu, reqwatch::ReqWatch, stats, syscall_waits::SyscallWaits},
};
use plegwatch_abi::Stat;
use std::time::Instant;

/// The summary printed at exit.
#[allow(clippy::too_many_arguments)]
pub(super) fn summary(
    ebpf: &aya::Ebpf,
    started: Instant,
    syscalls: &SyscallWaits,
    req: &ReqWatch,
    go: &GoWatch,
    offcpu: Option<&OffCpu>,
    incidents: &Incidents,
    scans: &ScanClock,
) -> Summary {
    let counters = stats::counters(ebpf);
    let (stalls, resolved, open) = syscalls.counts();
    let (req_stalls, req_resolved, req_open) = req.counts();
    let (go_stalls, go_resolved, go_open) = go.counts();
    let summary = Summary {
        ran_s: started.elapsed().as_secs_f64(),
        stalls: stalls + req_stalls + go_stalls,
        resolved: resolved + req_resolved + go_resolved,
        still_open: open + req_open + go_open,
        waits_started: stats::counter(&counters, Stat::WaitsStarted),
        dropped_waits: stats::counter(&counters, Stat::InflightFull),
        dropped_events: stats::counter(&counters, Stat::RingbufFull) + stats::counter(&counters, Stat::SockEventsFull),
        dropped: stats::drops(&counters),
        syscalls: stats::latency(ebpf, syscalls.measured()),
        offcpu_top: offcpu.map(|o| o.top(10)).unwrap_or_default(),
        go_latency: go.latency(),
        relists: go.relists(monotonic_ns()),
        go_locks: go.locks(10),
        go_funcs_in_use: go.ids_in_use().0,
        go_binaries_retired: go.ids_in_use().1,
        go_calls_orphaned: go.orphaned(),
        incidents: incidents.counts().0,
        incidents_resolved: incidents.counts().1,
        scans: scans.summary(),
        requests_seen: RequestsSeen { ttrpc_lost_step: stats::counter(&counters, Stat::TtrpcDesync), ..req.seen() },
    };
    if summary.dropped_waits + summary.dropped_events > 0 {
        tracing::warn!(
            dropped_waits = summary.dropped_waits,
            dropped_events = summary.dropped_events,
            "the kernel dropped records (the summary's `dropped` has them by probe): some waits or requests may be missing or timed approximately"
        );
    }
    summary
}

/// The daemon's periodic snapshot; takes the scan lateness gathered since the last one.
pub(super) fn status(ebpf: &aya::Ebpf, incidents: &Incidents, go: &GoWatch, late_since: &mut Vec<f64>) -> Status {
    let counters = stats::counters(ebpf);
    let (cpu_s, rss_bytes) = procfs::self_usage().unwrap_or((0.0, 0));
    Status {
        incidents: incidents.open_now(),
        relists: go.relists(monotonic_ns()),
        dropped: stats::drops(&counters),
        syscalls: stats::histograms(ebpf),
        go_latency: go.latency(),
        scan_late_s: std::mem::take(late_since),
        cpu_s,
        rss_bytes,
    }
}
