//! A netlink request left unanswered *before* plegwatch started.
//!
//! In a namespace of the test's own, `ip monitor` listens (a socket with multicast groups,
//! blocked in recv by design) and an `nl_client` sends RTM_NEWLINK on lo without NLM_F_ACK,
//! then blocks in `recvfrom` for a reply that never comes. 10 s later plegwatch starts with
//! `--warn 2s`. Its startup sweep must find the client's socket in `/proc/PID/net/netlink`
//! (the namespace's table, not the host's), see the thread blocked in a receive on it, and
//! report it within 2 s of the ready line, marked `started_before_attach`, with a `waited_s`
//! lower bound close to the 10 s the thread really slept. `ip monitor` must not be reported.
//! Killing the client then closes the wait.

use std::time::Duration;

use serde_json::{json, Value};

use plegwatch_scenarios::child::Proc;
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::netlink::{assert_client_stall, assert_resolved_after_kill, bad_line, stalls_of_comm, Client, NetNs};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::stall::wait_resolved;
use plegwatch_scenarios::{preflight, Plegwatch};

const NL_CLIENT: &str = env!("CARGO_BIN_EXE_nl_client");
const HEAD_START: Duration = Duration::from_secs(10);
/// The report must come this soon after the ready line.
const AFTER_READY_S: f64 = 2.0;
/// The `waited_s` lower bound may fall this much short of the head start.
const MIN_WAITED_S: f64 = 9.0;
/// How long after the report to keep watching for a (wrong) report of `ip monitor`: it has
/// been blocked for longer than --warn since before plegwatch started.
const WATCH_MONITOR: Duration = Duration::from_secs(3);
/// How late the `resolved` line may be after the kill, and how far off its `waited_s`.
const RESOLVE_LATE: Duration = Duration::from_millis(3500);
const SEQ: u32 = 0x5eed_0003;

#[test]
fn netlink_request_that_began_before_start_is_swept() -> anyhow::Result<()> {
    preflight::require();
    let ns = NetNs::new("swept")?;
    let mut monitor = Proc::spawn("ip monitor", &mut ns.ip(&["monitor"]))?;
    let mut client = Client::route_noreply(NL_CLIENT.as_ref(), &ns, SEQ)?;
    std::thread::sleep(HEAD_START);
    anyhow::ensure!(client.proc.running(), "the client (pid {}) stopped blocking during the head start", client.pid);
    anyhow::ensure!(monitor.running(), "ip monitor exited during the head start");

    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    let ready = plegwatch.wait_ready(READY_TIMEOUT)?;
    let pid = client.pid;
    let stall = plegwatch.wait_for(Duration::from_secs_f64(AFTER_READY_S + 3.0), |e| e.is_about("stall", pid));
    std::thread::sleep(WATCH_MONITOR);
    let killed = client.proc.kill()?;
    if let Some(stall) = &stall {
        wait_resolved(&mut plegwatch, stall, RESOLVE_LATE + Duration::from_secs(1));
    }
    let monitor_alive = monitor.running();
    let events = plegwatch.stop()?;
    let all = || dump(&events, client.sent);

    let Some(stall) = stall else {
        panic!(
            "no stall line for the netlink client (pid {pid}) blocked since {:.1}s before \
             plegwatch was ready; lines timed from its request:\n{}",
            ready.at.duration_since(client.sent).as_secs_f64(),
            all()
        );
    };
    let bad = |what: &str| bad_line(&stall, &events, client.sent, what);
    let field = |p: &str| stall.get(p).cloned().unwrap_or(Value::Null);

    assert_client_stall(&stall, &client, "route", true, &bad);
    // The startup sweep says what it found.
    let sweep = events.iter().find(|e| e.is("sweep")).unwrap_or_else(|| panic!("no sweep line:\n{}", all()));
    assert!(sweep.u64("/netlink_waiters").unwrap_or(0) >= 1, "the sweep found no netlink waiter:\n{}", all());
    // What was sent is unknown to a sweep: those fields must be null, not guessed.
    for key in ["message_type", "flags", "reply_expected"] {
        assert_eq!(field(&format!("/detail/{key}")), json!(null), "{}", bad(&format!("detail.{key} of a swept request is not null")));
    }
    let seq = field("/detail/seq");
    assert!(seq.is_null() || seq == SEQ, "{}", bad("detail.seq is neither null nor what was sent"));

    let after_ready = stall.at.duration_since(ready.at).as_secs_f64();
    assert!(
        after_ready <= AFTER_READY_S,
        "{}",
        bad(&format!("reported {after_ready:.3}s after the ready line, later than {AFTER_READY_S}s"))
    );
    let real = stall.at.duration_since(client.sent).as_secs_f64();
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    assert!(
        waited >= MIN_WAITED_S && waited <= real + 0.1,
        "{}",
        bad(&format!(
            "waited_s {waited} not in [{MIN_WAITED_S}, {real:.3}] (the thread had been blocked \
             {real:.3}s when the line came)"
        ))
    );
    let blocked = stall.f64("/detail/recv_blocked_s").unwrap_or(f64::NAN);
    assert!(
        blocked >= MIN_WAITED_S && blocked <= real + 0.1,
        "{}",
        bad(&format!("detail.recv_blocked_s {blocked} not in [{MIN_WAITED_S}, {real:.3}]"))
    );
    eprintln!(
        "swept netlink request of pid {pid}: ready {:.3}s after the request, reported {after_ready:.3}s \
         after ready, waited_s {waited:.3} (lower bound of a real {real:.3}s), recv_blocked_s \
         {blocked:.3}",
        ready.at.duration_since(client.sent).as_secs_f64()
    );

    assert!(monitor_alive, "ip monitor (pid {}) exited during the test:\n{}", monitor.pid(), all());
    assert!(
        stalls_of_comm(&events, "ip").is_empty() && !events.iter().any(|e| e.is_about("stall", monitor.pid())),
        "plegwatch reported ip monitor (pid {}), a multicast listener blocked in recv by \
         design, or another ip process:\n{}",
        monitor.pid(),
        all()
    );

    assert_resolved_after_kill(&events, &stall, client.sent, killed, RESOLVE_LATE);
    Ok(())
}
