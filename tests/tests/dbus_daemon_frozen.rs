//! A D-Bus call whose bus daemon freezes while the call is open (SIGSTOP after the call went
//! through it to a frozen service). plegwatch asks the daemon who owns the destination; the
//! daemon cannot answer. That question must never hold up the scan loop: each 250 ms scan
//! still starts on time (the summary's `scans.late_max_ms`), the call is still reported on
//! time, and its incident ends at a stopped process.
//!
//! And a daemon that is only late: frozen while a call sits unread in its socket, so that
//! plegwatch's question times out and the daemon is named the holder ("does not answer
//! who owns"), then thawed while the service stays frozen. That answer was not the last
//! word: plegwatch asks again, and the incident moves on to the owner, the frozen service.

use std::time::{Duration, Instant};

use plegwatch_scenarios::dbus::{self, dbus_send_call, proc_state, FrozenService, HeldCall, PrivateBus};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{incidents, preflight, Plegwatch};

const WARN: Duration = Duration::from_secs(2);
const SERVICE: &str = "com.example.Frozen";
/// How long a scan may take, and how late it may start after its tick. Asking a stuck
/// daemon on the loop made one scan take the lookup's 500 ms timeout (512 ms measured) and
/// the next start 264 ms late.
const LATE_MAX_MS: f64 = 200.0;

/// Continues a stopped process on drop, so that a failing test leaves no frozen daemon.
struct Thaw(u32);

impl Drop for Thaw {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a pid this test stopped itself.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

#[test]
fn a_frozen_bus_daemon_never_makes_a_scan_late() -> anyhow::Result<()> {
    preflight::require();
    let bus = PrivateBus::start()?;
    let mut service = FrozenService::start(&bus, SERVICE)?;
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    let called = Instant::now();
    let mut send = dbus::spawn("dbus-send", &mut dbus_send_call(&bus))?;
    let send_pid = send.pid();
    // Let the call reach the daemon and go on to the frozen service, then freeze the daemon.
    std::thread::sleep(Duration::from_millis(300));
    let daemon = bus.daemon_pid();
    // SAFETY: kill(2) on the daemon this test started.
    anyhow::ensure!(unsafe { libc::kill(daemon as libc::pid_t, libc::SIGSTOP) } == 0, "SIGSTOP to dbus-daemon");
    let thaw_daemon = Thaw(daemon);
    let stall = plegwatch.wait_for(WARN + Duration::from_secs(2), |e| e.is_about_pid("stall", send_pid));
    // Long enough for several lookups to time out while scans go on.
    let raised = plegwatch.wait_for(Duration::from_secs(4), |e| {
        e.is("incident") && incidents::Incident::chain(e).last().is_some_and(|h| h["kind"] == "process")
    });
    // A few more scans with the daemon still frozen.
    std::thread::sleep(Duration::from_secs(1));
    let daemon_state = proc_state(daemon);
    drop(thaw_daemon);
    service.thaw()?;
    let lifted = Instant::now();
    let status = send.wait_exit(Duration::from_secs(10))?;
    plegwatch.wait_for(Duration::from_secs(4), |e| e.is("incident_resolved"));
    let events = plegwatch.stop()?;
    let all = || dump(&events, called);

    assert_eq!(daemon_state, Some('T'), "the daemon was not stopped while the call was open");
    assert!(status.success(), "dbus-send failed after the thaw: {status}");
    let stall = stall.unwrap_or_else(|| panic!("no dbus_call stall for dbus-send (pid {send_pid}):\n{}", all()));
    assert_eq!(stall.str("/kind"), Some("dbus_call"), "{}", all());
    assert!(raised.is_some(), "no incident reached a process while the daemon was frozen:\n{}", all());
    let mine = |h: &serde_json::Value| h["kind"] == "dbus_call" && h["pid"].as_u64() == Some(u64::from(send_pid));
    let i = incidents::the_one(&events, WARN, Some(lifted), mine).unwrap_or_else(|e| panic!("{e}\n{}", all()));
    let stopped = |h: &serde_json::Value| h["kind"] == "process" && h["what"].as_str().is_some_and(|w| w.contains("state T"));
    let line = i.line_where(|c| c.last().is_some_and(stopped)).expect("a chain to a stopped process");
    let chain = incidents::Incident::chain(line);
    let text = incidents::chain_text(&chain);
    let end = chain.last().expect("a chain");
    assert!(end["what"].as_str().is_some_and(|w| w.contains("state T")), "the chain ends at a stopped process:\n{text}");
    let end_pid = end["pid"].as_u64().unwrap_or(0);
    assert!(
        [u64::from(daemon), u64::from(service.pid())].contains(&end_pid),
        "the chain ends at the frozen daemon ({daemon}) or the frozen service ({}):\n{text}",
        service.pid()
    );

    let summary = events.iter().rev().find(|e| e.is("summary")).expect("stop() checks for a summary");
    let late = summary.f64("/scans/late_max_ms").unwrap_or(f64::MAX);
    let took = summary.f64("/scans/took_max_ms").unwrap_or(f64::MAX);
    let scans = summary.u64("/scans/scans").unwrap_or(0);
    assert!(scans >= 12, "only {scans} scans in the run:\n{}", all());
    assert!(took <= LATE_MAX_MS, "a scan took {took:.1} ms while the daemon was frozen (want <= {LATE_MAX_MS} ms):\n{}", all());
    assert!(late <= LATE_MAX_MS, "a scan started {late:.1} ms late while the daemon was frozen (want <= {LATE_MAX_MS} ms):\n{}", all());
    eprintln!(
        "incident #{} raised {:.3}s after crossing --warn; {scans} scans, longest {took:.1} ms, latest {late:.1} ms late; chain:\n{text}",
        i.id,
        i.raised_after_warn(WARN).as_secs_f64()
    );
    Ok(())
}

#[test]
fn a_bus_daemon_that_answers_late_is_asked_again() -> anyhow::Result<()> {
    preflight::require();
    let bus = PrivateBus::start()?;
    let mut service = FrozenService::start(&bus, SERVICE)?;
    let mut caller = HeldCall::start(&bus)?;
    let caller_pid = caller.pid();
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    // Freeze the daemon, then call: the call sits unread in the daemon's socket, and
    // plegwatch's question to the daemon (who owns the name?) cannot be answered.
    let daemon = bus.daemon_pid();
    // SAFETY: kill(2) on the daemon this test started.
    anyhow::ensure!(unsafe { libc::kill(daemon as libc::pid_t, libc::SIGSTOP) } == 0, "SIGSTOP to dbus-daemon");
    let thaw_daemon = Thaw(daemon);
    while proc_state(daemon) != Some('T') {
        std::thread::sleep(Duration::from_millis(10));
    }
    let called = caller.call()?;
    let names_daemon =
        |e: &plegwatch_scenarios::Event| e.is_about_pid("stall", caller_pid) && e.u64("/holder/pid") == Some(u64::from(daemon));
    let first = plegwatch.wait_for(WARN + Duration::from_secs(3), |e| e.is_about_pid("stall", caller_pid));
    // Thawed: the daemon hands the call to the service (frozen still) and can say who
    // owns the name.
    drop(thaw_daemon);
    let thawed = Instant::now();
    let owner = |h: &serde_json::Value| {
        h["pid"].as_u64() == Some(u64::from(service.pid())) && h["what"].as_str().is_some_and(|w| w.contains("state T"))
    };
    let moved =
        plegwatch.wait_for(Duration::from_secs(10), |e| e.is("incident") && incidents::Incident::chain(e).last().is_some_and(owner));
    let moved_at = Instant::now();
    service.thaw()?;
    caller.wait_reply(Duration::from_secs(10))?;
    plegwatch.wait_for(Duration::from_secs(4), |e| e.is("incident_resolved"));
    let events = plegwatch.stop()?;
    let all = || dump(&events, called);

    let first = first.unwrap_or_else(|| panic!("no dbus_call stall for the caller (pid {caller_pid}):\n{}", all()));
    assert_eq!(first.str("/kind"), Some("dbus_call"), "{}", all());
    // The precondition: the question timed out, so the daemon was named.
    assert!(names_daemon(&first), "the first stall line does not name the frozen daemon ({daemon}) as the holder:\n{}", all());
    assert!(
        first.str("/chain/0/evidence").is_some_and(|e| e.contains("does not answer who owns")),
        "the first stall line's link does not say the daemon did not answer:\n{}",
        all()
    );
    let moved = moved.unwrap_or_else(|| {
        panic!("no incident line reached the frozen service ({}) after the daemon was thawed:\n{}", service.pid(), all())
    });
    let chain = incidents::Incident::chain(&moved);
    let text = incidents::chain_text(&chain);
    let link = &chain[0];
    assert_eq!(link["pid"].as_u64(), Some(u64::from(caller_pid)), "the chain starts at the caller:\n{text}");
    assert_eq!(link["exactness"], "exact", "the owner, as the daemon said, is exact:\n{text}");
    assert!(
        link["evidence"].as_str().is_some_and(|e| e.contains(&format!("owner of {SERVICE}"))),
        "the link names the owner of {SERVICE}:\n{text}"
    );
    eprintln!(
        "the daemon was named first; {:.3}s after the thaw the incident moved on to the frozen service:\n{text}",
        moved_at.duration_since(thawed).as_secs_f64()
    );
    Ok(())
}
