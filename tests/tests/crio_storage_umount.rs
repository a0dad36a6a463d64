//! CRI-O unmounts a container's storage itself, in its own process, where containerd's
//! shim does (containerd#9770): does that unmount sync the container's dirty pages, as the
//! shim's does? On real CRI-O 1.35.6, conmon 2.1.6 and runc 1.1.5 (see
//! `plegwatch_scenarios::crio`), with CRI-O's storage root on a loop ext4 whose writes are
//! throttled: no. CRI-O creates every container with containers/storage's `Volatile: true`
//! (`internal/storage/runtime.go`; `cmd/crio/main.go` says why), so the rootfs overlay is
//! mounted `volatile`, and overlayfs skips syncing its upper dir at unmount.
//!
//! A container writes 24 MiB into its rootfs and sleeps; `StopContainer` kills it and, in
//! `postStopCleanup`, unmounts its storage (containers/storage's overlay `Put`: `umount2`).
//! The test checks, with plegwatch `--warn 2s` watching:
//! - the rootfs overlay is mounted `volatile` (mountinfo: `fsync=volatile` on Linux 6.18);
//! - the stop returns under `--warn`, and plegwatch saw crio's `umount2` (its latency
//!   table), short; no incident and no stall line;
//! - the pages were still dirty: a `syncfs` of the disk after plegwatch stopped takes
//!   seconds (the throttle's pace), so the quick unmount did not write them.
//!
//! So on CRI-O the umount of containerd#9770 is not a stall (the dirty pages go out with
//! writeback, as any file's do); a relist driver (kubelet's relist CRI traffic; there is no
//! kubelet) runs throughout and stays fast.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plegwatch_scenarios::containerd::cri::{container, LatencyStats, ListCall, Pod, RelistDriver};
use plegwatch_scenarios::containerd::issue9770::syncfs;
use plegwatch_scenarios::crio::{Crio, BUSYBOX_REPO};
use plegwatch_scenarios::throttle::WriteThrottle;
use plegwatch_scenarios::{preflight, LoopFs};
use serde_json::Value;

const SCENARIO: &str = "crio_storage_umount";
const WARN: Duration = Duration::from_secs(2);
/// What the container leaves dirty, and how fast the disk takes it: about 24 s of writeback.
const DIRTY_MIB: u64 = 24;
const THROTTLE_BPS: u64 = 1 << 20;
/// The loop ext4 holding CRI-O's storage.
const DISK_SIZE: u64 = 256 << 20;
/// The least a syncfs of the disk after the stop must take: some of the 24 MiB were still
/// dirty (at 1 MiB/s, the flusher writes a few in the seconds the test takes).
const MIN_SYNC: Duration = Duration::from_secs(4);
/// How long the container may take to write.
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn a_stop_unmounts_a_volatile_overlay_without_syncing_and_nothing_stalls() -> Result<()> {
    preflight::require();
    if let Some(why) = Crio::missing() {
        preflight::skip(SCENARIO, &why);
        return Ok(());
    }
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip(SCENARIO, &why);
        return Ok(());
    }
    let fs = LoopFs::new(DISK_SIZE)?;
    let crio = Crio::start_on(Some(fs.mount_point().join("root")))?;
    let cri = crio.cri().clone();
    let sandbox = crio.pod_config("criounmount", "")?;
    let pod = Pod::run(&cri, sandbox)?;
    // Only what the container writes is to be dirty when the throttle goes on.
    syncfs(fs.mount_point())?;
    let throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    let image = crio.image(BUSYBOX_REPO);
    let script = format!("dd if=/dev/zero of=/big bs=1M count={DIRTY_MIB} 2>/dev/null; touch /written; exec sleep 100000");
    let mut config = container("writer", &image, &["/bin/sh", "-c", &script]);
    if let Some(i) = config.image.as_mut() {
        // CRI-O checks the image's signature policy against the name the user gave.
        i.user_specified_image = image.clone();
    }
    let ctr = pod.run_container(&config)?;
    wait_written(fs.mount_point(), &ctr)?;

    let plegwatch = crio.watched(WARN)?;

    let rootfs = volatile_rootfs(&ctr)?;
    eprintln!("the container's rootfs overlay ({rootfs}) is mounted volatile");

    let relist = RelistDriver::start(&cri, Duration::from_millis(200));
    let sent = Instant::now();
    cri.with_timeout(Duration::from_secs(120)).stop_container(&ctr, Duration::ZERO).context("StopContainer")?;
    let returned = Instant::now();
    thread::sleep(WARN);
    let calls = relist.stop(Duration::from_secs(10));
    let events = plegwatch.stop()?;
    let all = || plegwatch_scenarios::events::dump(&events, sent);
    let blocked = returned.duration_since(sent);
    // The pages the container left: still dirty, written now at the throttle's pace.
    let began = Instant::now();
    syncfs(fs.mount_point())?;
    let synced = began.elapsed();
    drop(throttle);
    eprintln!(
        "StopContainer returned after {:.3}s; a syncfs of the disk after it took {:.1}s",
        blocked.as_secs_f64(),
        synced.as_secs_f64()
    );
    ensure!(
        synced >= MIN_SYNC,
        "the staging did not hold: the disk's syncfs took {synced:?} (under {MIN_SYNC:?}): the container's pages were not dirty"
    );
    ensure!(blocked < WARN, "StopContainer blocked {blocked:?}, past --warn {WARN:?}:\n{}", crio.log_tail(30));

    // plegwatch saw crio's unmount, short, and reported nothing.
    let summary = events.iter().rev().find(|e| e.is("summary")).context("no summary line")?;
    let umounts = summary.syscall_count("umount2");
    let slowest = summary
        .get("/syscalls")
        .and_then(Value::as_array)
        .and_then(|rows| rows.iter().find(|r| r["syscall"] == "umount2"))
        .and_then(|r| r["max_le_s"].as_f64());
    eprintln!("plegwatch saw {umounts} umount2 calls, the longest under {slowest:?} s");
    ensure!(umounts >= 1, "plegwatch saw no umount2 (crio's unmount of the container's storage): {}", summary.json);
    ensure!(slowest.is_some_and(|s| s < 1.0), "a umount2 took a second or more: {}", summary.json);
    let reported: Vec<_> = events.iter().filter(|e| e.is("incident") || e.is("stall")).collect();
    ensure!(reported.is_empty(), "plegwatch reported {} lines for a stop that did not wait:\n{}", reported.len(), all());

    // The relist stayed fast.
    let during = |c: &plegwatch_scenarios::containerd::cri::TimedCall| c.started >= sent;
    for call in [ListCall::PodSandbox, ListCall::Containers] {
        let s = LatencyStats::of(&calls, call, during).with_context(|| format!("no {} after the stop", call.method()))?;
        assert!(s.max < Duration::from_secs(1) && s.failed == 0, "{} after the stop: {s}", call.method());
    }
    drop(pod);
    Ok(())
}

/// The mount point of container `ctr`'s rootfs overlay, checked to be mounted `volatile`.
fn volatile_rootfs(ctr: &str) -> Result<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("mountinfo")?;
    // CRI-O's rootfs overlays are mounted at `<root>/overlay/<layer>/merged`; the writer's
    // is the one whose upper dir holds the file it wrote (the infra container has one too).
    let overlays: Vec<(&str, &str)> = info
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut r = right.split_whitespace();
            (r.next()? == "overlay").then_some(())?;
            let super_opts = r.nth(1)?;
            let mount_point = left.split_whitespace().nth(4)?;
            Some((mount_point, super_opts))
        })
        .filter(|(m, _)| m.contains("plegwatch-loopfs-"))
        .collect();
    let upper = |opts: &str| opts.split(',').find_map(|o| o.strip_prefix("upperdir=")).map(std::path::PathBuf::from);
    let writer: Vec<&(&str, &str)> = overlays.iter().filter(|(_, o)| upper(o).is_some_and(|u| u.join("written").exists())).collect();
    let (mount_point, opts) = match writer.as_slice() {
        [one] => **one,
        more => bail!("want one rootfs overlay of container {} under the bed, found {} of {overlays:?}", &ctr[..12], more.len()),
    };
    // `volatile` as mounted; Linux 6.x shows it as `fsync=volatile`.
    ensure!(opts.split(',').any(|o| o == "volatile" || o == "fsync=volatile"), "the rootfs overlay {mount_point} is not volatile: {opts}");
    Ok(mount_point.to_string())
}

/// Waits until container `ctr` has written its file (its `/written` in an upper dir of
/// CRI-O's storage under `base`).
fn wait_written(base: &std::path::Path, ctr: &str) -> Result<()> {
    let began = Instant::now();
    let overlay = base.join("root").join("overlay");
    loop {
        let done =
            std::fs::read_dir(&overlay).into_iter().flatten().flatten().any(|layer| layer.path().join("diff").join("written").exists());
        if done {
            return Ok(());
        }
        if began.elapsed() > plegwatch_scenarios::timing::scaled(WRITE_TIMEOUT) {
            bail!("container {} did not write its {DIRTY_MIB} MiB within {WRITE_TIMEOUT:?}", &ctr[..12]);
        }
        thread::sleep(Duration::from_millis(100));
    }
}
