//! The benchmark's results table and median ratios. Numbers are reported, never judged.

use std::fmt::Write as _;

/// One (mode, round) measurement, in ns per loop iteration.
#[derive(Clone, Debug)]
pub struct Sample {
    pub mode: &'static str,
    pub round: u32,
    pub untraced: f64,
    pub plegwatch: f64,
    /// `None` when bpftrace was unavailable or failed to attach.
    pub bpftrace: Option<f64>,
}

impl Sample {
    pub fn plegwatch_ratio(&self) -> f64 {
        self.plegwatch / self.untraced
    }

    pub fn bpftrace_ratio(&self) -> Option<f64> {
        self.bpftrace.map(|b| b / self.untraced)
    }
}

/// The table of every sample, then the median ratios per mode.
pub fn render(samples: &[Sample], modes: &[&str]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<6} {:>5} {:>12} {:>12} {:>12} {:>10} {:>10}",
        "mode", "round", "untraced", "plegwatch", "bpftrace", "pw/untr", "bt/untr"
    );
    let _ = writeln!(
        out,
        "{:<6} {:>5} {:>12} {:>12} {:>12}",
        "", "", "ns/op", "ns/op", "ns/op"
    );
    for s in samples {
        let _ = writeln!(
            out,
            "{:<6} {:>5} {:>12.1} {:>12.1} {:>12} {:>10.2} {:>10}",
            s.mode,
            s.round,
            s.untraced,
            s.plegwatch,
            opt(s.bpftrace, 1),
            s.plegwatch_ratio(),
            opt(s.bpftrace_ratio(), 2),
        );
    }
    let _ = writeln!(out, "\nmedian ratios (traced / untraced, same run):");
    for mode in modes {
        let of_mode: Vec<&Sample> = samples.iter().filter(|s| s.mode == *mode).collect();
        let pw = median(of_mode.iter().map(|s| s.plegwatch_ratio()).collect());
        let bt = median(of_mode.iter().filter_map(|s| s.bpftrace_ratio()).collect());
        let _ = writeln!(
            out,
            "{:<6} plegwatch {:>6}   bpftrace {:>6}   ({} rounds)",
            mode,
            opt(pw, 2),
            opt(bt, 2),
            of_mode.len()
        );
    }
    out
}

fn opt(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:.decimals$}"))
}

/// The median, or `None` for no values.
pub fn median(mut values: Vec<f64>) -> Option<f64> {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return None;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    Some(if values.len().is_multiple_of(2) {
        (values[mid - 1] + values[mid]) / 2.0
    } else {
        values[mid]
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![f64::NAN]), None);
    }

    #[test]
    fn table_shows_missing_bpftrace_as_dash() {
        let samples = [Sample {
            mode: "unix",
            round: 1,
            untraced: 600.0,
            plegwatch: 900.0,
            bpftrace: None,
        }];
        let text = render(&samples, &["unix"]);
        assert!(text.contains("1.50"), "{text}");
        assert!(text.contains("bpftrace      -"), "{text}");
    }
}
