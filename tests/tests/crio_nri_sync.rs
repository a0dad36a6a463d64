//! CRI-O's NRI lock held across a container's `opLock`: every pod and container lifecycle
//! call on the node stops behind one hung runtime (the inversion cri-o#9804 and #9835
//! fix), on real CRI-O 1.35.6 with NRI on (its default), conmon 2.1.6 and runc 1.1.5.
//!
//! The staging: a container's runtime `update` stops itself (SIGSTOP) while
//! `(*runtimeOCI).UpdateContainer` holds the container's `opLock` (as in
//! `crio_update_stopped`). Then an NRI plugin registers, as one does when its DaemonSet pod
//! restarts (`nri_plugin.py`, speaking the NRI wire): CRI-O's `(*local).syncPlugin` takes
//! the NRI lock (a `sync.Mutex`) and reads every container's state for the plugin, each
//! through `(*Container).State`, whose `RLock` parks behind the held `opLock`. Then a
//! `StartContainer` for a container of another pod: its NRI event parks on the NRI lock
//! (`(*local).StartContainer`, or `PostStartContainer` when the start's first event got
//! the lock before the plugin's synchronization took it).
//! plegwatch must raise one incident within 1 s of `--warn`, from the start down to the
//! stopped runtime: StartContainer → `(*local).StartContainer` waiting to take the NRI
//! lock → `syncPlugin` holding it, parked on the opLock → `UpdateContainer` holding the
//! opLock → its `waitid` on the runtime → the runtime, stopped; and resolve it once the
//! runtime goes on. The relist (ListPodSandbox, ListContainers) takes neither lock and
//! stays fast throughout.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::containerd::cri::{container, LatencyStats, ListCall, Pod, RelistDriver};
use plegwatch_scenarios::crio::update_stall::UpdateStall;
use plegwatch_scenarios::crio::{Crio, Setup, BUSYBOX_REPO};
use plegwatch_scenarios::incidents::{self, Incident};
use plegwatch_scenarios::preflight;
use serde_json::Value;

const WARN: Duration = Duration::from_secs(2);
/// How long the runtime stays stopped once the incident reaches the start.
const HOLD_AFTER_RAISED: Duration = Duration::from_secs(2);

fn what(h: &Value) -> &str {
    h["what"].as_str().unwrap_or_default()
}

#[test]
fn a_plugin_synchronized_behind_a_held_oplock_stops_every_lifecycle_call() -> Result<()> {
    preflight::require();
    if let Some(why) = Crio::missing() {
        preflight::skip("crio_nri_sync", &why);
        return Ok(());
    }
    let crio = Crio::start_with(Setup { nri: true, ..Setup::default() })?;
    let cri = crio.cri().clone();
    // The stalled container's pod, and a second pod with a container created, not started.
    let prepared = UpdateStall::prepare(&crio, "crionri")?;
    let other = Pod::run(&cri, crio.pod_config("crionri-other", "")?)?;
    let image = crio.image(BUSYBOX_REPO);
    let mut config = container("starter", &image, &["sleep", "100000"]);
    if let Some(i) = config.image.as_mut() {
        i.user_specified_image = image.clone();
    }
    let starter = other.create_container(&config)?;
    let mut plegwatch = crio.watched(WARN)?;
    let relist = RelistDriver::start(&cri, Duration::from_millis(200));

    // The stall: the opLock held by a stopped update, then a plugin's synchronization.
    let stall = prepared.stall(&crio)?;
    let (sent, stopped, stopped_at) = (stall.sent, stall.stopped, stall.stopped_at);
    let mut plugin = crio.start_nri_plugin()?;
    let configured = plugin.wait_line(Duration::from_secs(10), |l| l == "call Configure");
    ensure!(configured.is_some(), "CRI-O never configured the NRI plugin:\n{}", crio.log_tail(30));
    let start_sent = Instant::now();
    let start = {
        let (cri, id) = (cri.clone(), starter.clone());
        thread::spawn(move || cri.start_container(&id).map(|()| Instant::now()))
    };
    let raised = plegwatch.wait_for(WARN + Duration::from_secs(4), |e| {
        e.is("incident")
            && Incident::chain(e).first().is_some_and(|h| what(h).contains("StartContainer"))
            && Incident::chain(e).last().is_some_and(|h| h["pid"].as_u64() == Some(u64::from(stopped)))
    });
    if raised.is_some() {
        thread::sleep(HOLD_AFTER_RAISED);
    }
    ensure!(!start.is_finished(), "StartContainer returned while the opLock was held: NRI did not stop it\n{}", crio.log_tail(30));
    let synchronized_before = plugin.lines().iter().any(|(_, l)| l == "call Synchronize");
    let lifted = Instant::now();
    let (pod, done) = stall.lift(&crio)?;
    let started = start.join().map_err(|_| anyhow::anyhow!("the start's caller panicked"))?.context("StartContainer")?;
    let synchronized = plugin.wait_line(Duration::from_secs(10), |l| l == "call Synchronize");
    plegwatch.wait_for(Duration::from_secs(5), |e| e.is("incident_resolved"));
    let calls = relist.stop(Duration::from_secs(10));
    let events = plegwatch.stop()?;
    let all = || plegwatch_scenarios::events::dump(&events, sent);
    drop(plugin);
    drop((pod, other));

    // The staging: the plugin was synchronized only once the opLock was let go.
    ensure!(!synchronized_before && synchronized.is_some(), "the plugin's Synchronize came before the lift, or never");
    ensure!(started >= lifted, "StartContainer returned before the runtime went on");

    // One incident, from the start down to the stopped runtime.
    let is_holder = |h: &Value| h["kind"] == "go_lock" && what(h).contains("syncPlugin holding NRI lock");
    let i = incidents::the_one_since(&events, WARN, Some(sent), Some(lifted), is_holder).map_err(|e| anyhow::anyhow!("{e}\n{}", all()))?;
    let line = i
        .line_where(|c| {
            c.first().is_some_and(|h| what(h).contains("StartContainer"))
                && c.last().is_some_and(|h| h["pid"].as_u64() == Some(u64::from(stopped)))
        })
        .with_context(|| format!("incident #{} never went from the start to the stopped runtime (pid {stopped}):\n{}", i.id, all()))?;
    let chain = Incident::chain(line);
    let text = incidents::chain_text(&chain);
    let kinds: Vec<&str> = chain.iter().map(|h| h["kind"].as_str().unwrap_or("?")).collect();
    let link = |n: usize| (chain[n]["edge"].as_str(), chain[n]["exactness"].as_str());
    assert_eq!(kinds, ["cri_call", "go_lock", "go_lock", "go_lock", "child_wait", "process"], "{text}");
    assert!(what(&chain[0]).contains("(*Server).StartContainer") && what(&chain[0]).contains(&starter[..12]), "{text}");
    assert_eq!(link(0), (Some("nested_call"), Some("exact")), "{text}");
    // The start's first NRI event, or, when that one took the lock before the plugin's
    // synchronization did (seen once in a 6.1 guest), the event after the runtime's start.
    let event = ["(*local).StartContainer", "(*local).PostStartContainer"].map(|m| format!("{m} waiting to take NRI lock"));
    assert!(event.iter().any(|e| what(&chain[1]).contains(e.as_str())), "{text}");
    assert_eq!(link(1), (Some("go_lock"), Some("exact")), "the start's NRI event waits for the NRI lock:\n{text}");
    assert!(what(&chain[2]).contains("(*local).syncPlugin holding NRI lock") && what(&chain[2]).contains("waiting on opLock"), "{text}");
    assert_eq!(link(2), (Some("go_lock"), Some("exact")), "the plugin's synchronization waits for the opLock:\n{text}");
    assert!(what(&chain[3]).contains("UpdateContainer holding opLock"), "{text}");
    assert_eq!(link(3), (Some("same_goroutine"), Some("exact")), "{text}");
    assert!(what(&chain[4]).contains(&format!("pid {stopped}")), "{text}");
    assert_eq!(link(4), (Some("child"), Some("exact")), "{text}");
    assert!(what(&chain[5]).contains("state T"), "{text}");

    // The relist stayed fast and out of it.
    let during = |c: &plegwatch_scenarios::containerd::cri::TimedCall| c.started >= stopped_at && c.ended() <= lifted;
    for call in [ListCall::PodSandbox, ListCall::Containers] {
        let s = LatencyStats::of(&calls, call, during).with_context(|| format!("no {} during the stall", call.method()))?;
        assert!(s.max < Duration::from_secs(1) && s.failed == 0, "{} during the stall: {s}", call.method());
    }

    // The NRI lock's hold, as plegwatch measured it, against the start's block.
    let held = plegwatch_scenarios::events::go_lock_hold(&events, ".(*local).syncPlugin").map_err(|e| {
        anyhow::anyhow!(
            "{e}:
{}",
            all()
        )
    })?;
    let blocked = started.duration_since(start_sent).as_secs_f64();
    assert!(
        held >= blocked - plegwatch_scenarios::timing::scaled(Duration::from_millis(500)).as_secs_f64(),
        "NRI lock held {held:.3} s by plegwatch, the start blocked {blocked:.3} s"
    );
    eprintln!(
        "incident #{} raised {:.3}s after crossing --warn; chain:\n{text}\nNRI lock held {held:.3}s by syncPlugin (the start blocked \
         {blocked:.3}s); opLock held until the lift ({:.3}s after the update)",
        i.id,
        i.raised_after_warn(WARN).as_secs_f64(),
        done.first.duration_since(sent).as_secs_f64()
    );
    Ok(())
}
