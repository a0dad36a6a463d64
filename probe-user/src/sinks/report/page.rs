//! `index.html`: one self-contained page to attach to a post-mortem. It
//! fetches nothing (no CDN, no font, no script of its own; CSS inline):
//! - each incident's summary line and its chain as a list;
//! - `chain.svg` inline;
//! - the timeline of the waits (inline SVG, see [`timeline`]): a bar per
//!   wait, coloured by the level it had reached, a tick where it ended;
//! - `blocked.svg` in an `<object>` from a `data:` URL, so inferno's own
//!   script (zoom, search) runs in its own document, as in the file;
//! - the latency tables and drop counts of `latency.json` (written at exit:
//!   the sink then renders the page again with them).
//!
//! Written with `maud`: its `html!` escapes every value by construction,
//! which `format!` would leave to care; only our two SVGs go in unescaped
//! (`PreEscaped`), and layout-rs escapes the text inside the chain's.

use super::bundle::{Bundle, HopRecord, IncidentRecord};
use super::chain_svg::who;
use super::timeline::{self, Timeline};
use base64::Engine as _;
use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;

const CSS: &str = "
body { font-family: 'DejaVu Sans', Arial, Helvetica, sans-serif; margin: 24px; color: #1d1d1d; max-width: 1320px; }
h1 { font-size: 22px; margin-bottom: 4px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ccc; }
.meta { color: #555; font-size: 13px; }
.summary { font-size: 15px; padding: 8px 12px; background: #f6f6f6; border-left: 4px solid #999; }
.lvl-warn { border-color: #d4a400; } .lvl-critical { border-color: #e07b00; } .lvl-imminent { border-color: #b00020; }
ol.chain { font-size: 14px; } ol.chain li { margin: 4px 0; }
ol.chain .kind { font-weight: bold; } ol.chain .root { color: #b00020; font-weight: bold; }
ol.chain .edge { color: #555; font-size: 12px; display: block; margin-left: 16px; }
code { font-family: 'DejaVu Sans Mono', monospace; font-size: 13px; }
.figure { overflow-x: auto; border: 1px solid #ddd; padding: 8px; }
table { border-collapse: collapse; font-size: 13px; margin: 8px 0 16px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; } th { background: #eee; }
td.name { text-align: left; font-family: 'DejaVu Sans Mono', monospace; }
.legend span { display: inline-block; padding: 1px 8px; margin-right: 6px; font-size: 12px; }
object.flame { width: 100%; min-height: 420px; border: 0; }
";

/// Level colours on the timeline (before `warn`: grey).
fn level_colour(level: &str) -> &'static str {
    match level {
        "warn" => "#f2c94c",
        "critical" => "#f2994a",
        "imminent" => "#d93b3b",
        _ => "#b8b8b8",
    }
}

/// The page; `chain_svg` and `blocked_svg` are the bundle's two pictures.
pub fn html(b: &Bundle, chain_svg: &str, blocked_svg: &[u8], latency: Option<&Value>) -> String {
    let title = match b.incidents.as_slice() {
        [one] if b.scope == "incident" => format!("plegwatch incident #{}", one.id),
        _ => format!("plegwatch run: {} incident(s)", b.incidents.len()),
    };
    // Inline: from the root element on (no XML declaration inside HTML).
    let chain_inline = chain_svg.find("<svg").map(|i| &chain_svg[i..]).unwrap_or("");
    let flame = base64::engine::general_purpose::STANDARD.encode(blocked_svg);
    let tl = timeline::of(b);
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                title { (title) }
                style { (PreEscaped(CSS)) }
            }
            body {
                h1 { (title) }
                p.meta { "written " (b.written_at) " (" (b.reason) "), by plegwatch " (env!("CARGO_PKG_VERSION")) }
                @for i in &b.incidents { (incident(i)) }
                h2 { "Wait-for graph" }
                div.figure #chain { (PreEscaped(chain_inline)) }
                h2 { "Timeline of the waits" }
                (timeline_svg(&tl))
                h2 { "Blocked time (flamegraph)" }
                p.meta { "bottom: the symptom; up: each hop to the root, then the waiting thread's kernel stack. Click to zoom." }
                object.flame #flamegraph type="image/svg+xml" data={ "data:image/svg+xml;base64," (flame) } { "blocked.svg" }
                h2 { "Latency and drops" }
                (latency_tables(latency))
            }
        }
    };
    page.into_string()
}

fn incident(i: &IncidentRecord) -> Markup {
    let root = i.chain.iter().find(|h| h.root);
    html! {
        h2 { "Incident #" (i.id) }
        p class={ "summary lvl-" (i.level) } #{ "summary-" (i.id) } {
            b { (i.level.to_uppercase()) } " (" (i.state) ") · PLEG budget " (format!("{:.0}%", i.budget_used * 100.0))
            " used · waited " (format!("{:.1}s", i.waited_s)) " · started " (i.started_at)
            @if i.cycle { " · a cycle (deadlock)" }
            br;
            "root: "
            @match root {
                Some(h) => { b { (h.kind) } " " (h.what) " (" (who(h)) ")" }
                None => { "none (the chain closes on itself or ends at a holder)" }
            }
        }
        ol.chain {
            @for h in &i.chain { (hop(h)) }
        }
        @if !i.attached.is_empty() {
            p { "Attached by a heuristic link (off the chain):" }
            ul.chain { @for h in &i.attached { (hop(h)) } }
        }
    }
}

fn hop(h: &HopRecord) -> Markup {
    html! {
        li {
            @if h.root { span.root { "ROOT " } }
            span.kind { (h.kind) } " "
            code { (h.what) }
            @if h.comm.is_some() || h.pid.is_some() { " · " (who(h)) }
            @if let Some(s) = h.waited_s { " · " (format!("{s:.1}s")) }
            @if let Some(e) = &h.edge {
                span.edge { "↓ " (e) " (" (h.exactness.as_deref().unwrap_or("?")) ")" @if let Some(ev) = &h.evidence { ": " (ev) } }
            }
        }
    }
}

const TL_WIDTH: f64 = 1280.0;
const TL_LABEL: f64 = 380.0;
const TL_ROW: f64 = 24.0;
const TL_TOP: f64 = 30.0;

fn timeline_svg(tl: &Timeline) -> Markup {
    let span = if tl.span_s > 0.0 { tl.span_s } else { 1.0 };
    let plot = TL_WIDTH - TL_LABEL - 20.0;
    let x = |s: f64| TL_LABEL + s.max(0.0) / span * plot;
    let height = TL_TOP + TL_ROW * tl.rows.len() as f64 + 20.0;
    let step = timeline::tick_step(span);
    let ticks: Vec<f64> = (0..).map(|n| n as f64 * step).take_while(|t| *t <= span + 1e-9).collect();
    html! {
        p.meta.legend {
            "time zero: " (tl.origin.as_deref().unwrap_or("unknown")) " · "
            span style={ "background:" (level_colour("")) } { "open" }
            span style={ "background:" (level_colour("warn")) } { "warn" }
            span style={ "background:" (level_colour("critical")) } { "critical" }
            span style={ "background:" (level_colour("imminent")) } { "imminent" }
            "▏ended · dashed outline: still open when written"
        }
        div.figure {
            svg #timeline width=(TL_WIDTH) height=(height) viewBox={ "0 0 " (TL_WIDTH) " " (height) } font-size="12" {
                @for t in &ticks {
                    line x1=(x(*t)) x2=(x(*t)) y1=(TL_TOP - 6.0) y2=(height - 16.0) stroke="#e4e4e4" {}
                    text x=(x(*t)) y=(TL_TOP - 10.0) text-anchor="middle" fill="#555" { (format!("{t:.1}s")) }
                }
                @for m in &tl.incident_marks {
                    line x1=(x(m.at_s)) x2=(x(m.at_s)) y1=(TL_TOP - 4.0) y2=(height - 16.0) stroke=(level_colour(&m.level)) stroke-width="2" stroke-dasharray="4 3" {
                        title { "incident #" (m.incident) " " (m.level) " at " (format!("{:.2}s", m.at_s)) }
                    }
                }
                @for (n, r) in tl.rows.iter().enumerate() {
                    @let y = TL_TOP + TL_ROW * n as f64;
                    g.tl-row data-wait=(r.wait_id) {
                        text x=(TL_LABEL - 8.0) y=(y + 15.0) text-anchor="end" {
                            (r.kind) " · " (r.who) " · #" (r.wait_id)
                        }
                        @for (from, to, level) in segments(r) {
                            rect x=(x(from)) y=(y + 4.0) width=((x(to) - x(from)).max(1.0)) height=(TL_ROW - 8.0) fill=(level_colour(&level)) {
                                title { (r.kind) " " (r.who) ": " (if level.is_empty() { "below warn" } else { level.as_str() }) " from " (format!("{from:.2}s")) " to " (format!("{to:.2}s")) }
                            }
                        }
                        @if r.ended {
                            line x1=(x(r.end_s)) x2=(x(r.end_s)) y1=(y + 1.0) y2=(y + TL_ROW - 1.0) stroke="#000" stroke-width="2" {}
                        } @else {
                            rect x=(x(r.start_s)) y=(y + 4.0) width=((x(r.end_s) - x(r.start_s)).max(1.0)) height=(TL_ROW - 8.0) fill="none" stroke="#555" stroke-dasharray="3 2" {}
                        }
                    }
                }
            }
        }
    }
}

/// A row's bar, cut where its level changed: (from, to, level).
fn segments(r: &timeline::Row) -> Vec<(f64, f64, String)> {
    let mut marks: Vec<(String, f64)> = r.marks.iter().filter(|(_, t)| *t < r.end_s).cloned().collect();
    marks.sort_by(|a, b| a.1.total_cmp(&b.1));
    let mut out = Vec::new();
    let mut from = r.start_s;
    let mut level = String::new();
    for (l, t) in marks {
        if t > from {
            out.push((from, t, level.clone()));
            from = t;
        }
        level = l;
    }
    out.push((from, r.end_s.max(from), level));
    out
}

fn num(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if v.is_u64() || v.is_i64() => format!("{f:.0}"),
        Some(f) if f < 1e-3 => format!("{:.1} µs", f * 1e6),
        Some(f) if f < 1.0 => format!("{:.2} ms", f * 1e3),
        Some(f) => format!("{f:.3} s"),
        None => "–".into(),
    }
}

fn latency_tables(latency: Option<&Value>) -> Markup {
    let Some(l) = latency else {
        return html! { p.meta { "latency.json is written when plegwatch exits; this page was written before that. `plegwatch report DIR --format html` renders it again with the tables." } };
    };
    const QS: [(&str, &str); 5] = [("p50", "p50"), ("p90", "p90"), ("p99", "p99"), ("p99_9", "p99.9"), ("max", "max")];
    let families = l["families"].as_array().cloned().unwrap_or_default();
    let by_probe = l["dropped_by_probe"].as_array().cloned().unwrap_or_default();
    html! {
        p.meta { "over " (num(&l["ran_s"])) " of watching" }
        @for f in &families {
            h3 { (f["family"].as_str().unwrap_or("?")) }
            p.meta { (f["source"].as_str().unwrap_or("")) }
            table {
                tr { th { "name" } th { "count" } @for (_, q) in QS { th { (q) } } }
                @for r in f["rows"].as_array().into_iter().flatten() {
                    tr {
                        td.name { (r["name"].as_str().unwrap_or("?")) }
                        td { (num(&r["count"])) }
                        @for (k, _) in QS {
                            // A measured value where there is one, else the bucket bound, marked.
                            @let exact = &r[format!("{k}_s")];
                            td { @if !exact.is_null() { (num(exact)) } @else { "≤ " (num(&r[format!("{k}_le_s")])) } }
                        }
                    }
                }
            }
        }
        h3 { "Drops" }
        table #drops {
            tr { th { "what" } th { "count" } }
            tr { td.name { "waits the kernel could not record (in-flight map full)" } td { (num(&l["dropped_waits"])) } }
            tr { td.name { "end records the kernel could not send (ring buffer full)" } td { (num(&l["dropped_events"])) } }
            @for d in &by_probe {
                tr { td.name { (d["probe"].as_str().unwrap_or("?")) ": " (d["reason"].as_str().unwrap_or("?")) } td { (num(&d["count"])) } }
            }
        }
    }
}
