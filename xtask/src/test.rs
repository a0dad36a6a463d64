//! `cargo xtask test`: every test tier that cargo alone can't sequence.
//!
//! Stages; the first failure stops the run with a non-zero exit:
//! 1. lint: `cargo fmt --check` (the workspace and `fuzz/`, by `rustfmt.toml`) and
//!    `cargo clippy --workspace --all-targets -- -D warnings`;
//! 2. unit tests of the whole workspace except the scenario crate (no root);
//! 3. the privileged scenarios against the real kernel (root; one thread, since they
//!    share mounts, throttles and daemons);
//! 4. beside 1–3, from their start: a guest stage on Debian 12's 6.1 with cgroup v2
//!    ([`GUEST_CI`], [`GUEST_SEED`]), built first: its own kernel (nothing either does is
//!    seen by the other's probes) on one host thread, its output into
//!    `target/guest/6.1.log`, a failed test's output printed at its end; a failure in 1–3
//!    stops it;
//! 5. a short fuzz run of each parser target (cargo-fuzz, nightly).
//!
//! `--kernel K` (repeatable) and `--kernels all` run the guest matrix ([`GUEST_CI`], [`GUEST_SEED`] and [`GUEST_MATRIX_MORE`]) on
//! those kernels instead, and nothing else: the same scenario binaries, built here, against
//! plegwatch's release build (see `vm.rs`).
//!
//! `--soak` runs the scenarios' negative soak (`negative_soak`: ordinary container,
//! D-Bus, netlink, sync and mount traffic that must raise no incident) for
//! [`SOAK_SECS`] instead of its default 60 s, through the scenario crate's
//! `PLEGWATCH_SOAK_SECS`.

use anyhow::{bail, Result};

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::{cmd, run, setup, vm};

/// The privileged scenario crate in `tests/`.
const SCENARIOS: &str = "plegwatch-scenarios";
/// The environment variable that names the `plegwatch` binary to the scenarios.
pub const BIN_ENV: &str = "PLEGWATCH_BIN";
/// How the scenario crate is told how long its negative soak runs, in seconds.
const SOAK_ENV: &str = "PLEGWATCH_SOAK_SECS";
/// The soak's length under `--soak`: 10 minutes.
const SOAK_SECS: u32 = 600;

/// Arguments of `cargo xtask test`.
#[derive(clap::Args)]
pub struct Args {
    /// Run the negative soak scenario (negative_soak) for 10 minutes instead of 60 s
    /// (sets PLEGWATCH_SOAK_SECS=600 for the scenario crate).
    #[arg(long)]
    pub soak: bool,
    /// Run the guest matrix on this kernel only (5.10, 6.1, 6.12 or a vmlinuz path;
    /// repeatable), and nothing else.
    #[arg(long, value_name = "KERNEL")]
    pub kernel: Vec<String>,
    /// `all`: run the guest matrix on every kernel of the matrix (5.10, 6.1, 6.12).
    #[arg(long, value_name = "all", value_parser = ["all"])]
    pub kernels: Option<String>,
    /// With --kernel/--kernels: only these scenario files of the guest matrix (repeatable),
    /// e.g. `--only umount_stall`.
    #[arg(long, value_name = "FILE")]
    pub only: Vec<String>,
    /// With --kernel/--kernels: plegwatch passes over its fexit variants in the guests
    /// (PLEGWATCH_FALLBACK=all), so that the matrix runs the fallbacks those kernels would
    /// not otherwise take.
    #[arg(long)]
    pub fallback: bool,
    /// Leave out the guest stage of a plain `cargo xtask test` (a quicker run on the host).
    #[arg(long, conflicts_with_all = ["kernel", "kernels"])]
    pub no_guest: bool,
}

/// Each stage's wall time, in the order they ended, for the run's last line.
static STAGE_TIMES: std::sync::Mutex<Vec<(&str, Duration)>> = std::sync::Mutex::new(Vec::new());

/// Runs one stage and prints how long it took (and keeps it for the last line): a CI
/// run must stay under its hour, and the stages share the host's two cores.
fn timed<T>(stage: &'static str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let began = std::time::Instant::now();
    let result = f();
    let took = began.elapsed();
    eprintln!("xtask test: {stage} {} after {:.0} s", if result.is_ok() { "passed" } else { "failed" }, took.as_secs_f64());
    if let Ok(mut times) = STAGE_TIMES.lock() {
        times.push((stage, took));
    }
    result
}

/// `stage 12 s, stage 340 s, …`.
fn stage_times() -> String {
    let times = STAGE_TIMES.lock().map(|t| t.clone()).unwrap_or_default();
    times.iter().map(|(stage, took)| format!("{stage} {:.0} s", took.as_secs_f64())).collect::<Vec<_>>().join(", ")
}

pub fn run(args: &Args) -> Result<()> {
    cmd::header("setup");
    timed("setup", || {
        setup::ensure()?;
        room_to_build()
    })?;
    if let Some(o) = args.only.iter().find(|o| !guest_matrix().any(|t| t.file == o.as_str())) {
        bail!("--only {o}: not a scenario of the guest matrix");
    }
    let kernels: Vec<String> = match &args.kernels {
        Some(_) => vm::KERNELS.iter().map(|k| k.name.to_string()).collect(),
        None => args.kernel.clone(),
    };
    if !kernels.is_empty() {
        warm_go_fixture()?;
        let mut stages = Vec::new();
        for k in &kernels {
            let chosen = guest_matrix().filter(|t| args.only.is_empty() || args.only.iter().any(|o| o == t.file));
            stages.push(prepare_stage(k, chosen, args.soak.then_some(SOAK_SECS), None, args.fallback)?);
        }
        let failed = run_stages(stages);
        if !failed.is_empty() {
            bail!("the guest matrix failed on {}", failed.join(", "));
        }
        eprintln!("\nxtask test: the guest matrix passed on {}", kernels.join(", "));
        return Ok(());
    }
    // The guest stage runs beside everything on the host (lint, unit tests, scenarios): it
    // takes one host thread (TCG) and has its own kernel, so neither sees the other's
    // stalls, and the run keeps under its hour. It is built first; a host stage that
    // fails stops it.
    let guest = if args.no_guest {
        None
    } else {
        Some(timed("guest build", || {
            warm_go_fixture()?;
            prepare_stage(GUEST_CI_KERNEL, GUEST_CI.iter().chain(GUEST_SEED), None, Some(GUEST_CI_LIMIT), false)
        })?)
    };
    let (host, guest) = std::thread::scope(|scope| {
        let guest = guest.map(|stage| scope.spawn(move || timed("guest stage", || run_logged(stage))));
        let host = timed("lint", lint)
            .and_then(|()| timed("unit tests", unit_tests))
            .and_then(|()| timed("host scenarios", || scenarios(args.soak.then_some(SOAK_SECS))));
        if host.is_err() {
            vm::cancel_guests();
        }
        let guest = guest.map(|g| g.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the guest stage's thread panicked"))));
        (host, guest)
    });
    match (host, guest.transpose()) {
        (Ok(()), Ok(_)) => {}
        (Err(h), Ok(_)) => return Err(h),
        (Ok(()), Err(g)) => return Err(g),
        (Err(h), Err(g)) => bail!("{h:#}; and {g:#}"),
    }
    timed("fuzz", fuzz)?;
    eprintln!("\nxtask test: all stages passed ({})", stage_times());
    Ok(())
}

/// Disk a whole `cargo xtask test` writes from a fresh clone, in GiB: the target
/// directory (the debug build, ~55 scenario binaries, the release build, the guest's
/// state) and the fuzz builds. The target directory measured 7.0 GB at its peak (a fresh
/// clone, 2026-11-27); with full debug info and incremental state it passed 12 GB before
/// the scenarios had run. See `[profile.dev]` in the workspace manifest.
const BUILD_ROOM_GIB: f64 = 9.0;

/// Fails at once, in one line, when the disk cannot hold the build: a linker that runs
/// out of room mid-build dies of SIGBUS ("ld terminated with signal 7 [Bus error]") with
/// no word of the disk. Counts what the target directory already holds as room.
fn room_to_build() -> Result<()> {
    let target = cmd::target_dir();
    let free = cmd::free_gib(&target)?;
    let held = dir_gib(&target) + dir_gib(&cmd::workspace_root().join("fuzz/target"));
    if free + held < BUILD_ROOM_GIB {
        bail!(
            "{free:.1} GiB free on the disk of {} (and {held:.1} GiB built already): a fresh `cargo xtask test` writes about {BUILD_ROOM_GIB:.0} GiB; free some room first",
            target.display()
        );
    }
    Ok(())
}

/// The apparent size of what `dir` holds, in GiB (0 when it does not exist).
fn dir_gib(dir: &Path) -> f64 {
    fn walk(dir: &Path) -> u64 {
        let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
        entries
            .flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() => walk(&e.path()),
                Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => 0,
            })
            .sum()
    }
    walk(dir) as f64 / f64::from(1u32 << 30)
}

/// Scenario tests run in a guest: a test binary of the scenario crate (its file name
/// under `tests/tests/`) and the tests in it to run (`--exact`), or all of them.
pub struct GuestTests {
    pub file: &'static str,
    pub tests: &'static [&'static str],
}

const fn all(file: &'static str) -> GuestTests {
    GuestTests { file, tests: &[] }
}

/// The kernel of `cargo xtask test`'s guest stage: Debian 12's, with cgroup v2, the kernel
/// family of Amazon Linux 2023 and COS.
pub const GUEST_CI_KERNEL: &str = "6.1";

/// What `cargo xtask test` runs in its guest (6.1, cgroup v2) with [`GUEST_SEED`], about
/// 10 min with the boot: the umount task_work tail with its device hop on `io.max` (21 s in
/// the guest), the Terway seed (RunPodSandbox → CNI plugin → daemon → a netlink request with
/// no reply, on containerd 1.6.20: 46 s) and D-Bus calls to a frozen service (24 s).
pub const GUEST_CI: &[GuestTests] = &[all("umount_stall"), all("terway_seed"), all("dbus_call")];

/// The other seed incidents, also run by `cargo xtask test`: containerd#9770 as one
/// incident on containerd 1.6.20 and 2.3.4 and a start in the middle of that stall (99–220 s
/// each in a guest, once containerd's state moved off virtme-ng's 9p overlay onto a tmpfs:
/// 14 min before), and runc → D-Bus → a frozen systemd1 stand-in (97 s). On 2.3.4 the lock
/// is held 2 s (containerd's own task-lookup timeout): plegwatch must report it within that
/// window, which the release build does under emulation.
pub const GUEST_SEED: &[GuestTests] = &[
    GuestTests {
        file: "containerd_9770_plegwatch",
        tests: &[
            "status_lock_held_across_shim_umount_is_reported",
            "containerd_9770_on_2_3",
            "started_mid_stall_it_sees_what_began_before",
        ],
    },
    GuestTests { file: "containerd_systemd_dbus", tests: &["one_incident_from_the_container_start_to_the_frozen_systemd"] },
];

/// What the whole matrix runs besides [`GUEST_CI`] and [`GUEST_SEED`]: kubelet's relist clock on the Go fixture (uprobes without attach
/// cookies before 5.15), netlink requests on their own, pod names from live containers,
/// the negative soak, a socket's fd reused (dup2, dup3, close_range, exec) and a parent in
/// waitpid (both on their syscalls' functions there), and CRI-O's opLock stall and a start in its middle (CRI-O 1.35.6 with
/// its cgroupfs driver, on the guests' cgroup v2), the same lock held across crun's call
/// to a frozen systemd (its systemd driver), CRI-O's NRI lock held behind it, and a bus
/// daemon frozen, then late, under a D-Bus call.
pub const GUEST_MATRIX_MORE: &[GuestTests] = &[
    all("pleg_relist"),
    all("netlink_request"),
    all("pod_names"),
    all("negative_soak"),
    all("socket_reuse"),
    all("child_wait"),
    all("crio_update_stopped"),
    all("crio_before_attach"),
    all("crio_systemd_dbus"),
    all("crio_pod_names"),
    all("crio_nri_sync"),
    all("dbus_daemon_frozen"),
];

/// The whole guest matrix, in order.
fn guest_matrix() -> impl Iterator<Item = &'static GuestTests> {
    GUEST_CI.iter().chain(GUEST_SEED).chain(GUEST_MATRIX_MORE)
}

/// Longest a guest test may run before the guest stops it as hung (emulated time is slow;
/// the longest pass so far took 319 s, pod names on 5.10).
const GUEST_TEST_TIMEOUT_S: u32 = 900;
/// What a guest stage may take over its tests' own limits (boot, the summary) before it is
/// stopped from the host, for when the guest's kernel hangs and its `timeout` never fires.
const GUEST_BOOT_SLACK: Duration = Duration::from_secs(300);
/// The most `cargo xtask test`'s own guest stage may take, from the host: it keeps a
/// fresh-clone CI run under its hour. Alone after the host's scenarios it took 29 min
/// (single-threaded TCG: one host core for two vCPUs), which made the run 67 min; beside
/// them it shares the host's two cores with them.
const GUEST_CI_LIMIT: Duration = Duration::from_secs(40 * 60);
/// How much slower the scenarios' clock runs in a TCG guest than on this machine kind:
/// their timing bounds and deadlines are multiplied by it (`tests/src/timing.rs`). Two
/// vCPUs on one host thread (single-threaded TCG) run slower than on two: 6, not 4.
const GUEST_TIME_SCALE: u32 = 6;
/// Guests run at once by `--kernels all`: each takes one host thread (single-threaded TCG).
const GUEST_PARALLEL: usize = 2;
/// Guest memory: containerd's loop-mounted roots live in the guest's /tmp tmpfs (RAM).
const GUEST_MEMORY: &str = "8G";

/// A shell function that prints, after each guest test, what a test can leave behind in
/// the guest: memory, the /tmp tmpfs (containerd's roots), loop devices, mounts, pinned
/// BPF objects and the commonest processes. A slow leak across tests shows as a trend.
const GUEST_STATE: &str = r#"guest_state() {
  echo "guest state: $(awk '/MemAvailable/{printf "%d MiB available", $2/1024}' /proc/meminfo), \
/tmp $(df -m --output=used /tmp | tail -1 | tr -d ' ') MiB, $(losetup -a 2>/dev/null | wc -l) loop devices, \
$(wc -l < /proc/mounts) mounts, $(ls /sys/fs/bpf 2>/dev/null | wc -l) pinned, $(ls /proc | grep -c '^[0-9]') processes: \
$(ps --ppid 2 -p 2 --deselect -o comm= | sort | uniq -c | sort -rn | head -6 | awk '{printf "%s %s, ", $2, $1}')" >&2
}
"#;

/// A guest stage ready to boot: its kernel, its script and its limit.
struct GuestStage {
    name: String,
    kernel: vm::Kernel,
    script: String,
    limit: Duration,
}

/// Runs `stages` side by side, [`GUEST_PARALLEL`] at a time (a guest takes one host
/// thread), each into its log under the target directory; prints each one's result lines
/// as it ends. Returns the names of those that failed.
fn run_stages(stages: Vec<GuestStage>) -> Vec<String> {
    let queue = std::sync::Mutex::new(stages.into_iter());
    let failed = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..GUEST_PARALLEL {
            scope.spawn(|| loop {
                let Some(stage) = queue.lock().ok().and_then(|mut q| q.next()) else { return };
                let name = stage.name.clone();
                if run_logged(stage).is_err() {
                    if let Ok(mut f) = failed.lock() {
                        f.push(name);
                    }
                }
            });
        }
    });
    failed.into_inner().unwrap_or_default()
}

/// Runs one guest stage into its log under the target directory; prints its result lines
/// as it ends, and the whole output of each test that failed (the log stays for the rest).
fn run_logged(stage: GuestStage) -> Result<()> {
    let name = stage.name.clone();
    let log = cmd::target_dir().join("guest").join(format!("{name}.log"));
    eprintln!("guest {name}: started, its log is {}", log.display());
    let result = stage.run(Some(&log));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    for section in failed_sections(&text, &name) {
        eprintln!("guest {name}: the output of a failed test, from its log:\n{section}");
    }
    // What the log says of each test, and any lockup the kernel reported.
    for line in text.lines().filter(|l| l.starts_with(&format!("guest {name}")) || l.contains("soft lockup") || l.contains("rcu: INFO")) {
        eprintln!("{line}");
    }
    if let Err(e) = &result {
        eprintln!("guest {name}: {e:#}");
    }
    result
}

/// Most lines of a failed test's output printed from a guest log (its last ones).
const FAILED_SECTION_LINES: usize = 600;

/// The output of each test that failed in guest `name`'s log: from its `==> guest NAME:
/// LABEL` line to its `guest NAME: LABEL: FAILED` line, the last [`FAILED_SECTION_LINES`].
fn failed_sections(log: &str, name: &str) -> Vec<String> {
    let start = format!("==> guest {name}: ");
    let mut sections = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    for line in log.lines() {
        if line.starts_with(&start) {
            current.clear();
        }
        current.push(line);
        if line.starts_with(&format!("guest {name}: ")) && line.contains(": FAILED in ") {
            let from = current.len().saturating_sub(FAILED_SECTION_LINES);
            sections.push(current[from..].join("\n"));
            current.clear();
        }
    }
    sections
}

/// Builds what a guest stage needs (the release build, the scenario binaries) and writes
/// its script.
fn prepare_stage<'a>(
    kernel: &str,
    tests: impl IntoIterator<Item = &'a GuestTests>,
    soak_secs: Option<u32>,
    limit: Option<Duration>,
    fallback: bool,
) -> Result<GuestStage> {
    cmd::header(&format!("privileged scenarios in a guest: Linux {kernel}"));
    if !cmd::is_root() {
        bail!("the guest stage boots a kernel and runs the privileged scenarios in it: run as root");
    }
    let k = vm::resolve(kernel)?;
    // The release build, as on a node: under emulation the debug build's scans fell up to
    // 2 s behind (containerd 2.3's whole 9770 window), the release build's 36 ms at most.
    run::build_release()?;
    let exes = scenario_executables()?;
    let plegwatch = run::release_binary();
    let mut script = String::from("pass=0; fail=0; failed=''\n");
    script.push_str(GUEST_STATE);
    let mut count = 0u32;
    script.push_str(&format!("export {}={}\n", crate::test::BIN_ENV, plegwatch.display()));
    script.push_str(&format!("export PLEGWATCH_TEST_TIME_SCALE={GUEST_TIME_SCALE}\n"));
    // Debian's kernels take fentry/fexit programs (this host's refuses them): the
    // scenarios check that plegwatch chose those variants there.
    script.push_str("export PLEGWATCH_TEST_FEXIT=1\n");
    if fallback {
        script.push_str("export PLEGWATCH_FALLBACK=all\n");
    }
    if std::env::var_os("CI").is_some() {
        script.push_str("export CI=true\n");
    }
    if let Some(secs) = soak_secs {
        script.push_str(&format!("export {SOAK_ENV}={secs}\n"));
    }
    // What plegwatch itself says of this kernel, for the log (the matrix's table).
    script.push_str(&format!("echo '==> guest {kernel}: plegwatch doctor' >&2; {} doctor >&2 || true\n", plegwatch.display()));
    for t in tests {
        let exe = exes.get(t.file).with_context(|| format!("no scenario test binary named {}", t.file))?;
        let runs: Vec<(String, String)> = if t.tests.is_empty() {
            vec![(t.file.to_string(), String::new())]
        } else {
            t.tests.iter().map(|n| (format!("{}::{n}", t.file), format!("--exact {n}"))).collect()
        };
        for (label, filter) in runs {
            count += 1;
            script.push_str(&format!(
                "echo '==> guest {kernel}: {label}' >&2; s=$(date +%s)\n\
                 if timeout -k 30 {GUEST_TEST_TIMEOUT_S} {exe} {filter} --test-threads=1 --nocapture; then pass=$((pass+1)); r=ok; \
                 else fail=$((fail+1)); r=FAILED; failed=\"$failed {label}\"; fi\n\
                 echo \"guest {kernel}: {label}: $r in $(( $(date +%s) - s )) s\" >&2; guest_state\n",
                exe = exe.display()
            ));
        }
    }
    script.push_str(&format!("echo \"guest {kernel} ($(uname -r)): $pass passed, $fail failed$failed\" >&2\n[ $fail -eq 0 ]\n"));
    let limit = limit.unwrap_or(Duration::from_secs(u64::from(count * (GUEST_TEST_TIMEOUT_S + 30))) + GUEST_BOOT_SLACK);
    Ok(GuestStage { name: kernel.to_string(), kernel: k, script, limit })
}

impl GuestStage {
    /// Boots the guest and runs the script, its output into `log` or through to ours.
    fn run(self, log: Option<&Path>) -> Result<()> {
        let status = vm::guest(&self.kernel, GUEST_MEMORY, "the scenarios", &self.script, Some(self.limit), log)?;
        if status != 0 {
            bail!("scenarios failed in the guest on Linux {} ({}): exit {status}", self.name, self.kernel.release);
        }
        Ok(())
    }
}

/// The scenario crate's test binaries by name, built now (`cargo test --no-run`).
fn scenario_executables() -> Result<HashMap<String, PathBuf>> {
    let out = cmd::output(cmd::cargo().args(["test", "-p", SCENARIOS, "--no-run", "--message-format=json-render-diagnostics"]))?;
    let mut exes = HashMap::new();
    for line in out.lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let is_test = msg["target"]["kind"].as_array().is_some_and(|k| k.iter().any(|k| k == "test"));
        if let (true, Some(name), Some(exe)) = (is_test, msg["target"]["name"].as_str(), msg["executable"].as_str()) {
            exes.insert(name.to_string(), PathBuf::from(exe));
        }
    }
    if exes.is_empty() {
        bail!("cargo test --no-run -p {SCENARIOS} named no test binary");
    }
    Ok(exes)
}

/// `cargo fmt --check` and `cargo clippy -D warnings` over everything.
fn lint() -> Result<()> {
    cmd::header("lint (rustfmt, clippy)");
    cmd::run(cmd::cargo().args(["fmt", "--all", "--check"]))?;
    cmd::run(cmd::cargo().args(["fmt", "--check", "--manifest-path", "fuzz/Cargo.toml"]))?;
    cmd::run(cmd::cargo().args(["clippy", "--workspace", "--all-targets", "--", "-D", "warnings"]))
}

fn unit_tests() -> Result<()> {
    cmd::header("unit tests (unprivileged)");
    cmd::run(cmd::cargo().args(["test", "--workspace", "--exclude", SCENARIOS]))
}

/// The cargo-fuzz targets in `fuzz/`: parsers of untrusted bytes (netlink and D-Bus
/// captures, ELF files, ttrpc frame headers, another process's `runtime.g`).
pub const FUZZ_TARGETS: &[&str] = &["netlink_parse", "dbus_stream", "gopclntab", "ttrpc_header", "goroutine_decode"];
/// Seconds each target runs in `cargo xtask test`: a smoke run that catches
/// regressions on the seeds and a little beyond, not a campaign (that is
/// `cargo xtask fuzz`).
const FUZZ_SECONDS: u32 = 10;

fn fuzz() -> Result<()> {
    cmd::header("fuzz (short runs)");
    run_fuzz(FUZZ_TARGETS, FUZZ_SECONDS)
}

/// Arguments of `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Minutes each target runs.
    #[arg(long, value_name = "M", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1440))]
    pub minutes: u32,
    /// Only these targets (repeatable) [default: all].
    #[arg(long, value_name = "TARGET")]
    pub target: Vec<String>,
}

/// `cargo xtask fuzz`: every parser target (or those named) for `--minutes` each, its
/// corpus kept under the temporary directory between runs; a crash stops it with the
/// reproducing input in `fuzz/artifacts/`.
pub fn fuzz_campaign(args: &FuzzArgs) -> Result<()> {
    let targets: Vec<&str> = if args.target.is_empty() {
        FUZZ_TARGETS.to_vec()
    } else {
        for t in &args.target {
            if !FUZZ_TARGETS.contains(&t.as_str()) {
                bail!("unknown fuzz target {t} (known: {})", FUZZ_TARGETS.join(", "));
            }
        }
        args.target.iter().map(String::as_str).collect()
    };
    cmd::header(&format!("fuzz: {} target(s), {} min each", targets.len(), args.minutes));
    run_fuzz(&targets, args.minutes * 60)
}

fn run_fuzz(targets: &[&str], seconds: u32) -> Result<()> {
    let root = cmd::workspace_root();
    for target in targets {
        let seconds = seconds.to_string();
        let target = *target;
        let corpus = std::env::temp_dir().join(format!("plegwatch-fuzz-{target}"));
        std::fs::create_dir_all(&corpus)?;
        let seeds = root.join("fuzz/seeds").join(target);
        cmd::run(
            std::process::Command::new("cargo")
                .current_dir(root.join("fuzz"))
                .args(["+nightly", "fuzz", "run", target])
                .arg(&corpus)
                .arg(&seeds)
                .args(["--", &format!("-max_total_time={seconds}"), "-print_final_stats=1"]),
        )?;
    }
    Ok(())
}

/// The scenarios, with the negative soak run for `soak_secs` when given.
/// Builds the fake-kubelet fixture on the host before the guests boot, for a guest matrix
/// run without the host stage. A guest (TCG) would build it itself, the first time in
/// minutes (265 s on an idle 5.10 guest; past a scenario's 900 s limit on a loaded host);
/// once the host has built it, the Go cache under `target/fake-kubelet` (shared with the
/// guest) makes the guest's build a link. The fixture's own scenario builds it and checks
/// it (stripped, kubelet's names in `.gopclntab`).
fn warm_go_fixture() -> Result<()> {
    cmd::header("the fake-kubelet fixture, built on the host for the guests");
    if !cmd::is_root() {
        bail!("the guest matrix runs privileged scenarios: run `cargo xtask test` as root");
    }
    let test = "fake_kubelet_relists_blocks_and_releases";
    cmd::run(cmd::cargo().args(["test", "-q", "-p", SCENARIOS, "--test", "fake_kubelet_fixture", "--", "--exact", test]))
}

fn scenarios(soak_secs: Option<u32>) -> Result<()> {
    cmd::header("privileged scenarios");
    if !cmd::is_root() {
        bail!("the privileged scenarios (cargo test -p {SCENARIOS}) need root: run `cargo xtask test` as root");
    }
    run::build_debug()?;
    let mut cargo = cmd::cargo();
    cargo.env(BIN_ENV, run::debug_binary());
    if let Some(secs) = soak_secs {
        eprintln!("negative soak: {secs} s ({SOAK_ENV}={secs})");
        cargo.env(SOAK_ENV, secs.to_string());
    }
    cmd::run(cargo.args(["test", "-p", SCENARIOS, "--", "--test-threads=1"]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_tests_output_is_cut_from_the_guest_log() {
        let log = "boot\n==> guest 6.1: a\nfine\nguest 6.1: a: ok in 3 s\n==> guest 6.1: b::x\npanicked here\n\
                   guest 6.1: b::x: FAILED in 9 s\n==> guest 6.1: c\nguest 6.1: c: ok in 1 s\n";
        let sections = failed_sections(log, "6.1");
        assert_eq!(sections, vec!["==> guest 6.1: b::x\npanicked here\nguest 6.1: b::x: FAILED in 9 s".to_string()]);
        assert!(failed_sections(log, "5.10").is_empty());
        assert!(failed_sections(&log.replace("FAILED", "ok"), "6.1").is_empty());
    }
}
