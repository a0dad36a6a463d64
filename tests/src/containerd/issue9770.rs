//! containerd#9770 staged on real components: `UpdateContainerResources` holds a container's
//! status write lock across `task.Update`, the shim's `Update` waits for the mutex its
//! `Delete` holds while it unmounts the exited container's rootfs, and that umount syncs the
//! container's dirty data through a throttled disk. Meanwhile every `ListContainers` waits on
//! the status read lock: the PLEG relist stalls (stall-catalog.md, patterns 2 and 3).
//!
//! The chain, as goroutine dumps taken mid-stall show it (machine-notes.md):
//! 1. `ListContainers` → `statusStorage.Get` → `RWMutex.RLock`, waiting;
//! 2. `UpdateContainerResources` → `Status.UpdateSync` → `task.Update`, waiting on the shim;
//! 3. the shim's `(*Init).Update` → `sync.(*Mutex).Lock`, waiting;
//! 4. the shim's `(*service).Delete` → `(*Init).delete` → `mount.UnmountAll` → `unix.Unmount`,
//!    holding that mutex, in umount2's task_work sync (`/proc/TID/syscall` reads 166).
//!
//! [`Bed::prepare`] sets everything up to a running host-network pod with the relist driver
//! going and the throttle on; [`Bed::trigger`] runs the container and causes the stall. A
//! plegwatch scenario starts plegwatch between the two (or in the `mid_stall` hook of
//! [`Bed::trigger_with`]) and compares its report with the [`Outcome`].

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context, Result};

use super::cri::{self, LatencyStats, ListCall, TimedCall};
use super::daemon::{Containerd, Placement};
use super::image::{self, BUSYBOX};
use super::procs::{self, Shim, ThreadSnapshot, UmountSpan, UmountWatch};
use super::{Cri, Pod, RelistDriver};
use crate::{LoopFs, WriteThrottle};

/// Which of containerd's data sits on the throttled disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDisk {
    /// containerd's whole `root`: snapshots, content and bbolt metadata. The update, holding
    /// the status lock, then waits in a bbolt `fdatasync` (it writes the new spec into the
    /// container's metadata before calling the shim), queued behind the umount's writeback
    /// (stall-catalog.md pattern 10); by the time it gets to the shim the task is gone, so it
    /// returns OK. The stall lasts as long, a little longer than the umount.
    Root,
    /// Only the overlayfs snapshots (the containers' rootfs layers): the exact #9770 chain,
    /// where the update waits on the shim's mutex while the shim's `Delete` holds it across
    /// the rootfs umount, and then fails with "cannot update a deleted process".
    Snapshots,
}

/// How the stall is staged.
#[derive(Clone, Debug)]
pub struct Options {
    pub on_disk: OnDisk,
    /// Size of the loop-mounted ext4.
    pub disk_size: u64,
    /// What the container writes into its rootfs (MiB), left dirty for the umount to sync.
    pub dirty_mib: u64,
    /// The disk's write limit.
    pub throttle_bps: u64,
    /// How long the container lives after writing.
    pub run_for: Duration,
    /// The relist driver's pause between relists.
    pub relist_period: Duration,
}

impl Default for Options {
    /// The #9770 chain ([`OnDisk::Snapshots`]), 24 MiB at 1 MiB/s: a stall of about 24 s
    /// (measured on this machine kind).
    fn default() -> Self {
        Self {
            on_disk: OnDisk::Snapshots,
            disk_size: 256 << 20,
            dirty_mib: 24,
            throttle_bps: 1 << 20,
            run_for: Duration::from_secs(5),
            relist_period: Duration::from_millis(200),
        }
    }
}

impl Options {
    /// Roughly how long the umount's sync takes: the dirty data at the throttle's rate.
    pub fn expected_stall(&self) -> Duration {
        Duration::from_secs_f64((self.dirty_mib << 20) as f64 / self.throttle_bps as f64)
    }
}

/// The stage: a loop-mounted ext4, a private containerd with its root (or snapshots) on it,
/// the test images, a host-network pod, the relist driver, and the write throttle.
///
/// Its fields drop in declaration order: the relist driver stops, the throttle is lifted,
/// the pod is torn down through CRI, then containerd is stopped (and cleaned up after), and
/// the ext4 is unmounted and detached last.
pub struct Bed {
    relist: Option<RelistDriver>,
    throttle: Option<WriteThrottle>,
    pod: Pod,
    cri: Cri,
    containerd: Containerd,
    fs: LoopFs,
    options: Options,
    /// How many times [`Bed::trigger_with`] ran (names each writer container apart).
    triggers: u32,
}

/// What the mid-stall hook of [`Bed::trigger_with`] gets.
#[derive(Clone, Debug)]
pub struct MidStall {
    pub container_id: String,
    pub shim: Shim,
    /// The shim thread in umount2, if it was seen before the update went out.
    pub umount: Option<UmountSpan>,
    pub update_sent: Instant,
    pub update_sent_wall: SystemTime,
}

/// What happened, with the timings that matter.
#[derive(Clone, Debug)]
pub struct Outcome {
    pub container_id: String,
    /// The container's init process (host PID).
    pub container_pid: u32,
    /// The pod's shim (the container's parent, `-address` = our socket, `-id` = the pod).
    pub shim: Shim,
    pub started: Instant,
    /// When the container's process was seen gone.
    pub exited: Instant,
    /// The shim thread's rootfs umount (the longest stay in syscall 166 after the exit).
    pub umount: Option<UmountSpan>,
    /// Every stay of a shim thread in syscall 166 seen after the container started.
    pub umount_spans: Vec<UmountSpan>,
    pub update_sent: Instant,
    pub update_sent_wall: SystemTime,
    /// How long `UpdateContainerResources` blocked.
    pub update_latency: Duration,
    /// Its result; containerd 1.6.20 answers "cannot update a deleted process" once the
    /// delete lets go of the shim's mutex.
    pub update_result: Result<(), String>,
    /// Every relist call made so far.
    pub calls: Vec<TimedCall>,
    /// `ListContainers` calls that started before the update went out.
    pub list_before: Option<LatencyStats>,
    /// `ListContainers` calls that were under way at some point while the update was.
    pub list_during: Option<LatencyStats>,
    /// containerd's threads in uninterruptible sleep [`Bed::PROBE_AFTER`] into the update
    /// (empty if it had returned by then): with [`OnDisk::Root`], the update's `fdatasync`.
    pub containerd_blocked: Vec<ThreadSnapshot>,
}

impl Outcome {
    pub fn update_ended(&self) -> Instant {
        self.update_sent + self.update_latency
    }

    /// One paragraph for the test log.
    pub fn summary(&self) -> String {
        let umount = match &self.umount {
            Some(u) => format!(
                "shim thread {} in umount2 for {:.2}s (first seen {:.2}s after the exit){}",
                u.tid,
                u.duration().as_secs_f64(),
                u.first_seen
                    .saturating_duration_since(self.exited)
                    .as_secs_f64(),
                u.snapshot
                    .as_ref()
                    .map(|s| format!(
                        "; {:.1}s in: state {}, wchan {}, syscall {}\n    stack: {}",
                        s.at.duration_since(u.first_seen).as_secs_f64(),
                        s.state,
                        s.wchan,
                        s.syscall.split_whitespace().next().unwrap_or("?"),
                        s.stack_line()
                    ))
                    .unwrap_or_default()
            ),
            None => "no shim thread was seen in umount2".into(),
        };
        let others: String = self
            .umount_spans
            .iter()
            .filter(|s| {
                self.umount
                    .as_ref()
                    .is_none_or(|u| u.tid != s.tid || u.first_seen != s.first_seen)
            })
            .map(|s| {
                format!(
                    "\n  also: shim thread {} in umount2 for {:.2}s from {:.2}s after the exit",
                    s.tid,
                    s.duration().as_secs_f64(),
                    s.first_seen
                        .saturating_duration_since(self.exited)
                        .as_secs_f64()
                )
            })
            .collect();
        let stats = |s: &Option<LatencyStats>| s.map_or("none".into(), |s| s.to_string());
        let blocked: String = self
            .containerd_blocked
            .iter()
            .map(|t| {
                format!(
                    "\n  containerd thread {} in D, syscall {}, wchan {}\n    stack: {}",
                    t.tid,
                    t.syscall.split_whitespace().next().unwrap_or("?"),
                    t.wchan,
                    t.stack_line()
                )
            })
            .collect();
        format!(
            "containerd#9770 stall: container {} (pid {}) exited {:.2}s after start; shim pid \
             {}\n  {umount}{others}\n  UpdateContainerResources sent {:.3}s after the exit, blocked \
             {:.2}s: {}\n  ListContainers before the update: {}\n  ListContainers during the \
             update: {}{blocked}",
            short(&self.container_id),
            self.container_pid,
            self.exited.duration_since(self.started).as_secs_f64(),
            self.shim.pid,
            self.update_sent
                .saturating_duration_since(self.exited)
                .as_secs_f64(),
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

impl Bed {
    /// How long the shim may take to start unmounting after the container's exit before the
    /// update goes out anyway.
    const UMOUNT_SHOW_TIMEOUT: Duration = Duration::from_secs(5);
    /// When, into the update, containerd's blocked threads are recorded.
    pub const PROBE_AFTER: Duration = Duration::from_secs(2);

    /// Everything up to a running pod, with the relist driver going and writes throttled.
    pub fn prepare(options: Options) -> Result<Self> {
        let fs = LoopFs::new(options.disk_size)?;
        let base = fs.mount_point().to_path_buf();
        let placement = match options.on_disk {
            OnDisk::Root => Placement::RootUnder(base),
            OnDisk::Snapshots => Placement::SnapshotsUnder(base),
        };
        let containerd = Containerd::start(placement)?;
        image::import_test_images(&containerd)?;
        let cri = containerd.cri()?;
        let pod = Pod::run(
            &cri,
            cri::host_network_pod(
                "stall9770",
                containerd.cgroup_parent(),
                &containerd.pod_log_dir(),
            )?,
        )
        .with_context(|| containerd.log_tail(30))?;
        let mut bed = Self {
            relist: None,
            throttle: None,
            pod,
            cri,
            containerd,
            fs,
            options,
            triggers: 0,
        };
        // Only what the container writes is to be dirty when the throttle goes on.
        syncfs(bed.fs.mount_point())?;
        bed.throttle = Some(WriteThrottle::new(bed.fs.dev(), bed.options.throttle_bps)?);
        bed.relist = Some(RelistDriver::start(&bed.cri, bed.options.relist_period));
        Ok(bed)
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

    pub fn fs(&self) -> &LoopFs {
        &self.fs
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

    /// [`Bed::trigger_with`] without a hook.
    pub fn trigger(&mut self) -> Result<Outcome> {
        self.trigger_with(|_| {})
    }

    /// Runs the container, waits for its exit and for the shim's rootfs umount, sends
    /// `UpdateContainerResources`, calls `mid_stall` while the update is blocked, and returns
    /// once the update has returned and the umount has ended. It may run again on the same
    /// bed, with a new container each time.
    pub fn trigger_with(&mut self, mid_stall: impl FnOnce(&MidStall)) -> Result<Outcome> {
        let o = self.options.clone();
        let script = format!(
            "dd if=/dev/zero of=/big bs=1M count={} 2>/dev/null; exec sleep {}",
            o.dirty_mib,
            o.run_for.as_secs_f64()
        );
        let name = format!("writer-{}", self.triggers);
        self.triggers += 1;
        let config = cri::container(&name, BUSYBOX, &["/bin/sh", "-c", &script]);
        let started = Instant::now();
        let container_id = self
            .pod
            .run_container(&config)
            .with_context(|| self.containerd.log_tail(30))?;
        let container_pid = self.cri.container_pid(&container_id)?;
        let shim = self.find_shim(container_pid)?;
        eprintln!(
            "container {} (pid {container_pid}) started under shim {}; writing {} MiB, \
             exiting in {:?}",
            short(&container_id),
            shim.pid,
            o.dirty_mib,
            o.run_for
        );
        let watch = UmountWatch::start(shim.pid)?;

        let exit_deadline = Instant::now() + o.run_for + Duration::from_secs(30);
        while procs::alive(container_pid) {
            if Instant::now() >= exit_deadline {
                bail!(
                    "container pid {container_pid} still runs {:?} after its start",
                    started.elapsed()
                );
            }
            thread::sleep(Duration::from_millis(5));
        }
        let exited = Instant::now();
        let seen = watch.wait_open(Self::UMOUNT_SHOW_TIMEOUT);
        if seen.is_none() {
            eprintln!(
                "warning: no thread of shim {} was seen in umount2 within {:?} of the exit",
                shim.pid,
                Self::UMOUNT_SHOW_TIMEOUT
            );
        }

        let update_sent_wall = SystemTime::now();
        let update_sent = Instant::now();
        let updater = {
            let cri = self.cri.clone();
            let id = container_id.clone();
            thread::Builder::new()
                .name("cri-update".into())
                .spawn(move || {
                    let r =
                        cri.update_container_resources(&id, &cri::resources(512, 100_000, 50_000));
                    (Instant::now(), r)
                })
                .context("spawn the UpdateContainerResources caller")?
        };
        mid_stall(&MidStall {
            container_id: container_id.clone(),
            shim: shim.clone(),
            umount: seen,
            update_sent,
            update_sent_wall,
        });
        let probe_at = update_sent + Self::PROBE_AFTER;
        while !updater.is_finished() && Instant::now() < probe_at {
            thread::sleep(Duration::from_millis(20));
        }
        let containerd_blocked = if updater.is_finished() {
            Vec::new()
        } else {
            procs::blocked_threads(self.containerd.pid())
        };
        let (update_ended, update_result) = updater
            .join()
            .map_err(|_| anyhow::anyhow!("the UpdateContainerResources caller panicked"))?;
        let update_latency = update_ended.duration_since(update_sent);
        if !watch.wait_closed(o.expected_stall() + Duration::from_secs(30)) {
            eprintln!(
                "warning: shim {} still in umount2 long after the update returned",
                shim.pid
            );
        }
        let spans = watch.stop();
        // Let the relist blocked behind the update finish and one more run after it.
        let settle = Instant::now() + 2 * o.relist_period + Duration::from_millis(500);
        while Instant::now() < settle {
            thread::sleep(Duration::from_millis(20));
        }

        let umount = spans
            .iter()
            .filter(|s| s.last_seen >= exited)
            .max_by_key(|s| s.duration())
            .cloned();
        let calls = self.relist_calls();
        let list_before =
            LatencyStats::of(&calls, ListCall::Containers, |c| c.started < update_sent);
        let list_during = LatencyStats::of(&calls, ListCall::Containers, |c| {
            c.started < update_ended && c.ended() > update_sent
        });
        Ok(Outcome {
            container_id,
            container_pid,
            shim,
            started,
            exited,
            umount,
            umount_spans: spans,
            update_sent,
            update_sent_wall,
            update_latency,
            update_result: update_result.map_err(|e| format!("{e:#}")),
            calls,
            list_before,
            list_during,
            containerd_blocked,
        })
    }

    /// The container's shim: its parent, checked to be a shim of this daemon serving the pod.
    fn find_shim(&self, container_pid: u32) -> Result<Shim> {
        let ours = self.containerd.shims();
        let parent = procs::ppid(container_pid);
        let shim = ours
            .iter()
            .find(|s| Some(s.pid) == parent)
            .or_else(|| ours.iter().find(|s| s.id == self.pod.id()))
            .cloned()
            .with_context(|| {
                format!(
                    "no shim of {} is the parent ({parent:?}) of container pid {container_pid} \
                     or serves pod {}: {ours:?}",
                    self.containerd.socket().display(),
                    self.pod.id()
                )
            })?;
        if shim.id != self.pod.id() {
            eprintln!(
                "note: shim {} has -id {}, not the pod's {}",
                shim.pid,
                shim.id,
                self.pod.id()
            );
        }
        Ok(shim)
    }
}

/// syncfs(2) of the filesystem holding `path`.
pub fn syncfs(path: &Path) -> Result<()> {
    let dir = File::open(path).with_context(|| format!("open {}", path.display()))?;
    // SAFETY: syncfs(2) on a file descriptor we own for the duration of the call.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("syncfs {}", path.display()));
    }
    Ok(())
}
