//! The opLock stall of the CRI-O scenarios, staged on a [`Crio`] bed: a pod (with an
//! infra container, as kubelet's default pod-wide PID namespace gives), one busybox
//! container, and an `UpdateContainerResources` whose runtime stops itself (SIGSTOP)
//! while `(*runtimeOCI).UpdateContainer` holds the container's `opLock`. Behind it, a
//! second update parks on the lock as a reader (`(*Container).State`) and
//! `ListContainerStats` as a writer (`ContainerStats` takes it for writing).

use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};

use super::{Crio, BUSYBOX_REPO};
use crate::containerd::cri::{container, resources, Pod};

/// The stall, under way. Dropped unlifted (a failed test), it continues the runtime
/// first, so that the pod's removal does not wait on it.
pub struct UpdateStall {
    pod: Option<Pod>,
    crio_pid: u32,
    /// The container whose opLock is held.
    pub ctr: String,
    /// When the first update was sent.
    pub sent: Instant,
    /// The stopped runtime (`rt-wrap`, a child of crio).
    pub stopped: u32,
    /// When it was seen stopped; the waiters were sent right after.
    pub stopped_at: Instant,
    calls: Option<[JoinHandle<Result<Instant>>; 3]>,
}

/// The pod and its container, before the stall.
pub struct Prepared {
    pod: Pod,
    /// The container.
    pub ctr: String,
}

/// When each call of the stall returned, once lifted.
pub struct Ended {
    pub first: Instant,
    pub second: Instant,
    pub stats: Instant,
}

impl UpdateStall {
    /// Stages it (the pod is named `name`); returns once the runtime is stopped and the
    /// two waiters are sent.
    pub fn stage(crio: &Crio, name: &str) -> Result<Self> {
        Self::prepare(crio, name)?.stall(crio)
    }

    /// The pod `name` (namespace `plegwatch`) and its container `sleeper`, running.
    pub fn prepare(crio: &Crio, name: &str) -> Result<Prepared> {
        let cri = crio.cri().clone();
        // A pod-wide PID namespace: CRI-O then runs an infra container (with a host-network
        // pod and a per-container PID namespace it runs none).
        let pod = Pod::run(&cri, crio.pod_config(name, "")?)?;
        let image = crio.image(BUSYBOX_REPO);
        let mut config = container("sleeper", &image, &["sleep", "100000"]);
        if let Some(i) = config.image.as_mut() {
            // CRI-O checks the image's signature policy against the name the user gave.
            i.user_specified_image = image.clone();
        }
        let ctr = pod.run_container(&config)?;
        Ok(Prepared { pod, ctr })
    }
}

impl Prepared {
    /// The stall, on this pod's container (see [`UpdateStall::stage`]).
    pub fn stall(self, crio: &Crio) -> Result<UpdateStall> {
        let Prepared { pod, ctr } = self;
        let cri = crio.cri().clone();
        crio.stop_next_update()?;
        let sent = Instant::now();
        let update = |memory_mib: i64| {
            let (cri, ctr) = (cri.clone(), ctr.clone());
            thread::spawn(move || cri.update_container_resources(&ctr, &resources(memory_mib, 100_000, 50_000)).map(|()| Instant::now()))
        };
        let first = update(512);
        let deadline = Instant::now() + Duration::from_secs(10);
        let stopped = loop {
            if let Some(&pid) = crio.stopped_runtimes().first() {
                break pid;
            }
            ensure!(Instant::now() < deadline, "the runtime's update never stopped:\n{}", crio.log_tail(30));
            thread::sleep(Duration::from_millis(20));
        };
        let stopped_at = Instant::now();
        let second = update(256);
        let stats = {
            let cri = cri.clone();
            thread::spawn(move || cri.list_container_stats().map(|_| Instant::now()))
        };
        Ok(UpdateStall { pod: Some(pod), crio_pid: crio.pid(), ctr, sent, stopped, stopped_at, calls: Some([first, second, stats]) })
    }
}

impl UpdateStall {
    /// Lifts it (the runtime goes on) and waits for the three calls; gives back the pod.
    pub fn lift(mut self, crio: &Crio) -> Result<(Pod, Ended)> {
        crio.continue_stopped();
        let ended = |h: JoinHandle<Result<Instant>>, what: &str| -> Result<Instant> {
            h.join().map_err(|_| anyhow::anyhow!("{what} panicked"))?.with_context(|| what.to_string())
        };
        let [first, second, stats] = self.calls.take().context("lifted twice")?;
        let first = ended(first, "the first update")?;
        let second = ended(second, "the second update")?;
        let stats = ended(stats, "ListContainerStats")?;
        let pod = self.pod.take().context("lifted twice")?;
        Ok((pod, Ended { first, second, stats }))
    }
}

impl Drop for UpdateStall {
    fn drop(&mut self) {
        if self.calls.is_some() {
            crate::containerd::procs::signal_child(self.stopped, self.crio_pid, "rt-wrap", libc::SIGCONT);
        }
    }
}
