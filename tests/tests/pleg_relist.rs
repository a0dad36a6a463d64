//! kubelet's relist clock, read with uprobes on a stripped Go binary.
//!
//! The target is the fake-kubelet FIXTURE (a small Go 1.19 program built here and stripped
//! with `-s -w`, not kubelet: see `plegwatch_scenarios::gofixture`). It carries kubelet's
//! symbol `k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Relist` in `.gopclntab` only,
//! relists every second, and parks one relist on command. plegwatch must find it by itself,
//! put uprobes at the function's entry and at every RET (no uretprobe), report the parked
//! relist as `pleg_relist` once it crosses `--warn`, time its end, and not crash it.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::gofixture::{self, FakeKubelet, RELIST_SYMBOL};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{incidents, preflight, Plegwatch};

const WARN_S: f64 = 2.0;
const SLACK_S: f64 = 1.0;
const HOLD: Duration = Duration::from_secs(4);

#[test]
fn a_parked_relist_is_reported_then_timed() -> anyhow::Result<()> {
    parked_relist(None)
}

/// The same with the probe points found by their place in the code, as on kernels
/// without uprobe attach cookies (Linux 5.10 to 5.14), forced here on one that has them.
#[test]
fn a_parked_relist_is_reported_then_timed_by_address() -> anyhow::Result<()> {
    parked_relist(Some("address"))
}

fn parked_relist(uprobes: Option<&str>) -> anyhow::Result<()> {
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start(&bin)?;
    let pid = kubelet.pid();
    // Let it relist normally first, so a completed relist is seen too.
    kubelet.wait_relist_start(Duration::from_secs(3)).context("the fixture does not relist")?;

    let mut args = vec!["--warn", "2s"];
    if let Some(how) = uprobes {
        args.extend(["--go-uprobes", how]);
    }
    let mut plegwatch = Plegwatch::start(&args)?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    // Found by the startup scan: its uprobes are on once the target line is out.
    let probed = plegwatch.wait_probed(pid, Duration::from_secs(5))?;
    if let Some(how) = uprobes {
        assert_eq!(probed.str("/uprobes"), Some(how), "the target line: {probed:?}");
    }

    kubelet.block_next()?;
    let n = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
    let parked_at = Instant::now();
    let stall = plegwatch.wait_for(Duration::from_secs_f64(WARN_S + SLACK_S + 1.0), |e| e.is_about_pid("stall", pid));
    let remaining = HOLD.saturating_sub(parked_at.elapsed());
    std::thread::sleep(remaining);
    anyhow::ensure!(kubelet.is_running(), "the fixture (pid {pid}) died while probed");
    kubelet.release()?;
    let end = kubelet.wait_relist_end(n, Duration::from_secs(3)).context("the parked relist never ended")?;
    let start = kubelet.relist(n).map(|r| r.start).context("no start time for the parked relist")?;
    let held_s = end - start;
    // It keeps relisting under the probes.
    let next = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist after the parked one")?;
    anyhow::ensure!(kubelet.wait_relist_end(next, Duration::from_secs(3)).is_some(), "relist {next} did not end");
    // Its `end` line comes before its RET: stopping plegwatch on it could beat the return
    // probe (a fresh-clone CI run counted 1 relist of 2, under load).
    anyhow::ensure!(kubelet.wait_relist_returned(next, Duration::from_secs(3)), "relist {next} did not return");
    plegwatch.wait_for(Duration::from_secs(3), |e| e.is_about_pid("resolved", pid));
    anyhow::ensure!(kubelet.is_running(), "the fixture (pid {pid}) died while probed");
    let events = plegwatch.stop()?;
    let status = kubelet.quit()?;
    assert!(status.success(), "the fixture exited badly under the probes: {status}");
    let all = || dump(&events, parked_at);

    let stall = stall.unwrap_or_else(|| panic!("no pleg_relist stall for the parked relist of pid {pid}:\n{}", all()));
    assert_eq!(stall.str("/kind"), Some("pleg_relist"), "{}", all());
    assert_eq!(stall.str("/level"), Some("warn"), "{}", all());
    assert_eq!(stall.str("/comm"), Some("fake-kubelet"), "{}", all());
    assert_eq!(stall.str("/detail/function"), Some(RELIST_SYMBOL), "{}", all());
    let arrived = stall.at.duration_since(parked_at).as_secs_f64();
    assert!(arrived <= WARN_S + SLACK_S, "reported {arrived:.3}s after the relist started:\n{}", all());
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    assert!((WARN_S..=WARN_S + SLACK_S).contains(&waited), "waited_s {waited}:\n{}", all());
    let budget = stall.f64("/budget_used").unwrap_or(f64::NAN);
    assert!((budget - waited / 180.0).abs() < 1e-6, "budget_used {budget}:\n{}", all());

    let resolved = events
        .iter()
        .find(|e| e.is("resolved") && e.u64("/id") == stall.u64("/id"))
        .unwrap_or_else(|| panic!("no resolved line for the parked relist:\n{}", all()));
    assert_eq!(resolved.str("/timing"), Some("exact"), "{}", all());
    let total = resolved.f64("/waited_s").unwrap_or(f64::NAN);
    assert!((total - held_s).abs() < 0.1, "resolved waited_s {total} vs the fixture's own relist duration {held_s:.3}s:\n{}", all());
    // Exactly one report for that relist, and none for the relists that ran normally.
    let stalls = events.iter().filter(|e| e.is("stall") && e.u64("/pid") == Some(u64::from(pid))).count();
    assert_eq!(stalls, 1, "{}", all());
    // The summary's relist clock for that kubelet: relists counted, none open, and the
    // parked one among the recent relists with the fixture's own duration.
    let summary = events.iter().find(|e| e.is("summary")).unwrap_or_else(|| panic!("no summary:\n{}", all()));
    let clock = summary
        .get("/relists")
        .and_then(|v| v.as_array())
        .and_then(|a| a.iter().find(|c| c["pid"].as_u64() == Some(u64::from(pid))))
        .unwrap_or_else(|| panic!("no relist clock for pid {pid}:\n{}", all()));
    assert!(clock["relists"].as_u64().unwrap_or(0) >= 2, "{clock}");
    assert_eq!(clock["open_now"], false, "{clock}");
    let recent = clock["recent"].as_array().cloned().unwrap_or_default();
    assert!(
        recent.iter().any(|r| (r["took_s"].as_f64().unwrap_or(f64::NAN) - held_s).abs() < 0.1),
        "the parked relist ({held_s:.3}s) is not among the recent relists: {clock}"
    );
    Ok(())
}

/// kubelet relists on one long-lived goroutine, so every PLEG stall of a node is the same
/// (process, goroutine, function). Three relists parked in one run must be three stalls,
/// each with its own id, each resolved exactly by its own end (a later one's end record
/// was once taken for the first's and dropped, and it resolved ~2 s late, "approximate").
#[test]
fn three_parked_relists_are_three_stalls_each_timed() -> anyhow::Result<()> {
    let (mut kubelet, mut plegwatch) = relisting_under_plegwatch()?;
    let pid = kubelet.pid();
    let origin = Instant::now();
    let mut rounds = Vec::new();
    for round in 0..3 {
        kubelet.block_next()?;
        let n = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
        let parked_at = Instant::now();
        let seen: Vec<u64> = rounds.iter().map(|(id, _)| *id).collect();
        let stall = plegwatch.wait_for(Duration::from_secs_f64(WARN_S + SLACK_S + 1.0), |e| {
            e.is_about_pid("stall", pid) && e.u64("/id").is_some_and(|id| !seen.contains(&id))
        });
        std::thread::sleep(HOLD.saturating_sub(parked_at.elapsed()));
        kubelet.release()?;
        let end = kubelet.wait_relist_end(n, Duration::from_secs(3)).context("the parked relist never ended")?;
        let start = kubelet.relist(n).map(|r| r.start).context("no start time for the parked relist")?;
        let stall =
            stall.unwrap_or_else(|| panic!("round {round}: no new stall for the parked relist {n}:\n{}", dump(plegwatch.events(), origin)));
        let id = stall.u64("/id").unwrap_or(0);
        let resolved = plegwatch.wait_for(Duration::from_secs(3), |e| e.is("resolved") && e.u64("/id") == Some(id));
        let resolved =
            resolved.unwrap_or_else(|| panic!("round {round}: stall {id} never resolved:\n{}", dump(plegwatch.events(), origin)));
        rounds.push((id, (end - start, resolved)));
    }
    let events = plegwatch.stop()?;
    kubelet.quit()?;
    let all = || dump(&events, origin);
    for (round, (id, (held_s, resolved))) in rounds.iter().enumerate() {
        assert_eq!(resolved.str("/timing"), Some("exact"), "round {round}, stall {id}:\n{}", all());
        let total = resolved.f64("/waited_s").unwrap_or(f64::NAN);
        assert!((total - held_s).abs() < 0.1, "round {round}: resolved waited_s {total} vs the fixture's {held_s:.3}s:\n{}", all());
    }
    let stalls = events.iter().filter(|e| e.is("stall") && e.u64("/pid") == Some(u64::from(pid))).count();
    assert_eq!(stalls, 3, "one stall line per parked relist:\n{}", all());
    Ok(())
}

/// The fixture relisting, and `plegwatch watch --warn 2s` ready with the fixture's uprobes
/// attached and one whole relist seen by them (the relist clock starts from it).
fn relisting_under_plegwatch() -> anyhow::Result<(FakeKubelet, Plegwatch)> {
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start(&bin)?;
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    plegwatch.wait_probed(kubelet.pid(), Duration::from_secs(5))?;
    let probed = gofixture::monotonic_now();
    let n = kubelet.wait_relist_started_since(probed, Duration::from_secs(3)).context("no relist after the fixture was probed")?;
    kubelet.wait_relist_end(n, Duration::from_secs(3)).context("the first probed relist did not end")?;
    Ok((kubelet, plegwatch))
}

/// A relist loop stuck outside `Relist` (no relist open, none started since one was due) is
/// an incident of its own, raised within 1 s of --warn after the missed relist was due, and
/// resolved when the loop goes on; the relists before it raised nothing.
#[test]
fn an_overdue_relist_with_none_open_is_an_incident() -> anyhow::Result<()> {
    let (mut kubelet, mut plegwatch) = relisting_under_plegwatch()?;
    let pid = kubelet.pid();
    let before = kubelet.wait_relist_start(Duration::from_secs(3)).context("the fixture does not relist")?;
    anyhow::ensure!(kubelet.wait_relist_end(before, Duration::from_secs(3)).is_some(), "relist {before} did not end");
    kubelet.hold_loop()?;
    let held = Instant::now();
    let overdue = |h: &serde_json::Value| {
        h["kind"] == "pleg_relist"
            && h["pid"].as_u64() == Some(u64::from(pid))
            && h["what"].as_str().is_some_and(|w| w.contains("no relist started"))
    };
    let raised = plegwatch.wait_for(Duration::from_secs(8), |e| e.is("incident") && incidents::Incident::chain(e).iter().any(overdue));
    kubelet.release_loop()?;
    let released = Instant::now();
    let next = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist after the loop was released")?;
    anyhow::ensure!(kubelet.wait_relist_end(next, Duration::from_secs(3)).is_some(), "relist {next} did not end");
    plegwatch.wait_for(Duration::from_secs(3), |e| e.is("incident_resolved"));
    let events = plegwatch.stop()?;
    let status = kubelet.quit()?;
    assert!(status.success(), "the fixture exited badly: {status}");
    let all = || dump(&events, held);
    assert!(raised.is_some(), "no incident for the held relist loop:\n{}", all());
    let i =
        incidents::the_one(&events, Duration::from_secs_f64(WARN_S), Some(released), overdue).unwrap_or_else(|e| panic!("{e}\n{}", all()));
    // Nothing about this kubelet before the hold: normal relists are not incidents.
    let early = incidents::incidents(&events)
        .into_iter()
        .filter(|x| x.id != i.id && x.any_hop(|h| h["pid"].as_u64() == Some(u64::from(pid))))
        .count();
    assert_eq!(early, 0, "other incidents for the fixture:\n{}", all());
    eprintln!(
        "overdue-relist incident #{} raised {:.3}s after crossing --warn ({:.3}s after the hold): {}",
        i.id,
        i.raised_after_warn(Duration::from_secs_f64(WARN_S)).as_secs_f64(),
        i.first().at.duration_since(held).as_secs_f64(),
        incidents::chain_text(&incidents::Incident::chain(i.first()))
    );
    Ok(())
}

/// A relist whose goroutine ends inside `Relist` (`runtime.Goexit`, as when a panic unwinds
/// past it) never returns through a probed RET. plegwatch sees the goroutine end
/// (`runtime.goexit0`) and drops the call, counted, instead of reporting a relist open for
/// ever; the dead relist loop then shows as an overdue relist.
#[test]
fn a_relist_whose_goroutine_ends_is_dropped_not_reported() -> anyhow::Result<()> {
    let (mut kubelet, mut plegwatch) = relisting_under_plegwatch()?;
    let pid = kubelet.pid();
    kubelet.goexit_next()?;
    let gone = Instant::now();
    kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after goexit")?;
    let overdue = |h: &serde_json::Value| {
        h["kind"] == "pleg_relist"
            && h["pid"].as_u64() == Some(u64::from(pid))
            && h["what"].as_str().is_some_and(|w| w.contains("no relist started"))
    };
    let raised = plegwatch.wait_for(Duration::from_secs(6), |e| e.is("incident") && incidents::Incident::chain(e).iter().any(overdue));
    anyhow::ensure!(kubelet.is_running(), "the fixture (pid {pid}) died");
    let events = plegwatch.stop()?;
    let _ = kubelet.quit();
    let all = || dump(&events, gone);
    let open_relist = events.iter().find(|e| e.is_about_pid("stall", pid) && e.str("/kind") == Some("pleg_relist"));
    assert!(open_relist.is_none(), "the relist whose goroutine ended was reported as still open:\n{}", all());
    let summary = events.iter().rev().find(|e| e.is("summary")).expect("stop() checks for a summary");
    let orphaned = summary.u64("/go_calls_orphaned").unwrap_or(0);
    assert!(orphaned >= 1, "no Go call counted as orphaned:\n{}", all());
    assert!(raised.is_some(), "the dead relist loop was not an overdue-relist incident:\n{}", all());
    eprintln!(
        "{orphaned} orphaned Go call(s) dropped; overdue-relist incident raised {:.3}s after the goroutine ended",
        raised.map(|r| r.at.duration_since(gone).as_secs_f64()).unwrap_or(f64::NAN)
    );
    Ok(())
}
