//! Each file of a bundle, rendered from its [`Bundle`] alone: what the
//! report sink writes and what `plegwatch report` re-renders.

use super::bundle::{folded, Bundle};
use super::{chain_svg, page, pprof};
use inferno::flamegraph::{self, color, Options};
use serde_json::Value;
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// `blocked.folded`: `frame;frame;… blocked_ns`, symptom first.
pub fn folded_text(b: &Bundle) -> String {
    folded(&b.samples)
}

/// `blocked.svg`: the interactive flamegraph (inferno), time in milliseconds.
pub fn svg(b: &Bundle) -> std::io::Result<Vec<u8>> {
    let folded = folded(&b.samples);
    let mut opts = Options::default();
    opts.title = match b.incidents.as_slice() {
        [one] if b.scope == "incident" => format!("plegwatch incident #{}: blocked time", one.id),
        _ => "plegwatch run: blocked time by incident chain".to_string(),
    };
    opts.subtitle = Some("bottom: the symptom; up: each hop to the root, then the waiting thread's kernel stack".into());
    opts.count_name = "ms blocked".into();
    opts.factor = 1e-6;
    opts.colors = color::Palette::Basic(color::BasicPalette::Io);
    let mut out = Vec::new();
    if folded.is_empty() {
        // inferno refuses an empty profile; a bundle with no blocked time still gets a picture.
        flamegraph::from_lines(&mut opts, ["(no blocked time recorded) 1"], &mut out)?;
    } else {
        flamegraph::from_lines(&mut opts, folded.lines(), &mut out)?;
    }
    Ok(out)
}

/// `profile.pb.gz`.
pub fn pprof_gz(b: &Bundle) -> std::io::Result<Vec<u8>> {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
    let duration = b.incidents.iter().map(|i| (i.waited_s * 1e9) as i64).max().unwrap_or(0);
    let ids: Vec<String> = b.incidents.iter().map(|i| format!("#{}", i.id)).collect();
    let comment = format!("plegwatch {} bundle: blocked time of incident(s) {}", b.scope, ids.join(", "));
    pprof::encode_gz(&pprof::profile(&b.samples, now, duration, &comment))
}

/// `chain.svg`: the incidents' wait-for graphs (see [`chain_svg`]).
pub fn chain(b: &Bundle) -> Result<String, chain_svg::LayoutError> {
    chain_svg::svg(b)
}

/// `index.html` (see [`page`]), from the two pictures already rendered and
/// `latency.json` when there is one.
pub fn html_with(b: &Bundle, chain: &str, blocked: &[u8], latency: Option<&Value>) -> String {
    page::html(b, chain, blocked, latency)
}

/// `index.html`, rendering both pictures.
pub fn html(b: &Bundle, latency: Option<&Value>) -> std::io::Result<String> {
    let chain = chain(b).map_err(std::io::Error::other)?;
    let blocked = svg(b)?;
    Ok(html_with(b, &chain, &blocked, latency))
}

/// `incident.json`, pretty-printed.
pub fn json(b: &Bundle) -> serde_json::Result<Vec<u8>> {
    let mut v = serde_json::to_vec_pretty(b)?;
    v.push(b'\n');
    Ok(v)
}

/// The bundle in words: each incident's chain, then the blocked time by wait.
pub fn text(b: &Bundle) -> String {
    let mut out = String::new();
    let total: u64 = b.samples.iter().map(|s| s.blocked_ns).sum();
    let _ = writeln!(
        out,
        "plegwatch {} bundle ({}), written {}: {} incident(s), {:.3}s blocked in all",
        b.scope,
        b.reason,
        b.written_at,
        b.incidents.len(),
        total as f64 / 1e9
    );
    for i in &b.incidents {
        let _ = writeln!(
            out,
            "\nincident #{} {} ({}), since {}, oldest wait {:.3}s, PLEG budget {:.1}% used{}",
            i.id,
            i.level.to_uppercase(),
            i.state,
            i.started_at,
            i.waited_s,
            i.budget_used * 100.0,
            if i.cycle { ", a cycle (deadlock)" } else { "" }
        );
        for (n, h) in i.chain.iter().enumerate() {
            let mark = if h.root {
                "ROOT"
            } else if h.wait_id.is_none() {
                " END"
            } else {
                "    "
            };
            let waited = h.waited_s.map(|s| format!("{s:.1}s")).unwrap_or_default();
            let who = match (h.comm.as_deref(), h.pid) {
                (Some(c), Some(p)) => {
                    format!("  [{c} pid={p}{}]", h.tid.filter(|t| Some(*t) != h.pid).map(|t| format!(" tid={t}")).unwrap_or_default())
                }
                _ => String::new(),
            };
            let _ = writeln!(out, "  {mark} {}. {:<16} {waited:>7}  {}{who}", n + 1, h.kind, h.what);
            if let (Some(e), Some(x)) = (&h.edge, &h.exactness) {
                let _ = writeln!(out, "           -> {e} ({x}): {}", h.evidence.as_deref().unwrap_or(""));
            }
        }
        for h in &i.attached {
            let _ = writeln!(out, "  attached {} {} {}", h.kind, h.what, h.evidence.as_deref().unwrap_or(""));
        }
        let _ = writeln!(out, "  blocked time by wait:");
        for s in b.samples.iter().filter(|s| s.labels.get("incident").map(String::as_str) == Some(i.id.to_string().as_str())) {
            let top = s.stack.last().map(String::as_str).unwrap_or("");
            let wait = s.labels.get("wait").map(String::as_str).unwrap_or("?");
            let kind = s.labels.get("kind").map(String::as_str).unwrap_or("?");
            let _ = writeln!(out, "    wait {wait:<4} {kind:<16} {:>10.3}s  top frame: {top}", s.blocked_ns as f64 / 1e9);
        }
    }
    out
}
