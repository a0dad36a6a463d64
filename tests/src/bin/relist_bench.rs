//! `relist_bench`: the CRI side of `cargo xtask bench`'s relist benchmark.
//!
//! Starts a private containerd (Debian's 1.6.20, through the test bed's [`Containerd`]),
//! imports the busybox images, runs one host-network pod with `--containers N` running
//! containers (busybox `sleep`), so that every `ListContainers` has work and takes each
//! container's Status lock for reading (`(*statusStorage).Get`). Then it prints
//! `{"type":"ready",...}` on stdout and reads commands on stdin, one a line:
//!
//! - `measure LABEL SECONDS PERIOD_MS`: runs the test bed's [`RelistDriver`] (kubelet's relist:
//!   `ListPodSandbox` then `ListContainers`, then a pause of `PERIOD_MS`; 0 for a tight loop)
//!   for `SECONDS`, and prints one JSON line with the latency of every call it made:
//!   `{"type":"phase","label","seconds","period_ms","relists","containers",
//!   "calls":{"ListContainers":{"count","failed","p50_us","p90_us","p99_us","mean_us","max_us"},
//!   "ListPodSandbox":{...}}}`;
//! - `quit`, or the end of stdin: tears everything down (the pod through CRI, then
//!   containerd and what it left) and exits.
//!
//! Logs go to stderr. Needs root, like the rest of the test bed. `cargo xtask bench` builds
//! it with `--release` and drives it, starting and stopping plegwatch between phases while
//! containerd stays up.

use std::io::{BufRead, Write};
use std::process::ExitCode;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use plegwatch_scenarios::containerd::cri::{self, ListCall, TimedCall};
use plegwatch_scenarios::containerd::{self, image, Containerd, Cri, Placement, Pod, RelistDriver};

/// Running containers in the pod unless `--containers` says otherwise.
const DEFAULT_CONTAINERS: usize = 3;
/// How long a stopping driver may wait for the relist under way.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest accepted phase.
const MAX_SECONDS: f64 = 3600.0;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relist_bench: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let containers = parse_args()?;
    // Panics with the reason when root or a program is missing.
    containerd::require();

    // Guards in set-up order: they drop in reverse (the pod through CRI, then containerd).
    let daemon = Containerd::start(Placement::TempDir)?;
    image::import_test_images(&daemon)?;
    let cri = daemon.cri()?;
    let config = cri::host_network_pod("relist-bench", daemon.cgroup_parent(), &daemon.pod_log_dir())?;
    let pod = Pod::run(&cri, config)?;
    for i in 0..containers {
        let config = cri::container(&format!("sleeper-{i}"), image::BUSYBOX, &["/bin/sleep", "2147483647"]);
        pod.run_container(&config).with_context(|| format!("run container sleeper-{i}\n{}", daemon.log_tail(20)))?;
    }
    let running = running_containers(&cri)?;
    if running != containers {
        bail!("{running} containers run in the pod, not {containers}");
    }
    emit(&json!({
        "type": "ready",
        "containerd_pid": daemon.pid(),
        "socket": daemon.socket(),
        "pod": pod.id(),
        "containers": running,
    }))?;

    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line.context("read a command from stdin")?;
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            [] => continue,
            ["quit"] => break,
            ["measure", label, seconds, period_ms] => {
                let seconds: f64 = seconds
                    .parse()
                    .ok()
                    .filter(|s: &f64| *s > 0.0 && *s <= MAX_SECONDS)
                    .with_context(|| format!("bad SECONDS in {line:?}"))?;
                let period_ms: u64 = period_ms.parse().with_context(|| format!("bad PERIOD_MS in {line:?}"))?;
                let phase = measure(&cri, label, seconds, period_ms)?;
                emit(&phase)?;
            }
            _ => bail!("unknown command {line:?} (measure LABEL SECONDS PERIOD_MS | quit)"),
        }
    }
    eprintln!("relist_bench: tearing down");
    drop(pod);
    drop(daemon);
    Ok(())
}

/// `[--containers N]`.
fn parse_args() -> Result<usize> {
    let mut containers = DEFAULT_CONTAINERS;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--containers" => {
                containers = args
                    .next()
                    .and_then(|n| n.parse().ok())
                    .filter(|n| (1..=50).contains(n))
                    .context("--containers takes a number from 1 to 50")?;
            }
            _ => bail!("usage: relist_bench [--containers N] (then commands on stdin)"),
        }
    }
    Ok(containers)
}

fn emit(value: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").context("write to stdout")?;
    out.flush().context("flush stdout")
}

/// The pod's containers that run.
fn running_containers(cri: &Cri) -> Result<usize> {
    let running = cri::ContainerState::ContainerRunning as i32;
    Ok(cri.list_containers()?.iter().filter(|c| c.state == running).count())
}

/// One phase: the relist driver for `seconds`, then the latency of each list call.
fn measure(cri: &Cri, label: &str, seconds: f64, period_ms: u64) -> Result<Value> {
    let started = Instant::now();
    let driver = RelistDriver::start(cri, Duration::from_millis(period_ms));
    thread::sleep(Duration::from_secs_f64(seconds));
    let calls = driver.stop(STOP_TIMEOUT);
    let elapsed = started.elapsed().as_secs_f64();
    let relists = calls.iter().map(|c| c.relist + 1).max().unwrap_or(0);
    let containers = running_containers(cri)?;
    let stats = |call| {
        let s = Stats::of(&calls, call);
        eprintln!(
            "relist_bench: {label}: {} x{} ({} failed): p50 {:.1} us, p99 {:.1} us, mean {:.1} us, max {:.1} us",
            call.method(),
            s.count,
            s.failed,
            s.p50_us,
            s.p99_us,
            s.mean_us,
            s.max_us
        );
        s.to_json()
    };
    Ok(json!({
        "type": "phase",
        "label": label,
        "seconds": elapsed,
        "period_ms": period_ms,
        "relists": relists,
        "containers": containers,
        "calls": {
            "ListContainers": stats(ListCall::Containers),
            "ListPodSandbox": stats(ListCall::PodSandbox),
        },
    }))
}

/// Latency of the successful calls of one kind, in µs; quantiles by nearest rank.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Stats {
    count: usize,
    failed: usize,
    p50_us: f64,
    p90_us: f64,
    p99_us: f64,
    mean_us: f64,
    max_us: f64,
}

impl Stats {
    fn of(calls: &[TimedCall], call: ListCall) -> Self {
        let of_kind = calls.iter().filter(|c| c.call == call);
        let failed = of_kind.clone().filter(|c| c.error.is_some()).count();
        let mut us: Vec<f64> = of_kind.filter(|c| c.error.is_none()).map(|c| c.latency.as_secs_f64() * 1e6).collect();
        us.sort_by(f64::total_cmp);
        Self::from_sorted(&us, failed)
    }

    fn from_sorted(us: &[f64], failed: usize) -> Self {
        let Some(&max_us) = us.last() else {
            return Self { failed, ..Self::default() };
        };
        let rank = |q: f64| us[((q * us.len() as f64).ceil() as usize).clamp(1, us.len()) - 1];
        Self {
            count: us.len(),
            failed,
            p50_us: rank(0.50),
            p90_us: rank(0.90),
            p99_us: rank(0.99),
            mean_us: us.iter().sum::<f64>() / us.len() as f64,
            max_us,
        }
    }

    fn to_json(self) -> Value {
        let round = |v: f64| (v * 10.0).round() / 10.0;
        json!({
            "count": self.count,
            "failed": self.failed,
            "p50_us": round(self.p50_us),
            "p90_us": round(self.p90_us),
            "p99_us": round(self.p99_us),
            "mean_us": round(self.mean_us),
            "max_us": round(self.max_us),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_quantiles() {
        let us: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Stats::from_sorted(&us, 2);
        assert_eq!((s.count, s.failed), (100, 2));
        assert_eq!((s.p50_us, s.p90_us, s.p99_us, s.max_us), (50.0, 90.0, 99.0, 100.0));
        assert_eq!(s.mean_us, 50.5);
        let one = Stats::from_sorted(&[7.0], 0);
        assert_eq!((one.p50_us, one.p99_us), (7.0, 7.0));
        assert_eq!(Stats::from_sorted(&[], 3).count, 0);
    }
}
