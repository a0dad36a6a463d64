//! Incident bundles (`watch --report-dir DIR`): a sink that writes one
//! directory per incident when it reaches `imminent` and again when it
//! resolves, and one for the whole run at exit:
//!
//! | file | what |
//! |---|---|
//! | `blocked.folded` | folded stacks of blocked time, in nanoseconds (see [`bundle`]) |
//! | `blocked.svg` | the same, as an interactive flamegraph (inferno) |
//! | `profile.pb.gz` | the same, as a pprof profile (see [`pprof`]) |
//! | `incident.json` | the incidents, their waits and the samples: what `plegwatch report` re-renders |
//! | `latency.json` | the run's latency tables per probe family, written at exit |
//! | `chain.svg` | the wait-for graph of each incident (layout-rs, see [`chain_svg`]) |
//! | `index.html` | one self-contained page: summary, chain, timeline, both pictures, latency (see [`page`]); rendered again at exit with `latency.json` |
//!
//! Bundles are named `<run>-incident-<id>` and `<run>-run`, where `<run>` is
//! the UTC time the watch started, this host's tag, plegwatch's pid and a random
//! part. The report directory must be this user's (root's) alone, or it is refused
//! at start; everything under it is written through directory descriptors, never
//! following a symlink ([`safe_dir`]). Directories get mode 0700, files 0600; each
//! file is written to a fresh temporary name and renamed, so a reader never sees half
//! a file.
//!
//! The sink keeps a small ledger from the events (no call back into the
//! engine) and hands each bundle to **a worker thread** through a bounded
//! queue: rendering (inferno, gzip) and writing never run on the scan loop.
//! A full queue or a full disk is logged as a warning and the bundle is skipped;
//! watching and the normal output go on. At exit
//! (the sink is dropped) the queue is drained and the worker joined.

pub mod bundle;
pub mod chain_svg;
pub mod page;
pub mod pprof;
pub mod render;
pub mod retention;
pub mod safe_dir;
pub mod timeline;

use crate::events::{Event, Sink};
use bundle::{Bundle, Ledger};
use safe_dir::{BundleDir, ReportRoot};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

/// Bundles waiting for the worker at most; more are skipped with a warning.
const QUEUE: usize = 16;

/// The file names of a bundle.
pub const FILES: [&str; 7] = ["blocked.folded", "blocked.svg", "profile.pb.gz", "incident.json", "latency.json", "chain.svg", "index.html"];

/// A job for the writer thread; bundles are named as under the report root.
enum Job {
    /// Render and write a bundle's files (not `latency.json`).
    Bundle(String, Box<Bundle>),
    /// Write `latency.json` into these bundles, and their `index.html` again with
    /// its tables.
    Latency(Vec<String>, Value),
}

/// The report sink. See the module doc.
pub struct ReportSink {
    run: String,
    ledger: Ledger,
    /// Incidents whose `imminent` bundle is written.
    imminent: BTreeSet<u64>,
    /// The bundles written in this run (for `latency.json` at exit): all of them for
    /// `watch`; for the daemon only as many as retention keeps.
    written: std::collections::VecDeque<String>,
    /// The daemon's retention: then each incident is forgotten once its resolved bundle
    /// is written, so that the ledger does not grow over weeks.
    keep: Option<retention::Retention>,
    /// The kernel's drop counters by probe, from the last status line (daemon only).
    dropped: Vec<crate::events::DropCount>,
    tx: Option<SyncSender<Job>>,
    worker: Option<JoinHandle<()>>,
}

impl ReportSink {
    /// Opens the report root `dir` (made, mode 0700, if missing) and starts the writer
    /// thread. A directory that cannot be made, or that others may write, or a symlink,
    /// is refused here, in one line: at start, not at the first incident.
    pub fn new(dir: &Path) -> Result<Self, String> {
        Self::with_retention(dir, None)
    }

    /// As [`ReportSink::new`]; after each bundle the writer thread removes this host's
    /// oldest bundles in `dir` beyond `keep` (see [`retention`]).
    pub fn with_retention(dir: &Path, keep: Option<retention::Retention>) -> Result<Self, String> {
        let root = Arc::new(ReportRoot::open(dir)?);
        let stamp = humantime::format_rfc3339_seconds(SystemTime::now()).to_string().replace(['-', ':'], "");
        let run = root.run_name(&stamp).map_err(|e| format!("report dir {}: a random bundle name: {e}", dir.display()))?;
        let (tx, rx) = sync_channel::<Job>(QUEUE);
        let worker = std::thread::Builder::new()
            .name("plegwatch-report".into())
            .spawn(move || {
                for job in rx {
                    match job {
                        Job::Bundle(name, b) => {
                            match root.bundle_dir(&name).map_err(|e| WriteError::Io(name.clone(), e)).and_then(|d| write_bundle(&d, &b)) {
                                Ok(()) => {
                                    if let Some(keep) = keep {
                                        retention::prune(&root, keep, &name);
                                    }
                                }
                                Err(e) => tracing::warn!("report bundle {name}: {e}; watching goes on"),
                            }
                        }
                        Job::Latency(names, v) => {
                            for name in names {
                                let d = match root.existing_bundle(&name) {
                                    Ok(d) => d,
                                    // Removed by retention since: nothing to add to.
                                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                                    Err(e) => {
                                        tracing::warn!("report bundle {name}: {e}");
                                        continue;
                                    }
                                };
                                let body = serde_json::to_vec_pretty(&v).unwrap_or_default();
                                if let Err(e) = d.write("latency.json", &body) {
                                    tracing::warn!("report bundle {name}: latency.json: {e}");
                                }
                                if let Err(e) = rewrite_page(&d, &v) {
                                    tracing::warn!("report bundle {name}: index.html: {e}");
                                }
                            }
                        }
                    }
                }
            })
            .map_err(|e| format!("report dir {}: cannot start its writer thread: {e}", dir.display()))?;
        Ok(ReportSink {
            keep,
            run,
            ledger: Ledger::default(),
            imminent: BTreeSet::new(),
            written: Default::default(),
            dropped: Vec::new(),
            tx: Some(tx),
            worker: Some(worker),
        })
    }

    fn send(&mut self, job: Job, what: &str) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(job) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => tracing::warn!("report writer busy ({QUEUE} bundles queued): {what} skipped"),
            Err(TrySendError::Disconnected(_)) => tracing::warn!("report writer stopped: {what} skipped"),
        }
    }

    fn incident_bundle(&mut self, id: u64, reason: &str) {
        let Some(b) = self.ledger.bundle_of(id, reason, now_rfc3339()) else { return };
        let name = format!("{}-incident-{id}", self.run);
        self.note_written(&name);
        self.send(Job::Bundle(name, Box::new(b)), &format!("bundle of incident #{id}"));
    }

    fn note_written(&mut self, name: &str) {
        if !self.written.iter().any(|n| n == name) {
            self.written.push_back(name.to_string());
        }
        if let Some(keep) = self.keep {
            while self.written.len() > keep.max_bundles {
                self.written.pop_front();
            }
        }
    }

    /// What the ledger holds: (incidents, waits), and the bundle names kept.
    pub fn held(&self) -> (usize, usize, usize) {
        let (i, w) = self.ledger.len();
        (i, w, self.written.len() + self.imminent.len())
    }
}

fn now_rfc3339() -> String {
    humantime::format_rfc3339_millis(SystemTime::now()).to_string()
}

impl Sink for ReportSink {
    fn emit(&mut self, event: &Event) {
        match event {
            Event::Stall(s) => self.ledger.stall(s),
            Event::Resolved(r) => self.ledger.resolved(r),
            Event::Incident(i) => {
                self.ledger.incident(i);
                if i.level == crate::levels::Level::Imminent && self.imminent.insert(i.id) {
                    self.incident_bundle(i.id, "imminent");
                }
            }
            Event::IncidentResolved(r) => {
                if self.ledger.incident_resolved(r) {
                    self.incident_bundle(r.id, "resolved");
                    if self.keep.is_some() {
                        // The daemon: written, so forgotten (its bundle has it all).
                        self.ledger.forget_incident(r.id);
                        self.imminent.remove(&r.id);
                    }
                }
            }
            Event::Summary(s) => {
                let name = format!("{}-run", self.run);
                self.note_written(&name);
                let b = self.ledger.run_bundle(now_rfc3339());
                self.send(Job::Bundle(name, Box::new(b)), "the run's bundle");
                let mut latency = latency_tables(s);
                // The summary's counters are the last word; a status's are older.
                let dropped = if s.dropped.is_empty() { &self.dropped } else { &s.dropped };
                if !dropped.is_empty() {
                    latency["dropped_by_probe"] = json!(dropped);
                }
                let dirs = self.written.iter().cloned().collect();
                self.send(Job::Latency(dirs, latency), "latency.json");
            }
            Event::Status(s) => self.dropped = s.dropped.clone(),
            Event::Ready(_) | Event::Target(_) | Event::Sweep(_) | Event::GoroutineScan(_) => {}
        }
    }
}

impl Drop for ReportSink {
    fn drop(&mut self) {
        // Closing the queue ends the worker once it has written what is queued.
        drop(self.tx.take());
        if let Some(w) = self.worker.take() {
            let _ = w.join();
        }
    }
}

/// `latency.json`: per probe family, from the run's summary. Go calls come
/// from HdrHistogram (3 significant digits); syscalls from the kernel's log2
/// histogram, so their quantiles are bucket upper bounds (`_le_s`), plus the
/// measured value (`_s`, HdrHistogram over the end records of the calls that
/// lasted `--warn`) for each quantile that falls among those calls.
pub fn latency_tables(s: &crate::events::Summary) -> Value {
    json!({
        "ran_s": s.ran_s,
        "families": [
            {
                "family": "syscall",
                "source": "kernel log2 histogram: each _le_s quantile is the upper bound of its bucket; _s values are measured (calls over --warn, from their end records)",
                "rows": s.syscalls.iter().map(|r| json!({
                    "name": r.syscall, "count": r.count,
                    "p50_le_s": r.p50_le_s, "p90_le_s": r.p90_le_s, "p99_le_s": r.p99_le_s,
                    "p99_9_le_s": r.p999_le_s, "max_le_s": r.max_le_s,
                    "measured": r.measured, "p50_s": r.p50_s, "p90_s": r.p90_s, "p99_s": r.p99_s, "max_s": r.max_s,
                })).collect::<Vec<_>>(),
            },
            {
                "family": "go_call",
                "source": "hdrhistogram, 3 significant digits, 1 µs to 1 h",
                "rows": s.go_latency.iter().map(|r| json!({
                    "name": format!("{} {}", r.target, r.function), "count": r.count,
                    "p50_s": r.p50_s, "p90_s": r.p90_s, "p99_s": r.p99_s,
                    "p99_9_s": r.p999_s, "max_s": r.max_s,
                })).collect::<Vec<_>>(),
            },
        ],
        "dropped_waits": s.dropped_waits,
        "dropped_events": s.dropped_events,
    })
}

/// Why a bundle file could not be written.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: cannot render: {1}")]
    Render(&'static str, String),
}

/// Renders and writes every file of `b` but `latency.json` into `dir`.
pub fn write_bundle(dir: &BundleDir, b: &Bundle) -> Result<(), WriteError> {
    let json = render::json(b).map_err(|e| WriteError::Render("incident.json", e.to_string()))?;
    let svg = render::svg(b).map_err(|e| WriteError::Render("blocked.svg", e.to_string()))?;
    let pprof = render::pprof_gz(b).map_err(|e| WriteError::Render("profile.pb.gz", e.to_string()))?;
    let folded = render::folded_text(b);
    // A graph the layout cannot draw costs the picture, not the bundle.
    let chain = render::chain(b).unwrap_or_else(|e| {
        tracing::warn!("report bundle {}: {e}; the bundle goes without it", dir.path().display());
        String::new()
    });
    let html = render::html_with(b, &chain, &svg, None);
    let mut files: Vec<(&str, &[u8])> = vec![
        ("incident.json", &json),
        ("blocked.folded", folded.as_bytes()),
        ("blocked.svg", &svg),
        ("profile.pb.gz", &pprof),
        ("index.html", html.as_bytes()),
    ];
    if !chain.is_empty() {
        files.push(("chain.svg", chain.as_bytes()));
    }
    for (name, body) in files {
        dir.write(name, body).map_err(|e| WriteError::Io(name.to_string(), e))?;
    }
    Ok(())
}

/// `index.html` of the bundle in `dir` again, now with `latency`.
fn rewrite_page(dir: &BundleDir, latency: &Value) -> Result<(), WriteError> {
    let text = dir.read("incident.json").map_err(|e| WriteError::Io("incident.json".into(), e))?;
    let b = parse(&dir.path().join("incident.json").display().to_string(), &String::from_utf8_lossy(&text))
        .map_err(|e| WriteError::Render("index.html", e.to_string()))?;
    let html = render::html(&b, Some(latency)).map_err(|e| WriteError::Render("index.html", e.to_string()))?;
    dir.write("index.html", html.as_bytes()).map_err(|e| WriteError::Io("index.html".into(), e))
}

/// `latency.json` beside a bundle's `incident.json`, if it is there and parses.
pub fn load_latency(path: &Path) -> Option<Value> {
    let dir = if path.is_dir() { path } else { path.parent()? };
    serde_json::from_slice(&std::fs::read(dir.join("latency.json")).ok()?).ok()
}

/// Why a bundle could not be read back.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: not a plegwatch bundle: {1}")]
    Json(String, String),
    #[error("{0}: format {1:?}, this plegwatch reads {2:?}")]
    Format(String, String, &'static str),
}

/// Reads a bundle from its directory (or its `incident.json`).
pub fn load(path: &Path) -> Result<Bundle, LoadError> {
    let is_json = path.extension().is_some_and(|e| e == "json");
    let file = if path.is_dir() || !is_json { path.join("incident.json") } else { path.to_path_buf() };
    let name = file.display().to_string();
    let text = std::fs::read_to_string(&file).map_err(|e| LoadError::Io(name.clone(), e))?;
    parse(&name, &text)
}

/// A bundle from its `incident.json` text (`name` names it in errors).
fn parse(name: &str, text: &str) -> Result<Bundle, LoadError> {
    let b: Bundle = serde_json::from_str(text).map_err(|e| LoadError::Json(name.to_string(), e.to_string()))?;
    if b.format != bundle::FORMAT {
        return Err(LoadError::Format(name.to_string(), b.format, bundle::FORMAT));
    }
    Ok(b)
}

#[cfg(test)]
mod tests;
