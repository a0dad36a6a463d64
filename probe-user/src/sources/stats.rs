//! Reading the kernel's counters and latency histogram.

use crate::{
    events::{DropCount, SyscallHistogram, SyscallSummary},
    syscalls::WATCHED,
};
use aya::{maps::PerCpuArray, Ebpf};
use plegwatch_abi::{bucket_floor_ns, maps, Stat, HIST_BUCKETS, STAT_COUNT};

/// The per-CPU counters of `STATS`, summed; zero where unreadable.
pub fn counters(ebpf: &Ebpf) -> [u64; STAT_COUNT as usize] {
    let mut out = [0u64; STAT_COUNT as usize];
    let Some(map) = ebpf.map(maps::STATS) else {
        return out;
    };
    let Ok(arr) = PerCpuArray::<_, u64>::try_from(map) else {
        return out;
    };
    for (i, slot) in out.iter_mut().enumerate() {
        if let Ok(v) = arr.get(&(i as u32), 0) {
            *slot = v.iter().sum();
        }
    }
    out
}

/// One counter.
pub fn counter(all: &[u64; STAT_COUNT as usize], s: Stat) -> u64 {
    all[s as usize]
}

/// Each watched syscall's bucket counts in the kernel's log2 histogram
/// (`HIST`, summed over CPUs), in slot order.
fn bucket_counts(ebpf: &Ebpf) -> Vec<(&'static str, Vec<u64>)> {
    let Some(arr) = ebpf.map(maps::HIST).and_then(|m| PerCpuArray::<_, u64>::try_from(m).ok()) else {
        return Vec::new();
    };
    WATCHED
        .iter()
        .enumerate()
        .map(|(slot, w)| {
            let counts =
                (0..HIST_BUCKETS).map(|b| arr.get(&(slot as u32 * HIST_BUCKETS + b), 0).map(|v| v.iter().sum()).unwrap_or(0)).collect();
            (w.name, counts)
        })
        .collect()
}

/// Per-syscall latency from the kernel's log2 histogram (syscalls never seen are left out).
/// with exact quantiles where they fall among the calls measured in userspace.
pub fn latency(ebpf: &Ebpf, measured: &crate::latency::LatencyTables) -> Vec<SyscallSummary> {
    bucket_counts(ebpf)
        .into_iter()
        .filter_map(|(name, counts)| summarize(name, &counts).map(|s| with_measured(s, measured.histogram("syscall", name))))
        .collect()
}

/// Fills the exact quantiles of `s` from `measured`: the durations (µs) of its
/// slowest calls, those long enough for an end record. A quantile whose rank
/// falls among them is read from them; a lower one keeps only its bucket bound.
pub fn with_measured(mut s: SyscallSummary, measured: Option<&hdrhistogram::Histogram<u64>>) -> SyscallSummary {
    let Some(h) = measured.filter(|h| !h.is_empty()) else { return s };
    let n = s.count.max(1);
    let e = h.len().min(n);
    let below = n - e;
    let at = |q: f64| {
        let rank = ((n as f64 * q).ceil() as u64).clamp(1, n);
        (rank > below).then(|| h.value_at_quantile((rank - below) as f64 / e as f64) as f64 / 1e6)
    };
    s.measured = e;
    s.p50_s = at(0.50);
    s.p90_s = at(0.90);
    s.p99_s = at(0.99);
    s.max_s = Some(h.max() as f64 / 1e6);
    s
}

/// Per-syscall log2 buckets (upper bound in seconds, count), for the
/// syscalls seen at least once.
pub fn histograms(ebpf: &Ebpf) -> Vec<SyscallHistogram> {
    bucket_counts(ebpf)
        .into_iter()
        .filter(|(_, counts)| counts.iter().any(|n| *n > 0))
        .map(|(name, counts)| SyscallHistogram {
            syscall: name.to_string(),
            buckets: counts.iter().enumerate().map(|(b, n)| (bucket_floor_ns(b as u32 + 1) as f64 / 1e9, *n)).collect(),
        })
        .collect()
}

/// The kernel's drop counters, by the probe that lost records and why.
pub fn drops(all: &[u64; STAT_COUNT as usize]) -> Vec<DropCount> {
    [
        ("wait_enter", "inflight_full", Stat::InflightFull),
        ("wait_exit", "ringbuf_full", Stat::RingbufFull),
        ("socket_io", "sock_events_full", Stat::SockEventsFull),
        ("socket_classify", "socks_full", Stat::SocksFull),
        ("socket_io", "sock_calls_full", Stat::SockCallsFull),
        ("socket_io", "read_failed", Stat::SockReadFailed),
        ("socket_io", "ttrpc_desync", Stat::TtrpcDesync),
        ("wait_enter", "path_read_failed", Stat::PathReadFailed),
        ("offcpu", "user_stack_failed", Stat::UserStackFailed),
        ("offcpu", "offcpu_start_full", Stat::OffcpuStartFull),
        ("offcpu", "offcpu_full", Stat::OffcpuFull),
        ("offcpu", "stack_failed", Stat::OffcpuStackFailed),
        ("lock_contention", "lock_waits_full", Stat::LockWaitsFull),
        ("lock_contention", "stack_failed", Stat::LockStackFailed),
        ("go_uprobes", "address_unknown", Stat::GoAddrUnknown),
        ("go_uprobes", "go_calls_full", Stat::GoCallsFull),
        ("go_uprobes", "go_events_full", Stat::GoEventsFull),
        ("go_uprobes", "ttrpc_callers_full", Stat::TtrpcCallersFull),
        ("child_wait", "child_waits_full", Stat::ChildWaitsFull),
        ("socket_classify", "socket_calls_full", Stat::SocketCallsFull),
        ("socket_reuse", "dup_calls_full", Stat::DupCallsFull),
        ("socket_io", "ttrpc_pos_full", Stat::TtrpcPosFull),
        ("socket_io", "dbus_pos_full", Stat::DbusPosFull),
        ("block_io", "dev_io_full", Stat::DevIoFull),
        ("offcpu", "interesting_full", Stat::InterestingFull),
    ]
    .into_iter()
    .map(|(probe, reason, s)| DropCount { probe, reason, count: counter(all, s) })
    .collect()
}

/// Summarises one syscall's bucket counts; `None` when it never ran.
pub fn summarize(name: &str, counts: &[u64]) -> Option<SyscallSummary> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let upper = |b: usize| bucket_floor_ns(b as u32 + 1) as f64 / 1e9;
    // The bucket holding the q-th quantile: the first whose running count reaches rank q.
    let quantile = |q: f64| {
        let rank = ((total as f64 * q).ceil() as u64).clamp(1, total);
        let mut acc = 0;
        for (b, c) in counts.iter().enumerate() {
            acc += c;
            if acc >= rank {
                return upper(b);
            }
        }
        upper(counts.len().saturating_sub(1))
    };
    let max_b = counts.iter().rposition(|&c| c > 0).unwrap_or(0);
    Some(SyscallSummary {
        syscall: name.to_string(),
        count: total,
        p50_le_s: quantile(0.50),
        p90_le_s: quantile(0.90),
        p99_le_s: quantile(0.99),
        p999_le_s: quantile(0.999),
        max_le_s: upper(max_b),
        measured: 0,
        p50_s: None,
        p90_s: None,
        p99_s: None,
        max_s: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drop_slot_is_named_once() {
        let mut all = [0u64; STAT_COUNT as usize];
        for (i, v) in all.iter_mut().enumerate() {
            *v = 100 + i as u64;
        }
        let d = drops(&all);
        let mut pairs: Vec<_> = d.iter().map(|c| (c.probe, c.reason)).collect();
        pairs.sort_unstable();
        pairs.dedup();
        assert_eq!(pairs.len(), d.len(), "a (probe, reason) pair twice: {d:?}");
        for (probe, reason, s) in [
            ("offcpu", "offcpu_start_full", Stat::OffcpuStartFull),
            ("offcpu", "offcpu_full", Stat::OffcpuFull),
            ("offcpu", "stack_failed", Stat::OffcpuStackFailed),
            ("lock_contention", "lock_waits_full", Stat::LockWaitsFull),
            ("lock_contention", "stack_failed", Stat::LockStackFailed),
            ("offcpu", "user_stack_failed", Stat::UserStackFailed),
        ] {
            let c = d.iter().find(|c| c.probe == probe && c.reason == reason);
            assert_eq!(c.map(|c| c.count), Some(100 + s as u64), "{probe}/{reason}: {d:?}");
        }
        // Every slot but the three that count work done (not losses) is a drop.
        let counted: Vec<u64> = d.iter().map(|c| c.count - 100).collect();
        for s in 0..STAT_COUNT as u64 {
            let not_a_drop = [Stat::WaitsStarted as u64, Stat::TailsStarted as u64, Stat::EndedByExit as u64].contains(&s);
            assert_eq!(counted.contains(&s), !not_a_drop, "slot {s}");
        }
    }

    #[test]
    fn summary_bounds() {
        assert!(summarize("fsync", &[0; 32]).is_none());
        let mut c = [0u64; 32];
        c[0] = 99;
        c[22] = 1; // ~4.3 s
        let s = summarize("fsync", &c).unwrap();
        assert_eq!(s.count, 100);
        assert!(s.p99_le_s < 0.01, "{s:?}");
        assert!(s.p50_le_s < 0.01 && s.p90_le_s < 0.01, "{s:?}");
        assert!(s.p999_le_s > 4.0 && s.p999_le_s < 9.0, "{s:?}");
        assert!(s.max_le_s > 4.0 && s.max_le_s < 9.0, "{s:?}");
    }

    /// 100 calls, the 3 slowest (over --warn) measured at 5.06 s, 6.2 s and
    /// 7.5 s: the p99 and the max are those measured values; p50 and p90
    /// fall among the short calls and keep only their bucket bounds.
    #[test]
    fn measured_quantiles_replace_bounds_where_they_fall_among_measured_calls() {
        let mut c = [0u64; 32];
        c[0] = 97;
        c[23] = 3;
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        for us in [5_060_000u64, 6_200_000, 7_500_000] {
            h.record(us).unwrap();
        }
        let s = with_measured(summarize("umount2", &c).unwrap(), Some(&h));
        assert_eq!(s.measured, 3);
        assert_eq!((s.p50_s, s.p90_s), (None, None), "{s:?}");
        // rank 99 of 100 is the 2nd of the 3 measured.
        let p99 = s.p99_s.unwrap();
        assert!((p99 - 6.2).abs() < 0.01, "{s:?}");
        assert!((s.max_s.unwrap() - 7.5).abs() < 0.01, "{s:?}");
        // One call only, measured: every quantile is it.
        let mut one = [0u64; 32];
        one[23] = 1;
        let mut h1 = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        h1.record(5_056_712).unwrap();
        let s = with_measured(summarize("umount2", &one).unwrap(), Some(&h1));
        for q in [s.p50_s, s.p90_s, s.p99_s, s.max_s] {
            assert!((q.unwrap() - 5.0567).abs() < 0.01, "{s:?}");
        }
    }
}
