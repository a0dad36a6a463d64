//! The canary mode under test: `plegwatch daemon` on a loopback port, a real
//! Prometheus server (Debian's `prometheus`) scraping it every second, and the
//! real node-problem-detector (`../shared/bin`) running `plegwatch check` as a
//! custom plugin. Each is a [`Proc`], killed on drop; readiness is polled on
//! their HTTP endpoints, never waited for with a fixed sleep.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::child::{Options, Proc, Stderr};
use crate::preflight::plegwatch_bin;

/// How often readiness and queries are polled.
const POLL: Duration = Duration::from_millis(200);

/// A loopback port free now (the kernel's pick; released at once for the server to take).
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// `GET path` over HTTP/1.0 on loopback: (status, body).
pub fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).with_context(|| format!("connect {addr}"))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).with_context(|| format!("read {addr}{path}"))?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| anyhow!("{addr}{path}: no HTTP header end"))?;
    let status =
        head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| anyhow!("{addr}{path}: bad status line {head:?}"))?;
    Ok((status, body.to_string()))
}

/// Polls `f` until it returns `Some`, or fails after `timeout` with `what`.
pub fn poll<T>(timeout: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let timeout = crate::timing::scaled(timeout);
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(POLL);
    }
}

/// `GET path` on a unix socket (HTTP/1.0): (status, body).
pub fn http_get_unix(socket: &Path, path: &str) -> Result<(u16, String)> {
    let mut s = std::os::unix::net::UnixStream::connect(socket).with_context(|| format!("connect {}", socket.display()))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).with_context(|| format!("read {}{path}", socket.display()))?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| anyhow!("{}{path}: no HTTP header end", socket.display()))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow!("{}{path}: bad status line {head:?}", socket.display()))?;
    Ok((code, body.to_string()))
}

/// Whether a Debian tool is on the PATH.
pub fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(tool)).find(|p| p.is_file())
}

/// A running `plegwatch daemon --listen 127.0.0.1:PORT --socket DIR/plegwatch.sock ARGS...`.
pub struct Daemon {
    pub proc: Proc,
    pub addr: SocketAddr,
    /// Its local socket (what `plegwatch check --socket` reads), in a private temp dir.
    pub socket: PathBuf,
    _socket_dir: tempfile::TempDir,
}

impl Daemon {
    /// Starts it and waits until `/healthz` says its probes are attached.
    pub fn start(args: &[&str], ready_timeout: Duration) -> Result<Self> {
        let bin = plegwatch_bin()?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let listen = addr.to_string();
        let socket_dir = tempfile::Builder::new().prefix("plegwatch-socket-").tempdir()?;
        let socket = socket_dir.path().join("plegwatch.sock");
        let mut cmd = Command::new(&bin);
        cmd.args(["--log-format", "json", "daemon", "--listen", &listen, "--socket"]).arg(&socket).args(args);
        let mut proc = Proc::spawn_with("plegwatch-daemon", &mut cmd, Options { stderr: Stderr::Echo, ..Options::default() })?;
        let deadline = Instant::now() + ready_timeout;
        loop {
            if let Ok((200, _)) = http_get(addr, "/healthz") {
                break;
            }
            if !proc.running() {
                bail!("plegwatch daemon exited before it was ready");
            }
            if Instant::now() >= deadline {
                bail!("plegwatch daemon not ready on {addr}/healthz after {ready_timeout:?}");
            }
            std::thread::sleep(POLL);
        }
        Ok(Self { proc, addr, socket, _socket_dir: socket_dir })
    }

    /// The current OpenMetrics text.
    pub fn metrics(&self) -> Result<String> {
        match http_get(self.addr, "/metrics")? {
            (200, body) => Ok(body),
            (code, body) => bail!("/metrics answered {code}: {body}"),
        }
    }
}

/// A Prometheus server in a temp dir, scraping `targets` (job name, address) every second.
pub struct Prometheus {
    pub proc: Proc,
    pub addr: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    pub fn start(targets: &[(&str, SocketAddr)], rules: Option<&Path>) -> Result<Self> {
        let bin = which("prometheus").context("no prometheus on PATH (Debian package prometheus; `cargo xtask setup` installs it)")?;
        let dir = tempfile::Builder::new().prefix("plegwatch-prom-").tempdir()?;
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()?).parse()?;
        let mut cfg = String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n");
        if let Some(r) = rules {
            cfg.push_str(&format!("rule_files:\n  - {}\n", r.display()));
        }
        cfg.push_str("scrape_configs:\n");
        for (job, target) in targets {
            cfg.push_str(&format!("  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"));
        }
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, &cfg)?;
        let mut cmd = Command::new(bin);
        cmd.arg(format!("--config.file={}", file.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn");
        let mut proc = Proc::spawn_with("prometheus", &mut cmd, Options { stderr: Stderr::Echo, ..Options::default() })?;
        poll(Duration::from_secs(60), "prometheus /-/ready", || {
            if !proc.running() {
                return Some(Err(anyhow!("prometheus exited at start")));
            }
            matches!(http_get(addr, "/-/ready"), Ok((200, _))).then_some(Ok(()))
        })??;
        Ok(Self { proc, addr, _dir: dir })
    }

    /// `/api/v1/query?query=EXPR`: each series' labels and value.
    pub fn query(&self, expr: &str) -> Result<Vec<(Value, f64)>> {
        let path = format!("/api/v1/query?query={}", encode(expr));
        let (code, body) = http_get(self.addr, &path)?;
        let v: Value = serde_json::from_str(&body).with_context(|| format!("query {expr}: {code} {body}"))?;
        if v["status"] != "success" {
            bail!("query {expr}: {body}");
        }
        let out = v["data"]["result"]
            .as_array()
            .map(|rs| rs.iter().filter_map(|r| Some((r["metric"].clone(), r["value"][1].as_str()?.parse::<f64>().ok()?))).collect())
            .unwrap_or_default();
        Ok(out)
    }

    /// The one value of a query that sums to a scalar-like vector (`sum(...)`), if any.
    pub fn value(&self, expr: &str) -> Option<f64> {
        self.query(expr).ok()?.first().map(|(_, v)| *v)
    }
}

/// Percent-encodes a query string value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The repository's root (for `deploy/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}
