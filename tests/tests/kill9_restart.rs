//! plegwatch killed with `kill -9` in the middle of an incident, then started again (as a
//! DaemonSet restarts it): the new run must find the same stall, begun before it attached,
//! and raise it as an incident again.
//!
//! The stall: a relist of the fake-kubelet FIXTURE (a stripped Go program carrying
//! kubelet's relist symbol; not kubelet) parked on command. The second plegwatch learns of
//! it only from the fixture's goroutines (`/proc/PID/mem`), as after any restart.

use std::time::{Duration, Instant};

use anyhow::Context as _;
use plegwatch_scenarios::events::{dump, Event};
use plegwatch_scenarios::gofixture::{self, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

/// An incident line with a `pleg_relist` hop in process `pid`.
fn relist_incident(e: &Event, pid: u32) -> bool {
    e.is("incident")
        && e.json["chain"]
            .as_array()
            .is_some_and(|c| c.iter().any(|h| h["pid"].as_u64() == Some(u64::from(pid)) && h["kind"] == "pleg_relist"))
}

#[test]
fn killed_mid_incident_and_restarted_it_finds_the_stall_again() -> anyhow::Result<()> {
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start(&bin)?;
    let pid = kubelet.pid();
    let mut plegwatch = Plegwatch::start(&["--warn", "1s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    plegwatch.wait_probed(pid, Duration::from_secs(5))?;
    let origin = Instant::now();
    let first = kubelet.park_and_await_incident(&mut plegwatch, origin)?;
    let first_id = first.u64("/id");
    let (events, status) = plegwatch.kill9()?;
    eprintln!("first run: incident #{first_id:?}, killed ({status}) after {} lines", events.len());
    anyhow::ensure!(kubelet.is_running(), "the fixture died with plegwatch's SIGKILL");

    let mut again = Plegwatch::start(&["--warn", "1s"])?;
    again.wait_ready(READY_TIMEOUT)?;
    let found = again.wait_for(Duration::from_secs(10), |e| relist_incident(e, pid));
    kubelet.release()?;
    let events = again.stop()?;
    kubelet.quit()?;
    let incident =
        found.with_context(|| format!("the restarted plegwatch raised no incident for the parked relist:\n{}", dump(&events, origin)))?;
    assert_eq!(incident.get("/started_before_attach"), Some(&serde_json::json!(true)), "{}", incident.json);
    let scan = events.iter().find(|e| e.is("goroutine_scan") && e.u64("/pid") == Some(u64::from(pid)));
    let scan = scan.with_context(|| format!("no goroutine scan of the fixture:\n{}", dump(&events, origin)))?;
    assert_eq!(scan.get("/error"), None, "{}", scan.json);
    eprintln!(
        "after the restart: incident #{:?} {:.3}s after start",
        incident.u64("/id"),
        incident.at.duration_since(origin).as_secs_f64()
    );
    Ok(())
}
