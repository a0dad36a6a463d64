//! The `incident` and `incident_resolved` lines of `plegwatch watch --json`,
//! grouped by incident, with the checks every scenario makes of them.

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Result};
use serde_json::Value;

use crate::events::Event;

/// How soon after its oldest wait crosses `--warn` an incident must be raised.
pub const RAISE_WITHIN: Duration = Duration::from_secs(1);

/// One incident: every line printed about it, in order.
#[derive(Clone, Debug)]
pub struct Incident {
    pub id: u64,
    /// Its `incident` lines: the first raise, then escalations and updates.
    pub lines: Vec<Event>,
    pub resolved: Option<Event>,
}

impl Incident {
    pub fn first(&self) -> &Event {
        &self.lines[0]
    }

    pub fn last(&self) -> &Event {
        &self.lines[self.lines.len() - 1]
    }

    /// The chain of a line: its hops.
    pub fn chain(line: &Event) -> Vec<Value> {
        line.get("/chain").and_then(Value::as_array).cloned().unwrap_or_default()
    }

    /// Whether any of its lines has a hop for which `pred` holds.
    pub fn any_hop(&self, pred: impl Fn(&Value) -> bool) -> bool {
        self.lines.iter().any(|l| Self::chain(l).iter().any(&pred))
    }

    /// The first line whose chain `pred` accepts.
    pub fn line_where(&self, pred: impl Fn(&[Value]) -> bool) -> Option<&Event> {
        self.lines.iter().find(|l| pred(&Self::chain(l)))
    }

    /// The last line whose chain satisfies `pred`: the chain as it settled.
    pub fn last_line_where(&self, pred: impl Fn(&[Value]) -> bool) -> Option<&Event> {
        self.lines.iter().rev().find(|l| pred(&Self::chain(l)))
    }

    /// How long after its oldest wait crossed `warn` it was first raised, by
    /// plegwatch's own clock (`waited_s` is that wait's age at the raise).
    pub fn raised_after_warn(&self, warn: Duration) -> Duration {
        let waited = self.first().f64("/waited_s").unwrap_or(f64::MAX);
        Duration::from_secs_f64((waited - warn.as_secs_f64()).max(0.0))
    }
}

/// Every incident in `events`, in the order they were raised.
pub fn incidents(events: &[Event]) -> Vec<Incident> {
    let mut out: Vec<Incident> = Vec::new();
    for e in events {
        let Some(id) = e.u64("/id") else { continue };
        if e.is("incident") {
            match out.iter_mut().find(|i| i.id == id) {
                Some(i) => i.lines.push(e.clone()),
                None => out.push(Incident { id, lines: vec![e.clone()], resolved: None }),
            }
        } else if e.is("incident_resolved") {
            if let Some(i) = out.iter_mut().find(|i| i.id == id) {
                i.resolved = Some(e.clone());
            }
        }
    }
    out
}

/// A hop's field as text (for messages).
pub fn hop_text(h: &Value) -> String {
    format!(
        "{} pid={} {} [{}] -> {} ({})",
        h["kind"].as_str().unwrap_or("?"),
        h["pid"],
        h["what"].as_str().unwrap_or("?"),
        h["comm"].as_str().unwrap_or("?"),
        h["edge"].as_str().unwrap_or("-"),
        h["exactness"].as_str().unwrap_or("-")
    )
}

/// A chain as lines, for messages and notes.
pub fn chain_text(chain: &[Value]) -> String {
    chain.iter().map(|h| format!("  {}", hop_text(h))).collect::<Vec<_>>().join("\n")
}

/// The one incident the stall made: exactly one incident has a hop `in_it`
/// accepts. It must have been raised within [`RAISE_WITHIN`] of crossing `warn`,
/// and be resolved by a line read after `lifted` (when the test lifted the fault).
pub fn the_one(events: &[Event], warn: Duration, lifted: Option<Instant>, in_it: impl Fn(&Value) -> bool) -> Result<Incident> {
    the_one_since(events, warn, None, lifted, in_it)
}

/// [`the_one`], among the incidents still open when the fault `began`: one that was
/// resolved before is another problem (on a slow machine, the staging's own container
/// start can take longer than `--warn` and raise an incident of its own, through the
/// same Status lock).
pub fn the_one_since(
    events: &[Event],
    warn: Duration,
    began: Option<Instant>,
    lifted: Option<Instant>,
    in_it: impl Fn(&Value) -> bool,
) -> Result<Incident> {
    let all = incidents(events);
    let open_then = |i: &Incident| match (began, &i.resolved) {
        (Some(b), Some(r)) => r.at >= b,
        _ => true,
    };
    let mine: Vec<&Incident> = all.iter().filter(|i| i.any_hop(&in_it) && open_then(i)).collect();
    let listing = || {
        all.iter()
            .map(|i| format!("incident #{} ({} lines):\n{}", i.id, i.lines.len(), chain_text(&Incident::chain(i.last()))))
            .collect::<Vec<_>>()
            .join("\n")
    };
    if mine.len() != 1 {
        bail!("want exactly one incident for the stall, found {}:\n{}", mine.len(), listing());
    }
    let i = mine[0].clone();
    let late = i.raised_after_warn(warn);
    let within = crate::timing::scaled(RAISE_WITHIN);
    ensure!(late <= within, "incident #{} raised {late:?} after its oldest wait crossed --warn (want <= {within:?})", i.id);
    if let Some(lifted) = lifted {
        match &i.resolved {
            Some(r) => ensure!(r.at >= lifted, "incident #{} resolved before the fault was lifted", i.id),
            None => bail!("incident #{} was never resolved after the fault was lifted:\n{}", i.id, listing()),
        }
    }
    Ok(i)
}
