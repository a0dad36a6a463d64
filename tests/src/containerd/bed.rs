//! What the containerd beds ([`super::issue9770`], [`super::runc_stopped`]) and their
//! scenarios share:
//!
//! - [`Stage`]: a private containerd with the test images, its CRI client, a host-network
//!   pod, the relist driver and (for #9770) the write throttle, dropped in that order's
//!   reverse;
//! - [`Update`] and [`Measured`]: one `UpdateContainerResources` sent on a thread of its own,
//!   how long it blocked and what the relists around it took, with the checks every
//!   baseline makes of them;
//! - [`StallBed`] and [`StallOutcome`]: a bed that stages a stall, and what it measured;
//! - [`Watched`]: a stall staged with `plegwatch watch --warn 2s` looking on, and the
//!   lookups the plegwatch scenarios make in what it printed.

use std::thread::{self, JoinHandle};

use crate::gofixture::{build_fake_kubelet, FakeKubelet};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, Result};

use super::cri::{self, ContainerConfig, LatencyStats, ListCall, TimedCall};
use super::daemon::{Containerd, Placement, Runc};
use super::image;
use super::procs::{self, Shim};
use super::{Cri, Pod, RelistDriver, Version};
use crate::events::{self, dump, Event};
use crate::plegwatch::READY_TIMEOUT;
use crate::{DevNum, Plegwatch, WriteThrottle};

/// How far the lock's hold as plegwatch reports it may be from the update's measured block.
pub const HOLD_SLACK_S: f64 = 1.5;

/// The Go function that holds the CRI Status write lock across `task.Update`.
const UPDATE_SYNC: &str = ".(*statusStorage).UpdateSync";

/// The first 12 characters of a container or sandbox id, as `crictl` shows them.
pub fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// A private containerd with the test images imported, its CRI client and a host-network
/// pod; then, as the bed sets them up, the write throttle and the relist driver.
///
/// Its fields drop in declaration order: the relist driver stops, the throttle is lifted,
/// the pod is torn down through CRI, then containerd is stopped (and cleaned up after).
pub struct Stage {
    relist: Option<RelistDriver>,
    throttle: Option<WriteThrottle>,
    pod: Pod,
    cri: Cri,
    containerd: Containerd,
}

/// A container the bed started in its pod.
#[derive(Clone, Debug)]
pub struct Started {
    pub id: String,
    /// Its init process (host PID).
    pub pid: u32,
    /// The pod's shim, the container's parent.
    pub shim: Shim,
}

impl Stage {
    /// Starts containerd (its shims running `runc` as `runc` says), imports the test images
    /// and runs a host-network pod named `pod_name`.
    pub fn start(placement: Placement, runc: Runc, pod_name: &str) -> Result<Self> {
        Self::start_version(Version::DEBIAN, placement, runc, pod_name)
    }

    /// [`Stage::start`] on the containerd, shim and runc of `version`.
    pub fn start_version(version: Version, placement: Placement, runc: Runc, pod_name: &str) -> Result<Self> {
        Self::on(Containerd::start_version(version, placement, runc)?, pod_name)
    }

    /// [`Stage::start`] on a containerd started already (e.g. [`Containerd::start_systemd`]).
    pub fn on(containerd: Containerd, pod_name: &str) -> Result<Self> {
        image::import_test_images(&containerd)?;
        let cri = containerd.cri()?;
        let pod = Pod::run(&cri, cri::host_network_pod(pod_name, containerd.cgroup_parent(), &containerd.pod_log_dir())?)
            .with_context(|| containerd.log_tail(30))?;
        Ok(Self { relist: None, throttle: None, pod, cri, containerd })
    }

    /// Throttles writes to `dev` to `bytes_per_s` until the stage drops (before the pod).
    pub fn throttle(&mut self, dev: DevNum, bytes_per_s: u64) -> Result<()> {
        // The pod's containers dirty the pages: on cgroup v2 the limit goes on their parent.
        self.throttle = Some(WriteThrottle::for_cgroup(dev, bytes_per_s, self.containerd.cgroup_parent())?);
        Ok(())
    }

    /// Changes the write limit [`Stage::throttle`] set (`None` lifts it).
    pub fn set_throttle(&self, bytes_per_s: Option<u64>) -> Result<()> {
        self.throttle.as_ref().context("no write throttle on this stage")?.set(bytes_per_s)
    }

    /// Gives the stage's later CRI calls (the update, the relist driver's) `timeout` as
    /// their deadline instead of kubelet's default.
    pub fn set_cri_timeout(&mut self, timeout: Duration) {
        self.cri = self.cri.with_timeout(timeout);
    }

    /// Whether the write limit is cgroup v2's `io.max` (on the pods' cgroup parent), not
    /// v1's rule at the blkio root.
    pub fn throttle_is_v2(&self) -> bool {
        self.throttle.as_ref().is_some_and(WriteThrottle::is_v2)
    }

    /// Starts the relist driver, pausing `period` between relists.
    pub fn start_relist(&mut self, period: Duration) {
        self.relist = Some(RelistDriver::start(&self.cri, period));
    }

    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }

    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    pub fn pod(&self) -> &Pod {
        &self.pod
    }

    /// The relist driver's calls so far.
    pub fn relist_calls(&self) -> Vec<TimedCall> {
        self.relist.as_ref().map(RelistDriver::calls).unwrap_or_default()
    }

    /// Runs `config` in the pod and finds its shim: the container's parent, checked to be a
    /// shim of this daemon, or else (with `or_pods_shim`) the shim serving the pod.
    pub fn run_container(&self, config: &ContainerConfig, or_pods_shim: bool) -> Result<Started> {
        let id = self.pod.run_container(config).with_context(|| self.containerd.log_tail(30))?;
        let pid = self.cri.container_pid(&id)?;
        let shim = self.find_shim(pid, or_pods_shim)?;
        Ok(Started { id, pid, shim })
    }

    fn find_shim(&self, container_pid: u32, or_pods_shim: bool) -> Result<Shim> {
        let ours = self.containerd.shims();
        let parent = procs::ppid(container_pid);
        let shim = ours
            .iter()
            .find(|s| Some(s.pid) == parent)
            .or_else(|| ours.iter().find(|s| or_pods_shim && s.id == self.pod.id()))
            .cloned()
            .with_context(|| {
                let or_pod = if or_pods_shim { format!(" or serves pod {}", self.pod.id()) } else { String::new() };
                format!(
                    "no shim of {} is the parent ({parent:?}) of container pid \
                     {container_pid}{or_pod}: {ours:?}",
                    self.containerd.socket().display(),
                )
            })?;
        if shim.id != self.pod.id() {
            eprintln!("note: shim {} has -id {}, not the pod's {}", shim.pid, shim.id, self.pod.id());
        }
        Ok(shim)
    }

    /// Sends `UpdateContainerResources` for `container_id` (CPU shares 512, a quota of 50 ms
    /// per 100 ms) from a thread of its own.
    pub fn send_update(&self, container_id: &str) -> Result<Update> {
        let sent_wall = SystemTime::now();
        let sent = Instant::now();
        let cri = self.cri.clone();
        let id = container_id.to_string();
        let caller = thread::Builder::new()
            .name("cri-update".into())
            .spawn(move || {
                let r = cri.update_container_resources(&id, &cri::resources(512, 100_000, 50_000));
                (Instant::now(), r)
            })
            .context("spawn the UpdateContainerResources caller")?;
        Ok(Update { sent, sent_wall, caller })
    }

    /// Lets the relist blocked behind the update finish and one more run after it, then
    /// measures the update against the relists.
    pub fn measure(&self, returned: Returned) -> Measured {
        let period = self.relist.as_ref().map_or(Duration::ZERO, RelistDriver::period);
        thread::sleep(2 * period + Duration::from_millis(500));
        returned.measure(self.relist_calls())
    }

    /// Asserts that `shim` is one of this daemon's and serves the pod.
    pub fn assert_pods_shim(&self, shim: &Shim) {
        assert_eq!(shim.address, self.containerd.socket().to_string_lossy(), "the shim found is not this daemon's");
        assert_eq!(shim.id, self.pod.id(), "the shim found does not serve the pod");
    }
}

/// `UpdateContainerResources` under way on a thread of its own ([`Stage::send_update`]).
pub struct Update {
    pub sent: Instant,
    pub sent_wall: SystemTime,
    caller: JoinHandle<(Instant, Result<()>)>,
}

impl Update {
    pub fn is_finished(&self) -> bool {
        self.caller.is_finished()
    }

    /// Waits, polling every `poll`, until the call returns or `deadline` passes; whether it
    /// returned.
    pub fn wait_until(&self, deadline: Instant, poll: Duration) -> bool {
        while !self.is_finished() && Instant::now() < deadline {
            thread::sleep(poll);
        }
        self.is_finished()
    }

    /// Waits for the call to return.
    pub fn join(self) -> Result<Returned> {
        let (ended, result) = self.caller.join().map_err(|_| anyhow::anyhow!("the UpdateContainerResources caller panicked"))?;
        Ok(Returned { sent: self.sent, sent_wall: self.sent_wall, ended, result })
    }
}

/// An `UpdateContainerResources` that returned.
#[derive(Debug)]
pub struct Returned {
    pub sent: Instant,
    pub sent_wall: SystemTime,
    pub ended: Instant,
    pub result: Result<()>,
}

impl Returned {
    /// How long it blocked, and the `ListContainers` calls of `calls` around it.
    pub fn measure(self, calls: Vec<TimedCall>) -> Measured {
        let (sent, ended) = (self.sent, self.ended);
        let list_before = LatencyStats::of(&calls, ListCall::Containers, |c| c.started < sent);
        let list_during = LatencyStats::of(&calls, ListCall::Containers, |c| c.started < ended && c.ended() > sent);
        Measured {
            sent,
            sent_wall: self.sent_wall,
            latency: ended.duration_since(sent),
            result: self.result.map_err(|e| format!("{e:#}")),
            calls,
            list_before,
            list_during,
        }
    }
}

/// How long `UpdateContainerResources` blocked, and what the relists around it took.
#[derive(Clone, Debug)]
pub struct Measured {
    pub sent: Instant,
    pub sent_wall: SystemTime,
    /// How long it blocked.
    pub latency: Duration,
    pub result: Result<(), String>,
    /// Every relist call made so far.
    pub calls: Vec<TimedCall>,
    /// `ListContainers` calls that started before the update went out.
    pub list_before: Option<LatencyStats>,
    /// `ListContainers` calls that were under way at some point while the update was.
    pub list_during: Option<LatencyStats>,
}

impl Measured {
    pub fn ended(&self) -> Instant {
        self.sent + self.latency
    }

    /// `blocked …s: RESULT` and the `ListContainers` stats before and during, for a
    /// summary's tail.
    pub fn summary(&self) -> String {
        let stats = |s: &Option<LatencyStats>| s.map_or("none".into(), |s| s.to_string());
        format!(
            "blocked {:.2}s: {}\n  ListContainers before the update: {}\n  ListContainers \
             during the update: {}",
            self.latency.as_secs_f64(),
            match &self.result {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            },
            stats(&self.list_before),
            stats(&self.list_during),
        )
    }

    /// Asserts that `ListContainers` was quick before the update, on an idle node: at least
    /// `min_calls` calls, none failed, a median under `median_max`.
    pub fn assert_quiet_before(&self, min_calls: usize, median_max: Duration, context: impl Fn() -> String) {
        let before = self.list_before.unwrap_or_else(|| panic!("no ListContainers before the update\n{}", context()));
        assert!(
            before.count >= min_calls && before.failed == 0 && before.median < median_max,
            "ListContainers before the stall: {before} (want ≥ {min_calls} calls, none \
             failed, median < {median_max:?})\n{}",
            context()
        );
    }

    /// The `ListContainers` calls during the update; panics if there were none.
    pub fn during(&self, context: impl Fn() -> String) -> LatencyStats {
        self.list_during.unwrap_or_else(|| panic!("no ListContainers during the update\n{}", context()))
    }
}

/// A bed that stages a stall around `UpdateContainerResources`.
pub trait StallBed {
    type Outcome: StallOutcome;

    fn stage(&self) -> &Stage;

    /// What the bed does once plegwatch is ready and before [`StallBed::trigger`] (with
    /// plegwatch watching only: a baseline goes straight to the trigger). Nothing by default.
    fn before_trigger(&mut self, _plegwatch: &mut Plegwatch) -> Result<()> {
        Ok(())
    }

    /// Causes the stall and returns once it is over.
    fn trigger(&mut self) -> Result<Self::Outcome>;

    /// `outcome`'s summary and the tail of containerd's log, for failure messages.
    fn context(&self, outcome: &Self::Outcome) -> String {
        format!("{}\n{}", outcome.summary(), self.stage().containerd().log_tail(40))
    }
}

/// What a [`StallBed`] measured.
pub trait StallOutcome {
    /// One paragraph for the test log.
    fn summary(&self) -> String;

    /// The origin of event dumps.
    fn origin(&self) -> Instant;

    fn update(&self) -> &Measured;
}

/// A stall staged with plegwatch watching: the bed (still up, to ask containerd
/// afterwards), what the bed measured, and every line plegwatch printed.
/// The `--warn` every [`Watched`] bed runs plegwatch with.
pub const WARN: Duration = Duration::from_secs(2);

/// The environment variable naming a file for [`TextCapture`].
pub const TEXT_CAPTURE_ENV: &str = "PLEGWATCH_TEXT_CAPTURE";

/// A second `plegwatch watch --no-live` beside the JSON one, its text output going to the
/// file named by [`TEXT_CAPTURE_ENV`], when that is set: how the README's text example of
/// an incident is captured from a real run. Not used by the suite.
pub struct TextCapture(std::process::Child);

impl TextCapture {
    /// Starts it when [`TEXT_CAPTURE_ENV`] names a file (none otherwise).
    pub fn start(warn: Duration) -> Result<Option<Self>> {
        let Some(path) = std::env::var_os(TEXT_CAPTURE_ENV) else { return Ok(None) };
        let out = std::fs::File::create(&path).with_context(|| format!("create {}", path.to_string_lossy()))?;
        let child = std::process::Command::new(crate::preflight::plegwatch_bin()?)
            .args(["watch", "--no-live", "--warn", &format!("{}ms", warn.as_millis())])
            .stdout(out)
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start the text plegwatch")?;
        // Ready once it printed its "plegwatch watching" line.
        let deadline = Instant::now() + crate::timing::scaled(READY_TIMEOUT);
        while !std::fs::read_to_string(&path).is_ok_and(|t| t.contains("plegwatch watching")) {
            anyhow::ensure!(Instant::now() < deadline, "the text plegwatch printed no ready line");
            thread::sleep(Duration::from_millis(50));
        }
        Ok(Some(Self(child)))
    }

    /// Stops it (SIGINT: its summary is written too).
    pub fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.0.id() as libc::pid_t, libc::SIGINT) };
        let _ = self.0.wait();
    }
}

pub struct Watched<B: StallBed> {
    pub bed: B,
    pub outcome: B::Outcome,
    pub events: Vec<Event>,
    pub containerd_pid: u32,
    /// The fake-kubelet fixture (a test fixture, not kubelet) relisting over CRI against
    /// the bed's containerd every second, as kubelet's PLEG does.
    pub kubelet: FakeKubelet,
    /// The `--warn` plegwatch ran with ([`WARN`] unless [`Watched::run_warn`] said).
    pub warn: Duration,
}

impl<B: StallBed> Watched<B> {
    /// Starts `plegwatch watch --warn 2s` on the prepared `bed`, triggers the stall and
    /// stops plegwatch once the lock hold resolved (or 5 s later).
    pub fn run(bed: B) -> Result<Self> {
        Self::run_warn(bed, WARN)
    }

    /// [`Watched::run`] with `plegwatch watch --warn WARN`, for a stall shorter than [`WARN`].
    pub fn run_warn(bed: B, warn: Duration) -> Result<Self> {
        Self::run_under(bed, warn, &[])
    }

    /// [`Watched::run_warn`] with plegwatch under `wrapper` (e.g. in namespaces of its own:
    /// [`crate::namespaces`]).
    pub fn run_under(bed: B, warn: Duration, wrapper: &[&str]) -> Result<Self> {
        Self::run_until_warn(bed, warn, wrapper, |e| e.is("resolved") && e.str("/kind") == Some("go_lock"))
    }

    /// [`Watched::run`], stopping plegwatch once it printed a line `done` accepts (or 5 s
    /// after the trigger returned).
    pub fn run_until(bed: B, done: impl Fn(&Event) -> bool) -> Result<Self> {
        Self::run_until_warn(bed, WARN, &[], done)
    }

    fn run_until_warn(bed: B, warn: Duration, wrapper: &[&str], done: impl Fn(&Event) -> bool) -> Result<Self> {
        Self::run_with(bed, warn, None, &[], wrapper, done)
    }

    /// [`Watched::run_until`] with `plegwatch watch --warn WARN` and `extra` arguments
    /// (e.g. `--report-dir DIR`, `--critical 4s`).
    pub fn run_with_args(bed: B, warn: Duration, extra: &[&str], done: impl Fn(&Event) -> bool) -> Result<Self> {
        Self::run_with(bed, warn, None, extra, &[], done)
    }

    /// [`Watched::run`] with plegwatch reading pod names from the containers' bundles only
    /// (`--runtime-endpoint none`): never asking the CRI.
    pub fn run_bundles_only(bed: B) -> Result<Self> {
        Self::run_with(bed, WARN, Some("none".into()), &[], &[], |e| e.is("resolved") && e.str("/kind") == Some("go_lock"))
    }

    /// Runs plegwatch under `wrapper` (none: directly) with `--runtime-endpoint` the bed's
    /// containerd socket (or `endpoint`) and `extra` arguments.
    fn run_with(
        mut bed: B,
        warn: Duration,
        endpoint: Option<String>,
        extra: &[&str],
        wrapper: &[&str],
        done: impl Fn(&Event) -> bool,
    ) -> Result<Self> {
        let containerd_pid = bed.stage().containerd().pid();
        let fixture = build_fake_kubelet()?;
        let socket = bed.stage().containerd().socket().display().to_string();
        let kubelet = FakeKubelet::start_cri(&fixture, &socket, &[])?;
        let endpoint = endpoint.unwrap_or_else(|| format!("unix://{socket}"));
        let warn_arg = format!("{}ms", warn.as_millis());
        let args: Vec<&str> =
            ["--warn", warn_arg.as_str(), "--runtime-endpoint", endpoint.as_str()].into_iter().chain(extra.iter().copied()).collect();
        let mut plegwatch = Plegwatch::start_under(wrapper, &args)?;
        plegwatch.wait_ready(READY_TIMEOUT)?;
        let text = TextCapture::start(warn)?;
        bed.before_trigger(&mut plegwatch)?;
        let outcome = bed.trigger()?;
        plegwatch.wait_for(Duration::from_secs(5), done);
        let events = plegwatch.stop()?;
        if let Some(t) = text {
            t.stop();
        }
        eprintln!("{}", outcome.summary());
        Ok(Self { bed, outcome, events, containerd_pid, kubelet, warn })
    }

    /// The bed's summary and plegwatch's lines, for failure messages.
    pub fn all(&self) -> String {
        format!("{}\n{}", self.outcome.summary(), dump(&self.events, self.outcome.origin()))
    }

    /// The stall lines of `kind` about process `pid`.
    pub fn stalls(&self, kind: &str, pid: u32) -> Vec<&Event> {
        events::stalls(&self.events, kind, pid)
    }

    /// containerd's `cri_call` stall of the CRI handler whose function ends with `handler`.
    pub fn cri_call(&self, handler: &str) -> Option<&Event> {
        self.stalls("cri_call", self.containerd_pid).into_iter().find(|e| e.ends_with("/detail/function", handler))
    }

    /// The go_lock stall held by `UpdateSync` in containerd, after checking that its
    /// resolved hold matches how long UpdateContainerResources really blocked. Returns the
    /// stall and (held, blocked) in seconds.
    pub fn update_sync_lock(&self) -> (&Event, f64, f64) {
        let lock = self
            .stalls("go_lock", self.containerd_pid)
            .into_iter()
            .find(|e| e.ends_with("/detail/holder_function", UPDATE_SYNC))
            .unwrap_or_else(|| panic!("no go_lock stall held by UpdateSync in containerd (pid {}):\n{}", self.containerd_pid, self.all()));
        let resolved = events::resolution(&self.events, lock).unwrap_or_else(|| panic!("the lock hold never resolved:\n{}", self.all()));
        let held = resolved.f64("/waited_s").unwrap_or(f64::NAN);
        let blocked = self.outcome.update().latency.as_secs_f64();
        assert!(
            (held - blocked).abs() <= HOLD_SLACK_S,
            "lock held {held:.3}s by plegwatch, UpdateContainerResources blocked \
             {blocked:.3}s:\n{}",
            self.all()
        );
        (lock, held, blocked)
    }

    /// containerd kept running and answering under the probes.
    pub fn assert_containerd_answers(&self) {
        assert!(self.bed.stage().cri().version().is_ok(), "containerd stopped answering CRI after the probes:\n{}", self.all());
    }
}

/// What plegwatch said about a staging, one line each, for the test log: every `target`
/// line (status, Go version, functions probed, why not), every `stall` (kind, pid,
/// function, waited) and how many incidents it raised.
pub fn reported(events: &[Event]) -> String {
    let mut out = Vec::new();
    for e in events.iter().filter(|e| e.is("target")) {
        let functions = e.get("/functions").and_then(|f| f.as_array()).map_or(0, Vec::len);
        out.push(format!(
            "  target {} {} pid {} {} ({}), {functions} functions{}",
            e.str("/target").unwrap_or("?"),
            e.str("/status").unwrap_or("?"),
            e.u64("/pid").unwrap_or(0),
            e.str("/binary").unwrap_or("?"),
            e.str("/go_version").unwrap_or("go?"),
            e.str("/why").map(|w| format!(": {w}")).unwrap_or_default(),
        ));
    }
    for e in events.iter().filter(|e| e.is("stall")) {
        let function =
            e.str("/detail/holder_function").or_else(|| e.str("/detail/function")).or_else(|| e.str("/detail/syscall")).unwrap_or("");
        out.push(format!(
            "  stall {} pid {} {} {function} waited {:.2}s",
            e.str("/kind").unwrap_or("?"),
            e.u64("/pid").unwrap_or(0),
            e.str("/comm").unwrap_or(""),
            e.f64("/waited_s").unwrap_or(f64::NAN),
        ));
    }
    let incidents = events.iter().filter(|e| e.is("incident")).count();
    out.push(format!("  {incidents} incident lines"));
    out.join("\n")
}
