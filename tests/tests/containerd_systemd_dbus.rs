//! Seed incident 002: a container start held by systemd over D-Bus (stall-catalog.md,
//! pattern 4).
//!
//! A private containerd with `SystemdCgroup = true`, its shim and runc run in a
//! mount namespace whose `/run` holds `systemd/system/` and a private system bus; a stand-in
//! for systemd owns `org.freedesktop.systemd1` there and answers runc's calls until it is
//! frozen (SIGSTOP). A pod runs (its pause container went through the stand-in) and a
//! container is created; then the stand-in is frozen and the container started: its `runc
//! create`'s `StartTransientUnit` is never answered until the stand-in is thawed, 6 s after
//! the call went out. See `plegwatch_scenarios::containerd::systemd_dbus`.
//!
//! Each runs on Debian's containerd 1.6.20 with runc 1.1.5 (no suffix), on containerd 1.7.34
//! with runc 1.4.3 (`_on_runc_1_4`) and on containerd 2.3.4 with runc 1.4.3
//! (`_on_containerd_2_3`). On cgroup v1 (this machine) runc takes its v1 systemd manager
//! (1.4.3: `github.com/opencontainers/cgroups/systemd.LegacyManager`) and joins the cgroups
//! itself; on cgroup v2 (the 6.1 guest) its unified manager leaves that to systemd, and the
//! stand-in makes the scope's cgroup and moves runc's PIDs in, as systemd does.
//!
//! - `baseline_start_waits_while_systemd_is_frozen`, with no plegwatch: the stall is real,
//!   lasts as long as the freeze, and the start succeeds after the thaw; the stand-in knew
//!   every call runc made.
//! - `one_incident_from_the_container_start_to_the_frozen_systemd`, with `plegwatch watch
//!   --warn 2s` started before the trigger and the bed's runc probed before it (a warm-up
//!   runc, let go once plegwatch's `target` line for it is out): one incident whose chain
//!   runs StartContainer → the shim's Create → runc's `systemd.startUnit` (runc 1.4.3: the
//!   one of `github.com/opencontainers/cgroups`, its target line `probed`, not `partial`) →
//!   its `dbus_call` `StartTransientUnit` → the frozen stand-in (state T), raised within 1 s
//!   of crossing --warn and resolved after the thaw.

use std::time::Duration;

use anyhow::Result;
use plegwatch_scenarios::containerd;
use plegwatch_scenarios::containerd::bed::{short, StallBed, StallOutcome, Watched, WARN};
use plegwatch_scenarios::containerd::systemd_dbus::{self, Bed, Options, BUS_SOCKET, MANAGER, START_UNIT, SYSTEMD};
use plegwatch_scenarios::containerd::version::RuncRelease;
use plegwatch_scenarios::containerd::Version;
use plegwatch_scenarios::dbus::MsgKind;
use plegwatch_scenarios::incidents::{self, Incident};
use plegwatch_scenarios::preflight;
use serde_json::Value;

const SCENARIO: &str = "containerd_systemd_dbus";
/// How far StartContainer's block may be above the freeze: runc's call goes out after the
/// shim has started it, and the start's own work follows the thaw.
const BLOCK_SLACK: Duration = Duration::from_millis(3000);

/// runc's `startUnit`, whose D-Bus call is held, by the runc release's package path.
fn start_unit_function(version: Version) -> &'static str {
    match version.runc {
        RuncRelease::V1_1_5 => "github.com/opencontainers/runc/libcontainer/cgroups/systemd.startUnit",
        RuncRelease::V1_4_3 => "github.com/opencontainers/cgroups/systemd.startUnit",
    }
}

/// What runc's v1 systemd manager calls `SetUnitProperties` in, as plegwatch's target line
/// and latency table name it (the package's last element on): 1.1.5's `setUnitProperties`;
/// in 1.4.3 that one is inlined into `(*LegacyManager).Set`, and its closure is left.
fn set_properties_function(version: Version) -> &'static str {
    match version.runc {
        RuncRelease::V1_1_5 => "systemd.setUnitProperties",
        RuncRelease::V1_4_3 => "systemd.(*LegacyManager).Set.setUnitProperties.func1",
    }
}

/// Everything this bed needs on `version`, or why it can't run (a failure under CI).
fn ready(version: Version, scenario: &str) -> bool {
    let scenario = format!("{scenario} on {version}");
    if !containerd::require_version(version, &scenario) {
        return false;
    }
    systemd_dbus::require();
    true
}

fn options(version: Version) -> Options {
    Options { version, ..Options::default() }
}

#[test]
fn baseline_start_waits_while_systemd_is_frozen() -> Result<()> {
    baseline(Version::DEBIAN)
}

#[test]
fn baseline_start_waits_while_systemd_is_frozen_on_runc_1_4() -> Result<()> {
    baseline(Version::V1_7)
}

#[test]
fn baseline_start_waits_while_systemd_is_frozen_on_containerd_2_3() -> Result<()> {
    baseline(Version::V2_3)
}

fn baseline(version: Version) -> Result<()> {
    if !ready(version, &format!("{SCENARIO}::baseline")) {
        return Ok(());
    }
    let options = options(version);
    let mut attempts = 0;
    let (bed, o) = loop {
        let mut bed = Bed::prepare(options.clone())?;
        let o = bed.trigger()?;
        attempts += 1;
        if attempts < 2 && runc_could_not_freeze(&o.start.result) {
            eprintln!("warning: runc could not freeze the container's cgroup (a loaded host): staged again on a new bed\n{}", o.summary());
            continue;
        }
        break (bed, o);
    };
    eprintln!("{}", o.summary());
    let context = || bed.context(&o);
    assert_eq!(o.call.destination.as_deref(), Some(SYSTEMD), "{}", context());
    assert_eq!(o.call.interface.as_deref(), Some(MANAGER), "{}", context());
    assert_eq!(o.call.path.as_deref(), Some("/org/freedesktop/systemd1"), "{}", context());
    // The caller is `runc … --systemd-cgroup create … ID`, the pod's shim's child.
    let argv = &o.runc_argv;
    assert!(
        argv.iter().any(|a| a == "--systemd-cgroup") && argv.iter().any(|a| a == "create") && argv.last() == Some(&o.container_id),
        "the caller is not the shim's `runc --systemd-cgroup create … {}`: {argv:?}\n{}",
        o.container_id,
        context()
    );
    // The start blocked for as long as the stand-in was frozen, then went through.
    let frozen = o.continued.duration_since(o.call_seen);
    assert!(frozen >= options.stop_for, "thawed after {frozen:?}\n{}", context());
    let blocked = o.start.latency;
    assert!(
        blocked >= frozen && blocked <= frozen + BLOCK_SLACK,
        "StartContainer blocked {blocked:?}, the stand-in was frozen {frozen:?} (want within \
         {BLOCK_SLACK:?} above)\n{}",
        context()
    );
    assert_eq!(o.start.result, Ok(()), "StartContainer should succeed after the thaw\n{}", context());
    assert!(o.reply.as_ref().is_some_and(|r| r.kind == MsgKind::Return), "no reply to the call\n{}", context());
    assert!(o.container_pid.is_some(), "the container does not run\n{}", context());
    assert_calls_known(&o);
    Ok(())
}

/// The stand-in knew every call runc made (none answered UnknownMethod or UnknownProperty),
/// and the container's `runc create` asked it for its scope.
fn assert_calls_known(o: &systemd_dbus::Outcome) {
    assert!(o.systemd_refused.is_empty(), "the fake systemd did not know {:?}\n{}", o.systemd_refused, o.summary());
    let scope = format!("cri-containerd-{}.scope", o.container_id);
    assert!(
        o.systemd_calls.iter().any(|c| c.starts_with(&format!("{START_UNIT} /org/freedesktop/systemd1 {scope} "))),
        "no {START_UNIT} of {scope} among the calls from the trigger on\n{}",
        o.summary()
    );
}

/// runc's cgroup v1 freezer gives up ("unable to freeze") when the container's cgroup
/// stays `FREEZING` through its thousand tries (opencontainers/cgroups `fs/freezer.go`),
/// which a CPU hog on the host made happen around runc 1.4.3's `SetUnitProperties`
/// (ci7, under `stress-ng`): the container start then fails for a reason that is runc's,
/// not the stall's, and the staging is run again, once, on a new bed.
fn runc_could_not_freeze(start: &Result<(), String>) -> bool {
    start.as_ref().err().is_some_and(|e| e.contains("unable to freeze"))
}

/// A hop of runc's `StartTransientUnit` call.
fn is_start_unit(h: &Value) -> bool {
    h["kind"] == "dbus_call" && h["what"].as_str().is_some_and(|s| s.contains(START_UNIT))
}

#[test]
fn one_incident_from_the_container_start_to_the_frozen_systemd() -> Result<()> {
    one_incident(Version::DEBIAN)
}

#[test]
fn one_incident_from_the_container_start_to_the_frozen_systemd_on_runc_1_4() -> Result<()> {
    one_incident(Version::V1_7)
}

#[test]
fn one_incident_from_the_container_start_to_the_frozen_systemd_on_containerd_2_3() -> Result<()> {
    one_incident(Version::V2_3)
}

fn one_incident(version: Version) -> Result<()> {
    preflight::require();
    if !ready(version, &format!("{SCENARIO}::one_incident")) {
        return Ok(());
    }
    // Other scenarios may run beside this one: stop at the resolution of this stall's incident.
    let mut attempts = 0;
    let w = loop {
        let w = Watched::run_until(Bed::prepare(options(version))?, |e| {
            e.is("incident_resolved") && e.get("/longest_chain").and_then(Value::as_array).is_some_and(|c| c.iter().any(is_start_unit))
        })?;
        attempts += 1;
        if attempts < 2 && runc_could_not_freeze(&w.outcome.start.result) {
            eprintln!("warning: runc could not freeze the container's cgroup (a loaded host): staged again on a new bed");
            continue;
        }
        break w;
    };
    let o = &w.outcome;
    let all = || w.all();
    assert_eq!(o.start.result, Ok(()), "StartContainer should succeed after the thaw\n{}", all());

    // runc's own call, as the socket probes saw it: its stall line names the call the
    // monitor saw and the frozen owner, found through the bus daemon in the other namespace.
    let stall = w
        .stalls("dbus_call", o.runc_pid)
        .into_iter()
        .find(|e| e.str("/detail/member") == Some(START_UNIT))
        .unwrap_or_else(|| panic!("no dbus_call stall for runc pid {}'s {START_UNIT}:\n{}", o.runc_pid, all()));
    for (field, want) in [
        ("/comm", Value::from("runc")),
        ("/detail/destination", Value::from(SYSTEMD)),
        ("/detail/interface", Value::from(MANAGER)),
        ("/detail/serial", Value::from(o.call.serial)),
        ("/detail/sender", Value::from(o.call.sender.clone())),
        ("/holder/pid", Value::from(o.systemd_pid)),
        ("/chain/0/edge", Value::from("dbus_owner")),
        ("/chain/0/exactness", Value::from("exact")),
    ] {
        assert_eq!(stall.get(field), Some(&want), "dbus_call stall {field}:\n{}", all());
    }
    // The link names the bus as its daemon bound it, and where plegwatch reached it.
    let evidence = stall.str("/chain/0/evidence").unwrap_or_default();
    let reached = format!("/proc/{}/root{BUS_SOCKET}", o.bus_daemon_pid);
    assert!(
        evidence.contains(&format!("owner of {SYSTEMD} on the bus {BUS_SOCKET}, asked at {reached}")),
        "dbus_call stall's link: {evidence}\n{}",
        all()
    );
    // The frozen systemd, as the holder: stopped (when it has no open wait of its own).
    if stall.str("/holder/kind") == Some("process") {
        assert!(stall.str("/holder/what").is_some_and(|w| w.contains("state T")), "{}", all());
    }

    // One incident, raised within 1 s of --warn, resolved after the thaw.
    let i = incidents::the_one(&w.events, WARN, Some(o.continued), is_start_unit).map_err(|e| anyhow::anyhow!("{e}\n{}", all()))?;
    // The line whose chain runs from the CRI call to the frozen stand-in: an earlier one
    // may end at runc itself, seen before its D-Bus call was (a slow guest, ci6: `runc
    // not answering (state S)`).
    let frozen = u64::from(o.systemd_pid);
    let line = i
        .line_where(|c| {
            c.last().is_some_and(|h| h["kind"] == "process" && h["pid"].as_u64() == Some(frozen))
                && c.first().is_some_and(|h| h["kind"] == "cri_call")
        })
        .unwrap_or_else(|| panic!("incident #{} never ran from the CRI call to the frozen systemd:\n{}", i.id, all()));
    let chain = Incident::chain(line);
    let text = incidents::chain_text(&chain);
    let pid = |h: &Value| h["pid"].as_u64();
    let what = |h: &Value| h["what"].as_str().unwrap_or_default().to_string();

    // 1. containerd's StartContainer for the container → the shim's task call.
    let start = &chain[0];
    assert_eq!(pid(start), Some(u64::from(w.containerd_pid)), "{text}");
    assert!(what(start).contains("(*instrumentedService).StartContainer") && what(start).contains(short(&o.container_id)), "{text}");
    assert_eq!((start["edge"].as_str(), start["exactness"].as_str()), (Some("ttrpc"), Some("exact")), "{text}");
    // Exact by the ttrpc stream StartContainer's goroutine has outstanding on the shim's
    // socket (the shim connection was made before plegwatch started: seeded by its peer name).
    let evidence = start["evidence"].as_str().unwrap_or_default();
    assert!(
        evidence.starts_with("ttrpc stream ") && evidence.ends_with(&format!("held by pid {}", o.shim_pid)),
        "the ttrpc hop should name its stream and the shim as the socket's peer: {evidence}\n{text}"
    );
    // 2. The shim's Create for the same container → its child, runc.
    let create = &chain[1];
    assert_eq!((create["kind"].as_str(), pid(create)), (Some("go_call"), Some(u64::from(o.shim_pid))), "{text}");
    assert!(what(create).contains("(*service).Create") && what(create).contains(short(&o.container_id)), "{text}");
    assert_eq!(create["edge"], "child", "{text}");
    // 3. runc's startUnit → its D-Bus call. The bed's runc binary was probed before the
    //    start (the warm-up runc): its target line says `probed` (every expected function
    //    found, none left out) before the start went out, so the hop must be there.
    let runc_binary = w.bed.stage().containerd().binaries().runc.clone();
    let runc_targets: Vec<_> = w
        .events
        .iter()
        .filter(|e| {
            e.is("target") && e.str("/target") == Some("runc") && e.str("/binary").map(std::path::Path::new) == Some(runc_binary.as_path())
        })
        .collect();
    let probed = runc_targets
        .iter()
        .find(|e| e.str("/status") == Some("probed"))
        .unwrap_or_else(|| panic!("no `probed` target line for {} (runc {}):\n{}", runc_binary.display(), version.runc.number(), all()));
    assert!(probed.at < o.start.sent, "runc {} was probed only after the start:\n{}", version.runc.number(), all());
    assert!(
        runc_targets.iter().all(|e| matches!(e.str("/status"), Some("probed" | "traced"))),
        "a target line for {} is not `probed` or `traced`:\n{}",
        runc_binary.display(),
        all()
    );
    let start_unit = start_unit_function(version);
    let set_properties = set_properties_function(version);
    // `functions` names each as `systemd.startUnit (N RETs)`.
    let functions: Vec<&str> =
        probed.get("/functions").and_then(Value::as_array).map_or(Vec::new(), |f| f.iter().filter_map(Value::as_str).collect());
    for short_name in ["systemd.startUnit", set_properties] {
        assert!(
            functions.iter().any(|f| f.starts_with(&format!("{short_name} ("))),
            "{short_name} is not among the functions probed in {}: {functions:?}\n{}",
            runc_binary.display(),
            all()
        );
    }
    let unit = &chain[2];
    assert_eq!((unit["kind"].as_str(), pid(unit)), (Some("go_call"), Some(u64::from(o.runc_pid))), "{text}");
    assert!(what(unit).contains("systemd.startUnit"), "{text}");
    assert_eq!(unit["edge"], "nested_call", "{text}");
    // Its stall line names the function by its full path: opencontainers/cgroups on runc 1.4.
    assert!(
        w.stalls("go_call", o.runc_pid).iter().any(|e| e.str("/detail/function") == Some(start_unit)),
        "no go_call stall of {start_unit} in runc pid {}:\n{}",
        o.runc_pid,
        all()
    );
    let at = 3;
    // 4. runc's StartTransientUnit → the owner of org.freedesktop.systemd1.
    let call = &chain[at];
    assert_eq!(
        (call["kind"].as_str(), pid(call), call["comm"].as_str()),
        (Some("dbus_call"), Some(u64::from(o.runc_pid)), Some("runc")),
        "{text}"
    );
    assert_eq!(what(call), format!("D-Bus {MANAGER}.{START_UNIT} to {SYSTEMD}"), "{text}");
    assert_eq!((call["edge"].as_str(), call["exactness"].as_str()), (Some("dbus_owner"), Some("exact")), "{text}");
    assert_eq!(call["root"], true, "the D-Bus call is the deepest open wait:\n{text}");
    // 5. The frozen stand-in, the end of the chain.
    let end = &chain[at + 1];
    assert_eq!((end["kind"].as_str(), pid(end)), (Some("process"), Some(u64::from(o.systemd_pid))), "{text}");
    assert_eq!(what(end), "stopped (state T)", "{text}");
    assert_eq!(chain.len(), at + 2, "nothing after the frozen process:\n{text}");
    assert_eq!(line.get("/root/pid").and_then(Value::as_u64), Some(u64::from(o.runc_pid)), "{text}");

    let longest = i.resolved.as_ref().and_then(|r| r.get("/longest_chain")).and_then(Value::as_array).map_or(0, Vec::len);
    assert!(longest >= chain.len(), "the resolution keeps the longest chain ({longest} hops)");
    w.assert_containerd_answers();
    assert_calls_known(o);
    // After the thaw runc went on to its SetUnitProperties through the probed function,
    // which returned: the summary's latency table counts it.
    let summary = w.events.iter().rev().find(|e| e.is("summary")).unwrap_or_else(|| panic!("no summary:\n{}", all()));
    let set_calls = summary.get("/go_latency").and_then(Value::as_array).map_or(0, |rows| {
        rows.iter().filter(|r| r["target"] == "runc" && r["function"] == set_properties).filter_map(|r| r["count"].as_u64()).sum()
    });
    assert!(set_calls >= 1, "no returned call of runc's {set_properties} in the summary's go_latency:\n{}", all());
    eprintln!(
        "{version}: incident #{} raised {:.3}s after crossing --warn; resolved {:.3}s after the thaw; chain:\n{text}",
        i.id,
        i.raised_after_warn(WARN).as_secs_f64(),
        i.resolved.as_ref().map_or(f64::NAN, |r| r.at.saturating_duration_since(o.continued).as_secs_f64()),
    );
    Ok(())
}
