//! plegwatch started in the middle of a CRI-O stall, as an SRE paged for it would: the
//! opLock stall of `crio_update_stopped` (an update whose runtime stopped under the
//! container's `opLock`, a second update and `ListContainerStats` parked behind it; see
//! `plegwatch_scenarios::crio::update_stall`) on real CRI-O 1.35.6, conmon 2.1.6 and runc
//! 1.1.5, all begun before plegwatch's probes were on.
//!
//! plegwatch must find it from outside: crio's goroutines, read from `/proc/PID/mem`, give
//! the handler, the update holding the lock (its lock read from the argument the update
//! keeps in its frame, checked against the lock's state) and the two waiters parked on the
//! lock's semaphores; the startup sweep gives the update's `waitid` on its runtime. One
//! incident, marked `started_before_attach`, from the handler down to the stopped runtime,
//! with both waiters in it, held by the update.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::crio::update_stall::UpdateStall;
use plegwatch_scenarios::crio::Crio;
use plegwatch_scenarios::events::Event;
use plegwatch_scenarios::incidents::{self, Incident};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};
use serde_json::Value;

/// How far into the stall plegwatch is started.
const START_INTO_STALL: Duration = Duration::from_secs(3);
/// With no GC in crio since the calls began, their ages are unknown and counted from when
/// they were found: a short `--warn`.
const WARN: Duration = Duration::from_secs(1);
/// How soon after `ready` the whole chain must show.
const WITHIN: Duration = Duration::from_secs(5);

/// The calls parked on the lock behind the update.
const WAITERS: [&str; 2] = [".(*Server).ListContainerStats", ".(*Server).UpdateContainerResources"];

/// A stall line of `function`, held by the update holding the opLock.
fn held_waiter(e: &Event, function: &str) -> bool {
    e.is("stall")
        && e.str("/detail/function").is_some_and(|s| s.ends_with(function))
        && e.str("/holder/what").is_some_and(|w| w.contains("UpdateContainer holding opLock"))
}

fn what(h: &Value) -> &str {
    h["what"].as_str().unwrap_or_default()
}

/// An incident line from a CRI handler down to the stopped runtime `pid`, through the
/// update holding the opLock.
fn whole_chain(e: &Event, pid: u32) -> bool {
    let chain = Incident::chain(e);
    e.is("incident")
        && chain.first().is_some_and(|h| h["kind"] == "cri_call")
        && chain.iter().any(|h| h["kind"] == "go_lock" && what(h).contains("UpdateContainer holding opLock"))
        && chain.last().is_some_and(|h| h["pid"].as_u64() == Some(u64::from(pid)))
}

#[test]
fn started_in_a_crio_stall_it_finds_the_lock_holder_and_its_waiters() -> Result<()> {
    preflight::require();
    if let Some(why) = Crio::missing() {
        preflight::skip("crio_before_attach", &why);
        return Ok(());
    }
    let crio = Crio::start()?;
    let stall = UpdateStall::stage(&crio, "criolate")?;
    let (stopped, ctr) = (stall.stopped, stall.ctr.clone());
    std::thread::sleep(START_INTO_STALL.saturating_sub(stall.stopped_at.elapsed()));

    let endpoint = format!("unix://{}", crio.dir().join("crio.sock").display());
    let mut plegwatch = Plegwatch::start(&["--warn", "1s", "--runtime-endpoint", &endpoint])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let ready = Instant::now();
    let at = plegwatch.wait_for(WITHIN, |e| whole_chain(e, stopped)).map(|_| Instant::now());
    // The waiters, found by the goroutine scan with no age, cross --warn a second after.
    for f in WAITERS {
        plegwatch.wait_for(WARN + Duration::from_secs(4), |e| held_waiter(e, f));
    }
    let lifted = Instant::now();
    let (pod, _) = stall.lift(&crio)?;
    plegwatch.wait_for(Duration::from_secs(5), |e| e.is("incident_resolved"));
    let events = plegwatch.stop()?;
    drop(pod);
    let all = || plegwatch_scenarios::events::dump(&events, ready);
    let at = at.with_context(|| format!("no incident from a handler through the opLock to pid {stopped} within {WITHIN:?}:\n{}", all()))?;

    let line = events.iter().find(|e| whole_chain(e, stopped)).context("the line")?;
    let chain = Incident::chain(line);
    let text = incidents::chain_text(&chain);
    eprintln!(
        "started {START_INTO_STALL:?} into the stall; the whole chain {:.3}s after ready:\n{text}",
        at.duration_since(ready).as_secs_f64()
    );
    assert_eq!(line.get("/started_before_attach"), Some(&serde_json::json!(true)), "{text}");
    // A handler leads it: the update's own (its nested call), or a waiter parked on the
    // lock (which of them is the oldest found is up to the scan).
    let kinds: Vec<&str> = chain.iter().map(|h| h["kind"].as_str().unwrap_or("?")).collect();
    assert_eq!(kinds, ["cri_call", "go_lock", "child_wait", "process"], "{text}");
    assert!(WAITERS.iter().any(|f| what(&chain[0]).contains(&f[1..])), "{text}");
    let link = |n: usize| (chain[n]["edge"].as_str(), chain[n]["exactness"].as_str());
    assert!(matches!(link(0), (Some("nested_call" | "go_lock"), Some("exact"))), "{text}");
    assert_eq!(link(1), (Some("same_goroutine"), Some("exact")), "the update's goroutine waits on its runtime:\n{text}");
    assert_eq!(link(2), (Some("child"), Some("exact")), "{text}");
    assert!(what(&chain[3]).contains("state T"), "{text}");
    let field = |k: &str| chain[3].get(k).and_then(Value::as_str);
    assert_eq!(
        (field("pod"), field("container"), field("container_id")),
        (Some("criolate"), Some("sleeper"), Some(ctr.as_str())),
        "{text}"
    );
    assert!(chain[1]["goroutine"].as_str().is_some_and(|g| g.starts_with("0xc")), "the holder's goroutine: {text}");
    // Found, not seen starting: their ages say so.
    for h in &chain[..2] {
        assert!(matches!(h["start"].as_str(), Some("waitsince" | "unknown")), "{h}\n{text}");
    }
    assert_eq!(chain[2]["start"].as_str(), Some("lower_bound"), "the swept waitid: {text}");

    // The two waiters, parked on the lock's semaphores before plegwatch started: each held
    // by the update, in the incident.
    let id = line.u64("/id");
    let in_incident = |e: &Event| {
        let wait = e.u64("/id");
        events
            .iter()
            .filter(|l| l.is("incident") && l.u64("/id") == id)
            .any(|l| l.get("/waits").and_then(Value::as_array).is_some_and(|w| w.iter().any(|x| x.as_u64() == wait)))
    };
    for f in WAITERS {
        let stall =
            events.iter().find(|e| held_waiter(e, f)).with_context(|| format!("no stall for {f} held by the update:\n{}", all()))?;
        assert!(in_incident(stall), "{f}'s wait is not in the incident:\n{}", all());
        ensure!(stall.at < lifted, "{f} was reported only after the lift");
    }
    // The waiting update, begun before the probes, names its container: read from the
    // request its frame keeps (no entry probe saw it).
    let update = events.iter().find(|e| held_waiter(e, WAITERS[1])).context("the waiting update")?;
    assert_eq!(update.str("/detail/container"), Some(ctr.as_str()), "the waiting update's container: {}", update.json);
    // The goroutine scan of crio, and the container the handler names.
    let scan = events.iter().find(|e| e.is("goroutine_scan") && e.u64("/pid") == Some(u64::from(crio.pid())));
    let scan = scan.with_context(|| format!("no goroutine_scan of crio:\n{}", all()))?;
    assert_eq!(scan.get("/error"), None, "{}", all());
    eprintln!(
        "goroutine scan of crio: {} goroutines, {} open calls, {:.1} ms; container {}",
        scan.u64("/goroutines").unwrap_or(0),
        scan.u64("/open_calls").unwrap_or(0),
        scan.f64("/took_ms").unwrap_or(0.0),
        &ctr[..12]
    );
    let sweep = events.iter().find(|e| e.is("sweep")).with_context(|| format!("no sweep line:\n{}", all()))?;
    ensure!(sweep.u64("/child_waits").is_some_and(|n| n >= 1), "the sweep found no child wait: {}", sweep.json);
    Ok(())
}
