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
//! containerd 1.7.34 and 2.3.4 (runc 1.4.3) take the same path: the update's task lookup
//! (the shim's `State`) comes before `runc update` starts, so it does not time out, and the
//! lock is held for as long as runc stays stopped.
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
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::bed::{short, Measured, Stage, StallBed, StallOutcome, Started};
use super::cri;
use super::daemon::{Placement, Runc};
use super::image::BUSYBOX;
use super::procs::{self, Shim, ThreadSnapshot};
use super::Version;

/// The runc subcommand the bed freezes.
pub const FROZEN_SUBCOMMAND: &str = "update";
/// The comm of the frozen process (the wrapper script's file name, kept by the `exec`).
pub const RUNC_COMM: &str = "runc";

/// How the stall is staged.
#[derive(Clone, Debug)]
pub struct Options {
    /// The containerd, shim and runc it is staged on.
    pub version: Version,
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
            version: Version::DEBIAN,
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
/// waits on it), then the [`Stage`] drops: the relist driver stops, the pod is torn down
/// through CRI, then containerd is stopped and cleaned up after.
pub struct Bed {
    stage: Stage,
    container: Started,
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
    /// When the runc was first seen stopped.
    pub stop_seen: Instant,
    /// When it was sent SIGCONT.
    pub continued: Instant,
    /// `UpdateContainerResources` and the relists around it; its result is OK once the real
    /// runc has applied the update.
    pub update: Measured,
}

impl Outcome {
    /// How long the runc stayed stopped, as the bed saw it (`continued - stop_seen`; it
    /// stopped up to one poll before it was seen).
    pub fn stopped_for(&self) -> Duration {
        self.continued.duration_since(self.stop_seen)
    }

    /// The longest `ListContainers` while the update was under way.
    pub fn list_max(&self) -> Option<Duration> {
        self.update.list_during.map(|s| s.max)
    }
}

impl StallOutcome for Outcome {
    fn summary(&self) -> String {
        let snapshot = self
            .runc_snapshot
            .as_ref()
            .map(|s| format!("\n  runc while stopped: state {}, wchan {}\n    stack: {}", s.state, s.wchan, s.stack_line()))
            .unwrap_or_default();
        format!(
            "runc stopped under UpdateContainerResources: container {} (pid {}), shim pid {}\n  \
             runc pid {} ({}) seen stopped {:.3}s after the update went out, stopped for \
             {:.2}s{snapshot}\n  UpdateContainerResources {}",
            short(&self.container_id),
            self.container_pid,
            self.shim.pid,
            self.runc_pid,
            self.runc_argv.join(" "),
            self.stop_seen.duration_since(self.update.sent).as_secs_f64(),
            self.stopped_for().as_secs_f64(),
            self.update.summary(),
        )
    }

    fn origin(&self) -> Instant {
        self.prepared
    }

    fn update(&self) -> &Measured {
        &self.update
    }
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
            eprintln!("warning: runc pid {} is gone or not the shim's child", self.pid);
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
        let mut stage = Stage::start_version(options.version, Placement::TempDir, Runc::StopBefore(FROZEN_SUBCOMMAND), "runcstopped")?;
        let config = cri::container("sleeper", BUSYBOX, &["/bin/sh", "-c", "exec sleep 3600"]);
        let container = stage.run_container(&config, false)?;
        eprintln!("container {} (pid {}) running under shim {}", short(&container.id), container.pid, container.shim.pid);
        stage.start_relist(options.relist_period);
        Ok(Self { stage, container, options, prepared: Instant::now() })
    }

    pub fn container_id(&self) -> &str {
        &self.container.id
    }

    pub fn shim(&self) -> &Shim {
        &self.container.shim
    }

    pub fn options(&self) -> &Options {
        &self.options
    }
}

impl StallBed for Bed {
    type Outcome = Outcome;

    fn stage(&self) -> &Stage {
        &self.stage
    }

    /// Lets the relist driver run on the quiet node for [`Options::quiet_for`], sends
    /// `UpdateContainerResources`, waits for its `runc update` to stop, keeps it stopped for
    /// [`Options::stop_for`], continues it, and returns once the update has returned and a
    /// relist has run after it.
    fn trigger(&mut self) -> Result<Outcome> {
        let o = self.options.clone();
        let shim = self.container.shim.pid;
        let containerd = self.stage.containerd();
        thread::sleep(o.quiet_for);
        let update = self.stage.send_update(&self.container.id)?;

        let deadline = update.sent + Bed::STOP_SHOW_TIMEOUT;
        let runc_pid = loop {
            if let Some(&pid) = procs::stopped_children(shim, RUNC_COMM).first() {
                break pid;
            }
            if update.is_finished() {
                let r = update.join()?.result;
                bail!(
                    "UpdateContainerResources returned ({r:?}) before a runc was seen stopped \
                     under shim {shim}\n{}",
                    containerd.log_tail(30)
                );
            }
            if Instant::now() >= deadline {
                // The caller thread is left to finish on its own once the bed is dropped.
                bail!(
                    "no runc stopped under shim {shim} within {:?} of UpdateContainerResources \
                     (children: {:?})\n{}",
                    Bed::STOP_SHOW_TIMEOUT,
                    procs::descendants(shim),
                    containerd.log_tail(30)
                );
            }
            thread::sleep(Bed::POLL);
        };
        let stop_seen = Instant::now();
        let mut cont = Continue { pid: runc_pid, shim, done: false };
        let runc_argv = procs::cmdline(runc_pid).unwrap_or_default();
        let runc_snapshot = ThreadSnapshot::take(runc_pid, runc_pid).ok();
        eprintln!(
            "runc pid {runc_pid} stopped under shim {shim} {:.3}s after the update went out: {}",
            stop_seen.duration_since(update.sent).as_secs_f64(),
            runc_argv.join(" ")
        );
        while stop_seen.elapsed() < o.stop_for {
            if update.is_finished() {
                eprintln!("warning: UpdateContainerResources returned while runc was stopped");
                break;
            }
            thread::sleep(Bed::POLL);
        }
        let continued = cont.now();

        if !update.wait_until(continued + Bed::RETURN_TIMEOUT, Bed::POLL) {
            bail!(
                "UpdateContainerResources still blocked {:?} after runc pid {runc_pid} was \
                 continued\n{}",
                Bed::RETURN_TIMEOUT,
                containerd.log_tail(30)
            );
        }
        let update = self.stage.measure(update.join()?);
        Ok(Outcome {
            container_id: self.container.id.clone(),
            container_pid: self.container.pid,
            shim: self.container.shim.clone(),
            runc_pid,
            runc_argv,
            runc_snapshot,
            prepared: self.prepared,
            stop_seen,
            continued,
            update,
        })
    }
}

impl Drop for Bed {
    fn drop(&mut self) {
        // A runc left stopped would hold the shim's process mutex, and so the pod's teardown.
        self.stage.containerd().continue_stopped_runc();
    }
}
