//! An incident bundle's `index.html`, opened in headless Chromium: containerd#9770 staged on
//! real containerd 1.6.20 (the bed of `containerd_9770_plegwatch.rs`), watched by
//! `plegwatch watch --report-dir` with warn/critical/imminent at 2/4/8 s. The bundle of the
//! incident that runs relist → ListContainers → the Status lock → the shim's umount2 must
//! hold `chain.svg` and `index.html` (0600), and the page must:
//! - load with no console message at all (Chromium logs every one, uncaught exceptions and
//!   failed loads included; the check is shown to fail on a page that throws);
//! - render (a 1400×2000 screenshot of real size);
//! - name the chain's hops in its DOM, inline the chain and embed the flamegraph, and draw
//!   one timeline row per wait of the bundle.
//!
//! `PLEGWATCH_SAVE_DOCS=DIR` copies the screenshot, `blocked.svg` and `chain.svg` there
//! (the README's pictures in `docs/img/` come from this run).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result};
use serde_json::Value;

use plegwatch_scenarios::chromium;
use plegwatch_scenarios::containerd;
use plegwatch_scenarios::containerd::bed::{StallBed, Watched};
use plegwatch_scenarios::containerd::issue9770::{Bed, OnDisk, Options};
use plegwatch_scenarios::containerd::Version;
use plegwatch_scenarios::preflight::plegwatch_bin;
use plegwatch_scenarios::{preflight, WriteThrottle};

const SCENARIO: &str = "report_page";
const WARN: Duration = Duration::from_secs(2);

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0)
}

/// The console check catches a page that throws, and passes a quiet one.
fn console_check_can_fail(bin: &Path, dir: &Path) -> Result<()> {
    let bad = dir.join("throws.html");
    std::fs::write(
        &bad,
        "<!DOCTYPE html><html><body><p>x</p><script>throw new Error('deliberate report_page failure')</script></body></html>",
    )?;
    let opened = chromium::open(bin, &bad, &dir.join("throws.png"))?;
    assert!(
        opened.console.iter().any(|l| l.contains("deliberate report_page failure")),
        "the console check missed a deliberate throw: {:?}",
        opened.console
    );
    let good = dir.join("quiet.html");
    std::fs::write(&good, "<!DOCTYPE html><html><body><p>x</p></body></html>")?;
    let opened = chromium::open(bin, &good, &dir.join("quiet.png"))?;
    assert!(opened.console.is_empty(), "a quiet page logged: {:?}", opened.console);
    Ok(())
}

/// The least umount of the staging that counts as the #9770 stall.
const STALL_MIN: Duration = Duration::from_secs(10);

/// Whether `v` (an incident's chain) has a hop in process `pid`.
fn names_pid(chain: &Value, pid: u32) -> bool {
    chain.as_array().into_iter().flatten().any(|h| h["pid"].as_u64() == Some(u64::from(pid)))
}

/// The incident bundle whose chain runs through ListContainers and the Status lock of our
/// containerd (other scenarios may run beside this one: plegwatch sees the whole host).
fn the_bundle(reports: &Path, containerd: u32) -> Result<(PathBuf, Value)> {
    let mut seen = Vec::new();
    for e in std::fs::read_dir(reports)? {
        let dir = e?.path();
        if !dir.to_string_lossy().contains("-incident-") {
            continue;
        }
        let json: Value = serde_json::from_slice(&std::fs::read(dir.join("incident.json"))?)?;
        let chain = json["incidents"][0]["chain"].to_string();
        if chain.contains("ListContainers") && chain.contains("Status lock") && names_pid(&json["incidents"][0]["chain"], containerd) {
            return Ok((dir, json));
        }
        seen.push(format!("{}: {chain}", dir.display()));
    }
    anyhow::bail!("no incident bundle with ListContainers and the Status lock in {}:\n{}", reports.display(), seen.join("\n"))
}

#[test]
fn the_incident_page_renders_in_chromium_with_no_console_errors() -> Result<()> {
    preflight::require();
    let scenario = format!("{SCENARIO} on {}", Version::DEBIAN);
    if !containerd::require_version(Version::DEBIAN, &scenario) {
        return Ok(());
    }
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip(&scenario, &why);
        return Ok(());
    }
    let bin = match chromium::find() {
        Ok(b) => b,
        Err(why) => {
            preflight::skip(&scenario, &why);
            return Ok(());
        }
    };
    let tmp = tempfile::tempdir()?;
    console_check_can_fail(&bin, tmp.path())?;

    let reports = tmp.path().join("reports");
    let reports_arg = reports.to_string_lossy().into_owned();
    let bed = Bed::prepare(Options { version: Version::DEBIAN, on_disk: OnDisk::Snapshots, ..Options::default() })?;
    let extra = ["--critical", "4s", "--imminent", "8s", "--report-dir", reports_arg.as_str()];
    let containerd_pid = bed.stage().containerd().pid();
    // Stop once our incident resolved: the one whose chain went through our containerd.
    let done = move |e: &plegwatch_scenarios::Event| {
        e.is("incident_resolved")
            && e.get("/merged_into").is_none()
            && e.get("/longest_chain").is_some_and(|c| names_pid(c, containerd_pid))
    };
    let w = Watched::run_with_args(bed, WARN, &extra, done)?;
    eprintln!("plegwatch:\n{}", containerd::bed::reported(&w.events));
    let umount = w.outcome.umount.as_ref().map(|u| u.duration());
    assert!(
        umount.is_some_and(|d| d >= STALL_MIN),
        "the staging did not stall (the shim's umount: {umount:?}; want ≥ {STALL_MIN:?})\n{}",
        w.all()
    );

    let (bundle, json) = the_bundle(&reports, containerd_pid).map_err(|e| anyhow::anyhow!("{e}\n{}", w.all()))?;
    eprintln!("bundle: {}", bundle.display());
    for f in ["chain.svg", "index.html", "blocked.svg", "incident.json"] {
        let p = bundle.join(f);
        assert!(p.is_file(), "{} is missing", p.display());
        assert_eq!(mode(&p), 0o600, "{}", p.display());
    }
    let chain_svg = std::fs::read_to_string(bundle.join("chain.svg"))?;
    assert!(
        chain_svg.starts_with("<?xml") && chain_svg.contains("ROOT: umount") && chain_svg.trim_end().ends_with("</svg>"),
        "chain.svg:\n{chain_svg}"
    );

    let page = bundle.join("index.html");
    let shot = tmp.path().join("incident-page.png");
    let opened = chromium::open(&bin, &page, &shot)?;
    assert!(opened.console.is_empty(), "index.html logged to the console:\n{}", opened.console.join("\n"));
    eprintln!("screenshot: {} bytes, {:?}", opened.png_bytes, opened.png_size);
    assert_eq!(opened.png_size, (chromium::WINDOW.0 as usize, chromium::WINDOW.1 as usize), "screenshot size");
    assert!(opened.png_bytes > 30_000, "a {}-byte screenshot is too small to show the page", opened.png_bytes);

    // The DOM names the chain's hops, in the list and in the inline chain.svg.
    let dom = &opened.dom;
    for want in ["ListContainers", "Status lock", "umount2", "ROOT", "pleg_relist"] {
        assert!(dom.contains(want), "the page's DOM does not name {want}");
    }
    let figure = &dom[dom.find("id=\"chain\"").context("the chain figure")?..];
    let inline = &figure[..figure.find("</svg>").context("inline chain.svg")?];
    for want in ["ListContainers", "Status lock", "umount2", "ROOT: umount"] {
        assert!(inline.contains(want), "the inline chain.svg does not name {want}");
    }
    assert!(dom.contains("data:image/svg+xml;base64,"), "blocked.svg is not embedded");
    let rows = dom.matches("class=\"tl-row\"").count();
    let waits = json["waits"].as_array().map_or(0, Vec::len);
    assert!(waits >= 3, "the bundle has {waits} waits: {json}");
    assert_eq!(rows, waits, "timeline rows vs the bundle's waits");
    // The timeline shows escalation: the incident reached imminent (8 s) in a ~20 s stall.
    assert!(dom.contains("incident #") && dom.contains(" imminent at "), "no imminent mark on the timeline");

    // plegwatch report renders both again from incident.json; latency.json's tables come along.
    let out = Command::new(plegwatch_bin()?).arg("report").arg(&bundle).args(["--format", "html"]).output()?;
    assert!(out.status.success(), "report --format html: {}", String::from_utf8_lossy(&out.stderr));
    let html = String::from_utf8_lossy(&out.stdout);
    assert!(html.contains("ListContainers") && html.contains("id=\"drops\""), "report --format html");
    let out = Command::new(plegwatch_bin()?).arg("report").arg(&bundle).args(["--format", "chain"]).output()?;
    assert!(out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ROOT: umount"), "report --format chain");

    if let Some(docs) = std::env::var_os("PLEGWATCH_SAVE_DOCS") {
        let docs = PathBuf::from(docs);
        std::fs::create_dir_all(&docs)?;
        std::fs::copy(&shot, docs.join("incident-page.png"))?;
        std::fs::copy(bundle.join("blocked.svg"), docs.join("blocked-flamegraph.svg"))?;
        std::fs::copy(bundle.join("chain.svg"), docs.join("chain.svg"))?;
        eprintln!("saved the pictures into {}", docs.display());
    }
    Ok(())
}
