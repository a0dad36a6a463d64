//! plegwatch in namespaces of its own, as the DaemonSet runs it (deploy/daemonset.yaml):
//! its own mount namespace (private: the host's later mounts do not show in it), with the
//! host's pid namespace (`hostPID: true`) or a pid namespace of its own over the host's
//! `/proc`. The kernel reports host pids, and the mounts that stall are the host's.
//!
//! - The umount2 stall of `umount_stall.rs`, its loop file system mounted on the host *after*
//!   plegwatch started (so its own mount table never had it): the same report, target and
//!   device included (from the host init's table, `/proc/1/mountinfo`), and no line about
//!   plegwatch's own threads (its self-filter uses its host pid, which the ready line names).
//! - A `/proc` of its own pid namespace (a container without `hostPID`): plegwatch refuses,
//!   naming the fix.
//!
//! containerd#9770 under the same wrapper is `containerd_9770_plegwatch.rs`'s
//! `status_lock_held_across_shim_umount_is_reported_from_a_container`.

use std::time::{Duration, Instant, SystemTime};

use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::namespaces::{self, HOST_PID, OWN_PID, OWN_PROC};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::stall::{assert_reported, CausedWait};
use plegwatch_scenarios::{incidents, preflight, LoopFs, Plegwatch, WriteThrottle};

const DIRTY: usize = 6 * MIB;
const THROTTLE_BPS: u64 = 1 << 20;
const WARN: Duration = Duration::from_secs(2);
/// Below this the umount did not really stall, and nothing about plegwatch can be concluded.
const REAL_STALL: Duration = Duration::from_secs(3);

#[test]
fn umount_stall_from_own_pid_and_mount_namespaces() -> anyhow::Result<()> {
    umount_stall_under("in_container (own pid ns)", OWN_PID, true)
}

#[test]
fn umount_stall_from_own_mount_namespace_with_host_pid() -> anyhow::Result<()> {
    umount_stall_under("in_container (hostPID)", HOST_PID, false)
}

#[test]
fn a_proc_of_another_pid_namespace_is_refused() -> anyhow::Result<()> {
    preflight::require();
    let mut plegwatch = Plegwatch::start_under(OWN_PROC, &["--warn", "2s", "--duration", "20s"])?;
    let err = plegwatch
        .wait_ready(READY_TIMEOUT)
        .err()
        .ok_or_else(|| anyhow::anyhow!("plegwatch started with a /proc that is not the host's"))?;
    let text = format!("{err:#}");
    assert!(text.contains("exited"), "plegwatch should exit at once: {text}");
    assert!(text.contains("not the host's") && text.contains("hostPID: true"), "the error should name the fix: {text}");
    Ok(())
}

fn umount_stall_under(scenario: &str, wrapper: &[&str], own_pid_ns: bool) -> anyhow::Result<()> {
    preflight::require();
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip(scenario, &why);
        return Ok(());
    }
    let mut plegwatch = Plegwatch::start_under(wrapper, &["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let me = std::process::id();
    let pw = plegwatch.pid();
    assert_ne!(namespaces::mount_ns(pw), namespaces::mount_ns(me), "plegwatch should have a mount namespace of its own");
    if own_pid_ns {
        assert_ne!(namespaces::pid_ns(pw), namespaces::pid_ns(me), "plegwatch should have a pid namespace of its own");
        assert_eq!(namespaces::ns_pid(pw), Some(1), "plegwatch is pid 1 of its namespace; the ready line named its host pid {pw}");
    } else {
        assert_eq!(namespaces::pid_ns(pw), namespaces::pid_ns(me), "hostPID: the host's pid namespace");
    }

    // Mounted after plegwatch's namespace was made: only the host's table has it.
    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let _throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    let target = fs.mount_point();
    let theirs = std::fs::read_to_string(format!("/proc/{pw}/mountinfo"))?;
    assert!(
        !theirs.contains(&format!(" {} ", target.display())),
        "{} shows in plegwatch's own mount table: its namespace is not private",
        target.display()
    );

    dirty::write_file(&target.join("dirty.bin"), DIRTY)?;
    let started_wall = SystemTime::now();
    let started = Instant::now();
    let (pid, measured) = fs.umount_timed()?;
    assert!(
        measured > REAL_STALL,
        "umount of {DIRTY} dirty bytes took only {measured:?}: the {THROTTLE_BPS} B/s throttle on {} did not take",
        fs.dev()
    );

    plegwatch.wait_for(Duration::from_secs(10), |e| e.is_about("resolved", pid));
    let events = plegwatch.stop()?;
    let report = assert_reported(
        &events,
        &CausedWait { kind: "umount", pid, tid: pid, comm: "umount", warn: WARN, started, started_wall, measured },
    );
    report.assert_detail(&fs.umount_tail_detail());
    let is_umount = |h: &serde_json::Value| h["kind"] == "umount" && h["pid"].as_u64() == Some(u64::from(pid));
    let i = incidents::the_one(&events, WARN, Some(started + measured), is_umount)?;
    let chain = incidents::Incident::chain(i.first());
    let text = incidents::chain_text(&chain);
    let device = chain.last().filter(|h| h["kind"] == "device").unwrap_or_else(|| panic!("no device hop:\n{text}"));
    assert!(
        device["what"].as_str().unwrap_or("").starts_with(&format!("block device {}", fs.dev())),
        "the device is the loop device {}:\n{text}",
        fs.dev()
    );

    let own = namespaces::lines_naming(&events, pw);
    assert!(own.is_empty(), "plegwatch reported its own threads (host pid {pw}):\n{}", own.join("\n"));
    eprintln!("{scenario}: plegwatch host pid {pw}; incident #{} chain:\n{text}", i.id);
    Ok(())
}
