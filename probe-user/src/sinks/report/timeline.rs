//! The timeline of a bundle's waits: one row per wait, when it began, when
//! it crossed each level (its stall lines) and when it ended (its end
//! record), in seconds from the earliest start. The page draws it.

use super::bundle::Bundle;
use std::time::SystemTime;

/// One wait on the timeline; times are seconds after [`Timeline::origin`].
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    pub wait_id: u64,
    pub kind: String,
    /// `comm pid=… tid=… g=…`.
    pub who: String,
    pub start_s: f64,
    /// Its end, or the last time it was seen open.
    pub end_s: f64,
    /// False while it was still open when the bundle was written.
    pub ended: bool,
    /// False when no line gave its start: it is drawn from its incident's.
    pub start_known: bool,
    /// (level, when) for each level its stall lines reported.
    pub marks: Vec<(String, f64)>,
}

/// An incident's escalation, on the same axis.
#[derive(Clone, Debug, PartialEq)]
pub struct Mark {
    pub incident: u64,
    pub level: String,
    pub at_s: f64,
}

/// The whole timeline.
#[derive(Clone, Debug, PartialEq)]
pub struct Timeline {
    /// RFC 3339 of time zero (none when no wait has a known start).
    pub origin: Option<String>,
    /// From zero to the latest end.
    pub span_s: f64,
    /// By start, then wait id: exactly one per wait of the bundle.
    pub rows: Vec<Row>,
    pub incident_marks: Vec<Mark>,
}

fn parse(t: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(t).ok()
}

fn secs_between(origin: SystemTime, t: SystemTime) -> f64 {
    t.duration_since(origin).map(|d| d.as_secs_f64()).unwrap_or_else(|e| -e.duration().as_secs_f64())
}

/// The timeline of `b`.
pub fn of(b: &Bundle) -> Timeline {
    let starts = b.waits.iter().filter_map(|w| w.started_at.as_deref().and_then(parse));
    let inc_starts = b.incidents.iter().filter_map(|i| parse(&i.started_at));
    let origin = starts.chain(inc_starts).min();
    let at = |t: Option<SystemTime>| -> Option<f64> { origin.zip(t).map(|(o, t)| secs_between(o, t)) };
    let mut rows: Vec<Row> = b
        .waits
        .iter()
        .map(|w| {
            let own = at(w.started_at.as_deref().and_then(parse));
            let of_incident = b.incidents.iter().find(|i| i.waits.contains(&w.id)).and_then(|i| at(parse(&i.started_at)));
            let start_s = own.or(of_incident).unwrap_or(0.0).max(0.0);
            let age = w.ended_after_s.unwrap_or(w.waited_s).max(0.0);
            let who = crate::graph::model::who_text(w.comm.as_deref(), w.pid, w.tid, w.goroutine.as_deref());
            Row {
                wait_id: w.id,
                kind: w.kind.clone(),
                who,
                start_s,
                end_s: start_s + age,
                ended: w.ended_after_s.is_some(),
                start_known: own.is_some(),
                marks: w.escalations.iter().map(|e| (e.level.clone(), start_s + e.after_s.max(0.0))).collect(),
            }
        })
        .collect();
    rows.sort_by(|a, b| a.start_s.total_cmp(&b.start_s).then(a.wait_id.cmp(&b.wait_id)));
    let incident_marks: Vec<Mark> = b
        .incidents
        .iter()
        .flat_map(|i| {
            let start = at(parse(&i.started_at)).unwrap_or(0.0);
            i.escalations.iter().map(move |e| Mark { incident: i.id, level: e.level.clone(), at_s: start + e.after_s })
        })
        .collect();
    let span_s = rows.iter().map(|r| r.end_s).chain(incident_marks.iter().map(|m| m.at_s)).fold(0.0, f64::max);
    let origin = origin.map(|o| humantime::format_rfc3339_millis(o).to_string());
    Timeline { origin, span_s, rows, incident_marks }
}

/// A round step for axis ticks: about `span / 8`, as 1, 2 or 5 × 10ⁿ.
pub fn tick_step(span: f64) -> f64 {
    if !(span.is_finite() && span > 0.0) {
        return 1.0;
    }
    let raw = span / 8.0;
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0].into_iter().map(|m| m * mag).find(|s| *s >= raw).unwrap_or(10.0 * mag)
}
