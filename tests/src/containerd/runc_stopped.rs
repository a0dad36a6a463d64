//! `UpdateContainerResources` while the `runc update` it starts is frozen with SIGSTOP: the
//! container's Status write lock stays held, and every `ListContainers` waits on it.
//!
//! The chain on containerd 1.6.20 and runc 1.1.5 (stall-catalog.md, pattern 2, with a shim
//! held up by its frozen runc as in pattern 8):
//! 1. `ListContainers` → `statusStorage.Get` → `RWMutex.RLock`, waiting;
//! 2. `UpdateContainerResources` → `Status.UpdateSync` (holding the write lock) →
//!    `task.Update`, waiting on the shim's ttrpc reply;
//! 3. the shim's `(*service).Update` → `(*Init).Update` → go-runc `Update`, waiting for
//!    `runc --root … --log … --log-format json update --resources - ID` to exit;
//! 4. that `runc`, the shim's child, in state `T` (`do_signal_stop`).
//!
//! The freeze is deterministic: containerd runs with [`Runc::StopBefore`]`("update")`, whose
//! `runc` wrapper stops itself before it runs the real runc, so nothing races the shim. The
//! bed finds the stopped process (a child of the container's shim, comm `runc`, state `T`),
//! keeps it stopped for [`Options::stop_for`], then sends SIGCONT: the real runc applies the
//! update, and the lock is let go.
//!
//! [`Bed::prepare`] sets everything up to a running container with the relist driver going;
//! [`Bed::trigger`] causes the stall. A plegwatch scenario starts plegwatch between the two
//! and compares its report with the [`Outcome`].

use std::thread;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use super::cri::{self, LatencyStats, ListCall, TimedCall};
use super::daemon::{Containerd, Placement, Runc};
use super::image::{self, BUSYBOX};
use super::procs::{self, Shim, ThreadSnapshot};
use super::{Cri, Pod, RelistDriver};

/// The runc subcommand the bed freezes.
pub const FROZEN_SUBCOMMAND: &str = "update";
/// The comm of the frozen process (the wrapper script's file name, kept by the `exec`).
pub const RUNC_COMM: &str = "runc";

/// How the stall is staged.
#[derive(Clone, Debug)]
pub struct Options {
    /// How long the `runc update` stays stopped once it is seen stopped.
    pub stop_for: Duration,
    /// How long the relist driver runs on the quiet node before the update goes out.
    pub quiet_for: Duration,
    /// The relist driver's pause between relists.
    pub relist_period: Duration,
}

impl Default for Options {
    /// Stopped for 8 s, after 1.5 s of relists every 200 ms.
    fn default() -> Self {
        Self {
            stop_for: Duration::from_secs(8),
            quiet_for: Duration::from_millis(1500),
            relist_period: Duration::from_millis(200),
        }
    }
}

/// The stage: a private containerd whose shims run the freezing `runc` wrapper, the test
/// images, a host-network pod with a long-running busybox container, and the relist driver.
///
/// Dropping it first continues any `runc` still stopped under its shims (so that nothing
/// waits on it), then its fields drop in declaration order: the relist driver stops, the pod
/// is torn down through CRI, then containerd is stopped and cleaned up after.
pub struct Bed {
    relist: Option<RelistDriver>,
    pod: Pod,
    cri: Cri,
    containerd: Containerd,
    container_id: String,
    container_pid: u32,
    shim: Shim,
    options: Options,
    prepared: Instant,
}

/// What happened, with the timings that matter.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub container_id: String,
    /// The container's init process (host PID).
    pub container_pid: u32,
    /// The pod's shim: the container's parent, and the stopped runc's.
    pub shim: Shim,
    /// The `runc update` frozen under the shim.
    pub runc_pid: u32,
    /// Its argv while it was stopped (`runc --root … update --resources - ID`).
    pub runc_argv: Vec<String>,
    /// What `/proc` said about it while it was stopped (state `T`, wchan `do_signal_stop`).
    pub runc_snapshot: Option<ThreadSnapshot>,
    /// When the bed was prepared: the origin for event dumps.
    pub prepared: Instant,
    pub update_sent: Instant,
    pub update_sent_wall: SystemTime,
    /// When the runc was first seen stopped.
    pub stop_seen: Instant,
    /// When it was sent SIGCONT.
    pub continued: Instant,
    /// How long `UpdateContainerResources` blocked.
    pub update_latency: Duration,
    /// Its result: OK once the real runc has applied the update.
    pub update_result: Result<(), String>,
    /// Every relist call made so far.
    pub calls: Vec<TimedCall>,
    /// `ListContainers` calls that started before the update went out.
    pub list_before: Option<LatencyStats>,
    /// `ListContainers` calls that were under way at some point while the update was.
    pub list_during: Option<LatencyStats>,
}

impl Outcome {
    /// How long the runc stayed stopped, as the bed saw it (`continued - stop_seen`; it
    /// stopped up to one poll before it was seen).
    pub fn stopped_for(&self) -> Duration {
        self.continued.duration_since(self.stop_seen)
    }

    pub fn update_ended(&self) -> Instant {
        self.update_sent + self.update_latency
    }

    /// The longest `ListContainers` while the update was under way.
    pub fn list_max(&self) -> Option<Duration> {
        self.list_during.map(|s| s.max)
    }

    /// One paragraph for the test log.
    pub fn summary(&self) -> String {
        let stats = |s: &Option<LatencyStats>| s.map_or("none".into(), |s| s.to_string());
        let snapshot = self
            .runc_snapshot
            .as_ref()
            .map(|s| {
                format!(
                    "\n  runc while stopped: state {}, wchan {}\n    stack: {}",
                    s.state,
                    s.wchan,
                    s.stack_line()
                )
            })
            .unwrap_or_default();
        format!(
            "runc stopped under UpdateContainerResources: container {} (pid {}), shim pid {}\n  \
             runc pid {} ({}) seen stopped {:.3}s after the update went out, stopped for \
             {:.2}s{snapshot}\n  UpdateContainerResources blocked {:.2}s: {}\n  ListContainers \
             before the update: {}\n  ListContainers during the update: {}",
            short(&self.container_id),
            self.container_pid,
            self.shim.pid,
            self.runc_pid,
            self.runc_argv.join(" "),
            self.stop_seen
                .duration_since(self.update_sent)
                .as_secs_f64(),
            self.stopped_for().as_secs_f64(),
            self.update_latency.as_secs_f64(),
            match &self.update_result {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            },
            stats(&self.list_before),
            stats(&self.list_during),
        )
    }
}

fn short(id: &str) -> &str {
    &id[..id.len().min(12)]
}

/// Sends SIGCONT to the frozen runc when told to or when dropped (also on a panic or an
/// early return), if it is still the shim's child named `runc`.
struct Continue {
    pid: u32,
    shim: u32,
    done: bool,
}

impl Continue {
    fn now(&mut self) -> Instant {
        self.done = true;
        if !procs::signal_child(self.pid, self.shim, RUNC_COMM, libc::SIGCONT) {
            eprintln!(
                "warning: runc pid {} is gone or not the shim's child",
                self.pid
            );
        }
        Instant::now()
    }
}

impl Drop for Continue {
    fn drop(&mut self) {
        if !self.done {
            eprintln!("cleanup: continuing runc pid {}", self.pid);
            self.now();
        }
    }
}

impl Bed {
    /// How long the shim may take to start the `runc update` once the update is sent.
    const STOP_SHOW_TIMEOUT: Duration = Duration::from_secs(10);
    /// How long the update may take to return once runc is continued.
    const RETURN_TIMEOUT: Duration = Duration::from_secs(15);
    const POLL: Duration = Duration::from_millis(10);

    /// Everything up to a running container, with the relist driver going.
    pub fn prepare(options: Options) -> Result<Self> {
        let containerd =
            Containerd::start_with(Placement::TempDir, Runc::StopBefore(FROZEN_SUBCOMMAND))?;
        image::import_test_images(&containerd)?;
        let cri = containerd.cri()?;
        let pod = Pod::run(
            &cri,
            cri::host_network_pod(
                "runcstopped",
                containerd.cgroup_parent(),
                &containerd.pod_log_dir(),
            )?,
        )
        .with_context(|| containerd.log_tail(30))?;
        let config = cri::container("sleeper", BUSYBOX, &["/bin/sh", "-c", "exec sleep 3600"]);
        let container_id = pod
            .run_container(&config)
            .with_context(|| containerd.log_tail(30))?;
        let container_pid = cri.container_pid(&container_id)?;
        let shim = find_shim(&containerd, &pod, container_pid)?;
        eprintln!(
            "container {} (pid {container_pid}) running under shim {}",
            short(&container_id),
            shim.pid
        );
        let relist = Some(RelistDriver::start(&cri, options.relist_period));
        Ok(Self {
            relist,
            pod,
            cri,
            containerd,
            container_id,
            container_pid,
            shim,
            options,
            prepared: Instant::now(),
        })
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

    pub fn container_id(&self) -> &str {
        &self.container_id
    }

    pub fn shim(&self) -> &Shim {
        &self.shim
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The relist driver's calls so far.
    pub fn relist_calls(&self) -> Vec<TimedCall> {
        self.relist
            .as_ref()
            .map(RelistDriver::calls)
            .unwrap_or_default()
    }

    /// Lets the relist driver run on the quiet node for [`Options::quiet_for`], sends
    /// `UpdateContainerResources`, waits for its `runc update` to stop, keeps it stopped for
    /// [`Options::stop_for`], continues it, and returns once the update has returned and a
    /// relist has run after it.
    pub fn trigger(&mut self) -> Result<Outcome> {
        let o = self.options.clone();
        thread::sleep(o.quiet_for);
        let update_sent_wall = SystemTime::now();
        let update_sent = Instant::now();
        let updater = {
            let cri = self.cri.clone();
            let id = self.container_id.clone();
            thread::Builder::new()
                .name("cri-update".into())
                .spawn(move || {
                    let r =
                        cri.update_container_resources(&id, &cri::resources(512, 100_000, 50_000));
                    (Instant::now(), r)
                })
                .context("spawn the UpdateContainerResources caller")?
        };

        let deadline = update_sent + Self::STOP_SHOW_TIMEOUT;
        let runc_pid = loop {
            if let Some(&pid) = procs::stopped_children(self.shim.pid, RUNC_COMM).first() {
                break pid;
            }
            if updater.is_finished() {
                let (_, r) = updater
                    .join()
                    .map_err(|_| anyhow::anyhow!("the UpdateContainerResources caller panicked"))?;
                bail!(
                    "UpdateContainerResources returned ({r:?}) before a runc was seen stopped \
                     under shim {}\n{}",
                    self.shim.pid,
                    self.containerd.log_tail(30)
                );
            }
            if Instant::now() >= deadline {
                // The caller thread is left to finish on its own once the bed is dropped.
                bail!(
                    "no runc stopped under shim {} within {:?} of UpdateContainerResources \
                     (children: {:?})\n{}",
                    self.shim.pid,
                    Self::STOP_SHOW_TIMEOUT,
                    procs::descendants(self.shim.pid),
                    self.containerd.log_tail(30)
                );
            }
            thread::sleep(Self::POLL);
        };
        let stop_seen = Instant::now();
        let mut cont = Continue {
            pid: runc_pid,
            shim: self.shim.pid,
            done: false,
        };
        let runc_argv = procs::cmdline(runc_pid).unwrap_or_default();
        let runc_snapshot = ThreadSnapshot::take(runc_pid, runc_pid).ok();
        eprintln!(
            "runc pid {runc_pid} stopped under shim {} {:.3}s after the update went out: {}",
            self.shim.pid,
            stop_seen.duration_since(update_sent).as_secs_f64(),
            runc_argv.join(" ")
        );
        while stop_seen.elapsed() < o.stop_for {
            if updater.is_finished() {
                eprintln!("warning: UpdateContainerResources returned while runc was stopped");
                break;
            }
            thread::sleep(Self::POLL);
        }
        let continued = cont.now();

        let return_deadline = continued + Self::RETURN_TIMEOUT;
        while !updater.is_finished() && Instant::now() < return_deadline {
            thread::sleep(Self::POLL);
        }
        if !updater.is_finished() {
            bail!(
                "UpdateContainerResources still blocked {:?} after runc pid {runc_pid} was \
                 continued\n{}",
                Self::RETURN_TIMEOUT,
                self.containerd.log_tail(30)
            );
        }
        let (update_ended, update_result) = updater
            .join()
            .map_err(|_| anyhow::anyhow!("the UpdateContainerResources caller panicked"))?;
        let update_latency = update_ended.duration_since(update_sent);
        // Let the relist blocked behind the update finish and one more run after it.
        thread::sleep(2 * o.relist_period + Duration::from_millis(500));

        let calls = self.relist_calls();
        let list_before =
            LatencyStats::of(&calls, ListCall::Containers, |c| c.started < update_sent);
        let list_during = LatencyStats::of(&calls, ListCall::Containers, |c| {
            c.started < update_ended && c.ended() > update_sent
        });
        Ok(Outcome {
            container_id: self.container_id.clone(),
            container_pid: self.container_pid,
            shim: self.shim.clone(),
            runc_pid,
            runc_argv,
            runc_snapshot,
            prepared: self.prepared,
            update_sent,
            update_sent_wall,
            stop_seen,
            continued,
            update_latency,
            update_result: update_result.map_err(|e| format!("{e:#}")),
            calls,
            list_before,
            list_during,
        })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // A runc left stopped would hold the shim's process mutex, and so the pod's teardown.
        self.containerd.continue_stopped_runc();
    }
}

/// The container's shim: its parent, checked to be a shim of this daemon serving the pod.
fn find_shim(containerd: &Containerd, pod: &Pod, container_pid: u32) -> Result<Shim> {
    let ours = containerd.shims();
    let parent = procs::ppid(container_pid);
    let shim = ours
        .iter()
        .find(|s| Some(s.pid) == parent)
        .cloned()
        .with_context(|| {
            format!(
                "no shim of {} is the parent ({parent:?}) of container pid {container_pid}: \
                 {ours:?}",
                containerd.socket().display()
            )
        })?;
    if shim.id != pod.id() {
        eprintln!(
            "note: shim {} has -id {}, not the pod's {}",
            shim.pid,
            shim.id,
            pod.id()
        );
    }
    Ok(shim)
}
