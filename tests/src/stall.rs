//! The checks every stall scenario makes on plegwatch's report of the wait it caused.

use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::events::{dump, Event};
use crate::plegwatch::Plegwatch;

/// The PLEG budget `budget_used` is a fraction of: kubelet's 3-minute relist threshold.
pub const PLEG_BUDGET_S: f64 = 180.0;
/// How late a report may be: plegwatch must say so within this of the wait crossing a level,
/// and its `resolved.waited_s` may differ this much from the wall time the test measured.
pub const SLACK: Duration = Duration::from_secs(1);

impl Report {
    /// Asserts that each `detail.KEY` of the stall line equals its expected value.
    pub fn assert_detail(&self, expected: &[(&str, Value)]) {
        for (key, want) in expected {
            let got = self.stall.get(&format!("/detail/{key}"));
            assert_eq!(got, Some(want), "detail.{key} of {}", self.stall.json);
        }
    }
}

/// A wait the test caused and timed itself.
#[derive(Clone, Debug)]
pub struct CausedWait<'a> {
    /// `umount` or `sync`.
    pub kind: &'a str,
    pub pid: u32,
    pub tid: u32,
    /// The waiting thread's name as the kernel knows it.
    pub comm: &'a str,
    /// The `--warn` plegwatch was started with.
    pub warn: Duration,
    /// Taken just before the waiting call (or the spawn of the waiting process).
    pub started: Instant,
    pub started_wall: SystemTime,
    /// Wall time of the waiting call, measured by the test.
    pub measured: Duration,
}

/// plegwatch's first `stall` line about the wait, and the `resolved` line that closed it.
#[derive(Clone, Debug)]
pub struct Report {
    pub stall: Event,
    pub resolved: Event,
}

/// Asserts that `events` report `wait` in flight and on time, and its end; prints the
/// measured latencies. The first `stall` line about the thread must:
/// - be level `warn`, for the right kind, pid, tid and comm;
/// - arrive between `warn` and `warn + SLACK` after the wait started, with `waited_s` in the
///   same bounds (so the report came while the wait was still going on);
/// - carry the contract's fields: `budget_used` = `waited_s`/180, an RFC 3339 `started_at`
///   within `SLACK` of the start, a non-empty `kernel_stack`, and `holder`, `chain`,
///   `user_stack`.
///
/// The `resolved` line with the same id must name the same wait and give a total `waited_s`
/// within `SLACK` of the measured wall time.
pub fn assert_reported(events: &[Event], wait: &CausedWait) -> Report {
    let all = || dump(events, wait.started);
    let Some(stall) = events.iter().find(|e| e.is_about("stall", wait.tid)).cloned() else {
        panic!(
            "plegwatch printed no stall line for tid {} ({} wait of {:.2}s, {}); lines, timed \
             from the start of the wait:\n{}",
            wait.tid,
            wait.kind,
            wait.measured.as_secs_f64(),
            wait.comm,
            all()
        );
    };
    let field = |p: &str| stall.get(p).cloned().unwrap_or(Value::Null);
    let bad = |what: &str| -> String { format!("{what} in {}\nall lines:\n{}", stall.json, all()) };

    assert_eq!(field("/kind"), wait.kind, "{}", bad("wrong kind"));
    assert_eq!(field("/level"), "warn", "{}", bad("the first report of a wait is not level warn"));
    assert_eq!(field("/pid"), wait.pid, "{}", bad("wrong pid"));
    assert_eq!(field("/comm"), wait.comm, "{}", bad("wrong comm"));

    let warn = wait.warn.as_secs_f64();
    let slack = crate::timing::scaled(SLACK).as_secs_f64();
    let arrived = stall.at.duration_since(wait.started).as_secs_f64();
    assert!(
        (warn..=warn + slack).contains(&arrived),
        "{}",
        bad(&format!(
            "the stall line arrived {arrived:.3}s after the wait started, not within \
             [{warn}, {}]s",
            warn + slack
        ))
    );
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    assert!((warn..=warn + slack).contains(&waited), "{}", bad(&format!("waited_s {waited} is not within [{warn}, {}]", warn + slack)));
    let budget = stall.f64("/budget_used").unwrap_or(f64::NAN);
    assert!((budget - waited / PLEG_BUDGET_S).abs() < 0.005, "{}", bad(&format!("budget_used {budget} is not waited_s/{PLEG_BUDGET_S}")));
    let started_at = stall.str("/started_at").unwrap_or_default();
    let started_at =
        OffsetDateTime::parse(started_at, &Rfc3339).unwrap_or_else(|e| panic!("{}", bad(&format!("started_at is not RFC 3339 ({e})"))));
    let skew = (started_at - OffsetDateTime::from(wait.started_wall)).as_seconds_f64();
    assert!(skew.abs() <= slack, "{}", bad(&format!("started_at is {skew:+.3}s off the wall-clock start of the wait")));
    let kernel_stack = stall.get("/kernel_stack").and_then(Value::as_array);
    assert!(
        kernel_stack.is_some_and(|s| !s.is_empty() && s.iter().all(Value::is_string)),
        "{}",
        bad("kernel_stack is not a non-empty list of function names")
    );
    for key in ["/holder", "/chain", "/user_stack", "/detail"] {
        assert!(stall.get(key).is_some(), "{}", bad(&format!("no {key}")));
    }

    let id = stall.u64("/id").unwrap_or_else(|| panic!("{}", bad("no numeric id")));
    let Some(resolved) = events.iter().find(|e| e.is("resolved") && e.u64("/id") == Some(id)).cloned() else {
        panic!("{}", bad(&format!("no resolved line for id {id}")));
    };
    for key in ["/kind", "/pid", "/tid"] {
        assert_eq!(resolved.get(key), stall.get(key), "resolved line {} does not match its stall line in {key}", resolved.json);
    }
    let total = resolved.f64("/waited_s").unwrap_or(f64::NAN);
    let measured = wait.measured.as_secs_f64();
    assert!(
        (total - measured).abs() <= slack,
        "resolved waited_s {total} is more than {slack}s off the measured {measured:.3}s: {}\n\
         all lines:\n{}",
        resolved.json,
        all()
    );

    eprintln!(
        "{} wait of tid {}: measured {measured:.3}s; stall line {:.3}s after the {warn}s crossing \
         (waited_s {waited:.3}); resolved {:.3}s after the end, waited_s {total:.3}; \
         kernel_stack {}",
        wait.kind,
        wait.tid,
        arrived - warn,
        resolved.at.duration_since(wait.started).as_secs_f64() - measured,
        field("/kernel_stack"),
    );
    Report { stall, resolved }
}

/// The `resolved` line closing `stall` (same id), already read or arriving within `timeout`.
pub fn wait_resolved(plegwatch: &mut Plegwatch, stall: &Event, timeout: Duration) -> Option<Event> {
    let id = stall.u64("/id")?;
    plegwatch.wait_for(timeout, |e| e.is("resolved") && e.u64("/id") == Some(id))
}
