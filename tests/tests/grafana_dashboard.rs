//! deploy/grafana-dashboard.json against a real Prometheus scraping a real `plegwatch
//! daemon`: every panel's `expr` (Grafana's `$instance` and `$__rate_interval` put in as a
//! dashboard would) must parse and evaluate through `/api/v1/query`, and the panels whose
//! series always exist (PLEG budget, scan lateness, plegwatch's CPU and RSS, probes
//! attached) must return data. Every metric name the dashboard uses must be one the daemon
//! registers (sinks/metrics.rs), so a panel for a series that is empty now still names a
//! real metric.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use plegwatch_scenarios::canary::{self, Daemon, Prometheus};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::preflight;
use serde_json::Value;

/// Metrics whose series exist from the daemon's first status on.
const ALWAYS: &[&str] = &[
    "plegwatch_pleg_budget_used_ratio",
    "plegwatch_scan_lateness_seconds",
    "process_cpu_seconds_total",
    "process_resident_memory_bytes",
    "plegwatch_ready",
];

/// Every panel's (title, expr), with Grafana's variables replaced.
fn exprs(dashboard: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().into_iter().flatten() {
        let title = p["title"].as_str().unwrap_or("?").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((title.clone(), e.replace("$__rate_interval", "30s").replace("$instance", ".*")));
            }
        }
    }
    out
}

/// The metric names in an expr: identifiers that start `plegwatch_` or `process_`.
fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let word_start = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if word_start && (expr[i..].starts_with("plegwatch_") || expr[i..].starts_with("process_")) {
            let end = expr[i..].find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).map_or(b.len(), |n| i + n);
            out.push(expr[i..end].to_string());
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

/// The registered name a series name comes from (`_total`, `_bucket`, units stripped).
fn registered(series: &str) -> String {
    let mut s = series.to_string();
    for suffix in ["_bucket", "_count", "_sum", "_total", "_seconds", "_bytes"] {
        if let Some(t) = s.strip_suffix(suffix) {
            s = t.to_string();
        }
    }
    s
}

#[test]
fn metric_names_are_found_in_exprs() {
    let names = metric_names(r#"rate(process_cpu_seconds_total{a="b"}[1m]) and on (instance) plegwatch_ready"#);
    assert_eq!(names, vec!["process_cpu_seconds_total", "plegwatch_ready"]);
    assert_eq!(registered("plegwatch_wait_duration_seconds_bucket"), "plegwatch_wait_duration");
    assert_eq!(registered("process_resident_memory_bytes"), "process_resident_memory");
}

#[test]
fn every_dashboard_query_evaluates_against_a_real_daemon() -> Result<()> {
    preflight::require();
    if canary::which("prometheus").is_none() {
        preflight::skip("grafana_dashboard", "no prometheus on PATH (Debian package prometheus; `cargo xtask setup`)");
        return Ok(());
    }
    let text = std::fs::read_to_string(canary::repo_root().join("deploy/grafana-dashboard.json"))?;
    let dashboard: Value = serde_json::from_str(&text).context("deploy/grafana-dashboard.json is not JSON")?;
    let all = exprs(&dashboard);
    assert!(all.len() >= 10, "only {} queries in the dashboard", all.len());
    let source = std::fs::read_to_string(canary::repo_root().join("probe-user/src/sinks/metrics.rs"))?;
    for (title, e) in &all {
        let names = metric_names(e);
        assert!(!names.is_empty(), "panel {title:?} names no plegwatch metric: {e}");
        for n in names {
            assert!(source.contains(&format!("\"{}\"", registered(&n))), "panel {title:?}: {n} is not a metric the daemon registers");
        }
    }

    let daemon = Daemon::start(&["--warn", "2s"], READY_TIMEOUT)?;
    let prom = Prometheus::start(&[("plegwatch", daemon.addr)], None)?;
    // A few scrapes, so that rate() over 30 s has two points.
    canary::poll(Duration::from_secs(60), "three scrapes of the daemon", || {
        prom.value(r#"count_over_time(up{job="plegwatch"}[1m])"#).filter(|n| *n >= 3.0)
    })?;
    let mut empty = Vec::new();
    for (title, e) in &all {
        let rows = match prom.query(e) {
            Ok(rows) => rows,
            Err(err) => bail!("panel {title:?}: Prometheus refused {e}: {err:#}"),
        };
        let always = metric_names(e).iter().all(|n| ALWAYS.iter().any(|a| n.starts_with(a)));
        eprintln!("{title}: {} series for {e}", rows.len());
        if always && rows.is_empty() {
            empty.push(format!("{title}: {e}"));
        }
    }
    assert!(empty.is_empty(), "queries that must have data returned none:\n{}", empty.join("\n"));
    let rss = prom.value(r#"process_resident_memory_bytes and on (instance) plegwatch_ready"#).unwrap_or(0.0);
    eprintln!("daemon RSS {:.1} MiB", rss / (1 << 20) as f64);
    Ok(())
}
