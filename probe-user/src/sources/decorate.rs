//! What a `stall` event gets on its way from its source to the sinks: the pod of its
//! process, its user stack named, its thread's off-CPU figures, the holder's own
//! longest open wait, and (for a thread waiting on a kernel mutex) the mutex's owner
//! as its holder.
//!
//! The scheduler passes each source's events through [`Decorate::event`]; a
//! `resolved` event unpins its thread's user stack.

use crate::{
    clock::monotonic_ns,
    events::{Event, Stall},
    observe::k8s::Pods,
    observe::ustack::UserSymbolizer,
    sources::offcpu::OffCpu,
};
use serde_json::Value;
use std::collections::HashMap;

/// What decorates one batch of events.
pub struct Decorate<'a> {
    pub offcpu: Option<&'a OffCpu>,
    /// Names the user stacks the kernel took at a wait's start.
    pub ustack: &'a mut UserSymbolizer,
    /// Each process's longest open wait: (kind, start ns).
    pub open_waits: &'a HashMap<u32, (&'static str, u64)>,
    /// Who is in which pod.
    pub pods: &'a mut Pods,
}

impl Decorate<'_> {
    /// `event`, decorated.
    pub fn event(&mut self, event: Event) -> Event {
        match event {
            Event::Resolved(r) => {
                self.ustack.unpin(r.tid);
                Event::Resolved(r)
            }
            Event::Stall(mut s) => {
                self.stall(&mut s);
                Event::Stall(s)
            }
            other => other,
        }
    }

    fn stall(&mut self, s: &mut Stall) {
        let now = monotonic_ns();
        s.pod = self.pods.of_pid(s.pid);
        // The holder's own longest open wait, if it has one: the next link.
        if let Some(Value::Object(h)) = &mut s.holder {
            let pid = h.get("pid").and_then(Value::as_u64).map(|p| p as u32);
            if let Some((kind, start)) = pid.and_then(|p| self.open_waits.get(&p)) {
                h.insert(
                    "longest_open_wait".into(),
                    serde_json::json!({ "kind": kind, "waited_s": now.saturating_sub(*start) as f64 / 1e9 }),
                );
            }
        }
        if s.user_stack.is_empty() {
            if let Some(o) = self.offcpu {
                // Innermost first from the kernel, as the kernel stack.
                s.user_stack = self.ustack.frames(s.pid, &o.user_ips(s.user_stack_id));
            }
        }
        if s.user_stack.is_empty() && s.started_before_attach {
            // Begun before the probes: a Go thread's stack is unwound from outside.
            s.user_stack = self.ustack.blocked_go_thread(s.pid, s.tid);
        }
        let Some(o) = self.offcpu else { return };
        if let (Some(v), Value::Object(d)) = (o.for_tid(s.tid, now), &mut s.detail) {
            d.insert("offcpu".into(), v);
        }
        // A thread waiting on a kernel mutex is held by its owner, before anything
        // vaguer ("the kernel").
        let vague = s.holder.as_ref().is_none_or(|h| h.get("kind").and_then(Value::as_str) == Some("kernel"));
        if vague {
            if let Some(h) = o.lock_holder(s.tid, now) {
                s.holder = Some(h);
            }
        }
    }
}
