//! The canary mode end to end, on the real kernel: `plegwatch daemon` on a loopback port,
//! a real Prometheus server scraping it every second, and the real node-problem-detector
//! (`../shared/bin`) running `plegwatch check --level warn` every second as a custom plugin
//! (deploy/npd-plegwatch-test.json, with this binary and port). The stall: a 16 MiB dirty
//! ext4 unmounted through a loop device throttled to 1 MiB/s (as in umount_stall), by a
//! thread of the test named [`COMM`]: the daemon watches only that comm, so other
//! scenarios' umounts running beside it on the node stay out of its series.
//!
//! Asserted through Prometheus's HTTP API and NPD's Prometheus exporter: the open-incident
//! series and the PLEG budget gauge are non-zero during the stall, NPD's `problem_gauge`
//! for `PLEGStallImminent` turns on; all return to zero after.

use std::ffi::CString;
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use plegwatch_scenarios::canary::{self, Daemon, Prometheus};
use plegwatch_scenarios::child::{Options, Proc, Stderr};
use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, LoopFs, WriteThrottle};

const DIRTY: usize = 16 * MIB;
/// The umount2 thread's name, and the daemon's `--comm` filter.
const COMM: &str = "canary-umount";
const THROTTLE_BPS: u64 = 1 << 20;
const NPD: &str = "../shared/bin/node-problem-detector";
const INCIDENTS: &str = "sum(plegwatch_incidents_open)";
const BUDGET: &str = "max(plegwatch_pleg_budget_used_ratio)";
const NPD_ON: &str = r#"problem_gauge{reason="PLEGStallImminent",type="PLEGStallImminent"}"#;

fn umount2(target: &Path) -> std::io::Result<()> {
    let path = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: umount2(2) with a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// The value of one series in an exposition text.
fn series(text: &str, name: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// node-problem-detector with only our custom plugin, the Kubernetes exporter off and its
/// Prometheus exporter on a loopback port.
fn start_npd(socket: &std::path::Path, dir: &std::path::Path) -> Result<(Proc, SocketAddr)> {
    let npd = canary::repo_root().join(NPD);
    let text = std::fs::read_to_string(canary::repo_root().join("deploy/npd-plegwatch-test.json"))?;
    let mut cfg: serde_json::Value = serde_json::from_str(&text)?;
    let rule = &mut cfg["rules"][0];
    rule["path"] = preflight::plegwatch_bin()?.display().to_string().into();
    let args = rule["args"].as_array_mut().context("rules[0].args")?;
    let at = args.iter().position(|a| a == "--socket").context("--socket in args")?;
    args[at + 1] = socket.display().to_string().into();
    let file = dir.join("npd-plegwatch-test.json");
    std::fs::write(&file, serde_json::to_string_pretty(&cfg)?)?;
    let metrics: SocketAddr = format!("127.0.0.1:{}", canary::free_port()?).parse()?;
    let mut cmd = Command::new(&npd);
    cmd.arg("--enable-k8s-exporter=false")
        .arg("--prometheus-address=127.0.0.1")
        .arg(format!("--prometheus-port={}", metrics.port()))
        .arg("--address=127.0.0.1")
        .arg(format!("--port={}", canary::free_port()?))
        .arg(format!("--config.custom-plugin-monitor={}", file.display()));
    let proc = Proc::spawn_with("npd", &mut cmd, Options { stderr: Stderr::Echo, ..Options::default() })?;
    Ok((proc, metrics))
}

fn npd_gauge(metrics: SocketAddr) -> Option<f64> {
    let (_, body) = canary::http_get(metrics, "/metrics").ok()?;
    series(&body, NPD_ON)
}

#[test]
fn daemon_metrics_in_prometheus_and_npd_condition_follow_a_staged_stall() -> Result<()> {
    preflight::require();
    if canary::which("prometheus").is_none() {
        preflight::skip("canary_daemon", "no prometheus on PATH (Debian package prometheus; `cargo xtask setup`)");
        return Ok(());
    }
    if !canary::repo_root().join(NPD).is_file() {
        preflight::skip("canary_daemon", &format!("{NPD} is missing (see ../shared/bin/README.md)"));
        return Ok(());
    }
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("canary_daemon", &why);
        return Ok(());
    }
    let dir = tempfile::Builder::new().prefix("plegwatch-canary-").tempdir()?;
    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let _throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    // Bundles with retention 1: an older bundle of this host's there before; a directory
    // that is not a bundle and another host's bundle, which retention must never touch.
    let reports = dir.path().join("reports");
    let host = plegwatch::sinks::report::safe_dir::host_tag();
    let stale = reports.join(format!("20200101T000000Z-{host}-pid1-0123456789abcdef-incident-9"));
    let other = if host == "00000000" { "11111111" } else { "00000000" };
    let foreign = reports.join(format!("20200101T000000Z-{other}-pid1-0123456789abcdef-incident-9"));
    let not_a_bundle = reports.join("notes");
    for d in [&stale, &foreign, &not_a_bundle] {
        std::fs::create_dir_all(d)?;
        std::fs::write(d.join("incident.json"), "{}")?;
    }
    let reports_arg = reports.display().to_string();
    // Only this test's umount: other scenarios may run beside it.
    let daemon = Daemon::start(&["--warn", "2s", "--comm", COMM, "--report-dir", &reports_arg, "--report-keep", "1"], READY_TIMEOUT)?;
    let prom = Prometheus::start(&[("plegwatch", daemon.addr)], None)?;
    let (_npd, npd_metrics) = start_npd(&daemon.socket, dir.path())?;

    // Quiet first: scraped, nothing open, NPD's condition off (its plugin ran and said 0).
    canary::poll(Duration::from_secs(30), "Prometheus scraping the daemon", || {
        (prom.value(r#"up{job="plegwatch"}"#) == Some(1.0) && prom.value(BUDGET).is_some()).then_some(())
    })?;
    assert_eq!(prom.value(INCIDENTS).unwrap_or(0.0), 0.0, "no incident before the stall");
    assert_eq!(prom.value(BUDGET), Some(0.0), "no budget used before the stall");
    canary::poll(Duration::from_secs(30), "NPD exporting its problem gauge", || npd_gauge(npd_metrics))?;
    assert_eq!(npd_gauge(npd_metrics), Some(0.0), "NPD's condition is off before the stall");

    let target = fs.mount_point().to_path_buf();
    dirty::write_file(&target.join("dirty.bin"), DIRTY)?;
    let started = Instant::now();
    let umount = std::thread::Builder::new().name(COMM.into()).spawn(move || umount2(&target))?;
    // During the stall: Prometheus sees the incident and the budget, NPD turns on.
    let (mut incidents_on, mut budget_on, mut npd_on) = (None, None, None);
    let mut max_budget: f64 = 0.0;
    let ended = loop {
        if umount.is_finished() {
            let took = started.elapsed();
            break (umount.join().map_err(|_| anyhow::anyhow!("the umount thread panicked"))?, took);
        }
        let t = started.elapsed();
        if incidents_on.is_none() && prom.value(INCIDENTS).is_some_and(|v| v > 0.0) {
            incidents_on = Some(t);
            // What the README shows: the daemon's own exposition during the stall.
            let text = daemon.metrics()?;
            let keep =
                ["plegwatch_incidents_open", "plegwatch_open_waits", "plegwatch_pleg_budget", "plegwatch_incidents_raised", "process_"];
            let shown: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && keep.iter().any(|k| l.starts_with(k))).collect();
            eprintln!("daemon /metrics during the stall (cut):\n{}", shown.join("\n"));
        }
        if let Some(b) = prom.value(BUDGET).filter(|b| *b > 0.0) {
            budget_on.get_or_insert(t);
            max_budget = max_budget.max(b);
        }
        if npd_on.is_none() && npd_gauge(npd_metrics) == Some(1.0) {
            npd_on = Some(t);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let (status, took) = ended;
    eprintln!(
        "umount took {:.2}s; seen in Prometheus: incidents at {:?}, budget at {:?} (max {:.4}); NPD condition on at {:?}",
        took.as_secs_f64(),
        incidents_on,
        budget_on,
        max_budget,
        npd_on
    );
    status.context("umount2")?;
    assert!(took > Duration::from_secs(6), "the umount took only {took:?}: the throttle did not take, no stall to see");
    assert!(incidents_on.is_some(), "Prometheus never returned a non-zero {INCIDENTS} during a {took:?} stall");
    assert!(budget_on.is_some(), "Prometheus never returned a non-zero {BUDGET} during the stall");
    assert!(npd_on.is_some(), "NPD's {NPD_ON} never turned on during the stall");
    // The budget is the incident's age over 180 s: at most the stall's own length.
    assert!(max_budget <= took.as_secs_f64() / 180.0 + 0.01, "budget {max_budget} for a {took:?} stall");

    // After: all back to zero.
    let back = Instant::now();
    canary::poll(Duration::from_secs(20), "the incident series and budget back to 0 in Prometheus", || {
        (prom.value(INCIDENTS) == Some(0.0) && prom.value(BUDGET) == Some(0.0)).then_some(())
    })?;
    let prom_back = back.elapsed();
    canary::poll(Duration::from_secs(20), "NPD's condition back off", || (npd_gauge(npd_metrics) == Some(0.0)).then_some(()))?;
    let npd_back = back.elapsed();
    eprintln!("after the umount: Prometheus at 0 in {:.2}s, NPD off in {:.2}s", prom_back.as_secs_f64(), npd_back.as_secs_f64());
    assert!(prom.value("sum(plegwatch_incidents_raised_total)").is_some_and(|v| v >= 1.0), "the raise was counted");
    assert!(prom.value("sum(plegwatch_incidents_resolved_total)").is_some_and(|v| v >= 1.0), "the resolution was counted");
    // The kernel's histograms reach the metrics with the daemon's once-a-second status, and
    // the umount counts only once it ended: wait for the first status after its end.
    let umount2 = "plegwatch_wait_duration_seconds_bucket{le=\"+Inf\",syscall=\"umount2\"}";
    let text = canary::poll(Duration::from_secs(5), "the umount2 histogram in /metrics", || {
        daemon.metrics().ok().filter(|t| t.contains(umount2))
    })?;
    // Retention: the resolved incident's bundle replaced the stale one; the notes stay.
    let bundles = || -> Vec<String> {
        std::fs::read_dir(&reports)
            .map(|d| d.flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| n.contains(&format!("-{host}-pid"))).collect())
            .unwrap_or_default()
    };
    canary::poll(Duration::from_secs(10), "the resolved incident's bundle, and the stale one removed", || {
        let b = bundles();
        (b.len() == 1 && b[0].contains("-incident-") && !stale.exists()).then_some(())
    })
    .with_context(|| format!("bundles now: {:?}", bundles()))?;
    assert!(not_a_bundle.join("incident.json").is_file(), "retention touched a directory that is not a bundle");
    assert!(foreign.join("incident.json").is_file(), "retention touched another host's bundle");
    let rss = series(&text, "process_resident_memory_bytes").unwrap_or(0.0);
    let cpu = series(&text, "process_cpu_seconds_total").unwrap_or(0.0);
    assert!(rss > 1e6, "RSS exported: {rss}");
    eprintln!("daemon: RSS {:.1} MB, CPU {cpu:.2}s", rss / 1e6);
    Ok(())
}
