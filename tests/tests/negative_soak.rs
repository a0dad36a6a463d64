//! Negative soak: a node busy with ordinary, healthy work, all at once, under
//! `plegwatch watch --warn 2s` watching the whole node, must raise no incident and print no
//! stall line; and the probes must have seen that work, so that a plegwatch that attached
//! nothing fails here too.
//!
//! For [`soak_duration`] (60 s; `cargo xtask test --soak` sets [`SOAK_ENV`] to 600):
//! - container churn on a private containerd 1.6 (the containerd bed's [`Stage`], its root
//!   on a loop ext4 of its own): a container created, started, stopped (SIGKILL at once)
//!   and removed every second in a host-network pod;
//! - the same churn on a private CRI-O 1.35.6 (the CRI-O bed, [`Crio`]: conmon and runc),
//!   in a host-network pod of its own;
//! - the fake-kubelet fixture (a test fixture, not kubelet) relisting over CRI every second,
//!   one against that containerd and one against that CRI-O;
//! - D-Bus calls on a private bus, several a second (`dbus-send --print-reply` to a live
//!   `dbus-test-tool echo` service and to the bus itself), and two `gdbus monitor` signal
//!   listeners, which block in read forever by design (one started before plegwatch, found
//!   by its startup sweep; one after);
//! - two `ip monitor` multicast listeners (likewise, one before and one after) and ordinary
//!   `ip link show`, `ip addr show`, `ip route show` requests several times a second;
//! - small writes with fsync, fdatasync, sync_file_range, syncfs and `sync FILE` on a loop
//!   ext4 and a tmpfs, unthrottled, and an umount and mount of the loop ext4 (and of a
//!   second tmpfs) every few seconds.
//!
//! `sync` is only ever run on files of the test's own filesystems (`sync FILE`, `sync -f
//! FILE`), never bare: a global sync would wait on whatever other filesystems of the machine
//! have dirty, and that is not this test's business.
//!
//! What plegwatch saw is taken from its `summary` line and checked against floors derived
//! from what the test did (at least half of each): netlink requests and D-Bus calls seen
//! and answered (`requests_seen`), relists and CRI calls seen as Go calls (`go_latency`,
//! `relists`), container exits seen in containerd and the shim, CRI-O's list calls and
//! container starts and removals, and the watched syscalls
//! (`syscalls`, `waits_started`). The counts are printed.
//!
//! Needs root, `PLEGWATCH_BIN`, the containerd bed's tools, the fixture's Go build, and the
//! programs in [`PROGRAMS`]; a missing program is a skip with its name, and a failure under CI.

use std::collections::HashSet;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use serde_json::Value;

use plegwatch_scenarios::child::Proc;
use plegwatch_scenarios::containerd::bed::Stage;
use plegwatch_scenarios::containerd::cri::{self, ContainerConfig, Cri, Pod, PodSandboxConfig};
use plegwatch_scenarios::containerd::image::BUSYBOX;
use plegwatch_scenarios::containerd::{self, procs, Placement, Runc};
use plegwatch_scenarios::crio::{self, Crio};
use plegwatch_scenarios::dbus::{self, PrivateBus, START_TIMEOUT};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::gofixture::{self, FakeKubelet};
use plegwatch_scenarios::incidents::{self, chain_text, Incident};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Event, LoopFs, Mount, Plegwatch};

const SCENARIO: &str = "negative_soak";
/// How long the soak runs, in seconds (60 when unset).
pub const SOAK_ENV: &str = "PLEGWATCH_SOAK_SECS";
const DEFAULT_SOAK: Duration = Duration::from_secs(60);
/// `--warn`: 2 s on a node; on a slow clock (a TCG guest), 2 s times the clock's scale and
/// 2.5 times more. The scale (6) covers most of a guest's slowness, but not container
/// creation with both runtimes churning: in a 6.1 guest CRI-O's CreateContainer took 9.0 s
/// at the median and 13.7 s at most over one soak (runc and its wrapper busy or in D
/// throughout), past a 12 s --warn, which plegwatch rightly flagged. The soak is about
/// ordinary churn on a node running at its own speed.
fn warn() -> String {
    const GUEST_CREATE_SLACK: f64 = 2.5;
    let scale = plegwatch_scenarios::timing::scale();
    let scaled = plegwatch_scenarios::timing::scaled(Duration::from_secs(2));
    let warn = if scale > 1.0 { scaled.mul_f64(GUEST_CREATE_SLACK) } else { scaled };
    format!("{}ms", warn.as_millis())
}

/// Programs the load runs besides the containerd bed's ([`containerd::TOOLS`]).
const PROGRAMS: &[&str] = &["ip", "dbus-daemon", "dbus-send", "dbus-test-tool", "gdbus", "mkfs.ext4", "losetup", "mount", "umount", "sync"];

/// The live D-Bus service the calls go to.
const ECHO: &str = "com.example.SoakEcho";
/// One container through its whole life per period.
const CHURN_PERIOD: Duration = Duration::from_secs(1);
/// A D-Bus call every this often (alternating the echo service and the bus).
const DBUS_PERIOD: Duration = Duration::from_millis(150);
/// The three `ip` requests every this often.
const IP_PERIOD: Duration = Duration::from_millis(300);
/// A round of synced writes every this often...
const IO_PERIOD: Duration = Duration::from_millis(200);
/// ...and an umount and mount of the loop ext4 and the spare tmpfs every this many rounds.
const REMOUNT_EVERY: u32 = 15;
const SMALL: usize = 64 << 10;

#[test]
fn ordinary_node_load_raises_no_incident() -> Result<()> {
    preflight::require();
    let missing = missing_programs();
    if !missing.is_empty() {
        preflight::skip(SCENARIO, &format!("not found in PATH: {} (`cargo xtask setup` installs them)", missing.join(", ")));
        return Ok(());
    }
    containerd::require();
    if let Some(why) = Crio::missing() {
        preflight::skip(SCENARIO, &why);
        return Ok(());
    }
    let soak = soak_duration()?;
    let fixture = gofixture::build_fake_kubelet()?;

    // Guards in set-up order: they drop in reverse, plegwatch first, the loop ext4 last.
    let mut fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let scratch = tempfile::Builder::new().prefix("plegwatch-soak-").tempdir()?;
    let (tmpfs_dir, spare_dir) = (scratch.path().join("tmpfs"), scratch.path().join("spare"));
    std::fs::create_dir(&tmpfs_dir)?;
    std::fs::create_dir(&spare_dir)?;
    let tmpfs = Mount::new("tmpfs", &tmpfs_dir, "tmpfs", Some("size=16m"))?;
    // containerd's root on an ext4 of its own (unthrottled): each container's rootfs umount
    // syncs the filesystem under its overlay, which should be this one, not the machine's
    // root, where whatever else dirtied it (a build just before) would be synced too.
    let containerd_fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let stage = Stage::start(Placement::RootUnder(containerd_fs.mount_point().to_path_buf()), Runc::Real, "soak")?;
    let crio = Crio::start()?;
    let crio_pod = Pod::run(crio.cri(), crio.pod_config("soak-crio", "")?)?;
    let crio_image = crio.image(crio::BUSYBOX_REPO);
    let bus = PrivateBus::start()?;
    let echo = dbus::spawn("dbus-test-tool echo", bus.command("dbus-test-tool").args(["echo", "--session"]).arg(format!("--name={ECHO}")))?;
    bus.wait_owned(ECHO, START_TIMEOUT)?;
    let listener_before = dbus::start_signal_listener(&bus)?;
    let monitor_before = Proc::spawn("ip monitor", Command::new("ip").arg("monitor"))?;
    let endpoint = format!("unix://{}", stage.containerd().socket().display());
    let kubelet = FakeKubelet::start_cri(&fixture, &endpoint, &["--period", "1s"])?;
    let crio_endpoint = format!("unix://{}", crio.socket().display());
    let crio_kubelet = FakeKubelet::start_cri(&fixture, &crio_endpoint, &["--period", "1s"])?;
    let containerd_config = |name: &str| cri::container(name, BUSYBOX, &["/bin/sleep", "600"]);
    let crio_config = |name: &str| {
        let mut config = cri::container(name, &crio_image, &["/bin/sleep", "600"]);
        if let Some(i) = config.image.as_mut() {
            // CRI-O checks the image's signature policy against the name the user gave.
            i.user_specified_image = crio_image.clone();
        }
        config
    };
    // Each runtime's first container, with everything cold, before plegwatch starts: in a
    // TCG guest CRI-O's first CreateContainer took 13 s (runc busy throughout), over the
    // guest's scaled --warn; the soak is about ordinary churn.
    let (crio_pod_id, crio_pod_config) = (crio_pod.id().to_string(), crio_pod.config().clone());
    for (cri, (pod_id, pod_config), config) in [
        (stage.cri(), (stage.pod().id().to_string(), stage.pod().config().clone()), containerd_config("warm-up")),
        (crio.cri(), (crio_pod_id, crio_pod_config), crio_config("warm-up")),
    ] {
        let cri = cri.with_timeout(plegwatch_scenarios::timing::scaled(Duration::from_secs(60)));
        cycle(&cri, &pod_id, &pod_config, &config, &mut Vec::new()).context("the warm-up container")?;
    }
    // Let the listeners settle into their blocking reads before plegwatch's sweep.
    thread::sleep(Duration::from_millis(500));

    let warn = warn();
    let mut plegwatch = Plegwatch::start(&["--warn", &warn])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let ready_mono = gofixture::monotonic_now();
    let listener_after = dbus::start_signal_listener(&bus)?;
    let monitor_after = Proc::spawn("ip monitor", Command::new("ip").arg("monitor"))?;
    let long_lived: Vec<u32> = [&echo, &listener_before, &listener_after, &monitor_before, &monitor_after]
        .iter()
        .map(|p| p.pid())
        .chain([bus.daemon_pid(), kubelet.pid(), stage.containerd().pid(), crio_kubelet.pid(), crio.pid()])
        .collect();

    let bus_address = format!("unix:path={}", bus.socket().display());
    // A CRI call's deadline on the scenarios' clock: a TCG guest's churn with both
    // runtimes took over 30 s for one call.
    let cri_deadline = plegwatch_scenarios::timing::scaled(Duration::from_secs(30));
    let churn_cri = stage.cri().with_timeout(cri_deadline);
    let pod = (stage.pod().id().to_string(), stage.pod().config().clone());
    let crio_churn_cri = crio.cri().with_timeout(cri_deadline);
    let crio_pod_ids = (crio_pod.id().to_string(), crio_pod.config().clone());
    let started = Instant::now();
    eprintln!("soak: {:.0}s of ordinary load under plegwatch --warn {warn}", soak.as_secs_f64());

    let stop = AtomicBool::new(false);
    let mut ours: HashSet<u32> = long_lived.iter().copied().collect();
    let mut reported = 0;
    let (churned, crio_churned, called, asked, io) = thread::scope(|s| {
        let _stop = StopOnDrop(&stop);
        let churn_containerd = s.spawn(|| churn(&churn_cri, &pod, &containerd_config, &stop));
        let churn_crio = s.spawn(|| churn(&crio_churn_cri, &crio_pod_ids, &crio_config, &stop));
        let dbus = s.spawn(|| dbus_calls(&bus_address, &stop));
        let ip = s.spawn(|| ip_requests(&stop));
        let io = s.spawn(|| syncs_and_mounts(&mut fs, tmpfs.target(), &spare_dir, &stop));
        while started.elapsed() < soak {
            thread::sleep(Duration::from_secs(1));
            note_our_processes(&mut ours, &stage, &crio);
            // Say at once when something is reported, with whose it is.
            let events = plegwatch.events();
            for e in events[reported..].iter().filter(|e| e.is("incident") || e.is("stall")) {
                eprintln!("soak: REPORTED at {:.1}s: {}", e.at.duration_since(started).as_secs_f64(), e.json);
            }
            reported = events.len();
        }
        stop.store(true, Ordering::Relaxed);
        Ok::<_, anyhow::Error>((
            join("containerd churn", churn_containerd)?,
            join("CRI-O churn", churn_crio)?,
            join("D-Bus", dbus)?,
            join("ip", ip)?,
            join("sync/mount", io)?,
        ))
    })?;
    let ran = started.elapsed();
    note_our_processes(&mut ours, &stage, &crio);
    ours.extend(churned.pids.iter().chain(&crio_churned.pids).chain(&called.pids).chain(&asked.pids));
    // The last relists and calls end; then plegwatch's last scan sees nothing open.
    thread::sleep(Duration::from_secs(1));
    let stop_mono = gofixture::monotonic_now();
    let events = plegwatch.stop()?;
    let all = || dump(&events, started);

    eprintln!(
        "soak: the test did in {:.1}s: {} containers on containerd and {} on CRI-O (create, start, stop, \
         remove); {} D-Bus calls; {} ip requests; {} fsync, {} fdatasync, {} sync_file_range, {} syncfs, {} sync FILE, {} sync -f FILE; {} umounts",
        ran.as_secs_f64(),
        churned.done,
        crio_churned.done,
        called.done,
        asked.done,
        io.fsync,
        io.fdatasync,
        io.sync_file_range,
        io.syncfs,
        io.sync_cmd,
        io.sync_f_cmd,
        io.umounts,
    );
    let relists = relists_between(&kubelet, ready_mono, stop_mono)?;
    let crio_relists = relists_between(&crio_kubelet, ready_mono, stop_mono)?;
    eprintln!("soak: the fixtures' relists while plegwatch watched: {relists} on containerd, {crio_relists} on CRI-O");

    // Nothing reported: no incident, no stall line...
    let mut problems = Vec::new();
    let raised = incidents::incidents(&events);
    let stalls: Vec<&Event> = events.iter().filter(|e| e.is("stall")).collect();
    if !raised.is_empty() || !stalls.is_empty() {
        problems.push(format!(
            "plegwatch reported {} incidents and {} stall lines under ordinary load that never waits {warn}:\n{}{}",
            raised.len(),
            stalls.len(),
            raised.iter().map(|i| describe_incident(i, &ours)).collect::<String>(),
            stalls.iter().map(|e| describe_stall(e, &ours)).collect::<String>(),
        ));
    }

    // ...and the probes saw the load.
    let summary = events.iter().rev().find(|e| e.is("summary")).context("no summary line")?;
    let seen = Seen::of(summary, kubelet.pid());
    let half = |n: u64| n.div_ceil(2);
    let relists = u64::from(relists);
    let crio_relists = u64::from(crio_relists);
    let checks: Vec<(&str, u64, u64)> = vec![
        ("netlink requests seen (requests_seen.netlink_requests) vs ip requests made", seen.netlink_requests, half(asked.done)),
        ("netlink requests answered (requests_seen.netlink_answered) vs ip requests made", seen.netlink_answered, half(asked.done)),
        ("D-Bus calls seen (requests_seen.dbus_calls) vs calls made", seen.dbus_calls, half(called.done)),
        ("D-Bus calls answered (requests_seen.dbus_answered) vs calls made", seen.dbus_answered, half(called.done)),
        ("relists on the fixture's relist clock (relists[].relists)", seen.relist_clock, half(relists)),
        ("kubelet Relist calls (go_latency) vs the fixture's relists", seen.go("kubelet", ".Relist"), half(relists)),
        ("containerd ListPodSandbox calls (go_latency) vs relists", seen.go("containerd", ".ListPodSandbox"), half(relists)),
        ("containerd ListContainers calls (go_latency) vs relists", seen.go("containerd", ".ListContainers"), half(relists)),
        (
            "containerd handleContainerExit calls (go_latency) vs containers",
            seen.go("containerd", ".handleContainerExit"),
            half(churned.done),
        ),
        ("containerd-shim Delete calls (go_latency) vs containers", seen.go("containerd-shim", ".Delete"), half(churned.done)),
        ("crio ListPodSandbox calls (go_latency) vs its fixture's relists", seen.go("crio", "Server).ListPodSandbox"), half(crio_relists)),
        ("crio ListContainers calls (go_latency) vs its fixture's relists", seen.go("crio", "Server).ListContainers"), half(crio_relists)),
        ("crio StartContainer calls (go_latency) vs its containers", seen.go("crio", "Server).StartContainer"), half(crio_churned.done)),
        ("crio RemoveContainer calls (go_latency) vs its containers", seen.go("crio", "Server).RemoveContainer"), half(crio_churned.done)),
        ("umount2 calls (syscalls) vs umounts made", seen.syscall("umount2"), half(io.umounts)),
        ("fsync calls (syscalls) vs fsync + sync FILE made", seen.syscall("fsync"), half(io.fsync + io.sync_cmd)),
        ("fdatasync calls (syscalls) vs made", seen.syscall("fdatasync"), half(io.fdatasync)),
        ("sync_file_range calls (syscalls) vs made", seen.syscall("sync_file_range"), half(io.sync_file_range)),
        ("syncfs calls (syscalls) vs syncfs + sync -f FILE made", seen.syscall("syncfs"), half(io.syncfs + io.sync_f_cmd)),
        ("waits started (waits_started) vs syncs and umounts made", seen.waits_started, half(io.total())),
    ];
    eprintln!("soak: plegwatch saw (floor: half of what the test did):");
    for (what, got, floor) in &checks {
        eprintln!("  {got:>7} (floor {floor:>5})  {what}");
    }
    eprintln!("  dropped by the kernel: {} waits, {} records", seen.dropped_waits, seen.dropped_events);
    let short: Vec<String> = checks
        .iter()
        .filter(|(_, got, floor)| got < floor || *floor == 0)
        .map(|(what, got, floor)| format!("{what}: {got}, want at least {floor} (and a non-zero floor)"))
        .collect();
    if !short.is_empty() {
        problems.push(format!("plegwatch did not see the load it watched:\n  {}\nits summary: {}", short.join("\n  "), summary.json));
    }
    if !problems.is_empty() {
        bail!("{}\nall lines, timed from the start of the load:\n{}", problems.join("\n"), all());
    }
    eprintln!("soak: passed: no incident, no stall; every count at or above its floor");
    Ok(())
}

/// A worker's result: an error if it failed or panicked.
fn join<T>(name: &str, h: thread::ScopedJoinHandle<'_, Result<T>>) -> Result<T> {
    h.join().map_err(|_| anyhow!("the {name} worker panicked"))?.with_context(|| format!("the {name} worker"))
}

/// [`SOAK_ENV`] as a duration, or [`DEFAULT_SOAK`].
fn soak_duration() -> Result<Duration> {
    match std::env::var(SOAK_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(DEFAULT_SOAK),
        Err(e) => bail!("{SOAK_ENV}: {e}"),
        Ok(v) => {
            let secs: u64 = v.trim().parse().with_context(|| format!("{SOAK_ENV}={v:?} is not a number of seconds"))?;
            ensure!(secs >= 10, "{SOAK_ENV}={secs}: a soak shorter than 10 s proves nothing");
            Ok(Duration::from_secs(secs))
        }
    }
}

fn missing_programs() -> Vec<&'static str> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    PROGRAMS.iter().chain(containerd::TOOLS).copied().filter(|p| !std::env::split_paths(&path).any(|d| d.join(p).is_file())).collect()
}

/// Sets the flag when dropped: the workers stop also when the main thread fails.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// What a worker did.
#[derive(Debug, Default)]
struct Tally {
    done: u64,
    /// The processes it ran.
    pids: Vec<u32>,
}

/// Sleeps what is left of `period` since `since`, in steps, until `stop`.
fn pace(since: Instant, period: Duration, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        let left = period.saturating_sub(since.elapsed());
        if left.is_zero() {
            return;
        }
        thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// One container through its whole life (create, start, stop with SIGKILL at once, remove)
/// every [`CHURN_PERIOD`].
fn churn(
    cri: &Cri,
    (pod_id, pod_config): &(String, PodSandboxConfig),
    config_of: &dyn Fn(&str) -> ContainerConfig,
    stop: &AtomicBool,
) -> Result<Tally> {
    let mut t = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        let name = format!("churn-{}", t.done);
        cycle(cri, pod_id, pod_config, &config_of(&name), &mut t.pids).with_context(|| format!("container {name}"))?;
        t.done += 1;
        pace(began, CHURN_PERIOD, stop);
    }
    Ok(t)
}

/// One container through its whole life: created, started, stopped at once, removed. Its
/// pid goes to `pids`.
fn cycle(cri: &Cri, pod_id: &str, pod_config: &PodSandboxConfig, config: &ContainerConfig, pids: &mut Vec<u32>) -> Result<()> {
    let id = cri.create_container(pod_id, config, pod_config).context("create")?;
    let lived = (|| {
        cri.start_container(&id)?;
        if let Ok(pid) = cri.container_pid(&id) {
            pids.push(pid);
        }
        cri.stop_container(&id, Duration::ZERO)
    })();
    let removed = cri.remove_container(&id);
    lived.with_context(|| format!("container {id}"))?;
    removed.with_context(|| format!("remove container {id}"))
}

/// `dbus-send --print-reply` every [`DBUS_PERIOD`], alternately to the echo service and to
/// the bus itself. Each is one call the test asked for (libdbus adds its `Hello`).
fn dbus_calls(address: &str, stop: &AtomicBool) -> Result<Tally> {
    let mut t = Tally::default();
    let targets: [&[&str]; 2] = [
        &[&format!("--dest={ECHO}"), "/x", "com.example.SoakEcho.Ping"],
        &["--dest=org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus.ListNames"],
    ];
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        let args = targets[(t.done % 2) as usize];
        plegwatch_scenarios::sys::run_recorded(
            Command::new("dbus-send")
                .env("DBUS_SESSION_BUS_ADDRESS", address)
                .args(["--session", "--print-reply", "--reply-timeout=10000"])
                .args(args),
            &mut t.pids,
        )?;
        t.done += 1;
        pace(began, DBUS_PERIOD, stop);
    }
    Ok(t)
}

/// `ip link show`, `ip addr show`, `ip route show` every [`IP_PERIOD`], on the host: reads
/// only. Each is counted as one request (each makes at least one).
fn ip_requests(stop: &AtomicBool) -> Result<Tally> {
    const COMMANDS: [&[&str]; 3] = [&["link", "show"], &["addr", "show"], &["route", "show"]];
    let mut t = Tally::default();
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        for args in COMMANDS {
            plegwatch_scenarios::sys::run_recorded(Command::new("ip").args(args), &mut t.pids)?;
            t.done += 1;
        }
        pace(began, IP_PERIOD, stop);
    }
    Ok(t)
}

/// The syncs and umounts the test made.
#[derive(Debug, Default)]
struct Io {
    fsync: u64,
    fdatasync: u64,
    sync_file_range: u64,
    syncfs: u64,
    /// `sync FILE` (an fsync) and `sync -f FILE` (a syncfs).
    sync_cmd: u64,
    sync_f_cmd: u64,
    umounts: u64,
}

impl Io {
    fn total(&self) -> u64 {
        self.fsync + self.fdatasync + self.sync_file_range + self.syncfs + self.sync_cmd + self.sync_f_cmd + self.umounts
    }
}

/// Small synced writes on the loop ext4 and the tmpfs every [`IO_PERIOD`]; every
/// [`REMOUNT_EVERY`] rounds, `sync FILE` and `sync -f FILE` on the ext4, an umount and mount
/// of it, and a tmpfs mounted on `spare` and unmounted.
fn syncs_and_mounts(fs: &mut LoopFs, tmpfs: &Path, spare: &Path, stop: &AtomicBool) -> Result<Io> {
    let mut io = Io::default();
    let mut round = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        synced_writes(fs.mount_point(), &mut io).context("synced writes on the loop ext4")?;
        synced_writes(tmpfs, &mut io).context("synced writes on the tmpfs")?;
        round += 1;
        if round.is_multiple_of(REMOUNT_EVERY) {
            let file = fs.mount_point().join("fsync.bin");
            run_quiet(Command::new("sync").arg(&file))?;
            io.sync_cmd += 1;
            run_quiet(Command::new("sync").arg("-f").arg(&file))?;
            io.sync_f_cmd += 1;
            fs.unmount()?;
            fs.mount()?;
            let spare_fs = Mount::new("tmpfs", spare, "tmpfs", Some("size=1m"))?;
            std::fs::write(spare.join("x"), b"x")?;
            spare_fs.unmount()?;
            io.umounts += 2;
        }
        pace(began, IO_PERIOD, stop);
    }
    Ok(io)
}

fn run_quiet(cmd: &mut Command) -> Result<()> {
    plegwatch_scenarios::sys::run(cmd).map(drop)
}

/// Writes small files in `dir` and syncs each a different way, counting each.
fn synced_writes(dir: &Path, io: &mut Io) -> Result<()> {
    plegwatch_scenarios::dirty::synced_writes(dir, SMALL)?;
    io.fsync += 1;
    io.fdatasync += 1;
    io.sync_file_range += 1;
    io.syncfs += 1;
    Ok(())
}

/// Adds the processes that are the test's now: its descendants, the shims of its
/// containerd with theirs (a shim leaves its parent's tree when it daemonizes), and
/// CRI-O's conmons with theirs (likewise).
fn note_our_processes(ours: &mut HashSet<u32>, stage: &Stage, crio: &Crio) {
    ours.extend(procs::descendants(std::process::id()));
    for conmon in crio.conmons() {
        ours.insert(conmon);
        ours.extend(procs::descendants(conmon));
    }
    for shim in stage.containerd().shims() {
        ours.insert(shim.pid);
        ours.extend(procs::descendants(shim.pid));
    }
}

/// How many of the fixture's relists ended between `from` and `to` (its monotonic clock);
/// an error if any of its CRI calls failed.
fn relists_between(kubelet: &FakeKubelet, from: f64, to: f64) -> Result<u32> {
    let mut n = 0;
    let mut i = 1;
    while let Some(r) = kubelet.relist(i) {
        if let Some(Err(f)) = kubelet.cri_relist(i).map(|c| c.result) {
            bail!("the fixture's relist {i}: {} failed: {}", f.method, f.error);
        }
        if r.end.is_some_and(|end| end >= from && end <= to) {
            n += 1;
        }
        i += 1;
    }
    Ok(n)
}

/// Whether `pid` is one of the test's processes, for the failure message.
fn whose(pid: Option<u64>, ours: &HashSet<u32>) -> &'static str {
    match pid.map(|p| ours.contains(&(p as u32))) {
        Some(true) => "the test's",
        Some(false) => "NOT the test's (another process on the node)",
        None => "no pid",
    }
}

fn describe_incident(i: &Incident, ours: &HashSet<u32>) -> String {
    let last = i.last();
    let hops = Incident::chain(last);
    let owners: Vec<String> = hops
        .iter()
        .map(|h| format!("pid {} [{}]: {}", h["pid"], h["comm"].as_str().unwrap_or("?"), whose(h["pid"].as_u64(), ours)))
        .collect();
    format!(
        "incident #{} ({} lines, {}):\n{}\n  whose: {}\n",
        i.id,
        i.lines.len(),
        if i.resolved.is_some() { "resolved" } else { "never resolved" },
        chain_text(&hops),
        owners.join("; ")
    )
}

fn describe_stall(e: &Event, ours: &HashSet<u32>) -> String {
    format!(
        "stall {} pid {} [{}] ({}): {}\n",
        e.str("/kind").unwrap_or("?"),
        e.get("/pid").unwrap_or(&Value::Null),
        e.str("/comm").unwrap_or("?"),
        whose(e.u64("/pid"), ours),
        e.json
    )
}

/// What plegwatch's summary says it saw.
#[derive(Debug)]
struct Seen {
    netlink_requests: u64,
    netlink_answered: u64,
    dbus_calls: u64,
    dbus_answered: u64,
    /// The fixture's relist clock: relists seen for its pid.
    relist_clock: u64,
    waits_started: u64,
    dropped_waits: u64,
    dropped_events: u64,
    /// (target, function, count) of every `go_latency` row.
    go_calls: Vec<(String, String, u64)>,
    /// The summary line, for its `syscalls` table.
    summary: Event,
}

impl Seen {
    fn of(summary: &Event, kubelet_pid: u32) -> Self {
        let n = |p: &str| summary.u64(p).unwrap_or(0);
        let rows = |p: &str| summary.get(p).and_then(Value::as_array).cloned().unwrap_or_default();
        let s = |v: &Value, k: &str| v[k].as_str().unwrap_or_default().to_string();
        Seen {
            netlink_requests: n("/requests_seen/netlink_requests"),
            netlink_answered: n("/requests_seen/netlink_answered"),
            dbus_calls: n("/requests_seen/dbus_calls"),
            dbus_answered: n("/requests_seen/dbus_answered"),
            relist_clock: rows("/relists")
                .iter()
                .find(|r| r["pid"].as_u64() == Some(u64::from(kubelet_pid)))
                .and_then(|r| r["relists"].as_u64())
                .unwrap_or(0),
            waits_started: n("/waits_started"),
            dropped_waits: n("/dropped_waits"),
            dropped_events: n("/dropped_events"),
            go_calls: rows("/go_latency").iter().map(|r| (s(r, "target"), s(r, "function"), r["count"].as_u64().unwrap_or(0))).collect(),
            summary: summary.clone(),
        }
    }

    /// Calls of `target`'s probed functions whose name ends with `function`.
    fn go(&self, target: &str, function: &str) -> u64 {
        self.go_calls.iter().filter(|(t, f, _)| t == target && f.ends_with(function)).map(|r| r.2).sum()
    }

    fn syscall(&self, name: &str) -> u64 {
        self.summary.syscall_count(name)
    }
}
