//! A private `containerd` of a given [`Version`] (Debian's 1.6.20, or a 1.7 or 2.x release
//! build) with its own config, `root`, `state`, socket and bin dir.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};

use super::cri::Cri;
use super::procs::{self, Shim};
use super::version::{BinName, Binaries, ConfigFormat, ContainerdRelease, Version};
use super::K8S_NAMESPACE;
use crate::sys::run;

/// Where the data that the scenarios make slow goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placement {
    /// Everything in the daemon's temp dir.
    TempDir,
    /// containerd's whole `root` (content store, bbolt metadata, snapshots) in a new dir
    /// under this one, e.g. a [`crate::LoopFs`] mount point.
    RootUnder(PathBuf),
    /// Only the overlayfs snapshotter's `root_path` (the containers' rootfs layers and their
    /// writable upper dirs) in a new dir under this one.
    SnapshotsUnder(PathBuf),
}

/// What the daemon's shims run as `runc` (the runc runtime's `BinaryName` option).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Runc {
    /// The `runc` in `PATH`.
    #[default]
    Real,
    /// A shell script named `runc` (so its comm is `runc`) in a dir of the daemon's own,
    /// which stops itself with SIGSTOP before it runs the real runc for this subcommand
    /// (e.g. `"update"`), and runs it at once for every other. The stopped process is a
    /// child of the shim, in state `T`, with the runc command line it was given; SIGCONT
    /// lets it `exec` the real runc with those arguments. [`Containerd::continue_stopped_runc`]
    /// does that for all of them, and so does dropping the daemon.
    StopBefore(&'static str),
}

/// runc's systemd cgroup driver (the runc runtime's `SystemdCgroup = true`), with containerd,
/// its shims and their runc in the mount namespace of process `ns_pid`, where `/run` holds a
/// `systemd/system` dir and the system bus socket the test serves
/// ([`super::systemd_dbus::NodeRun`]). The pods' cgroup parent is then a systemd slice
/// (`plegwatchXXXX.slice`, which runc expands to `/plegwatchXXXX.slice`), and containerd 1.6
/// passes runc `SLICE:cri-containerd:ID` cgroup paths (so do 1.7 and 2.3: the scopes are
/// `cri-containerd-ID.scope` on all three).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SystemdCgroups {
    pub ns_pid: u32,
}

/// A running `containerd --config FILE` whose every path is its own: a temp dir holds the
/// config, `root`, `state`, the gRPC socket, runc's state, the pods' log dirs, the daemon's
/// log and its bin dir; its containers go into a cgroup parent of its own.
///
/// The bin dir holds symlinks to the [`Version`]'s binaries named `containerd`,
/// `containerd-shim-runc-v2`, `ctr` and `runc`: containerd is started through it (so its comm
/// is `containerd`), with it first on its `PATH` (where containerd looks for the shim), and
/// its `runc` is the runc runtime's `BinaryName`. Nothing outside is touched except
/// `/run/containerd/s/`, where containerd 1.6 always puts shim sockets (named by a hash of
/// the daemon's socket, so they are told apart); with [`SystemdCgroups`], that is the `/run`
/// of its own mount namespace.
///
/// Dropping it stops containerd by PID (SIGTERM, then SIGKILL after
/// [`Containerd::STOP_TIMEOUT`]) and then undoes what it may have left: containers still
/// running (`runc delete --force`), its shims (found by their `-address`, killed by PID),
/// their sockets, the mounts under its dirs (lazily if need be), its cgroups and its dirs.
/// While the thread is panicking it first prints the end of the daemon's log.
///
/// Drop [`crate::containerd::Pod`]s before it (declare them after it) so that they are torn
/// down through CRI, as kubelet would.
pub struct Containerd {
    child: Child,
    dir: PathBuf,
    /// The dir made under the [`Placement`] path, if any.
    placed: Option<PathBuf>,
    root: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    config: PathBuf,
    log: PathBuf,
    runc_root: PathBuf,
    cgroup_parent: String,
    /// The `runc` wrapper of [`Runc::StopBefore`], if any.
    runc_wrapper: Option<PathBuf>,
    /// Of [`RUN_DIRS`], those that did not exist before this daemon started.
    new_run_dirs: Vec<&'static str>,
    /// The mount namespace it runs in ([`SystemdCgroups`]), if not this process's.
    ns_pid: Option<u32>,
    version: Version,
    /// The private bin dir, first on the daemon's `PATH`.
    bin_dir: PathBuf,
    /// The release binaries the bin dir links to.
    binaries: Binaries,
    started: Instant,
}

/// Where containerd 1.6 puts shim sockets whatever its config says; removed on drop if this
/// daemon made them and they are empty.
const RUN_DIRS: [&str; 2] = ["/run/containerd", "/run/containerd/s"];

impl Containerd {
    /// How long containerd may take to answer CRI `Version` after it is started.
    pub const START_TIMEOUT: Duration = Duration::from_secs(30);
    /// How long containerd may take to exit after SIGTERM.
    pub const STOP_TIMEOUT: Duration = Duration::from_secs(10);
    /// The pause image the CRI plugin runs in every pod sandbox.
    pub const SANDBOX_IMAGE: &'static str = super::image::PAUSE;
    const POLL: Duration = Duration::from_millis(50);

    /// Writes the config and starts Debian's containerd with the real runc; returns once its
    /// CRI service answers.
    pub fn start(placement: Placement) -> Result<Self> {
        Self::start_with(placement, Runc::Real)
    }

    /// [`Containerd::start`], with its shims running `runc` as `runc` says.
    pub fn start_with(placement: Placement, runc: Runc) -> Result<Self> {
        Self::start_version(Version::DEBIAN, placement, runc)
    }

    /// [`Containerd::start_with`] for the containerd, shim, `ctr` and runc of `version`.
    pub fn start_version(version: Version, placement: Placement, runc: Runc) -> Result<Self> {
        Self::start_inner(version, placement, runc, None)
    }

    /// [`Containerd::start_with`], with runc's systemd cgroup driver, in the mount namespace
    /// `systemd` names. Nothing of it touches this process's `/run`: its shim sockets go to
    /// `/run/containerd/s` of that namespace.
    pub fn start_systemd(placement: Placement, runc: Runc, systemd: SystemdCgroups) -> Result<Self> {
        Self::start_systemd_version(Version::DEBIAN, placement, runc, systemd)
    }

    /// [`Containerd::start_systemd`] for the containerd, shim, `ctr` and runc of `version`.
    pub fn start_systemd_version(version: Version, placement: Placement, runc: Runc, systemd: SystemdCgroups) -> Result<Self> {
        Self::start_inner(version, placement, runc, Some(systemd))
    }

    fn start_inner(version: Version, placement: Placement, runc: Runc, systemd: Option<SystemdCgroups>) -> Result<Self> {
        let ns_pid = systemd.map(|s| s.ns_pid);
        let dir = tempfile::Builder::new().prefix("plegwatch-containerd-").tempdir().context("create a temp dir for containerd")?.keep();
        let dir = dir.canonicalize()?;
        let name = dir.file_name().and_then(|n| n.to_str()).context("temp dir name")?.to_string();
        let placed = match &placement {
            Placement::TempDir => None,
            Placement::RootUnder(base) | Placement::SnapshotsUnder(base) => {
                let placed = base.canonicalize()?.join(&name);
                if let Err(e) = std::fs::create_dir(&placed) {
                    let _ = std::fs::remove_dir_all(&dir);
                    return Err(e).with_context(|| format!("create {}", placed.display()));
                }
                Some(placed)
            }
        };
        let root = match (&placement, &placed) {
            (Placement::RootUnder(_), Some(placed)) => placed.join("root"),
            _ => dir.join("root"),
        };
        let snapshots = match (&placement, &placed) {
            (Placement::SnapshotsUnder(_), Some(placed)) => Some(placed.join("snapshots")),
            _ => None,
        };
        let runc_wrapper = match runc {
            Runc::Real => None,
            Runc::StopBefore(_) => Some(dir.join("runc-wrapper").join("runc")),
        };
        let bin_dir = dir.join("bin");
        let real_runc = bin_dir.join(BinName::Runc.file_name());
        let paths = Paths {
            runc_binary: runc_wrapper.clone().unwrap_or_else(|| real_runc.clone()),
            release: version.containerd,
            root,
            state: dir.join("state"),
            socket: dir.join("containerd.sock"),
            runc_root: dir.join("state").join("runc"),
            snapshots,
            dir: dir.clone(),
            systemd_cgroup: systemd.is_some(),
        };
        let config = dir.join("config.toml");
        let log = dir.join("containerd.log");
        let cgroup_parent = match systemd {
            None => format!("/{name}"),
            // A slice name's dashes are its hierarchy: keep only the random part.
            Some(_) => {
                format!("plegwatch{}.slice", name.rsplit('-').next().unwrap_or_default().replace(|c: char| !c.is_ascii_alphanumeric(), ""))
            }
        };
        let setup = (|| -> Result<(File, Binaries)> {
            for d in ["tmp", "opt", "cni/bin", "cni/conf", "pod-logs"] {
                std::fs::create_dir_all(dir.join(d))?;
            }
            let binaries = version.link_into(&bin_dir)?;
            if let (Runc::StopBefore(subcommand), Some(wrapper)) = (runc, &runc_wrapper) {
                write_runc_wrapper(wrapper, &real_runc, subcommand)?;
            }
            std::fs::write(&config, config_toml(&paths)).with_context(|| format!("write {}", config.display()))?;
            let log_file = File::create(&log).with_context(|| format!("create {}", log.display()))?;
            Ok((log_file, binaries))
        })();
        let (log_file, binaries) = match setup {
            Ok(f) => f,
            Err(e) => {
                remove_dirs(&dir, placed.as_deref());
                return Err(e);
            }
        };
        // In a namespace of its own it makes them there, not here.
        let new_run_dirs: Vec<&'static str> = RUN_DIRS.into_iter().filter(|d| ns_pid.is_none() && !Path::new(d).exists()).collect();
        let child = spawn_containerd(ns_pid, &bin_dir, &config, log_file);
        let child = match child {
            Ok(c) => c,
            Err(e) => {
                remove_dirs(&dir, placed.as_deref());
                return Err(e).with_context(|| format!("spawn containerd ({version})"));
            }
        };
        eprintln!(
            "started {version} (pid {}) with {} ({placement:?}{})",
            child.id(),
            config.display(),
            ns_pid.map(|p| format!(", systemd cgroups, in the mount namespace of pid {p}")).unwrap_or_default()
        );
        let mut daemon = Self {
            child,
            dir,
            placed,
            root: paths.root,
            state: paths.state,
            socket: paths.socket,
            config,
            log,
            runc_root: paths.runc_root,
            cgroup_parent,
            runc_wrapper,
            new_run_dirs,
            ns_pid,
            version,
            bin_dir,
            binaries,
            started: Instant::now(),
        };
        daemon.wait_ready()?;
        Ok(daemon)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let deadline = self.started + crate::timing::scaled(Self::START_TIMEOUT);
        let mut last_error = String::from("the socket never appeared");
        loop {
            if let Some(status) = self.child.try_wait()? {
                bail!("containerd exited ({status}) before it answered on {}\n{}", self.socket.display(), self.log_tail(40));
            }
            if self.socket.exists() {
                match Cri::connect(&self.socket).map(|c| c.with_timeout(Duration::from_secs(2))).and_then(|c| c.version()) {
                    Ok(v) => {
                        eprintln!(
                            "containerd answered after {:.2}s: {} {} (CRI {})",
                            self.started.elapsed().as_secs_f64(),
                            v.runtime_name,
                            v.runtime_version,
                            v.runtime_api_version
                        );
                        return Ok(());
                    }
                    Err(e) => last_error = format!("{e:#}"),
                }
            }
            if Instant::now() >= deadline {
                bail!(
                    "containerd (pid {}) did not answer CRI Version on {} within {:?}: \
                     {last_error}\n{}",
                    self.pid(),
                    self.socket.display(),
                    crate::timing::scaled(Self::START_TIMEOUT),
                    self.log_tail(40)
                );
            }
            thread::sleep(Self::POLL);
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills containerd with SIGKILL (a crash, or systemd's restart after its stop timeout)
    /// and starts it again on the same config, dirs and socket; returns when the new
    /// process answers CRI `Version`, with when it was spawned. Its shims, and the
    /// containers under them, are not touched: they outlive containerd, which reconnects
    /// to them at start.
    pub fn restart(&mut self) -> Result<Instant> {
        let old = self.pid();
        // SAFETY: kill(2) on our own child, not yet reaped (wait below reaps it).
        if self.child.try_wait()?.is_none() {
            unsafe { libc::kill(old as libc::pid_t, libc::SIGKILL) };
        }
        let status = self.child.wait().context("reap the killed containerd")?;
        let log_file = std::fs::OpenOptions::new().append(true).open(&self.log).with_context(|| format!("open {}", self.log.display()))?;
        self.child = spawn_containerd(self.ns_pid, &self.bin_dir, &self.config, log_file)
            .with_context(|| format!("respawn containerd ({})", self.version))?;
        self.started = Instant::now();
        eprintln!("containerd pid {old} killed ({status}); restarted as pid {}", self.pid());
        let spawned = self.started;
        self.wait_ready()?;
        Ok(spawned)
    }

    /// The containerd, shim, `ctr` and runc it runs.
    pub fn version(&self) -> Version {
        self.version
    }

    /// The release binaries its bin dir links to (`/proc/PID/exe` of its processes).
    pub fn binaries(&self) -> &Binaries {
        &self.binaries
    }

    /// Its private bin dir (first on its `PATH`): `containerd`, `containerd-shim-runc-v2`,
    /// `ctr` and `runc`.
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The `runc` its shims run (through the [`Runc::StopBefore`] wrapper, if any).
    pub fn runc(&self) -> PathBuf {
        self.bin_dir.join(BinName::Runc.file_name())
    }

    /// The gRPC socket (also each shim's `-address`).
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn state(&self) -> &Path {
        &self.state
    }

    pub fn config_path(&self) -> &Path {
        &self.config
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The temp dir holding everything but a placed root or snapshots dir.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where pods' log directories go.
    pub fn pod_log_dir(&self) -> PathBuf {
        self.dir.join("pod-logs")
    }

    /// The cgroup parent to give pods (`LinuxPodSandboxConfig.cgroup_parent`), one of this
    /// daemon's own, removed on drop.
    pub fn cgroup_parent(&self) -> &str {
        &self.cgroup_parent
    }

    /// A CRI client on this daemon's socket.
    pub fn cri(&self) -> Result<Cri> {
        Cri::connect(&self.socket)
    }

    /// `ctr --address SOCKET -n k8s.io` (the `ctr` of its version), ready for more arguments.
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new(self.bin_dir.join(BinName::Ctr.file_name()));
        cmd.arg("--address").arg(&self.socket).args(["--namespace", K8S_NAMESPACE]);
        cmd
    }

    /// The `runc` wrapper its shims run ([`Runc::StopBefore`]), if any.
    pub fn runc_wrapper(&self) -> Option<&Path> {
        self.runc_wrapper.as_deref()
    }

    /// Sends SIGCONT to every `runc` stopped under this daemon's shims (a
    /// [`Runc::StopBefore`] wrapper waiting to run); returns their PIDs.
    pub fn continue_stopped_runc(&self) -> Vec<u32> {
        let mut continued = Vec::new();
        for shim in self.shims() {
            for pid in procs::stopped_children(shim.pid, "runc") {
                eprintln!("continuing runc pid {pid}, stopped under shim {}", shim.pid);
                if procs::signal_child(pid, shim.pid, "runc", libc::SIGCONT) {
                    continued.push(pid);
                }
            }
        }
        continued
    }

    /// The shims this daemon started that still run.
    pub fn shims(&self) -> Vec<Shim> {
        procs::shims_of(&self.socket)
    }

    /// The shim serving pod sandbox `sandbox_id` (CRI groups a pod's containers in the
    /// sandbox's shim).
    pub fn shim_of_pod(&self, sandbox_id: &str) -> Option<Shim> {
        self.shims().into_iter().find(|s| s.id == sandbox_id)
    }

    /// The last `lines` lines of the daemon's log, headed by its path.
    pub fn log_tail(&self, lines: usize) -> String {
        let mut text = String::new();
        if let Ok(mut f) = File::open(&self.log) {
            let len = f.metadata().map(|m| m.len()).unwrap_or(0);
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 << 10)));
            let mut buf = Vec::new();
            let _ = f.read_to_end(&mut buf);
            text = String::from_utf8_lossy(&buf).into_owned();
        }
        let all: Vec<&str> = text.lines().collect();
        format!(
            "--- last {} lines of {} ---\n{}",
            lines.min(all.len()),
            self.log.display(),
            all[all.len().saturating_sub(lines)..].join("\n")
        )
    }

    fn stop_daemon(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: kill(2) on our own child, not yet reaped (try_wait said it runs).
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Self::STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            thread::sleep(Self::POLL);
        }
        eprintln!("cleanup: containerd (pid {}) still runs {:?} after SIGTERM; SIGKILL", self.pid(), Self::STOP_TIMEOUT);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Containers runc still knows in this daemon's runc root, shims still running, their
    /// sockets: all ended and removed.
    fn clean_leftovers(&self) {
        let shims = self.shims();
        let ns_dir = self.runc_root.join(K8S_NAMESPACE);
        let leftover: Vec<String> =
            std::fs::read_dir(&ns_dir).map(|d| d.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()).unwrap_or_default();
        for id in &leftover {
            eprintln!("cleanup: runc delete --force {id}");
            // In its namespace: a systemd-driven runc needs that namespace's bus.
            if let Err(e) = run(in_ns(self.ns_pid, self.runc()).arg("--root").arg(&ns_dir).args(["delete", "--force", id])) {
                eprintln!("cleanup: {e:#}");
            }
        }
        for shim in &shims {
            // Re-read its argv just before each kill: the PID must still be our shim.
            if procs::shim(shim.pid).as_ref() != Some(shim) {
                continue;
            }
            for pid in procs::descendants(shim.pid) {
                eprintln!("cleanup: killing pid {pid}, left under shim {}", shim.pid);
                // SAFETY: kill(2) by PID; the process descends from our own shim.
                unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            }
            eprintln!("cleanup: killing shim pid {} (-id {})", shim.pid, shim.id);
            // SAFETY: kill(2) by PID of a shim whose -address is this daemon's socket.
            unsafe { libc::kill(shim.pid as libc::pid_t, libc::SIGKILL) };
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        while shims.iter().any(|s| procs::alive(s.pid)) && Instant::now() < deadline {
            thread::sleep(Self::POLL);
        }
        // In a namespace of its own, the sockets went into its `/run`, which its owner removes.
        for shim in shims.iter().filter(|_| self.ns_pid.is_none()) {
            let socket = shim_socket(&self.socket, &shim.namespace, &shim.id);
            if std::fs::symlink_metadata(&socket).is_ok_and(|m| m.file_type().is_socket()) {
                if let Err(e) = std::fs::remove_file(&socket) {
                    eprintln!("cleanup: remove {}: {e}", socket.display());
                }
            }
        }
    }

    fn remove_cgroups(&self) {
        remove_cgroups_named(&self.cgroup_parent);
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if thread::panicking() {
            eprintln!("{}", self.log_tail(60));
        }
        if self.runc_wrapper.is_some() {
            // A call waiting on a stopped runc would hold up containerd's shutdown.
            self.continue_stopped_runc();
        }
        self.stop_daemon();
        self.clean_leftovers();
        let mut clean = true;
        for dir in std::iter::once(&self.dir).chain(self.placed.as_ref()) {
            clean &= unmount_under(dir, self.ns_pid);
        }
        self.remove_cgroups();
        for d in self.new_run_dirs.iter().rev() {
            // Only if empty: another containerd may use it by now.
            let _ = std::fs::remove_dir(d);
        }
        if clean {
            remove_dirs(&self.dir, self.placed.as_deref());
        } else {
            eprintln!("cleanup: mounts remain under {}; leaving its files in place", self.dir.display());
        }
    }
}

#[derive(Clone)]
struct Paths {
    dir: PathBuf,
    /// Which containerd reads the config (its format, and its plugins).
    release: ContainerdRelease,
    /// The runc runtime's `BinaryName`: the bin dir's `runc` or the [`Runc::StopBefore`]
    /// wrapper.
    runc_binary: PathBuf,
    root: PathBuf,
    state: PathBuf,
    socket: PathBuf,
    runc_root: PathBuf,
    snapshots: Option<PathBuf>,
    /// runc's systemd cgroup driver ([`SystemdCgroups`]).
    systemd_cgroup: bool,
}

/// Spawns `BIN_DIR/containerd --config CONFIG` (in the mount namespace of `ns_pid`, if
/// any) with `bin_dir` first on its `PATH` and its output into `log_file`.
fn spawn_containerd(ns_pid: Option<u32>, bin_dir: &Path, config: &Path, log_file: File) -> Result<Child> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path =
        std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(std::env::split_paths(&path))).context("the daemon's PATH")?;
    Ok(in_ns(ns_pid, bin_dir.join(BinName::Containerd.file_name()))
        .env("PATH", path)
        .arg("--config")
        .arg(config)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone()?)
        .stderr(log_file)
        .spawn()?)
}

/// A TOML basic string (paths here hold no quotes or control characters).
fn quoted(p: &Path) -> String {
    format!("{:?}", p.to_string_lossy())
}

/// The config for the daemon's release: [`ConfigFormat::V2`] for 1.x, [`ConfigFormat::V3`]
/// for 2.x.
fn config_toml(p: &Paths) -> String {
    let common = Common::of(p);
    match p.release.config_format() {
        ConfigFormat::V2 => config_v2(p, &common),
        ConfigFormat::V3 => config_v3(p, &common),
    }
}

/// What both formats hold alike: the daemon's own dirs and socket, and no other listener.
struct Common {
    head: String,
    snapshots: String,
    options: String,
}

impl Common {
    fn of(p: &Paths) -> Self {
        let snapshots = p.snapshots.as_ref().map(|s| format!("  root_path = {}\n", quoted(s))).unwrap_or_default();
        let head = format!(
            r#"root = {root}
state = {state}
temp = {tmp}
oom_score = 0
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
]

[grpc]
  address = {socket}

[ttrpc]
  address = ""

[debug]
  address = ""
  level = "info"

[metrics]
  address = ""

[plugins."io.containerd.internal.v1.opt"]
  path = {opt}
"#,
            root = quoted(&p.root),
            state = quoted(&p.state),
            tmp = quoted(&p.dir.join("tmp")),
            socket = quoted(&p.socket),
            opt = quoted(&p.dir.join("opt")),
        );
        // The runc runtime's options (`runc.v2`'s `options.Options`), the same in both formats.
        let options = format!(
            "        Root = {runc_root}\n        SystemdCgroup = {systemd_cgroup}\n        \
             BinaryName = {binary_name}\n",
            runc_root = quoted(&p.runc_root),
            systemd_cgroup = p.systemd_cgroup,
            binary_name = quoted(&p.runc_binary),
        );
        Self { head, snapshots, options }
    }
}

/// containerd 1.6 and 1.7: `version = 2`, the CRI plugin's options all under
/// `io.containerd.grpc.v1.cri`.
fn config_v2(p: &Paths, c: &Common) -> String {
    // 1.7 has NRI (off by default); say so rather than rely on it. 1.6 has no such plugin.
    let nri = match p.release {
        ContainerdRelease::V1_6_20 => "",
        _ => {
            "\n# NRI would listen on /var/run/nri/nri.sock, the node's.\n\
              [plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true\n"
        }
    };
    format!(
        r#"# plegwatch scenario harness: a private containerd; nothing here is the node's.
version = 2
{head}
[plugins."io.containerd.snapshotter.v1.overlayfs"]
{snapshots}{nri}
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox}"
  # The pause container's oom_score_adj of -998 needs CAP_SYS_RESOURCE, which this machine
  # kind lacks (runc then fails with "can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
{options}
  # No CNI: the scenarios run host-network pods only.
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = {cni_bin}
    conf_dir = {cni_conf}
"#,
        head = c.head,
        snapshots = c.snapshots,
        sandbox = Containerd::SANDBOX_IMAGE,
        options = c.options,
        cni_bin = quoted(&p.dir.join("cni/bin")),
        cni_conf = quoted(&p.dir.join("cni/conf")),
    )
}

/// containerd 2.x: `version = 3`, the CRI options split between `io.containerd.cri.v1.images`
/// (the snapshotter, the pinned sandbox image), `io.containerd.cri.v1.runtime` (runtimes,
/// CNI, security options) and `io.containerd.grpc.v1.cri` (the streaming server), as
/// docs/cri/config.md at v2.3.4 lays them out. NRI, on by default in 2.x, is switched off
/// (it would listen on the node's `/var/run/nri/nri.sock`), and CDI (always on) is given no
/// spec dirs (it would watch the node's `/etc/cdi` and `/var/run/cdi`). containerd 2.3's own
/// format is version 4 (the `[grpc]`, `[ttrpc]` and `[debug]` tables become
/// `io.containerd.server.v1.*` plugins); it migrates version 3 at start and says so
/// ("Configuration migrated from version 3") in its log.
fn config_v3(p: &Paths, c: &Common) -> String {
    format!(
        r#"# plegwatch scenario harness: a private containerd; nothing here is the node's.
version = 3
{head}
[plugins."io.containerd.snapshotter.v1.overlayfs"]
{snapshots}
[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"

  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{sandbox}"

[plugins."io.containerd.cri.v1.runtime"]
  # The pause container's oom_score_adj of -998 needs CAP_SYS_RESOURCE, which this machine
  # kind lacks (runc then fails with "can't get final child's PID from pipe: EOF").
  restrict_oom_score_adj = true
  disable_apparmor = true
  enable_selinux = false
  # CDI is always on from 2.3 (`enable_cdi` is deprecated): give it no dirs of the node's.
  cdi_spec_dirs = []

  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"

    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
{options}
  # No CNI: the scenarios run host-network pods only.
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = [{cni_bin}]
    conf_dir = {cni_conf}

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"#,
        head = c.head,
        snapshots = c.snapshots,
        sandbox = Containerd::SANDBOX_IMAGE,
        options = c.options,
        cni_bin = quoted(&p.dir.join("cni/bin")),
        cni_conf = quoted(&p.dir.join("cni/conf")),
    )
}

/// The script of [`Runc::StopBefore`]: runs `real` with the same arguments, after stopping
/// itself (SIGSTOP) when the subcommand is `stop_before`. go-runc puts runc's global options
/// (`--root DIR`, `--log FILE`, `--log-format json`, `--systemd-cgroup`, `--rootless=...`)
/// before the subcommand; the subcommand is the first word that is neither an option nor
/// the value of one of runc's global options that take a value.
fn runc_wrapper_script(real: &Path, stop_before: &str) -> String {
    format!(
        r#"#!/bin/sh
# plegwatch scenario harness: runc for a private containerd's shims. Stops itself (SIGSTOP)
# before `runc {stop_before}`, so that the shim's call waits until the test sends SIGCONT.
sub=
takes_value=
for arg in "$@"; do
    if [ -n "$takes_value" ]; then takes_value=; continue; fi
    case "$arg" in
        --root|--log|--log-format|--criu|--rootless) takes_value=1 ;;
        -*) ;;
        *) sub=$arg; break ;;
    esac
done
if [ "$sub" = '{stop_before}' ]; then
    kill -STOP $$
fi
exec '{real}' "$@"
"#,
        real = real.display(),
    )
}

/// Writes the [`Runc::StopBefore`] wrapper at `path` (mode 0755), running `real` (the
/// daemon's bin dir's `runc`, so that the runc it execs keeps the comm `runc`).
fn write_runc_wrapper(path: &Path, real: &Path, stop_before: &str) -> Result<()> {
    let dir = path.parent().context("the runc wrapper's dir")?;
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    std::fs::write(path, runc_wrapper_script(real, stop_before)).with_context(|| format!("write {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).with_context(|| format!("chmod {}", path.display()))
}

/// Where containerd 1.6 puts the socket of the shim for (`namespace`, `id`) of the daemon on
/// `address`: `/run/containerd/s/` + hex(sha256(address/namespace/id)), whatever its state
/// dir (runtime/v2/shim/util_unix.go, `SocketAddress`).
pub fn shim_socket(address: &Path, namespace: &str, id: &str) -> PathBuf {
    let key = address.join(namespace).join(id);
    let digest = Sha256::digest(key.as_os_str().as_encoded_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Path::new("/run/containerd/s").join(hex)
}

/// `program`, run in the mount namespace of process `ns_pid` if one is given (`nsenter
/// --mount`, which execs it: the child's PID is the program's), else as it is.
pub fn in_ns(ns_pid: Option<u32>, program: impl AsRef<std::ffi::OsStr>) -> Command {
    match ns_pid {
        None => Command::new(program),
        Some(pid) => {
            let mut cmd = Command::new("nsenter");
            cmd.arg(format!("--target={pid}")).args(["--mount", "--"]).arg(program);
            cmd
        }
    }
}

/// Unmounts every mount at or under `dir` (deepest first, lazily if a plain umount fails),
/// in the mount namespace of `ns_pid` if given (the shims mount the rootfs there); whether
/// none is left. A namespace gone already has no mounts left to undo.
pub(crate) fn unmount_under(dir: &Path, ns_pid: Option<u32>) -> bool {
    if ns_pid.is_some_and(|p| !procs::alive(p)) {
        return true;
    }
    let mut targets = mounts_under(dir, ns_pid);
    targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
    for target in &targets {
        eprintln!("cleanup: unmounting {target}");
        if let Err(e) = run(in_ns(ns_pid, "umount").arg(target)) {
            eprintln!("cleanup: {e:#}; trying a lazy unmount");
            if let Err(e) = run(in_ns(ns_pid, "umount").arg("-l").arg(target)) {
                eprintln!("cleanup: {e:#}");
            }
        }
    }
    mounts_under(dir, ns_pid).is_empty()
}

/// Mount points at or under `dir`, from the `mountinfo` of this process or of `ns_pid`
/// (escapes undone).
fn mounts_under(dir: &Path, ns_pid: Option<u32>) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    let mountinfo = ns_pid.map_or("/proc/self/mountinfo".to_string(), |p| format!("/proc/{p}/mountinfo"));
    let Ok(info) = std::fs::read_to_string(mountinfo) else {
        return Vec::new();
    };
    info.lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(unescape)
        .filter(|m| m == &prefix || m.starts_with(&format!("{prefix}/")))
        .collect()
}

fn unescape(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

/// Removes a cgroup dir and the cgroups below it (rmdir only, children first).
/// Removes the cgroups named `parent` (a pod cgroup parent, `/NAME` or `NAME.slice`) in
/// every hierarchy: v2's root and each v1 controller's.
pub(crate) fn remove_cgroups_named(parent: &str) {
    let Ok(controllers) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    let name = parent.trim_start_matches('/');
    let mut bases = vec![PathBuf::from("/sys/fs/cgroup")];
    bases.extend(controllers.filter_map(|e| e.ok()).filter(|e| e.file_type().is_ok_and(|t| t.is_dir())).map(|e| e.path()));
    for base in bases {
        let dir = base.join(name);
        if dir.is_dir() {
            rmdir_tree(&dir);
        }
    }
}

fn rmdir_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                rmdir_tree(&e.path());
            }
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        eprintln!("cleanup: rmdir {}: {e}", dir.display());
    }
}

fn remove_dirs(dir: &Path, placed: Option<&Path>) {
    for d in std::iter::once(dir).chain(placed) {
        if let Err(e) = std::fs::remove_dir_all(d) {
            eprintln!("cleanup: remove {}: {e}", d.display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(release: ContainerdRelease) -> Paths {
        Paths {
            dir: "/tmp/x".into(),
            release,
            root: "/tmp/x/root".into(),
            state: "/tmp/x/state".into(),
            socket: "/tmp/x/containerd.sock".into(),
            runc_root: "/tmp/x/state/runc".into(),
            snapshots: Some("/mnt/y/snapshots".into()),
            runc_binary: "/tmp/x/bin/runc".into(),
            systemd_cgroup: false,
        }
    }

    #[test]
    fn config_names_private_paths() {
        for release in [ContainerdRelease::V1_6_20, ContainerdRelease::V1_7_34, ContainerdRelease::V2_3_4] {
            let p = paths(release);
            let toml = config_toml(&p);
            assert!(toml.contains("root = \"/tmp/x/root\""), "{toml}");
            assert!(toml.contains("address = \"/tmp/x/containerd.sock\""));
            assert!(toml.contains("root_path = \"/mnt/y/snapshots\""));
            assert!(toml.contains("restrict_oom_score_adj = true"));
            assert!(toml.contains("\"docker.io/local/pause:1\""));
            assert!(!toml.contains("/var/lib/containerd"));
            assert!(toml.contains("        SystemdCgroup = false\n        BinaryName = \"/tmp/x/bin/runc\"\n"));
            let systemd = config_toml(&Paths { systemd_cgroup: true, ..p.clone() });
            assert!(systemd.contains("        SystemdCgroup = true\n"));
            let wrapped = config_toml(&Paths { runc_binary: "/tmp/x/runc-wrapper/runc".into(), ..p });
            assert!(wrapped.contains("        BinaryName = \"/tmp/x/runc-wrapper/runc\"\n"));
        }
    }

    #[test]
    fn config_format_follows_the_release() {
        let v2 = config_toml(&paths(ContainerdRelease::V1_7_34));
        assert!(v2.contains("\nversion = 2\n"));
        assert!(v2.contains("[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]"));
        assert!(v2.contains("sandbox_image = \"docker.io/local/pause:1\""));
        assert!(v2.contains("[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true"));
        let v16 = config_toml(&paths(ContainerdRelease::V1_6_20));
        assert!(!v16.contains("nri"), "1.6 has no NRI plugin");
        let v3 = config_toml(&paths(ContainerdRelease::V2_3_4));
        assert!(v3.contains("\nversion = 3\n"));
        for section in [
            "[plugins.\"io.containerd.cri.v1.images\"]",
            "[plugins.\"io.containerd.cri.v1.images\".pinned_images]\n    sandbox = \"docker.io/local/pause:1\"",
            "[plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.runc.options]",
            "[plugins.\"io.containerd.cri.v1.runtime\".cni]\n    bin_dirs = [\"/tmp/x/cni/bin\"]",
            "[plugins.\"io.containerd.grpc.v1.cri\"]\n  stream_server_address",
            "[plugins.\"io.containerd.nri.v1.nri\"]\n  disable = true",
            "cdi_spec_dirs = []",
        ] {
            assert!(v3.contains(section), "{section} missing:\n{v3}");
        }
        assert!(!v3.contains("sandbox_image"), "a version 2 key in a version 3 config");
        assert!(!v3.contains("io.containerd.grpc.v1.cri\".containerd"));
    }

    /// Runs the wrapper script with `args` and `/bin/echo` for the real runc; returns whether
    /// it stopped itself (continuing it then), and what it printed.
    fn run_wrapper(args: &[&str]) -> (bool, String) {
        let dir = tempfile::tempdir().unwrap();
        let wrapper = dir.path().join("runc");
        std::fs::write(&wrapper, runc_wrapper_script(Path::new("/bin/echo"), "update")).unwrap();
        // Run by sh rather than exec'd: a file just written may be ETXTBSY for a while when
        // other test threads fork.
        let child = Command::new("/bin/sh").arg(&wrapper).args(args).stdout(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut stopped = false;
        while procs::alive(pid) && Instant::now() < deadline {
            if procs::state(pid) == Some('T') {
                stopped = true;
                assert!(procs::signal_child(pid, std::process::id(), "sh", libc::SIGCONT));
                break;
            }
            thread::sleep(Duration::from_millis(5));
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", out.status);
        (stopped, String::from_utf8_lossy(&out.stdout).trim_end().to_string())
    }

    #[test]
    fn runc_wrapper_stops_only_before_its_subcommand() {
        // As the shim runs it: go-runc's global options, then the subcommand.
        let update = [
            "--root",
            "/run/runc/k8s.io",
            "--log",
            "/run/b/log.json",
            "--log-format",
            "json",
            "--systemd-cgroup",
            "update",
            "--resources",
            "-",
            "abc",
        ];
        assert_eq!(run_wrapper(&update), (true, update.join(" ")));
        // A value that reads "update" is not the subcommand.
        let state = ["--root", "update", "--log-format=json", "state", "update"];
        assert_eq!(run_wrapper(&state), (false, state.join(" ")));
        assert!(!run_wrapper(&["--rootless=false", "kill", "abc", "9"]).0);
    }

    #[test]
    fn shim_socket_is_a_hash_under_run_containerd_s() {
        let s = shim_socket(Path::new("/a.sock"), "k8s.io", "id");
        assert!(s.starts_with("/run/containerd/s"));
        assert_eq!(s.file_name().unwrap().len(), 64);
    }
}
