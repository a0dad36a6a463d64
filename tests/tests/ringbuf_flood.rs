//! A ring-buffer flood (issue 12): a storm of netlink sends from several threads overflows
//! the socket ring buffer (`SOCK_EVENTS`, 1 MiB) while an incident is open. plegwatch must
//! survive it, count the drops by probe and say so (a warning on stderr naming the probe as
//! soon as the counter moves, the summary's `dropped`), stay within its memory bound, and
//! keep the incident that was open: same id, resolved under it once its wait ends, never
//! raised twice.
//!
//! The incident: a parked relist of the fake-kubelet FIXTURE (a stripped Go program carrying
//! kubelet's relist symbol; not kubelet). The storm: `plegwatch_scenarios::flood::storm`.

use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::flood::{self, RssSampler};
use plegwatch_scenarios::gofixture::{build_fake_kubelet, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};
use serde_json::Value;

/// Storm threads: more than the machine's 2 cores, so that the reader competes for CPU.
const THREADS: usize = 4;
const LENGTH: Duration = Duration::from_secs(4);
/// plegwatch's resident memory during the flood (debug build, about 67 MiB idle): its bound.
const RSS_BOUND: u64 = 96 << 20;
/// How much the flood may add to plegwatch's idle RSS: the ring buffers are preallocated
/// maps, so a flood should cost userspace little beyond what it parses one record at a time.
const RSS_GROWTH: u64 = 16 << 20;

#[test]
fn a_ringbuf_flood_is_counted_and_survived_with_the_incident_kept() -> Result<()> {
    preflight::require();
    let bin = build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start(&bin)?;
    let kpid = kubelet.pid();
    let mut plegwatch = Plegwatch::start(&["--warn", "1s", "--critical", "60s", "--imminent", "120s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    plegwatch.wait_probed(kpid, Duration::from_secs(5))?;
    let origin = Instant::now();
    let idle_rss = flood::rss_bytes(plegwatch.pid()).context("plegwatch's RSS")?;

    let raised = kubelet.park_and_await_incident(&mut plegwatch, origin)?;
    let id = raised.u64("/id").context("incident id")?;

    // The flood, with plegwatch's RSS sampled every 50 ms.
    let sampler = RssSampler::start(plegwatch.pid(), Duration::from_millis(50))?;
    let storm = flood::storm(THREADS, LENGTH)?;
    // The reader catches up.
    std::thread::sleep(Duration::from_secs(2));
    let (max_rss, samples) = sampler.stop();
    eprintln!(
        "storm: {} sends of {} B in {:.2}s ({:.0}/s) from {THREADS} threads; plegwatch RSS {:.1} MiB idle, max {:.1} MiB over {samples} samples",
        storm.sends,
        flood::MESSAGE_BYTES,
        storm.took.as_secs_f64(),
        storm.sends as f64 / storm.took.as_secs_f64(),
        idle_rss as f64 / 1048576.0,
        max_rss as f64 / 1048576.0
    );
    ensure!(samples > 10, "only {samples} RSS samples: plegwatch gone?");
    assert!(
        max_rss <= RSS_BOUND,
        "plegwatch's RSS reached {:.1} MiB during the flood (bound {} MiB)",
        max_rss as f64 / 1048576.0,
        RSS_BOUND >> 20
    );
    assert!(
        max_rss <= idle_rss + RSS_GROWTH,
        "plegwatch's RSS grew from {:.1} to {:.1} MiB during the flood (bound +{} MiB)",
        idle_rss as f64 / 1048576.0,
        max_rss as f64 / 1048576.0,
        RSS_GROWTH >> 20
    );
    let warned = plegwatch.wait_stderr("the kernel dropped records", Duration::from_secs(3));
    let stderr = plegwatch.stderr();
    let warning = stderr.lines().find(|l| l.contains("the kernel dropped records") && l.contains("socket_io"));
    assert!(warned && warning.is_some(), "no drop warning naming socket_io on stderr:\n{stderr}");
    eprintln!("warning: {}", warning.unwrap_or_default());

    // The incident survived: still open (not resolved), and resolves under its id.
    let all = dump(plegwatch.events(), origin);
    ensure!(!all.contains("\"incident_resolved\""), "an incident resolved during the flood:\n{all}");
    kubelet.release()?;
    let resolved = plegwatch.wait_for(Duration::from_secs(3), |e| e.is("incident_resolved") && e.u64("/id") == Some(id));
    let resolved =
        resolved.unwrap_or_else(|| panic!("incident #{id} did not resolve after the release:\n{}", dump(plegwatch.events(), origin)));
    let waited = resolved.f64("/waited_s").unwrap_or(0.0);
    assert!(waited >= LENGTH.as_secs_f64(), "incident #{id} waited {waited}s, across a {LENGTH:?} flood");

    let events = plegwatch.stop()?;
    let all = || dump(&events, origin);
    let raised_for_it = events
        .iter()
        .filter(|e| e.is("incident") && e.u64("/id") == Some(id) && e.get("/changed").and_then(Value::as_array).is_some_and(Vec::is_empty))
        .count();
    assert_eq!(raised_for_it, 1, "the parked relist was raised more than once:\n{}", all());
    let summary = events.iter().find(|e| e.is("summary")).with_context(|| format!("no summary:\n{}", all()))?;
    let dropped = summary.get("/dropped").and_then(Value::as_array).cloned().unwrap_or_default();
    let sock = dropped
        .iter()
        .find(|d| d["probe"] == "socket_io" && d["reason"] == "sock_events_full")
        .and_then(|d| d["count"].as_u64())
        .unwrap_or(0);
    eprintln!("summary dropped: {}", Value::Array(dropped.clone()));
    assert!(sock > 0, "the storm of {} sends did not overflow the socket ring buffer: {summary:?}", storm.sends, summary = summary.json);
    assert!(sock < storm.sends, "{sock} drops counted for {} sends", storm.sends);
    ensure!(kubelet.quit()?.success(), "the fixture exited badly");
    Ok(())
}
