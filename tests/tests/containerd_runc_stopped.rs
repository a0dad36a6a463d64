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

use std::time::Duration;

use anyhow::Result;
use plegwatch_scenarios::containerd;
use plegwatch_scenarios::containerd::runc_stopped::{Bed, Options, Outcome, RUNC_COMM};
use plegwatch_scenarios::events::{dump, Event};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

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
/// How far the lock's reported hold may be from the update's measured block.
const HOLD_SLACK_S: f64 = 1.5;

#[test]
fn baseline_update_blocks_while_runc_is_stopped() -> Result<()> {
    containerd::require();
    let mut bed = Bed::prepare(Options::default())?;
    let outcome = bed.trigger()?;
    eprintln!("{}", outcome.summary());
    let context = || format!("{}\n{}", outcome.summary(), bed.containerd().log_tail(40));

    // The frozen process: the shim's `runc update` of this container, stopped.
    assert_eq!(
        outcome.shim.address,
        bed.containerd().socket().to_string_lossy(),
        "the shim found is not this daemon's"
    );
    assert_eq!(
        outcome.shim.id,
        bed.pod().id(),
        "the shim found does not serve the pod"
    );
    let argv = &outcome.runc_argv;
    let sub = argv.iter().position(|a| a == "update");
    assert!(
        sub.is_some() && argv.last() == Some(&outcome.container_id),
        "the stopped runc is not `runc … update … {}`: {argv:?}\n{}",
        outcome.container_id,
        context()
    );
    let snapshot = outcome
        .runc_snapshot
        .as_ref()
        .unwrap_or_else(|| panic!("no /proc snapshot of the stopped runc\n{}", context()));
    assert!(
        snapshot.state.starts_with('T'),
        "runc state {}\n{}",
        snapshot.state,
        context()
    );
    assert_eq!(snapshot.comm, RUNC_COMM, "{}", context());

    // The update blocked for as long as runc was stopped, then went through.
    let stopped = outcome.stopped_for();
    assert!(
        stopped >= bed.options().stop_for,
        "runc was continued after {stopped:?}\n{}",
        context()
    );
    assert!(
        outcome.update_latency >= stopped && outcome.update_latency <= stopped + BLOCK_SLACK,
        "UpdateContainerResources blocked {:?}, runc stopped {stopped:?} (want within \
         {BLOCK_SLACK:?} above)\n{}",
        outcome.update_latency,
        context()
    );
    assert_eq!(
        outcome.update_result,
        Ok(()),
        "UpdateContainerResources should succeed once runc is continued\n{}",
        context()
    );

    // ListContainers was quick before, and waited on the lock during the stop.
    let before = outcome
        .list_before
        .unwrap_or_else(|| panic!("no ListContainers before the update\n{}", context()));
    assert!(
        before.count >= QUIET_CALLS_MIN && before.failed == 0 && before.median < QUIET_MEDIAN_MAX,
        "ListContainers before the stall: {before} (want ≥ {QUIET_CALLS_MIN} calls, none \
         failed, median < {QUIET_MEDIAN_MAX:?})\n{}",
        context()
    );
    let during = outcome
        .list_during
        .unwrap_or_else(|| panic!("no ListContainers during the update\n{}", context()));
    assert!(
        during.max + LIST_SLACK >= stopped && during.failed == 0,
        "ListContainers during the stall: {during} (want a max ≥ {stopped:?} - \
         {LIST_SLACK:?}, none failed)\n{}",
        context()
    );
    assert!(
        bed.cri().version().is_ok(),
        "containerd stopped answering CRI after the stall\n{}",
        context()
    );
    Ok(())
}

/// The stall staged with plegwatch watching: the bed (still up, to ask containerd
/// afterwards), what the bed measured, and every line plegwatch printed.
struct Watched {
    bed: Bed,
    outcome: Outcome,
    events: Vec<Event>,
    containerd_pid: u32,
}

impl Watched {
    /// Prepares the bed, starts `plegwatch watch --warn 2s`, triggers the stall and stops
    /// plegwatch once the lock hold resolved.
    fn run() -> Result<Self> {
        preflight::require();
        containerd::require();
        let mut bed = Bed::prepare(Options::default())?;
        let containerd_pid = bed.containerd().pid();
        let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
        plegwatch.wait_ready(READY_TIMEOUT)?;
        let outcome = bed.trigger()?;
        plegwatch.wait_for(Duration::from_secs(5), |e| {
            e.is("resolved") && e.str("/kind") == Some("go_lock")
        });
        let events = plegwatch.stop()?;
        eprintln!("{}", outcome.summary());
        Ok(Self {
            bed,
            outcome,
            events,
            containerd_pid,
        })
    }

    /// The bed's summary and plegwatch's lines, for failure messages.
    fn all(&self) -> String {
        format!(
            "{}\n{}",
            self.outcome.summary(),
            dump(&self.events, self.outcome.prepared)
        )
    }

    /// The stall lines of `kind` about process `pid`.
    fn stalls(&self, kind: &str, pid: u32) -> Vec<&Event> {
        self.events
            .iter()
            .filter(|e| {
                e.is("stall")
                    && e.str("/kind") == Some(kind)
                    && e.u64("/pid") == Some(u64::from(pid))
            })
            .collect()
    }
}

#[test]
fn lock_hold_is_blamed_on_the_stopped_runc() -> Result<()> {
    let w = Watched::run()?;
    let all = || w.all();
    let o = &w.outcome;

    // The Status write lock, held by UpdateSync, with ListContainers' Gets waiting on it.
    let lock = w
        .stalls("go_lock", w.containerd_pid)
        .into_iter()
        .find(|e| {
            e.str("/detail/holder_function")
                .is_some_and(|f| f.ends_with(".(*statusStorage).UpdateSync"))
        })
        .unwrap_or_else(|| {
            panic!(
                "no go_lock stall held by UpdateSync in containerd (pid {}):\n{}",
                w.containerd_pid,
                all()
            )
        });
    assert!(
        lock.at < o.continued,
        "the lock hold was reported only after runc was continued ({:.3}s late):\n{}",
        lock.at.duration_since(o.continued).as_secs_f64(),
        all()
    );
    let gets = lock.u64("/detail/waiting_gets").unwrap_or(0);
    assert!(
        gets >= 1,
        "no ListContainers Get waiting on the held lock:\n{}",
        all()
    );

    // It resolved when the update returned.
    let resolved = w
        .events
        .iter()
        .find(|e| e.is("resolved") && e.u64("/id") == lock.u64("/id"))
        .unwrap_or_else(|| panic!("the lock hold never resolved:\n{}", all()));
    let held = resolved.f64("/waited_s").unwrap_or(f64::NAN);
    let blocked = o.update_latency.as_secs_f64();
    assert!(
        (held - blocked).abs() <= HOLD_SLACK_S,
        "lock held {held:.3}s by plegwatch, UpdateContainerResources blocked {blocked:.3}s:\n{}",
        all()
    );

    // Who holds it: the container's shim.
    assert_eq!(lock.str("/holder/kind"), Some("shim"), "{}", all());
    assert_eq!(
        lock.u64("/holder/pid"),
        Some(u64::from(o.shim.pid)),
        "the holder should be the container's shim:\n{}",
        all()
    );

    // The CRI handler stuck behind the runc.
    let update = w
        .stalls("cri_call", w.containerd_pid)
        .into_iter()
        .find(|e| {
            e.str("/detail/function")
                .is_some_and(|f| f.ends_with(".(*criService).UpdateContainerResources"))
        })
        .unwrap_or_else(|| panic!("no cri_call for UpdateContainerResources:\n{}", all()));

    assert!(
        w.bed.cri().version().is_ok(),
        "containerd stopped answering CRI after the probes:\n{}",
        all()
    );

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
    assert_eq!(
        lock.str("/cause/kind"),
        Some("process_stopped"),
        "the lock hold should carry its cause:\n{}",
        all()
    );
    assert_eq!(
        lock.u64("/cause/pid"),
        Some(u64::from(o.runc_pid)),
        "the cause should be the stopped runc:\n{}",
        all()
    );
    assert_eq!(lock.str("/cause/comm"), Some(RUNC_COMM), "{}", all());
    assert_eq!(lock.str("/cause/state"), Some("T"), "{}", all());

    eprintln!(
        "lock held {held:.3}s (update blocked {blocked:.3}s, runc stopped {:.3}s), {gets} Gets waiting, cause runc pid {}",
        o.stopped_for().as_secs_f64(),
        o.runc_pid
    );
    Ok(())
}
