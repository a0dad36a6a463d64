//! Go waits begun before plegwatch started, found by reading the goroutines from outside.
//!
//! The target is the fake-kubelet FIXTURE (a stripped Go program carrying kubelet's
//! `(*GenericPLEG).Relist` symbol; not kubelet: see `plegwatch_scenarios::gofixture`). Its
//! relist is parked before plegwatch starts, and the fixture runs two GCs (`gc`, as a
//! real kubelet's GCs do), which stamp each parked goroutine's `waitsince`. plegwatch's
//! uprobes never saw that relist begin: it must find it in the goroutines it reads from
//! `/proc/PID/mem` once the probes are on, report it open at once with its age, and time
//! its end with the RET probe.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use plegwatch_scenarios::events::{dump, Event};
use plegwatch_scenarios::gofixture::{self, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

/// How long the relist is parked before plegwatch starts.
const PARKED: Duration = Duration::from_secs(6);
/// How soon after `ready` the relist must be reported.
const REPORT_WITHIN: Duration = Duration::from_secs(2);

/// The fixture with its next relist parked (plain gate, or in `RLock` behind a held
/// write lock), the parked goroutines stamped by two GCs, and `PARKED` elapsed; returns
/// the fixture, when the relist started (the fixture's clock, s) and when it was parked
/// here, and the write lock's address with `rlock`.
fn parked_before_attach(rlock: bool) -> anyhow::Result<(FakeKubelet, Instant, Option<u64>)> {
    let bin = gofixture::build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start(&bin)?;
    kubelet.wait_relist_start(Duration::from_secs(3)).context("the fixture does not relist")?;
    let lock = if rlock {
        let lock = kubelet.wlock()?;
        // The relist under way may be the one that parks (if it had not read the pods yet).
        kubelet.wait_rlock_parked(Duration::from_secs(3)).context("no relist parked in RLock behind the write lock")?;
        Some(lock)
    } else {
        kubelet.block_next()?;
        kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after parking")?;
        None
    };
    let parked_at = Instant::now();
    std::thread::sleep(Duration::from_millis(300));
    kubelet.gc()?;
    std::thread::sleep(PARKED.saturating_sub(parked_at.elapsed()));
    Ok((kubelet, parked_at, lock))
}

/// plegwatch started with the relist parked: its ready line's time, and the lines up to
/// the relist's report (or `REPORT_WITHIN` after ready).
fn watch(pid: u32) -> anyhow::Result<(Plegwatch, Instant, Option<Event>)> {
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let ready = Instant::now();
    let stall = plegwatch.wait_for(REPORT_WITHIN, |e| e.is_about_pid("stall", pid) && e.str("/kind") == Some("pleg_relist"));
    Ok((plegwatch, ready, stall))
}

#[test]
fn a_relist_parked_before_start_is_reported_open_with_its_age() -> anyhow::Result<()> {
    preflight::require();
    let (mut kubelet, parked_at, _) = parked_before_attach(false)?;
    let pid = kubelet.pid();
    let (mut plegwatch, ready, stall) = watch(pid)?;
    let seen_at = Instant::now();
    let parked_s = parked_at.elapsed().as_secs_f64();
    let incident = plegwatch
        .wait_for(Duration::from_secs(2), |e| e.is("incident") && e.get("/chain/0/pid").and_then(|p| p.as_u64()) == Some(u64::from(pid)));
    kubelet.release()?;
    plegwatch.wait_for(Duration::from_secs(3), |e| e.is_about_pid("resolved", pid));
    let events = plegwatch.stop()?;
    let status = kubelet.quit()?;
    let all = || dump(&events, parked_at);
    assert!(status.success(), "the fixture exited badly: {status}");

    let scan = events
        .iter()
        .find(|e| e.is("goroutine_scan") && e.u64("/pid") == Some(u64::from(pid)))
        .unwrap_or_else(|| panic!("no goroutine_scan line for pid {pid}:\n{}", all()));
    assert_eq!(scan.get("/error"), None, "{}", all());
    assert!(scan.u64("/goroutines").unwrap_or(0) >= 3, "{}", all());
    assert!(scan.u64("/open_calls").unwrap_or(0) >= 1, "{}", all());
    eprintln!("goroutine scan: {:?}", scan.get("").map(|v| v.to_string()));

    let stall = stall.unwrap_or_else(|| panic!("no pleg_relist stall within {REPORT_WITHIN:?} of ready:\n{}", all()));
    let after_ready = seen_at.duration_since(ready);
    assert!(after_ready <= REPORT_WITHIN, "reported {after_ready:?} after ready");
    assert_eq!(stall.get("/started_before_attach"), Some(&serde_json::json!(true)), "{}", all());
    assert!(stall.str("/detail/found_by").is_some_and(|s| s.contains("goroutine scan")), "{}", all());
    assert!(stall.str("/detail/age").is_some_and(|s| s.contains("waitsince")), "{}", all());
    // The age comes from waitsince, stamped by the fixture's GCs after it parked: no
    // lower than the time the relist has been parked, less 1 s.
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    let real = parked_s - seen_at.elapsed().as_secs_f64();
    eprintln!("relist parked {real:.2}s when reported; plegwatch says {waited:.2}s");
    assert!(waited >= real - 1.0 && waited <= real + 2.0, "waited_s {waited:.2} vs parked {real:.2}s:\n{}", all());
    // The budget clock runs from that age.
    let budget = stall.f64("/budget_used").unwrap_or(f64::NAN);
    assert!((budget - waited / 180.0).abs() < 1e-6, "budget_used {budget}:\n{}", all());

    // One incident, led by the relist, marked as begun before attach.
    let incident = incident.unwrap_or_else(|| panic!("no incident for the parked relist:\n{}", all()));
    assert_eq!(incident.str("/chain/0/kind"), Some("pleg_relist"), "{}", all());
    assert_eq!(incident.get("/started_before_attach"), Some(&serde_json::json!(true)), "{}", all());
    assert_eq!(incident.str("/chain/0/start"), Some("waitsince"), "{}", all());

    // Its end is timed by the RET probe, as for a relist the entry probe saw.
    let resolved = events
        .iter()
        .find(|e| e.is("resolved") && e.u64("/id") == stall.u64("/id"))
        .unwrap_or_else(|| panic!("no resolved line for the parked relist:\n{}", all()));
    assert_eq!(resolved.str("/timing"), Some("exact"), "{}", all());
    Ok(())
}

/// A relist parked in `RLock` before start: the lock it waits on is read from the
/// goroutine's stack (the semaphore address `runtime.semacquire1` keeps in its argument
/// slot), and it is the very lock the fixture's writer holds.
#[test]
fn a_relist_parked_in_rlock_before_start_names_its_lock() -> anyhow::Result<()> {
    preflight::require();
    let (mut kubelet, parked_at, lock) = parked_before_attach(true)?;
    let pid = kubelet.pid();
    let lock = lock.context("the fixture gave no lock address")?;
    let (plegwatch, _ready, stall) = watch(pid)?;
    kubelet.wunlock()?;
    let events = plegwatch.stop()?;
    let _ = kubelet.quit()?;
    let all = || dump(&events, parked_at);
    let stall = stall.unwrap_or_else(|| panic!("no pleg_relist stall within {REPORT_WITHIN:?} of ready:\n{}", all()));
    assert_eq!(stall.get("/started_before_attach"), Some(&serde_json::json!(true)), "{}", all());
    assert_eq!(stall.str("/detail/reader_wait/lock"), Some(format!("{lock:#x}").as_str()), "{}", all());
    Ok(())
}

/// A Go version the goroutine layout table does not know (the fixture's binary with its
/// version strings rewritten from go1.19 to go1.20, a release no toolchain was at hand to
/// check the layout on): its goroutines are not read, the `goroutine_scan` line names the
/// version, and every other probe goes on: the relist, parked after start, is reported by
/// its uprobes as usual.
#[test]
fn an_unknown_go_version_is_named_and_the_probes_go_on() -> anyhow::Result<()> {
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let mut data = std::fs::read(&bin)?;
    let (from, to) = (b"go1.19.".as_slice(), b"go1.20.".as_slice());
    let mut patched = 0;
    let mut i = 0;
    while i + from.len() <= data.len() {
        if &data[i..i + from.len()] == from {
            data[i..i + to.len()].copy_from_slice(to);
            patched += 1;
            i += from.len();
        } else {
            i += 1;
        }
    }
    anyhow::ensure!(patched > 0, "no go1.19 version string in {}", bin.display());
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("fake-kubelet");
    std::fs::write(&copy, &data)?;
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let mut kubelet = FakeKubelet::start(&copy)?;
    let pid = kubelet.pid();
    kubelet.wait_relist_start(Duration::from_secs(3)).context("the patched fixture does not relist")?;
    let started = Instant::now();
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    plegwatch.wait_probed(pid, Duration::from_secs(5))?;
    let scan = plegwatch.wait_for(Duration::from_secs(5), |e| e.is("goroutine_scan") && e.u64("/pid") == Some(u64::from(pid)));
    kubelet.block_next()?;
    kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
    let stall = plegwatch.wait_for(Duration::from_secs(5), |e| e.is_about_pid("stall", pid));
    kubelet.release()?;
    let events = plegwatch.stop()?;
    let _ = kubelet.quit()?;
    let all = || dump(&events, started);
    let scan = scan.unwrap_or_else(|| panic!("no goroutine_scan line for pid {pid}:\n{}", all()));
    let error = scan.str("/error").unwrap_or_else(|| panic!("the scan of an unknown version gave no error:\n{}", all()));
    assert!(error.contains("go1.20"), "the error names the version: {error}");
    assert_eq!(scan.u64("/goroutines"), Some(0), "{}", all());
    let stall = stall.unwrap_or_else(|| panic!("the relist parked after start was not reported:\n{}", all()));
    assert_eq!(stall.str("/kind"), Some("pleg_relist"), "{}", all());
    assert_eq!(stall.get("/started_before_attach"), Some(&serde_json::json!(false)), "{}", all());
    eprintln!("unknown version: {error}");
    Ok(())
}
