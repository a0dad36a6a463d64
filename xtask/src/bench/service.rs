//! `cargo xtask bench --only service`: plegwatch as a service on a node, one `watch --json
//! --warn 1s` per round, with 200 containers' worth of processes running (200 named
//! `containerd-shim`, copies of `sleep`, and 400 plain `sleep`s, started before it):
//! - **start to ready**: spawn to the `ready` line (every probe attached, the startup sweep
//!   and the Go target search done);
//! - **idle CPU**: the collector's CPU time over 10 s with nothing happening;
//! - **time to flag**: a `waitpid` on a stopped child (`loop childwait`) staged, to the
//!   incident line on stdout, less `--warn`;
//! - **busy CPU**: the collector's CPU while `loop netlink` makes netlink requests as fast as
//!   it can (each a request and its reply: two watched events);
//! - **workload**: `git status` on a tree of 30,000 files, untraced and under plegwatch;
//! - **scan lateness p99**: from plegwatch's own summary;
//! - **RSS** at the end of each round, and **BPF map memory** (the `memlock` of the map
//!   fds plegwatch holds).
//!
//! With `--soak-minutes M` (issue 19 asks for 60), a **daemon soak**. The rounds above run
//! `watch` for a short while each; on the canary nodes plegwatch runs as `plegwatch daemon`
//! for weeks, and what goes wrong there only shows over hours: memory or fds that grow a
//! little with each container or incident, a scan loop that falls behind. So the soak runs
//! the daemon as it runs on those nodes (`--warn 2s`, `--report-dir` a fresh root-owned dir
//! of mode 0700, `--socket` in another, `--listen` on a free loopback port, `--log-format
//! json`, stderr to `plegwatch-daemon.stderr.log`, `--runtime-endpoint` the node's
//! containerd) on a node that churns for M minutes: the scenario crate's `soak_bench`
//! (`tests/src/bin/soak_bench.rs`) runs a private containerd with one pod, the test bed's
//! relist driver every second in kubelet's place, a busybox container started every 3 s
//! (the oldest removed once more than 4 run), and an incident every 60 s: an `nl_client`
//! netlink request that is never answered, killed after 5 s, which the daemon raises at
//! 2 s and resolves, writing a report bundle. The daemon is started once that node is up
//! and is ready when `/healthz` answers 200; the soak begins then. Every 10 s its RSS
//! (`VmRSS`) and open fds (`/proc/PID/fd`) are sampled; at the end `/metrics` is scraped
//! once (saved as `soak-metrics.txt`) and the daemon stopped with SIGTERM. The figures:
//! - **RSS peak** (at most 64 MiB) and **RSS growth over the second half** (at most 1 MiB);
//! - **open fds growth over the second half**: none. Compared are the smallest counts of
//!   the first and the last minute of that half, so that an fd open for a moment at one
//!   sample (a `/proc` read, a scrape) is not taken for a leak;
//! - **scan lateness p99** from `plegwatch_scan_lateness_seconds`: the smallest bucket
//!   bound holding 99 % of the scans (at most 50 ms), so a bound, not an exact quantile;
//! - **incidents raised / staged** (`plegwatch_incidents_raised_total` over the driver's
//!   count), in the report's text: every staged incident must be raised (other waits the
//!   churn causes past 2 s are raised too, so it may exceed 1).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::driver::LineDriver;
use super::relist::cpu_time;
use super::report::{Figure, Target};
use super::tracer;
use crate::cmd;

/// Processes started as the node's containers: shims, and two more per container.
const SHIMS: usize = 200;
const SLEEPERS: usize = 400;
/// `--warn` of the measured runs.
const WARN: Duration = Duration::from_secs(1);
/// Idle phase length.
const IDLE: Duration = Duration::from_secs(10);
/// Requests of the busy phase (about 3 s on this machine kind).
const NETLINK_REQUESTS: u64 = 300_000;
/// Files of the `git status` tree, and runs of it per phase.
const TREE_FILES: usize = 30_000;
const GIT_RUNS: usize = 5;

/// The service figures over `rounds` rounds, and the daemon soak when one is asked for;
/// with the BPF map listing and the soak's summary as text.
pub fn measure(
    plegwatch: &Path,
    loop_bin: &Path,
    bench_dir: &Path,
    rounds: u32,
    daemon_soak: Option<&Soak>,
) -> Result<(Vec<Figure>, String)> {
    let tree = git_tree(bench_dir)?;
    let _node = Node::start(bench_dir)?;
    let mut f = Figures::default();
    let mut maps = String::new();
    for round in 1..=rounds {
        let untraced_git = git_status_s(&tree)?;
        let t0 = Instant::now();
        let mut pw = tracer::plegwatch_with(plegwatch, bench_dir, "plegwatch-service", &["--warn", "1s"])?;
        f.start_s.push(t0.elapsed().as_secs_f64());
        let pid = pw.pid();

        let cpu0 = cpu_time(pid)?;
        thread::sleep(IDLE);
        f.idle_pct.push(100.0 * (cpu_time(pid)? - cpu0).as_secs_f64() / IDLE.as_secs_f64());

        let staged = Instant::now();
        let mut waiter = Command::new(loop_bin).args(["childwait", "3"]).spawn().context("loop childwait")?;
        let parent = waiter.id();
        let about = format!("\"pid\":{parent},");
        let flagged = pw.wait_for(Duration::from_secs(3), "an incident about the staged child wait", |l| {
            l.contains("\"type\":\"incident\"") && l.contains("child_wait") && l.contains(&about)
        });
        let late = staged.elapsed().saturating_sub(WARN);
        let _ = waiter.wait();
        flagged?;
        f.flag_s.push(late.as_secs_f64());

        let cpu0 = cpu_time(pid)?;
        let t = Instant::now();
        let ns_per_request = super::time_loop(loop_bin, "netlink", NETLINK_REQUESTS)?;
        let busy = t.elapsed().as_secs_f64();
        f.busy_pct.push(100.0 * (cpu_time(pid)? - cpu0).as_secs_f64() / busy);
        f.events_per_s.push(2.0 * 1e9 / ns_per_request);

        f.git_ratio.push(git_status_s(&tree)? / untraced_git);
        f.rss_mib.push(rss_mib(pid)?);
        let (total, listing) = map_memory(pid)?;
        f.maps_mib.push(total);
        if round == 1 {
            maps = listing;
        }
        pw.stop();
        f.late_p99_ms.push(summary_late_p99_ms(&bench_dir.join("plegwatch-service.stdout.log"))?);
        eprintln!(
            "bench: service round {round}: ready {:.2}s, idle {:.2}% cpu, flagged {:.2}s after --warn, busy {:.1}% cpu at {:.0} ev/s, git status x{:.3}, rss {:.1} MiB",
            f.start_s[f.start_s.len() - 1],
            f.idle_pct[f.idle_pct.len() - 1],
            f.flag_s[f.flag_s.len() - 1],
            f.busy_pct[f.busy_pct.len() - 1],
            f.events_per_s[f.events_per_s.len() - 1],
            f.git_ratio[f.git_ratio.len() - 1],
            f.rss_mib[f.rss_mib.len() - 1],
        );
    }
    let mut figures = f.into_figures();
    if let Some(daemon_soak) = daemon_soak {
        let (soak_figures, text) = soak(plegwatch, bench_dir, daemon_soak)?;
        figures.extend(soak_figures);
        maps.push('\n');
        maps += &text;
    } else {
        figures.push(Figure::new("RSS over a soak, peak (--soak-minutes 60 to run)", "MiB", vec![], Target::AtMost(64.0)));
    }
    Ok((figures, maps))
}

#[derive(Default)]
struct Figures {
    start_s: Vec<f64>,
    idle_pct: Vec<f64>,
    flag_s: Vec<f64>,
    busy_pct: Vec<f64>,
    events_per_s: Vec<f64>,
    git_ratio: Vec<f64>,
    rss_mib: Vec<f64>,
    maps_mib: Vec<f64>,
    late_p99_ms: Vec<f64>,
}

impl Figures {
    fn into_figures(self) -> Vec<Figure> {
        let events = super::report::median(self.events_per_s.clone()).unwrap_or(0.0);
        vec![
            Figure::new("start to ready (probes attached, sweep done)", "s", self.start_s, Target::AtMost(2.0)),
            Figure::new(&format!("collector CPU idle, {SHIMS} shims + {SLEEPERS} processes"), "% core", self.idle_pct, Target::AtMost(1.0)),
            Figure::new(
                &format!("collector CPU at {:.0}k watched events/s (netlink)", events / 1e3),
                "% core",
                self.busy_pct,
                Target::AtMost(1.0),
            ),
            Figure::new("time to flag a wait past --warn", "s", self.flag_s, Target::AtMost(1.0)),
            Figure::new("scan lateness p99", "ms", self.late_p99_ms, Target::AtMost(50.0)),
            Figure::new(&format!("git status on {TREE_FILES} files, wall, ratio"), "x", self.git_ratio, Target::AtMost(1.03)),
            Figure::new("RSS at the end of a round", "MiB", self.rss_mib, Target::AtMost(64.0)),
            Figure::new("BPF map memory (bytes_memlock)", "MiB", self.maps_mib, Target::Stated),
        ]
    }
}

/// The fake node's processes, killed on drop.
struct Node {
    children: Vec<Child>,
}

impl Node {
    fn start(bench_dir: &Path) -> Result<Self> {
        let sleep = Path::new("/bin/sleep");
        let shim = bench_dir.join("containerd-shim-runc-v2");
        std::fs::copy(sleep, &shim).with_context(|| format!("cannot copy {} to {}", sleep.display(), shim.display()))?;
        let mut node = Node { children: Vec::new() };
        for i in 0..SHIMS + SLEEPERS {
            let bin: &Path = if i < SHIMS { &shim } else { sleep };
            let child = Command::new(bin).arg("100000").stdin(Stdio::null()).stdout(Stdio::null()).spawn();
            node.children.push(child.with_context(|| format!("cannot start {}", bin.display()))?);
        }
        Ok(node)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A committed tree of [`TREE_FILES`] files under `bench_dir/tree`, made once.
fn git_tree(bench_dir: &Path) -> Result<PathBuf> {
    let tree = bench_dir.join("tree");
    if tree.join(".git").join("bench-done").is_file() {
        return Ok(tree);
    }
    let _ = std::fs::remove_dir_all(&tree);
    eprintln!("bench: making a git tree of {TREE_FILES} files in {}", tree.display());
    for i in 0..TREE_FILES {
        let dir = tree.join(format!("d{:03}", i / 100));
        if i % 100 == 0 {
            std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        }
        std::fs::write(dir.join(format!("f{i}.txt")), format!("file {i}\n"))?;
    }
    let git = |args: &[&str]| {
        cmd::run(Command::new("git").arg("-C").arg(&tree).args(["-c", "user.name=bench", "-c", "user.email=bench@localhost"]).args(args))
    };
    git(&["init", "-q"])?;
    git(&["add", "."])?;
    git(&["commit", "-q", "-m", "bench tree"])?;
    std::fs::write(tree.join(".git").join("bench-done"), "")?;
    Ok(tree)
}

/// Median wall time of [`GIT_RUNS`] `git status` runs, after one to warm the caches.
fn git_status_s(tree: &Path) -> Result<f64> {
    let mut times = Vec::new();
    for i in 0..=GIT_RUNS {
        let t = Instant::now();
        cmd::output(Command::new("git").arg("-C").arg(tree).args(["-c", "core.untrackedCache=false", "status", "--porcelain"]))?;
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    super::report::median(times).context("no git status timing")
}

fn rss_mib(pid: u32) -> Result<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("cannot read /proc/{pid}/status"))?;
    let kib: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kib / 1024.0)
}

/// plegwatch's maps, from the map fds it holds (`/proc/PID/fdinfo/N`: `map_id`, `memlock`,
/// `max_entries`) named by `bpftool map show` (this bpftool lists no owning pids): their
/// total in MiB and one line per map, largest first.
fn map_memory(pid: u32) -> Result<(f64, String)> {
    let out = cmd::output(Command::new("bpftool").args(["-j", "map", "show"]))?;
    let listed: serde_json::Value = serde_json::from_str(&out).context("bpftool -j map show: not JSON")?;
    let name_of = |id: u64| {
        listed
            .as_array()
            .into_iter()
            .flatten()
            .find(|m| m["id"].as_u64() == Some(id))
            .and_then(|m| m["name"].as_str())
            .unwrap_or("?")
            .to_owned()
    };
    let dir = format!("/proc/{pid}/fdinfo");
    let mut mine: Vec<(u64, String, u64)> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot read {dir}"))?.flatten() {
        let Ok(text) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)).and_then(|v| v.trim().parse::<u64>().ok());
        let (Some(id), Some(memlock)) = (field("map_id:"), field("memlock:")) else {
            continue;
        };
        if seen.insert(id) {
            mine.push((memlock, name_of(id), field("max_entries:").unwrap_or(0)));
        }
    }
    if mine.is_empty() {
        bail!("plegwatch (pid {pid}) holds no BPF map fd in {dir}");
    }
    mine.sort_unstable_by(|a, b| b.cmp(a));
    let total: u64 = mine.iter().map(|m| m.0).sum();
    let mut listing =
        format!("BPF maps of plegwatch (memlock from fdinfo), {} maps, {:.1} MiB in all:\n", mine.len(), total as f64 / 1048576.0);
    for (bytes, name, entries) in &mine {
        listing += &format!("  {name:<16} {entries:>8} entries  {:>9.1} KiB\n", *bytes as f64 / 1024.0);
    }
    Ok((total as f64 / 1048576.0, listing))
}

/// `scans.late_p99_ms` of the last summary line in a `watch --json` stdout log.
fn summary_late_p99_ms(log: &Path) -> Result<f64> {
    let text = std::fs::read_to_string(log).with_context(|| format!("cannot read {}", log.display()))?;
    text.lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "summary")
        .and_then(|v| v["scans"]["late_p99_ms"].as_f64())
        .with_context(|| format!("no summary with scans.late_p99_ms in {}", log.display()))
}

/// The soak's driver binary and the netlink client it stages incidents with, in the
/// scenario crate.
const PACKAGE: &str = "plegwatch-scenarios";
const SOAK_DRIVER: &str = "soak_bench";
const NL_CLIENT: &str = "nl_client";
/// The daemon's `--warn`, as on the canary nodes.
const SOAK_WARN: &str = "2s";
/// The driver's pace: a container every 3 s, an incident every 60 s held 5 s.
const CHURN_MS: u32 = 3000;
const INCIDENT_EVERY_S: u32 = 60;
const STALL_S: u32 = 5;
/// RSS and fds are sampled this often.
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// Samples whose smallest fd count is compared at each end of the second half: a minute.
const FD_FLOOR_SAMPLES: usize = 6;
/// How long the driver may take to start containerd, import the images and run the pod.
const DRIVER_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the daemon may take to answer `/healthz` with 200 (its probes attached).
const DAEMON_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long past its length the soak may take to say it is done.
const SOAK_GRACE: Duration = Duration::from_secs(120);
/// How long the driver may take to tear the containers, pod and containerd down.
const DRIVER_QUIT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long the daemon may take to exit after SIGTERM before it is killed.
const DAEMON_STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// The daemon's metrics read at the end.
const LATENESS_BUCKET: &str = "plegwatch_scan_lateness_seconds_bucket";
const LATENESS_COUNT: &str = "plegwatch_scan_lateness_seconds_count";
const INCIDENTS_RAISED: &str = "plegwatch_incidents_raised_total";

/// What the daemon soak runs: its length and the binaries [`build_soak`] built.
pub struct Soak {
    pub minutes: u32,
    driver: PathBuf,
    nl_client: PathBuf,
}

/// `cargo build --release -p plegwatch-scenarios --bin soak_bench --bin nl_client`, for a
/// soak of `minutes`.
pub fn build_soak(minutes: u32) -> Result<Soak> {
    cmd::run(cmd::cargo().args(["build", "--release", "-p", PACKAGE, "--bin", SOAK_DRIVER, "--bin", NL_CLIENT]))?;
    let release = cmd::target_dir().join("release");
    Ok(Soak { minutes, driver: release.join(SOAK_DRIVER), nl_client: release.join(NL_CLIENT) })
}

/// `plegwatch daemon` over `soak.minutes` of container churn with an incident a minute
/// (module docs): its figures, and a summary for the report.
fn soak(plegwatch: &Path, bench_dir: &Path, soak: &Soak) -> Result<(Vec<Figure>, String)> {
    let minutes = soak.minutes;
    let seconds = u64::from(minutes) * 60;
    cmd::header(&format!("soak: {minutes} minute(s) of plegwatch daemon on a churning node, an incident every {INCIDENT_EVERY_S} s"));
    let reports = private_dir(&bench_dir.join("soak-reports"))?;
    let socket = private_dir(&bench_dir.join("soak"))?.join("plegwatch.sock");

    // The node first, so that the daemon names pods through its containerd, as on a node.
    let mut driver = SoakDriver::start(soak, seconds, bench_dir)?;
    let ready = &driver.ready;
    let endpoint = format!("unix://{}", ready["socket"].as_str().context("the driver's ready line names no socket")?);
    eprintln!(
        "bench: soak node ready: containerd pid {}, pod {}, netns {}",
        ready["containerd_pid"],
        ready["pod"].as_str().unwrap_or("?"),
        ready["netns"].as_str().unwrap_or("?")
    );
    let mut daemon = Daemon::start(plegwatch, bench_dir, &reports, &socket, &endpoint)?;
    daemon.wait_healthy(DAEMON_READY_TIMEOUT)?;
    let pid = daemon.pid();
    eprintln!("bench: plegwatch daemon (pid {pid}) ready on {}/healthz", daemon.addr);

    driver.inner.send("start")?;
    let deadline = Instant::now() + Duration::from_secs(seconds) + SOAK_GRACE;
    let (mut rss, mut fds) = (Vec::new(), Vec::new());
    let mut next_sample = Instant::now();
    let done = loop {
        if Instant::now() >= next_sample {
            daemon.check_running()?;
            rss.push(rss_mib(pid)?);
            fds.push(open_fds(pid)? as f64);
            next_sample += SAMPLE_EVERY;
        }
        let now = Instant::now();
        if now >= deadline {
            bail!("`{}` printed no done line within {}s of its start", driver.inner.line, seconds + SOAK_GRACE.as_secs());
        }
        let Some(line) = driver.inner.next_line(next_sample.min(deadline).saturating_duration_since(now))? else {
            continue;
        };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        match v["type"].as_str() {
            Some("tick") => eprintln!(
                "bench: soak minute {}: {} containers started, {} removed, {} incidents staged, {} relists ({} failed calls); daemon rss {:.1} MiB, {} fds",
                v["minute"],
                v["containers_started"],
                v["containers_removed"],
                v["incidents_staged"],
                v["relists"],
                v["relist_errors"],
                rss.last().copied().unwrap_or(0.0),
                fds.last().copied().unwrap_or(0.0),
            ),
            Some("done") => break v,
            _ => {}
        }
    };
    daemon.check_running()?;
    rss.push(rss_mib(pid)?);
    fds.push(open_fds(pid)? as f64);
    if done["completed"] != true {
        // Its reason is the last line it prints, after its teardown.
        let line = driver.inner.line.clone();
        let why = driver.inner.quit().err().map_or_else(|| "it gave no error".to_owned(), |e| format!("{e:#}"));
        bail!("`{line}` cut its soak short ({done}): {why}");
    }

    let metrics = daemon.get("/metrics").context("scrape the daemon's /metrics")?;
    std::fs::write(bench_dir.join("soak-metrics.txt"), &metrics).context("cannot save soak-metrics.txt")?;
    let lateness = Lateness::of(&metrics)?;
    let raised = metric(&metrics, INCIDENTS_RAISED).with_context(|| format!("no {INCIDENTS_RAISED} in /metrics"))?;
    let (daemon_line, driver_line) = (daemon.line.clone(), driver.inner.line.clone());
    let stop = daemon.stop();
    let quit = driver.inner.quit();
    let bundles = std::fs::read_dir(&reports)
        .with_context(|| format!("cannot read {}", reports.display()))?
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .count();

    let staged = done["incidents_staged"].as_u64().unwrap_or(0);
    let rss_half = &rss[rss.len() / 2..];
    let rss_growth = rss_half.last().copied().unwrap_or(0.0) - rss_half.first().copied().unwrap_or(0.0);
    let rss_peak = rss.iter().copied().fold(0.0, f64::max);
    let fd_growth = floor_growth(&fds[fds.len() / 2..], FD_FLOOR_SAMPLES);
    eprintln!("bench: soak RSS samples (MiB, every 10 s): {rss:.1?}");
    eprintln!("bench: soak open fd samples (every 10 s): {fds:?}");

    let mut text = format!(
        "daemon soak, {minutes} minute(s): `{}`\n\
         on `{}`: {} containers started, {} removed, {} relists ({} failed calls), ListContainers p99 {} ms, max {} ms\n",
        daemon_line,
        driver_line,
        done["containers_started"],
        done["containers_removed"],
        done["relists"],
        done["relist_errors"],
        done["list_containers_p99_ms"],
        done["list_containers_max_ms"],
    );
    let ratio = if staged > 0 { format!("{:.2}", raised / staged as f64) } else { "-".to_owned() };
    text += &format!(
        "incidents raised / staged: {raised:.0} / {staged} = {ratio} (want >= 1: every staged one raised); {bundles} report bundle(s) in {}\n",
        reports.display()
    );
    text += &format!(
        "scan lateness: {} scans, p99 <= {} s (bucket bound{}); RSS {:.1} MiB at the start, {:.1} at the end; open fds {} at the start, {} at the end\n",
        lateness.count,
        lateness.p99_bound,
        if lateness.past_last_bound { ", past the largest: the p99 is higher" } else { "" },
        rss.first().copied().unwrap_or(0.0),
        rss.last().copied().unwrap_or(0.0),
        fds.first().copied().unwrap_or(0.0),
        fds.last().copied().unwrap_or(0.0),
    );
    for warning in
        [stop.err().map(|e| format!("plegwatch daemon: {e:#}")), quit.err().map(|e| format!("{SOAK_DRIVER}: {e:#}"))].into_iter().flatten()
    {
        eprintln!("bench: warning: {warning}");
        text += &format!("warning: {warning}\n");
    }
    eprint!("{text}");

    let figures = vec![
        Figure::new(&format!("RSS over a {minutes}-minute soak, peak"), "MiB", vec![rss_peak], Target::AtMost(64.0)),
        Figure::new("RSS growth over the soak's second half", "MiB", vec![rss_growth], Target::AtMost(1.0)),
        Figure::new("open fds growth over the soak's second half (1-min floors)", "fds", vec![fd_growth], Target::AtMost(0.0)),
        Figure::new("scan lateness p99 over the soak (bucket bound)", "s", vec![lateness.p99_bound], Target::AtMost(0.05)),
    ];
    Ok((figures, text))
}

/// `dir` made afresh, mode 0700, owned by root (this runs as root): the daemon refuses a
/// report dir or socket dir that others could write.
fn private_dir(dir: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    if dir.exists() {
        std::fs::remove_dir_all(dir).with_context(|| format!("cannot remove the last soak's {}", dir.display()))?;
    }
    std::fs::DirBuilder::new().mode(0o700).create(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .with_context(|| format!("cannot chmod 0700 {}", dir.display()))?;
    let uid = std::fs::metadata(dir).with_context(|| format!("cannot stat {}", dir.display()))?.uid();
    if uid != 0 {
        bail!("{} belongs to uid {uid}, not root: the daemon would refuse it", dir.display());
    }
    Ok(dir.to_path_buf())
}

/// Entries of `/proc/PID/fd`.
fn open_fds(pid: u32) -> Result<usize> {
    let dir = format!("/proc/{pid}/fd");
    Ok(std::fs::read_dir(&dir).with_context(|| format!("cannot read {dir}"))?.count())
}

/// The growth of the floor of `samples`: the smallest of the last `window` less the smallest
/// of the first `window` (fewer when there are fewer than twice as many samples). A leak
/// raises the floor; an fd open for a moment at one sample (a `/proc` read, a scrape) does
/// not.
fn floor_growth(samples: &[f64], window: usize) -> f64 {
    let window = window.min(samples.len() / 2).max(1);
    if samples.is_empty() {
        return 0.0;
    }
    let floor = |s: &[f64]| s.iter().copied().fold(f64::INFINITY, f64::min);
    floor(&samples[samples.len().saturating_sub(window)..]) - floor(&samples[..window.min(samples.len())])
}

/// The first sample of `name` (no labels) in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        (words.next() == Some(name)).then(|| words.next()?.parse().ok()).flatten()
    })
}

/// plegwatch's scan-lateness histogram at the end of the soak.
#[derive(Debug, PartialEq)]
struct Lateness {
    count: f64,
    /// The smallest bucket bound `le` (s) whose cumulative count is at least 99 % of `count`;
    /// the largest finite bound when only `+Inf` is.
    p99_bound: f64,
    past_last_bound: bool,
}

impl Lateness {
    fn of(text: &str) -> Result<Self> {
        let count = metric(text, LATENESS_COUNT).with_context(|| format!("no {LATENESS_COUNT} in /metrics"))?;
        if count <= 0.0 {
            bail!("{LATENESS_COUNT} is {count}: the daemon counted no scan");
        }
        let mut buckets: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| {
                let rest = l.strip_prefix(LATENESS_BUCKET)?.strip_prefix('{')?;
                let (labels, value) = rest.split_once('}')?;
                let le = labels.split(',').find_map(|kv| kv.trim().strip_prefix("le=\""))?.strip_suffix('"')?;
                let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
                Some((le, value.split_whitespace().next()?.parse().ok()?))
            })
            .collect();
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        let last_finite = buckets.iter().map(|b| b.0).filter(|le| le.is_finite()).fold(f64::NAN, f64::max);
        let (le, _) = buckets
            .iter()
            .find(|(_, cumulative)| *cumulative >= 0.99 * count)
            .with_context(|| format!("no {LATENESS_BUCKET} reaches 99 % of {count} scans"))?;
        if le.is_finite() {
            return Ok(Lateness { count, p99_bound: *le, past_last_bound: false });
        }
        if last_finite.is_nan() {
            bail!("{LATENESS_BUCKET} has no finite bound");
        }
        Ok(Lateness { count, p99_bound: last_finite, past_last_bound: true })
    }
}

/// A loopback port free now (the kernel's pick, let go at once for the daemon to take).
fn free_port() -> Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(listener.local_addr().context("the bound port")?.port())
}

/// `plegwatch daemon`, as on a canary node, on a loopback port of its own. Dropping it
/// without [`Daemon::stop`] kills it.
struct Daemon {
    line: String,
    child: Child,
    addr: SocketAddr,
    stderr_log: PathBuf,
}

impl Daemon {
    fn start(plegwatch: &Path, log_dir: &Path, reports: &Path, socket: &Path, endpoint: &str) -> Result<Self> {
        let addr = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut command = Command::new(plegwatch);
        command.args(["daemon", "--warn", SOAK_WARN, "--report-dir"]).arg(reports).arg("--socket").arg(socket).args([
            "--listen",
            &addr.to_string(),
            "--log-format",
            "json",
            "--runtime-endpoint",
            endpoint,
        ]);
        let line = cmd::display(&command);
        let (stderr_log, stderr, stdout) = tracer::log_files(log_dir, "plegwatch-daemon")?;
        eprintln!("+ {line}");
        let child = command.stdin(Stdio::null()).stdout(stdout).stderr(stderr).spawn().with_context(|| format!("cannot start `{line}`"))?;
        Ok(Daemon { line, child, addr, stderr_log })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Polls `/healthz` until it answers 200 (every probe attached).
    fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok((200, _)) = http_get(self.addr, "/healthz") {
                return Ok(());
            }
            self.check_running()?;
            if Instant::now() >= deadline {
                bail!(
                    "`{}`: {}/healthz did not answer 200 within {}s (stderr: {}; log: {})",
                    self.line,
                    self.addr,
                    timeout.as_secs(),
                    self.stderr_tail(),
                    self.stderr_log.display()
                );
            }
            thread::sleep(Duration::from_millis(200));
        }
    }

    /// An error, with the last line of its log, if it has exited.
    fn check_running(&mut self) -> Result<()> {
        match self.child.try_wait().context("waitpid")? {
            None => Ok(()),
            Some(status) => {
                bail!("`{}` exited with {status} (stderr: {}; log: {})", self.line, self.stderr_tail(), self.stderr_log.display())
            }
        }
    }

    /// The body of `GET path`, which must answer 200.
    fn get(&self, path: &str) -> Result<String> {
        match http_get(self.addr, path)? {
            (200, body) => Ok(body),
            (status, body) => bail!("{}{path} answered {status}: {}", self.addr, cmd::last_line(&body)),
        }
    }

    /// SIGTERM, as systemd or the kubelet stops it, then wait for its exit (SIGKILL after
    /// [`DAEMON_STOP_TIMEOUT`]). An unclean exit is an error.
    fn stop(mut self) -> Result<()> {
        use std::os::unix::process::ExitStatusExt;
        let pid = libc::pid_t::try_from(self.child.id()).with_context(|| format!("pid {} out of range", self.child.id()))?;
        // SAFETY: kill(2) on the pid of our own child, not yet reaped.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!("kill -TERM {pid}: {}", std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + DAEMON_STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().context("waitpid")? {
                if status.success() || status.signal() == Some(libc::SIGTERM) {
                    return Ok(());
                }
                bail!("`{}` exited with {status} after SIGTERM (stderr: {})", self.line, self.stderr_tail());
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!("`{}` did not exit within {}s of SIGTERM; killed it", self.line, DAEMON_STOP_TIMEOUT.as_secs());
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_log).unwrap_or_default();
        cmd::last_line(&text).to_owned()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// `GET path` over HTTP/1.0 on `addr`: (status, body).
fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).context("set a read timeout")?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").with_context(|| format!("send GET {path} to {addr}"))?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).with_context(|| format!("read {addr}{path}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("{addr}{path}: no end of the HTTP header"))?;
    let status = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).with_context(|| format!("{addr}{path}: bad status line"))?;
    Ok((status, body.to_owned()))
}

/// The running `soak_bench`. Dropping it closes its stdin, which makes it tear down, and
/// waits.
struct SoakDriver {
    inner: LineDriver,
    /// Its ready line.
    ready: serde_json::Value,
}

impl SoakDriver {
    /// Spawn `soak_bench` (see [`LineDriver::start`]) and wait for its ready line.
    fn start(soak: &Soak, seconds: u64, log_dir: &Path) -> Result<Self> {
        let mut command = Command::new(&soak.driver);
        command
            .arg("--seconds")
            .arg(seconds.to_string())
            .arg("--churn-ms")
            .arg(CHURN_MS.to_string())
            .arg("--incident-every-s")
            .arg(INCIDENT_EVERY_S.to_string())
            .arg("--stall-s")
            .arg(STALL_S.to_string())
            .arg("--nl-client")
            .arg(&soak.nl_client);
        let inner = LineDriver::start(SOAK_DRIVER, command, log_dir, DRIVER_QUIT_TIMEOUT, "containerd, shims and netns")?;
        let ready = inner.wait_line(DRIVER_READY_TIMEOUT, "ready")?;
        let ready = serde_json::from_str(&ready).with_context(|| format!("`{}` printed a bad ready line: {ready}", inner.line))?;
        Ok(SoakDriver { inner, ready })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "\
# HELP plegwatch_incidents_raised Incidents raised.
# TYPE plegwatch_incidents_raised counter
plegwatch_incidents_raised_total 59
# HELP plegwatch_scan_lateness_seconds How late each 250 ms scan started after its tick.
# TYPE plegwatch_scan_lateness_seconds histogram
plegwatch_scan_lateness_seconds_sum 1.5
plegwatch_scan_lateness_seconds_count 1000
plegwatch_scan_lateness_seconds_bucket{le=\"0.001\"} 900
plegwatch_scan_lateness_seconds_bucket{le=\"0.005\"} 985
plegwatch_scan_lateness_seconds_bucket{le=\"0.01\"} 990
plegwatch_scan_lateness_seconds_bucket{le=\"0.025\"} 999
plegwatch_scan_lateness_seconds_bucket{le=\"+Inf\"} 1000
";

    #[test]
    fn lateness_p99_is_the_first_bound_holding_99_percent() {
        let l = Lateness::of(METRICS).unwrap();
        assert_eq!(l, Lateness { count: 1000.0, p99_bound: 0.01, past_last_bound: false });
        assert_eq!(metric(METRICS, INCIDENTS_RAISED), Some(59.0));
        assert_eq!(metric(METRICS, "plegwatch_incidents_raised"), None, "the family name is not a sample");
    }

    #[test]
    fn lateness_past_the_last_bound_says_so() {
        let slow = METRICS.replace("} 990", "} 900").replace("} 999", "} 900").replace("} 985", "} 900");
        let l = Lateness::of(&slow).unwrap();
        assert_eq!((l.p99_bound, l.past_last_bound), (0.025, true));
        let none = METRICS.replace("seconds_count 1000", "seconds_count 0");
        assert!(Lateness::of(&none).is_err());
    }

    #[test]
    fn fd_growth_compares_floors() {
        // A transient fd at the last sample is not growth; a raised floor is.
        assert_eq!(floor_growth(&[20.0, 21.0, 20.0, 20.0, 20.0, 21.0], 2), 0.0);
        assert_eq!(floor_growth(&[20.0, 20.0, 20.0, 22.0, 22.0, 23.0], 2), 2.0);
        assert_eq!(floor_growth(&[20.0], 6), 0.0);
        assert_eq!(floor_growth(&[], 6), 0.0);
    }
}
