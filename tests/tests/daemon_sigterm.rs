//! `plegwatch daemon` (the canary DaemonSet's mode) through a ring-buffer flood and then
//! SIGTERM, as a pod is stopped (issue 12).
//!
//! An incident is open (a parked relist of the fake-kubelet FIXTURE, a stripped Go program
//! carrying kubelet's relist symbol; not kubelet) and stays open through a storm of netlink
//! sends (`plegwatch_scenarios::flood::storm`) that overflows the socket ring buffer.
//! Asserted on the daemon's endpoints and files:
//! - `/metrics`: `plegwatch_dropped_records_total{probe="socket_io",reason="sock_events_full"}`
//!   above 0 after the storm, and `process_resident_memory_bytes` within the bound;
//! - `/incidents`: the same incident (id, `started_at`) before and after the storm;
//! - SIGTERM with the incident still open: exit status 0 within 5 s, and the run's final
//!   bundle under `--report-dir` holds the incident, still `open`, and the drop counters.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::canary::{self, Daemon};
use plegwatch_scenarios::flood;
use plegwatch_scenarios::gofixture::{build_fake_kubelet, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::preflight;
use serde_json::Value;

/// How soon the daemon must exit after SIGTERM.
const EXIT_WITHIN: Duration = Duration::from_secs(5);
const DROPS: &str = r#"plegwatch_dropped_records_total{probe="socket_io",reason="sock_events_full"}"#;
/// The daemon's resident memory (debug build, about 67 MiB idle) after the storm: its bound.
const RSS_BOUND: f64 = (96 << 20) as f64;

/// The value of one series in an exposition text.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// The open incident whose root is process `pid`, from `/incidents`.
fn incident_of(daemon: &Daemon, pid: u32) -> Option<Value> {
    let (code, body) = canary::http_get_unix(&daemon.socket, "/incidents").ok()?;
    let doc: Value = serde_json::from_str(&body).ok().filter(|_| code == 200)?;
    let needle = format!("pid={pid}");
    doc["incidents"].as_array()?.iter().find(|i| i["root"].as_str().is_some_and(|r| r.contains(&needle))).cloned()
}

#[test]
fn daemon_counts_a_flood_and_exits_0_on_sigterm_with_its_final_bundle() -> Result<()> {
    preflight::require();
    let bin = build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start(&bin)?;
    let kpid = kubelet.pid();
    let tmp = tempfile::tempdir()?;
    let reports = tmp.path().join("reports");
    let reports_arg = reports.display().to_string();
    let mut daemon = Daemon::start(&["--warn", "1s", "--report-dir", &reports_arg], READY_TIMEOUT)?;
    // The daemon finds the fixture by its exec or its 2 s /proc poll: its relist clock for
    // the fixture (a relist seen under the probes) is in /metrics once it has.
    let clock = format!("plegwatch_relist_age_seconds{{pid=\"{kpid}\"}}");
    canary::poll(Duration::from_secs(10), "the fixture's relist clock in /metrics", || {
        daemon.metrics().ok().filter(|t| t.lines().any(|l| l.starts_with(&clock)))
    })?;

    kubelet.block_next()?;
    kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
    let before = canary::poll(Duration::from_secs(6), "the parked relist in /incidents", || incident_of(&daemon, kpid))?;
    eprintln!("open before the storm: {before}");

    let storm = flood::storm(4, Duration::from_secs(3))?;
    // The daemon's status (and so its metrics) comes once a second.
    let text = canary::poll(Duration::from_secs(5), "socket_io drops in /metrics", || {
        daemon.metrics().ok().filter(|t| series(t, DROPS).is_some_and(|n| n > 0.0))
    })
    .with_context(|| format!("after {} sends; /metrics now:\n{}", storm.sends, daemon.metrics().unwrap_or_default()))?;
    let drops = series(&text, DROPS).unwrap_or(0.0);
    let rss = series(&text, "process_resident_memory_bytes").unwrap_or(0.0);
    eprintln!("storm: {} sends; /metrics: {drops} socket_io drops, RSS {:.1} MiB", storm.sends, rss / 1048576.0);
    assert!(rss > 0.0 && rss <= RSS_BOUND, "RSS {:.1} MiB after the storm (bound {} MiB)", rss / 1048576.0, RSS_BOUND / 1048576.0);
    let after = incident_of(&daemon, kpid).with_context(|| "the incident is gone from /incidents after the storm")?;
    assert_eq!(after["id"], before["id"], "another incident after the storm: {before} / {after}");
    assert_eq!(after["started_at"], before["started_at"], "{before} / {after}");
    let id = after["id"].as_u64().context("incident id")?;

    // Still parked: SIGTERM.
    daemon.proc.signal(libc::SIGTERM)?;
    let sent = Instant::now();
    let status = daemon.proc.wait_exit(EXIT_WITHIN)?;
    let took = sent.elapsed();
    eprintln!("daemon exited {status} {:.2}s after SIGTERM", took.as_secs_f64());
    kubelet.release()?;
    assert!(status.success(), "the daemon exited with {status} after SIGTERM");

    let bundles: Vec<PathBuf> = std::fs::read_dir(&reports)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    let run = bundles.iter().find(|b| b.to_string_lossy().ends_with("-run"));
    let run = run.with_context(|| format!("no run bundle after SIGTERM in {bundles:?}"))?;
    let json: Value = serde_json::from_slice(&std::fs::read(run.join("incident.json"))?)?;
    assert_eq!(json["reason"], "exit", "{json}");
    let incident = json["incidents"].as_array().into_iter().flatten().find(|i| i["id"].as_u64() == Some(id));
    let incident = incident.with_context(|| format!("incident #{id} is not in the final bundle: {json}"))?;
    assert_eq!(incident["state"], "open", "the relist was still parked at SIGTERM: {incident}");
    let latency: Value = serde_json::from_slice(&std::fs::read(run.join("latency.json"))?)?;
    let bundled = latency["dropped_by_probe"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["probe"] == "socket_io" && d["reason"] == "sock_events_full")
        .and_then(|d| d["count"].as_u64())
        .unwrap_or(0);
    assert!(bundled as f64 >= drops, "the final bundle counts {bundled} socket_io drops, /metrics said {drops}: {latency}");
    ensure!(kubelet.quit()?.success(), "the fixture exited badly");
    Ok(())
}
