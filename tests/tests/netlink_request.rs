//! Netlink requests left unanswered (stall-catalog pattern 5: a CNI daemon blocked in
//! `recvfrom` on AF_NETLINK), made by real sockets in a network namespace of the test's own.
//!
//! - `route_request_without_reply_is_flagged`: RTM_NEWLINK on lo with NLM_F_REQUEST only. The
//!   kernel applies it (a no-op) and sends nothing back; the client then blocks in `recvfrom`.
//! - `usersock_request_to_silent_peer_is_flagged`: a NETLINK_USERSOCK request with
//!   NLM_F_REQUEST|NLM_F_ACK to a peer process bound to a fixed portid that never reads.
//! - `route_request_amid_ip_traffic_only_the_client_is_flagged`: the first case again, while
//!   `ip monitor` listens in the same namespace and `ip addr show`, `ip route show` and
//!   `ip link set lo up` run every 100 ms there: only the client may be reported.
//!
//! Each waiter is an `nl_client` process (single-threaded, so pid == tid) started after
//! plegwatch is ready; it prints `PID TID sent fd=FD` once its request is out. Each test
//! starts its own plegwatch with `--warn 2s` and requires the report within 1 s of the wait
//! crossing 2 s, and a `resolved` line for the same id once the client is killed.
//!

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use plegwatch_scenarios::child::Proc;
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::incidents;
use plegwatch_scenarios::netlink::{assert_client_stall, assert_resolved_after_kill, bad_line, stalls_of_comm, Client, IpTraffic, NetNs};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::stall::{wait_resolved, PLEG_BUDGET_S};
use plegwatch_scenarios::{preflight, Event, Plegwatch};

const NL_CLIENT: &str = env!("CARGO_BIN_EXE_nl_client");
const WARN: &str = "2s";
const WARN_S: f64 = 2.0;
/// A report may come this long after the wait crosses `--warn`.
const SLACK_S: f64 = 1.0;
/// The test reads the client's `sent` line a little after the request went out.
const EARLY_S: f64 = 0.1;
/// How late a `resolved` line may be, and how far its `waited_s` may be off, for the
/// approximate end of a netlink wait (plegwatch notices it at its next scans).
const RESOLVE_LATE: Duration = Duration::from_millis(3500);
/// How long the client stays blocked: past the report, so that the wait is seen going on.
const HOLD: Duration = Duration::from_secs(4);

const ROUTE_SEQ: u32 = 0x5eed_0001;
const USERSOCK_SEQ: u32 = 0x5eed_0002;
const USERSOCK_PORTID: u32 = 0x7e57_0001;
const USERSOCK_TYPE: u16 = 0x10;

/// What a freshly sent request must be reported as.
struct Expect<'a> {
    protocol: &'a str,
    message_type: Value,
    flags: &'a str,
    seq: u32,
    reply_expected: bool,
    /// The link to the holder (`chain[0].edge`) and the holder's kind.
    holder: Option<(&'a str, &'a str)>,
}

fn route_expect() -> Expect<'static> {
    Expect {
        protocol: "route",
        message_type: json!("RTM_NEWLINK"),
        flags: "REQUEST",
        seq: ROUTE_SEQ,
        reply_expected: false,
        holder: Some(("no_reply", "kernel")),
    }
}

fn start_plegwatch() -> anyhow::Result<Plegwatch> {
    let mut plegwatch = Plegwatch::start(&["--warn", WARN])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    Ok(plegwatch)
}

fn start_route_client(ns: &NetNs) -> anyhow::Result<Client> {
    Client::route_noreply(NL_CLIENT.as_ref(), ns, ROUTE_SEQ)
}

/// Waits for the first stall line about `client`, failing with every line if none comes by
/// the latest moment it may.
fn wait_stall(plegwatch: &mut Plegwatch, client: &Client) -> Event {
    let deadline = client.sent + Duration::from_secs_f64(WARN_S + SLACK_S + 1.0);
    let left = deadline.saturating_duration_since(Instant::now());
    let pid = client.pid;
    plegwatch.wait_for(left, |e| e.is_about("stall", pid)).unwrap_or_else(|| {
        panic!(
            "no stall line for the netlink client (pid {pid}) within {:.1}s of its request; \
                 lines timed from the request:\n{}",
            WARN_S + SLACK_S + 1.0,
            dump(plegwatch.events(), client.sent)
        )
    })
}

/// Asserts that `stall` reports the request `client` made after plegwatch started, on time.
fn assert_fresh_stall(events: &[Event], stall: &Event, client: &Client, want: &Expect) {
    let bad = |what: &str| bad_line(stall, events, client.sent, what);
    let field = |p: &str| stall.get(p).cloned().unwrap_or(Value::Null);

    assert_client_stall(stall, client, want.protocol, false, &bad);
    assert_eq!(field("/detail/message_type"), want.message_type, "{}", bad("wrong detail.message_type"));
    assert_eq!(field("/detail/flags"), want.flags, "{}", bad("wrong detail.flags"));
    assert_eq!(field("/detail/seq"), want.seq, "{}", bad("wrong detail.seq"));
    assert_eq!(field("/detail/reply_expected"), want.reply_expected, "{}", bad("wrong detail.reply_expected"));
    if let Some((edge, holder)) = want.holder {
        assert_eq!(field("/chain/0/edge"), edge, "{}", bad("wrong chain[0].edge (the link to the holder)"));
        assert_eq!(field("/holder/kind"), holder, "{}", bad("wrong holder.kind"));
    }

    let arrived = stall.at.duration_since(client.sent).as_secs_f64();
    assert!(
        (WARN_S - EARLY_S..=WARN_S + SLACK_S).contains(&arrived),
        "{}",
        bad(&format!("reported {arrived:.3}s after the request, not within [{WARN_S}, {}]", WARN_S + SLACK_S))
    );
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    assert!(
        (WARN_S..=WARN_S + SLACK_S).contains(&waited),
        "{}",
        bad(&format!("waited_s {waited} not in [{WARN_S}, {}]", WARN_S + SLACK_S))
    );
    let blocked = stall.f64("/detail/recv_blocked_s").unwrap_or(f64::NAN);
    assert!(blocked > 0.0 && blocked <= waited, "{}", bad(&format!("detail.recv_blocked_s {blocked} not in (0, waited_s {waited}]")));
    let budget = stall.f64("/budget_used").unwrap_or(f64::NAN);
    assert!((budget - waited / PLEG_BUDGET_S).abs() < 1e-6, "{}", bad(&format!("budget_used {budget} is not waited_s/{PLEG_BUDGET_S}")));
    let started_at = stall.str("/started_at").unwrap_or_default();
    let started_at =
        OffsetDateTime::parse(started_at, &Rfc3339).unwrap_or_else(|e| panic!("{}", bad(&format!("started_at {started_at:?}: {e}"))));
    let sent_wall = OffsetDateTime::from(client.sent_wall);
    let off = (started_at - sent_wall).as_seconds_f64();
    assert!(off.abs() <= SLACK_S, "{}", bad(&format!("started_at is {off:+.3}s off the moment the request was sent")));
    let stack = stall.get("/kernel_stack").and_then(Value::as_array).cloned().unwrap_or_default();
    assert!(stack.iter().any(|f| f == "netlink_recvmsg"), "{}", bad("kernel_stack does not show the thread in netlink_recvmsg"));
    eprintln!(
        "{} request of pid {}: reported {arrived:.3}s after it was sent ({:+.3}s after the \
         {WARN_S}s crossing), waited_s {waited:.3}, recv_blocked_s {blocked:.3}, started_at \
         {off:+.3}s off",
        want.protocol,
        client.pid,
        arrived - WARN_S
    );
}

/// Keeps the client blocked until `HOLD` after its request, then kills it: returns the kill.
fn hold_then_kill(client: &mut Client) -> anyhow::Result<Instant> {
    let until = client.sent + HOLD;
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    anyhow::ensure!(client.proc.running(), "the client (pid {}) stopped blocking: its recvfrom returned", client.pid);
    client.proc.kill()
}

/// The life of a request that gets no reply: its first stall line (awaited as [`wait_stall`]
/// does), the kill that ends the wait ([`hold_then_kill`]), and time for the `resolved` line
/// to come. Returns the stall line and the moment of the kill.
fn stall_then_kill(plegwatch: &mut Plegwatch, client: &mut Client) -> anyhow::Result<(Event, Instant)> {
    let stall = wait_stall(plegwatch, client);
    let killed = hold_then_kill(client)?;
    wait_resolved(plegwatch, &stall, RESOLVE_LATE + Duration::from_secs(1));
    Ok((stall, killed))
}

/// Asserts that `stall` reports the request `client` made as `want` says, on time
/// ([`assert_fresh_stall`]), and that it was resolved within [`RESOLVE_LATE`] of the kill.
fn assert_flagged_then_resolved(events: &[Event], stall: &Event, client: &Client, killed: Instant, want: &Expect) {
    assert_fresh_stall(events, stall, client, want);
    assert_resolved_after_kill(events, stall, client.sent, killed, RESOLVE_LATE);
}

#[test]
fn route_request_without_reply_is_flagged() -> anyhow::Result<()> {
    preflight::require();
    let ns = NetNs::new("route")?;
    let mut plegwatch = start_plegwatch()?;
    let mut client = start_route_client(&ns)?;

    let (stall, killed) = stall_then_kill(&mut plegwatch, &mut client)?;
    let events = plegwatch.stop()?;

    assert_flagged_then_resolved(&events, &stall, &client, killed, &route_expect());
    // One incident, ending where the kernel never answered.
    let chain = one_incident_chain(&events, &client, killed);
    let text = incidents::chain_text(&chain);
    assert_eq!(chain.last().and_then(|h| h["kind"].as_str()), Some("kernel"), "{text}");
    assert_eq!((chain[0]["edge"].as_str(), chain[0]["exactness"].as_str()), (Some("no_reply"), Some("exact")), "{text}");
    Ok(())
}

/// The chain of the one incident the client's request raised, raised within 1 s of --warn
/// and resolved after the client was killed.
fn one_incident_chain(events: &[Event], client: &Client, killed: Instant) -> Vec<serde_json::Value> {
    let mine = |h: &serde_json::Value| h["kind"] == "netlink_request" && h["pid"].as_u64() == Some(u64::from(client.pid));
    let i = incidents::the_one(events, Duration::from_secs_f64(WARN_S), Some(killed), mine)
        .unwrap_or_else(|e| panic!("{e}\n{}", dump(events, client.sent)));
    let chain = incidents::Incident::chain(i.last());
    eprintln!(
        "incident #{} raised {:.3}s after crossing --warn; chain:\n{}",
        i.id,
        i.raised_after_warn(Duration::from_secs_f64(WARN_S)).as_secs_f64(),
        incidents::chain_text(&chain)
    );
    chain
}

/// A request that expects a reply (ACK) sent to a peer process that never reads: flagged with
/// the peer as its holder, and resolved within the usual bound once its sender is killed (the
/// exit closes the socket without a close(2), so plegwatch must notice the death itself).
#[test]
fn usersock_request_to_silent_peer_is_flagged() -> anyhow::Result<()> {
    preflight::require();
    let ns = NetNs::new("usersock")?;
    let mut plegwatch = start_plegwatch()?;
    let portid = USERSOCK_PORTID.to_string();
    let peer = Client::start(
        NL_CLIENT.as_ref(),
        "nl_client usersock-peer",
        &["usersock-peer", "--netns", ns.name(), "--portid", &portid],
        "bound",
    )?;
    let mut client = Client::start(
        NL_CLIENT.as_ref(),
        "nl_client usersock-request",
        &[
            "usersock-request",
            "--netns",
            ns.name(),
            "--portid",
            &portid,
            "--seq",
            &USERSOCK_SEQ.to_string(),
            "--type",
            &USERSOCK_TYPE.to_string(),
        ],
        "sent",
    )?;

    let (stall, killed) = stall_then_kill(&mut plegwatch, &mut client)?;
    let events = plegwatch.stop()?;

    assert_flagged_then_resolved(
        &events,
        &stall,
        &client,
        killed,
        &Expect {
            protocol: "usersock",
            // NETLINK_USERSOCK types have no names: plegwatch prints the number, as a string.
            message_type: json!(USERSOCK_TYPE.to_string()),
            flags: "REQUEST|ACK",
            seq: USERSOCK_SEQ,
            reply_expected: true,
            holder: Some(("netlink_peer", "process")),
        },
    );
    assert_eq!(
        stall.get("/holder/pid"),
        Some(&json!(peer.pid)),
        "the holder should be the usersock peer (pid {}) that never answers:\n{}",
        peer.pid,
        dump(&events, client.sent)
    );
    let evidence = stall.str("/chain/0/evidence").unwrap_or_default();
    assert!(
        evidence.contains(&format!("port id {USERSOCK_PORTID} ")),
        "the link names the port id: {evidence}\n{}",
        dump(&events, client.sent)
    );
    assert!(
        !events.iter().any(|e| e.is_about("stall", peer.pid)),
        "the usersock peer (pid {}), which never received, was reported:\n{}",
        peer.pid,
        dump(&events, client.sent)
    );
    // One incident, ending at the silent peer process.
    let chain = one_incident_chain(&events, &client, killed);
    let text = incidents::chain_text(&chain);
    let end = chain.last().expect("a chain");
    assert_eq!((end["kind"].as_str(), end["pid"].as_u64()), (Some("process"), Some(u64::from(peer.pid))), "{text}");
    assert_eq!((chain[0]["edge"].as_str(), chain[0]["exactness"].as_str()), (Some("netlink_peer"), Some("exact")), "{text}");
    Ok(())
}

#[test]
fn route_request_amid_ip_traffic_only_the_client_is_flagged() -> anyhow::Result<()> {
    preflight::require();
    let ns = NetNs::new("traffic")?;
    let mut plegwatch = start_plegwatch()?;
    let origin = Instant::now();
    let mut monitor = Proc::spawn("ip monitor", &mut ns.ip(&["monitor"]))?;
    std::thread::sleep(Duration::from_millis(300));
    let traffic = IpTraffic::start(ns.name(), Duration::from_millis(100))?;
    std::thread::sleep(Duration::from_secs(1));
    let mut client = start_route_client(&ns)?;

    let (stall, killed) = stall_then_kill(&mut plegwatch, &mut client)?;
    // Enough traffic for a real control, however slow the machine: the rounds after the
    // client's stall are still requests that must not be flagged.
    traffic.wait_rounds(20, Duration::from_secs(30));
    let rounds = traffic.stop()?;
    let monitor_alive = monitor.running();
    let monitor_lines = monitor.lines().len();
    let events = plegwatch.stop()?;
    let all = || dump(&events, origin);

    eprintln!(
        "ip traffic: {} rounds, {} commands, slowest {:.3}s; ip monitor printed {monitor_lines} \
         lines",
        rounds.rounds,
        rounds.commands,
        rounds.slowest.as_secs_f64()
    );
    assert!(monitor_alive, "ip monitor (pid {}) exited during the test:\n{}", monitor.pid(), all());
    assert!(rounds.rounds >= 20, "only {} rounds of ip requests ran: the negative control is too thin", rounds.rounds);
    let ours: Vec<u64> = rounds.pids.iter().chain([monitor.pid()].iter()).map(|&p| u64::from(p)).collect();
    let ip_stalls = stalls_of_comm(&events, "ip");
    assert!(
        ip_stalls.is_empty() && !events.iter().any(|e| e.is("stall") && e.u64("/pid").is_some_and(|p| ours.contains(&p))),
        "plegwatch reported ip processes (ip monitor is pid {}), which only listen or get \
         their replies at once:\n{}",
        monitor.pid(),
        all()
    );
    assert_flagged_then_resolved(&events, &stall, &client, killed, &route_expect());
    let others: Vec<_> =
        events.iter().filter(|e| e.is("stall") && e.u64("/pid") != Some(u64::from(client.pid))).map(|e| e.json.to_string()).collect();
    if !others.is_empty() {
        eprintln!("note: stall lines about other processes of this host: {others:#?}");
    }
    Ok(())
}
