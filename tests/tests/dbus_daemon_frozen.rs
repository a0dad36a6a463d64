//! A D-Bus call whose bus daemon freezes while the call is open (SIGSTOP after the call went
//! through it to a frozen service). plegwatch asks the daemon who owns the destination; the
//! daemon cannot answer. That question must never hold up the scan loop: each 250 ms scan
//! still starts on time (the summary's `scans.late_max_ms`), the call is still reported on
//! time, and its incident ends at a stopped process.

use std::time::{Duration, Instant};

use plegwatch_scenarios::dbus::{self, dbus_send_call, proc_state, FrozenService, PrivateBus};
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
