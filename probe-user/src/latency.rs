//! Latency tables of probed Go calls (HdrHistogram, 3 significant digits,
//! 1 µs to 1 hour), by target and function: what a CRI handler, a Status lock
//! or a relist usually takes next to what it took when it stalled.

use hdrhistogram::Histogram;
use serde::Serialize;
use std::collections::BTreeMap;
use std::time::Duration;

/// Highest value tracked, in µs (longer calls are clamped to it).
const MAX_US: u64 = 3_600_000_000;

/// One row of a latency table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct LatencyRow {
    pub target: String,
    pub function: String,
    pub count: u64,
    pub p50_s: f64,
    pub p90_s: f64,
    pub p99_s: f64,
    /// The 99.9th percentile (incident bundles' `latency.json`).
    pub p999_s: f64,
    pub max_s: f64,
}

/// Histograms by (target, function).
#[derive(Default)]
pub struct LatencyTables {
    tables: BTreeMap<(String, String), Histogram<u64>>,
}

impl LatencyTables {
    /// Records one call.
    pub fn record(&mut self, target: &str, function: &str, took: Duration) {
        let key = (target.to_string(), function.to_string());
        let h = match self.tables.get_mut(&key) {
            Some(h) => h,
            None => match Histogram::new_with_bounds(1, MAX_US, 3) {
                Ok(h) => self.tables.entry(key).or_insert(h),
                Err(_) => return,
            },
        };
        let us = u64::try_from(took.as_micros()).unwrap_or(MAX_US).clamp(1, MAX_US);
        h.saturating_record(us);
    }

    /// One table's histogram, if anything was recorded in it.
    pub fn histogram(&self, target: &str, function: &str) -> Option<&Histogram<u64>> {
        self.tables.get(&(target.to_string(), function.to_string()))
    }

    /// Every table, as rows sorted by target then function.
    pub fn rows(&self) -> Vec<LatencyRow> {
        let s = |us: u64| us as f64 / 1e6;
        self.tables
            .iter()
            .map(|((target, function), h)| LatencyRow {
                target: target.clone(),
                function: function.clone(),
                count: h.len(),
                p50_s: s(h.value_at_quantile(0.50)),
                p90_s: s(h.value_at_quantile(0.90)),
                p99_s: s(h.value_at_quantile(0.99)),
                p999_s: s(h.value_at_quantile(0.999)),
                max_s: s(h.max()),
            })
            .collect()
    }
}

/// The rows as an aligned text table.
pub fn render_table(rows: &[LatencyRow]) -> String {
    let width = rows.iter().map(|r| r.target.len() + r.function.len() + 1).max().unwrap_or(0).max(8);
    let mut out = format!("    {:<width$} {:>8} {:>10} {:>10} {:>10} {:>10}", "go call", "count", "p50", "p90", "p99", "max");
    for r in rows {
        let name = format!("{} {}", r.target, r.function);
        out.push_str(&format!(
            "\n    {name:<width$} {:>8} {:>10} {:>10} {:>10} {:>10}",
            r.count,
            secs(r.p50_s),
            secs(r.p90_s),
            secs(r.p99_s),
            secs(r.max_s)
        ));
    }
    out
}

/// `1.2ms`, `35µs`, `24.07s`, `3m05s`: three figures where they matter.
pub fn secs(s: f64) -> String {
    if s >= 59.995 {
        crate::durations::human_secs(s)
    } else if s >= 1.0 {
        format!("{s:.2}s")
    } else if s >= 1e-3 {
        format!("{:.1}ms", s * 1e3)
    } else {
        format!("{:.0}µs", s * 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_by_function() {
        let mut t = LatencyTables::default();
        for i in 1..=100u64 {
            t.record("containerd", "server.(*criService).ListContainers", Duration::from_micros(i * 10));
        }
        t.record("containerd", "container.(*statusStorage).UpdateSync", Duration::from_secs(24));
        let rows = t.rows();
        assert_eq!(rows.len(), 2);
        let list = rows.iter().find(|r| r.function.ends_with("ListContainers")).expect("row");
        assert_eq!(list.count, 100);
        assert!((list.p50_s - 500e-6).abs() < 1e-6, "{list:?}");
        assert!((list.p99_s - 990e-6).abs() < 1e-6, "{list:?}");
        assert!((list.max_s - 1000e-6).abs() < 1e-6, "{list:?}");
        assert!((list.p999_s - 1000e-6).abs() < 1e-6, "{list:?}");
        let upd = rows.iter().find(|r| r.function.ends_with("UpdateSync")).expect("row");
        assert!((upd.max_s - 24.0).abs() < 0.03, "{upd:?}");
        let text = render_table(&rows);
        assert!(text.contains("24.0") && text.contains("500µs"), "{text}");
    }

    #[test]
    fn zero_and_huge_are_clamped() {
        let mut t = LatencyTables::default();
        t.record("kubelet", "relist", Duration::ZERO);
        t.record("kubelet", "relist", Duration::from_secs(10 * 3600));
        let r = &t.rows()[0];
        assert_eq!(r.count, 2);
        assert!(r.max_s >= 3599.0 && r.max_s <= 3601.0, "{r:?}");
    }
}
