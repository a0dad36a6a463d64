//! The daemon's metrics: a sink that turns events into OpenMetrics series
//! (the official `prometheus-client`), and the [`Exposition`] the HTTP
//! endpoint reads them from.
//!
//! Fed only by events: incidents and stalls as they are printed, and the
//! daemon's once-a-second `status` for what moves between them (budgets, relist
//! clocks, kernel counters, latency tables, scan lateness, plegwatch's own use).
//! The sink never calls back into the engine; the endpoint only reads.

use crate::events::{Event, Sink, Status};
use crate::levels::Level;
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, NoLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram, MetricType},
    registry::{Registry, Unit},
};
use serde::Serialize;
use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
};

/// Labels of the open-waits and open-incidents gauges.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct KindLevel {
    pub kind: String,
    pub level: String,
}

/// Labels of the incidents-by-pod gauge: a pod that a hop of an open incident
/// runs in (`container` empty for a pod's shim).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PodLabels {
    pub namespace: String,
    pub pod: String,
    pub container: String,
}

impl PodLabels {
    /// Where the series past [`POD_SERIES_MAX`] are counted.
    fn other() -> Self {
        PodLabels { namespace: "other".into(), pod: "other".into(), container: "other".into() }
    }
}

/// Most pod label sets `plegwatch_incident_pods` shows at once (then one `other`
/// series): a node runs a hundred pods or so, and an incident rarely names
/// more than two or three.
pub const POD_SERIES_MAX: usize = 32;

/// The series to show for these counts by pod: those `shown` already keep
/// their own, new ones take the free places up to `max`, and the rest add up
/// under `other`. Label sets with no count are left out (their series go).
pub fn bound_pods(counts: &BTreeMap<PodLabels, i64>, shown: &BTreeSet<PodLabels>, max: usize) -> BTreeMap<PodLabels, i64> {
    let mut out: BTreeMap<PodLabels, i64> =
        counts.iter().filter(|(p, n)| **n > 0 && shown.contains(*p)).map(|(p, n)| (p.clone(), *n)).collect();
    out.retain(|p, _| *p != PodLabels::other());
    let mut other = 0;
    for (p, n) in counts.iter().filter(|(_, n)| **n > 0) {
        if out.contains_key(p) {
            continue;
        }
        if out.len() < max {
            out.insert(p.clone(), *n);
        } else {
            other += n;
        }
    }
    if other > 0 {
        out.insert(PodLabels::other(), other);
    }
    out
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    probe: String,
    reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PidLabel {
    pid: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SyscallLabel {
    syscall: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GoCallLabels {
    target: String,
    function: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct GoQuantileLabels {
    target: String,
    function: String,
    quantile: String,
}

/// An open incident as `/incidents` serves it (and `plegwatch check` reads it).
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct IncidentView {
    pub id: u64,
    pub level: String,
    /// The root's kind (`umount`, `go_lock`, ...), or `cycle`.
    pub root_kind: String,
    /// The root in words: what, and who (`comm pid=…`).
    pub root: String,
    /// The chain's first hop (the relist when one is in it).
    pub symptom: String,
    pub budget_used: f64,
    pub waited_s: f64,
    pub started_at: String,
}

/// What `/incidents` serves: whether the probes are up, and the open incidents.
#[derive(Clone, Debug, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct IncidentsDoc {
    pub ready: bool,
    pub incidents: Vec<IncidentView>,
}

/// Tables the scrape encodes as they were at the last status.
#[derive(Debug, Default)]
struct Tables {
    syscalls: Vec<crate::events::SyscallHistogram>,
    go_latency: Vec<crate::latency::LatencyRow>,
}

/// Encodes the kernel's log2 histograms and the Go latency tables at scrape time.
#[derive(Debug)]
struct TablesCollector(Arc<Mutex<Tables>>);

impl Collector for TablesCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(t) = self.0.lock() else { return Ok(()) };
        if !t.syscalls.is_empty() {
            let mut m = encoder.encode_descriptor(
                "plegwatch_wait_duration",
                "Watched waits (umount2, sync family) by syscall, from the kernel's log2 histogram (sum estimated at bucket midpoints)",
                Some(&Unit::Seconds),
                MetricType::Histogram,
            )?;
            for h in &t.syscalls {
                let (mut count, mut sum, mut lower) = (0u64, 0.0, 0.0);
                for (upper, n) in &h.buckets {
                    count += n;
                    sum += *n as f64 * (lower + upper) / 2.0;
                    lower = *upper;
                }
                let mut buckets = h.buckets.clone();
                buckets.push((f64::INFINITY, 0));
                let labels = SyscallLabel { syscall: h.syscall.clone() };
                m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        if !t.go_latency.is_empty() {
            let mut m = encoder.encode_descriptor(
                "plegwatch_go_call_duration",
                "Probed Go calls' latency quantiles by target and function (HdrHistogram)",
                Some(&Unit::Seconds),
                MetricType::Gauge,
            )?;
            for r in &t.go_latency {
                for (q, v) in [("0.5", r.p50_s), ("0.9", r.p90_s), ("0.99", r.p99_s), ("1", r.max_s)] {
                    let labels = GoQuantileLabels { target: r.target.clone(), function: r.function.clone(), quantile: q.into() };
                    m.encode_family(&labels)?.encode_gauge(&v)?;
                }
            }
            let mut m = encoder.encode_descriptor(
                "plegwatch_go_calls",
                "Probed Go calls that returned, by target and function",
                None,
                MetricType::Counter,
            )?;
            for r in &t.go_latency {
                let labels = GoCallLabels { target: r.target.clone(), function: r.function.clone() };
                m.encode_family(&labels)?.encode_counter::<NoLabelSet, _, f64>(&r.count, None)?;
            }
        }
        Ok(())
    }
}

/// What the HTTP endpoint serves: cheap to clone, safe to read from another task.
#[derive(Clone)]
pub struct Exposition {
    registry: Arc<Registry>,
    doc: Arc<Mutex<IncidentsDoc>>,
    ready: Arc<AtomicBool>,
}

impl Exposition {
    /// The OpenMetrics text of every series.
    pub fn metrics(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }

    /// Whether the probes are attached (the `ready` event was seen).
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// The open incidents, most PLEG budget used first.
    pub fn incidents(&self) -> IncidentsDoc {
        let mut doc = self.doc.lock().map(|d| d.clone()).unwrap_or_default();
        doc.ready = self.ready();
        doc
    }
}

/// The sink that keeps the series up to date.
pub struct MetricsSink {
    open_waits: Family<KindLevel, Gauge>,
    incidents_open: Family<KindLevel, Gauge>,
    incident_pods: Family<PodLabels, Gauge>,
    incidents_raised: Counter,
    incidents_resolved: Counter,
    budget: Gauge<f64, AtomicU64>,
    relist_age: Family<PidLabel, Gauge<f64, AtomicU64>>,
    dropped: Family<DropLabels, Counter>,
    scan_late: Histogram,
    cpu: Counter<f64, AtomicU64>,
    rss: Gauge,
    up: Gauge,
    tables: Arc<Mutex<Tables>>,
    doc: Arc<Mutex<IncidentsDoc>>,
    ready: Arc<AtomicBool>,
    // The sink's own view, from the events.
    waits: HashMap<u64, (String, Level)>,
    incidents: BTreeMap<u64, IncidentView>,
    /// Label sets ever set, zeroed when they empty (so a series goes back to 0).
    wait_labels: BTreeSet<KindLevel>,
    incident_labels: BTreeSet<KindLevel>,
    /// Each open incident's pods, and the pod series shown now.
    pods_by_incident: BTreeMap<u64, BTreeSet<PodLabels>>,
    pod_series: BTreeSet<PodLabels>,
    relist_pids: BTreeSet<String>,
    dropped_seen: HashMap<(&'static str, &'static str), u64>,
    cpu_seen: f64,
}

/// A metrics sink and the exposition it feeds.
pub fn metrics() -> (MetricsSink, Exposition) {
    let mut r = Registry::default();
    let open_waits = Family::<KindLevel, Gauge>::default();
    r.register("plegwatch_open_waits", "Reported waits still open, by kind and the level they reached", open_waits.clone());
    let incidents_open = Family::<KindLevel, Gauge>::default();
    r.register("plegwatch_incidents_open", "Open incidents, by their root's kind and their level", incidents_open.clone());
    let incident_pods = Family::<PodLabels, Gauge>::default();
    r.register(
        "plegwatch_incident_pods",
        "Open incidents with a hop in this pod and container (container empty for the pod's shim); at most 32 series, the rest under namespace/pod/container \"other\"",
        incident_pods.clone(),
    );
    let incidents_raised = Counter::default();
    r.register("plegwatch_incidents_raised", "Incidents raised", incidents_raised.clone());
    let incidents_resolved = Counter::default();
    r.register("plegwatch_incidents_resolved", "Incidents resolved (or merged into an older one)", incidents_resolved.clone());
    let budget = Gauge::<f64, AtomicU64>::default();
    r.register(
        "plegwatch_pleg_budget_used_ratio",
        "Share of kubelet's 180 s PLEG budget the worst open incident has used (from the traced relist's start when there is one, else its oldest wait); 0 with none open",
        budget.clone(),
    );
    let relist_age = Family::<PidLabel, Gauge<f64, AtomicU64>>::default();
    r.register_with_unit(
        "plegwatch_relist_age",
        "Time since the traced kubelet's last relist started, by kubelet pid",
        Unit::Seconds,
        relist_age.clone(),
    );
    let dropped = Family::<DropLabels, Counter>::default();
    r.register("plegwatch_dropped_records", "Records the kernel could not keep, by probe and reason", dropped.clone());
    let scan_late = Histogram::new([0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]);
    r.register_with_unit("plegwatch_scan_lateness", "How late each 250 ms scan started after its tick", Unit::Seconds, scan_late.clone());
    let cpu = Counter::<f64, AtomicU64>::default();
    r.register_with_unit("process_cpu", "plegwatch's own CPU time, user and system", Unit::Seconds, cpu.clone());
    let rss = Gauge::default();
    r.register_with_unit("process_resident_memory", "plegwatch's own resident memory", Unit::Bytes, rss.clone());
    let up = Gauge::default();
    r.register("plegwatch_ready", "1 once every probe is attached", up.clone());
    let tables = Arc::new(Mutex::new(Tables::default()));
    r.register_collector(Box::new(TablesCollector(tables.clone())));
    let doc = Arc::new(Mutex::new(IncidentsDoc::default()));
    let ready = Arc::new(AtomicBool::new(false));
    let exposition = Exposition { registry: Arc::new(r), doc: doc.clone(), ready: ready.clone() };
    let sink = MetricsSink {
        open_waits,
        incidents_open,
        incident_pods,
        incidents_raised,
        incidents_resolved,
        budget,
        relist_age,
        dropped,
        scan_late,
        cpu,
        rss,
        up,
        tables,
        doc,
        ready,
        waits: HashMap::new(),
        incidents: BTreeMap::new(),
        wait_labels: BTreeSet::new(),
        incident_labels: BTreeSet::new(),
        pods_by_incident: BTreeMap::new(),
        pod_series: BTreeSet::new(),
        relist_pids: BTreeSet::new(),
        dropped_seen: HashMap::new(),
        cpu_seen: 0.0,
    };
    (sink, exposition)
}

/// Counts by label set, with every label set seen before set to 0 when it has none now.
fn set_counts(family: &Family<KindLevel, Gauge>, seen: &mut BTreeSet<KindLevel>, now: impl Iterator<Item = KindLevel>) {
    let mut counts: BTreeMap<KindLevel, i64> = BTreeMap::new();
    for k in now {
        *counts.entry(k).or_default() += 1;
    }
    seen.extend(counts.keys().cloned());
    for k in seen.iter() {
        family.get_or_create(k).set(counts.get(k).copied().unwrap_or(0));
    }
}

impl MetricsSink {
    fn publish_incidents(&mut self) {
        let views: Vec<IncidentView> = self.incidents.values().cloned().collect();
        set_counts(
            &self.incidents_open,
            &mut self.incident_labels,
            views.iter().map(|v| KindLevel { kind: v.root_kind.clone(), level: v.level.clone() }),
        );
        self.budget.set(views.iter().map(|v| v.budget_used).fold(0.0, f64::max));
        let mut counts: BTreeMap<PodLabels, i64> = BTreeMap::new();
        for p in self.pods_by_incident.values().flatten() {
            *counts.entry(p.clone()).or_default() += 1;
        }
        let shown = bound_pods(&counts, &self.pod_series, POD_SERIES_MAX);
        for gone in self.pod_series.iter().filter(|p| !shown.contains_key(*p)) {
            self.incident_pods.remove(gone);
        }
        for (p, n) in &shown {
            self.incident_pods.get_or_create(p).set(*n);
        }
        self.pod_series = shown.into_keys().collect();
        let mut sorted = views;
        sorted.sort_by(|a, b| b.budget_used.total_cmp(&a.budget_used));
        if let Ok(mut d) = self.doc.lock() {
            d.incidents = sorted;
        }
    }

    fn publish_waits(&mut self) {
        let now = self.waits.values().map(|(k, l)| KindLevel { kind: k.clone(), level: l.as_str().into() });
        set_counts(&self.open_waits, &mut self.wait_labels, now);
    }

    fn status(&mut self, s: &Status) {
        for b in &s.incidents {
            if let Some(v) = self.incidents.get_mut(&b.id) {
                v.budget_used = b.budget_used;
                v.waited_s = b.waited_s;
                v.level = b.level.as_str().into();
            }
        }
        self.publish_incidents();
        let mut pids = BTreeSet::new();
        for r in &s.relists {
            let (Some(pid), Some(age)) = (r["pid"].as_u64(), r["since_last_start_s"].as_f64()) else { continue };
            let pid = pid.to_string();
            self.relist_age.get_or_create(&PidLabel { pid: pid.clone() }).set(age);
            pids.insert(pid);
        }
        for gone in self.relist_pids.difference(&pids) {
            self.relist_age.remove(&PidLabel { pid: gone.clone() });
        }
        self.relist_pids = pids;
        for d in &s.dropped {
            let seen = self.dropped_seen.entry((d.probe, d.reason)).or_insert(0);
            let c = self.dropped.get_or_create(&DropLabels { probe: d.probe.into(), reason: d.reason.into() });
            c.inc_by(d.count.saturating_sub(*seen));
            *seen = d.count.max(*seen);
        }
        for late in &s.scan_late_s {
            self.scan_late.observe(*late);
        }
        if s.cpu_s > self.cpu_seen {
            self.cpu.inc_by(s.cpu_s - self.cpu_seen);
            self.cpu_seen = s.cpu_s;
        }
        self.rss.set(i64::try_from(s.rss_bytes).unwrap_or(i64::MAX));
        if let Ok(mut t) = self.tables.lock() {
            t.syscalls = s.syscalls.clone();
            t.go_latency = s.go_latency.clone();
        }
    }
}

impl Sink for MetricsSink {
    fn emit(&mut self, event: &Event) {
        match event {
            Event::Ready(_) => {
                self.up.set(1);
                self.ready.store(true, Ordering::Relaxed);
            }
            Event::Stall(s) => {
                self.waits.insert(s.id, (s.kind.as_str().to_string(), s.level));
                self.publish_waits();
            }
            Event::Resolved(r) => {
                if self.waits.remove(&r.id).is_some() {
                    self.publish_waits();
                }
            }
            Event::Incident(i) => {
                if i.changed.is_empty() && !self.incidents.contains_key(&i.id) {
                    self.incidents_raised.inc();
                }
                let root = match &i.root {
                    Some(r) => (r.kind.clone(), format!("{} [{}]", r.what, r.who())),
                    None => ("cycle".into(), "a cycle (deadlock)".into()),
                };
                let view = IncidentView {
                    id: i.id,
                    level: i.level.as_str().into(),
                    root_kind: root.0,
                    root: root.1,
                    symptom: format!("{} ({})", i.symptom.what, i.symptom.kind),
                    budget_used: i.budget_used,
                    waited_s: i.waited_s,
                    started_at: i.started_at.clone(),
                };
                self.incidents.insert(i.id, view);
                let pods: BTreeSet<PodLabels> = i
                    .chain
                    .iter()
                    .chain(&i.attached)
                    .filter_map(|h| {
                        Some(PodLabels {
                            namespace: h.pod.namespace.clone().unwrap_or_default(),
                            pod: h.pod.pod.clone()?,
                            container: h.pod.container.clone().unwrap_or_default(),
                        })
                    })
                    .collect();
                self.pods_by_incident.insert(i.id, pods);
                self.publish_incidents();
            }
            Event::IncidentResolved(r) => {
                if self.incidents.remove(&r.id).is_some() {
                    self.incidents_resolved.inc();
                }
                self.pods_by_incident.remove(&r.id);
                self.publish_incidents();
            }
            Event::Status(s) => self.status(s),
            Event::Summary(_) => {
                self.up.set(0);
                self.ready.store(false, Ordering::Relaxed);
            }
            Event::Target(_) | Event::Sweep(_) | Event::GoroutineScan(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{DropCount, Ready, Resolved, Stall, SyscallHistogram};
    use crate::graph::incidents::{Incident, IncidentResolved, OpenBudget};
    use crate::graph::model::Hop;
    use crate::syscalls::WaitKind;

    fn hop(kind: &str, what: &str, root: bool) -> Hop {
        Hop {
            pod: Default::default(),
            start: Default::default(),
            wait_id: Some(1),
            kind: kind.into(),
            pid: Some(42),
            tid: Some(42),
            comm: Some("umount".into()),
            goroutine: None,
            what: what.into(),
            waited_s: Some(3.0),
            edge: None,
            evidence: None,
            exactness: None,
            root,
        }
    }

    fn incident(id: u64, level: Level, changed: Vec<&'static str>) -> Event {
        let root = hop("umount", "umount2 /mnt", true);
        Event::Incident(Box::new(Incident {
            level,
            id,
            changed,
            root: Some(root.clone()),
            symptom: root.clone(),
            chain: vec![root],
            waits: vec![1],
            attached: vec![],
            budget_used: 0.02,
            started_at: "2026-11-24T00:00:00.000Z".into(),
            waited_s: 3.0,
            cycle: false,
            started_before_attach: false,
        }))
    }

    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')).and_then(|v| v.trim().parse().ok()))
    }

    #[test]
    fn an_incident_turns_the_series_on_and_back_to_zero() {
        let (mut sink, exp) = metrics();
        sink.emit(&Event::Ready(Ready::new(1, vec![], 2.0, 60.0, 150.0)));
        sink.emit(&incident(7, Level::Warn, vec![]));
        let status = Status {
            incidents: vec![OpenBudget { id: 7, level: Level::Critical, budget_used: 0.4, waited_s: 72.0 }],
            dropped: vec![DropCount { probe: "wait_enter", reason: "inflight_full", count: 3 }],
            syscalls: vec![SyscallHistogram { syscall: "umount2".into(), buckets: vec![(0.001, 2), (2.0, 1)] }],
            scan_late_s: vec![0.002, 0.3],
            cpu_s: 1.5,
            rss_bytes: 40 << 20,
            relists: vec![serde_json::json!({"pid": 99, "since_last_start_s": 12.5})],
            ..Default::default()
        };
        sink.emit(&Event::Status(Box::new(status)));
        let text = exp.metrics().unwrap();
        assert_eq!(value(&text, r#"plegwatch_incidents_open{kind="umount",level="critical"}"#), Some(1.0), "{text}");
        assert_eq!(value(&text, "plegwatch_pleg_budget_used_ratio"), Some(0.4), "{text}");
        assert_eq!(value(&text, "plegwatch_incidents_raised_total"), Some(1.0), "{text}");
        assert_eq!(value(&text, r#"plegwatch_dropped_records_total{probe="wait_enter",reason="inflight_full"}"#), Some(3.0), "{text}");
        assert_eq!(value(&text, r#"plegwatch_relist_age_seconds{pid="99"}"#), Some(12.5), "{text}");
        assert_eq!(value(&text, r#"plegwatch_wait_duration_seconds_bucket{le="0.001",syscall="umount2"}"#), Some(2.0), "{text}");
        assert_eq!(value(&text, r#"plegwatch_wait_duration_seconds_bucket{le="+Inf",syscall="umount2"}"#), Some(3.0), "{text}");
        assert_eq!(value(&text, "plegwatch_scan_lateness_seconds_count"), Some(2.0), "{text}");
        assert_eq!(value(&text, "process_cpu_seconds_total"), Some(1.5), "{text}");
        assert_eq!(value(&text, "process_resident_memory_bytes"), Some((40u64 << 20) as f64), "{text}");
        assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with EOF");
        let doc = exp.incidents();
        assert!(doc.ready);
        assert_eq!(doc.incidents.len(), 1);
        assert_eq!((doc.incidents[0].level.as_str(), doc.incidents[0].root_kind.as_str()), ("critical", "umount"));
        assert!(doc.incidents[0].root.contains("umount2 /mnt [umount pid=42]"), "{:?}", doc.incidents[0]);

        // Escalated again (printed): not raised twice.
        sink.emit(&incident(7, Level::Critical, vec!["level"]));
        sink.emit(&Event::IncidentResolved(IncidentResolved { id: 7, waited_s: 80.0, longest_chain: vec![], merged_into: None }));
        sink.emit(&Event::Status(Box::default()));
        let text = exp.metrics().unwrap();
        assert_eq!(value(&text, r#"plegwatch_incidents_open{kind="umount",level="critical"}"#), Some(0.0), "back to zero:\n{text}");
        assert_eq!(value(&text, "plegwatch_pleg_budget_used_ratio"), Some(0.0), "{text}");
        assert_eq!(value(&text, "plegwatch_incidents_raised_total"), Some(1.0), "{text}");
        assert_eq!(value(&text, "plegwatch_incidents_resolved_total"), Some(1.0), "{text}");
        assert!(exp.incidents().incidents.is_empty());
    }

    fn labels(ns: &str, pod: &str) -> PodLabels {
        PodLabels { namespace: ns.into(), pod: pod.into(), container: String::new() }
    }

    #[test]
    fn pod_series_are_bounded() {
        let counts: BTreeMap<PodLabels, i64> = (0..5).map(|i| (labels("ns", &format!("p{i}")), 1)).collect();
        // Three places: p0..p2 shown, p3 and p4 under other.
        let shown = bound_pods(&counts, &BTreeSet::new(), 3);
        assert_eq!(shown.len(), 4, "{shown:?}");
        assert_eq!(shown[&PodLabels::other()], 2);
        assert!(shown.contains_key(&labels("ns", "p0")));
        // A series shown keeps its place when a new pod comes (no flapping).
        let before: BTreeSet<PodLabels> = [labels("ns", "p4")].into();
        let shown = bound_pods(&counts, &before, 3);
        assert!(shown.contains_key(&labels("ns", "p4")));
        assert_eq!(shown[&PodLabels::other()], 2);
        // Pods with no open incident are left out, and with room there is no other.
        let mut fewer = counts.clone();
        fewer.insert(labels("ns", "p1"), 0);
        let shown = bound_pods(&fewer, &BTreeSet::new(), 10);
        assert_eq!(shown.len(), 4);
        assert!(!shown.contains_key(&PodLabels::other()));
        // Never more than max + 1 series, however many pods.
        let many: BTreeMap<PodLabels, i64> = (0..1000).map(|i| (labels("ns", &format!("q{i}")), 1)).collect();
        assert_eq!(bound_pods(&many, &BTreeSet::new(), POD_SERIES_MAX).len(), POD_SERIES_MAX + 1);
    }

    #[test]
    fn incident_pods_come_and_go() {
        let (mut sink, exp) = metrics();
        let mut root = hop("umount", "umount2 /mnt", true);
        root.pod = crate::graph::model::PodRef {
            pod: Some("web-0".into()),
            namespace: Some("shop".into()),
            container: Some("app".into()),
            container_id: None,
        };
        let host = hop("cri_call", "ListContainers", false);
        sink.emit(&Event::Incident(Box::new(Incident {
            level: Level::Warn,
            id: 3,
            changed: vec![],
            root: Some(root.clone()),
            symptom: host.clone(),
            chain: vec![host, root],
            waits: vec![1],
            attached: vec![],
            budget_used: 0.1,
            started_at: String::new(),
            waited_s: 10.0,
            cycle: false,
            started_before_attach: false,
        })));
        let text = exp.metrics().unwrap();
        assert_eq!(value(&text, r#"plegwatch_incident_pods{namespace="shop",pod="web-0",container="app"}"#), Some(1.0), "{text}");
        assert_eq!(text.matches("plegwatch_incident_pods{").count(), 1, "the host hop has no series:\n{text}");
        sink.emit(&Event::IncidentResolved(IncidentResolved { id: 3, waited_s: 12.0, longest_chain: vec![], merged_into: None }));
        let text = exp.metrics().unwrap();
        assert!(!text.contains("plegwatch_incident_pods{"), "the series goes with the incident:\n{text}");
    }

    #[test]
    fn open_waits_by_kind_and_level() {
        let (mut sink, exp) = metrics();
        let stall = |id, level| {
            Event::Stall(Box::new(Stall {
                pod: Default::default(),
                level,
                id,
                kind: WaitKind::Umount,
                pid: 1,
                tid: 1,
                comm: "umount".into(),
                waited_s: 2.0,
                started_at: String::new(),
                budget_used: 0.0,
                started_before_attach: false,
                detail: serde_json::Value::Null,
                holder: None,
                cause: None,
                chain: vec![],
                wait: None,
                kernel_stack: vec![],
                user_stack: vec![],
                user_stack_id: -1,
            }))
        };
        sink.emit(&stall(1, Level::Warn));
        sink.emit(&stall(2, Level::Warn));
        sink.emit(&stall(2, Level::Critical));
        let text = exp.metrics().unwrap();
        assert_eq!(value(&text, r#"plegwatch_open_waits{kind="umount",level="warn"}"#), Some(1.0), "{text}");
        assert_eq!(value(&text, r#"plegwatch_open_waits{kind="umount",level="critical"}"#), Some(1.0), "{text}");
        for id in [1, 2] {
            sink.emit(&Event::Resolved(Resolved {
                id,
                kind: WaitKind::Umount,
                pid: 1,
                tid: 1,
                waited_s: 3.0,
                comm: "umount".into(),
                timing: "exact",
            }));
        }
        let text = exp.metrics().unwrap();
        assert_eq!(value(&text, r#"plegwatch_open_waits{kind="umount",level="warn"}"#), Some(0.0), "{text}");
        assert_eq!(value(&text, r#"plegwatch_open_waits{kind="umount",level="critical"}"#), Some(0.0), "{text}");
    }
}
