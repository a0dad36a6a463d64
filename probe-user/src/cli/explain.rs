//! `plegwatch explain ID --from FILE`: one incident, for the person reading
//! the log the next morning. It reads a `watch --json` log (the last
//! `incident` line with that id, and its `incident_resolved` line if any) or a
//! report bundle (`incident.json`), and prints the incident as `watch` prints
//! it (the text sink's own block), with each link of the chain in words.

use crate::durations::human_secs;
use crate::graph::incidents::Incident;
use crate::sinks::{incident_text, report, TextOptions};
use clap::Args;
use serde_json::Value;
use std::path::{Path, PathBuf};

/// Print one incident, hop by hop in words.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  plegwatch watch --json > plegwatch.jsonl        (later, on another terminal or the next morning:)
  plegwatch explain 3 --from plegwatch.jsonl
  plegwatch explain '#2' --from /var/lib/plegwatch/reports/20261123T230015Z-pid1097-incident-2")]
pub struct ExplainArgs {
    /// The incident's id: the `id` of its JSON lines, `#N` in text output.
    #[arg(value_parser = incident_id)]
    pub id: u64,
    /// A `watch --json` log (one JSON object a line), or a report bundle
    /// (its directory or its incident.json).
    #[arg(long, value_name = "FILE|BUNDLE_DIR")]
    pub from: PathBuf,
}

/// `3` or `#3`.
fn incident_id(s: &str) -> Result<u64, String> {
    s.trim().trim_start_matches('#').parse::<u64>().map_err(|_| format!("{s:?} is not an incident id (a number, as in `incident #3`)"))
}

/// The incident as found, and how it ended, if it did.
#[derive(Debug)]
pub struct Found {
    pub incident: Incident,
    /// Seconds from its oldest wait's start to its end, when it resolved.
    pub resolved_after_s: Option<f64>,
    /// The incident it joined, when it did not end but merged.
    pub merged_into: Option<u64>,
}

/// Finds incident `id` in a JSON log or a bundle; the error is one line.
pub fn find(from: &Path, id: u64) -> Result<Found, String> {
    let is_bundle = from.is_dir() || from.file_name().is_some_and(|n| n == "incident.json");
    if is_bundle {
        return from_bundle(from, id);
    }
    let body = std::fs::read_to_string(from).map_err(|e| format!("{}: {e}", from.display()))?;
    // A bundle's incident.json under another name: one JSON document with its format.
    if let Ok(b) = serde_json::from_str::<report::bundle::Bundle>(&body) {
        return bundle_incident(&b, id, from);
    }
    from_log(&body, id, from)
}

fn from_bundle(from: &Path, id: u64) -> Result<Found, String> {
    let b = report::load(from).map_err(|e| format!("{e:#}").replace('\n', " "))?;
    bundle_incident(&b, id, from)
}

fn bundle_incident(b: &report::bundle::Bundle, id: u64, from: &Path) -> Result<Found, String> {
    let Some(rec) = b.incidents.iter().find(|i| i.id == id) else {
        let ids: Vec<String> = b.incidents.iter().map(|i| i.id.to_string()).collect();
        return Err(format!("incident #{id} is not in the bundle {} (it holds: {})", from.display(), or_none(&ids)));
    };
    // The bundle's hops are the JSON lines' hops; the root and the symptom are among them.
    let root = rec.chain.iter().find(|h| h.root).cloned();
    let v = serde_json::json!({
        "level": rec.level,
        "id": rec.id,
        "root": root,
        "symptom": rec.chain.first(),
        "chain": rec.chain,
        "attached": rec.attached,
        "waits": rec.waits,
        "budget_used": rec.budget_used,
        "started_at": rec.started_at,
        "waited_s": rec.waited_s,
        "cycle": rec.cycle,
    });
    let incident: Incident = serde_json::from_value(v).map_err(|e| format!("{}: incident #{id} unreadable: {e}", from.display()))?;
    Ok(Found { incident, resolved_after_s: (rec.state == "resolved").then_some(rec.waited_s), merged_into: None })
}

fn from_log(body: &str, id: u64, from: &Path) -> Result<Found, String> {
    let mut last: Option<Value> = None;
    let mut resolved: Option<Value> = None;
    let (mut parsed, mut ids) = (0usize, std::collections::BTreeSet::new());
    for line in body.lines().map(str::trim).filter(|l| l.starts_with('{')) {
        let Ok(v) = serde_json::from_str::<Value>(line) else { continue };
        parsed += 1;
        let kind = v.get("type").and_then(Value::as_str);
        let this = v.get("id").and_then(Value::as_u64);
        if kind == Some("incident") {
            ids.extend(this);
        }
        match (kind, this == Some(id)) {
            (Some("incident"), true) => last = Some(v),
            (Some("incident_resolved"), true) => resolved = Some(v),
            _ => {}
        }
    }
    if parsed == 0 {
        return Err(format!("{}: not a `watch --json` log (no JSON lines) nor a report bundle", from.display()));
    }
    let Some(v) = last else {
        let ids: Vec<String> = ids.iter().map(u64::to_string).collect();
        return Err(format!("incident #{id} is not in {} (incidents there: {})", from.display(), or_none(&ids)));
    };
    let incident: Incident =
        serde_json::from_value(v).map_err(|e| format!("{}: incident #{id}'s last line unreadable: {e}", from.display()))?;
    let merged_into = resolved.as_ref().and_then(|r| r.get("merged_into")).and_then(Value::as_u64);
    let resolved_after_s = resolved.filter(|_| merged_into.is_none()).and_then(|r| r.get("waited_s").and_then(Value::as_f64));
    Ok(Found { incident, resolved_after_s, merged_into })
}

fn or_none(ids: &[String]) -> String {
    if ids.is_empty() {
        "none".into()
    } else {
        ids.join(", ")
    }
}

/// The explanation: the incident as `watch` prints it, each link in words,
/// and how it ended.
pub fn render(found: &Found, opts: &TextOptions) -> String {
    let i = &found.incident;
    let clock = i.started_at.get(11..23).unwrap_or(&i.started_at);
    let mut out = format!("incident #{} began at {} (its oldest wait's start); its last report:\n", i.id, i.started_at);
    out.push_str(&incident_text(clock, i, opts, true));
    out.push_str(
        "\nROOT marks the deepest open wait, where the cause sits; END, what holds the root when that is not a wait. \
         Ages are as of the last report. The PLEG budget is kubelet's 3 minutes: at 100% the node goes NotReady.",
    );
    match (found.resolved_after_s, found.merged_into) {
        (_, Some(into)) => out.push_str(&format!("\nIt did not end on its own: it joined incident #{into} (explain that one too).")),
        (Some(s), None) => out.push_str(&format!("\nIt resolved after {}: its last wait ended.", human_secs(s))),
        (None, None) => out.push_str("\nIt had not resolved when this log ends."),
    }
    out
}

/// Runs `explain`; a bad id or file is a usage error (exit 2).
pub fn run(args: ExplainArgs, opts: TextOptions) -> anyhow::Result<()> {
    let found = find(&args.from, args.id).map_err(super::UsageError)?;
    println!("{}", render(&found, &opts));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::Event;
    use crate::events::Sink as _;
    use crate::graph::incidents::IncidentResolved;
    use crate::sinks::JsonSink;

    /// A JSON log as `watch --json` writes it, from the live view's 9770 incident:
    /// a ready line, two updates of incident 4 (the last deeper), another
    /// incident, and incident 4's end.
    fn log() -> String {
        let mut buf = Vec::new();
        let mut sink = JsonSink(&mut buf);
        sink.emit(&crate::sinks::live::state::tests::ready());
        let mut first = crate::sinks::live::state::tests::incident_9770(4, 3.0);
        first.chain.truncate(2);
        sink.emit(&Event::Incident(Box::new(first)));
        sink.emit(&Event::Incident(Box::new(crate::sinks::live::state::tests::incident_9770(5, 2.0))));
        sink.emit(&Event::Incident(Box::new(crate::sinks::live::state::tests::incident_9770(4, 12.5))));
        let last = crate::sinks::live::state::tests::incident_9770(4, 12.5);
        sink.emit(&Event::IncidentResolved(IncidentResolved { id: 4, waited_s: 14.25, longest_chain: last.chain, merged_into: None }));
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn the_last_update_of_the_id_is_explained_hop_by_hop_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watch.jsonl");
        std::fs::write(&path, log()).unwrap();
        let found = find(&path, 4).unwrap();
        assert_eq!(
            found.incident.chain.len(),
            crate::sinks::live::state::tests::incident_9770(4, 1.0).chain.len(),
            "the last update, not the first"
        );
        assert_eq!(found.resolved_after_s, Some(14.25));
        let text = render(&found, &TextOptions::default());
        for h in &found.incident.chain {
            assert!(text.contains(&h.what), "hop {} missing:\n{text}", h.what);
            if let Some(e) = h.edge {
                assert!(text.contains(e.meaning()), "link {e:?} not in words:\n{text}");
            }
        }
        assert!(text.contains("incident #4") && text.contains("ROOT") && text.contains("resolved after 14.2s"), "{text}");
        assert!(!text.contains("{\""), "JSON in text:\n{text}");
        assert!(!text.contains('\u{1b}'), "colour without asking:\n{text}");
    }

    #[test]
    fn a_bundle_gives_the_same_chain() {
        let mut ledger = crate::sinks::report::bundle::Ledger::default();
        let i = crate::sinks::live::state::tests::incident_9770(7, 9.0);
        ledger.incident(&i);
        let b = ledger.bundle_of(7, "imminent", "2026-11-22T02:45:10Z".into()).unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("incident.json"), serde_json::to_vec(&b).unwrap()).unwrap();
        let found = find(dir.path(), 7).unwrap();
        assert_eq!(found.incident.chain.iter().map(|h| &h.what).collect::<Vec<_>>(), i.chain.iter().map(|h| &h.what).collect::<Vec<_>>());
        assert_eq!(found.incident.root.as_ref().map(|r| &r.what), i.root.as_ref().map(|r| &r.what));
        let text = render(&found, &TextOptions::default());
        assert!(text.contains("not resolved") && !text.contains("{\""), "{text}");
    }

    #[test]
    fn a_bad_id_or_file_is_one_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("watch.jsonl");
        std::fs::write(&path, log()).unwrap();
        let e = find(&path, 99).unwrap_err();
        assert!(e.contains("#99") && e.contains("incidents there: 4, 5") && !e.contains('\n'), "{e}");
        let junk = dir.path().join("junk.txt");
        std::fs::write(&junk, "hello\nworld\n").unwrap();
        let e = find(&junk, 1).unwrap_err();
        assert!(e.contains("not a `watch --json` log") && !e.contains('\n'), "{e}");
        let e = find(&dir.path().join("missing.jsonl"), 1).unwrap_err();
        assert!(e.contains("missing.jsonl") && !e.contains('\n'), "{e}");
        let e = find(&dir.path().join("nobundle/incident.json"), 1).unwrap_err();
        assert!(e.contains("incident.json") && !e.contains('\n'), "{e}");
        assert!(incident_id("#3") == Ok(3) && incident_id("x").is_err());
    }
}
