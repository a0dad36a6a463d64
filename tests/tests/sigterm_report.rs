//! SIGTERM (how a DaemonSet's pod is stopped) ends `watch --report-dir` as Ctrl-C does:
//! the summary, the run's final bundle with the incident still open at the time, and
//! exit 0.
//!
//! The incident is a parked relist of the fake-kubelet FIXTURE (a stripped Go binary,
//! see `plegwatch_scenarios::gofixture`), held past `--warn` and still held when
//! SIGTERM arrives, so the run bundle can only hold it if it is written at exit.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::gofixture::{build_fake_kubelet, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};
use serde_json::Value;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0)
}

#[test]
fn sigterm_writes_the_final_bundle_and_exits_0() -> anyhow::Result<()> {
    preflight::require();
    let bin = build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start(&bin)?;
    let pid = kubelet.pid();
    kubelet.wait_relist_start(Duration::from_secs(3)).context("the fixture does not relist")?;

    let tmp = tempfile::tempdir()?;
    let reports = tmp.path().join("reports");
    let reports_arg = reports.to_string_lossy().into_owned();
    let mut plegwatch = Plegwatch::start(&["--warn", "1s", "--report-dir", &reports_arg])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    plegwatch.wait_probed(pid, Duration::from_secs(5))?;
    let started = std::time::Instant::now();

    let raised = kubelet.park_and_await_incident(&mut plegwatch, started)?;
    let id = raised.u64("/id").context("incident id")?;

    // Still parked: SIGTERM now.
    let events = plegwatch.stop_with(libc::SIGTERM)?;
    let all = || dump(&events, started);
    kubelet.release()?;
    let summary = events.iter().find(|e| e.is("summary")).unwrap_or_else(|| panic!("no summary:\n{}", all()));
    eprintln!("summary: {}", summary.json);

    assert_eq!(mode(&reports), 0o700, "{}", reports.display());
    let bundles: Vec<PathBuf> = std::fs::read_dir(&reports)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    eprintln!("bundles: {bundles:?}");
    let run = bundles
        .iter()
        .find(|b| b.to_string_lossy().ends_with("-run"))
        .unwrap_or_else(|| panic!("no run bundle in {bundles:?}:\n{}", all()));
    assert_eq!(mode(run), 0o700, "{}", run.display());
    for f in ["incident.json", "latency.json", "blocked.folded", "blocked.svg", "profile.pb.gz", "index.html"] {
        let p = run.join(f);
        assert!(p.is_file(), "{} is missing after SIGTERM", p.display());
        assert_eq!(mode(&p), 0o600, "{}", p.display());
        assert!(std::fs::metadata(&p)?.len() > 0, "{} is empty", p.display());
    }
    let json: Value = serde_json::from_slice(&std::fs::read(run.join("incident.json"))?)?;
    assert_eq!(json["scope"], "run", "{json}");
    assert_eq!(json["reason"], "exit", "{json}");
    let incident = json["incidents"].as_array().into_iter().flatten().find(|i| i["id"].as_u64() == Some(id));
    let incident = incident.unwrap_or_else(|| panic!("incident #{id} is not in the run bundle: {json}"));
    assert_eq!(incident["state"], "open", "the relist was still parked at SIGTERM: {incident}");
    let latency: Value = serde_json::from_slice(&std::fs::read(run.join("latency.json"))?)?;
    assert!(latency["families"].as_array().is_some_and(|f| !f.is_empty()), "latency.json: {latency}");

    // The next morning: `plegwatch explain` reads the incident back from the JSON log
    // (its last update) and from the run bundle, hop by hop in words, and no JSON.
    let log = tmp.path().join("watch.jsonl");
    std::fs::write(&log, events.iter().map(|e| format!("{}\n", e.json)).collect::<String>())?;
    let last = events.iter().rev().find(|e| e.is("incident") && e.u64("/id") == Some(id)).context("the incident's last line")?;
    let hops: Vec<String> =
        last.json["chain"].as_array().into_iter().flatten().filter_map(|h| h["what"].as_str().map(str::to_string)).collect();
    assert!(!hops.is_empty(), "{}", last.json);
    let explain = |from: &Path, id: &str| {
        std::process::Command::new(preflight::plegwatch_bin()?)
            .args(["explain", id, "--from"])
            .arg(from)
            .env("NO_COLOR", "1")
            .output()
            .context("run plegwatch explain")
    };
    for from in [log.as_path(), run.as_path()] {
        let out = explain(from, &id.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("explain {id} --from {}:\n{text}", from.display());
        assert!(out.status.success(), "explain --from {}: {}: {}", from.display(), out.status, String::from_utf8_lossy(&out.stderr));
        assert!(text.contains(&format!("incident #{id}")) && text.contains("ROOT") && text.contains("had not resolved"), "{text}");
        assert_eq!(
            text.matches("in words: ").count(),
            hops.len() + last.json["chain"].as_array().into_iter().flatten().filter(|h| !h["edge"].is_null()).count(),
            "each hop and each link in words:\n{text}"
        );
        for h in &hops {
            assert!(text.contains(h.as_str()), "hop {h:?} is not in the explanation of {}:\n{text}", from.display());
        }
        assert!(!text.lines().any(|l| l.contains("{\"")), "JSON in explain's text:\n{text}");
    }
    let out = explain(&log, "999999")?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "an unknown id exits 2: {err}");
    assert!(err.trim().lines().count() == 1 && err.contains("#999999"), "one line naming the id: {err}");

    let n = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist after the release")?;
    anyhow::ensure!(kubelet.wait_relist_end(n, Duration::from_secs(3)).is_some(), "relist {n} did not end");
    let status = kubelet.quit()?;
    assert!(status.success(), "the fixture exited badly: {status}");
    Ok(())
}
