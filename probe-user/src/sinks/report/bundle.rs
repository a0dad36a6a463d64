//! The bundle's data (`incident.json`) and how its blocked time is folded.
//!
//! A bundle holds one or more incidents, the waits they are made of, and the
//! **samples** every renderer reads: one per wait, valued at that wait's
//! blocked time in nanoseconds, on a stack that runs from the bottom:
//! - the chain's hops from the symptom down to that wait (so the root's
//!   sample sits on the whole chain, the symptom's on the symptom alone);
//! - then the waiting thread's kernel stack, outermost frame first, each
//!   frame marked `_[k]` (flamegraph.pl's convention for kernel frames).
//!
//! A frame's width in the flamegraph is the blocked time of the waits at or
//! above it: the symptom's frame spans every wait of the chain, in
//! thread-seconds. Waits off the chain (threads attached by a heuristic link,
//! or further waits behind the same root) stand on a frame of their own.
//!
//! Above the hops stand the waiting thread's stacks, named already: its user
//! stack as the kernel took it at the wait's start (Go by gopclntab, C by ELF
//! symbols; watched syscalls only, so far), then its kernel stack
//! (`/proc/TID/stack`, or the off-CPU probe's symbolized stack when the stall
//! had none), suffixed `_[k]`.

use crate::events::{Resolved, Stall};
use crate::graph::incidents::{Incident, IncidentResolved};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};

/// The value of `format` in every `incident.json` this version writes.
pub const FORMAT: &str = "plegwatch-bundle/1";

/// One incident bundle, or the whole run's: what `incident.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Bundle {
    /// [`FORMAT`].
    pub format: String,
    /// `incident` (one incident) or `run` (every incident of a run).
    pub scope: String,
    /// Why it was written: `imminent`, `resolved` or `exit`.
    pub reason: String,
    /// RFC 3339 UTC.
    pub written_at: String,
    /// The unit of every sample's value: `nanoseconds` of blocked time.
    pub unit: String,
    pub incidents: Vec<IncidentRecord>,
    pub waits: Vec<WaitRecord>,
    pub samples: Vec<Sample>,
}

/// An incident as the bundle keeps it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IncidentRecord {
    pub id: u64,
    /// The highest level it reached.
    pub level: String,
    /// `open` or `resolved`.
    pub state: String,
    pub started_at: String,
    /// The age of its oldest wait (when it ended, for a resolved one).
    pub waited_s: f64,
    pub budget_used: f64,
    pub cycle: bool,
    /// The longest chain it had, from the symptom to the root (then the
    /// root's holder when that is not a wait), hops as in the JSON output.
    pub chain: Vec<HopRecord>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attached: Vec<HopRecord>,
    /// Every wait id it had.
    pub waits: Vec<u64>,
    /// The levels it reached, each with the age of its oldest wait then
    /// (`after_s`, seconds after `started_at`): the timeline's marks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalations: Vec<Escalation>,
}

/// A level crossed, and how long after the start.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Escalation {
    /// `warn`, `critical` or `imminent`.
    pub level: String,
    /// Seconds after the wait (or the incident's oldest wait) began.
    pub after_s: f64,
}

/// A hop, as printed in an `incident` line.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct HopRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_id: Option<u64>,
    pub kind: String,
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tid: Option<u32>,
    #[serde(default)]
    pub comm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goroutine: Option<String>,
    pub what: String,
    #[serde(default)]
    pub waited_s: Option<f64>,
    #[serde(default)]
    pub edge: Option<String>,
    #[serde(default)]
    pub evidence: Option<String>,
    #[serde(default)]
    pub exactness: Option<String>,
    #[serde(default)]
    pub root: bool,
    /// The process's pod, namespace and container, when plegwatch knows them.
    #[serde(flatten)]
    pub pod: PodNames,
}

/// A process's pod, namespace and container, each when known: the keys `pod`,
/// `namespace` and `container` of a hop or wait record.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct PodNames {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

impl PodNames {
    /// The known ones, as (label, value).
    pub fn labels(&self) -> impl Iterator<Item = (&'static str, &String)> {
        [("pod", &self.pod), ("namespace", &self.namespace), ("container", &self.container)]
            .into_iter()
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    }
}

/// A wait of an incident, with what its stall lines said of its thread.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct WaitRecord {
    pub id: u64,
    pub kind: String,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<String>,
    /// Its blocked time: the longest it was seen open, or its end record's.
    pub waited_s: f64,
    /// `exact` or `approximate` once it ended; none while open.
    #[serde(default)]
    pub timing: Option<String>,
    /// Innermost frame first, as `/proc/TID/stack` lists it.
    #[serde(default)]
    pub kernel_stack: Vec<String>,
    /// Where `kernel_stack` came from: `proc_stack` (at the stall line),
    /// `offcpu` (the off-CPU probe's top D-state stack), or none.
    #[serde(default)]
    pub kernel_stack_from: Option<String>,
    #[serde(default)]
    pub user_stack: Vec<String>,
    /// The goroutine (hex), when a hop named it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goroutine: Option<String>,
    /// When it began, RFC 3339 UTC: from its stall lines, else from its age
    /// on an incident line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_at: Option<String>,
    /// The levels its stall lines reported, first crossing of each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub escalations: Vec<Escalation>,
    /// Its age when it ended (its end record's); none while open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_after_s: Option<f64>,
    /// The process's pod, namespace and container, from its stall lines.
    #[serde(flatten)]
    pub pod: PodNames,
}

/// One folded stack of blocked time.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Sample {
    /// Frames from the bottom (the symptom) up.
    pub stack: Vec<String>,
    pub blocked_ns: u64,
    /// pprof labels: `kind`, `incident`, `wait` (pod, namespace and container
    /// when plegwatch knows them).
    pub labels: BTreeMap<String, String>,
}

impl HopRecord {
    /// The engine's hop, through its JSON form (the contract the bundle keeps).
    pub fn of<T: Serialize>(hop: &T) -> Option<HopRecord> {
        serde_json::to_value(hop).ok().and_then(|v| serde_json::from_value(v).ok())
    }

    /// The hop as a flamegraph frame: `kind comm: what`, with no `;` (the
    /// folded format's separator) and at most [`FRAME_MAX`] characters.
    pub fn frame(&self) -> String {
        frame_text(&format!("{} {}: {}", self.kind, self.comm.as_deref().unwrap_or("?"), self.what))
    }
}

/// The longest a frame's text may be.
pub const FRAME_MAX: usize = 120;

fn frame_text(s: &str) -> String {
    let clean: String = s.chars().map(|c| if c == ';' || c.is_control() { ',' } else { c }).collect();
    let clean = clean.trim();
    if clean.chars().count() <= FRAME_MAX {
        return clean.to_string();
    }
    let mut out: String = clean.chars().take(FRAME_MAX - 1).collect();
    out.push('…');
    out
}

/// A kernel function's frame.
fn kernel_frame(f: &str) -> String {
    frame_text(&format!("{f}_[k]"))
}

/// What the report sink remembers of the run, from the events alone.
#[derive(Default)]
pub struct Ledger {
    waits: BTreeMap<u64, WaitRecord>,
    incidents: BTreeMap<u64, IncidentRecord>,
}

/// Non-negative, finite seconds as a duration (else zero).
pub fn duration_s(s: f64) -> std::time::Duration {
    std::time::Duration::try_from_secs_f64(s).unwrap_or_default()
}

fn secs_ns(s: f64) -> u64 {
    if s.is_finite() && s > 0.0 {
        (s * 1e9).round() as u64
    } else {
        0
    }
}

impl Ledger {
    /// A stall line: the wait's thread and kernel stack.
    pub fn stall(&mut self, s: &Stall) {
        let w = self.waits.entry(s.id).or_insert_with(|| WaitRecord { id: s.id, ..Default::default() });
        w.kind = s.kind.as_str().to_string();
        w.pid = Some(s.pid);
        w.tid = Some(s.tid);
        w.comm = Some(s.comm.clone());
        w.waited_s = w.waited_s.max(s.waited_s);
        w.started_at = Some(s.started_at.clone());
        let level = s.level.as_str();
        if !w.escalations.iter().any(|e| e.level == level) {
            w.escalations.push(Escalation { level: level.to_string(), after_s: s.waited_s });
        }
        if s.pod.pod.is_some() {
            w.pod = PodNames { pod: s.pod.pod.clone(), namespace: s.pod.namespace.clone(), container: s.pod.container.clone() };
        }
        if !s.kernel_stack.is_empty() {
            w.kernel_stack = s.kernel_stack.clone();
            w.kernel_stack_from = Some("proc_stack".into());
        } else if w.kernel_stack.is_empty() {
            let top = s.detail.pointer("/offcpu/top_stack").and_then(Value::as_array);
            let frames: Vec<String> = top.into_iter().flatten().filter_map(|f| f.as_str().map(str::to_string)).collect();
            if !frames.is_empty() {
                w.kernel_stack = frames;
                w.kernel_stack_from = Some("offcpu".into());
            }
        }
        if !s.user_stack.is_empty() {
            w.user_stack = s.user_stack.clone();
        }
    }

    /// (incident records, wait records) held.
    pub fn len(&self) -> (usize, usize) {
        (self.incidents.len(), self.waits.len())
    }

    /// Drops incident `id` and the waits no other incident has, once its bundle is
    /// written (the daemon), and every ended wait that no incident has.
    pub fn forget_incident(&mut self, id: u64) {
        self.incidents.remove(&id);
        let kept: BTreeSet<u64> = self
            .incidents
            .values()
            .flat_map(|r| r.waits.iter().copied().chain(r.chain.iter().chain(&r.attached).filter_map(|h| h.wait_id)))
            .collect();
        self.waits.retain(|w, rec| kept.contains(w) || rec.ended_after_s.is_none());
    }

    /// A reported wait ended: its blocked time is final.
    pub fn resolved(&mut self, r: &Resolved) {
        let w = self.waits.entry(r.id).or_insert_with(|| WaitRecord { id: r.id, ..Default::default() });
        if w.kind.is_empty() {
            w.kind = r.kind.as_str().to_string();
            w.pid = Some(r.pid);
            w.tid = Some(r.tid);
            w.comm = Some(r.comm.clone());
        }
        w.waited_s = w.waited_s.max(r.waited_s);
        w.timing = Some(r.timing.to_string());
        w.ended_after_s = Some(r.waited_s);
    }

    /// An incident line (raised, escalated or updated).
    pub fn incident(&mut self, i: &Incident) {
        let chain: Vec<HopRecord> = i.chain.iter().filter_map(HopRecord::of).collect();
        let attached: Vec<HopRecord> = i.attached.iter().filter_map(HopRecord::of).collect();
        // The line's own time: its oldest wait's start plus that wait's age.
        let now = humantime::parse_rfc3339_weak(&i.started_at).ok().and_then(|t| t.checked_add(duration_s(i.waited_s)));
        for h in chain.iter().chain(&attached) {
            self.hop_seen(h, now);
        }
        let rec = self.incidents.entry(i.id).or_insert_with(|| IncidentRecord {
            id: i.id,
            level: String::new(),
            state: "open".into(),
            started_at: i.started_at.clone(),
            waited_s: 0.0,
            budget_used: 0.0,
            cycle: false,
            chain: Vec::new(),
            attached: Vec::new(),
            waits: Vec::new(),
            escalations: Vec::new(),
        });
        let level = i.level.as_str();
        if level_rank(level) > level_rank(&rec.level) {
            rec.escalations.push(Escalation { level: level.to_string(), after_s: i.waited_s });
        }
        if level_rank(level) >= level_rank(&rec.level) {
            rec.level = level.to_string();
        }
        rec.waited_s = rec.waited_s.max(i.waited_s);
        rec.budget_used = rec.budget_used.max(i.budget_used);
        rec.cycle = i.cycle;
        if chain.len() >= rec.chain.len() {
            rec.chain = chain;
        }
        rec.attached = attached;
        let all: BTreeSet<u64> = rec.waits.iter().copied().chain(i.waits.iter().copied()).collect();
        rec.waits = all.into_iter().collect();
    }

    /// Every wait of the incident ended (or it joined another one: then it is
    /// forgotten, and goes on under the other id). True when a bundle is due.
    pub fn incident_resolved(&mut self, r: &IncidentResolved) -> bool {
        if r.merged_into.is_some() {
            self.incidents.remove(&r.id);
            return false;
        }
        let longest: Vec<HopRecord> = r.longest_chain.iter().filter_map(HopRecord::of).collect();
        for h in &longest {
            self.hop_seen(h, None);
        }
        let Some(rec) = self.incidents.get_mut(&r.id) else { return false };
        rec.state = "resolved".into();
        rec.waited_s = rec.waited_s.max(r.waited_s);
        if longest.len() > rec.chain.len() {
            rec.chain = longest;
        }
        true
    }

    /// A hop of an incident line printed at `now` (none: time unknown).
    fn hop_seen(&mut self, h: &HopRecord, now: Option<std::time::SystemTime>) {
        let Some(id) = h.wait_id else { return };
        let w = self.waits.entry(id).or_insert_with(|| WaitRecord { id, ..Default::default() });
        if w.kind.is_empty() {
            w.kind = h.kind.clone();
            w.pid = h.pid;
            w.tid = h.tid;
            w.comm = h.comm.clone();
        }
        if w.goroutine.is_none() {
            w.goroutine = h.goroutine.clone();
        }
        w.waited_s = w.waited_s.max(h.waited_s.unwrap_or(0.0));
        if w.started_at.is_none() {
            let start = now.zip(h.waited_s).and_then(|(t, age)| t.checked_sub(duration_s(age)));
            w.started_at = start.map(|t| humantime::format_rfc3339_millis(t).to_string());
        }
    }

    /// The bundle of one incident (none if it was never raised).
    pub fn bundle_of(&self, id: u64, reason: &str, written_at: String) -> Option<Bundle> {
        let rec = self.incidents.get(&id)?;
        Some(self.bundle(std::slice::from_ref(rec), "incident", reason, written_at))
    }

    /// The whole run's bundle: every incident raised.
    pub fn run_bundle(&self, written_at: String) -> Bundle {
        let recs: Vec<IncidentRecord> = self.incidents.values().cloned().collect();
        self.bundle(&recs, "run", "exit", written_at)
    }

    fn bundle(&self, recs: &[IncidentRecord], scope: &str, reason: &str, written_at: String) -> Bundle {
        let mut ids = BTreeSet::new();
        for r in recs {
            ids.extend(r.waits.iter().copied());
            ids.extend(r.chain.iter().chain(&r.attached).filter_map(|h| h.wait_id));
        }
        let waits: Vec<WaitRecord> = ids.iter().filter_map(|id| self.waits.get(id).cloned()).collect();
        // Each hop's age is its wait's blocked time as last known (an ended
        // wait's end record), not the age at the incident's last line.
        let recs: Vec<IncidentRecord> = recs
            .iter()
            .map(|r| {
                let mut r = r.clone();
                for h in r.chain.iter_mut().chain(r.attached.iter_mut()) {
                    if let Some(w) = h.wait_id.and_then(|id| self.waits.get(&id)) {
                        h.waited_s = Some(h.waited_s.unwrap_or(0.0).max(w.waited_s));
                    }
                }
                r
            })
            .collect();
        let samples = recs.iter().flat_map(|r| samples_of(r, &waits)).collect();
        Bundle {
            format: FORMAT.into(),
            scope: scope.into(),
            reason: reason.into(),
            written_at,
            unit: "nanoseconds".into(),
            incidents: recs,
            waits,
            samples,
        }
    }
}

fn level_rank(l: &str) -> u8 {
    match l {
        "warn" => 1,
        "critical" => 2,
        "imminent" => 3,
        _ => 0,
    }
}

/// One incident's samples: a sample per wait, see the module doc.
pub fn samples_of(rec: &IncidentRecord, waits: &[WaitRecord]) -> Vec<Sample> {
    let by_id: BTreeMap<u64, &WaitRecord> = waits.iter().map(|w| (w.id, w)).collect();
    let blocked = |id: u64, hop: Option<&HopRecord>| -> u64 {
        let from_wait = by_id.get(&id).map(|w| w.waited_s).unwrap_or(0.0);
        let from_hop = hop.and_then(|h| h.waited_s).unwrap_or(0.0);
        secs_ns(from_wait.max(from_hop))
    };
    // The thread's stacks, outermost first: its user stack (taken at the wait's start),
    // then its kernel stack (where it sleeps).
    let kernel = |id: u64| -> Vec<String> {
        by_id
            .get(&id)
            .map(|w| {
                let user = w.user_stack.iter().rev().map(|f| frame_text(f));
                user.chain(w.kernel_stack.iter().rev().map(|f| kernel_frame(f))).collect()
            })
            .unwrap_or_default()
    };
    let labels = |kind: &str, id: u64, link: &str, pod: &PodNames| -> BTreeMap<String, String> {
        let mut l = BTreeMap::from([
            ("kind".to_string(), kind.to_string()),
            ("incident".to_string(), rec.id.to_string()),
            ("wait".to_string(), id.to_string()),
            ("link".to_string(), link.to_string()),
        ]);
        l.extend(pod.labels().map(|(k, v)| (k.to_string(), v.clone())));
        l
    };
    let mut out = Vec::new();
    let mut placed = BTreeSet::new();
    let mut path: Vec<String> = Vec::new();
    for h in &rec.chain {
        let Some(id) = h.wait_id else { continue };
        path.push(h.frame());
        if !placed.insert(id) {
            continue;
        }
        let mut stack = path.clone();
        stack.extend(kernel(id));
        out.push(Sample { stack, blocked_ns: blocked(id, Some(h)), labels: labels(&h.kind, id, "chain", &h.pod) });
    }
    for h in &rec.attached {
        let Some(id) = h.wait_id else { continue };
        if !placed.insert(id) {
            continue;
        }
        let mut stack = vec![frame_text(&format!("{} (attached: {})", h.frame(), h.edge.as_deref().unwrap_or("link")))];
        stack.extend(kernel(id));
        out.push(Sample { stack, blocked_ns: blocked(id, Some(h)), labels: labels(&h.kind, id, "attached", &h.pod) });
    }
    for id in &rec.waits {
        let Some(w) = by_id.get(id) else { continue };
        if !placed.insert(*id) {
            continue;
        }
        let mut stack = vec![frame_text(&format!("{} {}: behind the same root, off the chain", w.kind, w.comm.as_deref().unwrap_or("?")))];
        stack.extend(kernel(*id));
        out.push(Sample { stack, blocked_ns: blocked(*id, None), labels: labels(&w.kind, *id, "behind_root", &w.pod) });
    }
    out.retain(|s| s.blocked_ns > 0);
    out
}

/// The samples as folded stacks (`frame;frame;frame value`, value in
/// nanoseconds), identical stacks summed, sorted.
pub fn folded(samples: &[Sample]) -> String {
    let mut sums: BTreeMap<String, u64> = BTreeMap::new();
    for s in samples {
        *sums.entry(s.stack.join(";")).or_default() += s.blocked_ns;
    }
    sums.iter().map(|(stack, v)| format!("{stack} {v}\n")).collect()
}

/// The sum of a folded file's values.
pub fn folded_total(folded: &str) -> u64 {
    folded.lines().filter_map(|l| l.rsplit_once(' ')).filter_map(|(_, v)| v.trim().parse::<u64>().ok()).sum()
}
