//! `plegwatch watch`.

use crate::{
    durations,
    engine::{self, WatchConfig},
    events::Sink,
    levels::Thresholds,
    sinks::{stdout_writer::StdoutWriter, JsonSink, LiveSink, ReportSink, Tee, TextOptions, TextSink},
    sources::inflight::Filter,
};
use clap::Args;
use std::time::Duration;

/// Thresholds accept `150ms`, `10s`, `2m`, or bare seconds.
///
/// On a terminal, the open incidents are redrawn in place (the live view);
/// with `--no-live`, `--json`, `--waits`, or stdout not a terminal, each is
/// printed as lines when it is raised, changes or ends.
#[derive(Debug, Args)]
#[command(after_help = "Examples:
  plegwatch watch --warn 2s --duration 30
  plegwatch watch --no-live | tee plegwatch.log
  plegwatch watch --json --pid 1234 --comm umount
  plegwatch watch --comm 'containerd-shim*'
  plegwatch watch --runtime-endpoint unix:///run/k3s/containerd/containerd.sock
  plegwatch watch --report-dir /var/lib/plegwatch/reports")]
pub struct WatchArgs {
    /// Print one JSON object per line instead of text.
    #[arg(long)]
    pub json: bool,
    /// Print lines, not the live view, even on a terminal.
    #[arg(long)]
    pub no_live: bool,
    /// In text, also print each wait's own stall and resolved lines (JSON always
    /// has them); implies --no-live.
    #[arg(long)]
    pub waits: bool,
    /// Kernel stacks in `--waits` lines: `folded` to the frames that matter, or `full`.
    #[arg(long, value_enum, default_value = "folded", value_name = "HOW")]
    pub stacks: Stacks,
    #[command(flatten)]
    pub levels: LevelArgs,
    /// Only waits of this process or thread id (repeatable).
    #[arg(long = "pid", value_name = "PID", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..))]
    pub pids: Vec<u32>,
    /// Only waits of tasks with this comm; a trailing `*` matches a prefix (repeatable).
    #[arg(long = "comm", value_name = "COMM", value_parser = comm)]
    pub comms: Vec<String>,
    /// Probe this containerd binary (default: found by itself through /proc/*/exe).
    #[arg(long, value_name = "PATH")]
    pub containerd: Option<std::path::PathBuf>,
    /// Probe this kubelet binary, even before a kubelet runs it.
    #[arg(long, value_name = "PATH")]
    pub kubelet: Option<std::path::PathBuf>,
    /// Write an incident bundle (flamegraph, folded stacks, pprof, JSON) into a
    /// subdirectory of DIR for each incident when it reaches imminent and when
    /// it resolves, and one for the whole run at exit.
    #[arg(long, value_name = "DIR")]
    pub report_dir: Option<std::path::PathBuf>,
    /// Stop after this long, with a summary.
    #[arg(long, value_parser = durations::parse, allow_negative_numbers = true)]
    pub duration: Option<Duration>,
    /// The runtime's CRI socket, asked (off the scan loop, 2 s deadlines) for pod
    /// and container names; `none` to read them from containers' bundles only.
    #[arg(long, value_name = "ENDPOINT", default_value = crate::observe::k8s::cri::DEFAULT_ENDPOINT)]
    pub runtime_endpoint: String,
    /// How Go probe points name their function: attach cookies (Linux ≥
    /// 5.15), addresses, or `auto` (cookies when the kernel has them).
    #[arg(long, value_enum, default_value = "auto", value_name = "HOW", hide = true)]
    pub go_uprobes: crate::sources::gowatch::GoUprobes,
    /// How often open waits are scanned (at most 250ms).
    #[arg(long, default_value = "250ms", value_parser = durations::parse, allow_negative_numbers = true, hide = true)]
    pub interval: Duration,
}

/// The shortest `--interval`: each scan reads every open wait and walks the graph.
pub const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// How much of a kernel stack text lines show.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Stacks {
    /// Without the scheduler and syscall-entry frames, at most six frames.
    Folded,
    /// Every frame.
    Full,
}

/// The ages at which a wait is reported, and reported again (`watch`, `check --self-watch`).
#[derive(Clone, Debug, Args)]
pub struct LevelArgs {
    /// Report a wait once it has lasted this long.
    #[arg(long, default_value = "10s", value_parser = durations::level, allow_negative_numbers = true)]
    pub warn: Duration,
    /// Report it again, as critical, at this age.
    #[arg(long, default_value = "60s", value_parser = durations::level, allow_negative_numbers = true)]
    pub critical: Duration,
    /// Report it again, as imminent, at this age (kubelet's PLEG budget is 3m).
    #[arg(long, default_value = "150s", value_parser = durations::level, allow_negative_numbers = true)]
    pub imminent: Duration,
}

impl LevelArgs {
    /// The three levels, checked to be in order.
    pub fn thresholds(&self) -> Result<Thresholds, String> {
        Thresholds::new(self.warn, self.critical, self.imminent)
    }
}

/// The longest comm the kernel keeps (`TASK_COMM_LEN` less its NUL).
const COMM_MAX: usize = 15;

/// Checks a `--comm` (or the config's `comm`): not empty, and not longer
/// than a task's comm can be, since such a filter would silently match nothing.
pub fn comm(s: &str) -> Result<String, String> {
    let (exact, star) = match s.strip_suffix('*') {
        Some(prefix) => (prefix, "*"),
        None => (s, ""),
    };
    if s.is_empty() {
        return Err("empty comm: expected a task name, e.g. umount or 'containerd-shim*'".into());
    }
    if exact.len() > COMM_MAX {
        let cut: String = exact
            .chars()
            .scan(0, |n, c| {
                *n += c.len_utf8();
                (*n <= COMM_MAX).then_some(c)
            })
            .collect();
        return Err(format!(
            "comm {s:?} is longer than the {COMM_MAX} bytes the kernel keeps of a task's name, so it would match nothing; use {:?}",
            format!("{cut}{star}")
        ));
    }
    Ok(s.to_string())
}

impl WatchArgs {
    /// Checks the flags together.
    pub fn config(&self) -> Result<WatchConfig, String> {
        let thresholds = self.levels.thresholds()?;
        if self.interval > Duration::from_millis(250) || self.interval < MIN_INTERVAL {
            return Err(format!("--interval {:?}: must be from {MIN_INTERVAL:?} to 250ms (less is a busy loop)", self.interval));
        }
        for c in &self.comms {
            comm(c).map_err(|e| format!("--comm: {e}"))?;
        }
        Ok(WatchConfig {
            thresholds,
            filter: Filter { pids: self.pids.clone(), comms: self.comms.clone() },
            interval: self.interval,
            duration: self.duration,
            go_paths: self.go_paths()?,
            status_every: None,
            go_uprobes: self.go_uprobes,
            runtime_socket: match self.runtime_endpoint.as_str() {
                "none" => None,
                e => Some(crate::observe::k8s::cri::socket_path(e).map_err(|e| e.to_string())?),
            },
        })
    }

    /// `--containerd`/`--kubelet`, checked to be files.
    fn go_paths(&self) -> Result<Vec<(&'static str, std::path::PathBuf)>, String> {
        let given = [("containerd", &self.containerd), ("kubelet", &self.kubelet)];
        let mut out = Vec::new();
        for (target, path) in given {
            let Some(path) = path else { continue };
            if !path.is_file() {
                return Err(format!("--{target} {}: no such file", path.display()));
            }
            out.push((target, path.clone()));
        }
        Ok(out)
    }
}

/// Which sink `watch` prints through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Json,
    Text,
    Live,
}

impl WatchArgs {
    /// The sink for these flags, given whether stdout is a terminal that can show the live view.
    pub fn output(&self, terminal: bool) -> Output {
        if self.json {
            Output::Json
        } else if self.no_live || self.waits || !terminal {
            Output::Text
        } else {
            Output::Live
        }
    }
}

/// Runs `watch`; the error is one line. `text` carries the global flags
/// (colour, verbosity) for the text sink.
pub async fn run(args: WatchArgs, text: TextOptions) -> anyhow::Result<()> {
    let cfg = args.config().map_err(super::UsageError)?;
    let opts = TextOptions { waits: args.waits, full_stacks: args.stacks == Stacks::Full, ..text };
    // Lines go out from a thread of their own: a slow reader never holds the scans back.
    let out = || StdoutWriter::start(std::io::stdout()).map_err(|e| anyhow::anyhow!("cannot start the stdout writer thread: {e}"));
    let text = || -> anyhow::Result<Box<dyn Sink>> { Ok(Box::new(TextSink::new(out()?, opts))) };
    let mut sink: Box<dyn Sink> = match args.output(LiveSink::supported()) {
        Output::Json => Box::new(JsonSink(out()?)),
        Output::Text => text()?,
        Output::Live => match LiveSink::start(opts.color) {
            Ok(live) => Box::new(live),
            Err(e) => {
                tracing::warn!("live view: cannot start its thread ({e}); printing lines");
                text()?
            }
        },
    };
    if let Some(dir) = &args.report_dir {
        // A report dir that cannot be made, or is not safe to write as root: refused now.
        let report = ReportSink::new(dir).map_err(super::UsageError)?;
        sink = Box::new(Tee(sink, report));
    }
    // On an error the sink is dropped here, before main prints it: the live
    // view has given the terminal back by then.
    engine::watch(cfg, sink.as_mut()).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use std::time::Duration;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("plegwatch").chain(args.iter().copied()))
    }

    #[test]
    fn defaults_match_the_pleg_budget() {
        let Command::Watch(w) = parse(&["watch"]).unwrap().command else { panic!() };
        let c = w.config().unwrap();
        assert_eq!(c.thresholds.warn, Duration::from_secs(10));
        assert_eq!(c.thresholds.critical, Duration::from_secs(60));
        assert_eq!(c.thresholds.imminent, Duration::from_secs(150));
        assert_eq!(c.interval, Duration::from_millis(250));
    }

    #[test]
    fn flags_parse() {
        let Command::Watch(w) =
            parse(&["watch", "--json", "--warn", "2s", "--duration", "30", "--pid", "7", "--comm", "umount"]).unwrap().command
        else {
            panic!()
        };
        assert!(w.json);
        assert_eq!(w.levels.warn, Duration::from_secs(2));
        assert_eq!(w.duration, Some(Duration::from_secs(30)));
        assert_eq!((w.pids, w.comms), (vec![7], vec!["umount".to_string()]));
    }

    #[test]
    fn the_live_view_is_for_terminals_only() {
        use super::Output;
        let out = |args: &[&str], terminal: bool| {
            let Command::Watch(w) = parse(args).unwrap().command else { panic!() };
            w.output(terminal)
        };
        assert_eq!(out(&["watch"], true), Output::Live);
        assert_eq!(out(&["watch"], false), Output::Text);
        assert_eq!(out(&["watch", "--no-live"], true), Output::Text);
        assert_eq!(out(&["watch", "--waits"], true), Output::Text);
        assert_eq!(out(&["watch", "--json"], true), Output::Json);
        assert_eq!(out(&["watch", "--json", "--no-live"], false), Output::Json);
    }

    #[test]
    fn bad_input_is_refused() {
        assert!(parse(&["watch", "--warn", "soon"]).is_err());
        assert!(parse(&["watch", "--bogus"]).is_err());
        let Command::Watch(w) = parse(&["watch", "--warn", "70s"]).unwrap().command else { panic!() };
        let e = w.config().unwrap_err();
        assert!(e.contains("--critical") && !e.contains('\n'), "{e}");
        let Command::Watch(w) = parse(&["watch", "--containerd", "/nonexistent/containerd"]).unwrap().command else { panic!() };
        let e = w.config().unwrap_err();
        assert!(e.contains("--containerd /nonexistent/containerd") && !e.contains('\n'), "{e}");
        for interval in ["1ns", "9ms", "251ms"] {
            let Command::Watch(w) = parse(&["watch", "--interval", interval]).unwrap().command else { panic!() };
            let e = w.config().unwrap_err();
            assert!(e.starts_with("--interval") && e.contains("busy loop") && !e.contains('\n'), "{interval}: {e}");
        }
        let Command::Watch(w) = parse(&["watch", "--interval", "10ms"]).unwrap().command else { panic!() };
        assert_eq!(w.config().map(|c| c.interval), Ok(Duration::from_millis(10)));
    }
}
