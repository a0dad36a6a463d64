//! `plegwatch daemon`: the canary mode. The same engine as `watch`; incidents
//! go to the logs (`--log-format text|json`) and to `/metrics` (Prometheus text, or OpenMetrics),
//! `/healthz` on `--listen` (TCP, what an exporter serves), and all of those with
//! `/incidents` (pod names, paths: for `plegwatch check`) on `--socket`, a unix socket
//! root's alone.
//!
//! Settings come from `--config FILE` (TOML, every key optional), then the
//! flags, which win. An unknown key or a bad value stops it at start, named.

use crate::{
    cli::watch::{LevelArgs, WatchArgs},
    durations, engine, export,
    sinks::{metrics, report::retention::Retention, LogSink, ReportSink, Tee},
};
use anyhow::Context as _;
use clap::Args;
use serde::Deserialize;
use std::{net::SocketAddr, path::PathBuf, time::Duration};

/// Where the endpoint listens unless told: loopback only.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9792";
/// The local socket: everything the TCP port serves, and `/incidents` (root's alone).
pub const DEFAULT_SOCKET: &str = "/run/plegwatch/plegwatch.sock";

/// The daemon's flags; each overrides the same key of `--config`.
#[derive(Debug, Args, Default)]
#[command(after_help = "Examples:
  plegwatch daemon                                   127.0.0.1:9792: /metrics, /healthz, /incidents
  plegwatch --log-format json daemon --config /etc/plegwatch/daemon.toml
  plegwatch daemon --listen 0.0.0.0:9792 --warn 5s   every interface: only when told

Config file (TOML; every key optional, flags win):
  listen = \"127.0.0.1:9792\"
  socket = \"/run/plegwatch/plegwatch.sock\"
  warn = \"10s\"
  critical = \"60s\"
  imminent = \"150s\"
  pid = [1234]
  comm = [\"containerd-shim*\"]
  containerd = \"/usr/bin/containerd\"
  kubelet = \"/usr/bin/kubelet\"
  runtime_endpoint = \"unix:///run/containerd/containerd.sock\"
  report_dir = \"/var/lib/plegwatch/reports\"
  report_keep = 100
  report_max_mib = 256")]
pub struct DaemonArgs {
    /// TOML config file.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address of the HTTP endpoint: /metrics and /healthz [default: 127.0.0.1:9792].
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// The local unix socket (mode 0600 in a directory of mode 0700): /metrics, /healthz
    /// and /incidents, which `plegwatch check` reads [default: /run/plegwatch/plegwatch.sock].
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// Raise an incident once its oldest wait has lasted this long [default: 10s].
    #[arg(long, value_parser = durations::level, allow_negative_numbers = true)]
    pub warn: Option<Duration>,
    /// Escalate to critical at this age [default: 60s].
    #[arg(long, value_parser = durations::level, allow_negative_numbers = true)]
    pub critical: Option<Duration>,
    /// Escalate to imminent at this age [default: 150s].
    #[arg(long, value_parser = durations::level, allow_negative_numbers = true)]
    pub imminent: Option<Duration>,
    /// Only waits of this process or thread id (repeatable).
    #[arg(long = "pid", value_name = "PID", allow_negative_numbers = true, value_parser = clap::value_parser!(u32).range(1..))]
    pub pids: Vec<u32>,
    /// Only waits of tasks with this comm; a trailing `*` matches a prefix (repeatable).
    #[arg(long = "comm", value_name = "COMM", value_parser = crate::cli::watch::comm)]
    pub comms: Vec<String>,
    /// Probe this containerd binary.
    #[arg(long, value_name = "PATH")]
    pub containerd: Option<PathBuf>,
    /// Probe this kubelet binary, even before a kubelet runs it.
    #[arg(long, value_name = "PATH")]
    pub kubelet: Option<PathBuf>,
    /// Write a bundle per incident (flamegraph, folded stacks, pprof, JSON) under DIR.
    #[arg(long, value_name = "DIR")]
    pub report_dir: Option<PathBuf>,
    /// Keep at most this many bundles under --report-dir, removing the oldest [default: 100].
    #[arg(long, value_name = "N", allow_negative_numbers = true)]
    pub report_keep: Option<usize>,
    /// Keep at most this many MiB of bundles under --report-dir, removing the oldest [default: 256].
    #[arg(long, value_name = "MIB", allow_negative_numbers = true)]
    pub report_max_mib: Option<u64>,
    /// The runtime's CRI socket for pod and container names; `none` for bundles only
    /// [default: unix:///run/containerd/containerd.sock].
    #[arg(long, value_name = "ENDPOINT")]
    pub runtime_endpoint: Option<String>,
    /// Stop after this long (tests).
    #[arg(long, value_parser = durations::parse, allow_negative_numbers = true, hide = true)]
    pub duration: Option<Duration>,
}

/// The config file's keys (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub socket: Option<PathBuf>,
    pub warn: Option<String>,
    pub critical: Option<String>,
    pub imminent: Option<String>,
    pub pid: Option<Vec<u32>>,
    pub comm: Option<Vec<String>>,
    pub containerd: Option<PathBuf>,
    pub kubelet: Option<PathBuf>,
    pub report_dir: Option<PathBuf>,
    pub report_keep: Option<usize>,
    pub report_max_mib: Option<u64>,
    pub runtime_endpoint: Option<String>,
}

/// What the daemon runs with.
#[derive(Debug)]
pub struct DaemonConfig {
    pub listen: SocketAddr,
    pub socket: PathBuf,
    pub watch: engine::WatchConfig,
    pub report_dir: Option<PathBuf>,
    /// How many bundles, and bytes of them, `report_dir` keeps.
    pub retention: Retention,
}

/// Reads a config file's text; the error is one line naming the file, the line and the key.
pub fn parse_file(path: &std::path::Path, text: &str) -> Result<FileConfig, String> {
    toml::from_str(text).map_err(|e: toml::de::Error| {
        let line = e.span().map(|s| text.as_bytes()[..s.start.min(text.len())].iter().filter(|b| **b == b'\n').count() + 1);
        let at = line.map(|l| format!(" line {l}")).unwrap_or_default();
        format!("--config {}{at}: {}", path.display(), e.message().replace('\n', " "))
    })
}

impl DaemonArgs {
    /// The file's settings under the flags', checked together.
    pub fn resolve(&self) -> Result<DaemonConfig, String> {
        let file = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
                parse_file(path, &text)?
            }
            None => FileConfig::default(),
        };
        let origin = self.config.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let dur = |key: &str, flag: Option<Duration>, file: &Option<String>, default: &str| -> Result<Duration, String> {
            if let Some(d) = flag {
                return Ok(d);
            }
            match file {
                Some(v) => durations::level(v).map_err(|e| format!("--config {origin}: {key} = {v:?}: {e}")),
                None => durations::level(default),
            }
        };
        let listen = match (self.listen, &file.listen) {
            (Some(a), _) => a,
            (None, Some(v)) => v.parse().map_err(|e| format!("--config {origin}: listen = {v:?}: {e} (want ADDR:PORT)"))?,
            (None, None) => DEFAULT_LISTEN.parse().map_err(|e| format!("{DEFAULT_LISTEN}: {e}"))?,
        };
        if file.pid.iter().flatten().any(|p| *p == 0) {
            return Err(format!("--config {origin}: pid = 0: no process has pid 0"));
        }
        for c in file.comm.iter().flatten() {
            crate::cli::watch::comm(c).map_err(|e| format!("--config {origin}: comm = {c:?}: {e}"))?;
        }
        let watch = WatchArgs {
            json: false,
            no_live: true,
            waits: false,
            stacks: crate::cli::watch::Stacks::Folded,
            levels: LevelArgs {
                warn: dur("warn", self.warn, &file.warn, "10s")?,
                critical: dur("critical", self.critical, &file.critical, "60s")?,
                imminent: dur("imminent", self.imminent, &file.imminent, "150s")?,
            },
            pids: pick(&self.pids, &file.pid),
            comms: pick(&self.comms, &file.comm),
            containerd: self.containerd.clone().or(file.containerd),
            kubelet: self.kubelet.clone().or(file.kubelet),
            duration: self.duration,
            interval: Duration::from_millis(250),
            go_uprobes: Default::default(),
            report_dir: None,
            runtime_endpoint: self
                .runtime_endpoint
                .clone()
                .or(file.runtime_endpoint)
                .unwrap_or_else(|| crate::observe::k8s::cri::DEFAULT_ENDPOINT.into()),
        };
        let mut watch = watch.config()?;
        watch.status_every = Some(Duration::from_secs(1));
        let report_dir = self.report_dir.clone().or(file.report_dir);
        let retention = Retention {
            max_bundles: self.report_keep.or(file.report_keep).unwrap_or(Retention::DAEMON.max_bundles),
            max_bytes: self
                .report_max_mib
                .or(file.report_max_mib)
                .map(|m| m.saturating_mul(1 << 20))
                .unwrap_or(Retention::DAEMON.max_bytes),
        };
        let from = if origin.is_empty() { String::new() } else { format!(" (--config {origin})") };
        if retention.max_bundles == 0 {
            return Err(format!("report_keep (--report-keep) must be at least 1{from}"));
        }
        if retention.max_bytes == 0 {
            return Err(format!("report_max_mib (--report-max-mib) must be at least 1: 0 would remove every bundle{from}"));
        }
        if listen.port() == 0 {
            return Err(format!(
                "listen (--listen) {listen}: port 0 picks a port no scraper can find; name one (default {DEFAULT_LISTEN}){from}"
            ));
        }
        let socket = self.socket.clone().or(file.socket).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
        if !socket.is_absolute() {
            return Err(format!("socket (--socket) {}: want an absolute path{from}", socket.display()));
        }
        Ok(DaemonConfig { listen, socket, watch, report_dir, retention })
    }
}

/// The flag's list when given, else the file's.
fn pick<T: Clone>(flag: &[T], file: &Option<Vec<T>>) -> Vec<T> {
    if flag.is_empty() {
        file.clone().unwrap_or_default()
    } else {
        flag.to_vec()
    }
}

/// Runs the daemon until SIGTERM or Ctrl-C; the error is one line.
pub async fn run(args: DaemonArgs) -> anyhow::Result<()> {
    let cfg = args.resolve().map_err(super::UsageError)?;
    // Before the endpoint is served: a daemon that cannot load its probes says
    // so in one line rather than answering /healthz first.
    crate::kernel::loader::require_root()?;
    // A report dir that cannot be made, or is not safe to write as root: refused at start.
    let mut report = match &cfg.report_dir {
        Some(dir) => Some(ReportSink::with_retention(dir, Some(cfg.retention)).map_err(super::UsageError)?),
        None => None,
    };
    let listener = tokio::net::TcpListener::bind(cfg.listen).await.with_context(|| format!("--listen {}: cannot listen", cfg.listen))?;
    let local = export::http::bind_local(&cfg.socket).map_err(super::UsageError)?;
    let listen = listener.local_addr().unwrap_or(cfg.listen);
    if !listen.ip().is_loopback() {
        tracing::warn!(%listen, "the endpoint listens beyond loopback, as told (/metrics and /healthz only)");
    }
    tracing::info!(%listen, socket = %cfg.socket.display(), "serving /metrics and /healthz on the port; /incidents too on the socket");
    let (mut metrics, exposition) = metrics::metrics();
    let server = tokio::spawn(export::http::serve(listener, exposition.clone()));
    let local_server = tokio::spawn(export::http::serve_local(local, exposition));
    let mut log = LogSink;

    let result = {
        let mut tee = Tee(&mut metrics, &mut log);
        match report.as_mut() {
            Some(r) => engine::watch(cfg.watch, &mut Tee(&mut tee, r)).await,
            None => engine::watch(cfg.watch, &mut tee).await,
        }
    };
    drop(report);
    server.abort();
    local_server.abort();
    let _ = std::fs::remove_file(&cfg.socket);
    result?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;
    use std::path::Path;

    fn daemon(args: &[&str]) -> DaemonArgs {
        let cli = Cli::try_parse_from(std::iter::once("plegwatch").chain(std::iter::once("daemon")).chain(args.iter().copied())).unwrap();
        let Command::Daemon(d) = cli.command else { panic!() };
        d
    }

    #[test]
    fn defaults_listen_on_loopback_only() {
        let c = daemon(&[]).resolve().unwrap();
        assert_eq!(c.listen, "127.0.0.1:9792".parse().unwrap());
        assert_eq!(c.watch.thresholds.warn, Duration::from_secs(10));
        assert_eq!(c.watch.status_every, Some(Duration::from_secs(1)));
        assert_eq!(c.watch.runtime_socket.as_deref(), Some(Path::new("/run/containerd/containerd.sock")));
    }

    #[test]
    fn the_runtime_endpoint_from_the_file_or_the_flag() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("d.toml");
        std::fs::write(&f, "runtime_endpoint = \"unix:///run/k3s/containerd/containerd.sock\"\n").unwrap();
        let c = daemon(&["--config", f.to_str().unwrap()]).resolve().unwrap();
        assert_eq!(c.watch.runtime_socket.as_deref(), Some(Path::new("/run/k3s/containerd/containerd.sock")));
        let c = daemon(&["--config", f.to_str().unwrap(), "--runtime-endpoint", "none"]).resolve().unwrap();
        assert_eq!(c.watch.runtime_socket, None, "the flag wins; none: bundles only");
        let e = daemon(&["--runtime-endpoint", "tcp://10.0.0.1:1"]).resolve().unwrap_err();
        assert!(e.contains("--runtime-endpoint") && !e.contains('\n'), "{e}");
    }

    #[test]
    fn flags_win_over_the_file() {
        let dir = std::env::temp_dir().join(format!("plegwatch-daemon-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.toml");
        std::fs::write(&f, "listen = \"127.0.0.1:9999\"\nwarn = \"3s\"\ncritical = \"20s\"\ncomm = [\"umount\"]\n").unwrap();
        let c = daemon(&["--config", f.to_str().unwrap(), "--warn", "2s"]).resolve().unwrap();
        assert_eq!(c.listen.port(), 9999);
        assert_eq!(c.watch.thresholds.warn, Duration::from_secs(2), "the flag wins");
        assert_eq!(c.watch.thresholds.critical, Duration::from_secs(20), "the file's");
        assert_eq!(c.watch.filter.comms, vec!["umount".to_string()]);
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn retention_from_the_file_or_the_flags() {
        let c = daemon(&[]).resolve().unwrap();
        assert_eq!(c.retention, Retention::DAEMON);
        let dir = std::env::temp_dir().join(format!("plegwatch-daemon-keep-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.toml");
        std::fs::write(&f, "report_keep = 5\nreport_max_mib = 3\n").unwrap();
        let c = daemon(&["--config", f.to_str().unwrap(), "--report-keep", "7"]).resolve().unwrap();
        assert_eq!(c.retention, Retention { max_bundles: 7, max_bytes: 3 << 20 });
        let e = daemon(&["--report-keep", "0"]).resolve().unwrap_err();
        assert!(e.contains("at least 1"), "{e}");
        let e = daemon(&["--report-max-mib", "0"]).resolve().unwrap_err();
        assert!(e.starts_with("report_max_mib (--report-max-mib) must be at least 1") && !e.contains('\n'), "{e}");
        let e = daemon(&["--listen", "127.0.0.1:0"]).resolve().unwrap_err();
        assert!(e.contains("port 0") && !e.contains('\n'), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The DaemonSet's ConfigMap is a config this daemon accepts (a bad key would crash-loop it).
    #[test]
    fn the_daemonsets_config_parses() {
        let yaml = include_str!("../../../deploy/daemonset.yaml");
        let start = yaml.find("  daemon.toml: |\n").expect("a daemon.toml key") + "  daemon.toml: |\n".len();
        let toml: String =
            yaml[start..].lines().take_while(|l| l.starts_with("    ") || l.is_empty()).map(|l| format!("{}\n", l.trim_start())).collect();
        let file = parse_file(Path::new("daemonset.yaml"), &toml).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        assert_eq!(file.report_keep, Some(100));
        assert_eq!(file.listen.as_deref(), Some("0.0.0.0:9792"));
    }

    #[test]
    fn bad_keys_and_values_are_named() {
        let p = Path::new("d.toml");
        let e = parse_file(p, "listen = \"127.0.0.1:1\"\nwarnn = \"2s\"\n").unwrap_err();
        assert!(e.contains("warnn") && e.contains("line 2") && e.contains("d.toml") && !e.contains('\n'), "{e}");
        let e = parse_file(p, "pid = \"12\"\n").unwrap_err();
        assert!(e.contains("line 1") && !e.contains('\n'), "{e}");
        let dir = std::env::temp_dir().join(format!("plegwatch-daemon-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("d.toml");
        std::fs::write(&f, "warn = \"soon\"\n").unwrap();
        let e = daemon(&["--config", f.to_str().unwrap()]).resolve().unwrap_err();
        assert!(e.contains("warn = \"soon\""), "{e}");
        std::fs::write(&f, "listen = \"localhost\"\n").unwrap();
        let e = daemon(&["--config", f.to_str().unwrap()]).resolve().unwrap_err();
        assert!(e.contains("listen = \"localhost\""), "{e}");
        for (text, named) in [
            ("warn = \"1e20\"\n", "warn = \"1e20\""),
            ("imminent = \"-5s\"\n", "imminent = \"-5s\""),
            ("critical = \"0\"\n", "critical = \"0\""),
            ("comm = [\"\"]\n", "comm = \"\""),
            ("comm = [\"containerd-shim-runc-v2\"]\n", "comm = \"containerd-shim-runc-v2\""),
            ("warn = 5\n", "line 1"),
            ("pid = [0]\n", "pid = 0"),
            ("warn = \"5s\n", "line 1"),
            ("[listen]\nx = 1\n", "line 1"),
        ] {
            std::fs::write(&f, text).unwrap();
            let e = daemon(&["--config", f.to_str().unwrap()]).resolve().unwrap_err();
            assert!(e.contains(named) && e.contains("--config") && !e.contains('\n'), "{text}: {e}");
        }
        std::fs::write(&f, "warn = \"70s\"\n").unwrap();
        let e = daemon(&["--config", f.to_str().unwrap()]).resolve().unwrap_err();
        assert!(e.contains("--critical"), "{e}");
        let _ = std::fs::remove_dir_all(dir);
    }
}
