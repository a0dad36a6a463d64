//! The lines `plegwatch watch --json` prints, as received by the test.

use std::fmt::Write as _;
use std::time::Instant;

use serde_json::Value;

/// One stdout line of plegwatch, parsed, with the moment the test read it.
#[derive(Clone, Debug)]
pub struct Event {
    pub at: Instant,
    pub json: Value,
}

impl Event {
    /// The line's `"type"`: `ready`, `stall`, `resolved`, `summary`, ...
    pub fn line_type(&self) -> Option<&str> {
        self.str("/type")
    }

    pub fn is(&self, line_type: &str) -> bool {
        self.line_type() == Some(line_type)
    }

    /// The value at a JSON pointer such as `/detail/target`.
    pub fn get(&self, pointer: &str) -> Option<&Value> {
        self.json.pointer(pointer)
    }

    pub fn str(&self, pointer: &str) -> Option<&str> {
        self.get(pointer).and_then(Value::as_str)
    }

    pub fn u64(&self, pointer: &str) -> Option<u64> {
        self.get(pointer).and_then(Value::as_u64)
    }

    pub fn f64(&self, pointer: &str) -> Option<f64> {
        self.get(pointer).and_then(Value::as_f64)
    }

    /// Whether the string at `pointer` ends with `suffix`: a Go function named without its
    /// package path, such as `.(*criService).ListContainers`.
    pub fn ends_with(&self, pointer: &str, suffix: &str) -> bool {
        self.str(pointer).is_some_and(|s| s.ends_with(suffix))
    }

    /// Whether this is a line of `line_type` about process `pid` (any of its threads).
    pub fn is_about_pid(&self, line_type: &str, pid: u32) -> bool {
        self.is(line_type) && self.u64("/pid") == Some(u64::from(pid))
    }

    /// Whether this is a line of `line_type` about thread `tid`.
    pub fn is_about(&self, line_type: &str, tid: u32) -> bool {
        self.is(line_type) && self.u64("/tid") == Some(u64::from(tid))
    }

    /// On a `summary` line: how many calls of the watched syscall `name` the probes counted
    /// (node-wide; 0 if the `syscalls` table has no row for it).
    pub fn syscall_count(&self, name: &str) -> u64 {
        let rows = self.get("/syscalls").and_then(Value::as_array);
        rows.into_iter().flatten().filter(|r| r["syscall"] == name).filter_map(|r| r["count"].as_u64()).sum()
    }
}

/// The `stall` lines of `kind` about process `pid`.
pub fn stalls<'a>(events: &'a [Event], kind: &str, pid: u32) -> Vec<&'a Event> {
    events.iter().filter(|e| e.is_about_pid("stall", pid) && e.str("/kind") == Some(kind)).collect()
}

/// The `resolved` line of `stall` (the one with its `id`).
pub fn resolution<'a>(events: &'a [Event], stall: &Event) -> Option<&'a Event> {
    events.iter().find(|e| e.is("resolved") && e.u64("/id") == stall.u64("/id"))
}

/// How long plegwatch saw the Go lock held by the call whose function ends in `function`
/// (`.(*runtimeOCI).UpdateContainer`): the `waited_s` of the `resolved` line of its first
/// `go_lock` stall. The error says which of the two lines is missing.
pub fn go_lock_hold(events: &[Event], function: &str) -> Result<f64, String> {
    let stall = events
        .iter()
        .find(|e| e.is("stall") && e.str("/kind") == Some("go_lock") && e.ends_with("/detail/function", function))
        .ok_or_else(|| format!("no go_lock stall for {function}"))?;
    resolution(events, stall).and_then(|e| e.f64("/waited_s")).ok_or_else(|| format!("{function}'s hold never resolved"))
}

/// The lines, one per row, each with its arrival in seconds after `origin`: for failure
/// messages.
pub fn dump(events: &[Event], origin: Instant) -> String {
    let mut out = String::new();
    for e in events {
        let t = match e.at.checked_duration_since(origin) {
            Some(d) => d.as_secs_f64(),
            None => -origin.duration_since(e.at).as_secs_f64(),
        };
        let _ = writeln!(out, "  {t:+8.3}s  {}", e.json);
    }
    if out.is_empty() {
        out.push_str("  (no lines)\n");
    }
    out
}
