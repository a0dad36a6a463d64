//! containerd restarted in the middle of an incident (issue 12): the new containerd is
//! traced again within 2 s, and the incident keeps what it had.
//!
//! The incident: a relist of the fake-kubelet FIXTURE (a stripped Go program carrying
//! kubelet's relist symbol; not kubelet) in CRI mode against a private Debian containerd
//! 1.6.20, parked (`block`) before its CRI calls, so its chain is the relist alone and does
//! not die with containerd. While it is open containerd is SIGKILLed and started again on
//! the same config and socket. Asserted:
//! - a `target` line (`traced`: the same binary) for the new containerd's pid within 2 s of
//!   its spawn;
//! - the incident raised before the restart is the one escalated after it (at `--critical`):
//!   same id, same `started_at`, same chain (the relist hop, its wait id, pid and goroutine);
//!   no second incident is raised for it, and it resolves under that id once the relist is
//!   let go;
//! - the relists after the release make their CRI calls to the new containerd and plegwatch
//!   counts them in its `ListContainers` latency row.
//!
//! A hop that belonged to the dead containerd (a `cri_call` or a Status lock holder) would
//! end with it: the part of the chain still leading to the root keeps the incident's id, and
//! a wait cut off from it for 2 s is raised on its own (unit test
//! `graph::incidents::tests::a_restarted_process_leaves_the_rest_of_the_incident`).

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::containerd::{self, Containerd, Placement};
use plegwatch_scenarios::events::{dump, Event};
use plegwatch_scenarios::gofixture::{self, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};
use serde_json::Value;

/// The bound: a restarted containerd is traced again within this.
const TRACED_WITHIN: Duration = Duration::from_secs(2);
/// Relists the fixture must complete against the new containerd.
const AFTER: u64 = 4;

/// The relist hop of an incident line, without what changes with time (`waited_s`).
fn hops(incident: &Event) -> Vec<Value> {
    let mut chain = incident.get("/chain").and_then(Value::as_array).cloned().unwrap_or_default();
    for h in &mut chain {
        if let Some(o) = h.as_object_mut() {
            o.remove("waited_s");
        }
    }
    chain
}

#[test]
fn containerd_restarted_mid_incident_is_retraced_and_the_incident_kept() -> Result<()> {
    preflight::require();
    containerd::require();
    let bin = gofixture::build_fake_kubelet()?;
    let mut daemon = Containerd::start(Placement::TempDir)?;
    let endpoint = format!("unix://{}", daemon.socket().display());
    let mut kubelet = FakeKubelet::start_cri(&bin, &endpoint, &["--period", "300ms", "--runtime-request-timeout", "5s"])?;
    let kpid = kubelet.pid();

    let mut plegwatch = Plegwatch::start(&["--warn", "1s", "--critical", "6s", "--imminent", "60s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    plegwatch.wait_probed(kpid, Duration::from_secs(5))?;
    plegwatch.wait_probed(daemon.pid(), Duration::from_secs(10))?;
    let origin = Instant::now();
    // Relists from here on call a probed containerd.
    let counted_from =
        kubelet.wait_relist_started_since(gofixture::monotonic_now(), Duration::from_secs(3)).context("the fixture does not relist")?;

    // The incident: the relist parked.
    let raised = kubelet.park_and_await_incident(&mut plegwatch, origin)?;
    let id = raised.u64("/id").context("incident id")?;
    eprintln!("incident #{id} raised: {}", raised.json);
    let ours = move |e: &Event| e.is("incident") && e.u64("/id") == Some(id);

    // containerd dies and comes back while the relist is parked.
    let old_pid = daemon.pid();
    let spawned = daemon.restart()?;
    let new_pid = daemon.pid();
    ensure!(new_pid != old_pid, "containerd kept its pid {old_pid}");
    let target =
        plegwatch.wait_for(TRACED_WITHIN + Duration::from_secs(3), |e| e.is("target") && e.u64("/pid") == Some(u64::from(new_pid)));
    let target =
        target.unwrap_or_else(|| panic!("no target line for the new containerd (pid {new_pid}):\n{}", dump(plegwatch.events(), origin)));
    let after = target.at.saturating_duration_since(spawned);
    eprintln!("new containerd pid {new_pid}: target line {:?} {:.3}s after its spawn", target.str("/status"), after.as_secs_f64());
    assert!(
        after <= TRACED_WITHIN,
        "the new containerd traced {:.3}s after its spawn:\n{}",
        after.as_secs_f64(),
        dump(plegwatch.events(), origin)
    );
    assert_eq!(target.str("/status"), Some("traced"), "the same binary as before: {}", target.json);

    // Escalated at --critical: the same incident, as it was.
    let escalated = plegwatch.wait_for(Duration::from_secs(8), move |e| ours(e) && e.str("/level") == Some("critical"));
    let all = dump(plegwatch.events(), origin);
    let escalated = escalated.unwrap_or_else(|| panic!("incident #{id} never reached critical:\n{all}"));
    ensure!(escalated.at > spawned, "escalated before the restart:\n{all}");
    assert_eq!(escalated.u64("/id"), Some(id), "the incident changed id across the restart:\n{all}");
    assert_eq!(escalated.str("/started_at"), raised.str("/started_at"), "started_at moved:\n{all}");
    assert_eq!(hops(&escalated), hops(&raised), "the chain changed across the restart:\n{all}");
    assert_eq!(escalated.get("/waits"), raised.get("/waits"), "the waits changed:\n{all}");
    let waited = escalated.f64("/waited_s").unwrap_or(0.0);
    assert!(waited >= 6.0, "waited {waited}s at critical (6 s)");

    // Let it go: it resolves under its id, and relists go to the new containerd.
    kubelet.release()?;
    let resolved = plegwatch.wait_for(Duration::from_secs(3), |e| e.is("incident_resolved") && e.u64("/id") == Some(id));
    ensure!(resolved.is_some(), "incident #{id} did not resolve after the release:\n{}", dump(plegwatch.events(), origin));
    let released = gofixture::monotonic_now();
    let first = kubelet.wait_relist_started_since(released, Duration::from_secs(3)).context("no relist after the release")?;
    // gRPC reconnects to the new socket on its own backoff: a relist may fail before it has.
    let (mut last, mut ok) = (first - 1, 0);
    let deadline = Instant::now() + Duration::from_secs(10);
    while ok < AFTER {
        ensure!(Instant::now() < deadline, "{ok} relists answered by the new containerd in 10 s: {:?}", kubelet.transcript());
        let r = kubelet
            .wait_cri_relist(last, Duration::from_secs(5))
            .with_context(|| format!("no CRI relist after {last}: {:?}", kubelet.transcript()))?;
        match &r.result {
            Ok(_) => ok += 1,
            Err(e) => eprintln!("relist {} before the fixture reconnected: {e:?}", r.n),
        }
        last = r.n;
    }
    // CRI relists since both were probed: `relist cri N T ...`.
    let total = kubelet
        .transcript()
        .iter()
        .filter_map(|l| l.strip_prefix("relist cri ")?.split(' ').next()?.parse::<u64>().ok())
        .filter(|n| *n >= counted_from)
        .count() as u64;
    let events = plegwatch.stop()?;
    let all = || dump(&events, origin);
    let raised_for_it = events.iter().filter(|e| ours(e) && e.get("/changed").and_then(Value::as_array).is_some_and(Vec::is_empty)).count();
    assert_eq!(raised_for_it, 1, "the parked relist was raised more than once:\n{}", all());
    let summary = events.iter().find(|e| e.is("summary")).with_context(|| format!("no summary:\n{}", all()))?;
    let rows = summary.get("/go_latency").and_then(Value::as_array).cloned().unwrap_or_default();
    let list: Vec<&Value> = rows
        .iter()
        .filter(|r| r["target"] == "containerd" && r["function"].as_str().is_some_and(|f| f.ends_with(".(*criService).ListContainers")))
        .collect();
    assert!(!list.is_empty(), "no ListContainers latency row:\n{}", all());
    let count: u64 = list.iter().filter_map(|r| r["count"].as_u64()).sum();
    // Of the fixture's `total` ListContainers calls, at least AFTER went to the new process.
    eprintln!("ListContainers: {count} calls seen; the fixture made {total}, {ok} answered by the new containerd");
    assert!(count >= total, "{count} ListContainers calls seen, the fixture made {total} (>= {AFTER} to the new containerd):\n{}", all());
    ensure!(kubelet.quit()?.success(), "the fixture exited badly");
    Ok(())
}
