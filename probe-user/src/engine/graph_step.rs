//! The wait-for graph's step of a scan: every source's open waits and facts are
//! gathered into a [`Snapshot`], `graph::scan` turns them into changes, the scan's
//! `stall` lines take their links from the same graph, and each change is handed
//! back with its hops named by pod.
//!
//! The graph is kept until the next scan: a wait that crosses `--warn` and ends
//! before a scan sees it open (a short wait, or a late scan) gets its one stall line
//! from its end record, and that line takes its links from the last scan, which saw
//! it open, with the hops' ages as of that scan (`detail.links_as_of_s` says how long
//! before the line that was).

use super::{lookups, Watch};
use crate::{
    clock::monotonic_ns,
    events::{Event, Stall},
    graph::{
        ids,
        incidents::{Change, Clocks},
        model::WaitKey,
        scan::{scan, Scanned, Snapshot},
    },
    sources::{children::ChildWaits, decorate::name_pods, parked},
};
use std::time::SystemTime;

impl Watch {
    /// The wait-for graph's step: every source's open waits and facts in; each `stall`
    /// event the sources just made (in `out`) takes its holder, cause and chain from
    /// the graph; the graph's changes out, each hop named with its pod.
    pub(super) fn step_graph(&mut self, phases: &mut super::scan_clock::Phases) -> Vec<Event> {
        let now = monotonic_ns();
        let mut waits = self.syscalls.open_waits().to_vec();
        waits.extend(self.req.open_waits().iter().cloned());
        waits.extend(self.go.open_waits(now));
        let mut facts = self.go.facts();
        facts.ttrpc = self.req.ttrpc_facts(now);
        phases.mark("graph_waits");
        let child_waits = self.children.as_mut().map(ChildWaits::scan).unwrap_or_default();
        phases.mark("child_waits");
        // Threads parked where no probe sees them (last round's sample).
        let parked = self.sampler.as_ref().map(|s| s.latest().iter().filter(|p| parked::still_parked(p)).cloned().collect());
        phases.mark("parked");
        let answers = self.req.answers(now);
        let devices = match self.devices.as_mut() {
            Some(io) => {
                io.sample(now);
                self.syscalls.device_facts(io, now)
            }
            None => Vec::new(),
        };
        phases.mark("devices");
        let clocks = Clocks { now_ns: now, wall: SystemTime::now(), relist_start_ns: self.go.relist_start_ns() };
        let snapshot = Snapshot { clocks, waits, facts, child_waits, parked, answers, devices };
        let mut world = lookups::World { observe: &mut self.observe, offcpu: self.offcpu.as_ref() };
        let filter = &self.cfg.filter;
        let scanned = scan(&mut self.incidents, snapshot, &mut world, &|w| filter.matches_wait(w), &mut ids::id_of);
        phases.mark("graph_scan");
        // The sampler's next round: the processes of waits old enough to anchor one.
        if let Some(s) = &self.sampler {
            s.request(
                scanned.waits.iter().filter(|w| now.saturating_sub(w.start_ns) >= parked::ANCHOR_MIN_NS).map(|w| w.who.pid).collect(),
            );
        }
        // The stall lines' holders: decided here, once, as the incidents' hops are.
        let mut stalls: Vec<&mut Stall> = stalls_with_waits(&mut self.out).collect();
        let keys: Vec<WaitKey> = stalls.iter().filter_map(|s| s.wait).collect();
        for (s, links) in stalls.iter_mut().zip(scanned.links(&keys, now, &mut ids::id_of)) {
            s.holder = links.holder;
            s.cause = links.cause;
            s.chain = links.chain;
        }
        let Scanned { changes, waits, edges } = scanned;
        self.last_graph = Some(LastGraph { at_ns: now, graph: Scanned { changes: Vec::new(), waits, edges } });
        phases.mark("stall_links");
        let mut events = Vec::new();
        for change in changes {
            let event = match change {
                Change::Raised(mut i) => {
                    let hops = i.root.iter_mut().chain([&mut i.symptom]).chain(i.chain.iter_mut()).chain(i.attached.iter_mut());
                    name_pods(hops, &mut self.pods);
                    Event::Incident(Box::new(i))
                }
                Change::Resolved(mut r) => {
                    name_pods(r.longest_chain.iter_mut(), &mut self.pods);
                    Event::IncidentResolved(r)
                }
            };
            events.push(event);
        }
        phases.mark("incident_pods");
        events
    }

    /// The stall lines the sources just made between scans (from waits' end records)
    /// take their links from the last scan's graph (see the module doc).
    pub(super) fn link_ended(&mut self) {
        let Some(last) = &self.last_graph else { return };
        let mut stalls: Vec<&mut Stall> = stalls_with_waits(&mut self.out).filter(|s| s.holder.is_none() && s.chain.is_empty()).collect();
        if stalls.is_empty() {
            return;
        }
        let keys: Vec<WaitKey> = stalls.iter().filter_map(|s| s.wait).collect();
        let as_of_s = monotonic_ns().saturating_sub(last.at_ns) as f64 / 1e9;
        for (s, links) in stalls.iter_mut().zip(last.graph.links(&keys, last.at_ns, &mut ids::id_of)) {
            if links.chain.is_empty() {
                continue;
            }
            s.holder = links.holder;
            s.cause = links.cause;
            s.chain = links.chain;
            if let serde_json::Value::Object(d) = &mut s.detail {
                d.insert("links_as_of_s".into(), serde_json::json!((as_of_s * 1e3).round() / 1e3));
            }
        }
    }
}

/// The stall lines in `out` that name their wait (those the graph can link).
fn stalls_with_waits(out: &mut [Event]) -> impl Iterator<Item = &mut Stall> {
    out.iter_mut()
        .filter_map(|e| match e {
            Event::Stall(s) => Some(&mut **s),
            _ => None,
        })
        .filter(|s| s.wait.is_some())
}

/// The last scan's graph and when it was made.
pub(super) struct LastGraph {
    at_ns: u64,
    graph: Scanned,
}
