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
//!   fds plegwatch holds);
//! - with `--soak-minutes M`: RSS every 10 s over M minutes of mixed load (netlink, fsync and
//!   unix loops in turn), its peak and its growth over the second half.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::relist::cpu_time;
use super::report::{Figure, Target};
use super::tracer::{self, Tracer};
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

/// The service figures over `rounds` rounds (and a soak when `soak_minutes` > 0).
pub fn measure(plegwatch: &Path, loop_bin: &Path, bench_dir: &Path, rounds: u32, soak_minutes: u32) -> Result<(Vec<Figure>, String)> {
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
    if soak_minutes > 0 {
        figures.extend(soak(plegwatch, loop_bin, bench_dir, soak_minutes)?);
    } else {
        figures.push(Figure::new("RSS over a soak, peak (--soak-minutes 10 to run)", "MiB", vec![], Target::AtMost(64.0)));
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

/// RSS every 10 s over `minutes` of the loops in turn: its peak, and its growth from the
/// start of the second half to the end.
fn soak(plegwatch: &Path, loop_bin: &Path, bench_dir: &Path, minutes: u32) -> Result<Vec<Figure>> {
    cmd::header(&format!("soak: {minutes} minute(s) of mixed load under plegwatch"));
    let pw: Tracer = tracer::plegwatch_with(plegwatch, bench_dir, "plegwatch-soak", &["--warn", "1s"])?;
    let pid = pw.pid();
    let end = Instant::now() + Duration::from_secs(u64::from(minutes) * 60);
    let mut samples = Vec::new();
    let mut next = Instant::now();
    let modes = [("netlink", 100_000), ("fsync", 100_000), ("unix", 200_000), ("unixrw", 200_000)];
    let mut i = 0;
    while Instant::now() < end {
        let (mode, n) = modes[i % modes.len()];
        super::time_loop(loop_bin, mode, n)?;
        i += 1;
        if Instant::now() >= next {
            samples.push(rss_mib(pid)?);
            next += Duration::from_secs(10);
        }
    }
    samples.push(rss_mib(pid)?);
    pw.stop();
    let half = &samples[samples.len() / 2..];
    let growth = half.last().copied().unwrap_or(0.0) - half.first().copied().unwrap_or(0.0);
    let peak = samples.iter().copied().fold(0.0, f64::max);
    eprintln!("bench: soak RSS samples (MiB, every 10 s): {samples:.1?}");
    Ok(vec![
        Figure::new(&format!("RSS over a {minutes}-minute soak, peak"), "MiB", vec![peak], Target::AtMost(64.0)),
        Figure::new("RSS growth over the soak's second half", "MiB", vec![growth], Target::AtMost(1.0)),
    ])
}
