use super::bundle::{folded, folded_total, Ledger};
use super::*;
use crate::events::{Event, Resolved, Stall, Summary};
use crate::graph::incidents::{Incident, IncidentResolved};
use crate::graph::model::{EdgeKind, Exactness, Hop};
use crate::levels::Level;
use crate::syscalls::WaitKind;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

const UMOUNT_STACK: [&str; 4] = ["folio_wait_bit", "sync_filesystem", "cleanup_mnt", "entry_SYSCALL_64_after_hwframe"];

fn hop(id: Option<u64>, kind: &str, pid: u32, what: &str, waited: Option<f64>, edge: Option<EdgeKind>, root: bool) -> Hop {
    Hop {
        pod: Default::default(),
        start: Default::default(),
        wait_id: id,
        kind: kind.into(),
        pid: Some(pid),
        tid: Some(pid + 1),
        comm: Some(format!("c{pid}")),
        goroutine: None,
        what: what.into(),
        waited_s: waited,
        edge,
        evidence: edge.map(|_| "seen; really".to_string()),
        exactness: edge.map(|_| Exactness::Exact),
        root,
    }
}

/// relist (wait 7) → ListContainers (wait 8) → umount (wait 1, the root) → the loop device.
fn chain(waited: f64) -> Vec<Hop> {
    vec![
        hop(Some(7), "pleg_relist", 10, "pleg.(*GenericPLEG).Relist", Some(waited - 0.5), Some(EdgeKind::CriCall), false),
        hop(Some(8), "cri_call", 20, "server.(*criService).ListContainers", Some(waited - 0.5), Some(EdgeKind::SameGoroutine), false),
        hop(Some(1), "umount", 30, "umount2 /mnt (task_work after the syscall returned)", Some(waited), Some(EdgeKind::Device), true),
        Hop {
            wait_id: None,
            kind: "device".into(),
            pid: None,
            tid: None,
            comm: None,
            goroutine: None,
            what: "block device 7:0 (loop0)".into(),
            waited_s: None,
            edge: None,
            evidence: None,
            exactness: None,
            root: false,
            pod: Default::default(),
            start: Default::default(),
        },
    ]
}

fn incident(level: Level, waited: f64) -> Incident {
    let c = chain(waited);
    Incident {
        level,
        id: 3,
        changed: vec![],
        root: Some(c[2].clone()),
        symptom: c[0].clone(),
        chain: c,
        waits: vec![1, 7, 8, 9],
        attached: Vec::new(),
        budget_used: waited / 180.0,
        started_at: "2026-11-23T03:00:00.000Z".into(),
        waited_s: waited,
        cycle: false,
        started_before_attach: false,
    }
}

fn stall(id: u64, kind: WaitKind, pid: u32, waited: f64, stack: &[&str]) -> Stall {
    Stall {
        pod: Default::default(),
        level: Level::Warn,
        id,
        kind,
        pid,
        tid: pid + 1,
        comm: format!("c{pid}"),
        waited_s: waited,
        started_at: "2026-11-23T03:00:00.000Z".into(),
        budget_used: 0.0,
        started_before_attach: false,
        detail: serde_json::json!({}),
        holder: None,
        cause: None,
        chain: vec![],
        wait: None,
        kernel_stack: stack.iter().map(|s| s.to_string()).collect(),
        user_stack: vec![],
        user_stack_id: -1,
    }
}

fn resolved(id: u64, waited: f64) -> Resolved {
    Resolved { id, kind: WaitKind::Umount, pid: 30, tid: 31, waited_s: waited, comm: "c30".into(), timing: "exact" }
}

/// The events of one incident: raised at 2 s, updated at 6 s, imminent, ended at 8 s.
fn events() -> Vec<Event> {
    vec![
        Event::Stall(Box::new(stall(1, WaitKind::Umount, 30, 2.0, &UMOUNT_STACK))),
        Event::Incident(Box::new(incident(Level::Warn, 2.0))),
        // Wait 9 has a stall line but sits off the chain, behind the same root.
        Event::Stall(Box::new(stall(9, WaitKind::Sync, 40, 2.5, &["wait_on_page", "do_fsync"]))),
        Event::Incident(Box::new(incident(Level::Imminent, 6.0))),
        Event::Resolved(resolved(1, 8.0)),
        Event::IncidentResolved(IncidentResolved { id: 3, waited_s: 8.1, longest_chain: chain(6.0), merged_into: None }),
    ]
}

fn ledger() -> Ledger {
    let mut l = Ledger::default();
    for e in events() {
        match &e {
            Event::Stall(s) => l.stall(s),
            Event::Resolved(r) => l.resolved(r),
            Event::Incident(i) => l.incident(i),
            Event::IncidentResolved(r) => {
                assert!(l.incident_resolved(r));
            }
            _ => {}
        }
    }
    l
}

#[test]
fn blocked_time_folds_from_the_symptom_up_to_the_kernel_stack() {
    let b = ledger().bundle_of(3, "resolved", "now".into()).expect("raised");
    let f = folded(&b.samples);
    eprintln!("{f}");
    let lines: Vec<&str> = f.lines().collect();
    assert_eq!(lines.len(), 4, "{f}");
    let relist = "pleg_relist c10: pleg.(*GenericPLEG).Relist";
    let list = "cri_call c20: server.(*criService).ListContainers";
    let umount = "umount c30: umount2 /mnt (task_work after the syscall returned)";
    // The symptom alone, at its last seen age (5.5 s).
    assert!(lines.contains(&format!("{relist} 5500000000").as_str()), "{f}");
    assert!(lines.contains(&format!("{relist};{list} 5500000000").as_str()), "{f}");
    // The root on the whole chain, then its kernel stack outermost first; its end record's 8 s.
    let root = format!(
        "{relist};{list};{umount};entry_SYSCALL_64_after_hwframe_[k];cleanup_mnt_[k];sync_filesystem_[k];folio_wait_bit_[k] 8000000000"
    );
    assert!(lines.contains(&root.as_str()), "{f}");
    // The wait behind the same root, off the chain, on a frame of its own.
    assert!(lines.iter().any(|l| l.starts_with("sync c40: behind the same root") && l.ends_with(";wait_on_page_[k] 2500000000")), "{f}");
    assert_eq!(folded_total(&f), 5_500_000_000 * 2 + 8_000_000_000 + 2_500_000_000);
    // The terminal holder is not a wait: no sample of its own, and the device is named in the chain.
    assert!(!f.contains("loop0"), "{f}");
    assert_eq!(b.incidents[0].state, "resolved");
    assert_eq!(b.incidents[0].level, "imminent");
    assert_eq!(b.incidents[0].chain.last().map(|h| h.kind.as_str()), Some("device"));
}

#[test]
fn frames_never_carry_the_separator() {
    let mut i = incident(Level::Warn, 3.0);
    i.chain[0].what = "a;b\nc".repeat(100);
    let mut l = Ledger::default();
    l.incident(&i);
    let b = l.bundle_of(3, "imminent", "now".into()).unwrap();
    for s in &b.samples {
        for f in &s.stack {
            assert!(!f.contains(';') && !f.contains('\n') && f.chars().count() <= bundle::FRAME_MAX, "{f:?}");
        }
    }
}

#[test]
fn a_merged_incident_gets_no_bundle() {
    let mut l = Ledger::default();
    l.incident(&incident(Level::Warn, 3.0));
    assert!(!l.incident_resolved(&IncidentResolved { id: 3, waited_s: 3.0, longest_chain: vec![], merged_into: Some(1) }));
    assert!(l.bundle_of(3, "resolved", "now".into()).is_none());
    assert!(l.run_bundle("now".into()).incidents.is_empty());
}

/// Every `<`, `>` and `&` is balanced: quick-xml reads the whole SVG without an error.
fn assert_well_formed(svg: &[u8]) {
    let mut r = quick_xml::Reader::from_reader(svg);
    let mut buf = Vec::new();
    let mut depth = 0i64;
    let mut elements = 0;
    loop {
        match r.read_event_into(&mut buf) {
            Ok(quick_xml::events::Event::Start(_)) => {
                depth += 1;
                elements += 1;
            }
            Ok(quick_xml::events::Event::End(_)) => depth -= 1,
            Ok(quick_xml::events::Event::Empty(_)) => elements += 1,
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!("blocked.svg is not well-formed XML at byte {}: {e}", r.buffer_position()),
        }
        buf.clear();
    }
    assert_eq!(depth, 0, "unbalanced elements");
    assert!(elements > 10, "too few elements: {elements}");
}

#[test]
fn the_flamegraph_is_well_formed_and_names_the_hops() {
    let b = ledger().bundle_of(3, "resolved", "now".into()).unwrap();
    let svg = render::svg(&b).unwrap();
    assert_well_formed(&svg);
    let text = String::from_utf8(svg).unwrap();
    for hop in [
        "pleg_relist c10: pleg.(*GenericPLEG).Relist",
        "cri_call c20: server.(*criService).ListContainers",
        "umount c30: umount2 /mnt",
        "folio_wait_bit (",
    ] {
        assert!(text.contains(hop), "the SVG does not name {hop}");
    }
    // Kernel frames keep their `_[k]` mark for the palette, and inferno shows them without it.
    for hop in ["entry_SYSCALL_64_after_hwframe (", "sync_filesystem ("] {
        assert!(text.contains(hop), "the SVG does not name {hop}");
    }
    assert!(text.contains("plegwatch incident #3"));
    // An empty run still gets a well-formed picture.
    assert_well_formed(&render::svg(&Ledger::default().run_bundle("now".into())).unwrap());
}

/// The values of `go tool pprof -raw`'s `Samples:` section, summed.
fn pprof_raw_total(path: &Path) -> Option<u64> {
    let out = match std::process::Command::new("go").args(["tool", "pprof", "-raw"]).arg(path).env("HOME", std::env::temp_dir()).output() {
        Ok(o) => o,
        Err(e) => {
            assert!(std::env::var_os("CI").is_none(), "`go` (Debian's golang-go, for `go tool pprof`) is missing under CI: {e}");
            eprintln!("skipped: `go` is not installed ({e}), so `go tool pprof` cannot read the profile back");
            return None;
        }
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "go tool pprof -raw failed: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    eprintln!("{stdout}");
    let section = stdout.split("Samples:").nth(1).expect("a Samples: section");
    let section = section.split("Locations").next().unwrap_or(section);
    let mut total = 0;
    for line in section.lines() {
        let Some((v, _)) = line.trim_start().split_once(':') else { continue };
        if let Ok(v) = v.trim().parse::<u64>() {
            total += v;
        }
    }
    Some(total)
}

#[test]
fn pprof_totals_read_back_by_go_tool_pprof_equal_the_folded_totals() {
    let b = ledger().bundle_of(3, "resolved", "now".into()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    write_bundle(&safe_dir::BundleDir::open_path(dir.path()).unwrap(), &b).unwrap();
    let folded = std::fs::read_to_string(dir.path().join("blocked.folded")).unwrap();
    let Some(total) = pprof_raw_total(&dir.path().join("profile.pb.gz")) else { return };
    assert_eq!(total, folded_total(&folded));
    assert_eq!(total, 21_500_000_000);
}

#[test]
fn the_sink_writes_bundles_with_private_modes_and_they_read_back() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("reports");
    let mut sink = ReportSink::new(&dir).unwrap();
    for e in events() {
        sink.emit(&e);
    }
    sink.emit(&Event::Summary(Summary::default()));
    drop(sink);
    let mut bundles: Vec<PathBuf> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    bundles.sort();
    let names: Vec<String> = bundles.iter().map(|p| p.file_name().unwrap().to_string_lossy().into_owned()).collect();
    assert_eq!(names.len(), 2, "{names:?}");
    assert!(names[0].ends_with("-incident-3") && names[1].ends_with("-run"), "{names:?}");
    assert_eq!(std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777, 0o700);
    for b in &bundles {
        assert_eq!(std::fs::metadata(b).unwrap().permissions().mode() & 0o777, 0o700, "{}", b.display());
        for f in FILES {
            let m = std::fs::metadata(b.join(f)).unwrap_or_else(|e| panic!("{}/{f}: {e}", b.display()));
            assert_eq!(m.permissions().mode() & 0o777, 0o600, "{}/{f}", b.display());
            assert!(m.len() > 0, "{}/{f} is empty", b.display());
        }
        let back = load(b).unwrap();
        // The re-rendered folded file is the written one.
        assert_eq!(render::folded_text(&back), std::fs::read_to_string(b.join("blocked.folded")).unwrap());
    }
    // The incident bundle was rewritten when it resolved: it has the end record's 8 s.
    let inc = load(&bundles[0]).unwrap();
    assert_eq!((inc.reason.as_str(), inc.incidents[0].state.as_str()), ("resolved", "resolved"));
    let latency: serde_json::Value = serde_json::from_slice(&std::fs::read(bundles[0].join("latency.json")).unwrap()).unwrap();
    assert_eq!(latency["families"][0]["family"], "syscall");
    // index.html was rendered again at exit, with the latency tables and drops.
    let page = std::fs::read_to_string(bundles[0].join("index.html")).unwrap();
    assert!(page.contains("id=\"drops\"") && page.contains("Incident #3") && page.contains("id=\"timeline\""), "{page}");
    let text = render::text(&inc);
    assert!(text.contains("ROOT 3. umount") && text.contains("END 4. device"), "{text}");
    // The root hop shows its end record's 8 s, not its age at the last incident line.
    assert_eq!(inc.incidents[0].chain[2].waited_s, Some(8.0));
    assert!(!std::fs::read_dir(&bundles[0]).unwrap().any(|e| e.unwrap().file_name().to_string_lossy().ends_with(".tmp")));
}

#[test]
fn an_uncreatable_report_dir_is_refused_at_start_in_one_line() {
    let root = tempfile::tempdir().unwrap();
    let file = root.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    // A directory under a regular file cannot be made, even by root.
    let e = ReportSink::new(&file.join("reports")).err().expect("refused");
    assert!(e.contains("a-file/reports") && e.contains("cannot create it") && !e.contains('\n'), "{e}");
    assert_eq!(std::fs::read(&file).unwrap(), b"x");
}

#[test]
fn bad_bundles_are_refused_in_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let e = load(&dir.path().join("nothing")).unwrap_err().to_string();
    assert!(e.contains("nothing") && !e.contains('\n'), "{e}");
    std::fs::write(dir.path().join("incident.json"), "{\"format\": 1}").unwrap();
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("not a plegwatch bundle") && !e.contains('\n'), "{e}");
    let mut b = ledger().run_bundle("now".into());
    b.format = "plegwatch-bundle/99".into();
    std::fs::write(dir.path().join("incident.json"), serde_json::to_string(&b).unwrap()).unwrap();
    let e = load(dir.path()).unwrap_err().to_string();
    assert!(e.contains("plegwatch-bundle/99") && !e.contains('\n'), "{e}");
}

/// The text of every `<text>` element of an SVG (its tspans joined by newlines).
fn svg_texts(doc: &roxmltree::Document) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| {
            n.descendants()
                .filter(|d| d.has_tag_name("tspan") || d.has_tag_name("textPath"))
                .filter_map(|d| d.text())
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect()
}

const HOSTILE: &str = "</text><script>alert(1)</script> & \"q\" 'x' ";

/// The test incident, with an inferred middle edge, a hostile and long `what`, and a waiter
/// attached by a heuristic link.
fn rich_bundle() -> super::bundle::Bundle {
    let mut i = incident(Level::Imminent, 6.0);
    i.chain[1].exactness = Some(Exactness::Inferred);
    i.chain[1].goroutine = Some(0x2a);
    i.chain[2].what = format!("{HOSTILE}umount2 /run/containerd/io.containerd.runtime.v2.task/k8s.io/{}/rootfs", "f".repeat(64));
    let mut attached =
        hop(Some(9), "go_lock", 50, "store.(*Store).Get (parked beside UpdateSync)", Some(2.5), Some(EdgeKind::SameGoroutine), false);
    attached.exactness = Some(Exactness::Heuristic);
    i.attached = vec![attached];
    let mut l = Ledger::default();
    l.stall(&stall(1, WaitKind::Umount, 30, 2.0, &UMOUNT_STACK));
    l.incident(&i);
    l.bundle_of(3, "imminent", "now".into()).unwrap()
}

#[test]
fn the_chain_svg_parses_names_every_hop_and_marks_the_root() {
    let b = rich_bundle();
    let svg = render::chain(&b).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("chain.svg is not XML: {e}\n{svg}"));
    assert!(doc.root_element().has_tag_name("svg"));
    assert!(!doc.descendants().any(|n| n.has_tag_name("script")), "the hostile what became markup:\n{svg}");
    let texts = svg_texts(&doc);
    let all = texts.join("\n");
    eprintln!("{all}");
    let i = &b.incidents[0];
    for h in i.chain.iter().chain(&i.attached) {
        let first_line = super::chain_svg::wrap(&h.what, super::chain_svg::WRAP, 1).remove(0);
        let first_line = first_line.trim_end_matches('…');
        let node = texts.iter().find(|t| t.contains(first_line)).unwrap_or_else(|| panic!("no box names {:?}:\n{all}", h.what));
        assert!(node.contains(&h.kind), "{node}");
        if let Some(c) = &h.comm {
            assert!(node.contains(&format!("{c} pid={}", h.pid.unwrap())), "{node}");
        }
        if let Some(s) = h.waited_s {
            assert!(node.contains(&format!("waited {s:.1}s")), "{node}");
        }
    }
    // The goroutine, the root, the symptom, the side waiter; edges named with exactness.
    assert!(
        all.contains("g=0x2a") && all.contains("ROOT: umount") && all.contains("SYMPTOM: pleg_relist") && all.contains("ATTACHED: go_lock"),
        "{all}"
    );
    assert!(all.contains("cri_call\n(exact)") && all.contains("same_goroutine\n(inferred)") && all.contains("device\n(exact)"), "{all}");
    assert!(all.contains(HOSTILE.trim()), "the hostile text is shown as text: {all}");
    // Long whats are cut: no line over the wrap width.
    assert!(texts.iter().flat_map(|t| t.lines()).all(|l| l.chars().count() <= super::chain_svg::WRAP + "ATTACHED: ".len() + 30), "{all}");
    assert!(all.contains('…'), "the 64-character path was cut: {all}");
    // The root is red; exact solid, inferred dashed, heuristic dotted (by class).
    assert!(doc.descendants().any(|n| n.attribute("fill") == Some("#fbd3d3ff")), "no red box");
    let class_of = |c: &str| doc.descendants().filter(|n| n.attribute("class") == Some(c)).count();
    assert_eq!((class_of("pw-exact"), class_of("pw-inferred"), class_of("pw-heuristic")), (2, 1, 1), "{svg}");
    assert!(svg.contains(".pw-heuristic path { stroke-dasharray: 2 4; }"));
}

#[test]
fn a_run_bundle_draws_every_incident_side_by_side() {
    let mut l = Ledger::default();
    l.incident(&incident(Level::Warn, 3.0));
    let mut other = incident(Level::Critical, 4.0);
    other.id = 4;
    l.incident(&other);
    let svg = render::chain(&l.run_bundle("now".into())).unwrap();
    let doc = roxmltree::Document::parse(&svg).unwrap();
    let all = svg_texts(&doc).join("\n");
    assert!(all.contains("incident #3 WARN") && all.contains("incident #4 CRITICAL"), "{all}");
    // An empty run still draws.
    let empty = render::chain(&Ledger::default().run_bundle("now".into())).unwrap();
    assert!(roxmltree::Document::parse(&empty).is_ok() && empty.contains("no incident"), "{empty}");
}

#[test]
fn wrap_cuts_long_text_at_a_separator_and_marks_the_cut() {
    use super::chain_svg::wrap;
    assert_eq!(wrap("short", 10, 3), vec!["short"]);
    assert_eq!(wrap("/run/containerd/io.containerd", 16, 3), vec!["/run/containerd/", "io.containerd"]);
    assert_eq!(wrap("/run/containerd/io.containerd", 16, 1), vec!["/run/containerd…"]);
    // No separator in the second half of the window: cut at the width.
    assert_eq!(wrap("/run/containerd", 12, 2), vec!["/run/contain", "erd"]);
    let lines = wrap(&"x".repeat(100), 10, 2);
    assert_eq!(lines, vec!["x".repeat(10), format!("{}…", "x".repeat(9))]);
    assert_eq!(wrap("a\nb", 10, 3), vec!["a b"]);
}

/// Every `src=`, `href=`, `data=` and `url(` value of a page: none may fetch from the net.
fn fetched_urls(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for key in ["src=\"", "href=\"", "data=\"", "url(", "src='", "href='", "@import"] {
        let mut rest = html;
        while let Some(i) = rest.find(key) {
            rest = &rest[i + key.len()..];
            let value: String = rest.chars().take_while(|c| !matches!(c, '"' | '\'' | ')')).collect();
            out.push(value);
        }
    }
    out
}

#[test]
fn the_page_embeds_both_pictures_and_fetches_nothing() {
    use base64::Engine as _;
    let b = rich_bundle();
    let latency = latency_tables(&Summary { dropped_waits: 7, dropped_events: 11, ..Default::default() });
    let html = render::html(&b, Some(&latency)).unwrap();
    let urls = fetched_urls(&html);
    assert!(!urls.is_empty());
    for u in &urls {
        let u = u.trim().to_ascii_lowercase();
        assert!(!u.starts_with("http:") && !u.starts_with("https:") && !u.starts_with("//"), "the page fetches {u}");
    }
    // The check sees a fetch when there is one.
    assert!(fetched_urls("<img src=\"https://cdn.example/x.png\">").iter().any(|u| u.starts_with("https:")));
    assert!(!html.contains("<script"), "the page runs no script of its own");
    assert!(!html.contains("<script>alert(1)"), "hostile text escaped");
    // chain.svg inline, with every hop named.
    let div = &html[html.find("id=\"chain\"").expect("the chain's figure")..];
    let inline = &div[div.find("<svg").expect("chain.svg inline")..div.find("</svg>").unwrap() + "</svg>".len()];
    let doc = roxmltree::Document::parse(inline).unwrap_or_else(|e| panic!("the inline chain.svg: {e}"));
    let texts = svg_texts(&doc).join("\n");
    for h in &b.incidents[0].chain {
        assert!(texts.contains(&h.kind), "the inline chain.svg lacks {}", h.kind);
    }
    // blocked.svg as a data: URL that decodes to the file.
    let at = html.find("data:image/svg+xml;base64,").expect("blocked.svg embedded") + "data:image/svg+xml;base64,".len();
    let encoded: String = html[at..].chars().take_while(|c| *c != '"').collect();
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded).unwrap();
    assert_well_formed(&decoded);
    let decoded = String::from_utf8(decoded).unwrap();
    assert!(decoded.contains("plegwatch incident #3: blocked time") && decoded.contains("ListContainers"), "not blocked.svg");
    // Summary, chain list, drops.
    for want in [
        "IMMINENT",
        "PLEG budget 3%",
        "waited 6.0s",
        "started 2026-11-23T03:00:00.000Z",
        "server.(*criService).ListContainers",
        "ROOT",
        "id=\"drops\"",
        ">7<",
        ">11<",
        "umount2",
    ] {
        assert!(html.contains(want), "the page lacks {want}");
    }
}

#[test]
fn timeline_rows_are_the_waits_with_their_levels_and_ends() {
    let mut l = Ledger::default();
    let mut s = stall(1, WaitKind::Umount, 30, 1.0, &UMOUNT_STACK);
    s.started_at = "2026-11-23T03:00:01.000Z".into();
    l.stall(&s);
    s.level = Level::Critical;
    s.waited_s = 4.0;
    l.stall(&s);
    l.stall(&s); // a repeat keeps the first crossing
    l.incident(&incident(Level::Warn, 2.0));
    l.incident(&incident(Level::Imminent, 6.0));
    l.resolved(&resolved(1, 8.0));
    let b = l.bundle_of(3, "resolved", "now".into()).unwrap();
    let tl = super::timeline::of(&b);
    let ids: Vec<u64> = tl.rows.iter().map(|r| r.wait_id).collect::<std::collections::BTreeSet<_>>().into_iter().collect();
    assert_eq!(tl.rows.len(), b.waits.len());
    assert_eq!(ids, b.waits.iter().map(|w| w.id).collect::<Vec<_>>());
    // Time zero is the incident's start (03:00:00); wait 1 began a second later, went
    // warn at 1 s, critical at 4 s of its age, ended at 8 s.
    assert_eq!(tl.origin.as_deref(), Some("2026-11-23T03:00:00.000Z"));
    let w1 = tl.rows.iter().find(|r| r.wait_id == 1).unwrap();
    assert_eq!((w1.start_s, w1.end_s, w1.ended, w1.start_known), (1.0, 9.0, true, true));
    assert_eq!(w1.marks, vec![("warn".to_string(), 2.0), ("critical".to_string(), 5.0)]);
    // Wait 8 had no stall line: its start comes from its age on the incident line (6 s
    // line at 03:00:06, aged 5.5 s) and it is still open.
    let w8 = tl.rows.iter().find(|r| r.wait_id == 8).unwrap();
    assert!((w8.start_s - 0.5).abs() < 1e-6 && !w8.ended && w8.start_known, "{w8:?}");
    // The incident went warn at 2 s and imminent at 6 s.
    let marks: Vec<(String, f64)> = tl.incident_marks.iter().map(|m| (m.level.clone(), m.at_s)).collect();
    assert_eq!(marks, vec![("warn".to_string(), 2.0), ("imminent".to_string(), 6.0)]);
    // The page draws a row per wait.
    let html = render::html(&b, None).unwrap();
    assert_eq!(html.matches("class=\"tl-row\"").count(), b.waits.len());
    assert_eq!(super::timeline::tick_step(9.0), 2.0);
    assert_eq!(super::timeline::tick_step(0.3), 0.05);
}

#[test]
fn the_user_stack_stands_between_the_hops_and_the_kernel_stack() {
    let mut l = Ledger::default();
    let mut s = stall(1, WaitKind::Umount, 30, 2.0, &UMOUNT_STACK);
    // Innermost first, as the kernel walks it.
    s.user_stack = vec!["syscall.Syscall6".into(), "mount.unmount".into(), "task.(*service).Delete".into()];
    l.stall(&s);
    l.incident(&incident(Level::Imminent, 6.0));
    let b = l.bundle_of(3, "imminent", "now".into()).expect("raised");
    let f = folded(&b.samples);
    let line = f.lines().find(|l| l.contains("umount c30")).unwrap_or_else(|| panic!("{f}"));
    let user = "task.(*service).Delete;mount.unmount;syscall.Syscall6;entry_SYSCALL_64_after_hwframe_[k]";
    assert!(line.contains(&format!("(task_work after the syscall returned);{user}")), "{line}");
}

/// The daemon's sink forgets each incident once its resolved bundle is written: over
/// 200 incidents its ledger and its list of bundles stay as small as retention keeps.
#[test]
fn the_daemons_ledger_stays_bounded() {
    let root = tempfile::tempdir().unwrap();
    let keep = retention::Retention { max_bundles: 5, max_bytes: u64::MAX };
    let mut sink = ReportSink::with_retention(&root.path().join("reports"), Some(keep)).unwrap();
    for n in 0..200u64 {
        let id = 1000 + n;
        let wait = 5000 + n;
        sink.emit(&Event::Stall(Box::new(stall(wait, WaitKind::Umount, 30, 2.0, &UMOUNT_STACK))));
        let mut i = incident(Level::Warn, 2.0);
        i.id = id;
        i.waits = vec![wait];
        for h in i.chain.iter_mut() {
            h.wait_id = Some(wait);
        }
        i.root = i.chain.last().cloned();
        sink.emit(&Event::Incident(Box::new(i)));
        sink.emit(&Event::Resolved(resolved(wait, 3.0)));
        sink.emit(&Event::IncidentResolved(IncidentResolved { id, waited_s: 3.0, longest_chain: Vec::new(), merged_into: None }));
    }
    let (incidents, waits, names) = sink.held();
    assert!(incidents == 0 && waits <= 1 && names <= 5, "held: {incidents} incidents, {waits} waits, {names} names");
    drop(sink);
}
