//! `chain.svg`: an incident's wait-for graph as a picture, laid out by
//! `layout-rs` (a Rust port of dot's ranked layout that writes SVG itself),
//! so no Graphviz is needed at run time.
//!
//! One box per hop, the symptom at the top and each hop above the one it
//! waits on: its kind, who waits (comm, pid, tid, goroutine), what it waits
//! in (wrapped, cut at [`WHAT_LINES`] lines) and for how long. The root is
//! red and says `ROOT`; the terminal holder below it (a device, a stopped
//! process) is grey. Each edge is labelled with its kind and exactness, and
//! drawn solid (exact), dashed (inferred) or dotted (heuristic). Waits that
//! a heuristic link attaches to the chain hang off to the side, dotted, on
//! the hop they are attached to (the root). A run bundle draws every
//! incident side by side, each under a header box.
//!
//! What layout-rs does not do is added around it: it draws dotted lines as
//! dashed, so each edge's group carries a class and a small `<style>` sets
//! the dots; its text uses Times, overridden for a sans-serif. Its node text
//! and edge labels are XML-escaped by the crate; the classes we pass are
//! fixed strings. The crate asserts on graphs it cannot handle, so the layout
//! runs under `catch_unwind`: a panic becomes an error for this one file.

use super::bundle::{Bundle, HopRecord, IncidentRecord};
use layout::adt::dag::NodeHandle;
use layout::backends::svg::SVGWriter;
use layout::core::base::Orientation;
use layout::core::color::Color;
use layout::core::geometry::Point;
use layout::core::style::{LineStyleKind, StyleAttr};
use layout::std_shapes::shapes::{Arrow, Element, LineEndKind, ShapeKind};
use layout::topo::layout::VisualGraph;

/// Characters per line of a box's `what`.
pub const WRAP: usize = 44;
/// Lines of `what` at most; the last one is cut with `…`.
pub const WHAT_LINES: usize = 3;
const FONT: usize = 13;
const EDGE_FONT: usize = 11;

/// CSS added to layout-rs's output: dotted heuristic edges, a sans-serif.
const STYLE: &str = "<style>\
.pw-heuristic path { stroke-dasharray: 2 4; }\
text { font-family: 'DejaVu Sans', Arial, Helvetica, sans-serif !important; }\
</style>\n";

/// Why the picture could not be drawn.
#[derive(Debug, thiserror::Error)]
#[error("chain.svg: the layout failed: {0}")]
pub struct LayoutError(String);

/// `chain.svg` of a bundle: see the module doc.
pub fn svg(b: &Bundle) -> Result<String, LayoutError> {
    let incidents = b.incidents.clone();
    let drawn = std::panic::catch_unwind(move || draw(&incidents));
    match drawn {
        Ok(svg) => Ok(svg),
        Err(p) => {
            let why = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
            Err(LayoutError(why.unwrap_or_else(|| "a panic in layout-rs".into())))
        }
    }
}

fn draw(incidents: &[IncidentRecord]) -> String {
    let mut g = VisualGraph::new(Orientation::TopToBottom);
    if incidents.is_empty() {
        node(&mut g, "no incident in this bundle", Look::Header);
    }
    for i in incidents {
        incident(&mut g, i);
    }
    let mut w = SVGWriter::new();
    g.do_it(false, false, false, &mut w);
    let out = w.finalize();
    // Our style goes right after the root element's start tag.
    match out.find("<svg").and_then(|s| out[s..].find('>').map(|e| s + e + 1)) {
        Some(at) => format!("{}\n{STYLE}{}\n", &out[..at], &out[at..]),
        None => out,
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Look {
    Header,
    Symptom,
    Hop,
    Root,
    Terminal,
    Attached,
}

fn look(l: Look) -> StyleAttr {
    let (line, width, fill) = match l {
        Look::Header => ("#444444", 1, "#f4f4f4"),
        Look::Symptom => ("#1f4e99", 2, "#dde8f8"),
        Look::Hop => ("#333333", 1, "#ffffff"),
        Look::Root => ("#b00020", 3, "#fbd3d3"),
        Look::Terminal => ("#666666", 1, "#e6e6e6"),
        Look::Attached => ("#8a6d00", 1, "#fff6d5"),
    };
    let color = |hex: &str| Color::fast(hex);
    StyleAttr::new(color(line), width, Some(color(fill)), 4, FONT)
}

/// A box sized for its text (layout-rs sizes boxes as given).
fn node(g: &mut VisualGraph, text: &str, l: Look) -> NodeHandle {
    let lines = text.lines().count().max(1) as f64;
    let cols = text.lines().map(|l| l.chars().count()).max().unwrap_or(1) as f64;
    let size = Point::new(cols * FONT as f64 * 0.62 + 24.0, (lines + 1.0) * FONT as f64 + 12.0);
    g.add_node(Element::create(ShapeKind::new_box(text), look(l), Orientation::TopToBottom, size))
}

fn edge(g: &mut VisualGraph, from: NodeHandle, to: NodeHandle, label: &str, exactness: Option<&str>) {
    let style = match exactness {
        Some("exact") | None => LineStyleKind::Normal,
        Some("inferred") => LineStyleKind::Dashed,
        Some(_) => LineStyleKind::Dotted,
    };
    let class = match exactness {
        Some("exact") | None => "pw-exact",
        Some("inferred") => "pw-inferred",
        Some(_) => "pw-heuristic",
    };
    let mut attr = StyleAttr::simple();
    attr.font_size = EDGE_FONT;
    attr.line_width = 2;
    attr.line_color = Color::new(0x444444ff);
    let arrow =
        Arrow::with_properties(LineEndKind::None, LineEndKind::Arrow, style, label, &attr, format!("class=\"{class}\""), &None, &None);
    g.add_edge(arrow, from, to);
}

fn incident(g: &mut VisualGraph, i: &IncidentRecord) {
    let head = format!(
        "incident #{} {} ({})\nwaited {:.1}s, PLEG budget {:.0}%{}",
        i.id,
        i.level.to_uppercase(),
        i.state,
        i.waited_s,
        i.budget_used * 100.0,
        if i.cycle { ", a cycle" } else { "" }
    );
    let header = node(g, &head, Look::Header);
    let mut prev: Option<(NodeHandle, &HopRecord)> = None;
    let mut root = None;
    for (n, h) in i.chain.iter().enumerate() {
        let l = if h.root {
            Look::Root
        } else if h.wait_id.is_none() {
            Look::Terminal
        } else if n == 0 {
            Look::Symptom
        } else {
            Look::Hop
        };
        let this = node(g, &label(h, l), l);
        if h.root {
            root = Some(this);
        }
        match prev {
            None => g.add_edge(Arrow::invisible(), header, this),
            Some((p, ph)) => edge(g, p, this, &edge_label(ph), ph.exactness.as_deref()),
        }
        prev = Some((this, h));
    }
    // Attached waiters: off to the side, dotted, on the root (the last hop
    // when there is no root, e.g. a cycle).
    let anchor = root.or(prev.map(|(p, _)| p)).unwrap_or(header);
    for h in &i.attached {
        let this = node(g, &label(h, Look::Attached), Look::Attached);
        edge(g, this, anchor, &edge_label(h), Some(h.exactness.as_deref().unwrap_or("heuristic")));
    }
}

fn edge_label(h: &HopRecord) -> String {
    match (&h.edge, &h.exactness) {
        (Some(e), Some(x)) => format!("{e}\n({x})"),
        (Some(e), None) => e.clone(),
        (None, _) => String::new(),
    }
}

/// The hop's who, as `comm pid=… tid=… g=…`.
pub fn who(h: &HopRecord) -> String {
    crate::graph::model::who_text(h.comm.as_deref(), h.pid, h.tid, h.goroutine.as_deref())
}

fn label(h: &HopRecord, l: Look) -> String {
    let mark = match l {
        Look::Root => "ROOT: ",
        Look::Symptom => "SYMPTOM: ",
        Look::Attached => "ATTACHED: ",
        _ => "",
    };
    let mut lines = vec![format!("{mark}{}", h.kind)];
    if h.comm.is_some() || h.pid.is_some() {
        lines.push(who(h));
    }
    lines.extend(wrap(&h.what, WRAP, WHAT_LINES));
    if let Some(s) = h.waited_s {
        lines.push(format!("waited {s:.1}s"));
    }
    lines.join("\n")
}

/// `text` in lines of at most `width` characters (broken at spaces, `/`,
/// `.` or `,` when one is near, else anywhere), at most `max` lines, the
/// last cut with `…`. Control characters become spaces.
pub fn wrap(text: &str, width: usize, max: usize) -> Vec<String> {
    let clean: Vec<char> = text.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let mut out = Vec::new();
    let mut rest: &[char] = &clean;
    while !rest.is_empty() && out.len() < max {
        if rest.len() <= width {
            out.push(rest.iter().collect::<String>().trim().to_string());
            rest = &[];
            break;
        }
        let window = &rest[..width];
        let cut = window
            .iter()
            .rposition(|c| matches!(c, ' ' | '/' | '.' | ',' | '('))
            .filter(|&p| p >= width / 2)
            .map(|p| p + 1)
            .unwrap_or(width);
        out.push(rest[..cut].iter().collect::<String>().trim().to_string());
        rest = &rest[cut..];
    }
    if !rest.is_empty() {
        if let Some(last) = out.last_mut() {
            let mut s: String = last.chars().take(width.saturating_sub(1)).collect();
            s.push('…');
            *last = s;
        }
    }
    out.retain(|l| !l.is_empty());
    out
}
