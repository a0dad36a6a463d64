//! A netlink socket's fd reused for something else must not be parsed as netlink.
//!
//! plegwatch's kernel side classifies sockets per (process, fd). When the fd of a tracked
//! netlink socket comes to name another file without a `close(2)`, the class must go with the
//! old file: `dup2`/`dup3` onto it, `close_range` over it, an exec that closes it (CLOEXEC).
//!
//! Each test runs one `nl_client route-then-reuse` (single-threaded, so pid == tid) in a
//! network namespace of its own, under a plegwatch started with `--warn 2s`:
//! 1. it sends RTM_NEWLINK on lo with NLM_F_REQUEST only, which the kernel never answers, and
//!    blocks in `recvfrom` for 3.5 s: plegwatch must report that request (kind
//!    `netlink_request`, its seq and fd), which proves the probes see that fd's traffic;
//! 2. the receive times out, and the fd is reused for one end of an AF_UNIX socketpair (by
//!    `dup2`, `dup3`, `close_range(fd, fd)`, `close_range(3, ~0U)` or an exec);
//! 3. on that fd it writes the bytes of a netlink request that expects a reply (RTM_GETLINK,
//!    NLM_F_REQUEST|NLM_F_ACK, another seq) and blocks reading for 4.5 s, well past `--warn`.
//!
//! plegwatch must report nothing about the client after the first request: neither the bytes
//! on the socketpair as a request, nor the first request again. And the first request's
//! stall must be resolved (its receive ended).

use std::time::{Duration, Instant};

use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::netlink::{assert_client_stall, bad_line, Client, NetNs};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, variants, Plegwatch};

const NL_CLIENT: &str = env!("CARGO_BIN_EXE_nl_client");
const WARN: &str = "2s";
const WARN_S: f64 = 2.0;
/// A report may come this long after the wait crosses `--warn`.
const SLACK_S: f64 = 1.0;
/// How long the first receive blocks before it times out: past `--warn`, so it is reported.
const FIRST_WAIT_MS: u32 = 3500;
/// How long the client is left blocked reading the reused fd: past `--warn` and a few scans.
const HOLD_AFTER_REUSE: Duration = Duration::from_millis(4500);

const FIRST_SEQ: u32 = 0x5eed_0101;
const REUSE_SEQ: u32 = 0x5eed_0102;

/// Keys no thread can have (above Linux's largest pid_max, 2^22): they fill `DUP_CALLS`.
const FAKE_TIDS: u32 = 1 << 23;

/// `full_dup_calls`: the kernel's table of dup2/dup3 calls in flight is filled first, so
/// the reuse's `dup2` finds no room (issue 19: the fd then kept the replaced socket's class).
fn reused_fd_is_not_netlink_with(how: &str, full_dup_calls: bool) -> anyhow::Result<()> {
    preflight::require();
    let ns = NetNs::new(&format!("reuse-{how}"))?;
    let mut plegwatch = Plegwatch::start(&["--warn", WARN])?;
    let ready = plegwatch.wait_ready(READY_TIMEOUT)?;
    // Where the kernel takes fentry and fexit (a guest run), the fexit programs see the
    // arguments with the result, and DUP_CALLS is not used: filled, it must change nothing.
    let on_functions = variants::assert_variant(
        &ready,
        "socket_reuse",
        "fentry+fexit __x64_sys_{dup2,dup3,close_range}",
        (5, 9),
        "tracepoint syscalls:sys_exit_dup2",
    )
    .starts_with("fentry");
    if full_dup_calls {
        let id = plegwatch_scenarios::bpfmap::map_id(plegwatch.pid(), "DUP_CALLS")?;
        let (entries, max) = plegwatch_scenarios::bpfmap::fill_u32_keys(id, FAKE_TIDS, 1024, 8)?;
        anyhow::ensure!(entries as u64 == max, "DUP_CALLS (map {id}) holds {entries} of {max} entries after the fill");
        eprintln!("DUP_CALLS (map {id}) is full: {entries} of {max}");
    }
    let mut client = Client::start(
        NL_CLIENT.as_ref(),
        &format!("nl_client reuse by {how}"),
        &[
            "route-then-reuse",
            "--netns",
            ns.name(),
            "--seq",
            &FIRST_SEQ.to_string(),
            "--reuse",
            how,
            "--reuse-seq",
            &REUSE_SEQ.to_string(),
            "--first-wait-ms",
            &FIRST_WAIT_MS.to_string(),
        ],
        "sent",
    )?;
    let pid = client.pid;

    // 1. The real request is seen and reported.
    let deadline = client.sent + Duration::from_secs_f64(WARN_S + SLACK_S);
    let first = plegwatch.wait_for(deadline.saturating_duration_since(Instant::now()), |e| e.is_about("stall", pid)).unwrap_or_else(|| {
        panic!(
            "no stall line for the first request of nl_client (pid {pid}) on fd {} within \
                 {}s: the probes did not see that fd's traffic; lines timed from the request:\n{}",
            client.fd,
            WARN_S + SLACK_S,
            dump(plegwatch.events(), client.sent)
        )
    });
    {
        let events = plegwatch.events().to_vec();
        let bad = |what: &str| bad_line(&first, &events, client.sent, what);
        assert_client_stall(&first, &client, "route", false, &bad);
        assert_eq!(first.u64("/detail/seq"), Some(u64::from(FIRST_SEQ)), "{}", bad("wrong detail.seq"));
        assert_eq!(first.str("/detail/message_type"), Some("RTM_NEWLINK"), "{}", bad("wrong message_type"));
    }

    // 2. The fd is reused, request-looking bytes written there, and the client blocks reading.
    let reused_line = format!("{pid} {pid} reused fd={}", client.fd);
    let (reused, _) = client
        .proc
        .wait_line(Duration::from_millis(u64::from(FIRST_WAIT_MS)) + Duration::from_secs(3), |l| l == reused_line)
        .unwrap_or_else(|| panic!("nl_client (pid {pid}) never printed {reused_line:?}"));
    eprintln!("fd {} reused by {how} {:.3}s after the first request", client.fd, reused.duration_since(client.sent).as_secs_f64());
    std::thread::sleep((reused + HOLD_AFTER_REUSE).saturating_duration_since(Instant::now()));
    anyhow::ensure!(client.proc.running(), "nl_client (pid {pid}) stopped blocking in its read of the reused fd");
    let events = plegwatch.stop()?;
    let all = || dump(&events, client.sent);

    // 3. Nothing but the first request was reported about the client.
    let others: Vec<String> =
        events.iter().filter(|e| e.is_about_pid("stall", pid) && e.u64("/id") != first.u64("/id")).map(|e| e.json.to_string()).collect();
    assert!(
        others.is_empty(),
        "after its fd was reused by {how}, plegwatch reported nl_client (pid {pid}) again: the \
         socketpair end at fd {} was still taken for the netlink socket:\n{}\nall lines, timed \
         from the first request:\n{}",
        client.fd,
        others.join("\n"),
        all()
    );
    assert!(
        !events.iter().any(|e| e.is("stall") && e.u64("/detail/seq") == Some(u64::from(REUSE_SEQ))),
        "the bytes written on the socketpair were reported as a netlink request:\n{}",
        all()
    );
    assert!(
        events.iter().any(|e| e.is("resolved") && e.u64("/id") == first.u64("/id")),
        "the first request's stall (id {:?}) was never resolved, though its receive timed out \
         {FIRST_WAIT_MS} ms in:\n{}",
        first.u64("/id"),
        all()
    );
    if full_dup_calls {
        let summary = events.iter().find(|e| e.is("summary")).unwrap_or_else(|| panic!("no summary line:\n{}", all()));
        let full = summary
            .get("/dropped")
            .and_then(|d| d.as_array())
            .and_then(|d| d.iter().find(|x| x["reason"] == "dup_calls_full"))
            .and_then(|x| x["count"].as_u64());
        if on_functions {
            // The fexit programs keep nothing between entry and exit: a full DUP_CALLS
            // is never met, and the reuse was still seen (checked above).
            assert_eq!(full, Some(0), "DUP_CALLS is not used by the fexit variant, yet dup_calls_full is {full:?}");
        } else {
            assert!(full.is_some_and(|n| n >= 1), "the dup2 that found DUP_CALLS full was not counted (dup_calls_full {full:?})");
        }
    }
    Ok(())
}

fn reused_fd_is_not_netlink(how: &str) -> anyhow::Result<()> {
    reused_fd_is_not_netlink_with(how, false)
}

#[test]
fn dup2_onto_a_netlink_fd() -> anyhow::Result<()> {
    reused_fd_is_not_netlink("dup2")
}

#[test]
fn dup2_onto_a_netlink_fd_while_the_dup_table_is_full() -> anyhow::Result<()> {
    reused_fd_is_not_netlink_with("dup2", true)
}

#[test]
fn dup3_onto_a_netlink_fd() -> anyhow::Result<()> {
    reused_fd_is_not_netlink("dup3")
}

#[test]
fn close_range_of_the_netlink_fd() -> anyhow::Result<()> {
    reused_fd_is_not_netlink("close-range")
}

#[test]
fn close_range_of_every_fd_above_stdio() -> anyhow::Result<()> {
    reused_fd_is_not_netlink("close-range-all")
}

#[test]
fn exec_closes_a_cloexec_netlink_fd() -> anyhow::Result<()> {
    reused_fd_is_not_netlink("exec")
}
