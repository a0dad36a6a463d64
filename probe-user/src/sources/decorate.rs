//! What a `stall` event gets on its way from its source to the sinks: the pods of its
//! process and of its hops, its user stack named, and its thread's off-CPU figures.
//! Its holder, cause and chain are the graph's (see `graph::scan::Scanned::links`);
//! nothing here changes them.
//!
//! The scheduler passes each source's events through [`Decorate::event`]; a
//! `resolved` event unpins its thread's user stack.

use crate::{
    clock::monotonic_ns,
    events::{Event, Stall},
    graph::model::Hop,
    observe::k8s::Pods,
    observe::ustack::UserSymbolizer,
    sources::offcpu::{DSleeps, OffCpu},
};
use serde_json::Value;

/// What decorates one batch of events.
pub struct Decorate<'a> {
    pub offcpu: Option<&'a OffCpu>,
    /// Names the user stacks the kernel took at a wait's start.
    pub ustack: &'a mut UserSymbolizer,
    /// Who is in which pod.
    pub pods: &'a mut Pods,
    /// The kernel's D sleeps, read at the batch's first stall line.
    sleeps: Option<DSleeps>,
    /// Time spent naming pods, naming user stacks and reading off-CPU figures.
    spent: [std::time::Duration; 3],
}

/// Each hop's pod and container, by its process, as its line is printed (after the
/// graph decided what changed: names never make a line of their own).
pub fn name_pods<'h>(hops: impl Iterator<Item = &'h mut Hop>, pods: &mut Pods) {
    for h in hops {
        if let Some(pid) = h.pid {
            h.pod = pods.of_pid(pid);
        }
    }
}

impl<'a> Decorate<'a> {
    pub fn new(offcpu: Option<&'a OffCpu>, ustack: &'a mut UserSymbolizer, pods: &'a mut Pods) -> Self {
        Decorate { offcpu, ustack, pods, sleeps: None, spent: Default::default() }
    }

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

    /// Where this batch's time went: naming pods, naming user stacks, off-CPU figures.
    pub fn spent(&self) -> [(&'static str, std::time::Duration); 3] {
        [("decorate_pods", self.spent[0]), ("decorate_user_stacks", self.spent[1]), ("decorate_offcpu", self.spent[2])]
    }

    fn stall(&mut self, s: &mut Stall) {
        let now = monotonic_ns();
        let began = std::time::Instant::now();
        s.pod = self.pods.of_pid(s.pid);
        name_pods(s.holder.iter_mut().chain(s.cause.iter_mut()).chain(s.chain.iter_mut()), self.pods);
        let named = std::time::Instant::now();
        self.spent[0] += named - began;
        self.user_stack(s);
        let stacked = std::time::Instant::now();
        self.spent[1] += stacked - named;
        self.offcpu(s, now);
        self.spent[2] += stacked.elapsed();
    }

    fn user_stack(&mut self, s: &mut Stall) {
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
    }

    fn offcpu(&mut self, s: &mut Stall, now: u64) {
        let Some(o) = self.offcpu else { return };
        let sleeps = self.sleeps.get_or_insert_with(|| o.d_sleeps());
        if let (Some(v), Value::Object(d)) = (o.for_tid(sleeps, s.tid, now), &mut s.detail) {
            d.insert("offcpu".into(), v);
        }
    }
}
