//! Seed incident 000 (Terway; stall-catalog.md pattern 5), driven through containerd's own
//! CNI invocation.
//!
//! Two C **test fixtures stand in for Terway** (they hold no Terway code), in
//! `tests/fixtures/terway/`, built here with the system's gcc:
//! - `terwayd-fixture`, the CNI daemon: serves its plugin on a unix stream socket; the first
//!   ADD makes its serving thread take the daemon's pthread mutex and block in `recvfrom`
//!   on a netlink request the kernel never answers (in a throwaway network namespace), while
//!   its waiter threads block on the mutex. SIGUSR1 lifts the fault.
//! - `terway-cni`, a real CNI plugin executable (CNI 0.4.0: `CNI_COMMAND` and friends in
//!   the environment, the network config on stdin, the result on stdout) that asks the
//!   daemon over the unix socket and blocks in `read` for the answer.
//!
//! [`install_cni`] puts the plugin, Debian's `loopback` plugin (containernetworking-plugins;
//! containerd's CRI plugin always sets up `lo` too) and a network config into the private
//! containerd's own `bin_dir` and `conf_dir` (temp dirs of [`Containerd`]); the host's
//! `/etc/cni` and `/opt/cni` are never touched. A `RunPodSandbox` for a pod with its own
//! network namespace ([`pod_network_pod`]) then makes containerd run the plugin as its
//! child, which waits on the stuck daemon.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::child::Proc;
use crate::containerd::cri;
use crate::containerd::Containerd;
use crate::netlink::NetNs;
use k8s_cri::v1::{self as api, PodSandboxConfig};

/// The plugin's type in the network config, and its file name in `bin_dir`.
pub const PLUGIN: &str = "terway-cni";
/// The daemon fixture's name (its comm).
pub const DAEMON: &str = "terwayd-fixture";
/// Debian's loopback plugin (package containernetworking-plugins).
pub const LOOPBACK: &str = "/usr/lib/cni/loopback";
/// The network's name in the config.
pub const NETWORK: &str = "terway-fixture";
/// How long the daemon may take to say `ready`, and a request to reach it.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);

/// Panics unless gcc and Debian's loopback CNI plugin are there (`cargo xtask setup`
/// installs both).
pub fn require() {
    let path = std::env::var_os("PATH").unwrap_or_default();
    assert!(
        std::env::split_paths(&path).any(|d| d.join("gcc").is_file()),
        "gcc is not in PATH: the Terway fixtures are C (Debian package gcc)"
    );
    assert!(
        Path::new(LOOPBACK).is_file(),
        "{LOOPBACK} is missing: containerd's CRI plugin sets up the pod's lo with it (Debian \
         package containernetworking-plugins; `cargo xtask setup` installs it)"
    );
}

fn fixture_src(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/terway").join(name)
}

static BUILT: OnceLock<std::result::Result<(PathBuf, PathBuf), String>> = OnceLock::new();

/// Builds both fixtures (once per test process) into `$CARGO_TARGET_DIR/terway-fixtures`
/// (default `target/terway-fixtures`); returns (daemon, plugin).
pub fn build() -> Result<(PathBuf, PathBuf)> {
    BUILT.get_or_init(|| build_inner().map_err(|e| format!("{e:#}"))).clone().map_err(|e| anyhow!("building the Terway fixtures: {e}"))
}

fn build_inner() -> Result<(PathBuf, PathBuf)> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("terway-fixtures");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let out = |name: &str| dir.join(name);
    let gcc = |src: &str, bin: &Path, extra: &[&str]| -> Result<()> {
        // Built to a temp name and renamed: a process already running the old binary keeps it.
        let tmp = bin.with_extension(format!("tmp{}", std::process::id()));
        let status = Command::new("gcc")
            .args(["-O2", "-Wall", "-Wextra", "-Werror"])
            .args(extra)
            .arg("-o")
            .arg(&tmp)
            .arg(fixture_src(src))
            .status()
            .context("run gcc")?;
        if !status.success() {
            bail!("gcc {src}: {status}");
        }
        std::fs::rename(&tmp, bin).with_context(|| format!("rename to {}", bin.display()))
    };
    gcc("terwayd_fixture.c", &out(DAEMON), &["-pthread"])?;
    gcc("terway_cni_fixture.c", &out(PLUGIN), &[])?;
    Ok((out(DAEMON), out(PLUGIN)))
}

/// Where the private containerd's CRI plugin looks for CNI plugins and configs.
pub fn cni_dirs(containerd: &Containerd) -> (PathBuf, PathBuf) {
    (containerd.dir().join("cni/bin"), containerd.dir().join("cni/conf"))
}

/// The daemon's socket path, in the containerd's temp dir.
pub fn daemon_socket(containerd: &Containerd) -> PathBuf {
    containerd.dir().join("terwayd.sock")
}

/// Installs the plugin, the loopback plugin and a network config naming the daemon's
/// socket into the containerd's `bin_dir` and `conf_dir`.
pub fn install_cni(containerd: &Containerd, plugin: &Path) -> Result<()> {
    let (bin, conf) = cni_dirs(containerd);
    std::fs::copy(plugin, bin.join(PLUGIN)).context("copy the CNI plugin fixture")?;
    std::fs::copy(LOOPBACK, bin.join("loopback")).context("copy the loopback plugin")?;
    let config = format!(
        r#"{{
  "cniVersion": "0.4.0",
  "name": "{NETWORK}",
  "plugins": [
    {{ "type": "{PLUGIN}", "socket": "{}" }}
  ]
}}
"#,
        daemon_socket(containerd).display()
    );
    let path = conf.join("10-terway-fixture.conflist");
    std::fs::write(&path, config).with_context(|| format!("write {}", path.display()))
}

/// A pod sandbox config with its own network namespace (so containerd runs CNI for it).
pub fn pod_network_pod(name: &str, containerd: &Containerd) -> Result<PodSandboxConfig> {
    let mut config = cri::host_network_pod(name, containerd.cgroup_parent(), &containerd.pod_log_dir())?;
    let ns = config
        .linux
        .as_mut()
        .and_then(|l| l.security_context.as_mut())
        .and_then(|s| s.namespace_options.as_mut())
        .context("namespace options")?;
    ns.network = api::NamespaceMode::Pod as i32;
    config.hostname = name.into();
    Ok(config)
}

/// The running daemon fixture.
pub struct Daemon {
    pub proc: Proc,
    pub pid: u32,
}

impl Daemon {
    /// Starts the daemon on `socket`, its netlink requests in `netns`, with `waiters` threads
    /// that will block on its mutex; returns once it listens.
    pub fn start(bin: &Path, socket: &Path, netns: &NetNs, waiters: u32) -> Result<Self> {
        let mut proc = Proc::spawn(
            DAEMON,
            Command::new(bin).arg("--socket").arg(socket).args(["--netns", netns.name(), "--waiters", &waiters.to_string()]),
        )?;
        let pid = proc.pid();
        proc.wait_line(START_TIMEOUT, |l| l.starts_with("ready ")).with_context(|| format!("{DAEMON} (pid {pid}) never said ready"))?;
        Ok(Daemon { proc, pid })
    }

    /// The thread id a `WORD tid=T ...` line names, waiting up to `timeout` for it.
    pub fn tid_of(&mut self, word: &str, timeout: Duration) -> Result<u32> {
        let prefix = format!("{word} tid=");
        let (_, line) = self
            .proc
            .wait_line(timeout, |l| l.starts_with(&prefix))
            .with_context(|| format!("{DAEMON} printed no `{word}` line within {timeout:?}"))?;
        tid_field(&line).with_context(|| format!("no tid in {line:?}"))
    }

    /// The thread ids of every `WORD tid=T` line so far, waiting until there are `n`.
    pub fn tids_of(&mut self, word: &str, n: usize, timeout: Duration) -> Result<Vec<u32>> {
        let prefix = format!("{word} tid=");
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let _ = self.proc.wait_line(Duration::from_millis(50), |_| false);
            let tids: Vec<u32> =
                self.proc.lines().iter().filter(|(_, l)| l.starts_with(&prefix)).filter_map(|(_, l)| tid_field(l)).collect();
            if tids.len() >= n {
                return Ok(tids);
            }
            if std::time::Instant::now() >= deadline {
                bail!("{DAEMON} printed {} `{word}` lines within {timeout:?}, want {n}", tids.len());
            }
        }
    }

    /// Lifts the fault: SIGUSR1 interrupts the netlink recvfrom.
    pub fn lift(&mut self) -> Result<()> {
        self.proc.signal(libc::SIGUSR1)
    }
}

/// `T` of a `word tid=T ...` line.
pub fn tid_field(line: &str) -> Option<u32> {
    line.split_whitespace().find_map(|w| w.strip_prefix("tid="))?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tids_are_read_from_lines() {
        assert_eq!(tid_field("sent tid=42 fd=8 seq=4243"), Some(42));
        assert_eq!(tid_field("ready pid=1"), None);
    }
}
