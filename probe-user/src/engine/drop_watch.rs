//! Warns when the kernel drops records: one line per probe and reason that grew, at
//! most every few seconds.

use crate::sources::stats;
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// Warns, at most every few seconds, when any of the kernel's drop counters
/// grows: one line per probe and reason that grew.
#[derive(Default)]
pub(super) struct DropWatch {
    last_check: Option<Instant>,
    seen: HashMap<(&'static str, &'static str), u64>,
}

impl DropWatch {
    const EVERY: Duration = Duration::from_secs(5);

    pub(super) fn check(&mut self, ebpf: &aya::Ebpf) {
        if self.last_check.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        self.last_check = Some(Instant::now());
        for d in stats::drops(&stats::counters(ebpf)) {
            let seen = self.seen.entry((d.probe, d.reason)).or_default();
            if d.count > *seen {
                tracing::warn!(
                    probe = d.probe,
                    reason = d.reason,
                    new = d.count - *seen,
                    total = d.count,
                    "the kernel dropped records: {}",
                    drop_effect(d.reason)
                );
                *seen = d.count;
            }
        }
    }
}

/// What a drop of `reason` costs the output, for the warning.
fn drop_effect(reason: &str) -> &'static str {
    match reason {
        "inflight_full" | "ringbuf_full" => "affected waits are missed or timed approximately",
        "offcpu_start_full" | "offcpu_full" => "some D-state time is missing from the off-CPU figures",
        "lock_waits_full" => "some kernel-mutex waits are not linked to their owner",
        "stack_failed" | "user_stack_failed" => "some stacks are missing (a full stack map, or a hash collision)",
        _ => "some requests or details are missing",
    }
}
