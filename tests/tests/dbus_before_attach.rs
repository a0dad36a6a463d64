//! D-Bus calls to a frozen service that were already waiting when plegwatch started.
//!
//! Same private bus and frozen `com.example.Frozen` as `dbus_call.rs`, with the `gdbus
//! monitor` signal listener and the `dbus-monitor` ground truth started first. The caller
//! calls, and only a head start later does plegwatch start. It never saw the calls being
//! written; its startup sweep must find them queued unread in the frozen service's socket and
//! report them at once, marked `started_before_attach`, with the service as holder
//! (the call sits unread in its socket) and a `waited_s` that is a lower bound of the call's real age, then resolve
//! them once the service is thawed.
//!
//! - `dbus_send_call_made_before_start_is_swept`: `dbus-send` (one thread) with a 10 s head
//!   start: its call's age is known to plegwatch almost exactly (waited_s >= 9).
//! - `gdbus_calls_made_before_start_are_swept`: `gdbus call` (GLib: three threads) with a 6 s
//!   head start. It sent `Introspect` at once and `Hello` 3 s later, when GLib gave up on the
//!   first. Both must be found, and neither age may exceed the call's real age.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;
use plegwatch_scenarios::dbus::{
    self, assert_bystanders_quiet, assert_dbus_stall, assert_resolved_after_reply, dbus_send_call, gdbus_call, proc_state, rfc3339_secs,
    stall_ids, start_signal_listener, task_clock_skew, tids, BusMonitor, Clocks, ExpectedStall, FrozenService, MsgKind, PrivateBus,
    ResolvedCall, Seen, INTROSPECT, INTROSPECTABLE, MEMBER, RESOLVE_LATE_S, SERVICE,
};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::stall::wait_resolved;
use plegwatch_scenarios::{preflight, Event, Plegwatch};

/// The swept calls must be reported within this of plegwatch's ready line.
const AFTER_READY_S: f64 = 2.0;
/// A lower bound may exceed the real age by this much (clock reading and rounding), plus the
/// skew between the CPUs' task clocks measured at the time (see `dbus::task_clock_skew`).
const OVER_S: f64 = 0.1;
/// The lower bound must come within this of the time since the caller's last call went out.
const UNDER_S: f64 = 1.0;
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug)]
enum Caller {
    DbusSend,
    GdbusCall,
}

impl Caller {
    fn comm(self) -> &'static str {
        match self {
            Caller::DbusSend => "dbus-send",
            Caller::GdbusCall => "gdbus",
        }
    }

    fn command(self, bus: &PrivateBus) -> Command {
        match self {
            Caller::DbusSend => dbus_send_call(bus),
            Caller::GdbusCall => gdbus_call(bus),
        }
    }

    /// The calls it leaves unanswered, in order: (interface, member).
    fn calls(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Caller::DbusSend => &[(SERVICE, MEMBER)],
            Caller::GdbusCall => &[(INTROSPECTABLE, INTROSPECT), (SERVICE, MEMBER)],
        }
    }
}

#[test]
fn dbus_send_call_made_before_start_is_swept() -> anyhow::Result<()> {
    let reports = swept(Caller::DbusSend, Duration::from_secs(10))?;
    let waited = reports[0].f64("/waited_s").unwrap_or(f64::NAN);
    assert!(waited >= 9.0, "waited_s {waited} for a call made 10 s before plegwatch started: {}", reports[0].json);
    Ok(())
}

#[test]
fn gdbus_calls_made_before_start_are_swept() -> anyhow::Result<()> {
    swept(Caller::GdbusCall, Duration::from_secs(6))?;
    Ok(())
}

/// Runs the scenario for `caller` with plegwatch started `head_start` after it; returns the
/// stall lines for its calls, in the order of [`Caller::calls`].
fn swept(caller: Caller, head_start: Duration) -> anyhow::Result<Vec<Event>> {
    preflight::require();
    let clocks = Clocks::now();
    let bus = PrivateBus::start()?;
    let mut service = FrozenService::start(&bus, SERVICE)?;
    let mut monitor = BusMonitor::start(&bus, SERVICE)?;
    let mut listener = start_signal_listener(&bus)?;

    assert_eq!(proc_state(service.pid()), Some('T'), "the service (pid {}) is not stopped before the call", service.pid());
    let called = Instant::now();
    let mut client = dbus::spawn(caller.comm(), &mut caller.command(&bus))?;
    let pid = client.pid();
    // Every call it will leave unanswered, as the monitor saw it go out.
    let mut calls: Vec<Seen> = Vec::new();
    for (interface, member) in caller.calls() {
        let call = monitor
            .wait(head_start, |m| {
                m.kind == MsgKind::Call && m.interface.as_deref() == Some(interface) && m.member.as_deref() == Some(member)
            })
            .with_context(|| format!("dbus-monitor saw no {interface}.{member} call"))?;
        calls.push(call);
    }
    std::thread::sleep(head_start.saturating_sub(called.elapsed()));
    assert!(client.running(), "{} ended within the {head_start:?} head start", caller.comm());
    let caller_tids = tids(pid);
    let sender = calls[0].sender.clone().unwrap_or_default();
    let sender_pid = bus.pid_of(&sender)?;
    assert_eq!(sender_pid, pid, "the bus says {sender} is pid {sender_pid}");

    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    let ready = plegwatch.wait_ready(READY_TIMEOUT)?;
    let skew = task_clock_skew().map_or(0.0, |d| d.as_secs_f64());
    let mut found = Vec::new();
    for call in &calls {
        let serial = call.serial.map(u64::from);
        let timeout = Duration::from_secs_f64(AFTER_READY_S + 1.0).saturating_sub(ready.at.elapsed());
        found.push(
            plegwatch.wait_for(timeout, |e| e.is("stall") && e.u64("/pid") == Some(u64::from(pid)) && e.u64("/detail/serial") == serial),
        );
    }
    let still_stopped = proc_state(service.pid());
    let thawed = service.thaw()?;
    for stall in found.iter().flatten() {
        wait_resolved(&mut plegwatch, stall, Duration::from_secs_f64(RESOLVE_LATE_S + 2.0));
    }
    let status = client.wait_exit(EXIT_TIMEOUT)?;
    let listener_running = listener.running();
    let events = plegwatch.stop()?;
    let all = || dump(&events, called);
    eprintln!(
        "{}: plegwatch ready {:.3}s after the call; service thawed {:.3}s after it; per-CPU task \
         clock skew {skew:.3}s",
        caller.comm(),
        ready.at.duration_since(called).as_secs_f64(),
        thawed.duration_since(called).as_secs_f64()
    );
    assert_eq!(still_stopped, Some('T'), "the service was no longer stopped while the calls were open");
    // The startup sweep says what it found.
    let sweep = events.iter().find(|e| e.is("sweep")).unwrap_or_else(|| panic!("no sweep line:\n{}", all()));
    assert!(sweep.u64("/dbus_calls").unwrap_or(0) >= 1, "the sweep found no queued D-Bus call:\n{}", all());

    let last_sent = calls.iter().map(|c| c.time).fold(f64::MIN, f64::max);
    let mut reports = Vec::new();
    for (call, stall) in calls.iter().zip(found) {
        let what = format!("{}'s {}.{}", caller.comm(), call.interface.as_deref().unwrap_or("?"), call.member.as_deref().unwrap_or("?"));
        let stall = stall.unwrap_or_else(|| {
            panic!(
                "no stall line for {what} (serial {:?}) within {AFTER_READY_S}s of ready; lines \
                 timed from the call:\n{}",
                call.serial,
                all()
            )
        });
        assert_dbus_stall(
            &stall,
            &ExpectedStall {
                caller_pid: pid,
                caller_tids: &caller_tids,
                comm: caller.comm(),
                call,
                service_pid: service.pid(),
                holder_link: "sits unread in this process's socket",
                before_attach: true,
            },
            &all,
        );

        let after_ready = stall.at.duration_since(ready.at).as_secs_f64();
        // The real age when the line was printed, and the time since the caller last sent
        // anything: a sound lower bound lies between the two.
        let age = clocks.wall(stall.at) - call.time;
        let quiet = clocks.wall(stall.at) - last_sent;
        let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
        let started_at = rfc3339_secs(stall.str("/started_at").unwrap_or_default()).unwrap_or(f64::NAN);
        eprintln!(
            "{what}: reported {after_ready:.3}s after ready; waited_s {waited:.3} for a real \
             age of {age:.3}s ({:+.3}s); started_at {:+.3}s off the monitor's stamp",
            waited - age,
            started_at - call.time
        );
        assert!(
            after_ready <= AFTER_READY_S,
            "{what} reported {after_ready:.3}s after the ready line, not within \
             {AFTER_READY_S}s:\n{}",
            all()
        );
        assert!(
            waited <= age + OVER_S + skew,
            "waited_s {waited:.3} for {what} exceeds its real age of {age:.3}s (sent at \
             {:.3}s, per dbus-monitor) by more than {OVER_S}s + the {skew:.3}s task clock skew: \
             not a lower bound. {}\n{}",
            clocks.instant(call.time).duration_since(called).as_secs_f64(),
            stall.json,
            all()
        );
        assert!(
            waited >= quiet - UNDER_S,
            "waited_s {waited:.3} for {what}: the caller has sent nothing for {quiet:.3}s, \
             so it is at least that old:\n{}",
            all()
        );

        let ResolvedCall { real, total } = assert_resolved_after_reply(&mut monitor, &events, &stall, call, &sender, &clocks, &all);
        assert!(
            total >= waited && total <= real + RESOLVE_LATE_S,
            "resolved waited_s {total} for {what}, answered after {real:.3}s (stall said \
             {waited:.3}):\n{}",
            all()
        );
        reports.push(stall);
    }

    // One report per call, and nothing about the listener, the monitor, the service or the
    // bus daemon.
    let ids = stall_ids(&events, pid);
    assert_eq!(ids.len(), calls.len(), "stall ids {ids:?} for {} calls:\n{}", calls.len(), all());
    assert_bystanders_quiet(&events, &listener, &monitor, &service, &bus, &all);
    assert!(listener_running, "the listener exited during the test: it should listen forever");
    assert!(status.success(), "{} failed: {status}", caller.comm());
    Ok(reports)
}
