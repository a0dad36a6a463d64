//! The daemon's output: events as `tracing` records (text or JSON, as
//! `--log-format` says), one record per incident raised, changed or resolved.

use crate::events::{Event, Sink};

/// Writes events as log records.
#[derive(Default)]
pub struct LogSink;

impl Sink for LogSink {
    fn emit(&mut self, event: &Event) {
        let event = super::escape::escaped(event);
        match &*event {
            Event::Ready(r) => tracing::info!(
                pid = r.pid,
                probes = r.probes.len(),
                warn_s = r.warn_s,
                critical_s = r.critical_s,
                imminent_s = r.imminent_s,
                "plegwatch daemon ready"
            ),
            Event::Target(t) => tracing::info!(target_kind = %t.target, status = t.status, pid = t.pid, binary = %t.binary, "Go target"),
            Event::Sweep(s) => tracing::info!(
                kernel_waits = s.kernel_waits,
                child_waits = s.child_waits,
                netlink_waiters = s.netlink_waiters,
                dbus_calls = s.dbus_calls,
                "startup sweep: already waiting when plegwatch started"
            ),
            Event::GoroutineScan(g) => match &g.error {
                Some(e) => tracing::warn!(target_kind = %g.target, pid = g.pid, "goroutines not read: {e}; every other probe goes on"),
                None => {
                    tracing::info!(target_kind = %g.target, pid = g.pid, goroutines = g.goroutines, open_calls = g.open_calls, took_ms = g.took_ms, "goroutines read")
                }
            },
            Event::Incident(i) => {
                let root = i.root.as_ref().map(|r| format!("{} [{}]", r.what, r.who())).unwrap_or_else(|| "a cycle (deadlock)".into());
                let root_kind = i.root.as_ref().map(|r| r.kind.as_str()).unwrap_or("cycle");
                let chain: Vec<String> = i.chain.iter().map(|h| format!("{} ({})", h.what, h.kind)).collect();
                let changed = i.changed.join(",");
                tracing::warn!(
                    incident = i.id,
                    level = i.level.as_str(),
                    changed = %changed,
                    budget_used = i.budget_used,
                    waited_s = i.waited_s,
                    root_kind,
                    root = %root,
                    chain = %chain.join(" -> "),
                    "incident"
                );
            }
            Event::IncidentResolved(r) => {
                tracing::info!(incident = r.id, waited_s = r.waited_s, merged_into = r.merged_into, "incident resolved")
            }
            Event::Stall(s) => tracing::debug!(
                id = s.id,
                kind = s.kind.as_str(),
                level = s.level.as_str(),
                pid = s.pid,
                tid = s.tid,
                waited_s = s.waited_s,
                "wait"
            ),
            Event::Resolved(r) => tracing::debug!(id = r.id, kind = r.kind.as_str(), waited_s = r.waited_s, "wait ended"),
            Event::Summary(s) => tracing::info!(
                ran_s = s.ran_s,
                incidents = s.incidents,
                incidents_resolved = s.incidents_resolved,
                dropped_waits = s.dropped_waits,
                dropped_events = s.dropped_events,
                "plegwatch daemon stopped"
            ),
            Event::Status(_) => {}
        }
    }
}
