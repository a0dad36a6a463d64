//! The command line: one module per subcommand.

pub mod check;
pub mod completions;
pub mod daemon;
pub mod doctor;
pub mod explain;
pub mod report;
pub mod version;
pub mod watch;

use crate::logging::LogFormat;
use crate::style::ColorChoice;
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
  plegwatch check                          node-problem-detector plugin: asks the daemon
  plegwatch explain 3 --from plegwatch.jsonl    incident #3 of a `watch --json` log, hop by hop in words
  plegwatch completions bash > /etc/bash_completion.d/plegwatch

Exit codes:
  0  done: watch/daemon stopped by --duration, Ctrl-C or SIGTERM; a command did its job
  1  failed: could not load or attach the probes, not root, an I/O error
     (check: a stall at --level)
  2  bad input: a bad flag, config value, file or incident id (one line on stderr)
     (check: cannot tell)";

/// The exit codes, as the `--help` epilogue and the man page give them.
pub const EXIT_CODES: &[(i32, &str)] = &[
    (0, "done: watch or daemon stopped by --duration, Ctrl-C or SIGTERM; any other command did its job (check: no stall at --level)"),
    (1, "failed: the probes could not load or attach, not root, an I/O error (check: a stall at --level)"),
    (2, "bad input: a bad flag, config value, file or incident id, in one line on stderr (check: cannot tell)"),
];

/// plegwatch catches the waits that stall kubelet's PLEG (umount2 syncs,
/// fsyncs, ...) while they are still in flight, long before the node goes NotReady.
#[derive(Debug, Parser)]
#[command(name = "plegwatch", version = crate::cli::version::short(), long_version = crate::cli::version::long(), after_help = EXAMPLES)]
pub struct Cli {
    /// Log format on stderr.
    #[arg(long, global = true, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// Colour by level: `auto` on a terminal unless NO_COLOR is set.
    #[arg(long, global = true, value_enum, default_value = "auto", value_name = "WHEN")]
    pub color: ColorChoice,
    /// More detail: the probes chosen and startup logs (-v), debug logs (-vv).
    /// Logs are at `warn` on a terminal and `info` otherwise; PLEGWATCH_LOG overrides.
    #[arg(long, short, global = true, action = clap::ArgAction::Count)]
    pub verbose: u8,
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
    /// Print one incident of a `watch --json` log or a report bundle, hop by hop in words.
    Explain(explain::ExplainArgs),
    /// Print a shell completion script (bash, zsh, fish) on stdout.
    Completions(completions::CompletionsArgs),
    /// Print the man page (roff) on stdout: `plegwatch man | man -l -`.
    Man(completions::ManArgs),
}

/// The exit code of a bad flag or config value: clap's usage-error code.
pub const USAGE_EXIT: i32 = 2;

/// A bad flag or config value found after clap's parse (levels out of order,
/// a bad config file): `main` prints it as one line and exits [`USAGE_EXIT`].
#[derive(Debug)]
pub struct UsageError(pub String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

/// clap's error for a bad command line as one line (its message, possible
/// values and tip, without the usage block and the `--help` hint), so that a
/// log collector keeps it whole.
pub fn one_line(rendered: &str) -> String {
    rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more information"))
        .filter(|l| !l.is_empty())
        .map(|l| l.strip_prefix("error: ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(args: &[&str]) -> String {
        let e = Cli::try_parse_from(std::iter::once("plegwatch").chain(args.iter().copied())).unwrap_err();
        one_line(&e.render().to_string())
    }

    /// Each bad value is refused by the parse, in one line naming the flag and the value.
    #[test]
    fn hostile_flags_are_one_line_naming_flag_and_value() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&["watch", "--warn", "1e20"], "--warn", "1e20"),
            (&["watch", "--warn", "-3"], "--warn", "-3"),
            (&["watch", "--warn", "0"], "--warn", "0"),
            (&["watch", "--critical", "2d"], "--critical", "2d"),
            (&["watch", "--imminent", "NaN"], "--imminent", "NaN"),
            (&["watch", "--duration", "1e300"], "--duration", "1e300"),
            (&["watch", "--duration", "-1"], "--duration", "-1"),
            (&["watch", "--comm", ""], "--comm", "empty comm"),
            (&["watch", "--comm", "containerd-shim-runc-v2"], "--comm", "containerd-shim-runc-v2"),
            (&["watch", "--pid", "-5"], "--pid", "-5"),
            (&["watch", "--pid", "0"], "--pid", "0"),
            (&["daemon", "--report-keep", "-1"], "--report-keep", "-1"),
            (&["daemon", "--warn", "1e20"], "--warn", "1e20"),
            (&["daemon", "--comm", ""], "--comm", "empty comm"),
            (&["daemon", "--listen", "localhost"], "--listen", "localhost"),
            (&["check", "--level", "bogus"], "--level", "bogus"),
            (&["check", "--timeout", "-1"], "--timeout", "-1"),
            (&["check", "--self-watch", "1e20"], "--self-watch", "1e20"),
            (&["report", "x", "--format", "gif"], "--format", "gif"),
            (&["--log-format", "xml", "doctor"], "--log-format", "xml"),
            (&["--color", "rainbow", "doctor"], "--color", "rainbow"),
            (&["completions", "tcsh"], "<SHELL>", "tcsh"),
            (&["explain", "x", "--from", "f"], "<ID>", "x"),
            (&["watch", "--stacks", "some"], "--stacks", "some"),
        ];
        for (args, flag, value) in cases {
            let e = err(args);
            assert!(e.contains(flag) && e.contains(value) && !e.contains('\n'), "{args:?}: {e}");
        }
    }

    #[test]
    fn the_possible_values_stay_on_the_line() {
        let e = err(&["check", "--level", "bogus"]);
        assert!(e.contains("possible values: warn, critical, imminent"), "{e}");
        assert!(!e.contains("Usage") && !e.contains("--help"), "{e}");
    }
}
