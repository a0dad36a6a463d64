//! `plegwatch check`: a node-problem-detector custom plugin. It asks the
//! daemon running on this node (`--socket`, its local unix socket, root's alone) for
//! its open incidents. With `--self-watch DURATION`, when no daemon listens there, it
//! traces by itself for that long instead (as root), and judges the incidents
//! open at the end: the startup sweep finds kernel waits that began before it
//! started, with their age as a lower bound.

use crate::{
    cli::watch::{LevelArgs, WatchArgs},
    durations, engine,
    events::{Event, Sink},
    export::check,
    levels::Level,
    sinks::metrics,
};
use clap::{Args, ValueEnum};
use std::time::Duration;

/// The level that counts as a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AtLevel {
    Warn,
    Critical,
    Imminent,
}

impl From<AtLevel> for Level {
    fn from(l: AtLevel) -> Level {
        match l {
            AtLevel::Warn => Level::Warn,
            AtLevel::Critical => Level::Critical,
            AtLevel::Imminent => Level::Imminent,
        }
    }
}

/// Exit 0: fine; 1: an incident at `--level` or worse; 2: can't tell (no
/// daemon, or not ready). One line on stdout, naming the root.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  plegwatch check                        exit 1 at critical or worse, from the daemon on /run/plegwatch/plegwatch.sock
  plegwatch check --level imminent --socket /run/plegwatch/plegwatch.sock")]
pub struct CheckArgs {
    /// The daemon's local socket (`plegwatch daemon --socket`).
    #[arg(long, value_name = "PATH", default_value = super::daemon::DEFAULT_SOCKET)]
    pub socket: std::path::PathBuf,
    /// An incident at this level or worse is a problem.
    #[arg(long, value_enum, default_value = "critical")]
    pub level: AtLevel,
    /// Give up (exit 2) after this long.
    #[arg(long, default_value = "3s", value_parser = durations::parse, allow_negative_numbers = true)]
    pub timeout: Duration,
    /// When no daemon listens at --socket, trace for this long by itself (as root)
    /// instead of answering "cannot tell"; --warn, --critical and --imminent set its levels.
    #[arg(long, value_name = "DURATION", value_parser = durations::parse, allow_negative_numbers = true)]
    pub self_watch: Option<Duration>,
    /// The levels' ages (used by --self-watch only; a daemon has its own).
    #[command(flatten)]
    pub levels: LevelArgs,
}

/// Runs the check: prints its line, returns its exit code.
pub async fn run(args: CheckArgs) -> i32 {
    let answer = match (check::ask(&args.socket, args.timeout).await, args.self_watch) {
        (Err(e), Some(d)) if e.is_no_daemon() => self_watch(&args, d).await,
        (Err(e), None) if e.is_no_daemon() => Err(format!("{e} (--self-watch 5s traces by itself instead)")),
        (answer, _) => answer.map_err(|e| e.to_string()),
    };
    let (code, line) = check::verdict(answer, args.level.into());
    println!("{line}");
    code
}

/// The watch `--self-watch` runs: the thresholds given, everything else as `watch`'s defaults.
fn self_watch_config(args: &CheckArgs, duration: Duration) -> Result<engine::WatchConfig, String> {
    WatchArgs {
        json: false,
        no_live: true,
        waits: false,
        stacks: crate::cli::watch::Stacks::Folded,
        levels: args.levels.clone(),
        pids: Vec::new(),
        comms: Vec::new(),
        containerd: None,
        kubelet: None,
        report_dir: None,
        runtime_endpoint: crate::observe::k8s::cri::DEFAULT_ENDPOINT.into(),
        duration: Some(duration),
        interval: Duration::from_millis(250),
        go_uprobes: Default::default(),
    }
    .config()
    .map(|mut c| {
        // As the daemon: open incidents' ages and levels refreshed every second.
        c.status_every = Some(Duration::from_secs(1));
        c
    })
}

/// Traces for `duration` and answers as a daemon would have: the incidents open at the end.
async fn self_watch(args: &CheckArgs, duration: Duration) -> Result<metrics::IncidentsDoc, String> {
    let cfg = self_watch_config(args, duration)?;
    let (metrics, exposition) = metrics::metrics();
    let mut sink = AtTheEnd { metrics, exposition, doc: None };
    engine::watch(cfg, &mut sink).await.map_err(|e| format!("--self-watch: {e:#}"))?;
    sink.doc.ok_or_else(|| "--self-watch: the watch ended without a summary".to_string())
}

/// The daemon's incident sink, read just before the run's summary (which marks it not ready).
struct AtTheEnd {
    metrics: metrics::MetricsSink,
    exposition: metrics::Exposition,
    doc: Option<metrics::IncidentsDoc>,
}

impl Sink for AtTheEnd {
    fn emit(&mut self, e: &Event) {
        if matches!(e, Event::Summary(_)) {
            self.doc = Some(self.exposition.incidents());
        }
        self.metrics.emit(e);
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use std::time::Duration;

    fn check(args: &[&str]) -> super::CheckArgs {
        let cli = Cli::try_parse_from(["plegwatch", "check"].into_iter().chain(args.iter().copied())).unwrap();
        let Command::Check(c) = cli.command else { panic!() };
        c
    }

    #[test]
    fn self_watch_takes_its_thresholds() {
        let c = check(&["--self-watch", "5s", "--warn", "2s", "--critical", "4s"]);
        let cfg = super::self_watch_config(&c, Duration::from_secs(5)).unwrap();
        assert_eq!(cfg.duration, Some(Duration::from_secs(5)));
        assert_eq!(cfg.thresholds.warn, Duration::from_secs(2));
        assert_eq!(cfg.thresholds.critical, Duration::from_secs(4));
        let bad = check(&["--self-watch", "5s", "--warn", "70s"]);
        assert!(super::self_watch_config(&bad, Duration::from_secs(5)).unwrap_err().contains("--critical"));
    }

    #[tokio::test]
    async fn no_daemon_and_no_self_watch_cannot_tell_and_says_how() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("none.sock");
        let c = check(&["--socket", socket.to_str().unwrap(), "--timeout", "1s"]);
        assert_eq!(super::run(c).await, crate::export::check::UNKNOWN);
    }
}
