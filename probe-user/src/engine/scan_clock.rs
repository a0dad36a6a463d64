//! The scheduler's own clock: how late each scan starts after its tick, how long it
//! takes, where the slowest one's time went, and the longest slice spent attaching
//! uprobes (the summary's `scans`).

use std::time::{Duration, Instant};

/// How late each scan starts after its tick, and how long it takes (µs;
/// none if the histogram could not be made, which fixed bounds rule out).
pub(super) struct ScanClock {
    late: Option<hdrhistogram::Histogram<u64>>,
    took: Option<hdrhistogram::Histogram<u64>>,
    attach_max: Duration,
    /// The slowest scan's phases.
    slowest: Option<(Duration, Vec<(&'static str, Duration)>)>,
}

impl Default for ScanClock {
    fn default() -> Self {
        let h = || hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2).ok();
        ScanClock { late: h(), took: h(), attach_max: Duration::ZERO, slowest: None }
    }
}

impl ScanClock {
    pub(super) fn late(&mut self, d: Duration) {
        if let Some(h) = self.late.as_mut() {
            let _ = h.record(d.as_micros().max(1) as u64);
        }
    }

    /// A scan's end: its length, and its phases kept if it is the slowest yet.
    pub(super) fn took(&mut self, d: Duration, phases: Phases) {
        if let Some(h) = self.took.as_mut() {
            let _ = h.record(d.as_micros().max(1) as u64);
        }
        if self.slowest.as_ref().is_none_or(|(max, _)| d > *max) {
            self.slowest = Some((d, phases.marks));
        }
    }

    pub(super) fn attach_took(&mut self, d: Duration) {
        self.attach_max = self.attach_max.max(d);
    }

    pub(super) fn summary(&self) -> crate::events::ScanSummary {
        let q = |h: &Option<hdrhistogram::Histogram<u64>>, q: f64| h.as_ref().map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1e3);
        crate::events::ScanSummary {
            scans: self.late.as_ref().map_or(0, |h| h.len()),
            late_p50_ms: q(&self.late, 0.5),
            late_p99_ms: q(&self.late, 0.99),
            late_max_ms: q(&self.late, 1.0),
            took_p50_ms: q(&self.took, 0.5),
            took_p99_ms: q(&self.took, 0.99),
            go_attach_max_ms: self.attach_max.as_secs_f64() * 1e3,
            took_max_ms: q(&self.took, 1.0),
            slowest: self.slowest.as_ref().map_or_else(Vec::new, |(_, marks)| {
                marks
                    .iter()
                    .filter(|(_, d)| *d >= Duration::from_micros(100))
                    .map(|&(phase, d)| crate::events::PhaseTime { phase, ms: d.as_secs_f64() * 1e3 })
                    .collect()
            }),
        }
    }
}

/// Where one scan's time went, phase by phase, in the order they ran.
pub(super) struct Phases {
    last: Instant,
    marks: Vec<(&'static str, Duration)>,
}

impl Phases {
    pub(super) fn start() -> Self {
        Phases { last: Instant::now(), marks: Vec::with_capacity(16) }
    }

    /// Closes the phase that ran since the last mark, under `name`.
    pub(super) fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.marks.push((name, now.saturating_duration_since(self.last)));
        self.last = now;
    }

    /// Closes the phase that ran since the last mark as `parts` (measured inside it) and
    /// the rest of it under `rest`.
    pub(super) fn mark_parts(&mut self, parts: &[(&'static str, Duration)], rest: &'static str) {
        let now = Instant::now();
        let total = now.saturating_duration_since(self.last);
        let inside: Duration = parts.iter().map(|p| p.1).sum();
        self.marks.extend_from_slice(parts);
        self.marks.push((rest, total.saturating_sub(inside)));
        self.last = now;
    }
}
