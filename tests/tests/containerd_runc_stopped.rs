//! `UpdateContainerResources` while the `runc update` it starts is frozen with SIGSTOP.
//!
//! A private containerd 1.6.20 whose shims run a `runc` wrapper that stops itself before
//! `runc update` (`Runc::StopBefore("update")`); a host-network pod with a busybox `sleep`;
//! a relist driver calling ListPodSandbox + ListContainers every 200 ms. The update takes the
//! container's Status write lock (`UpdateSync`) and waits on the shim, which waits on its
//! stopped runc child; every ListContainers waits on the lock. After 8 s the bed sends
//! SIGCONT, the real runc applies the update, and everything moves again.
//!
//! - `baseline_update_blocks_while_runc_is_stopped`, with no plegwatch: the stall is real,
//!   lasts as long as the runc stays stopped, and holds up ListContainers.
//! - `lock_hold_is_blamed_on_the_stopped_runc`, with `plegwatch watch --warn 2s` started
//!   before the trigger: the lock hold is reported with its cause, the stopped runc
//!   (`cause.kind` `process_stopped`, its pid, comm `runc`, state `T`), the container it is
//!   about, and the shim as holder.
//! - `one_incident_ends_at_the_stopped_runc`: one incident, whose Status holder → shim hop is
//!   the exact ttrpc edge, by the stream id outstanding on the holder's goroutine.

use std::time::Duration;

use anyhow::Result;
use plegwatch_scenarios::containerd;
use plegwatch_scenarios::containerd::bed::{StallBed, StallOutcome, Watched};
use plegwatch_scenarios::containerd::runc_stopped::{Bed, Options, Outcome, RUNC_COMM};
use plegwatch_scenarios::containerd::Version;
use plegwatch_scenarios::incidents;
use plegwatch_scenarios::preflight;

/// How far the update's block may be from the time runc stayed stopped: the update's own
/// work (a bbolt write, the ttrpc round trips, runc itself once continued) and the bed's
/// 10 ms polls.
const BLOCK_SLACK: Duration = Duration::from_millis(1500);
/// How much shorter than the stop the longest ListContainers may be: the first one to wait
/// starts within a relist period (200 ms) and a call of the lock being taken.
const LIST_SLACK: Duration = Duration::from_millis(1000);
/// ListContainers before the stall, on an idle node.
const QUIET_MEDIAN_MAX: Duration = Duration::from_millis(50);
/// At least this many ListContainers calls before the update (about 7 in 1.5 s at 200 ms).
const QUIET_CALLS_MIN: usize = 4;

#[test]
fn baseline_update_blocks_while_runc_is_stopped() -> Result<()> {
    baseline(Version::DEBIAN)
}

#[test]
fn baseline_update_blocks_while_runc_is_stopped_on_1_7() -> Result<()> {
    baseline(Version::V1_7)
}

#[test]
fn baseline_update_blocks_while_runc_is_stopped_on_2_3() -> Result<()> {
    baseline(Version::V2_3)
}

fn options(version: Version) -> Options {
    Options { version, ..Options::default() }
}

fn baseline(version: Version) -> Result<()> {
    if !containerd::require_version(version, &format!("containerd_runc_stopped on {version}")) {
        return Ok(());
    }
    let mut bed = Bed::prepare(options(version))?;
    let outcome = bed.trigger()?;
    eprintln!("{}", outcome.summary());
    assert_staged(&bed, &outcome);
    Ok(())
}

/// The stall the bed staged, as it measured it: the shim's `runc update` of the container
/// stopped, the update blocked for as long as it stayed so and then went through, and
/// ListContainers quick before and held up during the stop.
fn assert_staged(bed: &Bed, outcome: &Outcome) {
    let context = || bed.context(outcome);

    // The frozen process: the shim's `runc update` of this container, stopped.
    bed.stage().assert_pods_shim(&outcome.shim);
    let argv = &outcome.runc_argv;
    let sub = argv.iter().position(|a| a == "update");
    assert!(
        sub.is_some() && argv.last() == Some(&outcome.container_id),
        "the stopped runc is not `runc … update … {}`: {argv:?}\n{}",
        outcome.container_id,
        context()
    );
    let snapshot = outcome.runc_snapshot.as_ref().unwrap_or_else(|| panic!("no /proc snapshot of the stopped runc\n{}", context()));
    assert!(snapshot.state.starts_with('T'), "runc state {}\n{}", snapshot.state, context());
    assert_eq!(snapshot.comm, RUNC_COMM, "{}", context());

    // The update blocked for as long as runc was stopped, then went through.
    let stopped = outcome.stopped_for();
    assert!(stopped >= bed.options().stop_for, "runc was continued after {stopped:?}\n{}", context());
    let update = &outcome.update;
    assert!(
        update.latency >= stopped && update.latency <= stopped + BLOCK_SLACK,
        "UpdateContainerResources blocked {:?}, runc stopped {stopped:?} (want within \
         {BLOCK_SLACK:?} above)\n{}",
        update.latency,
        context()
    );
    assert_eq!(update.result, Ok(()), "UpdateContainerResources should succeed once runc is continued\n{}", context());

    // ListContainers was quick before, and waited on the lock during the stop.
    update.assert_quiet_before(QUIET_CALLS_MIN, QUIET_MEDIAN_MAX, context);
    let during = update.during(context);
    assert!(
        during.max + LIST_SLACK >= stopped && during.failed == 0,
        "ListContainers during the stall: {during} (want a max ≥ {stopped:?} - \
         {LIST_SLACK:?}, none failed)\n{}",
        context()
    );
    assert!(bed.stage().cri().version().is_ok(), "containerd stopped answering CRI after the stall\n{}", context());
}

/// Prepares the bed on `version` and stages the stall with `plegwatch watch --warn 2s`
/// looking on; `None` (the reason printed) when a release build is missing.
fn watch(version: Version) -> Result<Option<Watched<Bed>>> {
    preflight::require();
    if !containerd::require_version(version, &format!("containerd_runc_stopped on {version}")) {
        return Ok(None);
    }
    Watched::run(Bed::prepare(options(version))?).map(Some)
}

#[test]
fn lock_hold_is_blamed_on_the_stopped_runc() -> Result<()> {
    let Some(w) = watch(Version::DEBIAN)? else {
        return Ok(());
    };
    lock_hold_is_blamed(&w);
    Ok(())
}

/// The staging on containerd 1.7.34 + runc 1.4.3, then what plegwatch must report of it: the
/// lock hold blamed on the stopped runc, and the one incident, as on 1.6.
#[test]
fn containerd_runc_stopped_on_1_7() -> Result<()> {
    on_version(Version::V1_7)
}

/// [`containerd_runc_stopped_on_1_7`] on containerd 2.3.4 + runc 1.4.3: the update's task
/// lookup comes before `runc update` starts, so (unlike #9770's staging) nothing times out
/// and the lock is held for as long as runc is stopped.
#[test]
fn containerd_runc_stopped_on_2_3() -> Result<()> {
    on_version(Version::V2_3)
}

fn on_version(version: Version) -> Result<()> {
    let Some(w) = watch(version)? else {
        return Ok(());
    };
    assert_staged(&w.bed, &w.outcome);
    eprintln!("plegwatch on {version}:\n{}", plegwatch_scenarios::containerd::bed::reported(&w.events));
    lock_hold_is_blamed(&w);
    one_incident(&w)
}

fn lock_hold_is_blamed(w: &Watched<Bed>) {
    let all = || w.all();
    let o = &w.outcome;

    // The Status write lock, held by UpdateSync, with ListContainers' Gets waiting on it; it
    // resolved when the update returned.
    let (lock, held, blocked) = w.update_sync_lock();
    assert!(
        lock.at < o.continued,
        "the lock hold was reported only after runc was continued ({:.3}s late):\n{}",
        lock.at.duration_since(o.continued).as_secs_f64(),
        all()
    );
    let gets = lock.u64("/detail/waiting_gets").unwrap_or(0);
    assert!(gets >= 1, "no ListContainers Get waiting on the held lock:\n{}", all());

    // Who holds it (from the wait-for graph, as the incident's hops): the container's shim,
    // by the ttrpc request the holder's goroutine has outstanding on its socket.
    assert_eq!(lock.u64("/holder/pid"), Some(u64::from(o.shim.pid)), "the holder should be in the container's shim:\n{}", all());
    assert_eq!(lock.str("/chain/0/edge"), Some("ttrpc"), "{}", all());

    // The CRI handler stuck behind the runc.
    let update = w
        .cri_call(".(*criService).UpdateContainerResources")
        .unwrap_or_else(|| panic!("no cri_call for UpdateContainerResources:\n{}", all()));

    w.assert_containerd_answers();

    // Which container, and why the shim does not answer: its runc, stopped.
    assert_eq!(
        lock.str("/detail/container"),
        Some(o.container_id.as_str()),
        "the lock hold should name the container UpdateContainerResources was called for:\n{}",
        all()
    );
    assert_eq!(
        update.str("/detail/container"),
        Some(o.container_id.as_str()),
        "the UpdateContainerResources call should name its container:\n{}",
        all()
    );
    // Its chain ends at the stopped runc: the shim's task call (the root wait) is held by it.
    assert_eq!(lock.u64("/cause/pid"), Some(u64::from(o.shim.pid)), "the root wait should be the shim's:\n{}", all());
    let chain = lock.get("/chain").and_then(|c| c.as_array()).cloned().unwrap_or_default();
    let end = chain.last().cloned().unwrap_or_default();
    assert_eq!(
        (end["kind"].as_str(), end["pid"].as_u64(), end["comm"].as_str()),
        (Some("process"), Some(u64::from(o.runc_pid)), Some(RUNC_COMM)),
        "the lock hold's chain should end at the stopped runc:\n{}",
        all()
    );
    assert!(end["what"].as_str().is_some_and(|s| s.contains("state T")), "{}", all());

    eprintln!(
        "lock held {held:.3}s (update blocked {blocked:.3}s, runc stopped {:.3}s), {gets} Gets waiting, cause runc pid {}",
        o.stopped_for().as_secs_f64(),
        o.runc_pid
    );
}

/// The whole stall is one incident: from UpdateContainerResources through the Status lock's
/// holder and the shim's task call down to the stopped runc, raised within 1 s of crossing
/// --warn, and resolved once runc is continued.
#[test]
fn one_incident_ends_at_the_stopped_runc() -> Result<()> {
    let Some(w) = watch(Version::DEBIAN)? else {
        return Ok(());
    };
    one_incident(&w)
}

fn one_incident(w: &Watched<Bed>) -> Result<()> {
    let o = &w.outcome;
    let all = || w.all();
    let is_holder = |h: &serde_json::Value| h["kind"] == "go_lock" && h["what"].as_str().is_some_and(|s| s.contains("UpdateSync"));
    // Among the incidents still open once runc was seen stopped: the staging's own
    // container start may raise one of its own on a slow machine (see the 9770 scenario).
    let i = incidents::the_one_since(&w.events, w.warn, Some(o.stop_seen), Some(o.continued), is_holder)
        .map_err(|e| anyhow::anyhow!("{e}\n{}", all()))?;
    // The chain as it stood before runc was continued: holder -> shim -> runc (T).
    let line = i
        .line_where(|c| c.last().is_some_and(|h| h["kind"] == "process" && h["pid"].as_u64() == Some(u64::from(o.runc_pid))))
        .unwrap_or_else(|| panic!("incident #{} never reached the stopped runc:\n{}", i.id, all()));
    let chain = incidents::Incident::chain(line);
    let text = incidents::chain_text(&chain);
    let end = chain.last().expect("a chain");
    assert_eq!(end["pid"].as_u64(), Some(u64::from(o.runc_pid)), "the chain should end at the stopped runc:\n{text}");
    assert!(end["what"].as_str().is_some_and(|s| s.contains("state T")), "{text}");
    let holder = chain.iter().position(is_holder).expect("the holder is on the chain");
    assert_eq!(chain[holder]["edge"], "ttrpc", "the holder waits on the shim's reply:\n{text}");
    assert_eq!(chain[holder]["exactness"], "exact", "{text}");
    // Exact because the holder's goroutine has a ttrpc request outstanding on a socket whose
    // peer is this shim (Debian's containerd 1.6.20 has ttrpc 1.1: its sender goroutine writes
    // the frame, bound to the caller at dispatch; 1.7.34 and 2.3.4 have ttrpc 1.2, where the
    // caller writes it), not because the container ids match.
    let ttrpc_evidence = chain[holder]["evidence"].as_str().unwrap_or_default();
    let stream = ttrpc_evidence
        .strip_prefix("ttrpc stream ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse::<u32>().ok())
        .unwrap_or_else(|| panic!("the ttrpc hop's evidence names no stream id:\n{text}"));
    assert!(stream % 2 == 1, "client-initiated ttrpc streams are odd, got {stream}:\n{text}");
    assert!(ttrpc_evidence.contains(" on socket ino "), "{text}");
    assert!(
        ttrpc_evidence.ends_with(&format!("held by pid {}", o.shim.pid)),
        "the stream's socket peer should be the container's shim:\n{text}"
    );
    // The request was answered once runc went on: the response frame read back closed it,
    // and the kernel never lost step with the stream (headers only, payloads skipped).
    let summary = w.events.iter().find(|e| e.is("summary")).unwrap_or_else(|| panic!("no summary:\n{}", all()));
    let seen = |f: &str| summary.u64(&format!("/requests_seen/{f}")).unwrap_or(0);
    assert!(seen("ttrpc_requests") >= 1 && seen("ttrpc_answered") >= 1, "ttrpc requests seen: {:?}", summary.get("/requests_seen"));
    assert_eq!(seen("ttrpc_lost_step"), 0, "a ttrpc connection lost step: {:?}", summary.get("/requests_seen"));
    let shim = &chain[holder + 1];
    assert_eq!(shim["pid"].as_u64(), Some(u64::from(o.shim.pid)), "the next hop is the container's shim:\n{text}");
    assert!(shim["what"].as_str().is_some_and(|s| s.contains("(*service).Update")), "{text}");
    assert_eq!(shim["edge"], "child", "{text}");
    // Exact: the shim's children are the pod's pause, the container's init and the runc; the
    // runc is the one started during the call, holding the write end of a pipe the shim reads.
    assert_eq!(shim["exactness"], "exact", "the shim -> runc hop should be exact:\n{text}");
    let evidence = shim["evidence"].as_str().unwrap_or("");
    assert!(
        evidence.contains("pipe:[") && evidence.contains(&format!("pid {}", o.runc_pid)),
        "the shim -> runc evidence should name the pipe and the runc pid {}: {evidence}",
        o.runc_pid
    );
    assert_ne!(end["pid"].as_u64(), Some(u64::from(o.container_pid)), "not the container's init:\n{text}");
    // Its root is the deepest open wait, the shim's call; the runc is the terminal holder.
    assert_eq!(line.get("/root/pid").and_then(serde_json::Value::as_u64), Some(u64::from(o.shim.pid)), "{text}");
    let longest = i.resolved.as_ref().and_then(|r| r.get("/longest_chain")).and_then(serde_json::Value::as_array).map_or(0, Vec::len);
    assert!(longest >= chain.len(), "the resolution keeps the longest chain ({longest} hops)");
    eprintln!(
        "incident #{} raised {:.3}s after crossing --warn; chain:\n{text}\nttrpc hop: {ttrpc_evidence}",
        i.id,
        i.raised_after_warn(w.warn).as_secs_f64()
    );
    Ok(())
}
