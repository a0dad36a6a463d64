//! Go targets that restart or are upgraded while plegwatch runs.
//!
//! Uprobes live on a binary's inode, so a restarted process of the same file is covered at
//! once; an upgrade is a new inode that needs new probes. plegwatch sees every `execve`
//! (tracepoint `sched:sched_process_exec`) and must, within 2 s of the new process starting,
//! print a `target` line for it (`traced` for a known binary, `probed` for a new one) and
//! then see its calls.
//! - The fake-kubelet FIXTURE (a small stripped Go 1.19 program carrying kubelet's relist
//!   symbol; not kubelet): started, restarted, and "upgraded" to a copy of the binary; each
//!   time a parked relist must be reported for the new process.
//! - Debian's containerd 1.6.20: restarted; the calls made to the new process must show in
//!   plegwatch's latency tables.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::containerd::{self, Containerd, Placement};
use plegwatch_scenarios::events::{dump, Event};
use plegwatch_scenarios::gofixture::{self, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

/// The bound: a restarted target is traced again within this.
const TRACED_WITHIN: Duration = Duration::from_secs(2);

/// Waits for the `target` line about `pid` and checks it came within [`TRACED_WITHIN`] of
/// `spawned` with one of the statuses `status` (`|`-separated).
fn target_line(plegwatch: &mut Plegwatch, pid: u32, spawned: Instant, status: &str) -> Event {
    let line = plegwatch.wait_for(TRACED_WITHIN + Duration::from_secs(3), |e| e.is("target") && e.u64("/pid") == Some(u64::from(pid)));
    let all = dump(plegwatch.events(), spawned);
    let line = line.unwrap_or_else(|| panic!("no target line for pid {pid}:\n{all}"));
    let after = line.at.saturating_duration_since(spawned);
    assert!(after <= TRACED_WITHIN, "pid {pid} traced {:.3}s after it started:\n{all}", after.as_secs_f64());
    let got = line.str("/status").unwrap_or_default();
    assert!(status.split('|').any(|s| s == got), "status {got}, expected {status}:\n{all}");
    eprintln!("pid {pid}: target line {status} after {:.3}s (found by {:?})", after.as_secs_f64(), line.str("/found_by"));
    line
}

/// Parks one relist of `kubelet` and checks plegwatch reports it, then lets it go.
fn parked_relist_is_reported(plegwatch: &mut Plegwatch, kubelet: &mut FakeKubelet) -> Result<()> {
    let pid = kubelet.pid();
    kubelet.block_next()?;
    let parked = Instant::now();
    kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
    let stall = plegwatch.wait_for(Duration::from_secs(4), |e| e.is_about_pid("stall", pid) && e.str("/kind") == Some("pleg_relist"));
    kubelet.release()?;
    let all = dump(plegwatch.events(), parked);
    ensure!(stall.is_some(), "no pleg_relist stall for pid {pid} after a restart:\n{all}");
    ensure!(kubelet.is_running(), "the fixture (pid {pid}) died under the probes");
    Ok(())
}

#[test]
fn restarted_and_upgraded_fixture_is_traced_within_2s() -> Result<()> {
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let mut plegwatch = Plegwatch::start(&["--warn", "1s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    // First start: the binary is new to plegwatch, found at exec.
    let spawned = Instant::now();
    let mut first = FakeKubelet::start(&bin)?;
    let line = target_line(&mut plegwatch, first.pid(), spawned, "probed");
    assert_eq!(line.str("/found_by"), Some("exec"), "{}", dump(plegwatch.events(), spawned));
    parked_relist_is_reported(&mut plegwatch, &mut first)?;
    ensure!(first.quit()?.success(), "the fixture exited badly under the probes");

    // Restart: the same file, a new process.
    let spawned = Instant::now();
    let mut again = FakeKubelet::start(&bin)?;
    target_line(&mut plegwatch, again.pid(), spawned, "traced");
    parked_relist_is_reported(&mut plegwatch, &mut again)?;
    ensure!(again.quit()?.success(), "the restarted fixture exited badly under the probes");

    // Upgrade: a new file (new inode) under the same name.
    let dir = tempdir("upgrade")?;
    let copy = dir.join("fake-kubelet");
    std::fs::copy(&bin, &copy).context("copying the fixture")?;
    let spawned = Instant::now();
    let mut upgraded = FakeKubelet::start(&copy)?;
    let line = target_line(&mut plegwatch, upgraded.pid(), spawned, "probed");
    assert_eq!(line.str("/binary"), copy.to_str(), "{}", dump(plegwatch.events(), spawned));
    parked_relist_is_reported(&mut plegwatch, &mut upgraded)?;
    ensure!(upgraded.quit()?.success(), "the upgraded fixture exited badly under the probes");

    let events = plegwatch.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    let summary = events.iter().find(|e| e.is("summary")).context("no summary")?;
    let relists = summary.get("/relists").and_then(|v| v.as_array()).map(Vec::len).unwrap_or(0);
    assert_eq!(relists, 3, "one relist clock per fixture process:\n{}", dump(&events, spawned));
    Ok(())
}

#[test]
fn restarted_containerd_is_traced_within_2s() -> Result<()> {
    preflight::require();
    containerd::require();
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    // `traced` when another containerd of the same binary already runs on the node.
    let spawned = Instant::now();
    let first = Containerd::start(Placement::TempDir)?;
    target_line(&mut plegwatch, first.pid(), spawned, "probed|traced");
    drop(first);

    let spawned = Instant::now();
    let second = Containerd::start(Placement::TempDir)?;
    target_line(&mut plegwatch, second.pid(), spawned, "traced");
    // Calls to the new process only: the latency table must count them.
    let cri = second.cri()?;
    const CALLS: u64 = 20;
    for _ in 0..CALLS {
        cri.list_containers()?;
    }
    std::thread::sleep(Duration::from_millis(500));
    ensure!(cri.version().is_ok(), "containerd stopped answering under the probes");
    let events = plegwatch.stop()?;
    let all = || dump(&events, spawned);
    let summary = events.iter().find(|e| e.is("summary")).context("no summary")?;
    let rows = summary.get("/go_latency").and_then(|v| v.as_array()).cloned().unwrap_or_default();
    let list = rows
        .iter()
        .find(|r| r["target"] == "containerd" && r["function"].as_str().is_some_and(|f| f.ends_with(".(*criService).ListContainers")))
        .unwrap_or_else(|| panic!("no ListContainers latency row:\n{}", all()));
    let count = list["count"].as_u64().unwrap_or(0);
    assert!(count >= CALLS, "{count} ListContainers calls seen, {CALLS} made to the restarted containerd:\n{}", all());
    Ok(())
}

/// A fresh directory under the system temp dir.
fn tempdir(tag: &str) -> Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("plegwatch-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// Upgrades that replace the binary on disk: once no process runs an old copy and its file
/// is gone, plegwatch gives its probes and function ids back (before, ids were never reused
/// and after a few dozen upgrades nothing new was probed). Every new copy is still probed.
#[test]
fn upgraded_binaries_give_their_ids_back() -> Result<()> {
    const UPGRADES: usize = 4;
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let mut plegwatch = Plegwatch::start(&["--warn", "1s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let dir = tempdir("retire")?;
    let started = Instant::now();
    for n in 0..UPGRADES {
        // Each upgrade: a new file (new inode) at a new path, run, stopped, then deleted.
        let copy = dir.join(format!("fake-kubelet-{n}"));
        std::fs::copy(&bin, &copy).context("copying the fixture")?;
        let spawned = Instant::now();
        let kubelet = FakeKubelet::start(&copy)?;
        target_line(&mut plegwatch, kubelet.pid(), spawned, "probed");
        ensure!(kubelet.quit()?.success(), "the fixture exited badly under the probes");
        std::fs::remove_file(&copy).context("deleting the old copy")?;
    }
    // The 2 s poll notices each deleted copy, and says so in a `retired` target line.
    for n in 0..UPGRADES {
        let copy = dir.join(format!("fake-kubelet-{n}")).display().to_string();
        let retired = plegwatch.wait_for(Duration::from_secs(10), |e| {
            e.is("target") && e.str("/status") == Some("retired") && e.str("/binary") == Some(copy.as_str())
        });
        ensure!(retired.is_some(), "no retired line for {copy} within 10 s of the last upgrade");
    }
    let events = plegwatch.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    let summary = events.iter().find(|e| e.is("summary")).context("no summary")?;
    let retired = summary.u64("/go_binaries_retired").unwrap_or(0);
    assert!(
        retired >= UPGRADES as u64,
        "{retired} binaries retired after {UPGRADES} upgrades whose old copies were deleted:\n{}",
        dump(&events, started)
    );
    eprintln!("{retired} binaries retired; {} function ids in use at exit", summary.u64("/go_funcs_in_use").unwrap_or(0));
    Ok(())
}
