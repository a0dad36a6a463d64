//! containerd#9770 on real components, with no plegwatch: proof that the stall the plegwatch
//! scenarios will point at is real, and how long it lasts.
//!
//! A private containerd 1.6.20 (Debian's, with runc 1.1.5) keeps its overlayfs snapshots (or
//! its whole root) on a loop-mounted ext4 whose writes are throttled to 1 MiB/s. In a host-network pod, a busybox
//! container writes 24 MiB into its rootfs and exits 5 s later. The shim's `Delete` unmounts
//! the rootfs, which syncs those 24 MiB through the throttle. `UpdateContainerResources`,
//! sent right then, takes the container's status write lock and keeps it for the whole
//! umount; every `ListContainers` (the relist driver's, every 200 ms) waits on that lock.
//!
//! - Snapshots on the disk: the update waits on the shim's mutex, held by `Delete` across the
//!   umount, and fails with "cannot update a deleted process" once it gets it (#9770 as
//!   reported).
//! - The whole root on the disk: the update first writes the new spec to bbolt, and its
//!   `fdatasync` waits behind the umount's writeback in a journal commit; the task is gone by
//!   then, so it returns OK.
//!
//! The snapshots variant is also staged on the containerd 1.7.34 and 2.3.4 release builds
//! (with their shims and runc 1.4.3). Both still take the Status write lock (`UpdateSync`)
//! around the task lookup and `task.Update` in `UpdateContainerResources`, and their shims
//! still hold the process mutex across the rootfs umount in `Delete`. 1.7 stalls as 1.6
//! does; 2.3 fails the task lookup once the shim's `State` times out (2 s) and lets go of
//! the lock then ([`UpdateEnd::StateTimeout`]): a stall of the state timeout, not of the
//! umount.

use std::time::Duration;

use anyhow::Result;
use plegwatch_scenarios::containerd;
use plegwatch_scenarios::containerd::bed::{StallBed, StallOutcome};
use plegwatch_scenarios::containerd::issue9770::{self, OnDisk, Outcome, UpdateEnd};
use plegwatch_scenarios::containerd::Version;
use plegwatch_scenarios::{preflight, WriteThrottle};

/// The least stall that counts: 24 MiB at 1 MiB/s measured 18-24 s here.
const STALL_MIN: Duration = Duration::from_secs(10);
/// ListContainers before the stall, on an idle node.
const QUIET_MEDIAN_MAX: Duration = Duration::from_millis(50);
/// At least this many ListContainers calls before the update (about 25 at 200 ms).
const QUIET_CALLS_MIN: usize = 5;
/// How far the update's end may be from the umount's end when it waits on the shim (the
/// umount watch polls every 10 ms).
const SAME_END: Duration = Duration::from_millis(500);
/// How far above the state timeout the update may return: the lookup's own work and the
/// error's way back.
const STATE_SLACK: Duration = Duration::from_millis(1500);
/// How much shorter than the lock hold the longest ListContainers may be: it starts within a
/// relist period (200 ms) of the lock being taken.
const LIST_SLACK: Duration = Duration::from_millis(500);
/// fsync(2) and fdatasync(2) on x86-64.
const SYS_FSYNC: u32 = 74;
const SYS_FDATASYNC: u32 = 75;

#[test]
fn snapshots_on_throttled_disk_update_waits_for_shim_umount() -> Result<()> {
    update_waits_for_shim_umount(Version::DEBIAN)
}

#[test]
fn snapshots_on_throttled_disk_update_waits_for_shim_umount_on_1_7() -> Result<()> {
    update_waits_for_shim_umount(Version::V1_7)
}

#[test]
fn snapshots_on_throttled_disk_update_waits_for_shim_umount_on_2_3() -> Result<()> {
    update_waits_for_shim_umount(Version::V2_3)
}

fn update_waits_for_shim_umount(version: Version) -> Result<()> {
    let Some((bed, outcome)) = stage(version, OnDisk::Snapshots)? else {
        return Ok(());
    };
    let context = || bed.context(&outcome);
    let umount = outcome.umount.as_ref().expect("checked by stage");
    if let UpdateEnd::StateTimeout(timeout) = UpdateEnd::of(version) {
        update_gave_up_at_state_timeout(&outcome, timeout, context);
        return Ok(());
    }
    assert_blocked_for_the_stall(&outcome, context);
    // It waited for the shim's Delete, and got the mutex only once the process was deleted.
    let ended = outcome.update.ended();
    let gap = if ended > umount.last_seen { ended - umount.last_seen } else { umount.last_seen - ended };
    assert!(gap <= SAME_END, "UpdateContainerResources ended {gap:?} away from the shim's umount\n{}", context());
    match &outcome.update.result {
        Err(e) if e.contains("cannot update a deleted process") => {}
        other => panic!(
            "UpdateContainerResources should fail with \"cannot update a deleted process\" \
             after waiting for the shim's Delete, got {other:?}\n{}",
            context()
        ),
    }
    Ok(())
}

#[test]
fn root_on_throttled_disk_update_waits_in_fdatasync() -> Result<()> {
    let Some((bed, outcome)) = stage(Version::DEBIAN, OnDisk::Root)? else {
        return Ok(());
    };
    let context = || bed.context(&outcome);
    assert_blocked_for_the_stall(&outcome, context);
    // The holder of the status lock waits in the kernel, in a metadata sync.
    assert!(
        outcome.containerd_blocked.iter().any(|t| matches!(t.syscall_nr(), Some(SYS_FSYNC | SYS_FDATASYNC))),
        "no containerd thread was in fsync/fdatasync {:?} into the update\n{}",
        issue9770::Bed::PROBE_AFTER,
        context()
    );
    assert!(
        outcome.update.ended() + SAME_END >= outcome.umount.as_ref().expect("checked").last_seen,
        "UpdateContainerResources returned before the umount ended\n{}",
        context()
    );
    Ok(())
}

/// Stages the stall and checks what both variants share; returns the bed (still set up, for
/// its log) and the outcome, or `None` when there is no blkio throttling (skipped).
fn stage(version: Version, on_disk: OnDisk) -> Result<Option<(issue9770::Bed, Outcome)>> {
    let scenario = format!("containerd_9770_baseline on {version}");
    if !containerd::require_version(version, &scenario) {
        return Ok(None);
    }
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip(&scenario, &why);
        return Ok(None);
    }
    let options = issue9770::Options { version, on_disk, ..Default::default() };
    let mut bed = issue9770::Bed::prepare(options)?;
    let outcome = bed.trigger()?;
    eprintln!("{}", outcome.summary());
    let context = || bed.context(&outcome);

    bed.stage().assert_pods_shim(&outcome.shim);
    let umount = outcome.umount.as_ref().unwrap_or_else(|| panic!("no shim thread was seen in umount2\n{}", context()));
    assert!(umount.duration() >= STALL_MIN, "the shim's rootfs umount lasted only {:?}\n{}", umount.duration(), context());
    outcome.update.assert_quiet_before(QUIET_CALLS_MIN, QUIET_MEDIAN_MAX, context);
    Ok(Some((bed, outcome)))
}

/// The update held the Status lock for the whole stall: it blocked at least [`STALL_MIN`],
/// without hitting a deadline, and so did a ListContainers.
fn assert_blocked_for_the_stall(outcome: &Outcome, context: impl Fn() -> String) {
    let update = &outcome.update;
    assert!(update.latency >= STALL_MIN, "UpdateContainerResources blocked only {:?}\n{}", update.latency, context());
    if let Err(e) = &update.result {
        assert!(
            !e.contains("no answer") && !e.contains("DeadlineExceeded"),
            "UpdateContainerResources hit a deadline instead of waiting: {e}\n{}",
            context()
        );
    }
    let during = update.during(&context);
    assert!(during.max >= STALL_MIN, "ListContainers during the stall: {during} (want a max ≥ {STALL_MIN:?})\n{}", context());
}

/// containerd 2.3: the update's task lookup timed out on the shim's `State` (waiting on the
/// mutex the `Delete` holds across the umount), so the update failed after the state
/// timeout, holding the Status lock (and ListContainers) that long, while the umount went on.
fn update_gave_up_at_state_timeout(outcome: &Outcome, timeout: Duration, context: impl Fn() -> String) {
    let update = &outcome.update;
    assert!(
        update.latency >= timeout && update.latency <= timeout + STATE_SLACK,
        "UpdateContainerResources blocked {:?}; the shim's State times out after {timeout:?} \
         (want within {STATE_SLACK:?} above)\n{}",
        update.latency,
        context()
    );
    match &update.result {
        Err(e) if e.contains("failed to get task") && e.contains("deadline exceeded") => {}
        other => panic!(
            "UpdateContainerResources should fail its task lookup with \"context deadline \
             exceeded\" once the shim's State times out, got {other:?}\n{}",
            context()
        ),
    }
    let during = update.during(&context);
    assert!(
        during.max + LIST_SLACK >= timeout && during.failed == 0,
        "ListContainers during the update: {during} (want a max ≥ {timeout:?} - \
         {LIST_SLACK:?})\n{}",
        context()
    );
    let umount = outcome.umount.as_ref().expect("checked by stage");
    assert!(
        umount.last_seen > update.ended() + STALL_MIN / 2,
        "the shim's umount ended {:?} after the update gave up; it should go on well after it\n{}",
        umount.last_seen.saturating_duration_since(update.ended()),
        context()
    );
}
