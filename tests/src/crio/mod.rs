//! A real CRI-O for the CRI-O scenarios: the release build of 1.35.6 and its `pinns` in
//! [`shared_bin`] (`../shared/bin/README.md` says how they were built), Debian's conmon
//! 2.1.6, and an OCI runtime behind `rt-wrap` ([`OciRuntime`]): Debian's runc 1.1.5, or
//! Debian's crun 1.8.1 where the cgroups are unified (v2). On this host's hybrid cgroup v1
//! crun runs nothing ("cgroups in hybrid mode not supported"). CRI-O 1.35.6 writes
//! `ociVersion` 1.3.0 into its bundles, which crun 1.8.1 refuses ("unknown version
//! specified": it takes 1.0.x only) and runc 1.1.5 takes as 1.0.2: `rt-wrap` writes 1.0.2
//! into each bundle it is handed, for both, and changes nothing else the runtime does.
//!
//! Everything lives under one temp dir: the config (`crio.conf`: cgroupfs, overlay
//! storage, its own socket, NRI off), the storage, the runtime's state and a one-image-set
//! registry (`registry.py` on 127.0.0.1: CRI-O has no image import, it pulls) serving the
//! same busybox images the containerd scenarios import. Outside it, CRI-O's image library
//! keeps a cache at `/var/lib/containers/cache/blob-info-cache-v1.sqlite` (no option moves it).
//!
//! Fault hooks: [`Crio::stop_next_update`] makes the next `update` stop itself in `rt-wrap`
//! (SIGSTOP) before the runtime runs, as a hung runtime would; [`Crio::continue_stopped`] lifts it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::json;

use crate::containerd::cri::Cri;
use crate::containerd::image::{busybox_layer, digest};
use crate::containerd::procs;
use crate::containerd::version::shared_bin;

/// The CRI-O release the scenarios run.
pub const CRIO_BIN: &str = "crio-1.35.6";
/// Its namespace pinner, from the same build.
pub const PINNS_BIN: &str = "pinns-1.35.6";
/// The monitor CRI-O starts for each container (Debian's `conmon`).
pub const CONMON: &str = "/usr/bin/conmon";
/// The workload image, as pulled from the scenario's registry (its port is added).
pub const BUSYBOX_REPO: &str = "local/busybox:1";
/// The pod sandbox (infra) image: an idle shell that exits on SIGTERM, its `Cmd` (`pause_command = ""`).
pub const PAUSE_REPO: &str = "local/pause:1";

pub mod update_stall;

const CONFIG: &str = include_str!("crio.conf");
const RT_WRAP: &str = include_str!("rt-wrap");
const REGISTRY: &str = include_str!("registry.py");
const NRI_PLUGIN: &str = include_str!("nri_plugin.py");

/// How a [`Crio`] is set up.
#[derive(Debug, Default)]
pub struct Setup {
    /// Its storage root (a dir it makes), else in its temp dir.
    pub root: Option<PathBuf>,
    /// Run in the mount namespace of this process (a [`NodeRun`]'s holder), with the
    /// systemd cgroup manager: CRI-O and the runtime it runs talk to the systemd on that
    /// namespace's system bus. Else cgroupfs, in this process's namespace.
    ///
    /// [`NodeRun`]: crate::containerd::systemd_dbus::NodeRun
    pub systemd_ns: Option<u32>,
    /// The OCI runtime behind `rt-wrap`.
    pub runtime: OciRuntime,
    /// NRI on (CRI-O's default; off in the other scenarios), its socket at
    /// [`Crio::nri_socket`], no plugin started by CRI-O.
    pub nri: bool,
}

/// The OCI runtime CRI-O runs, behind `rt-wrap`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OciRuntime {
    /// Debian's runc 1.1.5.
    #[default]
    Runc,
    /// Debian's crun 1.8.1 (CRI-O's default runtime): cgroup v2 only here.
    Crun,
}

impl OciRuntime {
    /// crun where this node's cgroups are unified (v2: the guests, most nodes today), runc
    /// on a hybrid cgroup v1 host (this one), where crun 1.8.1 runs no container.
    pub fn native() -> Self {
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            Self::Crun
        } else {
            Self::Runc
        }
    }

    /// Its name: CRI-O's runtime handler and the binary's file name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Runc => "runc",
            Self::Crun => "crun",
        }
    }

    /// Where Debian installs it.
    pub fn path(self) -> &'static str {
        match self {
            Self::Runc => "/usr/sbin/runc",
            Self::Crun => "/usr/bin/crun",
        }
    }
}

/// A running CRI-O with its registry. Dropping it stops every pod, CRI-O and the registry,
/// and removes what they left (mounts first).
pub struct Crio {
    dir: PathBuf,
    /// Its storage root (in `dir`, or where [`Crio::start_on`] put it).
    root: PathBuf,
    daemon: Child,
    registry: Child,
    port: u16,
    cri: Cri,
    /// The mount namespace it runs in ([`Setup::systemd_ns`]), where its mounts are.
    ns: Option<u32>,
    /// A cgroup parent for pods of its own ([`Crio::cgroup_parent`]).
    cgroup_parent: String,
}

impl Crio {
    /// How long CRI-O may take to answer on its socket.
    const START_TIMEOUT: Duration = Duration::from_secs(30);

    /// The binaries the bed needs, or why it cannot run here.
    pub fn missing() -> Option<String> {
        let bin = shared_bin();
        [bin.join(CRIO_BIN), bin.join(PINNS_BIN), PathBuf::from(CONMON), PathBuf::from("/bin/busybox")]
            .into_iter()
            .chain([OciRuntime::Runc, OciRuntime::Crun].map(|r| PathBuf::from(r.path())))
            .find(|p| !p.is_file())
            .map(|p| format!("{} is missing (cargo xtask setup installs conmon, runc, crun and busybox-static)", p.display()))
    }

    /// Starts the registry and CRI-O, and pulls both images.
    pub fn start() -> Result<Self> {
        Self::start_on(None)
    }

    /// [`Crio::start`] with CRI-O's storage root at `root` (a dir it makes), else in its
    /// temp dir: a container's rootfs is then an overlay whose upper dir is on `root`'s
    /// file system.
    pub fn start_on(root: Option<PathBuf>) -> Result<Self> {
        Self::start_with(Setup { root, ..Setup::default() })
    }

    /// [`Crio::start`] as `setup` says.
    pub fn start_with(setup: Setup) -> Result<Self> {
        let Setup { root, systemd_ns, runtime, nri } = setup;
        let dir = tempfile::Builder::new().prefix("plegwatch-crio-").tempdir().context("temp dir")?.keep();
        let t = dir.clone();
        let (registry, port) = start_registry(&t)?;
        for sub in ["conf.d", "registries.d", "cni-net", "cni-bin", "pods-log", "policies", "auth", "nri-plugins", "nri-conf"] {
            std::fs::create_dir_all(t.join(sub))?;
        }
        let root = root.unwrap_or_else(|| t.join("root"));
        std::fs::create_dir_all(&root)?;
        let fill = |text: &str| {
            text.replace("@ROOT@", &root.to_string_lossy())
                .replace("@T@", &t.to_string_lossy())
                .replace("@PORT@", &port.to_string())
                .replace("@PINNS@", &shared_bin().join(PINNS_BIN).to_string_lossy())
                .replace("@CGROUP_MANAGER@", if systemd_ns.is_some() { "systemd" } else { "cgroupfs" })
                .replace("@RUNTIME@", runtime.name())
                .replace("@RUNTIME_PATH@", runtime.path())
                .replace("@NRI@", if nri { "true" } else { "false" })
        };
        std::fs::write(t.join("crio.conf"), fill(CONFIG))?;
        let wrap = t.join("rt-wrap");
        std::fs::write(&wrap, fill(RT_WRAP))?;
        std::fs::set_permissions(&wrap, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        std::fs::write(t.join("policy.json"), json!({"default": [{"type": "insecureAcceptAnything"}]}).to_string())?;
        std::fs::write(t.join("registries.conf"), format!("[[registry]]\nlocation = \"127.0.0.1:{port}\"\ninsecure = true\n"))?;
        let log = std::fs::File::create(t.join("crio.log"))?;
        let daemon = crate::containerd::daemon::in_ns(systemd_ns, shared_bin().join(CRIO_BIN))
            .arg("--config")
            .arg(t.join("crio.conf"))
            .arg("--config-dir")
            .arg(t.join("conf.d"))
            .arg("--registries-conf")
            .arg(t.join("registries.conf"))
            .arg("--registries-conf-dir")
            .arg(t.join("registries.d"))
            .current_dir(&t)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start crio")?;
        let socket = t.join("crio.sock");
        let began = Instant::now();
        let cri = loop {
            if socket.exists() {
                if let Ok(cri) = Cri::connect(&socket) {
                    if cri.version().is_ok() {
                        break cri;
                    }
                }
            }
            if began.elapsed() > Self::START_TIMEOUT {
                bail!("crio did not answer on {} within {:?}:\n{}", socket.display(), Self::START_TIMEOUT, log_tail(&t, 30));
            }
            thread::sleep(Duration::from_millis(100));
        };
        let rand: String =
            dir.file_name().map(|n| n.to_string_lossy().chars().filter(char::is_ascii_alphanumeric).collect()).unwrap_or_default();
        // A slice name's dashes are its hierarchy: one word.
        let cgroup_parent = if systemd_ns.is_some() { format!("{rand}.slice") } else { format!("/{rand}") };
        let me = Crio { dir, root, daemon, registry, port, cri, ns: systemd_ns, cgroup_parent };
        for repo in [PAUSE_REPO, BUSYBOX_REPO] {
            me.cri.pull_image(&me.image(repo)).with_context(|| format!("pull {repo}\n{}", log_tail(&t, 30)))?;
        }
        Ok(me)
    }

    /// The CRI client on CRI-O's socket.
    pub fn cri(&self) -> &Cri {
        &self.cri
    }

    /// CRI-O's process id.
    pub fn pid(&self) -> u32 {
        self.daemon.id()
    }

    /// `repo` (`local/busybox:1`) as pulled from the scenario's registry.
    pub fn image(&self, repo: &str) -> String {
        format!("127.0.0.1:{}/{repo}", self.port)
    }

    /// A cgroup parent for pods (`LinuxPodSandboxConfig.cgroup_parent`), of this bed only:
    /// `/NAME` with the cgroupfs driver, `NAME.slice` with systemd's. Its cgroups are
    /// removed on drop. (Pods given none go to CRI-O's default place.)
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// A host-network pod `name` (namespace `plegwatch`) under `cgroup_parent` ("" for
    /// CRI-O's default), with a pod-wide PID namespace as kubelet asks by default (and
    /// as [`container`](crate::containerd::cri::container)'s config asks): CRI-O runs an
    /// infra container for it.
    pub fn pod_config(&self, name: &str, cgroup_parent: &str) -> Result<k8s_cri::v1::PodSandboxConfig> {
        let mut sandbox = crate::containerd::cri::host_network_pod(name, cgroup_parent, &self.dir.join("pods-log"))?;
        if let Some(ns) = sandbox.linux.as_mut().and_then(|l| l.security_context.as_mut()).and_then(|c| c.namespace_options.as_mut()) {
            ns.pid = k8s_cri::v1::NamespaceMode::Pod as i32;
        }
        Ok(sandbox)
    }

    /// `plegwatch watch --warn WARN` with this CRI-O as its runtime endpoint, ready, and
    /// its `target` line for this CRI-O's process saying `probed`.
    pub fn watched(&self, warn: Duration) -> Result<crate::Plegwatch> {
        let endpoint = format!("unix://{}", self.socket().display());
        let warn = format!("{}ms", warn.as_millis());
        let mut plegwatch = crate::Plegwatch::start(&["--warn", &warn, "--runtime-endpoint", &endpoint])?;
        plegwatch.wait_ready(crate::plegwatch::READY_TIMEOUT)?;
        let pid = u64::from(self.pid());
        let probed = plegwatch
            .wait_for(Duration::from_secs(30), |e| e.is("target") && e.str("/target") == Some("crio") && e.u64("/pid") == Some(pid));
        let probed = probed.with_context(|| format!("no target line for crio pid {pid}"))?;
        anyhow::ensure!(probed.str("/status") == Some("probed"), "crio was not probed: {}", probed.json);
        Ok(plegwatch)
    }

    /// CRI-O's NRI socket ([`Setup::nri`]).
    pub fn nri_socket(&self) -> PathBuf {
        self.dir.join("nri.sock")
    }

    /// An external NRI plugin (`nri_plugin.py`) connected to [`Crio::nri_socket`], once it
    /// says CRI-O registered it: CRI-O then configures it and, under its NRI lock,
    /// synchronizes it with every pod and container. Its lines: `registered`, `call
    /// METHOD` per call CRI-O makes to it.
    pub fn start_nri_plugin(&self) -> Result<crate::child::Proc> {
        let script = self.dir.join("nri_plugin.py");
        std::fs::write(&script, NRI_PLUGIN).with_context(|| format!("write {}", script.display()))?;
        let mut cmd = crate::containerd::daemon::in_ns(self.ns, "/usr/bin/python3");
        let mut plugin = crate::child::Proc::spawn("NRI plugin", cmd.arg(&script).arg(self.nri_socket()))?;
        let registered =
            plugin.wait_line(Duration::from_secs(10), |l| l == "registered" || l.starts_with("error") || l.starts_with("closed"));
        anyhow::ensure!(
            registered.as_ref().is_some_and(|(_, l)| l == "registered"),
            "the NRI plugin was not registered: {registered:?}\n{}",
            self.log_tail(30)
        );
        Ok(plugin)
    }

    /// The temp dir everything lives in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// CRI-O's CRI socket.
    pub fn socket(&self) -> PathBuf {
        self.dir.join("crio.sock")
    }

    /// The conmons of this CRI-O's containers (a conmon leaves crio's tree when it
    /// daemonizes): those whose arguments name paths under the bed's dir.
    pub fn conmons(&self) -> Vec<u32> {
        let dir = self.dir.to_string_lossy();
        procs::pids()
            .into_iter()
            .filter(|&pid| procs::comm(pid).is_some_and(|c| c == "conmon"))
            .filter(|&pid| procs::cmdline(pid).is_some_and(|argv| argv.iter().any(|a| a.contains(dir.as_ref()))))
            .collect()
    }

    /// The next `update` CRI-O runs stops itself in `rt-wrap`, before the runtime is exec'd.
    pub fn stop_next_update(&self) -> Result<()> {
        std::fs::write(self.dir().join("stop-update"), b"").context("stop-update")
    }

    /// The runtime wrappers a fault hook stopped: CRI-O's children named `rt-wrap` in state T.
    pub fn stopped_runtimes(&self) -> Vec<u32> {
        procs::stopped_children(self.pid(), "rt-wrap")
    }

    /// Removes the hook and continues every runtime it stopped.
    pub fn continue_stopped(&self) {
        let _ = std::fs::remove_file(self.dir().join("stop-update"));
        for pid in self.stopped_runtimes() {
            procs::signal_child(pid, self.pid(), "rt-wrap", libc::SIGCONT);
        }
    }

    /// The last `n` lines of CRI-O's log.
    pub fn log_tail(&self, n: usize) -> String {
        log_tail(self.dir(), n)
    }
}

impl Drop for Crio {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("{}", self.log_tail(60));
        }
        self.continue_stopped();
        let cri = self.cri.with_timeout(Duration::from_secs(20));
        if let Ok(pods) = cri.list_pod_sandbox() {
            for p in pods {
                if let Err(e) = cri.stop_pod_sandbox(&p.id).and_then(|_| cri.remove_pod_sandbox(&p.id)) {
                    eprintln!("cleanup: pod {}: {e:#}", p.id);
                }
            }
        }
        // SAFETY: kill(2) on the crio this bed started.
        unsafe { libc::kill(self.daemon.id() as libc::pid_t, libc::SIGTERM) };
        let began = Instant::now();
        while matches!(self.daemon.try_wait(), Ok(None)) && began.elapsed() < Duration::from_secs(10) {
            thread::sleep(Duration::from_millis(50));
        }
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        let _ = self.registry.kill();
        let _ = self.registry.wait();
        crate::containerd::daemon::remove_cgroups_named(&self.cgroup_parent);
        // The storage root's mounts first, where it is outside the temp dir.
        if !self.root.starts_with(&self.dir) && !crate::containerd::daemon::unmount_under(&self.root, self.ns) {
            eprintln!("cleanup: mounts remain under {}", self.root.display());
        }
        if crate::containerd::daemon::unmount_under(&self.dir, self.ns) {
            let _ = std::fs::remove_dir_all(&self.dir);
        } else {
            eprintln!("cleanup: mounts remain under {}; leaving its files in place", self.dir.display());
        }
    }
}

/// Writes the images' blobs and manifests under `t/registry` and starts `registry.py` on
/// them; returns it and its port.
fn start_registry(t: &Path) -> Result<(Child, u16)> {
    let root = t.join("registry");
    let blobs = root.join("blobs/sha256");
    std::fs::create_dir_all(&blobs)?;
    let layer = busybox_layer()?;
    // As a pid namespace's init, a plain `sleep` ignores SIGTERM and every stop waits out
    // its grace period (30 s a pod); a shell that traps it exits at once.
    let idle = ["sh", "-c", "trap 'exit 0' TERM; sleep 2147483647 & wait"];
    for (repo, argv) in [(PAUSE_REPO, idle), (BUSYBOX_REPO, idle)] {
        let config = serde_json::to_vec(&json!({
            "architecture": "amd64",
            "os": "linux",
            "config": { "Env": ["PATH=/bin"], "Cmd": argv, "WorkingDir": "/" },
            "rootfs": { "type": "layers", "diff_ids": [digest(&layer)] },
        }))?;
        let manifest = serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": digest(&config), "size": config.len() },
            "layers": [{ "mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest(&layer), "size": layer.len() }],
        }))?;
        for blob in [&layer, &config, &manifest] {
            std::fs::write(blobs.join(digest(blob).trim_start_matches("sha256:")), blob)?;
        }
        let (name, tag) = repo.rsplit_once(':').context("repo:tag")?;
        let dir = root.join("manifests").join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(tag), &manifest)?;
    }
    let script = t.join("registry.py");
    std::fs::write(&script, REGISTRY)?;
    let log = std::fs::File::create(t.join("registry.log"))?;
    let mut child = Command::new("python3")
        .arg(&script)
        .arg(&root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .context("start the registry")?;
    let out = child.stdout.take().context("registry stdout")?;
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).context("the registry's port")?;
    let port = line.trim().parse().with_context(|| format!("the registry printed {line:?}, not a port"))?;
    Ok((child, port))
}

fn log_tail(t: &Path, n: usize) -> String {
    let log = std::fs::read_to_string(t.join("crio.log")).unwrap_or_default();
    let lines: Vec<&str> = log.lines().collect();
    format!("crio log (last {n} lines):\n{}", lines[lines.len().saturating_sub(n)..].join("\n"))
}
