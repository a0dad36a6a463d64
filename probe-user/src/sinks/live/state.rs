//! What the live view shows, kept from the events alone: the open incidents
//! (the latest line of each, by id), the last few resolved, the probes and
//! Go targets, and the last log lines.
//!
//! Pure: the time is passed in and nothing here touches a terminal.
//! [`LiveState::render`] draws into any ratatui frame: the real terminal, or
//! a `TestBackend` in the tests below.

use crate::events::{Event, Ready, Summary};
use crate::graph::{
    incidents::{weakest, Incident, IncidentResolved},
    model::Hop,
};
use crate::levels::{Level, PLEG_BUDGET};
use ratatui::{
    layout::{Constraint, Layout},
    style::{Color, Modifier, Style},
    text::{Line, Span},
    widgets::Paragraph,
    Frame,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

/// How many resolved incidents the footer keeps.
pub const RESOLVED_SHOWN: usize = 5;
/// How many warnings and errors from plegwatch's log the footer keeps.
const LOGS_SHOWN: usize = 2;

/// Something received at `at`.
#[derive(Clone, Debug)]
struct Seen<T> {
    at: Instant,
    item: T,
}

/// The live view's model.
#[derive(Debug, Default)]
pub struct LiveState {
    ready: Option<Ready>,
    /// Go binaries with uprobes attached (`target` lines with status `probed`).
    targets: BTreeSet<String>,
    /// The latest `incident` line of each open incident, by id.
    open: BTreeMap<u64, Seen<Incident>>,
    /// The last [`RESOLVED_SHOWN`] `incident_resolved` lines, newest first.
    resolved: VecDeque<Seen<IncidentResolved>>,
    ended: u64,
    merged: u64,
    summary: Option<Summary>,
    logs: VecDeque<String>,
    /// Draw without colours (`--color never`, `NO_COLOR`): bold and the like stay.
    pub monochrome: bool,
}

impl LiveState {
    /// Takes in one event received at `now`.
    pub fn apply(&mut self, event: &Event, now: Instant) {
        match event {
            Event::Ready(r) => self.ready = Some(r.clone()),
            Event::Target(t) if matches!(t.status, "probed" | "partial") => {
                self.targets.insert(t.binary.clone());
            }
            Event::Target(t) if t.status == "retired" => {
                self.targets.remove(&t.binary);
            }
            Event::Incident(i) => {
                self.open.insert(i.id, Seen { at: now, item: (**i).clone() });
            }
            Event::IncidentResolved(r) => {
                self.open.remove(&r.id);
                match r.merged_into {
                    Some(_) => self.merged += 1,
                    None => self.ended += 1,
                }
                self.resolved.push_front(Seen { at: now, item: r.clone() });
                self.resolved.truncate(RESOLVED_SHOWN);
            }
            Event::Summary(s) => self.summary = Some(s.clone()),
            Event::Target(_) | Event::Sweep(_) | Event::GoroutineScan(_) | Event::Stall(_) | Event::Resolved(_) | Event::Status(_) => {}
        }
    }

    /// Takes in one line plegwatch logged (ANSI colours already stripped);
    /// only warnings and errors are shown.
    pub fn note_log(&mut self, line: &str) {
        if !is_warning(line) {
            return;
        }
        self.logs.push_back(line.to_string());
        while self.logs.len() > LOGS_SHOWN {
            self.logs.pop_front();
        }
    }

    /// Whether anything on screen ages by itself (an open incident's clock).
    pub fn ticking(&self) -> bool {
        !self.open.is_empty()
    }

    pub fn summary(&self) -> Option<&Summary> {
        self.summary.as_ref()
    }

    /// The open incidents as of `now` (their ages and budgets moved on by
    /// the time since their last line), the most budget used first.
    pub fn open_incidents(&self, now: Instant) -> Vec<Incident> {
        let mut out: Vec<Incident> = self.open.values().map(|s| aged(&s.item, now.saturating_duration_since(s.at))).collect();
        out.sort_by(|a, b| b.budget_used.total_cmp(&a.budget_used).then(a.id.cmp(&b.id)));
        out
    }

    /// Draws the whole screen.
    pub fn render(&self, frame: &mut Frame, now: Instant) {
        let area = frame.area();
        let footer = self.footer(now);
        let footer_h = (footer.len() as u16).min(area.height / 3);
        let [header, body, foot] = Layout::vertical([Constraint::Length(1), Constraint::Min(0), Constraint::Length(footer_h)]).areas(area);
        let paint = |lines: Vec<Line<'static>>| if self.monochrome { lines.into_iter().map(uncoloured).collect() } else { lines };
        frame.render_widget(Paragraph::new(paint(vec![self.header()])), header);
        frame.render_widget(Paragraph::new(paint(self.body(now, body.height as usize))), body);
        frame.render_widget(Paragraph::new(paint(footer)), foot);
    }

    fn probes(&self) -> (usize, usize) {
        let probes = self.ready.as_ref().map(|r| r.probes.as_slice()).unwrap_or_default();
        let off = probes.iter().filter(|p| p.variant == "off").count();
        (probes.len() - off, off)
    }

    fn header(&self) -> Line<'static> {
        let style = Style::default().add_modifier(Modifier::REVERSED);
        let Some(r) = &self.ready else {
            return Line::styled(" plegwatch · starting: loading and attaching the probes", style);
        };
        let (on, off) = self.probes();
        let mut text = format!(" plegwatch (pid {}) · {on} probes ready", r.pid);
        if off > 0 {
            text.push_str(&format!(" ({off} off)"));
        }
        text.push_str(&format!(
            " · {} Go targets probed · incidents: {} open, {} resolved",
            self.targets.len(),
            self.open.len(),
            self.ended
        ));
        if self.merged > 0 {
            text.push_str(&format!(", {} merged", self.merged));
        }
        text.push_str(&format!(" · warn {} · Ctrl-C to stop ", secs_text(r.warn_s)));
        Line::styled(text, style)
    }

    /// The open incidents, as many whole blocks as fit in `height` lines.
    fn body(&self, now: Instant, height: usize) -> Vec<Line<'static>> {
        let mut out = vec![Line::default()];
        if self.ready.is_none() {
            out.push(Line::raw("  starting: loading and attaching the probes…"));
            return out;
        }
        let incidents = self.open_incidents(now);
        if incidents.is_empty() {
            let (on, _) = self.probes();
            out.push(Line::raw(format!("  no incidents: watching {on} probes, {} Go targets", self.targets.len())));
            return out;
        }
        for (n, i) in incidents.iter().enumerate() {
            let block = incident_lines(i);
            let rest = incidents.len() - n;
            // Room for this block, its blank line, and a note if any come after.
            let needed = block.len() + 1 + usize::from(rest > 1);
            if out.len() + needed > height && n > 0 {
                out.push(Line::styled(
                    format!("  … {rest} more open incident(s) not shown: the terminal is too small"),
                    Style::default().add_modifier(Modifier::DIM),
                ));
                break;
            }
            out.extend(block);
            out.push(Line::default());
        }
        out
    }

    fn footer(&self, now: Instant) -> Vec<Line<'static>> {
        let mut out = Vec::new();
        if !self.resolved.is_empty() {
            out.push(Line::styled(" recently resolved", Style::default().add_modifier(Modifier::BOLD)));
        }
        for r in &self.resolved {
            let ago = ago_text(now.saturating_duration_since(r.at));
            let text = match r.item.merged_into {
                Some(into) => format!("  #{} merged into #{into} {ago} ago", r.item.id),
                None => {
                    let root = root_of(&r.item.longest_chain).map(|h| format!("; root was {}  [{}]", h.what, h.who())).unwrap_or_default();
                    format!("  #{} resolved {ago} ago, after {:.1}s{root}", r.item.id, r.item.waited_s)
                }
            };
            out.push(Line::raw(text));
        }
        for l in &self.logs {
            out.push(Line::styled(format!(" log: {l}"), Style::default().add_modifier(Modifier::DIM)));
        }
        out
    }
}

/// Whether a log line is a warning or an error: `TIME  WARN message` in
/// text, `"level":"WARN"` in JSON.
fn is_warning(line: &str) -> bool {
    let level = match line.trim_start().starts_with('{') {
        true => {
            serde_json::from_str::<serde_json::Value>(line).ok().and_then(|v| v.get("level").and_then(|l| l.as_str()).map(str::to_string))
        }
        false => line.split_whitespace().nth(1).map(str::to_string),
    };
    matches!(level.as_deref(), Some("WARN" | "ERROR"))
}

/// `i` as it stands `dt` after its line: its waits are that much older.
fn aged(i: &Incident, dt: Duration) -> Incident {
    let dt_s = dt.as_secs_f64();
    let mut i = i.clone();
    i.waited_s += dt_s;
    i.budget_used += dt_s / PLEG_BUDGET.as_secs_f64();
    for h in i.chain.iter_mut().chain(i.root.iter_mut()).chain(std::iter::once(&mut i.symptom)) {
        if let Some(w) = h.waited_s.as_mut() {
            *w += dt_s;
        }
    }
    i
}

/// A line with its colours taken out, its other modifiers kept.
fn uncoloured(mut line: Line<'static>) -> Line<'static> {
    line.style.fg = None;
    line.style.bg = None;
    for span in &mut line.spans {
        span.style.fg = None;
        span.style.bg = None;
    }
    line
}

fn level_style(level: Level) -> Style {
    match level {
        Level::Warn => Style::default().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        Level::Critical => Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        Level::Imminent => Style::default().fg(Color::White).bg(Color::Red).add_modifier(Modifier::BOLD),
    }
}

/// One incident: a line about it, then its chain, one hop a line, from the
/// symptom down to the root (and the root's terminal holder).
fn incident_lines(i: &Incident) -> Vec<Line<'static>> {
    let mut about = format!(
        " waited {:.1}s · PLEG budget {} used · since {} · {} wait(s)",
        i.waited_s,
        percent(i.budget_used),
        clock_of(&i.started_at),
        i.waits.len()
    );
    if let Some(x) = weakest(&i.chain) {
        about.push_str(&format!(" · weakest link {}", x.as_str()));
    }
    if i.cycle {
        about.push_str(" · DEADLOCK: the chain waits on itself");
    }
    let mut out = vec![Line::from(vec![
        Span::styled(format!(" #{} ", i.id), Style::default().add_modifier(Modifier::BOLD)),
        Span::styled(format!("{:<8}", i.level.as_str().to_uppercase()), level_style(i.level)),
        Span::raw(about),
    ])];
    let links: Vec<String> = i
        .chain
        .iter()
        .map(|h| match (h.edge, h.exactness) {
            (Some(e), Some(x)) => format!("↓ {} ({})", e.as_str(), x.as_str()),
            (Some(e), None) => format!("↓ {}", e.as_str()),
            _ => String::new(),
        })
        .collect();
    // As wide as this chain's links need, so a chain without any wastes no room.
    let link_w = links.iter().filter(|l| !l.is_empty()).map(|l| l.chars().count() + 2).max().unwrap_or(0);
    for ((n, h), link) in i.chain.iter().enumerate().zip(links) {
        let mark = if h.root {
            "ROOT"
        } else if h.wait_id.is_none() {
            "END"
        } else {
            ""
        };
        let age = h.waited_s.map(|w| format!("{w:.1}s")).unwrap_or_default();
        let text = format!("   {mark:<4} {:>2}. {:<14} {age:>7}  {link:<link_w$}{}  [{}]", n + 1, h.kind, h.what, h.who());
        let style = if h.root { Style::default().add_modifier(Modifier::BOLD) } else { Style::default() };
        out.push(Line::styled(text, style));
    }
    let others = i.waits.len().saturating_sub(i.chain.iter().filter(|h| h.wait_id.is_some()).count());
    if others > 0 {
        out.push(Line::styled(
            format!("            and {others} more wait(s) behind the same root"),
            Style::default().add_modifier(Modifier::DIM),
        ));
    }
    out
}

/// The root of a chain: the hop marked so, else its deepest wait.
fn root_of(chain: &[Hop]) -> Option<&Hop> {
    chain.iter().find(|h| h.root).or_else(|| chain.iter().rev().find(|h| h.wait_id.is_some()))
}

/// `HH:MM:SS UTC` of an RFC 3339 time, or the time as given.
fn clock_of(rfc3339: &str) -> String {
    match rfc3339.get(11..19) {
        Some(t) => format!("{t} UTC"),
        None => rfc3339.to_string(),
    }
}

/// `1.2%` below 10 %, `34%` above.
fn percent(share: f64) -> String {
    let p = share * 100.0;
    if p < 10.0 {
        format!("{p:.1}%")
    } else {
        format!("{p:.0}%")
    }
}

/// `2s`, `1.5s`.
fn secs_text(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{s:.0}s")
    } else {
        format!("{s}s")
    }
}

/// `4s`, `2m05s`, `1h02m`.
fn ago_text(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::events::{ProbeChoice, Target};
    use crate::graph::model::{EdgeKind, Exactness};
    use ratatui::{backend::TestBackend, Terminal};

    pub(crate) fn ready() -> Event {
        let probe = |p: &str, v: &str| ProbeChoice { probe: p.into(), variant: v.into(), ..Default::default() };
        let probes = vec![probe("syscalls", "tracepoint raw_syscalls"), probe("umount_tail_end", "fexit"), probe("offcpu", "off")];
        Event::Ready(Ready::new(4242, probes, 2.0, 60.0, 150.0))
    }

    fn target(binary: &str, status: &'static str) -> Event {
        Event::Target(Target::new("containerd", status, 7, std::path::Path::new(binary), "startup"))
    }

    fn hop(id: Option<u64>, kind: &str, what: &str, comm: &str, pid: u32, waited: Option<f64>, edge: Option<(EdgeKind, Exactness)>) -> Hop {
        Hop {
            pod: Default::default(),
            start: Default::default(),
            wait_id: id,
            kind: kind.into(),
            pid: Some(pid),
            tid: id.map(|_| pid),
            comm: Some(comm.into()),
            goroutine: None,
            what: what.into(),
            waited_s: waited,
            edge: edge.map(|e| e.0),
            evidence: edge.map(|_| "test".into()),
            exactness: edge.map(|e| e.1),
            root: false,
        }
    }

    /// relist → ListContainers → Status lock holder → umount (the root).
    pub(crate) fn incident_9770(id: u64, waited_s: f64) -> Incident {
        let mut root = hop(Some(4), "umount", "umount2 /run/k8s/rootfs (task_work)", "containerd-shim", 40, Some(waited_s), None);
        root.root = true;
        let chain = vec![
            hop(Some(1), "pleg_relist", "relist", "kubelet", 10, Some(waited_s - 5.0), Some((EdgeKind::CriCall, Exactness::Inferred))),
            hop(Some(2), "cri_call", "ListContainers", "containerd", 20, Some(waited_s - 4.0), Some((EdgeKind::GoLock, Exactness::Exact))),
            hop(
                Some(3),
                "go_lock",
                "UpdateSync holds Status lock",
                "containerd",
                20,
                Some(waited_s - 1.0),
                Some((EdgeKind::Ttrpc, Exactness::Exact)),
            ),
            root.clone(),
        ];
        Incident {
            level: Level::Warn,
            id,
            changed: vec![],
            root: Some(root),
            symptom: chain[0].clone(),
            chain,
            waits: vec![1, 2, 3, 4, 5],
            attached: Vec::new(),
            budget_used: waited_s / 180.0,
            started_at: "2026-11-22T02:45:01.123Z".into(),
            waited_s,
            cycle: false,
            started_before_attach: false,
        }
    }

    /// One sync wait held by a stopped process (a terminal).
    fn incident_sync(id: u64, waited_s: f64) -> Incident {
        let mut w = hop(Some(9), "sync", "fsync fd 3", "etcd", 90, Some(waited_s), Some((EdgeKind::Child, Exactness::Exact)));
        w.root = true;
        let end = hop(None, "process", "stopped (state T)", "runc", 91, None, None);
        Incident {
            level: Level::Critical,
            id,
            changed: vec![],
            root: Some(w.clone()),
            symptom: w.clone(),
            chain: vec![w, end],
            waits: vec![9],
            attached: Vec::new(),
            budget_used: waited_s / 180.0,
            started_at: "2026-11-22T02:44:00.000Z".into(),
            waited_s,
            cycle: false,
            started_before_attach: false,
        }
    }

    fn resolved(id: u64, merged_into: Option<u64>) -> Event {
        Event::IncidentResolved(IncidentResolved { id, waited_s: 12.5, longest_chain: incident_9770(id, 12.0).chain, merged_into })
    }

    /// The screen as text, one string a row, trailing blanks cut.
    pub(crate) fn screen(state: &LiveState, now: Instant, w: u16, h: u16) -> Vec<String> {
        let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
        t.draw(|f| state.render(f, now)).unwrap();
        let buf = t.backend().buffer().clone();
        (0..h).map(|y| (0..w).map(|x| buf[(x, y)].symbol().to_string()).collect::<String>().trim_end().to_string()).collect()
    }

    /// `--color never` / `NO_COLOR`: the same screen, and not one coloured cell.
    #[test]
    fn monochrome_draws_no_colour() {
        use ratatui::style::Color;
        let t0 = Instant::now();
        let coloured = |monochrome: bool| {
            let mut s = LiveState { monochrome, ..Default::default() };
            s.apply(&ready(), t0);
            s.apply(&Event::Incident(Box::new(incident_9770(1, 100.0))), t0);
            let mut t = Terminal::new(TestBackend::new(120, 30)).unwrap();
            t.draw(|f| s.render(f, t0)).unwrap();
            let buf = t.backend().buffer().clone();
            let n = buf.content().iter().filter(|c| c.fg != Color::Reset || c.bg != Color::Reset).count();
            (n, screen(&s, t0, 120, 30))
        };
        let (with, rows) = coloured(false);
        let (without, plain_rows) = coloured(true);
        assert!(with > 0, "the level is coloured by default");
        assert_eq!(without, 0, "a coloured cell with monochrome");
        assert_eq!(rows, plain_rows);
    }

    fn find<'a>(rows: &'a [String], needle: &str) -> Option<(usize, &'a String)> {
        rows.iter().enumerate().find(|(_, r)| r.contains(needle))
    }

    #[test]
    fn before_ready_and_the_quiet_first_screen() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        let rows = screen(&s, t0, 100, 12);
        assert!(rows[0].contains("starting"), "{rows:#?}");
        s.apply(&target("/usr/bin/containerd", "probed"), t0);
        s.apply(&target("/usr/bin/containerd", "probed"), t0);
        s.apply(&target("/usr/bin/runc", "unmatched"), t0);
        s.apply(&ready(), t0);
        let rows = screen(&s, t0, 140, 12);
        assert!(find(&rows, "no incidents: watching 2 probes, 1 Go targets").is_some(), "{rows:#?}");
        let head = &rows[0];
        for want in ["pid 4242", "2 probes ready (1 off)", "1 Go targets probed", "incidents: 0 open, 0 resolved", "warn 2s"] {
            assert!(head.contains(want), "{want:?} not in the header {head:?}");
        }
        assert!(!rows.iter().any(|r| r.contains("recently resolved")));
    }

    #[test]
    fn an_incident_shows_its_chain_one_hop_a_line_with_the_root_marked() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        s.apply(&ready(), t0);
        s.apply(&Event::Incident(Box::new(incident_9770(3, 20.0))), t0);
        let rows = screen(&s, t0 + Duration::from_millis(1500), 160, 20);
        let (at, head) = find(&rows, "#3 WARN").expect("the incident's line");
        assert!(head.contains("waited 21.5s") && head.contains("PLEG budget 12% used"), "aged by 1.5 s: {head}");
        assert!(head.contains("since 02:45:01 UTC") && head.contains("5 wait(s)") && head.contains("weakest link inferred"), "{head}");
        let chain = &rows[at + 1..at + 5];
        let expect = [
            ("pleg_relist", "↓ cri_call (inferred)", "relist"),
            ("cri_call", "↓ go_lock (exact)", "ListContainers"),
            ("go_lock", "↓ ttrpc (exact)", "UpdateSync holds Status lock"),
            ("umount", "", "umount2 /run/k8s/rootfs (task_work)  [containerd-shim pid=40]"),
        ];
        for (row, (kind, link, what)) in chain.iter().zip(expect) {
            assert!(row.contains(kind) && row.contains(link) && row.contains(what), "{row:?} lacks {kind}, {link}, {what}");
        }
        assert!(chain[3].trim_start().starts_with("ROOT"), "the root is marked: {:?}", chain[3]);
        assert!(chain.iter().take(3).all(|r| !r.contains("ROOT")));
        assert!(chain[3].contains("21.5s") && chain[0].contains("16.5s"), "hop ages move on too: {chain:#?}");
        assert!(rows[at + 5].contains("and 1 more wait(s) behind the same root"), "{rows:#?}");
        assert!(rows[0].contains("incidents: 1 open, 0 resolved"));
        assert!(find(&rows, "no incidents").is_none());
    }

    #[test]
    fn incidents_are_sorted_by_budget_used_and_updates_replace_them() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        s.apply(&ready(), t0);
        s.apply(&Event::Incident(Box::new(incident_9770(1, 10.0))), t0);
        s.apply(&Event::Incident(Box::new(incident_sync(2, 70.0))), t0);
        let rows = screen(&s, t0, 160, 30);
        let first = find(&rows, "#2 CRITICAL").map(|(n, _)| n);
        let second = find(&rows, "#1 WARN").map(|(n, _)| n);
        assert!(first < second && second.is_some(), "70 s before 10 s: {rows:#?}");
        let (at, _) = find(&rows, "#2 CRITICAL").unwrap();
        assert!(rows[at + 1].contains("↓ child (exact)") && rows[at + 1].trim_start().starts_with("ROOT"));
        assert!(rows[at + 2].trim_start().starts_with("END") && rows[at + 2].contains("stopped (state T)"), "{rows:#?}");
        // #1 escalates past #2: its new line replaces the old one.
        let mut later = incident_9770(1, 100.0);
        later.level = Level::Critical;
        later.changed = vec!["level"];
        s.apply(&Event::Incident(Box::new(later)), t0);
        let rows = screen(&s, t0, 160, 30);
        assert!(find(&rows, "#1 CRITICAL").map(|(n, _)| n) < find(&rows, "#2 CRITICAL").map(|(n, _)| n), "{rows:#?}");
        assert_eq!(rows.iter().filter(|r| r.contains("#1 ")).count(), 1);
        assert_eq!(s.open_incidents(t0).iter().map(|i| i.id).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn resolved_incidents_leave_for_the_footer() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        s.apply(&ready(), t0);
        s.apply(&Event::Incident(Box::new(incident_9770(1, 10.0))), t0);
        s.apply(&Event::Incident(Box::new(incident_sync(2, 70.0))), t0);
        s.apply(&resolved(1, None), t0 + Duration::from_secs(2));
        let rows = screen(&s, t0 + Duration::from_secs(5), 160, 30);
        assert!(find(&rows, "#1 WARN").is_none(), "{rows:#?}");
        let (foot, _) = find(&rows, "recently resolved").expect("a footer");
        let (n, line) = find(&rows, "#1 resolved").expect("#1 in the footer");
        assert!(n > foot && find(&rows, "#2 CRITICAL").is_some_and(|(m, _)| m < foot));
        assert!(line.contains("3s ago, after 12.5s; root was umount2 /run/k8s/rootfs (task_work)  [containerd-shim pid=40]"), "{line}");
        assert!(rows[0].contains("incidents: 1 open, 1 resolved"), "{}", rows[0]);
        s.apply(&resolved(2, Some(7)), t0);
        let rows = screen(&s, t0, 160, 30);
        assert!(find(&rows, "#2 merged into #7").is_some() && rows[0].contains("0 open, 1 resolved, 1 merged"), "{rows:#?}");
        assert!(find(&rows, "no incidents: watching").is_some());
        for id in 10..20 {
            s.apply(&resolved(id, None), t0);
        }
        let rows = screen(&s, t0, 160, 40);
        assert_eq!(rows.iter().filter(|r| r.contains(" resolved 0s ago")).count(), RESOLVED_SHOWN, "{rows:#?}");
        assert!(find(&rows, "#19 resolved").is_some() && find(&rows, "#14 resolved").is_none());
    }

    #[test]
    fn a_small_terminal_shows_whole_incidents_and_says_how_many_are_left_out() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        s.apply(&ready(), t0);
        for id in 1..=5 {
            s.apply(&Event::Incident(Box::new(incident_9770(id, 10.0 * id as f64))), t0);
        }
        let rows = screen(&s, t0, 120, 17);
        // The header, a blank line, 6 + 1 lines an incident: two and the note fit in 17.
        assert!(find(&rows, "#5 WARN").is_some() && find(&rows, "#4 WARN").is_some(), "{rows:#?}");
        assert!(find(&rows, "#3 WARN").is_none());
        assert!(find(&rows, "3 more open incident(s) not shown").is_some(), "{rows:#?}");
        // Too small for even one: the first is cut, not left out.
        let rows = screen(&s, t0, 120, 4);
        assert!(find(&rows, "#5 WARN").is_some(), "{rows:#?}");
    }

    #[test]
    fn the_last_log_lines_show_in_the_footer() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        s.apply(&ready(), t0);
        for l in [
            "2026-11-22T02:45:01.1Z  WARN one",
            "2026-11-22T02:45:01.2Z  INFO startup sweep: not shown",
            "",
            r#"{"timestamp":"2026-11-22T02:45:01.3Z","level":"ERROR","fields":{"message":"two"}}"#,
            "2026-11-22T02:45:01.4Z  WARN three",
            "2026-11-22T02:45:01.5Z  INFO not shown either",
        ] {
            s.note_log(l);
        }
        let rows = screen(&s, t0, 120, 12);
        assert!(find(&rows, "\"message\":\"two\"").is_some() && find(&rows, "WARN three").is_some(), "{rows:#?}");
        assert!(find(&rows, "one").is_none() && find(&rows, "not shown").is_none(), "{rows:#?}");
    }

    #[test]
    fn ages_move_on_between_lines() {
        let t0 = Instant::now();
        let mut s = LiveState::default();
        s.apply(&Event::Incident(Box::new(incident_9770(1, 18.0))), t0);
        let i = &s.open_incidents(t0 + Duration::from_secs(18))[0];
        assert!((i.waited_s - 36.0).abs() < 1e-9 && (i.budget_used - 0.2).abs() < 1e-9);
        assert_eq!(i.root.as_ref().and_then(|r| r.waited_s), Some(36.0));
        assert_eq!(i.chain[0].waited_s, Some(31.0));
        assert!(s.ticking());
        assert_eq!(ago_text(Duration::from_secs(125)), "2m05s");
        assert_eq!(ago_text(Duration::from_secs(3720)), "1h02m");
        assert_eq!(secs_text(2.0), "2s");
        assert_eq!(secs_text(0.5), "0.5s");
        assert_eq!((percent(0.012), percent(0.34)), ("1.2%".to_string(), "34%".to_string()));
    }
}
