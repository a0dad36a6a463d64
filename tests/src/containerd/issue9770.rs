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
//! On containerd 2.3 the chain is cut short (see [`UpdateEnd`]): the update's `Task()` lookup
//! asks the shim for the task's `State`, which waits on the same shim mutex as step 3; from
//! v2.3.0 that lookup fails once containerd's 2 s `io.containerd.timeout.task.state` runs
//! out, so `UpdateContainerResources` fails and lets go of the Status lock after ~2 s instead
//! of holding it for the whole umount.
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

use super::bed::{short, Measured, Stage, StallBed, StallOutcome, Started};
use super::cri;
use super::daemon::{Placement, Runc};
use super::image::BUSYBOX;
use super::procs::{self, Shim, ThreadSnapshot, UmountSpan, UmountWatch};
use super::version::ContainerdRelease;
use super::Version;
use crate::dirty::KeepDirty;
use crate::LoopFs;

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

/// How `UpdateContainerResources` ends in this staging, which decides how long it holds the
/// Status lock. In every version, inside `UpdateSync`, it first looks the task up
/// (`Container.Task` → tasks service `Get` → the shim's `State`, under the 2 s
/// `io.containerd.timeout.task.state`), then calls `task.Update`. The shim's `State` and
/// `Update` both wait on the init process's mutex, which `Delete` holds across the umount.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateEnd {
    /// containerd 1.6 and 1.7: the tasks service only logs a `State` that timed out
    /// ("get state for …") and returns the task anyway, so `task.Update` goes to the shim and
    /// waits there until `Delete` lets go of the mutex, then fails with "cannot update a
    /// deleted process". The lock is held for the whole umount (#9770 as reported).
    AfterUmount,
    /// containerd 2.3 (PR #12821, "propagate `context deadline exceeded` error properly",
    /// first in v2.3.0): the tasks service returns the `State` timeout as DeadlineExceeded,
    /// so `Container.Task` fails, and `UpdateContainerResources` fails with "failed to get
    /// task: context deadline exceeded" after the state timeout, letting go of the lock. The
    /// stall is bounded by that timeout; the shim's umount goes on.
    StateTimeout(Duration),
}

impl UpdateEnd {
    /// containerd's default `io.containerd.timeout.task.state`.
    pub const STATE_TIMEOUT: Duration = Duration::from_secs(2);

    pub fn of(version: Version) -> Self {
        match version.containerd {
            ContainerdRelease::V1_6_20 | ContainerdRelease::V1_7_34 => Self::AfterUmount,
            ContainerdRelease::V2_3_4 => Self::StateTimeout(Self::STATE_TIMEOUT),
        }
    }
}

/// How the stall is staged.
#[derive(Clone, Debug)]
pub struct Options {
    /// The containerd, shim and runc it is staged on.
    pub version: Version,
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
    /// The deadline of the bed's CRI calls (the update, the relist driver's), if not
    /// kubelet's default of 2 min.
    pub cri_timeout: Option<Duration>,
}

impl Default for Options {
    /// The #9770 chain ([`OnDisk::Snapshots`]), 24 MiB at 1 MiB/s: a stall of about 24 s
    /// (measured on this machine kind).
    fn default() -> Self {
        Self {
            version: Version::DEBIAN,
            on_disk: OnDisk::Snapshots,
            disk_size: 256 << 20,
            dirty_mib: 24,
            throttle_bps: 1 << 20,
            run_for: Duration::from_secs(5),
            relist_period: Duration::from_millis(200),
            cri_timeout: None,
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
/// Its fields drop in declaration order: the [`Stage`] (the relist driver stops, the
/// throttle is lifted, the pod is torn down through CRI, then containerd is stopped and
/// cleaned up after), and the ext4 is unmounted and detached last.
pub struct Bed {
    stage: Stage,
    fs: LoopFs,
    options: Options,
    /// How many times [`Bed::trigger_with`] ran (names each writer container apart).
    triggers: u32,
    /// The container's writes stay dirty until the umount syncs them, however slow the
    /// machine (set back last).
    _keep_dirty: KeepDirty,
}

/// How long the container's writes are left to the umount at least: past the container's
/// run, its exit and the shim's unmount in a slow guest (36 s there), and the stall itself.
const KEEP_DIRTY_S: u64 = 600;

/// What the mid-stall hook of [`Bed::trigger_with`] gets.
pub struct MidStall<'a> {
    pub container_id: String,
    pub shim: Shim,
    /// The shim thread in umount2, if it was seen before the update went out.
    pub umount: Option<UmountSpan>,
    pub update_sent: Instant,
    pub update_sent_wall: SystemTime,
    stage: &'a Stage,
}

/// The write limit while a stall is held ([`MidStall::hold`]): 16 KiB/s, so that the
/// umount's sync all but stops.
const HOLD_BPS: u64 = 16 << 10;

impl MidStall<'_> {
    /// Holds the stall until the returned guard drops: the disk's write limit drops to
    /// [`HOLD_BPS`], then is lifted. A test that must look at the stall while it lasts
    /// (plegwatch started in the middle of it, which takes about 30 s in a 5.10 TCG guest)
    /// then does not race the sync's progress.
    pub fn hold(&self) -> Result<Held<'_>> {
        Held::start(self.stage, None)
    }
}

/// A disk all but stopped ([`HOLD_BPS`]) until this drops; then its limit is set to
/// `after` (`None` lifts it, and the umount finishes its sync at the disk's own speed).
pub struct Held<'a> {
    stage: &'a Stage,
    after: Option<u64>,
}

impl<'a> Held<'a> {
    fn start(stage: &'a Stage, after: Option<u64>) -> Result<Self> {
        stage.set_throttle(Some(HOLD_BPS))?;
        Ok(Held { stage, after })
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.stage.set_throttle(self.after) {
            eprintln!("cleanup: setting the held disk's write limit back to {:?} B/s: {e:#}", self.after);
        }
    }
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
    /// `UpdateContainerResources` and the relists around it. With [`OnDisk::Snapshots`],
    /// containerd 1.6.20 answers "cannot update a deleted process" once the delete lets go
    /// of the shim's mutex.
    pub update: Measured,
    /// The page cache's `Dirty` and `Writeback` (KiB, /proc/meminfo) when the umount was
    /// first seen: what it had left to sync.
    pub dirty_at_umount: Option<(u64, u64)>,
    /// containerd's threads in uninterruptible sleep [`Bed::PROBE_AFTER`] into the update
    /// (empty if it had returned by then): with [`OnDisk::Root`], the update's `fdatasync`.
    pub containerd_blocked: Vec<ThreadSnapshot>,
}

impl StallOutcome for Outcome {
    fn summary(&self) -> String {
        let umount = match &self.umount {
            Some(u) => format!(
                "shim thread {} in umount2 for {:.2}s (first seen {:.2}s after the exit){}",
                u.tid,
                u.duration().as_secs_f64(),
                u.first_seen.saturating_duration_since(self.exited).as_secs_f64(),
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
            .filter(|s| self.umount.as_ref().is_none_or(|u| u.tid != s.tid || u.first_seen != s.first_seen))
            .map(|s| {
                format!(
                    "\n  also: shim thread {} in umount2 for {:.2}s from {:.2}s after the exit",
                    s.tid,
                    s.duration().as_secs_f64(),
                    s.first_seen.saturating_duration_since(self.exited).as_secs_f64()
                )
            })
            .collect();
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
        let dirty = match self.dirty_at_umount {
            Some((d, w)) => format!("; page cache then: {:.1} MiB dirty, {:.1} MiB under writeback", d as f64 / 1024.0, w as f64 / 1024.0),
            None => String::new(),
        };
        format!(
            "containerd#9770 stall: container {} (pid {}) exited {:.2}s after start; shim pid \
             {}\n  {umount}{dirty}{others}\n  UpdateContainerResources sent {:.3}s after the exit, \
             {}{blocked}",
            short(&self.container_id),
            self.container_pid,
            self.exited.duration_since(self.started).as_secs_f64(),
            self.shim.pid,
            self.update.sent.saturating_duration_since(self.exited).as_secs_f64(),
            self.update.summary(),
        )
    }

    fn origin(&self) -> Instant {
        self.started
    }

    fn update(&self) -> &Measured {
        &self.update
    }
}

impl Bed {
    /// How long the shim may take to start unmounting after the container's exit before the
    /// update goes out anyway, on this machine kind's clock (scaled in a guest: a 6.1 TCG
    /// guest's shim began its umount 8.8 s after the exit, the update went out at 5 s, and
    /// the lock crossed --warn while the shim's Delete had not reached umount2 yet).
    const UMOUNT_SHOW_TIMEOUT: Duration = Duration::from_secs(5);
    /// When, into the update, containerd's blocked threads are recorded.
    pub const PROBE_AFTER: Duration = Duration::from_secs(2);

    /// Everything up to a running pod, with the relist driver going and writes throttled.
    pub fn prepare(options: Options) -> Result<Self> {
        let keep_dirty = KeepDirty::for_secs(KEEP_DIRTY_S)?;
        let fs = LoopFs::new(options.disk_size)?;
        let base = fs.mount_point().to_path_buf();
        let placement = match options.on_disk {
            OnDisk::Root => Placement::RootUnder(base),
            OnDisk::Snapshots => Placement::SnapshotsUnder(base),
        };
        let stage = Stage::start_version(options.version, placement, Runc::Real, "stall9770")?;
        let mut bed = Self { stage, fs, options, triggers: 0, _keep_dirty: keep_dirty };
        if let Some(t) = bed.options.cri_timeout {
            bed.stage.set_cri_timeout(t);
        }
        // Only what the container writes is to be dirty when the throttle goes on.
        syncfs(bed.fs.mount_point())?;
        bed.stage.throttle(bed.fs.dev(), bed.options.throttle_bps)?;
        bed.stage.start_relist(bed.options.relist_period);
        Ok(bed)
    }

    pub fn fs(&self) -> &LoopFs {
        &self.fs
    }

    pub fn options(&self) -> &Options {
        &self.options
    }

    /// Runs the container, waits for its exit and for the shim's rootfs umount, sends
    /// `UpdateContainerResources`, calls `mid_stall` while the update is blocked, and returns
    /// once the update has returned and the umount has ended. It may run again on the same
    /// bed, with a new container each time.
    pub fn trigger_with(&mut self, mid_stall: impl FnOnce(&MidStall)) -> Result<Outcome> {
        let o = self.options.clone();
        let script = format!("dd if=/dev/zero of=/big bs=1M count={} 2>/dev/null; exec sleep {}", o.dirty_mib, o.run_for.as_secs_f64());
        let name = format!("writer-{}", self.triggers);
        self.triggers += 1;
        let config = cri::container(&name, BUSYBOX, &["/bin/sh", "-c", &script]);
        let started = Instant::now();
        let Started { id: container_id, pid: container_pid, shim } = self.stage.run_container(&config, true)?;
        eprintln!(
            "container {} (pid {container_pid}) started under shim {}; writing {} MiB, \
             exiting in {:?}",
            short(&container_id),
            shim.pid,
            o.dirty_mib,
            o.run_for
        );
        let watch = UmountWatch::start(shim.pid)?;

        let exit_deadline = Instant::now() + o.run_for + crate::timing::scaled(Duration::from_secs(30));
        while procs::alive(container_pid) {
            if Instant::now() >= exit_deadline {
                bail!("container pid {container_pid} still runs {:?} after its start", started.elapsed());
            }
            thread::sleep(Duration::from_millis(5));
        }
        let exited = Instant::now();
        // On cgroup v2 the container's pages go to the disk from when it writes them (cgroup
        // writeback): in a 6.1 guest the exit-to-umount time (3-10 s there) was taken off the
        // stall, umount and delay adding up to 17-22 s in five runs, and one umount lasted
        // 8 s. The disk all but stops from the exit until the umount has begun, so that it
        // finds what the container left dirty at its exit (24 MiB less what went out in its
        // last seconds), and syncs it at the throttle's rate. On v1 the pages stay dirty
        // until the umount (the host's umounts last the whole 24 s).
        let held = if self.stage.throttle_is_v2() { Some(Held::start(&self.stage, Some(o.throttle_bps))?) } else { None };
        let show_timeout = crate::timing::scaled(Self::UMOUNT_SHOW_TIMEOUT);
        let seen = watch.wait_open(show_timeout);
        let dirty_at_umount = crate::dirty::dirty_and_writeback_kib();
        drop(held);
        if seen.is_none() {
            eprintln!("warning: no thread of shim {} was seen in umount2 within {show_timeout:?} of the exit", shim.pid);
        }

        let update = self.stage.send_update(&container_id)?;
        mid_stall(&MidStall {
            container_id: container_id.clone(),
            shim: shim.clone(),
            umount: seen,
            update_sent: update.sent,
            update_sent_wall: update.sent_wall,
            stage: &self.stage,
        });
        let containerd_blocked = if update.wait_until(update.sent + Self::PROBE_AFTER, Duration::from_millis(20)) {
            Vec::new()
        } else {
            procs::blocked_threads(self.stage.containerd().pid())
        };
        let returned = update.join()?;
        if !watch.wait_closed(o.expected_stall() + Duration::from_secs(30)) {
            eprintln!("warning: shim {} still in umount2 long after the update returned", shim.pid);
        }
        let spans = watch.stop();
        let update = self.stage.measure(returned);

        let umount = spans.iter().filter(|s| s.last_seen >= exited).max_by_key(|s| s.duration()).cloned();
        Ok(Outcome {
            container_id,
            container_pid,
            shim,
            started,
            exited,
            umount,
            umount_spans: spans,
            update,
            dirty_at_umount,
            containerd_blocked,
        })
    }
}

impl StallBed for Bed {
    type Outcome = Outcome;

    fn stage(&self) -> &Stage {
        &self.stage
    }

    /// [`Bed::trigger_with`] without a hook.
    fn trigger(&mut self) -> Result<Outcome> {
        self.trigger_with(|_| {})
    }
}

/// syncfs(2) of the filesystem holding `path`.
pub fn syncfs(path: &Path) -> Result<()> {
    let dir = File::open(path).with_context(|| format!("open {}", path.display()))?;
    // SAFETY: syncfs(2) on a file descriptor we own for the duration of the call.
    if unsafe { libc::syncfs(dir.as_raw_fd()) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("syncfs {}", path.display()));
    }
    Ok(())
}
