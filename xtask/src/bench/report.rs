//! The benchmark's results table and median ratios. Numbers are reported, never judged.

use std::fmt::Write as _;

/// The tracers each loop runs under, besides untraced, in table order: plegwatch, then
/// the references it is judged against (see [`super::tracer::REFERENCES`]).
pub const COLUMNS: &[&str] = &["plegwatch", "bpftrace", "floor-raw", "floor-unused", "hook-free", "floor-rawtp", "pw-fallback"];

/// The place of `name` in [`COLUMNS`].
fn column(name: &str) -> usize {
    COLUMNS.iter().position(|c| *c == name).unwrap_or(usize::MAX)
}

/// One (mode, round) measurement, in ns per loop iteration.
#[derive(Clone, Debug)]
pub struct Sample {
    pub mode: &'static str,
    pub round: u32,
    pub untraced: f64,
    /// Per [`COLUMNS`] entry, `None` when that tracer was unavailable or failed to attach.
    pub traced: Vec<Option<f64>>,
}

impl Sample {
    /// The column's time over the untraced one, if measured.
    pub fn ratio(&self, column: usize) -> Option<f64> {
        self.traced.get(column).copied().flatten().map(|t| t / self.untraced)
    }
}

/// The table of every sample, then per mode each column's median ratio with its spread
/// (the lowest and highest ratio over the rounds): these machines are noisy.
pub fn render(samples: &[Sample], modes: &[&str], unit: &str) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:<6} {:>5} {:>10}", "mode", "round", "untraced");
    for c in COLUMNS {
        let _ = write!(out, " {c:>12}");
    }
    let _ = writeln!(out, "   ({unit}; ratio to untraced in brackets)");
    for s in samples {
        let _ = write!(out, "{:<6} {:>5} {:>10.1}", s.mode, s.round, s.untraced);
        for (i, t) in s.traced.iter().enumerate() {
            let cell = match (t, s.ratio(i)) {
                (Some(t), Some(r)) => format!("{t:.0} [{r:.2}]"),
                _ => "-".to_owned(),
            };
            let _ = write!(out, " {cell:>12}");
        }
        let _ = writeln!(out);
    }
    let _ = writeln!(out, "\nmedian ratio (lowest-highest) per mode, traced / untraced, same run:");
    for mode in modes {
        let of_mode: Vec<&Sample> = samples.iter().filter(|s| s.mode == *mode).collect();
        let _ = write!(out, "{mode:<6}");
        for (i, c) in COLUMNS.iter().enumerate() {
            let ratios: Vec<f64> = of_mode.iter().filter_map(|s| s.ratio(i)).collect();
            let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            let cell = match median(ratios.clone()) {
                Some(m) => format!("{m:.2} ({lo:.2}-{hi:.2})"),
                None => "-".to_owned(),
            };
            let _ = write!(out, "  {c} {cell}");
        }
        let _ = writeln!(out, "  ({} rounds)", of_mode.len());
    }
    let _ = writeln!(
        out,
        "floor-raw: one empty program on raw_syscalls:sys_enter; floor-unused: one on a syscall tracepoint the loop never calls \
         (the tracing slow path alone); hook-free: only sched:sched_switch and sock:sock_send_length/sock_recv_length; \
         floor-rawtp: one empty raw_tp program on sys_enter (bpftrace's floor-raw is a classic tracepoint); \
         pw-fallback: plegwatch with PLEGWATCH_FALLBACK=all (the tracepoint variants where the kernel takes fentry/fexit)"
    );
    out
}

/// Latency of one CRI call kind over one relist phase, in µs, as `relist_bench` prints it.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Deserialize)]
pub struct CallStats {
    pub count: u64,
    pub failed: u64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub max_us: f64,
}

/// One figure of a [`CallStats`] (p50, p99, mean, count).
pub type CallFigure = fn(&CallStats) -> f64;

/// One (mode, call, round) of the relist benchmark: the untraced phases just before and
/// just after the one under plegwatch.
#[derive(Clone, Debug)]
pub struct RelistSample {
    pub mode: &'static str,
    pub call: &'static str,
    pub round: u32,
    pub before: CallStats,
    pub plegwatch: CallStats,
    pub after: CallStats,
}

impl RelistSample {
    /// The untraced baseline of a figure: the mean of the phases before and after.
    pub fn untraced(&self, figure: CallFigure) -> f64 {
        (figure(&self.before) + figure(&self.after)) / 2.0
    }

    /// plegwatch over the untraced baseline.
    pub fn ratio(&self, figure: CallFigure) -> f64 {
        figure(&self.plegwatch) / self.untraced(figure)
    }

    /// plegwatch minus the untraced baseline.
    pub fn added(&self, figure: CallFigure) -> f64 {
        figure(&self.plegwatch) - self.untraced(figure)
    }
}

fn p50(s: &CallStats) -> f64 {
    s.p50_us
}
fn p99(s: &CallStats) -> f64 {
    s.p99_us
}
fn mean(s: &CallStats) -> f64 {
    s.mean_us
}
fn calls(s: &CallStats) -> f64 {
    s.count as f64
}

/// The table of every relist sample (µs per call), then the median ratios and added µs
/// per mode and call.
pub fn render_relist(samples: &[RelistSample], modes: &[(&str, u64)], calls_of: &[&str]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "CRI list calls under the relist driver (untr = mean of the untraced phases before and after plegwatch)");
    let _ = writeln!(
        out,
        "{:<6} {:<15} {:>5} {:>8} {:>8} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6}",
        "mode", "call", "round", "calls", "calls", "p50", "p50", "", "p99", "p99", "", "mean", "mean", ""
    );
    let _ = writeln!(
        out,
        "{:<6} {:<15} {:>5} {:>8} {:>8} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6} {:>9} {:>9} {:>6}",
        "", "", "", "untr", "pw", "untr µs", "pw µs", "pw/u", "untr µs", "pw µs", "pw/u", "untr µs", "pw µs", "pw/u"
    );
    for s in samples {
        let _ = writeln!(
            out,
            "{:<6} {:<15} {:>5} {:>8.0} {:>8} {:>9.1} {:>9.1} {:>6.2} {:>9.1} {:>9.1} {:>6.2} {:>9.1} {:>9.1} {:>6.2}",
            s.mode,
            s.call,
            s.round,
            s.untraced(calls),
            s.plegwatch.count,
            s.untraced(p50),
            s.plegwatch.p50_us,
            s.ratio(p50),
            s.untraced(p99),
            s.plegwatch.p99_us,
            s.ratio(p99),
            s.untraced(mean),
            s.plegwatch.mean_us,
            s.ratio(mean),
        );
    }
    let failed: u64 = samples.iter().map(|s| s.before.failed + s.plegwatch.failed + s.after.failed).sum();
    if failed > 0 {
        let _ = writeln!(out, "({failed} failed calls left out of the figures)");
    }
    let _ = writeln!(
        out,
        "
median ratios (plegwatch / untraced, same run) and added µs per call:"
    );
    for &(mode, period_ms) in modes {
        for &call in calls_of {
            let of: Vec<&RelistSample> = samples.iter().filter(|s| s.mode == mode && s.call == call).collect();
            let med = |f: fn(&RelistSample, CallFigure) -> f64, figure| median(of.iter().map(|s| f(s, figure)).collect());
            let pause = match period_ms {
                0 => "back to back".to_owned(),
                ms => format!("{ms} ms apart"),
            };
            let _ = writeln!(
                out,
                "{:<6} {:<15} p50 {:>5} ({:>7} µs)  p99 {:>5} ({:>7} µs)  mean {:>5} ({:>7} µs)  calls {:>5}  ({} rounds, relists {pause})",
                mode,
                call,
                opt(med(RelistSample::ratio, p50), 2),
                signed(med(RelistSample::added, p50)),
                opt(med(RelistSample::ratio, p99), 2),
                signed(med(RelistSample::added, p99)),
                opt(med(RelistSample::ratio, mean), 2),
                signed(med(RelistSample::added, mean)),
                opt(med(RelistSample::ratio, calls), 2),
                of.len(),
            );
        }
    }
    out
}

/// CPU time per relist over one (mode, round): containerd's, where the uprobes' traps and
/// programs run (charged as its system time), in each phase; and plegwatch's own.
#[derive(Clone, Debug)]
pub struct CpuSample {
    pub mode: &'static str,
    pub round: u32,
    pub containerd_before_us: f64,
    pub containerd_plegwatch_us: f64,
    pub containerd_after_us: f64,
    /// plegwatch's CPU time per relist.
    pub plegwatch_us: f64,
    /// plegwatch's CPU time over the phase's wall time.
    pub plegwatch_share: f64,
}

impl CpuSample {
    pub fn containerd_untraced_us(&self) -> f64 {
        (self.containerd_before_us + self.containerd_after_us) / 2.0
    }
}

/// The CPU table: per relist, containerd untraced and under plegwatch, and plegwatch's own.
pub fn render_cpu(samples: &[CpuSample], modes: &[(&str, u64)]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "CPU time per relist (ListPodSandbox + ListContainers), from /proc/PID/stat");
    let _ = writeln!(
        out,
        "{:<6} {:>5} {:>14} {:>14} {:>9} {:>14} {:>10}",
        "mode", "round", "containerd", "containerd", "added", "plegwatch", "plegwatch"
    );
    let _ = writeln!(out, "{:<6} {:>5} {:>14} {:>14} {:>9} {:>14} {:>10}", "", "", "untr µs", "pw µs", "µs", "own µs", "% of core");
    for s in samples {
        let _ = writeln!(
            out,
            "{:<6} {:>5} {:>14.1} {:>14.1} {:>+9.1} {:>14.1} {:>10.1}",
            s.mode,
            s.round,
            s.containerd_untraced_us(),
            s.containerd_plegwatch_us,
            s.containerd_plegwatch_us - s.containerd_untraced_us(),
            s.plegwatch_us,
            s.plegwatch_share * 100.0,
        );
    }
    for &(mode, _) in modes {
        let of: Vec<&CpuSample> = samples.iter().filter(|s| s.mode == mode).collect();
        if of.is_empty() {
            continue;
        }
        let added = median(of.iter().map(|s| s.containerd_plegwatch_us - s.containerd_untraced_us()).collect());
        let own = median(of.iter().map(|s| s.plegwatch_us).collect());
        let share = median(of.iter().map(|s| s.plegwatch_share * 100.0).collect());
        let _ = writeln!(
            out,
            "{mode:<6} median: containerd {} µs per relist under plegwatch, plegwatch's own {} µs per relist ({} % of a core)",
            signed(added),
            opt(own, 1),
            opt(share, 1)
        );
    }
    out
}

/// `+1.5` / `-0.3`, or `-` for none.
fn signed(value: Option<f64>) -> String {
    value.map_or_else(|| "-".to_owned(), |v| format!("{v:+.1}"))
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
    Some(if values.len().is_multiple_of(2) { (values[mid - 1] + values[mid]) / 2.0 } else { values[mid] })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_say_met_not_met_stated_and_not_measured() {
        let figures = [
            Figure::new("fast", "s", vec![0.5, 3.0, 0.7], Target::AtMost(1.0)),
            Figure::new("slow", "x", vec![1.4, 1.6], Target::AtMost(1.25)),
            Figure::new("maps", "MiB", vec![9.4], Target::Stated),
            Figure::new("soak", "MiB", vec![], Target::AtMost(64.0)),
        ];
        assert_eq!(figures.iter().map(Figure::met).collect::<Vec<_>>(), [Some(true), Some(false), None, None]);
        let text = render_figures(&figures);
        let verdict = |name: &str| text.lines().find(|l| l.starts_with(name)).map(|l| l.rsplit("  ").next().unwrap_or("").to_owned());
        assert_eq!(verdict("fast").as_deref(), Some("met"), "{text}");
        assert_eq!(verdict("slow").as_deref(), Some("NOT met"), "{text}");
        assert_eq!(verdict("maps").as_deref(), Some("stated"), "{text}");
        assert_eq!(verdict("soak").as_deref(), Some("not measured"), "{text}");
        assert!(text.contains("0.50-3.00 (n=3)"), "the spread: {text}");
    }

    #[test]
    fn loop_figures_compare_with_bpftrace_round_by_round() {
        let s = |mode, untraced, pw, bt| Sample { mode, round: 1, untraced, traced: vec![Some(pw), Some(bt), None, None, None] };
        let f = loop_figures(&[s("unix", 100.0, 120.0, 200.0), s("fsync", 100.0, 300.0, 350.0)]);
        assert_eq!(f[0].values, [1.2]);
        assert_eq!(f[0].met(), Some(false));
        assert_eq!(f[2].values, [3.0]);
        assert!((f[3].values[0] - 0.6).abs() < 1e-9, "{:?}", f[3]);
        assert_eq!(f[3].met(), Some(true));
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(vec![4.0, 1.0, 2.0, 3.0]), Some(2.5));
        assert_eq!(median(vec![]), None);
        assert_eq!(median(vec![f64::NAN]), None);
    }

    fn stats(p50_us: f64, count: u64) -> CallStats {
        CallStats { count, p50_us, p90_us: p50_us * 1.5, p99_us: p50_us * 3.0, mean_us: p50_us * 1.1, max_us: p50_us * 10.0, failed: 0 }
    }

    #[test]
    fn relist_baseline_is_the_mean_of_before_and_after() {
        let s = RelistSample {
            mode: "paced",
            call: "ListContainers",
            round: 1,
            before: stats(300.0, 1000),
            plegwatch: stats(330.0, 990),
            after: stats(320.0, 1010),
        };
        assert_eq!(s.untraced(p50), 310.0);
        assert!((s.ratio(p50) - 330.0 / 310.0).abs() < 1e-12);
        assert_eq!(s.added(p50), 20.0);
        let text = render_relist(&[s], &[("paced", 10), ("tight", 0)], &["ListContainers"]);
        assert!(text.contains("1.06"), "{text}");
        assert!(text.contains("+20.0 µs"), "{text}");
        assert!(text.contains("10 ms apart"), "{text}");
        // A mode with no samples shows dashes, not NaN.
        assert!(text.contains("tight  ListContainers  p50     -"), "{text}");
    }

    #[test]
    fn table_shows_missing_tracers_as_dash_and_the_spread() {
        let sample = |round, pw| Sample { mode: "unix", round, untraced: 600.0, traced: vec![Some(pw), None, Some(660.0), None, None] };
        let samples = [sample(1, 900.0), sample(2, 690.0), sample(3, 720.0)];
        let text = render(&samples, &["unix"], "ns/op");
        assert!(text.contains("900 [1.50]"), "{text}");
        assert!(text.contains("plegwatch 1.20 (1.15-1.50)"), "{text}");
        assert!(text.contains("bpftrace -"), "{text}");
        assert!(text.contains("floor-raw 1.10 (1.10-1.10)"), "{text}");
    }
}

/// What a figure is held to.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    /// The median must be at most this.
    AtMost(f64),
    /// No bound: the figure is stated (and justified in the docs).
    Stated,
}

/// One figure of issue 12's table: its values over the rounds, and its target.
#[derive(Clone, Debug)]
pub struct Figure {
    pub name: String,
    pub unit: &'static str,
    pub values: Vec<f64>,
    pub target: Target,
}

impl Figure {
    pub fn new(name: &str, unit: &'static str, values: Vec<f64>, target: Target) -> Self {
        Figure { name: name.to_owned(), unit, values, target }
    }

    /// `Some(true)` when the median meets the target; `None` when there is no value or no bound.
    pub fn met(&self) -> Option<bool> {
        let m = median(self.values.clone())?;
        match self.target {
            Target::AtMost(t) => Some(m <= t),
            Target::Stated => None,
        }
    }
}

/// The figures as one table: median, spread over the rounds, target, and whether it is met.
pub fn render_figures(figures: &[Figure]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{:<58} {:>10} {:>19} {:>10}  verdict", "figure", "median", "spread (lo-hi)", "target");
    for f in figures {
        let lo = f.values.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = f.values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let (med, spread) = match median(f.values.clone()) {
            Some(m) => (format!("{} {}", short(m), f.unit), format!("{}-{} (n={})", short(lo), short(hi), f.values.len())),
            None => ("-".to_owned(), "not measured".to_owned()),
        };
        let target = match f.target {
            Target::AtMost(t) => format!("<= {}", short(t)),
            Target::Stated => "stated".to_owned(),
        };
        let verdict = match (f.met(), f.values.is_empty()) {
            (_, true) => "not measured",
            (Some(true), _) => "met",
            (Some(false), _) => "NOT met",
            (None, _) => "stated",
        };
        let _ = writeln!(out, "{:<58} {med:>10} {spread:>19} {target:>10}  {verdict}", f.name);
    }
    out
}

/// A number with the digits that matter at its size.
fn short(v: f64) -> String {
    match v.abs() {
        a if a >= 100.0 => format!("{v:.0}"),
        a if a >= 10.0 => format!("{v:.1}"),
        _ => format!("{v:.2}"),
    }
}

/// The loops' figures: each mode's plegwatch ratio against its target, and, for `unix`,
/// against bpftrace's in the same rounds.
pub fn loop_figures(samples: &[Sample]) -> Vec<Figure> {
    let ratios =
        |mode: &str, column: usize| -> Vec<f64> { samples.iter().filter(|s| s.mode == mode).filter_map(|s| s.ratio(column)).collect() };
    let mut out = Vec::new();
    for (mode, what, target) in [
        ("unix", "socketpair send/recvfrom loop, ratio", 1.10),
        ("unixrw", "unix-socket write/read loop (not D-Bus), ratio", 1.05),
        ("fsync", "fsync on tmpfs loop, ratio", 1.25),
    ] {
        out.push(Figure::new(what, "x", ratios(mode, 0), Target::AtMost(target)));
    }
    // plegwatch's ratio over a reference's, round by round, on the socketpair loop.
    let vs = |reference: &str| -> Vec<f64> {
        let (pw, r) = (column("plegwatch"), column(reference));
        samples.iter().filter(|s| s.mode == "unix").filter_map(|s| Some(s.ratio(pw)? / s.ratio(r)?)).collect()
    };
    out.push(Figure::new("socketpair loop, plegwatch / bpftrace (same round)", "x", vs("bpftrace"), Target::AtMost(1.0)));
    out.push(Figure::new("socketpair loop, plegwatch / empty raw_tp floor (same round)", "x", vs("floor-rawtp"), Target::AtMost(1.0)));
    out
}

/// The relist figures: ListContainers p50 and p99 under plegwatch, ratio to untraced.
pub fn relist_figures(samples: &[RelistSample]) -> Vec<Figure> {
    let of = |figure: CallFigure| -> Vec<f64> { samples.iter().filter(|s| s.call == "ListContainers").map(|s| s.ratio(figure)).collect() };
    vec![
        Figure::new("ListContainers p50 under the relist driver, ratio", "x", of(p50), Target::AtMost(1.05)),
        Figure::new("ListContainers p99 under the relist driver, ratio", "x", of(p99), Target::AtMost(1.05)),
    ]
}
