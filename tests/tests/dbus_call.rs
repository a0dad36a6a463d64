//! D-Bus method calls to a frozen service, made while plegwatch watches (stall pattern 4:
//! runc → systemd over D-Bus, never answered).
//!
//! A private `dbus-daemon`; `dbus-test-tool echo` owns `com.example.Frozen` and is stopped
//! with SIGSTOP. Two real clients call it: `dbus-send` (libdbus, one thread, blocks in poll)
//! and `gdbus call` (GLib, waits on a worker thread). `gdbus call` first asks
//! `Introspectable.Introspect`, gives up on it after 3 s, then sends `Hello`, so it leaves two
//! unanswered calls, the second 3 s after the first. A `gdbus monitor` signal listener runs
//! all along (it blocks in poll forever, by design). `dbus-monitor` times every message to and
//! from the service: it is the ground truth for when each call went out, with which serial
//! and from which connection, and when its reply came.
//!
//! Each call must be reported within a second of crossing `--warn`, naming the caller, the
//! call and the frozen service as holder (the owner of the name, asked of the bus); the listener must
//! not be. After SIGCONT every call must be resolved, and both clients must succeed.

use std::time::{Duration, Instant};

use plegwatch_scenarios::dbus::{
    self, assert_bystanders_quiet, assert_dbus_stall, assert_resolved_after_reply, dbus_send_call, gdbus_call, proc_state, rfc3339_secs,
    stall_ids, start_signal_listener, tids, BusMonitor, Clocks, ExpectedStall, FrozenService, MsgKind, PrivateBus, ResolvedCall, Seen,
    INTROSPECT, INTROSPECTABLE, MEMBER, OBJECT_PATH, RESOLVE_LATE_S, SERVICE,
};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::incidents;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::stall::wait_resolved;
use plegwatch_scenarios::{preflight, variants, Event, Plegwatch};

const WARN_S: f64 = 2.0;
/// A report may come this late after its wait crossed `--warn` (1 s, times the
/// scenarios' clock scale: 4 in a TCG guest).
fn slack_s() -> f64 {
    plegwatch_scenarios::timing::scaled(Duration::from_secs(1)).as_secs_f64()
}
/// `dbus-monitor` stamps a call when it reads its copy, a little after the caller wrote it.
const MONITOR_LAG_S: f64 = 0.1;
/// `started_at` may differ this much from the monitor's stamp of the call.
const STARTED_AT_SKEW_S: f64 = 0.5;
/// GLib's own timeout for the introspection `gdbus call` makes first (GLib 2.74).
const GDBUS_INTROSPECT_TIMEOUT_S: f64 = 3.0;
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

#[test]
fn calls_to_a_frozen_service_are_flagged_then_resolved() -> anyhow::Result<()> {
    preflight::require();
    let clocks = Clocks::now();
    let bus = PrivateBus::start()?;
    let mut service = FrozenService::start(&bus, SERVICE)?;
    let mut monitor = BusMonitor::start(&bus, SERVICE)?;

    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    let ready = plegwatch.wait_ready(READY_TIMEOUT)?;
    // The calls are seen by fentry/fexit on the syscalls' functions where the kernel
    // takes them (and has bpf_loop), else by the syscall tracepoints.
    variants::assert_variant(&ready, "socket_io", "fentry+fexit", (5, 17), "tracepoint syscalls:sys_exit_{write");
    variants::assert_variant(&ready, "socket_classify", "fentry+fexit", (5, 5), "tracepoint syscalls:sys_enter_socket");

    let mut listener = start_signal_listener(&bus)?;

    assert_eq!(proc_state(service.pid()), Some('T'), "the service (pid {}) is not stopped before the calls", service.pid());
    let called = Instant::now();
    let mut send = dbus::spawn("dbus-send", &mut dbus_send_call(&bus))?;
    let mut gcall = dbus::spawn("gdbus call", &mut gdbus_call(&bus))?;
    let (send_pid, gcall_pid) = (send.pid(), gcall.pid());

    // The three reports, each awaited until well past when it is due.
    let dbus_call_of = |pid: u32, member: &'static str| {
        move |e: &Event| {
            e.is("stall")
                && e.str("/kind") == Some("dbus_call")
                && e.u64("/pid") == Some(u64::from(pid))
                && e.str("/detail/member") == Some(member)
        }
    };
    let due = Duration::from_secs_f64(WARN_S + slack_s() + 2.0);
    let send_stall = plegwatch.wait_for(due, dbus_call_of(send_pid, MEMBER));
    let intro_stall = plegwatch.wait_for(due, dbus_call_of(gcall_pid, INTROSPECT));
    // gdbus sends its Hello only when GLib gives up on the Introspect: wait for the monitor
    // to see it go out (GDBUS_INTROSPECT_TIMEOUT_S after the spawn here), then for its report.
    let intro_sender = intro_stall.as_ref().and_then(|s| s.str("/detail/sender")).map(str::to_string);
    let hello_sent = monitor.wait(Duration::from_secs_f64(GDBUS_INTROSPECT_TIMEOUT_S * 3.0), |m| {
        m.kind == MsgKind::Call && m.member.as_deref() == Some(MEMBER) && m.sender.is_some() && m.sender == intro_sender
    });
    let hello_stall = match &hello_sent {
        Some(call) => plegwatch.wait_for(due.saturating_sub(clocks.instant(call.time).elapsed()), dbus_call_of(gcall_pid, MEMBER)),
        None => None,
    };
    // While the calls are open: the callers' threads, and who the bus says each sender is.
    let send_tids = tids(send_pid);
    let gcall_tids = tids(gcall_pid);
    let senders: Vec<(String, Result<u32, String>)> = [&send_stall, &intro_stall, &hello_stall]
        .into_iter()
        .flatten()
        .filter_map(|s| s.str("/detail/sender"))
        .map(|s| (s.to_string(), bus.pid_of(s).map_err(|e| format!("{e:#}"))))
        .collect();
    let still_stopped = proc_state(service.pid());

    let thawed = service.thaw()?;
    for stall in [&send_stall, &intro_stall, &hello_stall].into_iter().flatten() {
        wait_resolved(&mut plegwatch, stall, Duration::from_secs_f64(RESOLVE_LATE_S + 2.0));
    }
    let send_status = send.wait_exit(EXIT_TIMEOUT)?;
    let gcall_status = gcall.wait_exit(EXIT_TIMEOUT)?;
    let listener_running = listener.running();
    let events = plegwatch.stop()?;
    let all = || dump(&events, called);
    eprintln!(
        "plegwatch ready {:.3}s before the calls; service thawed {:.3}s after them",
        called.duration_since(ready.at).as_secs_f64(),
        thawed.duration_since(called).as_secs_f64()
    );

    assert_eq!(still_stopped, Some('T'), "the service was no longer stopped while the calls were open");
    let report = |stall: Option<Event>, what: &str| {
        stall.unwrap_or_else(|| {
            panic!(
                "no dbus_call stall line for {what} within its due time; lines timed from the \
                 calls:\n{}",
                all()
            )
        })
    };
    let send_stall = report(send_stall, "dbus-send's Hello");
    let intro_stall = report(intro_stall, "gdbus call's Introspect");
    assert!(
        hello_sent.is_some(),
        "dbus-monitor never saw gdbus call's Hello go out (GLib gives up on its Introspect \
         after {GDBUS_INTROSPECT_TIMEOUT_S}s, then sends it):\n{}",
        all()
    );
    let hello_stall = report(hello_stall, "gdbus call's Hello");

    // Each sender the stalls name is the caller's connection, as the bus itself says.
    for (sender, pid) in &senders {
        let pid = pid.as_ref().unwrap_or_else(|e| panic!("asking the bus for {sender}'s pid: {e}"));
        assert!([send_pid, gcall_pid].contains(pid), "the bus says {sender} is pid {pid}, none of the callers");
    }
    let pid_of_sender = |stall: &Event| {
        let sender = stall.str("/detail/sender").unwrap_or_default();
        senders.iter().find(|(s, _)| s == sender).and_then(|(_, p)| p.as_ref().ok().copied())
    };
    assert_eq!(pid_of_sender(&send_stall), Some(send_pid), "{}", all());
    assert_eq!(pid_of_sender(&intro_stall), Some(gcall_pid), "{}", all());
    assert_eq!(pid_of_sender(&hello_stall), Some(gcall_pid), "{}", all());

    let cases = [
        (&send_stall, send_pid, &send_tids[..], "dbus-send", SERVICE),
        (&intro_stall, gcall_pid, &gcall_tids[..], "gdbus", INTROSPECTABLE),
        (&hello_stall, gcall_pid, &gcall_tids[..], "gdbus", SERVICE),
    ];
    for (stall, pid, caller_tids, comm, interface) in cases {
        let sender = stall.str("/detail/sender").unwrap_or_default();
        let serial = stall.u64("/detail/serial").unwrap_or(0) as u32;
        let call: Seen = monitor
            .call(sender, serial)
            .unwrap_or_else(|| panic!("dbus-monitor saw no call {serial} from {sender}, which {} names:\n{}", stall.json, all()));
        assert_eq!(call.interface.as_deref(), Some(interface), "{call:?}");
        assert_eq!(call.path.as_deref(), Some(OBJECT_PATH), "{call:?}");
        assert_dbus_stall(
            stall,
            &ExpectedStall {
                caller_pid: pid,
                caller_tids,
                comm,
                call: &call,
                service_pid: service.pid(),
                holder_link: "owner of",
                before_attach: false,
            },
            &all,
        );
        let bus_path = bus.socket().to_str().unwrap_or_default();
        let evidence = stall.str("/chain/0/evidence").unwrap_or_default();
        assert!(evidence.contains(&format!("on the bus {bus_path}")), "the link names the bus: {}", stall.json);

        // On time: within slack_s() of the call crossing --warn.
        let sent = clocks.instant(call.time);
        let arrived = stall.at.duration_since(sent.min(stall.at)).as_secs_f64();
        let after_spawn = stall.at.duration_since(called).as_secs_f64();
        let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
        let skew = rfc3339_secs(stall.str("/started_at").unwrap_or_default()).unwrap_or(f64::NAN) - call.time;
        eprintln!(
            "{comm} {}: sent {:.3}s after the spawn; reported {arrived:.3}s after it was sent \
             ({after_spawn:.3}s after the spawn), waited_s {waited:.3}, started_at {skew:+.3}s \
             off",
            call.member.as_deref().unwrap_or("?"),
            sent.saturating_duration_since(called).as_secs_f64()
        );
        assert!(
            (WARN_S - MONITOR_LAG_S..=WARN_S + slack_s()).contains(&arrived),
            "{} reported {arrived:.3}s after it was sent, not within [{WARN_S}, {}]s:\n{}",
            stall.json,
            WARN_S + slack_s(),
            all()
        );
        assert!(
            (WARN_S..=WARN_S + slack_s()).contains(&waited),
            "waited_s {waited} not within [{WARN_S}, {}] in {}:\n{}",
            WARN_S + slack_s(),
            stall.json,
            all()
        );
        assert!(
            skew.abs() <= STARTED_AT_SKEW_S,
            "started_at is {skew:+.3}s off the monitor's stamp of the call in {}:\n{}",
            stall.json,
            all()
        );

        // Resolved once the thawed service answers.
        let ResolvedCall { real, total } = assert_resolved_after_reply(&mut monitor, &events, stall, &call, sender, &clocks, &all);
        assert!(
            total >= real - 0.25 && total <= real + RESOLVE_LATE_S,
            "resolved waited_s {total} for a call answered after {real:.3}s:\n{}",
            all()
        );
    }
    // dbus-send and gdbus's Introspect went out at once; gdbus's Hello only after GLib gave
    // up on the Introspect.
    for stall in [&send_stall, &intro_stall] {
        let after_spawn = stall.at.duration_since(called).as_secs_f64();
        assert!(after_spawn <= WARN_S + slack_s(), "{} came {after_spawn:.3}s after the spawn:\n{}", stall.json, all());
    }

    // Nothing else about the callers (one report each), and nothing about the listener, the
    // monitor, the frozen service or the bus daemon.
    assert_eq!(stall_ids(&events, send_pid), [send_stall.u64("/id").unwrap_or(0)], "{}", all());
    let gcall_ids = stall_ids(&events, gcall_pid);
    let mut want = vec![intro_stall.u64("/id").unwrap_or(0), hello_stall.u64("/id").unwrap_or(0)];
    want.sort_unstable();
    assert_eq!(gcall_ids, want, "{}", all());
    assert_bystanders_quiet(&events, &listener, &monitor, &service, &bus, &all);
    assert!(listener_running, "the listener exited during the test: it should listen forever");
    let signals = listener.lines().iter().filter(|(_, l)| l.contains("NameOwnerChanged")).count();
    assert!(signals > 0, "the listener got no NameOwnerChanged signal: it did not really listen");

    assert!(send_status.success(), "dbus-send failed: {send_status}");
    assert!(gcall_status.success(), "gdbus call failed: {gcall_status}");
    assert!(send.lines().iter().any(|(_, l)| l.starts_with("method return")), "dbus-send printed no method return: {:?}", send.lines());
    assert!(gcall.lines().iter().any(|(_, l)| l.trim() == "()"), "gdbus call printed no empty reply: {:?}", gcall.lines());

    // One incident: every call waits on the one frozen service (state T), its chain's end.
    let from_callers = |h: &serde_json::Value| {
        h["kind"] == "dbus_call" && [u64::from(send_pid), u64::from(gcall_pid)].contains(&h["pid"].as_u64().unwrap_or(0))
    };
    let i = incidents::the_one(&events, Duration::from_secs_f64(WARN_S), Some(thawed), from_callers)
        .unwrap_or_else(|e| panic!("{e}\n{}", all()));
    let line = i.last();
    let chain = incidents::Incident::chain(line);
    let text = incidents::chain_text(&chain);
    let end = chain.last().expect("a chain");
    assert_eq!(
        (end["kind"].as_str(), end["pid"].as_u64()),
        (Some("process"), Some(u64::from(service.pid()))),
        "the chain ends at the frozen service:\n{text}"
    );
    assert!(end["what"].as_str().is_some_and(|w| w.contains("state T")), "{text}");
    assert_eq!(
        (chain[chain.len() - 2]["edge"].as_str(), chain[chain.len() - 2]["exactness"].as_str()),
        (Some("dbus_owner"), Some("exact")),
        "{text}"
    );
    // Both callers' calls belong to it. An incident's line is printed again only when its
    // level, root or chain changes, not when one more caller joins it: a call that crossed
    // --warn after it was raised (gdbus 1.6 s after dbus-send in a loaded 6.1 guest) shows
    // on no incident line. Such a call's own stall line names the frozen service as its
    // holder, and no other incident was raised for the callers (`the_one`).
    let waits: Vec<u64> = line
        .get("/waits")
        .and_then(serde_json::Value::as_array)
        .map(|a| a.iter().filter_map(serde_json::Value::as_u64).collect())
        .unwrap_or_default();
    let in_a_line = |id: u64| {
        i.lines.iter().any(|l| l.get("/waits").and_then(serde_json::Value::as_array).is_some_and(|a| a.contains(&serde_json::json!(id))))
    };
    let held_by_service = |s: &plegwatch_scenarios::events::Event| s.u64("/holder/pid") == Some(u64::from(service.pid()));
    assert!(send_stall.u64("/id").is_some_and(in_a_line), "dbus-send's call is a wait of the incident (last: {waits:?})\n{}", all());
    for stall in [&send_stall, &intro_stall] {
        let id = stall.u64("/id").unwrap_or(0);
        assert!(
            in_a_line(id) || held_by_service(stall),
            "call #{id} is neither a wait of the incident (last: {waits:?}) nor held by the service:\n{}",
            stall.json
        );
    }
    eprintln!(
        "incident #{} raised {:.3}s after crossing --warn; chain:\n{text}",
        i.id,
        i.raised_after_warn(Duration::from_secs_f64(WARN_S)).as_secs_f64()
    );
    Ok(())
}
