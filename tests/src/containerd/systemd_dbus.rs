//! Seed incident 002: a container start held up by runc's systemd cgroup driver, whose
//! `StartTransientUnit` call to systemd over D-Bus is never answered (stall-catalog.md,
//! pattern 4: systemd#11809, runc#1959, #3904, #4481; go-systemd calls with
//! `context.TODO()`, so the call has no timeout).
//!
//! The real components: a containerd of the bed's [`Version`] with `SystemdCgroup = true` for
//! its runc runtime, its shim, its runc (`--systemd-cgroup`), dbus-daemon. Only systemd is a
//! stand-in ([`FakeSystemd`], `fake_systemd.py`): it owns `org.freedesktop.systemd1` on a
//! private system bus and answers what runc asks (`StartTransientUnit` with its `JobRemoved`
//! signal, `SetUnitProperties`, `StopUnit`, `ResetFailedUnit`, `Properties.Get`), until the
//! test freezes it (SIGSTOP).
//!
//! Versions: Debian's containerd 1.6.20 with runc 1.1.5 (`libcontainer/cgroups/systemd`), and
//! the release builds of containerd 1.7.34 or 2.3.4 with runc 1.4.3, whose driver is
//! `github.com/opencontainers/cgroups/systemd` (v0.0.6). This machine runs cgroup v1 (the
//! hybrid layout: the v1 controllers, plus cgroup2 at `/sys/fs/cgroup/unified`), so both runc
//! take their v1 manager (1.4.3's `LegacyManager`). At a container's `runc create` 1.4.3
//! asks, in this order (seen on this bed): `StartTransientUnit` of `cri-containerd-ID.scope`
//! (`Description`, `Slice`, `Delegate`, `PIDs`, the four `*Accounting`,
//! `DefaultDependencies`; then it waits up to 30 s for the job's `JobRemoved`), in `Set` the
//! Manager's `Version` (once per process, to choose the device and CPU properties), then
//! `SetUnitProperties` (`DeviceAllow`, `DevicePolicy`, `CPUShares`, `CPUQuotaPeriodUSec`,
//! `CPUQuotaPerSecUSec`; a container is not `SkipDevices`, so no `DevicePolicy` and
//! `DeviceAllow` are read first, and its freezer cgroup is frozen around the call through
//! cgroupfs); at `runc delete`, `StopUnit` (and its `JobRemoved`) then `ResetFailedUnit`.
//! runc 1.1.5 asks the very same (its `SetUnitProperties` lists `DevicePolicy` first), so the
//! stand-in needed no new answers for 1.4.3; it now logs what it refuses, and the scenarios
//! assert it refused nothing.
//!
//! Both runc (go-systemd v22 `NewWithContext`) use systemd only if `/run/systemd/system` is a
//! directory, dial the system bus first
//! (`$DBUS_SYSTEM_BUS_ADDRESS`, else `/var/run/dbus/system_bus_socket`) and, as root, falls
//! back to `/run/systemd/private`. None of that may touch this machine's `/run`, so
//! [`NodeRun`] makes a mount namespace whose `/run` is a temp dir (a bind mount made in that
//! namespace only) holding `systemd/system/` and `dbus/system_bus_socket`; dbus-daemon, the
//! stand-in, and containerd (so its shims and their runc) run in it through `nsenter`. The
//! bus daemon binds `/run/dbus/system_bus_socket` as it sees it: a path that means nothing
//! in plegwatch's mount namespace, as on a node where plegwatch runs in a container.
//!
//! The chain on those components: CRI `StartContainer` (which creates the task: containerd's
//! task service → the shim's ttrpc `Create`) → the shim's `(*service).Create` → `runc create
//! … --systemd-cgroup …`, its child → runc's `startUnit` → go-systemd's
//! `StartTransientUnitContext`: a D-Bus METHOD_CALL on its bus socket, whose reply never
//! comes → the owner of `org.freedesktop.systemd1`, stopped (state `T`). Thawed (SIGCONT), it
//! answers, runc joins the cgroups itself (cgroup v1) and the container starts.
//!
//! [`Bed::prepare`] sets up everything to a created (not started) container; [`Bed::trigger`]
//! freezes the stand-in and starts the container. Drop order (fields in declaration order):
//! the stage (the pod torn down through CRI, with the stand-in thawed first), the monitor, the
//! stand-in, the bus, and last the namespace and its `/run`.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, ensure, Context, Result};

use super::bed::{short, Measured, Returned, Stage, StallBed, StallOutcome};
use super::cri;
use super::daemon::{in_ns, Containerd, Placement, Runc, SystemdCgroups};
use super::image::BUSYBOX;
use super::procs;
use super::Version;
use crate::child::Proc;
use crate::dbus::{self, BusMonitor, MsgKind, PrivateBus, Seen};
use crate::plegwatch::Plegwatch;

/// The name systemd owns on the system bus.
pub const SYSTEMD: &str = "org.freedesktop.systemd1";
/// The interface of the call runc makes.
pub const MANAGER: &str = "org.freedesktop.systemd1.Manager";
/// The call runc's systemd driver makes to create a container's scope.
pub const START_UNIT: &str = "StartTransientUnit";
/// The bus socket as runc (and the bus daemon) see it, in the namespace.
pub const BUS_SOCKET: &str = "/run/dbus/system_bus_socket";
/// The interpreter with Debian's python3-dbus-next (not a pyenv shim's).
pub const PYTHON: &str = "/usr/bin/python3";
/// The programs this bed runs besides [`super::TOOLS`].
pub const TOOLS: &[&str] = &["unshare", "nsenter", "dbus-daemon", "dbus-monitor", "dbus-send"];

const STAND_IN: &str = include_str!("fake_systemd.py");
const POLL: Duration = Duration::from_millis(10);

/// Panics unless this bed's programs are there: [`TOOLS`] in PATH, and [`PYTHON`] with the
/// `dbus_next` module (Debian package python3-dbus-next, which `cargo xtask setup` installs).
pub fn require() {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file())).collect();
    assert!(missing.is_empty(), "not found in PATH: {} (Debian packages util-linux, dbus-daemon, dbus-bin)", missing.join(", "));
    let python = Command::new(PYTHON).args(["-c", "import dbus_next"]).output();
    assert!(
        python.as_ref().is_ok_and(|o| o.status.success()),
        "{PYTHON} cannot import dbus_next (Debian package python3-dbus-next; `cargo xtask setup` \
         installs it): {:?}",
        python.map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
    );
}

/// A mount namespace whose `/run` is a temp dir of its own (with `systemd/system/` and
/// `dbus/`), held by a process that does nothing else. The bind mount exists only in that
/// namespace, and the namespace ends with the last process in it. Dropping this kills the
/// holder by PID and removes the dir; the holder also exits by itself when this process dies
/// (its stdin is a pipe from here).
pub struct NodeRun {
    holder: Child,
    dir: tempfile::TempDir,
}

impl NodeRun {
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("plegwatch-run-").tempdir().context("make a temp dir for the namespace's /run")?;
        for d in ["systemd/system", "dbus"] {
            std::fs::create_dir_all(dir.path().join(d))?;
        }
        let holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
            .arg(r#"mount --bind "$1" /run && echo ready && exec cat >/dev/null"#)
            .arg("sh")
            .arg(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("spawn unshare --mount (Debian package util-linux)")?;
        eprintln!("started the namespace holder (pid {}): /run is {} there", holder.id(), dir.path().display());
        let mut run = Self { holder, dir };
        let mut line = String::new();
        if let Some(out) = run.holder.stdout.take() {
            // The shell prints `ready` or exits (EOF) at once.
            BufReader::new(out).read_line(&mut line)?;
        }
        ensure!(line.trim() == "ready", "the namespace holder did not bind its /run (said {line:?})");
        run.check()?;
        Ok(run)
    }

    /// The bind mount took, in another mount namespace than this process's.
    fn check(&self) -> Result<()> {
        let pid = self.pid();
        let ns = |p: &str| std::fs::read_link(format!("/proc/{p}/ns/mnt")).ok();
        ensure!(
            ns(&pid.to_string()).is_some() && ns(&pid.to_string()) != ns("self"),
            "the holder (pid {pid}) shares this process's mount namespace"
        );
        let there = std::fs::metadata(format!("/proc/{pid}/root/run"))?;
        let here = std::fs::metadata(self.dir.path())?;
        ensure!((there.dev(), there.ino()) == (here.dev(), here.ino()), "/run of pid {pid} is not {}", self.dir.path().display());
        Ok(())
    }

    /// The holder's PID: `nsenter --target` it to run in the namespace.
    pub fn pid(&self) -> u32 {
        self.holder.id()
    }

    /// `program`, run in the namespace (see [`in_ns`]).
    pub fn command(&self, program: &str) -> Command {
        in_ns(Some(self.pid()), program)
    }

    /// Where `/run/REL` of the namespace is from here.
    pub fn host_path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
}

impl Drop for NodeRun {
    fn drop(&mut self) {
        if let Ok(None) = self.holder.try_wait() {
            eprintln!("cleanup: killing the namespace holder (pid {})", self.pid());
            let _ = self.holder.kill();
        }
        let _ = self.holder.wait();
    }
}

/// The stand-in for systemd (`fake_systemd.py` on [`PYTHON`]), in the namespace, owning
/// [`SYSTEMD`] on the bus. Dropping it continues it and kills it.
pub struct FakeSystemd {
    proc: Proc,
    _script: tempfile::TempDir,
}

impl FakeSystemd {
    /// Starts it and waits until it owns its name.
    pub fn start(ns: &NodeRun, bus: &PrivateBus) -> Result<Self> {
        let script = tempfile::Builder::new().prefix("plegwatch-systemd-").tempdir()?;
        let file = script.path().join("fake_systemd.py");
        std::fs::write(&file, STAND_IN).with_context(|| format!("write {}", file.display()))?;
        let mut proc = dbus::spawn("fake systemd", ns.command(PYTHON).arg(&file).arg(format!("unix:path={BUS_SOCKET}")))?;
        ensure!(
            proc.wait_line(dbus::START_TIMEOUT, |l| l.starts_with("ready ")).is_some(),
            "the fake systemd (pid {}) did not say ready within {:?}",
            proc.pid(),
            dbus::START_TIMEOUT
        );
        bus.wait_owned(SYSTEMD, dbus::START_TIMEOUT)?;
        Ok(Self { proc, _script: script })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// The calls it got so far (`MEMBER PATH ARG0`, and `props=NAME,...` for
    /// `StartTransientUnit` and `SetUnitProperties`).
    pub fn calls(&mut self) -> Vec<String> {
        self.lines_after("call ")
    }

    /// The calls it did not know so far (`MEMBER PATH INTERFACE.MEMBER_OR_PROPERTY`),
    /// answered with an UnknownMethod or UnknownProperty error.
    pub fn refused(&mut self) -> Vec<String> {
        self.lines_after("refused ")
    }

    fn lines_after(&mut self, prefix: &str) -> Vec<String> {
        self.proc.lines().iter().filter_map(|(_, l)| l.strip_prefix(prefix).map(String::from)).collect()
    }

    /// SIGSTOP, and waits for state `T`.
    pub fn freeze(&mut self) -> Result<()> {
        self.proc.signal(libc::SIGSTOP)?;
        let deadline = Instant::now() + dbus::START_TIMEOUT;
        while dbus::proc_state(self.pid()) != Some('T') {
            ensure!(Instant::now() < deadline, "the fake systemd (pid {}) is not stopped", self.pid());
            thread::sleep(POLL);
        }
        eprintln!("froze the fake systemd (pid {})", self.pid());
        Ok(())
    }

    /// SIGCONT; the moment just before it was sent.
    pub fn thaw(&mut self) -> Result<Instant> {
        let at = Instant::now();
        self.proc.signal(libc::SIGCONT)?;
        eprintln!("thawed the fake systemd (pid {})", self.pid());
        Ok(at)
    }
}

/// How the stall is staged.
#[derive(Clone, Debug)]
pub struct Options {
    /// The containerd, shim and runc it is staged on.
    pub version: Version,
    /// How long the stand-in stays frozen once runc's call is seen on the bus.
    pub stop_for: Duration,
}

impl Default for Options {
    /// On [`Version::DEBIAN`], frozen 6 s: past `--warn 2s`, the incident's raise and a few
    /// scans.
    fn default() -> Self {
        Self { version: Version::DEBIAN, stop_for: Duration::from_secs(6) }
    }
}

/// The bed: see the module doc. Dropping it thaws the stand-in before anything else drops,
/// so that the pod's teardown (runc's `StopUnit`) is answered.
pub struct Bed {
    stage: Stage,
    monitor: BusMonitor,
    systemd: FakeSystemd,
    bus: PrivateBus,
    ns: NodeRun,
    container_id: String,
    options: Options,
    prepared: Instant,
    /// The runc run before the trigger for plegwatch to probe ([`StallBed::before_trigger`]).
    warm_up: Option<u32>,
}

/// What happened, with the timings that matter.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub version: Version,
    pub container_id: String,
    /// The container's init, once started (host PID).
    pub container_pid: Option<u32>,
    /// The pod's shim, which ran the `runc create`.
    pub shim_pid: u32,
    /// The runc run (and let go once plegwatch had probed it) before the trigger, with
    /// plegwatch watching.
    pub warm_up_pid: Option<u32>,
    /// The `runc create` whose call was held: the caller the bus names.
    pub runc_pid: u32,
    pub runc_argv: Vec<String>,
    /// The frozen stand-in.
    pub systemd_pid: u32,
    /// The bus daemon (in the namespace).
    pub bus_daemon_pid: u32,
    /// runc's `StartTransientUnit` as `dbus-monitor` saw it go out.
    pub call: Seen,
    /// Its reply, after the thaw.
    pub reply: Option<Seen>,
    pub prepared: Instant,
    /// When the monitor's line for the call was read.
    pub call_seen: Instant,
    pub continued: Instant,
    /// `StartContainer` (in the [`Measured`] of an update: how long it blocked, its result).
    pub start: Measured,
    /// What the stand-in was asked from the trigger on (the container's `runc create`), as
    /// [`FakeSystemd::calls`] lists them.
    pub systemd_calls: Vec<String>,
    /// What it was asked and did not know, from the start of the bed ([`FakeSystemd::refused`]).
    pub systemd_refused: Vec<String>,
}

impl StallOutcome for Outcome {
    fn summary(&self) -> String {
        format!(
            "{}: StartContainer {} held by systemd over D-Bus: shim pid {}, runc pid {} ({}), \
             {START_UNIT} serial {:?} from {:?} seen {:.3}s after the start was sent; the fake \
             systemd (pid {}) frozen until {:.3}s after that; reply {}\n  StartContainer {}\n  \
             the fake systemd was asked, from the start on:\n    {}\n  and refused: {:?}",
            self.version,
            short(&self.container_id),
            self.shim_pid,
            self.runc_pid,
            self.runc_argv.join(" "),
            self.call.serial,
            self.call.sender,
            self.call_seen.duration_since(self.start.sent).as_secs_f64(),
            self.systemd_pid,
            self.continued.duration_since(self.call_seen).as_secs_f64(),
            self.reply.as_ref().map_or("none".into(), |r| format!("{:?} at {:.3}", r.kind, r.time)),
            self.start.summary(),
            self.systemd_calls.join("\n    "),
            self.systemd_refused,
        )
    }

    fn origin(&self) -> Instant {
        self.prepared
    }

    fn update(&self) -> &Measured {
        &self.start
    }
}

impl Bed {
    /// How long the shim may take to run runc and runc to call systemd.
    const CALL_SHOW_TIMEOUT: Duration = Duration::from_secs(15);
    /// How long StartContainer may take to return once the stand-in is thawed.
    const RETURN_TIMEOUT: Duration = Duration::from_secs(20);
    /// How long plegwatch may take to probe the warm-up runc (a first attach in a debug
    /// build on a busy node).
    const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

    /// The namespace, its bus and the stand-in (answering), a monitor on the stand-in's
    /// name, containerd with systemd cgroups in the namespace, the test images, a
    /// host-network pod (whose pause container went through the stand-in), and a container
    /// created in it, not started.
    pub fn prepare(options: Options) -> Result<Self> {
        let ns = NodeRun::start()?;
        let bus = PrivateBus::start_listening(ns.command("dbus-daemon"), Path::new(BUS_SOCKET), &ns.host_path("dbus/system_bus_socket"))?;
        let mut systemd = FakeSystemd::start(&ns, &bus)?;
        let monitor = BusMonitor::start(&bus, SYSTEMD)?;
        let containerd =
            Containerd::start_systemd_version(options.version, Placement::TempDir, Runc::Real, SystemdCgroups { ns_pid: ns.pid() })?;
        let stage = Stage::on(containerd, "systemddbus")?;
        let calls = systemd.calls();
        ensure!(
            calls.iter().any(|c| c.starts_with(START_UNIT)),
            "the pod's pause container did not go through the fake systemd (calls: {calls:?}):\n{}",
            stage.containerd().log_tail(30)
        );
        let config = cri::container("sleeper", BUSYBOX, &["/bin/sh", "-c", "exec sleep 3600"]);
        let container_id = stage.pod().create_container(&config).with_context(|| stage.containerd().log_tail(30))?;
        eprintln!("container {} created, not started", short(&container_id));
        Ok(Self { stage, monitor, systemd, bus, ns, container_id, options, prepared: Instant::now(), warm_up: None })
    }

    pub fn systemd_pid(&self) -> u32 {
        self.systemd.pid()
    }

    pub fn bus_daemon_pid(&self) -> u32 {
        self.bus.daemon_pid()
    }

    pub fn namespace_pid(&self) -> u32 {
        self.ns.pid()
    }

    /// plegwatch probes a Go binary when it first sees a process run it, and a `runc
    /// --version` is gone before it is seen: run the daemon's runc (its bin dir's `runc`, so
    /// its comm is `runc`) so that it stays, blocked opening its `--log` FIFO (runc opens it
    /// first thing, in `app.Before`), until plegwatch says it is probed (its `target` line
    /// comes after the uprobes are attached); then let it go. The container start's runc is
    /// then probed from its first instruction, as on a node where runc runs all the time.
    /// Returns the runc's PID.
    fn warm_up_runc(&self, plegwatch: &mut Plegwatch) -> Result<u32> {
        let dir = tempfile::Builder::new().prefix("plegwatch-runc-warm-up-").tempdir()?;
        let fifo = dir.path().join("log");
        let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes())?;
        // SAFETY: mkfifo(3) on a NUL-terminated path in our own temp dir.
        ensure!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } == 0, "mkfifo {}: {}", fifo.display(), std::io::Error::last_os_error());
        let runc_path = self.stage.containerd().runc();
        let mut runc = Command::new(&runc_path)
            .arg("--root")
            .arg(dir.path().join("root"))
            .arg("--log")
            .arg(&fifo)
            .args(["state", "plegwatch-warm-up"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawn {}", runc_path.display()))?;
        let pid = runc.id();
        let probed = plegwatch.wait_probed(pid, Self::PROBE_TIMEOUT);
        // A reader lets runc's open return; it logs that there is no such container and exits.
        let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo);
        let deadline = Instant::now() + Duration::from_secs(5);
        while runc.try_wait()?.is_none() {
            if Instant::now() >= deadline {
                eprintln!("warning: the warm-up runc (pid {pid}) did not exit: killing it");
                let _ = runc.kill();
                let _ = runc.wait();
                break;
            }
            thread::sleep(POLL);
        }
        drop(reader);
        let line = probed?;
        eprintln!(
            "warm-up runc pid {pid} ({}): plegwatch says {} {}",
            runc_path.display(),
            line.str("/status").unwrap_or("?"),
            line.str("/binary").unwrap_or("?")
        );
        Ok(pid)
    }
}

impl StallBed for Bed {
    type Outcome = Outcome;

    fn stage(&self) -> &Stage {
        &self.stage
    }

    /// Runs the daemon's runc until plegwatch has probed it ([`Bed::warm_up_runc`]).
    fn before_trigger(&mut self, plegwatch: &mut Plegwatch) -> Result<()> {
        self.warm_up = Some(self.warm_up_runc(plegwatch)?);
        Ok(())
    }

    /// Freezes the stand-in, sends `StartContainer`, waits for runc's `StartTransientUnit`
    /// on the bus, keeps the stand-in frozen for [`Options::stop_for`], thaws it, and
    /// returns once `StartContainer` has returned.
    fn trigger(&mut self) -> Result<Outcome> {
        let earlier = self.monitor.messages().len();
        let calls_before = self.systemd.calls().len();
        self.systemd.freeze()?;
        let sent_wall = SystemTime::now();
        let sent = Instant::now();
        let cri = self.stage.cri().clone();
        let id = self.container_id.clone();
        let caller = thread::Builder::new()
            .name("cri-start".into())
            .spawn(move || {
                let r = cri.start_container(&id);
                (Instant::now(), r)
            })
            .context("spawn the StartContainer caller")?;

        let deadline = sent + Bed::CALL_SHOW_TIMEOUT;
        let call = loop {
            let new = self
                .monitor
                .messages()
                .into_iter()
                .skip(earlier)
                .find(|m| m.kind == MsgKind::Call && m.member.as_deref() == Some(START_UNIT));
            if let Some(m) = new {
                break m;
            }
            if caller.is_finished() {
                let r = caller.join().map(|(_, r)| r);
                bail!("StartContainer returned ({r:?}) before runc called {START_UNIT}\n{}", self.stage.containerd().log_tail(30));
            }
            // The caller thread is left to finish on its own once the bed is dropped.
            ensure!(
                Instant::now() < deadline,
                "no {START_UNIT} on the bus within {:?} of StartContainer\n{}",
                Bed::CALL_SHOW_TIMEOUT,
                self.stage.containerd().log_tail(30)
            );
            thread::sleep(POLL);
        };
        let call_seen = Instant::now();
        let sender = call.sender.clone().context("the call has no sender")?;
        let runc_pid = self.bus.pid_of(&sender)?;
        let runc_argv = procs::cmdline(runc_pid).unwrap_or_default();
        let shim = self.stage.containerd().shim_of_pod(self.stage.pod().id()).context("no shim serves the pod")?;
        eprintln!(
            "runc pid {runc_pid} (parent {:?}, the pod's shim is {}) called {START_UNIT} (serial \
             {:?}) {:.3}s after StartContainer: {}",
            procs::ppid(runc_pid),
            shim.pid,
            call.serial,
            call_seen.duration_since(sent).as_secs_f64(),
            runc_argv.join(" ")
        );
        while call_seen.elapsed() < self.options.stop_for && !caller.is_finished() {
            thread::sleep(POLL);
        }
        if caller.is_finished() {
            eprintln!("warning: StartContainer returned while the fake systemd was frozen");
        }
        let continued = self.systemd.thaw()?;
        let reply = call.serial.and_then(|s| self.monitor.reply(&sender, s, Duration::from_secs(10)));
        let deadline = continued + Bed::RETURN_TIMEOUT;
        while !caller.is_finished() && Instant::now() < deadline {
            thread::sleep(POLL);
        }
        ensure!(
            caller.is_finished(),
            "StartContainer still blocked {:?} after the fake systemd was thawed\n{}",
            Bed::RETURN_TIMEOUT,
            self.stage.containerd().log_tail(30)
        );
        let (ended, result) = caller.join().map_err(|_| anyhow::anyhow!("the StartContainer caller panicked"))?;
        let start = Returned { sent, sent_wall, ended, result }.measure(Vec::new());
        let container_pid = self.stage.cri().container_pid(&self.container_id).ok();
        let systemd_calls = self.systemd.calls().split_off(calls_before);
        Ok(Outcome {
            version: self.options.version,
            container_id: self.container_id.clone(),
            container_pid,
            shim_pid: shim.pid,
            warm_up_pid: self.warm_up,
            runc_pid,
            runc_argv,
            systemd_pid: self.systemd.pid(),
            bus_daemon_pid: self.bus.daemon_pid(),
            call,
            reply,
            prepared: self.prepared,
            call_seen,
            continued,
            start,
            systemd_calls,
            systemd_refused: self.systemd.refused(),
        })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // A frozen systemd would hold up the pod's teardown (runc's StopUnit has no timeout).
        if dbus::proc_state(self.systemd.pid()) == Some('T') {
            eprintln!("cleanup: thawing the fake systemd (pid {})", self.systemd.pid());
            let _ = self.systemd.thaw();
        }
    }
}
