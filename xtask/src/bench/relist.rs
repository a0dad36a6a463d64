//! The relist benchmark: the latency plegwatch's Go probes add to containerd's
//! `ListContainers` (and `ListPodSandbox`), as kubelet's PLEG relist calls them.
//!
//! The `relist_bench` driver (`tests/src/bin/relist_bench.rs`) keeps a private containerd
//! 1.6.20 up for the whole benchmark, with one host-network pod of a few running busybox
//! containers, and measures a phase of the test bed's relist driver on each `measure`
//! command it reads on stdin. Each round measures every mode untraced, then under
//! `plegwatch watch --json` (once plegwatch's `target` line says it probes containerd's
//! binary), then untraced again; the untraced baseline of a round is the mean of the two,
//! which cancels a slow drift. Alongside, containerd's CPU time per relist (the uprobes'
//! traps and programs run in its threads) and plegwatch's own. Nothing here fails on a
//! number.
//!
//! The driver is built with `--release`: a debug gRPC client would add its own hundreds of
//! µs to every call and dilute the ratios.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use super::driver::LineDriver;
use super::report::{CallStats, CpuSample, RelistSample};
use super::tracer::{self, Tracer};
use crate::cmd;

/// The scenario crate and its driver binary.
const PACKAGE: &str = "plegwatch-scenarios";
const DRIVER: &str = "relist_bench";

/// Relist modes: the pause between relists, in ms (0: back to back).
pub const MODES: &[(&str, u64)] = &[("paced", 10), ("tight", 0)];
/// The calls reported, as the driver names them.
pub const CALLS: &[&str] = &["ListContainers", "ListPodSandbox"];

/// How long the driver may take to start containerd, import the images and run the pod.
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long a phase may overrun its length (the relist under way, the stats).
const PHASE_GRACE: Duration = Duration::from_secs(60);
/// How long the driver may take to tear the pod and containerd down.
const QUIT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long plegwatch may take, once ready, to say that it probes containerd.
const PROBED_TIMEOUT: Duration = Duration::from_secs(15);
/// How long to wait for other tracers to exit before a phase (then it is measured anyway,
/// with a warning in the report).
const OTHER_TRACERS_TIMEOUT: Duration = Duration::from_secs(120);
/// An unreported relist phase before the first round, so the first untraced phase does not
/// pay for cold caches.
const WARMUP_SECONDS: f64 = 2.0;

/// What `cargo xtask bench` asks of the relist benchmark.
pub struct Config<'a> {
    pub plegwatch: &'a Path,
    pub driver: &'a Path,
    pub log_dir: &'a Path,
    pub rounds: u32,
    pub seconds: f64,
    pub containers: u32,
}

/// `cargo build --release -p plegwatch-scenarios --bin relist_bench`; returns the binary.
pub fn build_driver() -> Result<PathBuf> {
    cmd::run(cmd::cargo().args(["build", "--release", "-p", PACKAGE, "--bin", DRIVER]))?;
    Ok(cmd::target_dir().join("release").join(DRIVER))
}

/// What the relist benchmark measured.
pub struct Results {
    /// Every round, mode and call.
    pub calls: Vec<RelistSample>,
    /// Every round and mode.
    pub cpu: Vec<CpuSample>,
    /// For the report: other tracers that ran meanwhile.
    pub warnings: Vec<String>,
    /// The 1-minute load average before the first round and after the last.
    pub load: (Option<f64>, Option<f64>),
}

/// Every round: each mode untraced, under plegwatch, untraced again.
pub fn measure(config: &Config) -> Result<Results> {
    let mut driver = Driver::start(config.driver, config.containers, config.log_dir)?;
    eprintln!(
        "bench: relist driver ready: containerd pid {}, {} running container(s) in one pod",
        driver.ready.containerd_pid, driver.ready.containers
    );
    driver.measure("warmup", WARMUP_SECONDS, 0)?;

    let mut results = Results { calls: Vec::new(), cpu: Vec::new(), warnings: Vec::new(), load: (load_average(), None) };
    for round in 1..=config.rounds {
        let mut phases = |driver: &mut Driver, label: &str, plegwatch: Option<u32>| {
            let own: Vec<u32> = plegwatch.into_iter().collect();
            let others = wait_for_other_tracers(&own);
            let measured = measure_modes(driver, label, config.seconds, plegwatch);
            let mut others_after = other_tracers(&own);
            others_after.retain(|o| !others.contains(o));
            let others: Vec<String> = others.into_iter().chain(others_after).collect();
            if !others.is_empty() {
                let warning = format!(
                    "round {round}, {label} phases: other tracers ran, whose probes may have \
                     traced them too: {}",
                    others.join(", ")
                );
                eprintln!("bench: warning: {warning}");
                results.warnings.push(warning);
            }
            measured
        };
        let before = phases(&mut driver, "untraced", None)?;
        let pw = plegwatch_on_containerd(config.plegwatch, config.log_dir, driver.ready.containerd_pid)?;
        let traced = phases(&mut driver, "plegwatch", Some(pw.pid()));
        pw.stop();
        let traced = traced?;
        let after = phases(&mut driver, "untraced", None)?;

        for (i, &(mode, _)) in MODES.iter().enumerate() {
            for &call in CALLS {
                let sample = RelistSample {
                    mode,
                    call,
                    round,
                    before: before[i].phase.call(call)?,
                    plegwatch: traced[i].phase.call(call)?,
                    after: after[i].phase.call(call)?,
                };
                eprintln!(
                    "bench: round {round} relist {mode:<5} {call:<14}: untraced p50 {:.1} us, \
                     plegwatch {:.1} us ({:.2}); mean {:.1} / {:.1} us ({:.2}); calls {} / {}",
                    sample.untraced(|s| s.p50_us),
                    sample.plegwatch.p50_us,
                    sample.ratio(|s| s.p50_us),
                    sample.untraced(|s| s.mean_us),
                    sample.plegwatch.mean_us,
                    sample.ratio(|s| s.mean_us),
                    sample.untraced(|s| s.count as f64).round(),
                    sample.plegwatch.count,
                );
                results.calls.push(sample);
            }
            let cpu = CpuSample {
                mode,
                round,
                containerd_before_us: before[i].containerd_us_per_relist(),
                containerd_plegwatch_us: traced[i].containerd_us_per_relist(),
                containerd_after_us: after[i].containerd_us_per_relist(),
                plegwatch_us: traced[i].plegwatch_us_per_relist().unwrap_or(f64::NAN),
                plegwatch_share: traced[i].plegwatch_share().unwrap_or(f64::NAN),
            };
            eprintln!(
                "bench: round {round} relist {mode:<5} CPU per relist: containerd {:.1} us \
                 untraced, {:.1} us under plegwatch; plegwatch itself {:.1} us ({:.1}% of a core)",
                cpu.containerd_untraced_us(),
                cpu.containerd_plegwatch_us,
                cpu.plegwatch_us,
                cpu.plegwatch_share * 100.0
            );
            results.cpu.push(cpu);
        }
    }
    results.load.1 = load_average();
    driver.quit();
    Ok(results)
}

/// The 1-minute load average (`/proc/loadavg`): what else ran on the machine meanwhile.
fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// A phase, with the CPU time containerd (and plegwatch, if it ran) used meanwhile.
struct Measured {
    phase: Phase,
    containerd_cpu: Duration,
    plegwatch_cpu: Option<Duration>,
}

impl Measured {
    fn containerd_us_per_relist(&self) -> f64 {
        per_relist_us(self.containerd_cpu, self.phase.relists)
    }

    fn plegwatch_us_per_relist(&self) -> Option<f64> {
        Some(per_relist_us(self.plegwatch_cpu?, self.phase.relists))
    }

    /// plegwatch's CPU time over the phase's wall time: the share of one core it used.
    fn plegwatch_share(&self) -> Option<f64> {
        Some(self.plegwatch_cpu?.as_secs_f64() / self.phase.seconds)
    }
}

fn per_relist_us(cpu: Duration, relists: u64) -> f64 {
    cpu.as_secs_f64() * 1e6 / relists as f64
}

/// One phase of each mode, in [`MODES`] order, with containerd's and plegwatch's CPU time.
fn measure_modes(driver: &mut Driver, label: &str, seconds: f64, plegwatch: Option<u32>) -> Result<Vec<Measured>> {
    let containerd = driver.ready.containerd_pid;
    MODES
        .iter()
        .map(|&(mode, period_ms)| {
            let cpu_before = (cpu_time(containerd)?, plegwatch.map(cpu_time).transpose()?);
            let phase = driver.measure(&format!("{label}-{mode}"), seconds, period_ms)?;
            let containerd_cpu = cpu_time(containerd)?.saturating_sub(cpu_before.0);
            let plegwatch_cpu = match (plegwatch, cpu_before.1) {
                (Some(pid), Some(before)) => Some(cpu_time(pid)?.saturating_sub(before)),
                _ => None,
            };
            Ok(Measured { phase, containerd_cpu, plegwatch_cpu })
        })
        .collect()
}

/// User plus system CPU time of a process so far (`/proc/PID/stat`, fields 14 and 15).
pub(super) fn cpu_time(pid: u32) -> Result<Duration> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).with_context(|| format!("cannot read {path}"))?;
    cpu_time_of_stat(&stat).with_context(|| format!("{path}: no utime and stime in {stat:?}"))
}

fn cpu_time_of_stat(stat: &str) -> Option<Duration> {
    // The comm (field 2) is in parentheses and may hold spaces: count from the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = u64::try_from(ticks).ok().filter(|&t| t > 0)?;
    Some(Duration::from_secs_f64((utime + stime) as f64 / ticks as f64))
}

/// `plegwatch watch --json`, ready, and having said on stdout that it probes containerd's
/// binary: its `{"type":"target","target":"containerd","status":"probed"}` line (a
/// `"traced"` one when that binary was probed for another containerd first: uprobes cover
/// every process running a binary). plegwatch looks for Go binaries before it is ready, then
/// on every exec and poll.
fn plegwatch_on_containerd(bin: &Path, log_dir: &Path, containerd: u32) -> Result<Tracer> {
    let exe = std::fs::read_link(format!("/proc/{containerd}/exe"))
        .with_context(|| format!("containerd (pid {containerd}): readlink /proc/{containerd}/exe"))?;
    let exe = exe.to_string_lossy().into_owned();
    let mut pw = tracer::plegwatch(bin, log_dir)?;
    let line = pw.wait_for(PROBED_TIMEOUT, &format!("{{\"type\":\"target\",\"target\":\"containerd\"}} line for {exe}"), |l| {
        containerd_target(l, &exe).is_some()
    })?;
    let target = containerd_target(&line, &exe).with_context(|| format!("plegwatch's target line changed: {line}"))?;
    match target.status.as_str() {
        "probed" | "traced" => {}
        status => {
            bail!("plegwatch did not probe containerd ({exe}): status {status}: {}", target.why.as_deref().unwrap_or("(no reason given)"))
        }
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        eprintln!("bench: plegwatch probes containerd ({exe}, {}): {}", target.status, target.functions.join(", "));
    });
    Ok(pw)
}

/// plegwatch's `target` line (docs/output-contract.md).
#[derive(Debug, Deserialize)]
struct Target {
    #[serde(rename = "type")]
    kind: String,
    target: String,
    status: String,
    binary: String,
    #[serde(default)]
    functions: Vec<String>,
    why: Option<String>,
}

/// The `target` line of a plegwatch stdout line, if it is about containerd's binary `exe`.
fn containerd_target(line: &str, exe: &str) -> Option<Target> {
    let t: Target = serde_json::from_str(line).ok()?;
    (t.kind == "target" && t.target == "containerd" && t.binary == exe).then_some(t)
}

/// [`other_tracers`], after waiting up to [`OTHER_TRACERS_TIMEOUT`] for them to exit (the
/// privileged scenarios run plegwatch for a few seconds at a time).
fn wait_for_other_tracers(own: &[u32]) -> Vec<String> {
    let deadline = Instant::now() + OTHER_TRACERS_TIMEOUT;
    let mut said = false;
    loop {
        let others = other_tracers(own);
        if others.is_empty() || Instant::now() >= deadline {
            return others;
        }
        if !said {
            eprintln!("bench: waiting up to {}s for other tracers to exit: {}", OTHER_TRACERS_TIMEOUT.as_secs(), others.join(", "));
            said = true;
        }
        thread::sleep(Duration::from_millis(500));
    }
}

/// Other processes named `plegwatch` (or `bpftrace`): their probes would trace the
/// "untraced" phases too, since uprobes cover every process running a binary.
fn other_tracers(own: &[u32]) -> Vec<String> {
    crate::cmd::processes()
        .into_iter()
        .filter(|(pid, comm)| !own.contains(pid) && matches!(comm.as_str(), "plegwatch" | "bpftrace"))
        .map(|(pid, comm)| format!("{comm} (pid {pid})"))
        .collect()
}

/// The driver's first line.
#[derive(Debug, Deserialize)]
struct Ready {
    containerd_pid: u32,
    containers: u32,
}

/// One `measure` answer.
#[derive(Debug, Deserialize)]
pub struct Phase {
    pub label: String,
    /// Wall time of the phase.
    pub seconds: f64,
    pub relists: u64,
    pub calls: std::collections::HashMap<String, CallStats>,
}

impl Phase {
    fn call(&self, call: &str) -> Result<CallStats> {
        self.calls.get(call).copied().with_context(|| format!("phase {} has no {call} stats", self.label))
    }
}

/// The running driver. Dropping it closes its stdin, which makes it tear down, and waits.
struct Driver {
    inner: LineDriver,
    ready: Ready,
}

impl Driver {
    /// Spawn `relist_bench --containers N` (see [`LineDriver::start`]) and wait for its
    /// ready line.
    fn start(bin: &Path, containers: u32, log_dir: &Path) -> Result<Self> {
        let mut command = Command::new(bin);
        command.args(["--containers", &containers.to_string()]);
        let inner = LineDriver::start(DRIVER, command, log_dir, QUIT_TIMEOUT, "containerd and shims")?;
        let ready = inner.wait_line(READY_TIMEOUT, "ready")?;
        let ready = serde_json::from_str(&ready).with_context(|| format!("`{}` printed a bad ready line: {ready}", inner.line))?;
        Ok(Driver { inner, ready })
    }

    /// `measure LABEL SECONDS PERIOD_MS`, and its answer.
    fn measure(&mut self, label: &str, seconds: f64, period_ms: u64) -> Result<Phase> {
        self.inner.send(&format!("measure {label} {seconds} {period_ms}"))?;
        let timeout = Duration::from_secs_f64(seconds) + PHASE_GRACE;
        let answer = self.inner.wait_line(timeout, "phase")?;
        serde_json::from_str(&answer).with_context(|| format!("`{}` printed a bad phase line: {answer}", self.inner.line))
    }

    /// Close stdin and wait for the teardown; a failed one is a warning (the numbers are in).
    fn quit(self) {
        if let Err(e) = self.inner.quit() {
            eprintln!("bench: warning: {DRIVER}: {e:#}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_lines() {
        let exe = "/usr/bin/containerd";
        let probed = r#"{"type":"target","target":"containerd","status":"probed","pid":12,"binary":"/usr/bin/containerd","found_by":"startup","go_version":"go1.19.8","functions":["container.(*statusStorage).Get (2 RETs)","server.(*criService).ListContainers (1 RETs)"],"g_tls_offset":-8}"#;
        let t = containerd_target(probed, exe).unwrap();
        assert_eq!((t.status.as_str(), t.functions.len()), ("probed", 2));
        let failed = r#"{"type":"target","target":"containerd","status":"failed","pid":12,"binary":"/usr/bin/containerd","found_by":"startup","functions":[],"why":"load go_entry: denied"}"#;
        assert_eq!(containerd_target(failed, exe).unwrap().why.as_deref(), Some("load go_entry: denied"));
        let shim = r#"{"type":"target","target":"containerd-shim","status":"probed","pid":13,"binary":"/usr/bin/containerd-shim-runc-v2","found_by":"startup","functions":[]}"#;
        assert!(containerd_target(shim, exe).is_none());
        assert!(containerd_target(probed, "/usr/local/bin/containerd").is_none());
        assert!(containerd_target(r#"{"type":"ready","pid":1}"#, exe).is_none());
    }

    #[test]
    fn phase_line_parses() {
        let line = r#"{"type":"phase","label":"untraced-paced","seconds":10.0,"period_ms":10,"relists":900,"containers":3,"calls":{"ListContainers":{"count":900,"failed":0,"p50_us":310.5,"p90_us":400.0,"p99_us":800.1,"mean_us":330.0,"max_us":2000.0},"ListPodSandbox":{"count":900,"failed":0,"p50_us":200.0,"p90_us":250.0,"p99_us":500.0,"mean_us":210.0,"max_us":900.0}}}"#;
        let phase: Phase = serde_json::from_str(line).unwrap();
        let lc = phase.call("ListContainers").unwrap();
        assert_eq!((lc.count, lc.p50_us), (900, 310.5));
        assert!(phase.call("ContainerStatus").is_err());
        assert_eq!(phase.relists, 900);
    }

    #[test]
    fn stat_cpu_time() {
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let stat = "42 (a b) c) S 1 42 42 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1 2 3";
        let t = cpu_time_of_stat(stat).unwrap();
        assert!((t.as_secs_f64() - 300.0 / hz).abs() < 1e-9);
        assert!(cpu_time_of_stat("42 (x) S 1").is_none());
        assert!(cpu_time(std::process::id()).is_ok());
    }
}
