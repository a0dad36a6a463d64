//! CRI-O with the systemd cgroup manager, its runtime's update waiting on a frozen systemd:
//! a container's `opLock` held across a D-Bus call that gets no answer (stall-catalog.md,
//! pattern 4, on CRI-O), on real CRI-O 1.35.6, conmon 2.1.6, dbus-daemon, and the OCI
//! runtime this node can run ([`OciRuntime::native`]): Debian's crun 1.8.1 (CRI-O's
//! default runtime; C, systemd's sd-bus) where the cgroups are unified (the guests, cgroup
//! v2), runc 1.1.5 (Go, godbus) on this host's hybrid cgroup v1, where crun 1.8.1 runs no
//! container. plegwatch reads the D-Bus wire, not the client library: the same chain is
//! asserted for both, except runc's own Go calls, which crun has not.
//!
//! CRI-O runs in a mount namespace whose `/run` holds `systemd/system/` and a private
//! system bus (`plegwatch_scenarios::containerd::systemd_dbus::NodeRun`), where a stand-in
//! for systemd owns `org.freedesktop.systemd1` (`fake_systemd.py`). With
//! `cgroup_manager = "systemd"` CRI-O asks it for each conmon's scope, and the runtime (run
//! with `--systemd-cgroup`) for each container's `crio-ID.scope`.
//!
//! The stall: with a pod and its container running, the stand-in is frozen (SIGSTOP) and
//! `UpdateContainerResources` sent. `(*runtimeOCI).UpdateContainer` takes the container's
//! `opLock` and runs the runtime's `update`, whose systemd manager calls systemd over
//! D-Bus (runc: `Properties.Get`, then `SetUnitProperties`; crun: `SetUnitProperties`) and
//! gets no answer. plegwatch must raise one incident within 1 s of `--warn`:
//! UpdateContainerResources → the `UpdateContainer` holding the opLock → its `waitid` on
//! the runtime → the runtime's D-Bus call → the frozen stand-in (state T); and resolve it
//! once the stand-in is thawed.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::containerd::cri::resources;
use plegwatch_scenarios::containerd::systemd_dbus::{self, FakeSystemd, NodeRun, BUS_SOCKET, SYSTEMD};
use plegwatch_scenarios::crio::update_stall::UpdateStall;
use plegwatch_scenarios::crio::{Crio, OciRuntime, Setup};
use plegwatch_scenarios::dbus::{BusMonitor, MsgKind, PrivateBus};
use plegwatch_scenarios::incidents::{self, Incident};
use plegwatch_scenarios::preflight;
use serde_json::Value;

const WARN: Duration = Duration::from_secs(2);
/// How long the stand-in stays frozen once the incident is up.
const HOLD_AFTER_RAISED: Duration = Duration::from_secs(2);

fn what(h: &Value) -> &str {
    h["what"].as_str().unwrap_or_default()
}

/// Thaws the stand-in when dropped frozen (a failed test): CRI-O's teardown runs the runtime,
/// whose calls to systemd have no timeout.
struct ThawOnDrop<'a>(&'a mut FakeSystemd);

impl Drop for ThawOnDrop<'_> {
    fn drop(&mut self) {
        if plegwatch_scenarios::dbus::proc_state(self.0.pid()) == Some('T') {
            eprintln!("cleanup: thawing the fake systemd (pid {})", self.0.pid());
            let _ = self.0.thaw();
        }
    }
}

#[test]
fn an_update_waiting_on_a_frozen_systemd_is_one_incident_down_to_systemd() -> Result<()> {
    preflight::require();
    if let Some(why) = Crio::missing() {
        preflight::skip("crio_systemd_dbus", &why);
        return Ok(());
    }
    systemd_dbus::require();
    let ns = NodeRun::start()?;
    let bus =
        PrivateBus::start_listening(ns.command("dbus-daemon"), std::path::Path::new(BUS_SOCKET), &ns.host_path("dbus/system_bus_socket"))?;
    let mut systemd = FakeSystemd::start(&ns, &bus)?;
    let mut monitor = BusMonitor::start(&bus, SYSTEMD)?;
    let runtime = OciRuntime::native();
    let rt = runtime.name();
    eprintln!("CRI-O's OCI runtime here: {rt}");
    let crio = Crio::start_with(Setup { systemd_ns: Some(ns.pid()), runtime, ..Setup::default() })?;
    let cri = crio.cri().clone();
    let prepared = UpdateStall::prepare(&crio, "criosystemd")?;
    let ctr = prepared.ctr.clone();
    let scope = format!("crio-{ctr}.scope");
    let calls = systemd.calls();
    ensure!(
        calls.iter().any(|c| c.starts_with("StartTransientUnit ") && c.contains(&scope)),
        "the container's {rt} did not ask the fake systemd for {scope} (calls: {calls:?}):\n{}",
        crio.log_tail(30)
    );

    let mut plegwatch = crio.watched(WARN)?;

    // The stall.
    let earlier = monitor.messages().len();
    let calls_before = systemd.calls().len();
    let thaw = ThawOnDrop(&mut systemd);
    thaw.0.freeze()?;
    let systemd_pid = thaw.0.pid();
    let sent = Instant::now();
    let update = {
        let (cri, ctr) = (cri.clone(), ctr.clone());
        thread::spawn(move || cri.update_container_resources(&ctr, &resources(512, 100_000, 50_000)).map(|()| Instant::now()))
    };
    let deadline = sent + plegwatch_scenarios::timing::scaled(Duration::from_secs(15));
    let call = loop {
        let seen = monitor.messages().into_iter().skip(earlier).find(|m| m.kind == MsgKind::Call);
        if let Some(m) = seen {
            break m;
        }
        ensure!(!update.is_finished(), "the update returned before any call reached the frozen systemd:\n{}", crio.log_tail(30));
        ensure!(Instant::now() < deadline, "no call to the frozen systemd within 15 s of the update:\n{}", crio.log_tail(30));
        thread::sleep(Duration::from_millis(20));
    };
    let sender = call.sender.clone().context("the call has no sender")?;
    let caller = bus.pid_of(&sender)?;
    let argv = plegwatch_scenarios::containerd::procs::cmdline(caller).unwrap_or_default();
    let parent = plegwatch_scenarios::containerd::procs::ppid(caller);
    eprintln!("pid {caller} ({}) called {:?} on the frozen systemd: {}", argv.join(" "), call.member, call.path.as_deref().unwrap_or("?"));
    let raised = plegwatch.wait_for(WARN + Duration::from_secs(4), |e| {
        e.is("incident") && Incident::chain(e).last().is_some_and(|h| h["pid"].as_u64() == Some(u64::from(systemd_pid)))
    });
    if raised.is_some() {
        thread::sleep(HOLD_AFTER_RAISED);
    }
    let continued = thaw.0.thaw()?;
    let reply = call.serial.and_then(|s| monitor.reply(&sender, s, Duration::from_secs(10)));
    let returned = update.join().map_err(|_| anyhow::anyhow!("the update's caller panicked"))?.context("UpdateContainerResources")?;
    plegwatch.wait_for(Duration::from_secs(5), |e| e.is("incident_resolved"));
    let events = plegwatch.stop()?;
    let all = || plegwatch_scenarios::events::dump(&events, sent);
    let systemd_calls = thaw.0.calls().split_off(calls_before);
    let refused = thaw.0.refused();
    drop(thaw);

    // The staging: the runtime, crio's child, called systemd and waited for the thaw.
    ensure!(
        argv.first().is_some_and(|a| a.ends_with(runtime.path())) && argv.iter().any(|a| a == "update"),
        "the caller is not {rt} update: {argv:?}"
    );
    ensure!(parent == Some(crio.pid()), "{rt} pid {caller} is not crio's child (its parent: {parent:?})");
    ensure!(reply.as_ref().is_some_and(|r| r.kind == MsgKind::Return), "no reply to {rt}'s call after the thaw: {reply:?}");
    ensure!(returned >= continued, "the update returned before the thaw");
    assert!(refused.is_empty(), "the fake systemd did not know {refused:?} (calls since the freeze: {systemd_calls:?})");

    // One incident, from the update down to the frozen systemd.
    let is_holder = |h: &Value| h["kind"] == "go_lock" && what(h).contains("UpdateContainer holding opLock");
    let i =
        incidents::the_one_since(&events, WARN, Some(sent), Some(continued), is_holder).map_err(|e| anyhow::anyhow!("{e}\n{}", all()))?;
    let line = i
        .line_where(|c| c.last().is_some_and(|h| h["pid"].as_u64() == Some(u64::from(systemd_pid))))
        .with_context(|| format!("incident #{} never reached the frozen systemd (pid {systemd_pid}):\n{}", i.id, all()))?;
    let chain = Incident::chain(line);
    let text = incidents::chain_text(&chain);
    let kinds: Vec<&str> = chain.iter().map(|h| h["kind"].as_str().unwrap_or("?")).collect();
    let link = |n: usize| (chain[n]["edge"].as_str(), chain[n]["exactness"].as_str());
    assert_eq!(kinds[..3], ["cri_call", "go_lock", "child_wait"], "{text}");
    assert!(what(&chain[0]).contains("UpdateContainerResources") && what(&chain[0]).contains(&ctr[..12]), "{text}");
    assert_eq!(link(0), (Some("nested_call"), Some("exact")), "{text}");
    assert_eq!(link(1), (Some("same_goroutine"), Some("exact")), "the holder's goroutine waits on {rt}:\n{text}");
    assert!(what(&chain[2]).contains(&format!("pid {caller}")), "{text}");
    assert_eq!(link(2).0, Some("child"), "{text}");
    // Then runc's own hops (its probed Go calls, when runc's binary was probed in time; crun
    // has none), the runtime's D-Bus call, and the stand-in.
    let n = chain.len();
    assert!(n >= 5, "{text}");
    assert!(runtime == OciRuntime::Runc || n == 5, "crun has no Go calls to hop through:\n{text}");
    for h in &chain[3..n - 2] {
        assert_eq!((h["kind"].as_str(), h["pid"].as_u64()), (Some("go_call"), Some(u64::from(caller))), "{text}");
    }
    let dbus = &chain[n - 2];
    assert_eq!((dbus["kind"].as_str(), dbus["pid"].as_u64()), (Some("dbus_call"), Some(u64::from(caller))), "{text}");
    let member = call.member.clone().unwrap_or_default();
    assert!(what(dbus).contains(&member) && what(dbus).contains(SYSTEMD), "the D-Bus hop should name {rt}'s {member}:\n{text}");
    assert_eq!(link(n - 2), (Some("dbus_owner"), Some("exact")), "{text}");
    let end = &chain[n - 1];
    assert_eq!((end["kind"].as_str(), end["pid"].as_u64()), (Some("process"), Some(u64::from(systemd_pid))), "{text}");
    assert_eq!(what(end), "stopped (state T)", "{text}");
    // The runtime names the container it updates.
    assert_eq!(chain[n - 2]["container_id"].as_str(), Some(ctr.as_str()), "{rt}'s hop:\n{text}");

    // The hold, as plegwatch measured it, against the block the test measured.
    let held = plegwatch_scenarios::events::go_lock_hold(&events, ".(*runtimeOCI).UpdateContainer").map_err(|e| {
        anyhow::anyhow!(
            "{e}:
{}",
            all()
        )
    })?;
    let blocked = returned.duration_since(sent).as_secs_f64();
    let slack = plegwatch_scenarios::timing::scaled(Duration::from_millis(500)).as_secs_f64();
    assert!(held <= blocked + 0.05 && blocked - held < slack, "opLock held {held:.3} s by plegwatch, the update blocked {blocked:.3} s");
    eprintln!(
        "{rt}: incident #{} raised {:.3}s after crossing --warn; chain:\n{text}\nopLock held {held:.3}s (update blocked {blocked:.3}s); \
         the stand-in was asked, from the freeze on: {systemd_calls:?}",
        i.id,
        i.raised_after_warn(WARN).as_secs_f64(),
    );
    drop(prepared);
    Ok(())
}
