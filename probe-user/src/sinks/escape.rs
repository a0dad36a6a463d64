//! Control characters out of text output.
//!
//! A comm is whatever bytes a process set (`prctl(PR_SET_NAME)`), and so are paths,
//! command lines, pod names and the symbols of a container's binaries. Printed raw,
//! one of them could put escape sequences on an SRE's terminal (move the cursor, erase
//! lines, set the title) or a newline into node-problem-detector's one-line message.
//! Every text sink shows an event through [`escaped`]: each control character in its
//! strings (C0, DEL and C1) becomes a visible `\xNN` (`\u{NNNN}` for C1), and a
//! backslash stays as it is. The JSON sink needs none of this (JSON escapes them).

use crate::events::Event;
use crate::graph::model::{Hop, PodRef};
use serde_json::Value;
use std::borrow::Cow;

/// Whether `c` is a control character a terminal may act on.
fn is_control(c: char) -> bool {
    c.is_control()
}

/// `s` with its control characters made visible (`\x1b`, `\x0a`, `\u{9b}`).
pub fn text(s: &str) -> Cow<'_, str> {
    if !s.chars().any(is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if !is_control(c) {
            out.push(c);
        } else if c.is_ascii() {
            out.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        }
    }
    Cow::Owned(out)
}

fn fix(s: &mut String) {
    if let Cow::Owned(t) = text(s) {
        *s = t;
    }
}

fn fix_opt(s: &mut Option<String>) {
    if let Some(s) = s {
        fix(s);
    }
}

fn fix_all(v: &mut [String]) {
    v.iter_mut().for_each(fix);
}

fn fix_value(v: &mut Value) {
    match v {
        Value::String(s) => fix(s),
        Value::Array(a) => a.iter_mut().for_each(fix_value),
        Value::Object(o) => {
            // Keys are ours; values may come from anywhere.
            o.values_mut().for_each(fix_value);
        }
        _ => {}
    }
}

fn fix_pod(p: &mut PodRef) {
    fix_opt(&mut p.pod);
    fix_opt(&mut p.namespace);
    fix_opt(&mut p.container);
}

fn fix_hop(h: &mut Hop) {
    fix(&mut h.kind);
    fix_opt(&mut h.comm);
    fix(&mut h.what);
    fix_opt(&mut h.evidence);
    fix_pod(&mut h.pod);
}

/// Whether any string of `event` holds a control character. JSON escapes C0 as `\n`,
/// `\t`, `\u001b`…, and leaves DEL and C1 as they are.
fn has_control(event: &Event) -> bool {
    let Ok(json) = serde_json::to_string(event) else { return true };
    json.contains("\\u00")
        || json.contains("\\n")
        || json.contains("\\t")
        || json.contains("\\r")
        || json.contains("\\b")
        || json.contains("\\f")
        || json.chars().any(is_control)
}

/// `event` with every string made safe to print (borrowed when it has nothing to fix,
/// which is nearly always).
pub fn escaped(event: &Event) -> Cow<'_, Event> {
    if !has_control(event) {
        return Cow::Borrowed(event);
    }
    let mut e = event.clone();
    match &mut e {
        Event::Ready(r) => r.probes.iter_mut().for_each(|p| {
            fix(&mut p.probe);
            fix(&mut p.variant);
            fix_opt(&mut p.why);
            fix_opt(&mut p.loses);
        }),
        Event::Target(t) => {
            fix(&mut t.target);
            fix(&mut t.binary);
            fix_opt(&mut t.go_version);
            fix_all(&mut t.functions);
            fix_all(&mut t.left_out);
            fix_opt(&mut t.why);
        }
        Event::Sweep(_) => {}
        Event::GoroutineScan(g) => {
            fix(&mut g.target);
            fix_opt(&mut g.go_version);
            fix_opt(&mut g.error);
        }
        Event::Stall(s) => {
            fix(&mut s.comm);
            fix(&mut s.started_at);
            fix_value(&mut s.detail);
            s.holder.iter_mut().chain(s.cause.iter_mut()).chain(s.chain.iter_mut()).for_each(fix_hop);
            fix_all(&mut s.kernel_stack);
            fix_all(&mut s.user_stack);
            fix_pod(&mut s.pod);
        }
        Event::Resolved(r) => fix(&mut r.comm),
        Event::Summary(s) => {
            s.syscalls.iter_mut().for_each(|c| fix(&mut c.syscall));
            s.offcpu_top.iter_mut().for_each(fix_value);
            s.go_latency.iter_mut().for_each(|r| {
                fix(&mut r.target);
                fix(&mut r.function);
            });
            s.relists.iter_mut().for_each(fix_value);
            s.go_locks.iter_mut().for_each(fix_value);
        }
        Event::Incident(i) => {
            i.root.iter_mut().for_each(fix_hop);
            fix_hop(&mut i.symptom);
            i.chain.iter_mut().for_each(fix_hop);
            i.attached.iter_mut().for_each(fix_hop);
            fix(&mut i.started_at);
        }
        Event::IncidentResolved(r) => r.longest_chain.iter_mut().for_each(fix_hop),
        Event::Status(s) => {
            s.relists.iter_mut().for_each(fix_value);
            s.syscalls.iter_mut().for_each(|c| fix(&mut c.syscall));
            s.go_latency.iter_mut().for_each(|r| {
                fix(&mut r.target);
                fix(&mut r.function);
            });
        }
    }
    Cow::Owned(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Resolved;

    #[test]
    fn control_characters_become_visible() {
        assert_eq!(text("containerd"), Cow::Borrowed("containerd"));
        assert_eq!(text("evil\u{1b}]0;pwned\u{7}"), "evil\\x1b]0;pwned\\x07");
        assert_eq!(text("a\nb\r\t"), "a\\x0ab\\x0d\\x09");
        assert_eq!(text("\u{7f}\u{9b}2J"), "\\x7f\\u{9b}2J");
        assert_eq!(text("päth ✓ \\x1b"), "päth ✓ \\x1b", "printable text and backslashes stay");
    }

    #[test]
    fn every_string_of_a_hostile_event_is_escaped_and_a_clean_one_is_borrowed() {
        let clean = Event::Resolved(Resolved {
            id: 1,
            kind: crate::syscalls::WaitKind::Umount,
            pid: 1,
            tid: 1,
            waited_s: 1.0,
            comm: "shim".into(),
            timing: "exact",
        });
        assert!(matches!(escaped(&clean), Cow::Borrowed(_)));
        let mut s = crate::sources::inflight::stall_line(
            &crate::sources::inflight::WaitInfo {
                tgid: 1,
                tid: 1,
                comm: "x\u{1b}[2J\nFAKE".into(),
                nr: 0,
                slot: 0,
                start_ns: 0,
                sys_exit_ns: 0,
                arg0: 0,
                path: String::new(),
                before_attach: false,
                g: 0,
                user_stack: -1,
            },
            crate::levels::Level::Warn,
            1,
            crate::syscalls::WaitKind::Umount,
            std::time::Duration::from_secs(1),
            serde_json::json!({"target": "/mnt/\u{1b}[1A", "n": 3}),
        );
        s.user_stack = vec!["main.\u{9b}evil".into()];
        let e = Event::Stall(Box::new(s));
        let Cow::Owned(Event::Stall(out)) = escaped(&e) else { panic!("not escaped") };
        assert_eq!(out.comm, "x\\x1b[2J\\x0aFAKE");
        assert_eq!(out.detail["target"], "/mnt/\\x1b[1A");
        assert_eq!(out.user_stack, vec!["main.\\u{9b}evil".to_string()]);
        assert!(!has_control(&Event::Stall(out)));
    }
}
