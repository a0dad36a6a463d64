//! The output contract: one JSON object per line with `--json`, or human lines.
//!
//! Types: `ready` (probes attached), `stall` (a wait crossed a level),
//! `resolved` (a reported wait ended), `summary` (at exit). Later kinds add
//! fields and `kind` values; the fields here stay.

use crate::{levels::Level, syscalls::WaitKind};
use serde::Serialize;
use serde_json::Value;
use std::io::Write;

/// A wait that crossed a level.
#[derive(Clone, Debug, Serialize)]
pub struct Stall {
    pub level: Level,
    pub id: u64,
    pub kind: WaitKind,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub waited_s: f64,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub budget_used: f64,
    /// The wait was already open when plegwatch started (found by its sweep of
    /// `/proc`); `waited_s` and `started_at` are then the best lower bound the
    /// kernel offers (the thread has not run since).
    pub started_before_attach: bool,
    pub detail: Value,
    pub holder: Option<Value>,
    /// The root wait the chain leads to (e.g. a shim's umount, a stopped
    /// runc), when plegwatch could follow it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Value>,
    pub chain: Vec<Value>,
    pub kernel_stack: Vec<String>,
    pub user_stack: Vec<String>,
}

impl Stall {
    /// A line about `item` with who, when and what only: no holder, cause,
    /// chain or stacks (callers add those with struct update syntax).
    pub fn about<T: crate::inflight::Item>(
        item: &T,
        level: Level,
        id: u64,
        kind: WaitKind,
        waited: std::time::Duration,
        detail: Value,
    ) -> Stall {
        Stall {
            level,
            id,
            kind,
            pid: item.tgid(),
            tid: item.tid(),
            comm: item.comm().to_string(),
            waited_s: waited.as_secs_f64(),
            started_at: humantime::format_rfc3339_millis(crate::collector::wall_of(item.start_ns())).to_string(),
            budget_used: crate::levels::budget_used(waited),
            started_before_attach: false,
            detail,
            holder: None,
            cause: None,
            chain: Vec::new(),
            kernel_stack: Vec::new(),
            user_stack: Vec::new(),
        }
    }
}

/// A reported wait that ended.
#[derive(Clone, Debug, Serialize)]
pub struct Resolved {
    pub id: u64,
    pub kind: WaitKind,
    pub pid: u32,
    pub tid: u32,
    pub waited_s: f64,
    pub comm: String,
    /// `exact` from the kernel's end record; `approximate` when plegwatch saw the
    /// wait disappear without one (its end record was lost, or the thread vanished).
    pub timing: &'static str,
}

/// One attached probe, as chosen from the attach table.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeChoice {
    pub probe: String,
    pub variant: String,
}

/// Printed once every probe is attached.
#[derive(Clone, Debug, Serialize)]
pub struct Ready {
    pub pid: u32,
    pub probes: Vec<ProbeChoice>,
    pub warn_s: f64,
    pub critical_s: f64,
    pub imminent_s: f64,
}

/// Latency of one watched syscall over the run (from the kernel histogram).
#[derive(Clone, Debug, Serialize)]
pub struct SyscallSummary {
    pub syscall: String,
    pub count: u64,
    /// Upper bound of the bucket holding the 99th percentile, in seconds.
    pub p99_le_s: f64,
    /// Upper bound of the highest non-empty bucket, in seconds.
    pub max_le_s: f64,
}

/// Printed at exit.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub ran_s: f64,
    pub stalls: u64,
    pub resolved: u64,
    pub still_open: u64,
    pub waits_started: u64,
    /// Waits the kernel could not record (in-flight map full).
    pub dropped_waits: u64,
    /// End records the kernel could not send (ring buffer full).
    pub dropped_events: u64,
    pub syscalls: Vec<SyscallSummary>,
    /// The (process, kernel stack) pairs with the most D-state time, for the
    /// processes that matter.
    pub offcpu_top: Vec<Value>,
    /// Probed Go functions' call latencies (hdrhistogram), by target and function.
    pub go_latency: Vec<crate::latency::LatencyRow>,
    /// kubelet relist clocks, one per kubelet process seen.
    pub relists: Vec<Value>,
    /// containerd's CRI Status locks held longest (write holds, and the
    /// longest read wait on each).
    pub go_locks: Vec<Value>,
}

/// A Go binary plegwatch looked at: probed, or left alone and why.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// `containerd`, `containerd-shim`, `kubelet`, `runc`.
    pub target: String,
    /// `probed` (uprobes attached to this binary now), `traced` (a new
    /// process of a binary already probed), `unmatched` (none of the
    /// expected functions: left alone), `failed` (could not be read or attached).
    pub status: &'static str,
    /// The process that led to it (0 for a binary given by path).
    pub pid: u32,
    pub binary: String,
    /// What brought it up: `startup`, `exec`, `poll` or `flag`.
    pub found_by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_version: Option<String>,
    /// The probed functions, with their RET counts.
    pub functions: Vec<String>,
    /// Where `g` sits from fsbase (for goroutine ids at kernel probes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub g_tls_offset: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl Target {
    /// A line with nothing but who and what.
    pub fn new(target: &str, status: &'static str, pid: u32, binary: &std::path::Path, found_by: &'static str) -> Self {
        Target {
            target: target.to_string(),
            status,
            pid,
            binary: binary.display().to_string(),
            found_by,
            go_version: None,
            functions: Vec::new(),
            g_tls_offset: None,
            why: None,
        }
    }
}

/// Anything plegwatch prints on stdout.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Ready(Ready),
    Target(Target),
    Stall(Stall),
    Resolved(Resolved),
    Summary(Summary),
}

/// Where events go.
pub trait Sink {
    fn emit(&mut self, event: &Event);
}

/// One JSON object per line, flushed at once (readers follow a pipe).
pub struct JsonSink<W: Write>(pub W);

impl<W: Write> Sink for JsonSink<W> {
    fn emit(&mut self, event: &Event) {
        if let Ok(line) = serde_json::to_string(event) {
            let _ = writeln!(self.0, "{line}");
            let _ = self.0.flush();
        }
    }
}

/// Human-readable lines.
pub struct TextSink<W: Write>(pub W);

impl<W: Write> Sink for TextSink<W> {
    fn emit(&mut self, event: &Event) {
        let _ = writeln!(self.0, "{}", render_text(event));
        let _ = self.0.flush();
    }
}

fn detail_text(detail: &Value) -> String {
    let Some(obj) = detail.as_object() else {
        return String::new();
    };
    obj.iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| match v {
            Value::String(s) => format!("{k}={s}"),
            other => format!("{k}={other}"),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A container id cut to the 12 digits people use.
fn short_id(v: &Value) -> Option<&str> {
    v.as_str().map(|id| id.get(..12).unwrap_or(id))
}

/// `exact` or `inferred`, from a link's `exact` flag.
fn exactness(v: &Value) -> &'static str {
    match v.get("exact").and_then(Value::as_bool) {
        Some(false) => "inferred",
        _ => "exact",
    }
}

/// A holder in words: a shim with its open task calls, else its fields.
fn holder_text(h: &Value) -> String {
    if h.get("kind").and_then(Value::as_str) != Some("shim") {
        return detail_text(h);
    }
    let mut out = format!(
        "shim pid={} {} ({})",
        h["pid"],
        h.get("comm").and_then(Value::as_str).unwrap_or("?"),
        exactness(h)
    );
    let calls = h.get("calls").and_then(Value::as_array).cloned().unwrap_or_default();
    for c in &calls {
        out.push_str(&format!(
            "; {} container={} open {:.1}s",
            c.get("function").and_then(Value::as_str).unwrap_or("?"),
            short_id(&c["container"]).unwrap_or("?"),
            c.get("open_s").and_then(Value::as_f64).unwrap_or(0.0)
        ));
        if let Some(w) = c.get("thread_wait").filter(|w| !w.is_null()) {
            out.push_str(&format!(
                " in {} ({})",
                w.get("syscall").and_then(Value::as_str).unwrap_or("a syscall"),
                w.get("phase").and_then(Value::as_str).unwrap_or("?")
            ));
        }
    }
    if calls.is_empty() {
        if let Some(why) = h.get("why").and_then(Value::as_str) {
            out.push_str(&format!("; {why}"));
        }
    }
    out
}

/// A cause in words: a kernel wait where, or a process in what state.
fn cause_text(c: &Value) -> String {
    let kind = c.get("kind").and_then(Value::as_str).unwrap_or("?");
    let who = format!(
        "{} pid={}{}",
        c.get("comm").and_then(Value::as_str).unwrap_or("?"),
        c["pid"],
        c.get("tid").map(|t| format!(" tid={t}")).unwrap_or_default()
    );
    let text = match kind {
        "process_stopped" | "process_blocked" | "child_process" => format!(
            "{who} is {} (state {}{}), a child of pid {}",
            match kind {
                "process_stopped" => "stopped",
                "process_blocked" => "blocked",
                _ => "running",
            },
            c.get("state").and_then(Value::as_str).unwrap_or("?"),
            c.get("wchan").and_then(Value::as_str).map(|w| format!(", in {w}")).unwrap_or_default(),
            c["parent"]
        ),
        _ => format!(
            "{}{} for {:.1}s in {who}{}",
            c.get("syscall").and_then(Value::as_str).unwrap_or(kind),
            c.get("phase").and_then(Value::as_str).map(|p| format!(" ({p})")).unwrap_or_default(),
            c.get("waited_s").and_then(Value::as_f64).unwrap_or(0.0),
            c.get("via").and_then(Value::as_str).map(|v| format!(", via {v}")).unwrap_or_default()
        ),
    };
    format!("{text} ({})", exactness(c))
}

/// The text form of an event (no trailing newline).
pub fn render_text(event: &Event) -> String {
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let clock = now.get(11..23).unwrap_or(&now).to_string();
    match event {
        Event::Ready(r) => format!(
            "{clock} plegwatch watching (pid {}): warn {}s, critical {}s, imminent {}s; probes: {}",
            r.pid,
            r.warn_s,
            r.critical_s,
            r.imminent_s,
            r.probes
                .iter()
                .map(|p| format!("{}={}", p.probe, p.variant))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Event::Stall(s) => {
            let mut out = format!(
                "{clock} {:<8} #{} {} {} pid={} tid={} waited={}{:.1}s budget={:.0}% {}",
                s.level.as_str().to_uppercase(),
                s.id,
                s.kind.as_str(),
                s.comm,
                s.pid,
                s.tid,
                if s.started_before_attach { ">=" } else { "" },
                s.waited_s,
                s.budget_used * 100.0,
                detail_text(&s.detail)
            );
            if let Some(h) = &s.holder {
                out.push_str("\n    holder: ");
                out.push_str(&holder_text(h));
            }
            if let Some(c) = &s.cause {
                out.push_str("\n    cause: ");
                out.push_str(&cause_text(c));
            }
            if !s.kernel_stack.is_empty() {
                out.push_str("\n    kernel: ");
                out.push_str(&s.kernel_stack.join(" < "));
            }
            out
        }
        Event::Resolved(r) => format!(
            "{clock} RESOLVED #{} {} {} pid={} tid={} waited={:.2}s{}",
            r.id,
            r.kind.as_str(),
            r.comm,
            r.pid,
            r.tid,
            r.waited_s,
            if r.timing == "exact" {
                ""
            } else {
                " (approximate)"
            }
        ),
        Event::Summary(s) => {
            let mut out = format!(
                "{clock} summary: ran {:.1}s, {} stalls, {} resolved, {} still open, {} waits seen, dropped {} waits and {} end records",
                s.ran_s,
                s.stalls,
                s.resolved,
                s.still_open,
                s.waits_started,
                s.dropped_waits,
                s.dropped_events
            );
            for c in &s.syscalls {
                out.push_str(&format!(
                    "\n    {:<16} {:>8} calls  p99 <= {:.6}s  max <= {:.6}s",
                    c.syscall, c.count, c.p99_le_s, c.max_le_s
                ));
            }
            if !s.go_latency.is_empty() {
                out.push('\n');
                out.push_str(&crate::latency::render_table(&s.go_latency));
            }
            for r in &s.relists {
                out.push_str("\n    relist: ");
                out.push_str(&detail_text(r));
            }
            for l in &s.go_locks {
                out.push_str("\n    status lock: ");
                out.push_str(&detail_text(l));
            }
            out
        }
        Event::Target(t) => format!(
            "{clock} target {} {} pid={} {}{}{}{}",
            t.target,
            t.status,
            t.pid,
            t.binary,
            t.go_version.as_deref().map(|v| format!(" ({v})")).unwrap_or_default(),
            if t.functions.is_empty() { String::new() } else { format!(": {}", t.functions.join(", ")) },
            t.why.as_deref().map(|w| format!(": {w}")).unwrap_or_default()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stall() -> Stall {
        Stall {
            level: Level::Warn,
            id: 7,
            kind: WaitKind::Umount,
            pid: 10,
            tid: 11,
            comm: "umount".into(),
            waited_s: 2.25,
            started_at: "2026-11-22T02:45:01.123Z".into(),
            budget_used: 0.0125,
            started_before_attach: false,
            detail: json!({"syscall": "umount2", "target": "/mnt/x", "phase": "task_work"}),
            holder: None,
            cause: None,
            chain: vec![],
            kernel_stack: vec!["folio_wait_bit".into(), "sync_filesystem".into()],
            user_stack: vec![],
        }
    }

    #[test]
    fn json_contract_fields() {
        let mut buf = Vec::new();
        JsonSink(&mut buf).emit(&Event::Stall(stall()));
        let v: Value = serde_json::from_slice(&buf).unwrap();
        for k in [
            "type",
            "level",
            "id",
            "kind",
            "pid",
            "tid",
            "comm",
            "waited_s",
            "started_at",
            "budget_used",
            "detail",
            "holder",
            "chain",
            "kernel_stack",
            "user_stack",
        ] {
            assert!(v.get(k).is_some(), "missing {k} in {v}");
        }
        assert_eq!(v["type"], "stall");
        assert_eq!(v["level"], "warn");
        assert_eq!(v["kind"], "umount");
        assert!(v["holder"].is_null());
        assert_eq!(buf.iter().filter(|&&b| b == b'\n').count(), 1);

        let mut buf = Vec::new();
        JsonSink(&mut buf).emit(&Event::Resolved(Resolved {
            id: 7,
            kind: WaitKind::Sync,
            pid: 1,
            tid: 2,
            waited_s: 6.5,
            comm: "x".into(),
            timing: "exact",
        }));
        let v: Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["type"], "resolved");
        assert_eq!(v["kind"], "sync");
        assert_eq!(v["waited_s"], 6.5);
    }

    #[test]
    fn text_lines_name_the_essentials() {
        let t = render_text(&Event::Stall(stall()));
        assert!(
            t.contains("WARN")
                && t.contains("umount")
                && t.contains("pid=10")
                && t.contains("target=/mnt/x"),
            "{t}"
        );
        assert!(t.contains("folio_wait_bit < sync_filesystem"), "{t}");
    }

    #[test]
    fn holders_and_causes_read_as_words() {
        let shim = json!({"kind": "shim", "pid": 7, "comm": "containerd-shim", "exact": true, "calls": [
            {"function": "task.(*service).Update", "container": "4c694c17cc79951f4dee69cf", "open_s": 2.21, "thread_wait": null},
            {"function": "task.(*service).Delete", "container": "4c694c17cc79951f4dee69cf", "open_s": 9.5,
             "thread_wait": {"syscall": "umount2", "phase": "task_work"}}]});
        let h = holder_text(&shim);
        assert_eq!(
            h,
            "shim pid=7 containerd-shim (exact); task.(*service).Update container=4c694c17cc79 open 2.2s; \
             task.(*service).Delete container=4c694c17cc79 open 9.5s in umount2 (task_work)"
        );
        let stopped = json!({"kind": "process_stopped", "pid": 9, "comm": "runc", "state": "T", "wchan": "do_signal_stop", "parent": 7, "exact": true});
        assert_eq!(cause_text(&stopped), "runc pid=9 is stopped (state T, in do_signal_stop), a child of pid 7 (exact)");
        let child = json!({"kind": "child_process", "pid": 9, "comm": "runc", "state": "S", "parent": 7, "exact": true});
        assert_eq!(cause_text(&child), "runc pid=9 is running (state S), a child of pid 7 (exact)");
        let umount = json!({"kind": "umount", "syscall": "umount2", "phase": "task_work", "waited_s": 20.04, "pid": 7, "tid": 8,
                            "comm": "containerd-shim", "via": "task.(*service).Delete", "exact": true});
        assert_eq!(
            cause_text(&umount),
            "umount2 (task_work) for 20.0s in containerd-shim pid=7 tid=8, via task.(*service).Delete (exact)"
        );
        let inferred = json!({"kind": "umount", "pid": 7, "comm": "containerd-shim", "waited_s": 3.0, "exact": false});
        assert_eq!(cause_text(&inferred), "umount for 3.0s in containerd-shim pid=7 (inferred)");
        // Other holders keep their fields.
        assert!(holder_text(&json!({"kind": "kernel", "what": "netlink route: no reply"})).contains("what=netlink route"));
    }
}
