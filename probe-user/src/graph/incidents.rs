//! Incidents: each scan, the open waits and their edges become chains, and
//! the chains become incidents that are raised, escalated, updated and
//! resolved.
//!
//! - Each wait follows its best edge (exact before inferred before
//!   heuristic; an open wait before a terminal holder; then the older
//!   holder) to its holder, and so on down to a **root**: a wait held by
//!   nothing open (maybe by a terminal: a stopped process, the kernel).
//! - An **incident** is a root plus every wait that leads to it. It is
//!   raised once its oldest wait has lasted `warn`, and keeps its id for as
//!   long as any of its waits stays open, however its chain grows or its
//!   root moves.
//! - A chain that comes back to a wait already on it is a **cycle**: a
//!   deadlock, reported as such.
//! - A wait **cut off** from its incident's chain (what it waited on ended,
//!   and it has not yet) stays in that incident for [`CUT_OFF_GRACE`]: a
//!   chain unwinds from its root up, each caller returning a little after
//!   its callee (containerd's `RunPodSandbox` goes on for a while after its
//!   CNI plugin exits), and that tail is not a new problem. Cut off for
//!   longer, it is raised on its own (a relist left waiting on a containerd
//!   that was restarted is).
//!
//! Pure logic: the waits, edges and clocks are passed in, nothing sleeps,
//! nothing reads the kernel, nothing prints.

use super::model::{Edge, Exactness, HeldBy, HolderId, Hop, OpenWait, PodRef, Terminal, WaitKey};
use crate::levels::{Level, Thresholds, PLEG_BUDGET};
use crate::syscalls::WaitKind;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, SystemTime};

/// How long a wait cut off from its incident's chain stays in that incident
/// before it may be raised on its own (see the module doc).
pub const CUT_OFF_GRACE: Duration = Duration::from_secs(2);

/// An incident as printed: raised, escalated or updated.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Incident {
    pub level: Level,
    pub id: u64,
    /// Why this line was printed again: `level`, `root`, `chain` (empty when first raised).
    #[serde(skip_deserializing)]
    pub changed: Vec<&'static str>,
    /// The deepest open wait (none for a cycle).
    pub root: Option<Hop>,
    /// Where the chain starts: the relist when one is in it, else the wait farthest from the root.
    pub symptom: Hop,
    /// From the symptom down to the root, then the root's terminal holder if any.
    pub chain: Vec<Hop>,
    /// Ids of every wait in the incident.
    pub waits: Vec<u64>,
    /// The waits off the chain that a heuristic link attaches (threads parked on a lock
    /// beside a sibling's long wait), each with its link.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attached: Vec<Hop>,
    pub budget_used: f64,
    /// RFC 3339: when its oldest wait began.
    pub started_at: String,
    /// The age of its oldest wait.
    pub waited_s: f64,
    /// The chain closes on itself: a deadlock.
    pub cycle: bool,
    /// A wait on its chain began before plegwatch started (found by the startup sweep
    /// or the goroutine scan): its age is that of the hops marked `start`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub started_before_attach: bool,
}

/// An incident whose waits have all ended.
#[derive(Clone, Debug, Serialize)]
pub struct IncidentResolved {
    pub id: u64,
    /// From its oldest wait's start to the scan that found none open (to within a scan).
    pub waited_s: f64,
    /// The longest chain it had.
    pub longest_chain: Vec<Hop>,
    /// Set when it did not end but joined another incident.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub merged_into: Option<u64>,
}

/// What a scan decided.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)] // a few per scan at most, moved straight to the sink
pub enum Change {
    Raised(Incident),
    Resolved(IncidentResolved),
}

/// Where a wait's chain ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum End {
    /// At a wait held by nothing open.
    Root(WaitKey),
    /// At a holder several waits share (a stopped process, a slow disk).
    Holder(HolderId),
    /// A cycle, named by its smallest key.
    Cycle(WaitKey),
}

/// Waits that end in the same place: (where, each wait with its path length, the oldest start).
type Group = (End, Vec<(WaitKey, usize)>, u64);

/// One scan's graph: the waits, and each wait's chosen edge.
pub struct Graph<'a> {
    waits: HashMap<WaitKey, &'a OpenWait>,
    best: HashMap<WaitKey, &'a Edge>,
}

impl<'a> Graph<'a> {
    pub fn new(waits: &'a [OpenWait], edges: &'a [Edge]) -> Self {
        let by_key: HashMap<WaitKey, &OpenWait> = waits.iter().map(|w| (w.key, w)).collect();
        let mut best: HashMap<WaitKey, &Edge> = HashMap::new();
        for e in edges {
            if !by_key.contains_key(&e.from) {
                continue;
            }
            // An edge to a wait that is not open (any more) leads nowhere.
            let target_start = match &e.to {
                HeldBy::Wait(k) if *k == e.from => continue,
                HeldBy::Wait(k) => match by_key.get(k) {
                    Some(w) => Some(w.start_ns),
                    None => continue,
                },
                HeldBy::Terminal(_) => None,
            };
            let rank = |e: &Edge, start: Option<u64>| (e.exactness, start.is_some(), std::cmp::Reverse(start.unwrap_or(u64::MAX)));
            match best.get(&e.from) {
                Some(cur) => {
                    let cur_start = match &cur.to {
                        HeldBy::Wait(k) => by_key.get(k).map(|w| w.start_ns),
                        HeldBy::Terminal(_) => None,
                    };
                    if rank(e, target_start) > rank(cur, cur_start) {
                        best.insert(e.from, e);
                    }
                }
                None => {
                    best.insert(e.from, e);
                }
            }
        }
        Graph { waits: by_key, best }
    }

    fn next(&self, k: WaitKey) -> Option<WaitKey> {
        match &self.best.get(&k)?.to {
            HeldBy::Wait(n) => Some(*n),
            HeldBy::Terminal(_) => None,
        }
    }

    /// The path from `k` along best edges: every wait once, and where it ends.
    fn path(&self, k: WaitKey) -> (Vec<WaitKey>, End) {
        let mut path = vec![k];
        let mut seen = HashSet::from([k]);
        let mut cur = k;
        while let Some(n) = self.next(cur) {
            if !seen.insert(n) {
                let at = path.iter().position(|p| *p == n).unwrap_or(0);
                let name = path[at..].iter().min().copied().unwrap_or(n);
                return (path, End::Cycle(name));
            }
            path.push(n);
            cur = n;
        }
        match self.best.get(&cur).map(|e| &e.to) {
            Some(HeldBy::Terminal(Terminal { id: Some(id), .. })) => (path, End::Holder(*id)),
            _ => (path, End::Root(cur)),
        }
    }

    fn hop(&self, k: WaitKey, now_ns: u64, root: bool, ids: &mut dyn FnMut(WaitKey) -> u64) -> Option<Hop> {
        let w = self.waits.get(&k)?;
        let edge = self.best.get(&k);
        Some(Hop {
            wait_id: Some(ids(k)),
            kind: w.kind.as_str().to_string(),
            pid: Some(w.who.pid),
            tid: Some(w.who.tid),
            comm: Some(w.who.comm.clone()),
            goroutine: w.who.goroutine,
            what: w.what.clone(),
            waited_s: Some(now_ns.saturating_sub(w.start_ns) as f64 / 1e9),
            edge: edge.map(|e| e.kind),
            evidence: edge.map(|e| e.evidence.clone()),
            exactness: edge.map(|e| e.exactness),
            root,
            pod: PodRef::default(),
            start: w.start,
        })
    }
}

/// What holds one wait, as hops: its chain from itself down to its root (then the
/// root's holder when that is not a wait), the hop that holds it (the next one), and
/// the cause (the root, when that is another wait). What a `stall` line is to show.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Links {
    pub holder: Option<Hop>,
    pub cause: Option<Hop>,
    pub chain: Vec<Hop>,
}

impl Graph<'_> {
    /// The hops of `path` (its `root_key` marked as the root), then the root's holder when
    /// that is not a wait: an incident's chain, or one wait's from it down.
    fn chain(&self, path: &[WaitKey], root_key: Option<WaitKey>, now_ns: u64, ids: &mut dyn FnMut(WaitKey) -> u64) -> Vec<Hop> {
        let mut chain: Vec<Hop> = path.iter().filter_map(|k| self.hop(*k, now_ns, Some(*k) == root_key, ids)).collect();
        if let Some(HeldBy::Terminal(t)) = root_key.and_then(|r| self.best.get(&r)).map(|e| &e.to) {
            chain.push(terminal_hop(t));
        }
        chain
    }

    /// The links of wait `key` in this graph (empty when it is not in it).
    pub fn links(&self, key: WaitKey, now_ns: u64, ids: &mut dyn FnMut(WaitKey) -> u64) -> Links {
        if !self.waits.contains_key(&key) {
            return Links::default();
        }
        let (path, end) = self.path(key);
        let root_key = match end {
            End::Cycle(_) => None,
            _ => path.last().copied(),
        };
        let chain = self.chain(&path, root_key, now_ns, ids);
        let holder = chain.get(1).cloned();
        let cause = root_key.filter(|r| *r != key).and_then(|_| chain.iter().find(|h| h.root).cloned());
        Links { holder, cause, chain }
    }
}

fn terminal_hop(t: &Terminal) -> Hop {
    Hop {
        wait_id: None,
        kind: t.kind.to_string(),
        pid: t.pid,
        tid: None,
        comm: t.comm.clone(),
        goroutine: None,
        what: t.what.clone(),
        waited_s: None,
        edge: None,
        evidence: None,
        exactness: None,
        root: false,
        pod: PodRef::default(),
        start: Default::default(),
    }
}

/// What the builder remembers of an open incident.
#[derive(Clone, Debug)]
struct Open {
    id: u64,
    waits: BTreeSet<WaitKey>,
    first_start_ns: u64,
    /// `first_start_ns` on the wall clock, as first printed: kept while the start does
    /// not move, so that reprints do not jitter by the wall and monotonic clocks' sampling.
    started_at: String,
    end: End,
    /// The deepest wait of its chain (none for a cycle).
    root: Option<WaitKey>,
    /// Every holder its root has had that is not a wait (a stopped process, a device, the
    /// kernel): its kind and, for one waits can share, its id. One seen before is not news
    /// again (a root whose holder comes and goes does not print a line each time).
    terminals: Vec<(&'static str, Option<HolderId>)>,
    level: Level,
    longest_chain: Vec<Hop>,
    /// The PLEG budget used at the last scan.
    budget_used: f64,
}

/// An open incident's level and PLEG budget as of the last scan: what the
/// daemon's gauges show between the scans that print it again.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct OpenBudget {
    pub id: u64,
    pub level: Level,
    pub budget_used: f64,
    /// The age of its oldest wait.
    pub waited_s: f64,
}

/// The clocks a scan is judged by.
#[derive(Clone, Copy, Debug)]
pub struct Clocks {
    /// CLOCK_MONOTONIC ns, the clock of every `start_ns`.
    pub now_ns: u64,
    /// The wall clock at the same instant.
    pub wall: SystemTime,
    /// When the traced kubelet's current (or last) relist started, if one is traced:
    /// the PLEG budget is used from there.
    pub relist_start_ns: Option<u64>,
}

/// The incidents open now.
pub struct Incidents {
    thresholds: Thresholds,
    open: Vec<Open>,
    next_id: u64,
    raised: u64,
    resolved: u64,
    /// The last scan's clock.
    last_now_ns: u64,
    /// Waits cut off from an open incident's chain: since when (monotonic ns).
    cut_off: HashMap<WaitKey, u64>,
}

impl Incidents {
    pub fn new(thresholds: Thresholds) -> Self {
        Incidents { thresholds, open: Vec::new(), next_id: 1, raised: 0, resolved: 0, last_now_ns: 0, cut_off: HashMap::new() }
    }

    /// (incidents raised, incidents resolved, open now).
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.raised, self.resolved, self.open.len() as u64)
    }

    /// Takes one scan: every wait open now, every edge found, and whether a
    /// wait counts (`--pid`/`--comm`). `ids` names a wait as its stall lines do.
    ///
    /// The steps: group the waits by where their chains end; match the open
    /// incidents to the groups; merge incidents that now share a group; resolve
    /// those left without one; admit the new groups (or carry waits just cut off
    /// from an open incident); and raise or update one incident per group.
    pub fn scan(
        &mut self,
        waits: &[OpenWait],
        edges: &[Edge],
        clocks: Clocks,
        keep: &dyn Fn(&OpenWait) -> bool,
        ids: &mut dyn FnMut(WaitKey) -> u64,
    ) -> Vec<Change> {
        let graph = Graph::new(waits, edges);
        let groups = group_by_end(&graph, waits, clocks.now_ns);
        let matched = self.match_groups(&groups);
        let merged = self.merges(&matched);
        // Which open incident each wait was in, for the waits a chain cuts off.
        let was_in: HashMap<WaitKey, u64> = self.open.iter().flat_map(|o| o.waits.iter().map(move |k| (*k, o.id))).collect();
        let mut changes = Vec::new();
        let (mut still_open, taken) = self.resolve_unmatched(&matched, &merged, clocks.now_ns, &mut changes);
        let mut carried = self.admit_new(&graph, &groups, &taken, &was_in, clocks.now_ns, keep, &mut still_open);
        still_open.sort_by_key(|(_, gi)| *gi);
        for (prev, gi) in still_open {
            let carried_waits = prev.as_ref().and_then(|p| carried.remove(&p.id)).unwrap_or_default();
            let Some((open, change)) = self.update(&graph, &groups[gi], prev, carried_waits, clocks, ids) else { continue };
            changes.extend(change);
            self.open.push(open);
        }
        self.last_now_ns = clocks.now_ns;
        changes
    }

    /// Each open incident's group: the one it shares most waits with (by index).
    fn match_groups(&self, groups: &[Group]) -> HashMap<usize, usize> {
        let mut matched = HashMap::new();
        // Existing incidents keep their ids: each takes the group it shares most waits with.
        for (oi, o) in self.open.iter().enumerate() {
            let pick = groups
                .iter()
                .enumerate()
                .map(|(gi, (end, members, _))| {
                    let shared = members.iter().filter(|(k, _)| o.waits.contains(k)).count();
                    (gi, shared, *end == o.end)
                })
                // Only a group that shares a wait, or ends at the same root wait, is
                // this incident: another group that ends at the same holder is another
                // problem of that holder (a new incident), not this one coming back.
                .filter(|(_, shared, same_end)| *shared > 0 || (*same_end && matches!(o.end, End::Root(_))))
                .max_by_key(|(gi, shared, same_end)| (*same_end, *shared, std::cmp::Reverse(*gi)));
            if let Some((gi, _, _)) = pick {
                matched.insert(oi, gi);
            }
        }
        matched
    }

    /// Two incidents that now share a group merge into the older one: the younger's
    /// index → the id it merges into.
    fn merges(&self, matched: &HashMap<usize, usize>) -> HashMap<usize, u64> {
        let mut merged: HashMap<usize, u64> = HashMap::new();
        let mut owner: HashMap<usize, usize> = HashMap::new();
        for oi in 0..self.open.len() {
            let Some(&gi) = matched.get(&oi) else { continue };
            match owner.get(&gi) {
                Some(&first) => {
                    let (keep_i, drop_i) = if self.open[first].id <= self.open[oi].id { (first, oi) } else { (oi, first) };
                    owner.insert(gi, keep_i);
                    merged.insert(drop_i, self.open[keep_i].id);
                }
                None => {
                    owner.insert(gi, oi);
                }
            }
        }
        merged
    }

    /// Resolves the incidents merged into another or left without a group; returns
    /// the others with their group, and the groups they took.
    fn resolve_unmatched(
        &mut self,
        matched: &HashMap<usize, usize>,
        merged: &HashMap<usize, u64>,
        now_ns: u64,
        changes: &mut Vec<Change>,
    ) -> (Vec<(Option<Open>, usize)>, HashSet<usize>) {
        let mut still_open = Vec::new();
        let mut taken = HashSet::new();
        for (oi, o) in std::mem::take(&mut self.open).into_iter().enumerate() {
            let merged_into = merged.get(&oi).copied();
            let group = if merged_into.is_some() { None } else { matched.get(&oi).copied() };
            if let Some(gi) = group {
                taken.insert(gi);
                still_open.push((Some(o), gi));
                continue;
            }
            self.resolved += 1;
            changes.push(Change::Resolved(IncidentResolved {
                id: o.id,
                waited_s: secs(now_ns.saturating_sub(o.first_start_ns)),
                longest_chain: o.longest_chain,
                merged_into,
            }));
        }
        (still_open, taken)
    }

    /// The groups no open incident took: a group cut off from an incident still open
    /// is carried by it for [`CUT_OFF_GRACE`] (returned, by incident id); any other
    /// that is old enough and has a wait `keep` counts is added to `still_open` as a
    /// new incident.
    #[allow(clippy::too_many_arguments)]
    fn admit_new(
        &mut self,
        graph: &Graph<'_>,
        groups: &[Group],
        taken: &HashSet<usize>,
        was_in: &HashMap<WaitKey, u64>,
        now_ns: u64,
        keep: &dyn Fn(&OpenWait) -> bool,
        still_open: &mut Vec<(Option<Open>, usize)>,
    ) -> HashMap<u64, Vec<WaitKey>> {
        // The incidents still open after this scan, by id: what a cut-off wait may stay in.
        let kept_ids: HashSet<u64> = still_open.iter().filter_map(|(o, _)| o.as_ref().map(|o| o.id)).collect();
        let mut carried: HashMap<u64, Vec<WaitKey>> = HashMap::new();
        let mut cut_off = HashMap::new();
        for (gi, (_, members, oldest)) in groups.iter().enumerate() {
            if taken.contains(&gi) {
                continue;
            }
            // Cut off from an incident still open: carried by it for the grace.
            let from = members.iter().find_map(|(k, _)| was_in.get(k).filter(|id| kept_ids.contains(id)).map(|id| (*k, *id)));
            if let Some((k, id)) = from {
                let since = self.cut_off.get(&k).copied().unwrap_or(now_ns);
                if Duration::from_nanos(now_ns.saturating_sub(since)) < CUT_OFF_GRACE {
                    for (m, _) in members {
                        cut_off.insert(*m, since);
                    }
                    carried.entry(id).or_default().extend(members.iter().map(|(m, _)| *m));
                    continue;
                }
            }
            let age = Duration::from_nanos(now_ns.saturating_sub(*oldest));
            if self.thresholds.level(age).is_none() {
                continue;
            }
            if !members.iter().filter_map(|(k, _)| graph.waits.get(k)).any(|w| keep(w)) {
                continue;
            }
            still_open.push((None, gi));
        }
        self.cut_off = cut_off;
        carried
    }

    /// Raises a new incident for `group` (no `prev`) or updates `prev` with it: the
    /// incident as it stands, and the `incident` line when it is news (raised, or its
    /// level, root or chain changed). None when the group has no chain to show.
    fn update(
        &mut self,
        graph: &Graph<'_>,
        group: &Group,
        prev: Option<Open>,
        carried: Vec<WaitKey>,
        clocks: Clocks,
        ids: &mut dyn FnMut(WaitKey) -> u64,
    ) -> Option<(Open, Option<Change>)> {
        let (end, members, oldest) = group;
        let age = Duration::from_nanos(clocks.now_ns.saturating_sub(*oldest));
        // Already raised: never goes down while it is open (its oldest wait may end
        // and leave younger ones), so an escalation is printed once.
        let level = match (self.thresholds.level(age), prev.as_ref().map(|p| p.level)) {
            (Some(now), Some(was)) => now.max(was),
            (now, was) => now.or(was).unwrap_or(Level::Warn),
        };
        let symptom = symptom(graph, members);
        let (path, _) = graph.path(symptom);
        let root_key = match end {
            End::Cycle(_) => None,
            _ => path.last().copied(),
        };
        let chain = graph.chain(&path, root_key, clocks.now_ns, ids);
        let root = root_key.and_then(|r| graph.hop(r, clocks.now_ns, true, ids));
        let terminal = root_key.and_then(|r| graph.best.get(&r)).and_then(|e| match &e.to {
            HeldBy::Terminal(t) => Some((t.kind, t.id)),
            HeldBy::Wait(_) => None,
        });
        let symptom_hop = chain.first().cloned()?;
        let attached: Vec<Hop> = members
            .iter()
            .filter(|(k, _)| !path.contains(k) && graph.best.get(k).is_some_and(|e| e.exactness == Exactness::Heuristic))
            .filter_map(|(k, _)| graph.hop(*k, clocks.now_ns, false, ids))
            .collect();
        let mut wait_ids: Vec<u64> = members.iter().map(|(k, _)| ids(*k)).collect();
        wait_ids.sort_unstable();
        let budget = match clocks.relist_start_ns {
            Some(start) => clocks.now_ns.saturating_sub(start),
            None => clocks.now_ns.saturating_sub(*oldest),
        };
        let mut keys: BTreeSet<WaitKey> = members.iter().map(|(k, _)| *k).collect();
        if prev.is_some() {
            keys.extend(carried);
        }
        let mut terminals = prev.as_ref().map(|p| p.terminals.clone()).unwrap_or_default();
        let (id, changed, mut longest, first_start) = match &prev {
            None => {
                let id = self.next_id;
                self.next_id += 1;
                self.raised += 1;
                (id, Some(Vec::new()), Vec::new(), *oldest)
            }
            Some(p) => {
                (p.id, what_changed(p, level, root_key, *end, &path, terminal), p.longest_chain.clone(), p.first_start_ns.min(*oldest))
            }
        };
        if chain.len() > longest.len() {
            longest = chain.clone();
        }
        let started_at = match &prev {
            Some(p) if p.first_start_ns == first_start => p.started_at.clone(),
            _ => rfc3339(clocks, first_start),
        };
        let change = changed.map(|changed| {
            let started_before_attach = chain.iter().chain(attached.iter()).any(|h| !h.start.is_exact());
            Change::Raised(Incident {
                started_before_attach,
                level,
                id,
                changed,
                root,
                symptom: symptom_hop,
                chain,
                waits: wait_ids,
                attached,
                budget_used: budget as f64 / PLEG_BUDGET.as_nanos() as f64,
                started_at: started_at.clone(),
                waited_s: secs(clocks.now_ns.saturating_sub(first_start)),
                cycle: matches!(end, End::Cycle(_)),
            })
        });
        let open = Open {
            id,
            waits: keys,
            first_start_ns: first_start,
            started_at,
            end: *end,
            root: root_key,
            terminals: {
                if let Some(t) = terminal.filter(|t| !terminals.contains(t)) {
                    terminals.push(t);
                }
                terminals
            },
            level,
            longest_chain: longest,
            budget_used: budget as f64 / PLEG_BUDGET.as_nanos() as f64,
        };
        Some((open, change))
    }

    /// Every incident open after the last scan, with its budget then.
    pub fn open_now(&self) -> Vec<OpenBudget> {
        self.open
            .iter()
            .map(|o| OpenBudget {
                id: o.id,
                level: o.level,
                budget_used: o.budget_used,
                waited_s: secs(self.last_now_ns.saturating_sub(o.first_start_ns)),
            })
            .collect()
    }
}

/// Every wait's chain, grouped by where it ends; oldest groups first, so that ids
/// follow age when several start at once.
fn group_by_end(graph: &Graph<'_>, waits: &[OpenWait], now_ns: u64) -> Vec<Group> {
    let mut groups: HashMap<End, Vec<(WaitKey, usize)>> = HashMap::new();
    for w in waits {
        let (path, end) = graph.path(w.key);
        groups.entry(end).or_default().push((w.key, path.len()));
    }
    let mut groups: Vec<Group> = groups
        .into_iter()
        .map(|(end, members)| {
            let oldest = members.iter().filter_map(|(k, _)| graph.waits.get(k)).map(|w| w.start_ns).min().unwrap_or(now_ns);
            (end, members, oldest)
        })
        .collect();
    groups.sort_by_key(|(end, _, oldest)| (*oldest, *end));
    groups
}

/// Why an open incident's line is printed again, if it is: its level rose, its root
/// moved deeper (or it became a cycle), or its chain shows a wait it did not have or a
/// new holder of its root (a process found stopped, a D-Bus name's owner once the bus
/// daemon answered, a device).
fn what_changed(
    p: &Open,
    level: Level,
    root_key: Option<WaitKey>,
    end: End,
    path: &[WaitKey],
    terminal: Option<(&'static str, Option<HolderId>)>,
) -> Option<Vec<&'static str>> {
    let mut why = Vec::new();
    if level > p.level {
        why.push("level");
    }
    // A root that moves deeper is news; one that moves up (the deepest waits ended
    // first) is only the chain shrinking. So is one that was any of its waits already
    // (a cut-off wait it carried): its chain's waits are among them.
    let root_moved = root_key != p.root && !root_key.is_some_and(|r| p.waits.contains(&r));
    if root_moved || (end != p.end && matches!(end, End::Cycle(_))) {
        why.push("root");
    }
    // A chain that only got shorter (its deepest waits ended), or that now shows waits
    // the incident already had, is not news.
    let grew = path.iter().any(|k| !p.waits.contains(k)) || terminal.is_some_and(|t| !p.terminals.contains(&t));
    if grew && !root_moved {
        why.push("chain");
    }
    (!why.is_empty()).then_some(why)
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn rfc3339(clocks: Clocks, start_ns: u64) -> String {
    let back = Duration::from_nanos(clocks.now_ns.saturating_sub(start_ns));
    let at = clocks.wall.checked_sub(back).unwrap_or(SystemTime::UNIX_EPOCH);
    humantime::format_rfc3339_millis(at).to_string()
}

/// The chain's start: a relist if the incident has one (the symptom kubelet
/// shows), else a CRI call on the relist's path (what kubelet would wait
/// on), else a wait whose path to the root has no guessed link (a client on
/// the root's socket before a thread parked beside the root on a lock: the
/// `sibling` link is a heuristic, and such waits are listed as attached),
/// then the longest path, then the oldest.
fn symptom(graph: &Graph<'_>, members: &[(WaitKey, usize)]) -> WaitKey {
    let known = |k: WaitKey| !graph.path(k).0.iter().any(|w| graph.best.get(w).is_some_and(|e| e.exactness == Exactness::Heuristic));
    members
        .iter()
        .filter_map(|(k, len)| graph.waits.get(k).map(|w| (*k, *len, w)))
        .max_by_key(|(k, len, w)| {
            (w.kind == WaitKind::PlegRelist, w.pleg_path, known(*k), *len, std::cmp::Reverse(w.start_ns), std::cmp::Reverse(*k))
        })
        .map(|(k, _, _)| k)
        .unwrap_or(members[0].0)
}

/// Which exactness a whole chain has: its weakest link.
pub fn weakest(chain: &[Hop]) -> Option<Exactness> {
    chain.iter().filter_map(|h| h.exactness).min()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::model::{EdgeKind, StartTiming, Who};

    const S: u64 = 1_000_000_000;

    fn wait(tid: u32, kind: WaitKind, what: &str, start_s: u64) -> OpenWait {
        OpenWait {
            pleg_path: kind == WaitKind::PlegRelist,
            key: WaitKey::Kernel { tid, start_ns: start_s * S },
            who: Who { pid: tid, tid, comm: format!("c{tid}"), goroutine: None },
            kind,
            what: what.into(),
            start_ns: start_s * S,
            start: StartTiming::Exact,
        }
    }

    fn edge(from: &OpenWait, to: &OpenWait, kind: EdgeKind, exactness: Exactness) -> Edge {
        Edge { from: from.key, to: HeldBy::Wait(to.key), kind, evidence: "test".into(), exactness }
    }

    fn builder() -> Incidents {
        Incidents::new(Thresholds::new(Duration::from_secs(10), Duration::from_secs(60), Duration::from_secs(150)).unwrap())
    }

    fn clocks(now_s: u64) -> Clocks {
        Clocks { now_ns: now_s * S, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000), relist_start_ns: None }
    }

    /// A kernel wait's id is its tid (for readable asserts); every other key gets an id of
    /// its own from 1000 on, as `graph::ids` gives (never one id for several keys).
    fn ids(k: WaitKey) -> u64 {
        thread_local! {
            static OTHERS: std::cell::RefCell<HashMap<WaitKey, u64>> = Default::default();
        }
        match k {
            WaitKey::Kernel { tid, .. } => tid as u64,
            _ => OTHERS.with(|m| {
                let mut m = m.borrow_mut();
                let next = 1000 + m.len() as u64;
                *m.entry(k).or_insert(next)
            }),
        }
    }

    fn run(b: &mut Incidents, waits: &[OpenWait], edges: &[Edge], now_s: u64) -> Vec<Change> {
        b.scan(waits, edges, clocks(now_s), &|_| true, &mut ids)
    }

    fn raised(c: &[Change]) -> Vec<&Incident> {
        c.iter().filter_map(|c| if let Change::Raised(i) = c { Some(i) } else { None }).collect()
    }

    fn resolved(c: &[Change]) -> Vec<&IncidentResolved> {
        c.iter().filter_map(|c| if let Change::Resolved(r) = c { Some(r) } else { None }).collect()
    }

    /// relist → ListContainers → UpdateSync holder → umount: the 9770 chain.
    fn chain_9770() -> (Vec<OpenWait>, Vec<Edge>) {
        let relist = wait(1, WaitKind::PlegRelist, "relist", 100);
        let list = wait(2, WaitKind::CriCall, "ListContainers", 101);
        let holder = wait(3, WaitKind::GoLock, "UpdateSync holds Status lock", 99);
        let umount = wait(4, WaitKind::Umount, "umount2 rootfs (task_work)", 95);
        let edges = vec![
            edge(&relist, &list, EdgeKind::CriCall, Exactness::Inferred),
            edge(&list, &holder, EdgeKind::GoLock, Exactness::Exact),
            edge(&holder, &umount, EdgeKind::Ttrpc, Exactness::Exact),
        ];
        (vec![relist, list, holder, umount], edges)
    }

    #[test]
    fn one_incident_from_the_relist_to_the_root() {
        let (waits, edges) = chain_9770();
        let mut b = builder();
        assert!(run(&mut b, &waits, &edges, 104).is_empty(), "the oldest wait is 9 s old: below warn");
        let c = run(&mut b, &waits, &edges, 105);
        let r = raised(&c);
        assert_eq!(r.len(), 1, "one incident, not four: {c:?}");
        let i = r[0];
        assert_eq!(i.level, Level::Warn);
        assert_eq!(i.symptom.kind, "pleg_relist");
        let kinds: Vec<&str> = i.chain.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(kinds, ["pleg_relist", "cri_call", "go_lock", "umount"]);
        assert_eq!(i.root.as_ref().map(|h| h.what.as_str()), Some("umount2 rootfs (task_work)"));
        assert!(i.chain.last().is_some_and(|h| h.root) && !i.chain[0].root);
        assert_eq!(i.chain[0].exactness, Some(Exactness::Inferred));
        assert_eq!(i.chain[1].edge, Some(EdgeKind::GoLock));
        assert_eq!(i.chain[3].edge, None);
        assert_eq!(i.waits, vec![1, 2, 3, 4]);
        assert!((i.waited_s - 10.0).abs() < 1e-9, "the oldest wait's age: {}", i.waited_s);
        assert!((i.budget_used - 10.0 / 180.0).abs() < 1e-9);
        assert_eq!(weakest(&i.chain), Some(Exactness::Inferred));
        // Nothing new: nothing printed.
        assert!(run(&mut b, &waits, &edges, 106).is_empty());
        // Escalates once at critical.
        let c = run(&mut b, &waits, &edges, 155);
        assert_eq!(raised(&c).len(), 1);
        assert_eq!(raised(&c)[0].level, Level::Critical);
        assert_eq!(raised(&c)[0].changed, vec!["level"]);
        assert_eq!(raised(&c)[0].id, i.id, "same incident");
        assert!(run(&mut b, &waits, &edges, 156).is_empty());
    }

    /// Issue 19: a client on the daemon's socket and a thread parked beside the daemon's
    /// netlink request on its lock have paths of one length; the parked thread's is a
    /// guess (`sibling`), and it was older, so it became the top and the client was left
    /// out of the incident. The client is the top; the parked thread is attached.
    #[test]
    fn a_known_client_is_the_top_before_a_guessed_sibling() {
        let netlink = wait(1, WaitKind::NetlinkRequest, "route RTM_NEWLINK", 90);
        let parked = wait(2, WaitKind::Futex, "futex on the daemon's lock", 91);
        let client = wait(3, WaitKind::UnixRecv, "read on the daemon's socket", 92);
        let edges = vec![
            edge(&parked, &netlink, EdgeKind::Sibling, Exactness::Heuristic),
            edge(&client, &netlink, EdgeKind::UnixPeer, Exactness::Exact),
        ];
        let mut b = builder();
        let c = run(&mut b, &[netlink, parked, client], &edges, 101);
        let r = raised(&c);
        assert_eq!(r.len(), 1, "{c:?}");
        let kinds: Vec<&str> = r[0].chain.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(kinds, ["unix_recv", "netlink_request"], "{c:?}");
        assert_eq!(r[0].attached.iter().map(|h| h.kind.as_str()).collect::<Vec<_>>(), ["futex"]);
    }

    #[test]
    fn without_a_relist_the_list_call_is_the_symptom() {
        let (mut waits, edges) = chain_9770();
        waits.remove(0);
        // UpdateContainerResources also waits on the holder, from further up.
        let ucr = wait(5, WaitKind::CriCall, "UpdateContainerResources", 98);
        let nested = wait(6, WaitKind::CriCall, "outer", 97);
        let mut edges = edges[1..].to_vec();
        edges.push(edge(&nested, &ucr, EdgeKind::NestedCall, Exactness::Exact));
        edges.push(edge(&ucr, &waits[1], EdgeKind::NestedCall, Exactness::Exact));
        waits[0].pleg_path = true;
        waits.extend([ucr, nested]);
        let mut b = builder();
        let c = run(&mut b, &waits, &edges, 111);
        assert_eq!(raised(&c)[0].symptom.what, "ListContainers", "{c:?}");
    }

    #[test]
    fn open_incidents_carry_their_budget_between_prints() {
        let (waits, edges) = chain_9770();
        let mut b = builder();
        assert!(b.open_now().is_empty());
        run(&mut b, &waits, &edges, 105);
        // Nothing printed at 120 s, but the budget has grown.
        assert!(run(&mut b, &waits, &edges, 120).is_empty());
        let open = b.open_now();
        assert_eq!(open.len(), 1);
        assert_eq!(open[0].level, Level::Warn);
        assert!((open[0].budget_used - 25.0 / 180.0).abs() < 1e-9, "{open:?}");
        assert!((open[0].waited_s - 25.0).abs() < 1e-9, "{open:?}");
        run(&mut b, &[], &[], 121);
        assert!(b.open_now().is_empty(), "resolved: none open");
    }

    #[test]
    fn the_relist_clock_sets_the_budget() {
        let (waits, edges) = chain_9770();
        let mut b = builder();
        let c = b.scan(&waits, &edges, Clocks { relist_start_ns: Some(90 * S), ..clocks(105) }, &|_| true, &mut ids);
        assert!((raised(&c)[0].budget_used - 15.0 / 180.0).abs() < 1e-9);
    }

    /// A D-Bus call raised before the bus daemon said who owns its name: once the owner
    /// is known (a stopped process), the incident's line is printed again with it at the
    /// end of its chain (a guest run resolved such an incident having printed only the
    /// chain without its holder). The same holder again is not news.
    #[test]
    fn a_root_whose_holder_is_found_later_prints_its_chain_again() {
        let call = wait(1, WaitKind::DbusCall, "D-Bus StartTransientUnit", 100);
        let mut b = builder();
        let c = run(&mut b, std::slice::from_ref(&call), &[], 110);
        assert_eq!(raised(&c)[0].chain.len(), 1);
        let systemd = Terminal {
            id: Some(HolderId::Process(9)),
            kind: "process",
            pid: Some(9),
            comm: Some("systemd".into()),
            what: "stopped (state T)".into(),
        };
        let owner = Edge {
            from: call.key,
            to: HeldBy::Terminal(systemd),
            kind: EdgeKind::DbusOwner,
            evidence: "owner".into(),
            exactness: Exactness::Exact,
        };
        let c = run(&mut b, std::slice::from_ref(&call), std::slice::from_ref(&owner), 111);
        let r = raised(&c);
        assert_eq!(r.len(), 1, "{c:?}");
        assert_eq!(r[0].changed, vec!["chain"]);
        assert_eq!(r[0].chain.last().map(|h| (h.kind.as_str(), h.pid)), Some(("process", Some(9))));
        assert!(run(&mut b, std::slice::from_ref(&call), std::slice::from_ref(&owner), 112).is_empty(), "the same holder again");
        // A holder that comes and goes is news the first time only.
        assert!(run(&mut b, std::slice::from_ref(&call), &[], 113).is_empty(), "gone: the chain only got shorter");
        assert!(run(&mut b, std::slice::from_ref(&call), std::slice::from_ref(&owner), 114).is_empty(), "back: seen before");
        // A terminal without an id (the kernel) is news too, once.
        let nl = wait(2, WaitKind::NetlinkRequest, "route", 100);
        let mut b = builder();
        run(&mut b, std::slice::from_ref(&nl), &[], 110);
        let kernel = Terminal { id: None, kind: "kernel", pid: None, comm: None, what: "the kernel: no reply".into() };
        let no_reply = Edge {
            from: nl.key,
            to: HeldBy::Terminal(kernel),
            kind: EdgeKind::NoReply,
            evidence: "seq".into(),
            exactness: Exactness::Exact,
        };
        let c = run(&mut b, std::slice::from_ref(&nl), std::slice::from_ref(&no_reply), 111);
        assert_eq!(raised(&c).first().map(|i| i.changed.clone()), Some(vec!["chain"]));
        assert!(run(&mut b, std::slice::from_ref(&nl), std::slice::from_ref(&no_reply), 112).is_empty());
    }

    #[test]
    fn a_growing_chain_updates_the_incident_and_its_root() {
        let (waits, edges) = chain_9770();
        let mut b = builder();
        // First only the top three are linked: the holder is the root.
        let c = run(&mut b, &waits[..3], &edges[..2], 110);
        let first = raised(&c)[0].clone();
        assert_eq!(first.root.as_ref().map(|r| r.kind.as_str()), Some("go_lock"));
        // Then the holder's link to the umount is found.
        let c = run(&mut b, &waits, &edges, 111);
        let r = raised(&c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].id, first.id);
        assert_eq!(r[0].changed, vec!["root"]);
        assert_eq!(r[0].root.as_ref().map(|r| r.kind.as_str()), Some("umount"));
        // The umount ends: a shorter chain is not news.
        let c = run(&mut b, &waits[..3], &edges[..2], 112);
        assert!(c.is_empty(), "{c:?}");
        // Everything ends: one resolution, with the longest chain.
        let c = run(&mut b, &[], &[], 120);
        let res = resolved(&c);
        assert_eq!(res.len(), 1);
        assert_eq!(res[0].id, first.id);
        assert_eq!(res[0].longest_chain.len(), 4);
        assert!((res[0].waited_s - 25.0).abs() < 1e-9, "from the umount's start at 95 s: {}", res[0].waited_s);
        assert_eq!(b.counts(), (1, 1, 0));
    }

    /// containerd restarted mid-incident: its waits (the list call, the lock holder) end
    /// with it. The part of the chain still leading to the root keeps the id and the start,
    /// a shorter chain is no news, and a wait cut off from the root (the relist, whose link
    /// went through containerd) is raised on its own, with its own age.
    #[test]
    fn a_restarted_process_leaves_the_rest_of_the_incident() {
        let (waits, edges) = chain_9770();
        let mut b = builder();
        let first = raised(&run(&mut b, &waits, &edges, 110))[0].clone();
        // containerd (waits 2 and 3) is gone: the relist and the shim's umount remain.
        let left = [waits[0].clone(), waits[3].clone()];
        let c = run(&mut b, &left, &[], 111);
        assert!(c.is_empty(), "within the grace the cut-off relist stays in its incident: {c:?}");
        let c = run(&mut b, &left, &[], 112);
        assert!(c.is_empty(), "still within the grace: {c:?}");
        // Cut off for the whole grace: raised on its own.
        let c = run(&mut b, &left, &[], 113);
        assert!(resolved(&c).is_empty(), "nothing resolved: {c:?}");
        let r = raised(&c);
        assert_eq!(r.len(), 1, "only the cut-off relist is news: {c:?}");
        assert_ne!(r[0].id, first.id);
        assert_eq!(r[0].symptom.kind, "pleg_relist");
        assert!((r[0].waited_s - 13.0).abs() < 1e-9, "the relist's own age: {}", r[0].waited_s);
        let kept = b.open_now().into_iter().find(|o| o.id == first.id).expect("the first incident is still open");
        assert!((kept.waited_s - 18.0).abs() < 1e-9, "from the umount's start at 95 s: {kept:?}");
        // At critical it is printed again: same id and start, the root's hop as before.
        let c = run(&mut b, &left, &[], 155);
        let again = raised(&c).into_iter().find(|i| i.id == first.id).cloned().expect("escalated");
        assert!((again.waited_s - 60.0).abs() < 1e-9, "from the umount's start at 95 s: {}", again.waited_s);
        assert_eq!(again.started_at, first.started_at, "printed as first printed, not recomputed");
        assert_eq!(again.root.as_ref().map(|h| h.wait_id), first.root.as_ref().map(|h| h.wait_id));
        assert_eq!(again.chain.iter().map(|h| h.wait_id).collect::<Vec<_>>(), vec![Some(4)]);
        // The umount ends: the incident resolves under its id, with its longest chain.
        let c = run(&mut b, &left[..1], &[], 156);
        let res = resolved(&c);
        assert_eq!(res.len(), 1);
        assert_eq!(res[0].id, first.id);
        assert_eq!(res[0].longest_chain.len(), 4);
    }

    #[test]
    fn a_caller_returning_after_its_callee_is_not_a_new_incident() {
        // RunPodSandbox (1) waits on its CNI plugin (2), which waits on the daemon's
        // netlink request (3, the root).
        let call = wait(1, WaitKind::CriCall, "RunPodSandbox", 100);
        let plugin = wait(2, WaitKind::UnixRecv, "read on the daemon's socket", 100);
        let root = wait(3, WaitKind::NetlinkRequest, "route RTM_NEWLINK", 99);
        let edges =
            vec![edge(&call, &plugin, EdgeKind::Child, Exactness::Inferred), edge(&plugin, &root, EdgeKind::UnixPeer, Exactness::Exact)];
        let mut b = builder();
        let first = raised(&run(&mut b, &[call.clone(), plugin.clone(), root.clone()], &edges, 110))[0].clone();
        assert_eq!(first.chain.len(), 3);
        // The plugin got its answer and exited; the root's end is not seen yet, and the
        // call goes on a little: no second incident.
        let c = run(&mut b, &[call.clone(), root.clone()], &edges, 111);
        assert!(c.is_empty(), "{c:?}");
        // The root ends; the call is still finishing: the same incident goes on.
        let c = run(&mut b, std::slice::from_ref(&call), &edges, 112);
        assert!(raised(&c).is_empty() && resolved(&c).is_empty(), "{c:?}");
        // The call returns: the one incident resolves.
        let c = run(&mut b, &[], &edges, 112);
        let res = resolved(&c);
        assert_eq!(res.len(), 1, "{c:?}");
        assert_eq!(res[0].id, first.id);
        assert_eq!(b.counts(), (1, 1, 0));
    }

    #[test]
    fn unrelated_stalls_are_separate_incidents() {
        let a = wait(1, WaitKind::Sync, "fsync a", 100);
        let bw = wait(2, WaitKind::NetlinkRequest, "RTM_NEWADDR", 100);
        let mut b = builder();
        let c = run(&mut b, &[a, bw], &[], 111);
        let r = raised(&c);
        assert_eq!(r.len(), 2);
        assert_ne!(r[0].id, r[1].id);
        assert!(r.iter().all(|i| i.chain.len() == 1 && i.root.is_some()));
    }

    #[test]
    fn a_cycle_is_a_deadlock() {
        let a = wait(1, WaitKind::GoCall, "a", 100);
        let b_ = wait(2, WaitKind::GoCall, "b", 100);
        let c_ = wait(3, WaitKind::GoCall, "c", 100);
        let edges = vec![
            edge(&a, &b_, EdgeKind::Child, Exactness::Exact),
            edge(&b_, &c_, EdgeKind::UnixPeer, Exactness::Exact),
            edge(&c_, &b_, EdgeKind::UnixPeer, Exactness::Exact),
        ];
        let mut b = builder();
        let c = run(&mut b, &[a, b_, c_], &edges, 111);
        let r = raised(&c);
        assert_eq!(r.len(), 1, "{c:?}");
        assert!(r[0].cycle);
        assert!(r[0].root.is_none());
        assert_eq!(r[0].chain[0].what, "a", "it starts at the wait leading into the cycle");
        assert_eq!(r[0].chain.len(), 3);
    }

    #[test]
    fn exact_edges_win_over_inferred_and_terminals_end_the_chain() {
        let w = wait(1, WaitKind::DbusCall, "StartTransientUnit", 100);
        let other = wait(2, WaitKind::Sync, "fsync", 50);
        let stopped = Terminal {
            id: Some(HolderId::Process(9)),
            kind: "process",
            pid: Some(9),
            comm: Some("svc".into()),
            what: "stopped (state T)".into(),
        };
        let edges = vec![
            edge(&w, &other, EdgeKind::Sibling, Exactness::Heuristic),
            Edge {
                from: w.key,
                to: HeldBy::Terminal(stopped),
                kind: EdgeKind::DbusOwner,
                evidence: "GetConnectionUnixProcessID".into(),
                exactness: Exactness::Exact,
            },
        ];
        let mut b = builder();
        let c = run(&mut b, &[w, other], &edges, 111);
        let r = raised(&c);
        let dbus = r.iter().find(|i| i.symptom.kind == "dbus_call").expect("the D-Bus incident");
        assert_eq!(dbus.chain.len(), 2);
        assert_eq!(dbus.chain[1].kind, "process");
        assert_eq!(dbus.chain[1].what, "stopped (state T)");
        assert!(dbus.chain[0].root, "the call is the deepest open wait");
        assert_eq!(dbus.chain[0].edge, Some(EdgeKind::DbusOwner));
    }

    /// An incident's level only rises: when its oldest wait ends and leaves younger ones,
    /// it stays critical, and its escalation is not printed a second time.
    #[test]
    fn a_level_never_goes_down_and_escalates_once() {
        let old = wait(1, WaitKind::CriCall, "ListContainers", 100);
        let young = wait(2, WaitKind::CriCall, "ListContainers", 145);
        let root = wait(3, WaitKind::GoLock, "UpdateSync holds Status lock", 140);
        let edges = vec![edge(&old, &root, EdgeKind::GoLock, Exactness::Exact), edge(&young, &root, EdgeKind::GoLock, Exactness::Exact)];
        let mut b = builder();
        let all = [old.clone(), young.clone(), root.clone()];
        let c = run(&mut b, &all, &edges, 111);
        assert_eq!(raised(&c)[0].level, Level::Warn, "{c:?}");
        let id = raised(&c)[0].id;
        let c = run(&mut b, &all, &edges, 161);
        assert_eq!(raised(&c)[0].level, Level::Critical, "{c:?}");
        // The oldest wait ends: the group's oldest is now 30 s old, a warn age.
        let rest = [young, root];
        let c = run(&mut b, &rest, &edges, 170);
        assert!(raised(&c).iter().all(|i| i.level == Level::Critical), "{c:?}");
        assert_eq!(b.open_now().first().map(|o| (o.id, o.level)), Some((id, Level::Critical)));
        // Its oldest wait crossing critical again is not a new escalation.
        let c = run(&mut b, &rest, &edges, 201);
        assert!(raised(&c).iter().all(|i| !i.changed.contains(&"level")), "printed the escalation again: {c:?}");
    }

    /// `w`'s D-Bus call → its owner, process 9, stopped.
    fn owned_by_stopped_process(w: &OpenWait) -> Edge {
        Edge {
            from: w.key,
            to: HeldBy::Terminal(Terminal {
                id: Some(HolderId::Process(9)),
                kind: "process",
                pid: Some(9),
                comm: None,
                what: "stopped (state T)".into(),
            }),
            kind: EdgeKind::DbusOwner,
            evidence: "owner".into(),
            exactness: Exactness::Exact,
        }
    }

    /// An incident whose waits all ended is over, even when a new, unrelated wait on the
    /// same holder (a stopped process) is open in the same scan: that is a new incident.
    #[test]
    fn a_new_group_at_the_same_holder_is_a_new_incident() {
        let stopped = owned_by_stopped_process;
        let first = wait(1, WaitKind::DbusCall, "Ping", 100);
        let mut b = builder();
        let c = run(&mut b, std::slice::from_ref(&first), &[stopped(&first)], 111);
        let id = raised(&c)[0].id;
        let second = wait(7, WaitKind::DbusCall, "Introspect", 115);
        let c = run(&mut b, std::slice::from_ref(&second), &[stopped(&second)], 130);
        assert_eq!(resolved(&c).iter().map(|r| r.id).collect::<Vec<_>>(), vec![id], "{c:?}");
        let r = raised(&c);
        assert_eq!(r.len(), 1, "{c:?}");
        assert_ne!(r[0].id, id, "an unrelated wait took over the finished incident: {c:?}");
        assert_eq!(r[0].waits, vec![7]);
    }

    #[test]
    fn waits_on_one_stopped_process_are_one_incident() {
        let a = wait(1, WaitKind::DbusCall, "Ping", 100);
        let b_ = wait(2, WaitKind::DbusCall, "Introspect", 102);
        let kernel_a = wait(3, WaitKind::NetlinkRequest, "RTM_NEWADDR", 100);
        let kernel_b = wait(4, WaitKind::NetlinkRequest, "RTM_GETLINK", 100);
        let svc = owned_by_stopped_process;
        let kernel = |w: &OpenWait| Edge {
            from: w.key,
            to: HeldBy::Terminal(Terminal { id: None, kind: "kernel", pid: None, comm: None, what: "no reply".into() }),
            kind: EdgeKind::NoReply,
            evidence: "seq".into(),
            exactness: Exactness::Exact,
        };
        let edges = vec![svc(&a), svc(&b_), kernel(&kernel_a), kernel(&kernel_b)];
        let mut b = builder();
        let c = run(&mut b, &[a, b_, kernel_a, kernel_b], &edges, 113);
        let r = raised(&c);
        assert_eq!(r.len(), 3, "both calls on the one stopped service, each unanswered request alone: {c:?}");
        let svc_incident = r.iter().find(|i| i.waits.contains(&1)).expect("the service's incident");
        assert_eq!(svc_incident.waits, vec![1, 2]);
        assert_eq!(svc_incident.chain.last().map(|h| h.kind.as_str()), Some("process"));
        assert!(svc_incident.root.is_some());
    }

    #[test]
    fn edges_to_waits_that_ended_lead_nowhere() {
        let a = wait(1, WaitKind::CriCall, "ListContainers", 100);
        let gone = wait(2, WaitKind::GoLock, "held", 90);
        let edges = vec![edge(&a, &gone, EdgeKind::GoLock, Exactness::Exact)];
        let mut b = builder();
        let c = run(&mut b, std::slice::from_ref(&a), &edges, 111);
        assert_eq!(raised(&c)[0].chain.len(), 1);
        assert_eq!(raised(&c)[0].root.as_ref().map(|h| h.wait_id), Some(Some(1)));
    }

    #[test]
    fn joined_incidents_merge_into_the_older() {
        let a = wait(1, WaitKind::CriCall, "ListContainers", 100);
        let root = wait(2, WaitKind::Umount, "umount", 95);
        let mut b = builder();
        let c = run(&mut b, &[a.clone(), root.clone()], &[], 111);
        assert_eq!(raised(&c).len(), 2);
        let ids_before: Vec<u64> = raised(&c).iter().map(|i| i.id).collect();
        let edges = vec![edge(&a, &root, EdgeKind::Ttrpc, Exactness::Exact)];
        let c = run(&mut b, &[a, root], &edges, 112);
        let res = resolved(&c);
        assert_eq!(res.len(), 1, "{c:?}");
        let kept = raised(&c);
        assert_eq!(kept.len(), 1);
        assert_eq!(res[0].merged_into, Some(kept[0].id));
        assert!(ids_before.contains(&kept[0].id) && ids_before.contains(&res[0].id));
        assert_eq!(kept[0].chain.len(), 2);
    }

    #[test]
    fn the_filter_picks_incidents_by_any_of_their_waits() {
        let (waits, edges) = chain_9770();
        let mut b = builder();
        let c = b.scan(&waits, &edges, clocks(111), &|w| w.who.comm == "c4", &mut ids);
        assert_eq!(raised(&c).len(), 1, "the umount's comm matches: the whole chain is shown");
        let mut b = builder();
        let c = b.scan(&waits, &edges, clocks(111), &|w| w.who.comm == "nobody", &mut ids);
        assert!(c.is_empty());
    }

    #[test]
    fn a_waits_links_are_its_holder_its_root_and_the_chain_between() {
        let relist = wait(1, WaitKind::PlegRelist, "relist", 0);
        let lock = wait(2, WaitKind::GoLock, "UpdateSync", 1);
        let umount = wait(3, WaitKind::Umount, "umount2", 2);
        let waits = vec![relist.clone(), lock.clone(), umount.clone()];
        let device = Terminal { id: Some(HolderId::Device(7, 0)), kind: "device", pid: None, comm: None, what: "loop0".into() };
        let edges = vec![
            edge(&relist, &lock, EdgeKind::CriCall, Exactness::Inferred),
            edge(&lock, &umount, EdgeKind::SameGoroutine, Exactness::Exact),
            Edge {
                from: umount.key,
                to: HeldBy::Terminal(device),
                kind: EdgeKind::Device,
                evidence: "mount".into(),
                exactness: Exactness::Exact,
            },
        ];
        let g = Graph::new(&waits, &edges);
        let mut ids = |k: WaitKey| match k {
            WaitKey::Kernel { tid, .. } => u64::from(tid),
            _ => 0,
        };
        let l = g.links(relist.key, 10 * S, &mut ids);
        assert_eq!(l.chain.iter().map(|h| h.kind.as_str()).collect::<Vec<_>>(), ["pleg_relist", "go_lock", "umount", "device"]);
        assert_eq!(l.holder.as_ref().and_then(|h| h.wait_id), Some(2), "held by the lock's wait");
        assert_eq!(l.chain[0].edge, Some(EdgeKind::CriCall), "the link to the holder is on the waiter's hop");
        let cause = l.cause.expect("a cause");
        assert_eq!((cause.wait_id, cause.root), (Some(3), true));
        // The root itself: held by the device, and no cause of its own.
        let l = g.links(umount.key, 10 * S, &mut ids);
        assert_eq!(l.holder.map(|h| h.kind), Some("device".to_string()));
        assert!(l.cause.is_none());
        // A wait not in the graph has no links.
        assert_eq!(g.links(WaitKey::Kernel { tid: 99, start_ns: 0 }, 10 * S, &mut ids), Links::default());
    }
}
