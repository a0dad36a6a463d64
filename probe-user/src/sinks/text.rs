//! Human-readable lines: by default one block per incident, its chain top
//! to bottom; with `--waits`, today's per-wait `stall` and `resolved` lines too.

use crate::durations::human_secs;
use crate::events::{Event, Sink};
use crate::graph::{
    incidents::Incident,
    model::{Exactness, Hop, StartTiming},
};
use crate::style::{level_style, ok_style, paint};
use serde_json::Value;
use std::io::Write;

/// What the text sink shows, and how.
#[derive(Clone, Copy, Debug, Default)]
pub struct TextOptions {
    /// Also the per-wait `stall` and `resolved` lines (`--waits`).
    pub waits: bool,
    /// Colour each line by its level (`--color`, decided by the caller).
    pub color: bool,
    /// The start line lists every probe's variant (`-v`), not just counts.
    pub verbose: bool,
    /// Kernel stacks whole (`--stacks full`), not folded to the frames that matter.
    pub full_stacks: bool,
}

/// Human-readable lines.
pub struct TextSink<W: Write> {
    pub out: W,
    pub options: TextOptions,
}

impl<W: Write> TextSink<W> {
    pub fn new(out: W, options: TextOptions) -> Self {
        TextSink { out, options }
    }
}

impl<W: Write> Sink for TextSink<W> {
    fn emit(&mut self, event: &Event) {
        if !self.options.waits && matches!(event, Event::Stall(_) | Event::Resolved(_)) {
            return;
        }
        // The daemon's periodic snapshot is for the metrics, not for people.
        if matches!(event, Event::Status(_)) {
            return;
        }
        let _ = writeln!(self.out, "{}", render_text_with(&super::escape::escaped(event), &self.options));
        let _ = self.out.flush();
    }
}

/// One hop of a chain, as a line: who, how long, what.
fn hop_line(h: &Hop) -> String {
    let who = h.who();
    // Begun before plegwatch started: `>=` a lower bound, `~` from a GC's waitsince,
    // `?` unknown (counted from when it was found).
    let mark = match h.start {
        StartTiming::Exact => "",
        StartTiming::LowerBound => ">=",
        StartTiming::Waitsince => "~",
        StartTiming::Unknown => "?",
    };
    let age = h.waited_s.map(|w| format!("{:>8}", format!("{mark}{}", human_secs(w)))).unwrap_or_else(|| "        ".into());
    if h.comm.is_none() && h.pid.is_none() {
        return format!("{:<15} {age}  {}", h.kind, h.what);
    }
    let pod = match (&h.pod.pod, &h.pod.container) {
        (Some(p), c) => {
            let ns = h.pod.namespace.as_deref().unwrap_or("?");
            format!("  pod {ns}/{p}{}", c.as_deref().map(|c| format!(" container {c}")).unwrap_or_default())
        }
        _ => String::new(),
    };
    format!("{:<15} {age}  {}  [{who}]{pod}", h.kind, h.what)
}

/// An incident as a block: a header, then its chain top to bottom, one hop
/// a line, each followed by the link to the next; with `explain`, each link
/// also in words (`plegwatch explain`).
pub fn incident_text(clock: &str, i: &Incident, opts: &TextOptions, explain: bool) -> String {
    let root = i
        .root
        .as_ref()
        .map(|r| format!("root: {} in {} pid={}", r.what, r.comm.as_deref().unwrap_or("?"), r.pid.unwrap_or(0)))
        .unwrap_or_else(|| "a cycle: the chain waits on itself (deadlock)".into());
    let level = format!("{:<8}", i.level.as_str().to_uppercase());
    let mut out = format!(
        "{clock} {} incident #{} waited {}, PLEG budget {:.0}% used{}; {root}",
        paint(opts.color, level_style(i.level), &level),
        i.id,
        human_secs(i.waited_s),
        i.budget_used * 100.0,
        if i.changed.is_empty() { String::new() } else { format!(" ({} changed)", i.changed.join(", ")) },
    );
    if i.started_before_attach {
        out.push_str("\n       begun before plegwatch started: ages marked >= are lower bounds, ~ from the goroutine's GC stamp, ? unknown (counted from when found)");
    }
    for (n, h) in i.chain.iter().enumerate() {
        let mark = if h.root {
            "ROOT"
        } else if h.wait_id.is_none() {
            " END"
        } else {
            "    "
        };
        out.push_str(&format!("\n  {mark} {}. {}", n + 1, hop_line(h)));
        if explain {
            let role = match (h.root, n == 0 && i.chain.iter().filter(|h| h.wait_id.is_some()).count() > 1) {
                (true, _) => " It is the root: the cause sits here.",
                (false, true) => " It is the symptom.",
                _ => "",
            };
            out.push_str(&format!("\n              in words: {}.{role}", kind_meaning(&h.kind)));
        }
        if let (Some(edge), Some(x)) = (h.edge, h.exactness) {
            out.push_str(&format!("\n           -> {} ({}): {}", edge.as_str(), x.as_str(), h.evidence.as_deref().unwrap_or("")));
            if explain {
                let next = i.chain.get(n + 1).map(|h| format!("#{} {}", n + 2, h.kind)).unwrap_or_else(|| "what holds it".into());
                out.push_str(&format!(
                    "\n              in words: #{} {} {} ({next}); the link is {}",
                    n + 1,
                    h.kind,
                    edge.meaning(),
                    x.meaning()
                ));
            }
        }
    }
    for h in &i.attached {
        let edge = h.edge.map(|e| e.as_str()).unwrap_or("?");
        out.push_str(&format!("\n     + {}\n           -> {edge} (heuristic): {}", hop_line(h), h.evidence.as_deref().unwrap_or("")));
        if let (true, Some(e)) = (explain, h.edge) {
            out.push_str(&format!(
                "\n              in words: this {} {}; the link is {}",
                h.kind,
                e.meaning(),
                Exactness::Heuristic.meaning()
            ));
        }
    }
    let others = i.waits.len().saturating_sub(i.chain.iter().filter(|h| h.wait_id.is_some()).count() + i.attached.len());
    if others > 0 {
        out.push_str(&format!("\n       and {others} more wait(s) behind the same root"));
    }
    out
}

/// The watched syscalls' latency: measured values where the calls were
/// timed exactly (those over `--warn`, from their end records), else the
/// kernel's log2 bucket bound, marked `<=`.
fn syscall_table(rows: &[crate::events::SyscallSummary]) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let cell = |exact: Option<f64>, bound: f64| match exact {
        Some(v) => crate::latency::secs(v),
        None => format!("<={}", human_secs(bound)),
    };
    let mut out = format!("\n    {:<16} {:>8} {:>9} {:>9} {:>9} {:>9}  measured", "syscall", "calls", "p50", "p90", "p99", "max");
    for c in rows {
        out.push_str(&format!(
            "\n    {:<16} {:>8} {:>9} {:>9} {:>9} {:>9}  {}",
            c.syscall,
            c.count,
            cell(c.p50_s, c.p50_le_s),
            cell(c.p90_s, c.p90_le_s),
            cell(c.p99_s, c.p99_le_s),
            cell(c.max_s, c.max_le_s),
            c.measured
        ));
    }
    out.push_str("\n    (measured: calls over --warn, timed exactly; <=X: the kernel's log2 bucket bound, not a measured value)");
    out
}

/// What a hop of this kind is, in words (`plegwatch explain`).
fn kind_meaning(kind: &str) -> &'static str {
    match kind {
        "umount" => "An unmount (umount2) still running, often syncing dirty pages to disk after the syscall returned",
        "sync" => "A sync call (sync, syncfs, fsync, fdatasync, sync_file_range) waiting for writes to reach the disk",
        "netlink_request" => "A netlink request (to the kernel or a daemon) that has had no reply yet",
        "dbus_call" => "A D-Bus method call that has had no reply yet",
        "pleg_relist" => "kubelet's PLEG relist still running: when it passes 3 minutes the node goes NotReady",
        "go_lock" => "A Go lock (containerd's CRI container Status lock) held, with callers waiting for it",
        "cri_call" => "A CRI call still running inside containerd",
        "go_call" => "A probed Go call (a shim task call, runc's systemd calls) still running",
        "child_wait" => "A process waiting for its child process to finish",
        "unix_recv" => "A thread waiting for a reply on a unix socket",
        "futex" => "A thread parked on a contended lock",
        "process" => "The process holding the wait above (its state says whether it is stopped or blocked)",
        "kernel" => "The kernel, which has not answered",
        "device" => "The block device the writes go to, with its requests in flight and write rate",
        _ => "A wait plegwatch tracks",
    }
}

fn chain_words(chain: &[Hop]) -> String {
    chain.iter().map(|h| format!("{} ({})", h.what, h.kind)).collect::<Vec<_>>().join(" -> ")
}

/// An object's fields as `key=value` words; nested objects flattened to
/// `outer.inner=value`, lists joined with commas: never JSON in a text line.
fn detail_text(detail: &Value) -> String {
    let mut words = Vec::new();
    flat_words("", detail, &mut words);
    words.join(" ")
}

fn flat_words(prefix: &str, v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Null => {}
        Value::Object(obj) => {
            for (k, v) in obj {
                let key = if prefix.is_empty() { k.clone() } else { format!("{prefix}.{k}") };
                flat_words(&key, v, out);
            }
        }
        Value::Array(items) if items.iter().all(|i| !i.is_object() && !i.is_array()) => {
            if !items.is_empty() {
                out.push(format!("{prefix}={}", items.iter().map(scalar).collect::<Vec<_>>().join(",")));
            }
        }
        Value::Array(items) => {
            for (n, item) in items.iter().enumerate() {
                flat_words(&format!("{prefix}[{n}]"), item, out);
            }
        }
        other if prefix.is_empty() => out.push(scalar(other)),
        other => out.push(format!("{prefix}={}", scalar(other))),
    }
}

/// A JSON scalar as a word: strings bare, seconds fields as people read them.
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Kernel frames that say nothing about why a thread waits: the scheduler
/// and the syscall entry path.
fn boring_frame(f: &str) -> bool {
    let name = f.split(['+', ' ']).next().unwrap_or(f);
    matches!(
        name,
        "__schedule"
            | "schedule"
            | "schedule_timeout"
            | "io_schedule"
            | "io_schedule_timeout"
            | "schedule_preempt_disabled"
            | "do_syscall_64"
            | "x64_sys_call"
            | "entry_SYSCALL_64_after_hwframe"
            | "entry_SYSCALL_64"
            | "ret_from_fork"
            | "ret_from_fork_asm"
            | "syscall_exit_to_user_mode"
            | "exit_to_user_mode_prepare"
            | "exit_to_user_mode_loop"
    )
}

/// The frames that matter, innermost first, at most this many.
const FOLDED_FRAMES: usize = 6;

/// A kernel stack on one line: folded to [`FOLDED_FRAMES`] frames that are
/// not the scheduler or the syscall entry, with how many were left out.
fn stack_text(frames: &[String], full: bool) -> String {
    if full {
        return frames.join(" < ");
    }
    let kept: Vec<&str> = frames.iter().map(String::as_str).filter(|f| !boring_frame(f)).take(FOLDED_FRAMES).collect();
    let left = frames.len() - kept.len();
    let mut out = kept.join(" < ");
    if left > 0 {
        out.push_str(&format!(" (+{left} frames: --stacks full)"));
    }
    out
}

/// A stall's holder or cause in words: what it is, who, and for how long.
fn hop_words(h: &Hop) -> String {
    let age = h.waited_s.map(|w| format!(" for {}", human_secs(w))).unwrap_or_default();
    match (h.pid, &h.comm) {
        (None, None) => format!("{}: {}", h.kind, h.what),
        _ => format!("{} {}{age} [{}]", h.kind, h.what, h.who()),
    }
}

/// A stall's holder in words, with the link to it (`link`: the stall's own hop).
fn holder_text(link: Option<&Hop>, h: &Hop) -> String {
    let mut out = hop_words(h);
    if let Some((edge, l)) = link.and_then(|l| l.edge.map(|e| (e, l))) {
        out.push_str(&format!(
            "\n      via {} ({}): {}",
            edge.as_str(),
            l.exactness.map(|x| x.as_str()).unwrap_or("?"),
            l.evidence.as_deref().unwrap_or("")
        ));
    }
    out
}

/// The text form of an event (no trailing newline), with the default options.
pub fn render_text(event: &Event) -> String {
    render_text_with(event, &TextOptions::default())
}

/// The start line: what is watched, how many probes are on, which are off
/// and why; every variant with `-v`.
fn ready_text(clock: &str, r: &crate::events::Ready, verbose: bool) -> String {
    let levels = format!("warn {}, critical {}, imminent {}", human_secs(r.warn_s), human_secs(r.critical_s), human_secs(r.imminent_s));
    if verbose {
        return format!(
            "{clock} plegwatch watching (pid {}): {levels}; probes: {}",
            r.pid,
            r.probes.iter().map(|p| format!("{}={}", p.probe, p.variant)).collect::<Vec<_>>().join(", ")
        );
    }
    let off: Vec<String> = r
        .probes
        .iter()
        .filter(|p| p.variant == "off")
        .map(|p| format!("{} ({})", p.probe, p.why.as_deref().unwrap_or("not offered here")))
        .collect();
    let fallback = r.probes.iter().filter(|p| p.variant != "off" && p.why.is_some()).count();
    let on = r.probes.len() - off.len();
    let mut out = format!("{clock} plegwatch watching this node (pid {}): {levels}; {on} of {} probes on", r.pid, r.probes.len());
    if fallback > 0 {
        out.push_str(&format!(" ({fallback} on a fallback)"));
    }
    if !off.is_empty() {
        out.push_str(&format!(", off: {}", off.join(", ")));
    }
    let lost: Vec<&str> = r.probes.iter().filter(|p| p.seed_chain).filter_map(|p| p.loses.as_deref()).collect();
    if !lost.is_empty() {
        out.push_str(&format!("; DEGRADED, not seen: {}", lost.join("; ")));
    }
    out.push_str("; more: -v, plegwatch doctor");
    out
}

/// The text form of an event (no trailing newline).
pub fn render_text_with(event: &Event, opts: &TextOptions) -> String {
    let now = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let clock = now.get(11..23).unwrap_or(&now).to_string();
    match event {
        Event::Ready(r) => ready_text(&clock, r, opts.verbose),
        Event::Stall(s) => stall_text(&clock, s, opts),
        Event::Incident(i) => incident_text(&clock, i, opts, false),
        Event::IncidentResolved(r) => incident_resolved_text(&clock, r, opts),
        Event::Resolved(r) => resolved_text(&clock, r, opts),
        Event::Summary(s) => summary_text(&clock, s),
        Event::Target(t) => target_text(&clock, t),
        Event::Status(s) => format!("{clock} status: {} incident(s) open", s.incidents.len()),
        Event::GoroutineScan(g) => goroutine_scan_text(&clock, g),
        Event::Sweep(s) => sweep_text(&clock, s),
    }
}

/// What the startup sweep found already waiting: only what it found.
fn sweep_text(clock: &str, s: &crate::events::Sweep) -> String {
    let found: Vec<String> = [
        (s.kernel_waits, "kernel wait(s)"),
        (s.child_waits, "wait(s) on a child"),
        (s.netlink_waiters, "netlink request(s)"),
        (s.dbus_calls, "D-Bus call(s)"),
    ]
    .iter()
    .filter(|(n, _)| *n > 0)
    .map(|(n, what)| format!("{n} {what}"))
    .collect();
    format!("{clock} already waiting when plegwatch started: {} (each is reported when it crosses --warn)", found.join(", "))
}

/// A wait over a level (`--waits`): its line, then its holder, cause and
/// kernel stack when known.
fn stall_text(clock: &str, s: &crate::events::Stall, opts: &TextOptions) -> String {
    let level = format!("{:<8}", s.level.as_str().to_uppercase());
    let mut out = format!(
        "{clock} {} #{} {} {} pid={} tid={} waited={}{} budget={:.0}% {}",
        paint(opts.color, level_style(s.level), &level),
        s.id,
        s.kind.as_str(),
        s.comm,
        s.pid,
        s.tid,
        if s.started_before_attach { ">=" } else { "" },
        human_secs(s.waited_s),
        s.budget_used * 100.0,
        detail_text(&s.detail)
    );
    if let Some(h) = &s.holder {
        out.push_str("\n    holder: ");
        out.push_str(&holder_text(s.chain.first(), h));
    }
    if let Some(c) = &s.cause {
        out.push_str("\n    cause: ");
        out.push_str(&hop_words(c));
    }
    if !s.kernel_stack.is_empty() {
        out.push_str("\n    kernel: ");
        out.push_str(&stack_text(&s.kernel_stack, opts.full_stacks));
    }
    out
}

/// An incident's end: merged into another, or resolved with its longest chain.
fn incident_resolved_text(clock: &str, r: &crate::graph::incidents::IncidentResolved, opts: &TextOptions) -> String {
    match r.merged_into {
        Some(into) => format!("{clock} MERGED   incident #{} into #{into}", r.id),
        None => format!(
            "{clock} {} incident #{} after {}; longest chain: {}",
            paint(opts.color, ok_style(), "RESOLVED"),
            r.id,
            human_secs(r.waited_s),
            chain_words(&r.longest_chain)
        ),
    }
}

/// A wait's end (`--waits`).
fn resolved_text(clock: &str, r: &crate::events::Resolved, opts: &TextOptions) -> String {
    format!(
        "{clock} {} #{} {} {} pid={} tid={} waited={}{}",
        paint(opts.color, ok_style(), "RESOLVED"),
        r.id,
        r.kind.as_str(),
        r.comm,
        r.pid,
        r.tid,
        human_secs(r.waited_s),
        if r.timing == "exact" { "" } else { " (approximate)" }
    )
}

/// The end-of-run summary: counts and drops, incidents and scans, requests
/// seen, then the latency tables, relists and status locks.
fn summary_text(clock: &str, s: &crate::events::Summary) -> String {
    let mut out = format!(
        "{clock} summary: ran {}, {} stalls, {} resolved, {} still open, {} waits seen, dropped {} waits and {} end records",
        human_secs(s.ran_s),
        s.stalls,
        s.resolved,
        s.still_open,
        s.waits_started,
        s.dropped_waits,
        s.dropped_events
    );
    let dropped: Vec<String> = s.dropped.iter().filter(|d| d.count > 0).map(|d| format!("{}/{} {}", d.probe, d.reason, d.count)).collect();
    if !dropped.is_empty() {
        out.push_str(&format!("\n    kernel drops by probe: {}", dropped.join(", ")));
    }
    out.push_str(&format!(
        "\n    incidents: {} raised, {} resolved; scans: {} (late p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms; took p99 {:.1} ms)",
        s.incidents,
        s.incidents_resolved,
        s.scans.scans,
        s.scans.late_p50_ms,
        s.scans.late_p99_ms,
        s.scans.late_max_ms,
        s.scans.took_p99_ms
    ));
    // Where the slowest scan went, when it was slow enough to matter (a quarter second).
    if s.scans.took_max_ms >= 250.0 {
        let mut phases: Vec<&crate::events::PhaseTime> = s.scans.slowest.iter().collect();
        phases.sort_by(|a, b| b.ms.total_cmp(&a.ms));
        let top: Vec<String> = phases.iter().take(3).map(|p| format!("{} {:.0} ms", p.phase, p.ms)).collect();
        out.push_str(&format!("\n    slowest scan: {:.0} ms ({})", s.scans.took_max_ms, top.join(", ")));
    }
    let q = &s.requests_seen;
    out.push_str(&format!(
        "\n    requests seen: {} netlink ({} answered), {} D-Bus calls ({} answered), {} ttrpc to shims ({} answered{})",
        q.netlink_requests,
        q.netlink_answered,
        q.dbus_calls,
        q.dbus_answered,
        q.ttrpc_requests,
        q.ttrpc_answered,
        if q.ttrpc_lost_step > 0 { format!("; {} connections lost step", q.ttrpc_lost_step) } else { String::new() }
    ));
    out.push_str(&syscall_table(&s.syscalls));
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

/// A Go target found (or not): its binary, version, probed functions and
/// what was left out.
fn target_text(clock: &str, t: &crate::events::Target) -> String {
    format!(
        "{clock} target {} {} pid={} {}{}{}{}{}{}",
        t.target,
        t.status,
        t.pid,
        t.binary,
        t.go_version.as_deref().map(|v| format!(" ({v})")).unwrap_or_default(),
        if t.functions.is_empty() { String::new() } else { format!(": {}", t.functions.join(", ")) },
        if t.left_out.is_empty() { String::new() } else { format!("; left out: {}", t.left_out.join(", ")) },
        // Only the fallback is named: cookies are the rule (Linux ≥ 5.15).
        if t.uprobes == Some("address") { "; uprobes=address (no attach cookies before Linux 5.15)" } else { "" },
        t.why.as_deref().map(|w| format!(": {w}")).unwrap_or_default()
    )
}

/// A Go process's goroutines read at start, or why they were not.
fn goroutine_scan_text(clock: &str, g: &crate::events::GoroutineScan) -> String {
    match &g.error {
        Some(e) => format!("{clock} goroutines of {} pid={} not read: {e}; every other probe goes on", g.target, g.pid),
        None => format!(
            "{clock} goroutines of {} pid={}{}: {} read in {:.1}ms, {} probed call(s) open since before plegwatch started",
            g.target,
            g.pid,
            g.go_version.as_deref().map(|v| format!(" ({v})")).unwrap_or_default(),
            g.goroutines,
            g.took_ms,
            g.open_calls
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        events::{Resolved, Stall},
        levels::Level,
        sinks::JsonSink,
        syscalls::WaitKind,
    };
    use serde_json::json;

    fn stall() -> Stall {
        Stall {
            pod: Default::default(),
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
            wait: None,
            kernel_stack: vec!["folio_wait_bit".into(), "sync_filesystem".into()],
            user_stack: vec![],
            user_stack_id: -1,
        }
    }

    #[test]
    fn json_contract_fields() {
        let mut buf = Vec::new();
        JsonSink(&mut buf).emit(&Event::Stall(Box::new(stall())));
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
        // A host process's line names no pod; a container's names it, flat.
        for k in ["pod", "namespace", "container", "container_id"] {
            assert!(v.get(k).is_none(), "{k} on a host process: {v}");
        }
        let mut s = stall();
        s.pod = crate::graph::model::PodRef {
            pod: Some("web-0".into()),
            namespace: Some("shop".into()),
            container: Some("app".into()),
            container_id: Some("ab".repeat(32)),
        };
        let mut buf = Vec::new();
        JsonSink(&mut buf).emit(&Event::Stall(Box::new(s)));
        let v: Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(
            (v["pod"].as_str(), v["namespace"].as_str(), v["container"].as_str()),
            (Some("web-0"), Some("shop"), Some("app")),
            "{v}"
        );

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
        let t = render_text(&Event::Stall(Box::new(stall())));
        assert!(t.contains("WARN") && t.contains("umount") && t.contains("pid=10") && t.contains("target=/mnt/x"), "{t}");
        assert!(t.contains("folio_wait_bit < sync_filesystem"), "{t}");
    }

    #[test]
    fn holders_and_causes_read_as_words() {
        use crate::graph::model::{EdgeKind, Exactness};
        let mut lock =
            hop("go_lock", 5, "UpdateSync holding Status lock 0xc000", Some(9.5), Some((EdgeKind::Ttrpc, Exactness::Exact)), false);
        lock.evidence = Some("ttrpc stream 7 on socket ino 42".into());
        let shim = hop("go_call", 7, "(*service).Update for container 4c694c17cc79", Some(2.21), None, false);
        let umount = hop("umount", 7, "umount2 /run/x (task_work)", Some(20.04), None, true);
        let mut s = stall();
        s.holder = Some(shim.clone());
        s.cause = Some(umount.clone());
        s.chain = vec![lock, shim, umount];
        let t = render_text_with(&Event::Stall(Box::new(s)), &TextOptions { waits: true, ..Default::default() });
        assert!(
            t.contains("holder: go_call (*service).Update for container 4c694c17cc79 for 2.2s [c7 pid=7]"),
            "the holder, who and for how long: {t}"
        );
        assert!(t.contains("via ttrpc (exact): ttrpc stream 7 on socket ino 42"), "the link to it: {t}");
        assert!(t.contains("cause: umount umount2 /run/x (task_work) for 20s [c7 pid=7]"), "{t}");
        // A terminal holder: what it is, no age.
        let kernel = Hop {
            pid: None,
            comm: None,
            tid: None,
            wait_id: None,
            waited_s: None,
            ..hop("kernel", 0, "the kernel: no reply", None, None, false)
        };
        assert_eq!(hop_words(&kernel), "kernel: the kernel: no reply");
    }

    fn hop(
        kind: &str,
        pid: u32,
        what: &str,
        waited: Option<f64>,
        edge: Option<(crate::graph::model::EdgeKind, crate::graph::model::Exactness)>,
        root: bool,
    ) -> Hop {
        Hop {
            pod: Default::default(),
            start: Default::default(),
            wait_id: waited.map(|_| u64::from(pid)),
            kind: kind.into(),
            pid: Some(pid),
            tid: Some(pid),
            comm: Some(format!("c{pid}")),
            goroutine: None,
            what: what.into(),
            waited_s: waited,
            edge: edge.map(|e| e.0),
            evidence: edge.map(|_| "seen".to_string()),
            exactness: edge.map(|e| e.1),
            root,
        }
    }

    /// A ring-buffer flood's drops reach the text summary by probe, and the JSON one.
    #[test]
    fn summaries_show_the_kernel_drops_by_probe() {
        use crate::events::{DropCount, Summary};
        let s = Summary {
            dropped_events: 823_658,
            dropped: vec![
                DropCount { probe: "wait_enter", reason: "inflight_full", count: 0 },
                DropCount { probe: "socket_io", reason: "sock_events_full", count: 823_658 },
            ],
            ..Default::default()
        };
        let text = render_text(&Event::Summary(s.clone()));
        assert!(text.contains("dropped 0 waits and 823658 end records"), "{text}");
        assert!(text.contains("kernel drops by probe: socket_io/sock_events_full 823658"), "{text}");
        assert!(!text.contains("inflight_full"), "a zero counter is left out: {text}");
        let mut buf = Vec::new();
        JsonSink(&mut buf).emit(&Event::Summary(s));
        let v: serde_json::Value = serde_json::from_slice(&buf).unwrap();
        assert_eq!(v["dropped"][1], serde_json::json!({"probe": "socket_io", "reason": "sock_events_full", "count": 823_658}), "{v}");
    }

    #[test]
    fn ages_begun_before_start_are_marked_by_what_they_rest_on() {
        let mut h = hop("cri_call", 7, "ListContainers", Some(0.25), None, false);
        assert!(hop_line(&h).contains(" 250ms  ListContainers"), "{}", hop_line(&h));
        for (start, mark) in [(StartTiming::LowerBound, ">=250ms"), (StartTiming::Waitsince, "~250ms"), (StartTiming::Unknown, "?250ms")] {
            h.start = start;
            assert!(hop_line(&h).contains(&format!("{mark}  ListContainers")), "{}", hop_line(&h));
        }
    }

    #[test]
    fn an_incident_reads_top_to_bottom_with_its_root_marked() {
        use crate::graph::{
            incidents::IncidentResolved,
            model::{EdgeKind, Exactness},
        };
        let chain = vec![
            hop("pleg_relist", 10, "pleg.(*GenericPLEG).Relist", Some(74.0), Some((EdgeKind::CriCall, Exactness::Inferred)), false),
            hop("go_lock", 20, "UpdateSync holding Status lock 0xc000a1b2", Some(73.5), Some((EdgeKind::Ttrpc, Exactness::Exact)), false),
            Hop {
                pod: crate::graph::model::PodRef {
                    pod: Some("web-0".into()),
                    namespace: Some("shop".into()),
                    container: None,
                    container_id: None,
                },
                ..hop(
                    "umount",
                    30,
                    "umount2 /rootfs (task_work after the syscall returned)",
                    Some(73.0),
                    Some((EdgeKind::Device, Exactness::Exact)),
                    true,
                )
            },
            hop("device", 0, "block device 7:1 (loop1): 0 requests in flight, 1.0 MiB/s written over the last 5 s", None, None, false),
        ];
        let i = Incident {
            level: Level::Critical,
            id: 3,
            changed: vec!["level"],
            root: Some(chain[2].clone()),
            symptom: chain[0].clone(),
            chain: chain.clone(),
            waits: vec![10, 20, 30, 40],
            attached: Vec::new(),
            budget_used: 74.0 / 180.0,
            started_at: "2026-11-23T03:00:00.000Z".into(),
            waited_s: 74.0,
            cycle: false,
            started_before_attach: false,
        };
        let t = render_text(&Event::Incident(Box::new(i)));
        eprintln!("{t}");
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].contains("CRITICAL")
                && lines[0].contains("incident #3")
                && lines[0].contains("41%")
                && lines[0].contains("(level changed)"),
            "{t}"
        );
        assert!(lines[0].contains("root: umount2 /rootfs"), "{t}");
        assert!(lines[1].contains("1. pleg_relist") && lines[1].contains("1m14s"), "{t}");
        assert!(lines[2].contains("-> cri_call (inferred)"), "{t}");
        assert!(t.contains("ROOT 3. umount"), "{t}");
        assert!(t.lines().any(|l| l.contains("ROOT 3. umount") && l.ends_with("[c30 pid=30]  pod shop/web-0")), "{t}");
        assert!(!lines[1].contains("pod "), "a host hop names no pod: {t}");
        assert!(t.contains(" END 4. device"), "{t}");
        assert!(t.contains("and 1 more wait(s) behind the same root"), "{t}");
        let r = render_text(&Event::IncidentResolved(IncidentResolved { id: 3, waited_s: 80.0, longest_chain: chain, merged_into: None }));
        assert!(r.contains("RESOLVED incident #3 after 1m20s") && r.contains("pleg.(*GenericPLEG).Relist (pleg_relist) -> "), "{r}");
        // Per-wait lines only with --waits.
        let mut out = Vec::new();
        TextSink::new(&mut out, TextOptions::default()).emit(&Event::Stall(Box::new(stall())));
        assert!(out.is_empty());
        TextSink::new(&mut out, TextOptions { waits: true, ..Default::default() }).emit(&Event::Stall(Box::new(stall())));
        assert!(!out.is_empty());
    }

    fn summary() -> crate::events::Summary {
        let mut c = [0u64; 32];
        c[0] = 4;
        let fsync = crate::sources::stats::summarize("fsync", &c).unwrap();
        let mut u = [0u64; 32];
        u[23] = 1;
        let mut h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).unwrap();
        h.record(5_056_712).unwrap();
        let umount = crate::sources::stats::with_measured(crate::sources::stats::summarize("umount2", &u).unwrap(), Some(&h));
        crate::events::Summary { ran_s: 16.6, syscalls: vec![umount, fsync], ..Default::default() }
    }

    /// The summary gives measured values where it has them, and bucket
    /// bounds marked `<=` (and said to be bounds) only where it does not.
    #[test]
    fn the_summary_gives_measured_quantiles_and_marks_bounds() {
        let t = render_text(&Event::Summary(summary()));
        let umount = t.lines().find(|l| l.trim_start().starts_with("umount2")).unwrap();
        assert_eq!(umount.matches("5.06s").count(), 4, "p50, p90, p99 and max are the measured 5.06 s: {t}");
        assert!(!umount.contains("<="), "{t}");
        let fsync = t.lines().find(|l| l.trim_start().starts_with("fsync")).unwrap();
        assert!(fsync.contains("<=") && fsync.trim_end().ends_with(" 0"), "no fsync was measured: {t}");
        assert!(t.contains("bucket bound, not a measured value"), "{t}");
        assert!(!t.contains("8.589935") && !t.contains("p99 <="), "{t}");
    }

    /// No text line carries JSON, whatever the event: nested details (an
    /// off-CPU record, a holder's calls) are flattened into words.
    #[test]
    fn no_text_line_contains_json() {
        let mut s = stall();
        s.detail = json!({"syscall": "umount2", "target": "/mnt/x", "offcpu": {"d_sleeps": 3, "d_ms": 4200, "top": [{"comm": "jbd2", "ms": 10}]}, "flags": ["REQUEST", "ACK"]});
        s.holder = Some(hop("process", 5, "stopped (state T)", None, None, false));
        s.kernel_stack = (0..20).map(|n| format!("frame_{n}")).collect();
        let opts = TextOptions { waits: true, ..Default::default() };
        let mut probes: Vec<crate::events::ProbeChoice> = ["wait_enter", "offcpu", "lock_contention"]
            .iter()
            .map(|p| crate::events::ProbeChoice { probe: p.to_string(), variant: "tracepoint x".into(), ..Default::default() })
            .collect();
        probes[2].variant = "off".into();
        probes[2].why = Some("no tracepoint lock:contention_begin".into());
        let ready = Event::Ready(crate::events::Ready::new(1, probes, 2.0, 60.0, 150.0));
        let mut sum = summary();
        sum.relists = vec![json!({"pid": 4, "last": {"took_s": 0.2}})];
        for e in [Event::Stall(Box::new(s)), ready.clone(), Event::Summary(sum)] {
            let t = render_text_with(&e, &opts);
            assert!(!t.contains("{\"") && !t.contains("\":"), "JSON in a text line:\n{t}");
        }
        let t = render_text_with(
            &Event::Stall({
                let mut s = stall();
                s.detail = json!({"offcpu": {"d_sleeps": 3}});
                Box::new(s)
            }),
            &opts,
        );
        assert!(t.contains("offcpu.d_sleeps=3"), "{t}");
        // The start line: one line, counts and what is off and why; every variant with -v.
        let t = render_text_with(&ready, &opts);
        assert!(!t.contains('\n') && t.len() < 200, "{t}");
        assert!(
            t.contains("plegwatch watching")
                && t.contains("2 of 3 probes on")
                && t.contains("off: lock_contention (no tracepoint lock:contention_begin)"),
            "{t}"
        );
        assert!(t.contains("warn 2s, critical 1m00s, imminent 2m30s"), "{t}");
        let v = render_text_with(&ready, &TextOptions { verbose: true, ..opts });
        assert!(v.contains("offcpu=tracepoint x"), "{v}");
    }

    /// A probe a seed chain needs, off: the start line says DEGRADED and what goes unseen;
    /// an off probe no seed chain needs does not make it degraded.
    #[test]
    fn the_start_line_says_degraded_when_a_seed_chain_is_lost() {
        let choice = |probe: &str, off: bool| {
            let loss = crate::kernel::probes::loss_of(probe).filter(|_| off);
            crate::events::ProbeChoice {
                probe: probe.into(),
                variant: if off { "off".into() } else { "tracepoint".into() },
                why: off.then(|| "refused by the verifier".into()),
                loses: loss.map(|l| l.what.into()),
                seed_chain: loss.is_some_and(|l| l.seed_chain),
            }
        };
        let ready = |probes| Event::Ready(crate::events::Ready::new(1, probes, 2.0, 60.0, 150.0));
        let t = render_text(&ready(vec![choice("wait_enter", false), choice("socket_io", true), choice("block_io", true)]));
        assert!(t.contains("DEGRADED, not seen: netlink requests (the Terway chain)"), "{t}");
        assert!(t.contains("; the device hop under writeback waits"), "{t}");
        assert!(!t.contains('\n'), "{t}");
        let t = render_text(&ready(vec![choice("wait_enter", false), choice("lock_contention", true)]));
        assert!(t.contains("off: lock_contention (refused by the verifier)") && !t.contains("DEGRADED"), "{t}");
    }

    #[test]
    fn stacks_are_folded_to_the_frames_that_matter_unless_full() {
        let frames: Vec<String> = [
            "__schedule",
            "schedule",
            "io_schedule",
            "folio_wait_bit_common",
            "folio_wait_writeback",
            "__filemap_fdatawait_range",
            "filemap_fdatawait_keep_errors",
            "sync_inodes_sb",
            "sync_filesystem",
            "generic_shutdown_super",
            "kill_block_super",
            "deactivate_locked_super",
            "cleanup_mnt",
            "task_work_run",
            "syscall_exit_to_user_mode",
            "do_syscall_64",
            "entry_SYSCALL_64_after_hwframe",
        ]
        .iter()
        .map(|f| f.to_string())
        .collect();
        let folded = stack_text(&frames, false);
        assert!(folded.starts_with("folio_wait_bit_common < ") && !folded.contains("schedule <"), "{folded}");
        assert!(folded.contains("(+11 frames: --stacks full)"), "{folded}");
        assert_eq!(stack_text(&frames, true).matches(" < ").count(), frames.len() - 1);
    }

    #[test]
    fn colour_by_level_only_when_asked() {
        let opts = TextOptions { waits: true, color: true, ..Default::default() };
        let t = render_text_with(&Event::Stall(Box::new(stall())), &opts);
        assert!(t.contains("\u{1b}[") && t.contains("WARN"), "{t:?}");
        let plain = render_text_with(&Event::Stall(Box::new(stall())), &TextOptions { waits: true, ..Default::default() });
        assert!(!plain.contains('\u{1b}'), "{plain:?}");
    }

    #[test]
    fn a_sweep_line_names_only_what_was_found_and_its_json_is_typed() {
        let found = crate::events::Sweep { kernel_waits: 2, netlink_sockets: 9, dbus_calls: 1, ..Default::default() };
        assert!(found.found_waits());
        let line = render_text(&Event::Sweep(found.clone()));
        assert!(line.contains("2 kernel wait(s), 1 D-Bus call(s)"), "{line}");
        assert!(!line.contains("netlink"), "sockets alone are not waits: {line}");
        let v = serde_json::to_value(Event::Sweep(found)).unwrap_or_default();
        assert_eq!(v["type"], "sweep");
        assert_eq!(v["kernel_waits"], 2);
        assert_eq!(v["netlink_sockets"], 9);
        let only_sockets = crate::events::Sweep { netlink_sockets: 3, ttrpc_connections: 1, ..Default::default() };
        assert!(!only_sockets.found_waits(), "open sockets are no news");
    }
}
