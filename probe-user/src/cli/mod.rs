//! The command line: one module per subcommand.

pub mod check;
pub mod daemon;
pub mod doctor;
pub mod report;
pub mod watch;

use crate::logging::LogFormat;
use clap::{Parser, Subcommand};

const EXAMPLES: &str = "\
Examples:
  plegwatch doctor                         what this node supports, and the probes chosen
  plegwatch watch                          live stalls, warn at 10s / critical 60s / imminent 150s
  plegwatch watch --json --warn 2s         one JSON object per line, earlier warnings
  plegwatch watch --comm 'containerd-shim*' --duration 10m
  plegwatch watch --report-dir /var/lib/plegwatch/reports   a bundle per incident (flamegraph, pprof, JSON)
  plegwatch report DIR/<bundle> --format svg -o blocked.svg
  plegwatch daemon                         canary mode: logs, and /metrics on 127.0.0.1:9792
  plegwatch check                          node-problem-detector plugin: asks the daemon";

/// plegwatch catches the waits that stall kubelet's PLEG (umount2 syncs,
/// fsyncs, ...) while they are still in flight, long before the node goes NotReady.
#[derive(Debug, Parser)]
#[command(name = "plegwatch", version, after_help = EXAMPLES)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Watch this node and report stalls as they happen (needs root).
    Watch(watch::WatchArgs),
    /// Check what this node offers and which probe variants will be used.
    Doctor(doctor::DoctorArgs),
    /// Re-render an incident bundle written by `watch --report-dir`.
    Report(report::ReportArgs),
    /// Canary mode: watch, log incidents, serve /metrics, /healthz and /incidents (needs root).
    Daemon(daemon::DaemonArgs),
    /// node-problem-detector plugin: exit 0 fine, 1 stall at --level, 2 can't tell.
    Check(check::CheckArgs),
}
