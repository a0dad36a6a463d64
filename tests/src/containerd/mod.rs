//! A test bed of real Kubernetes node components: a containerd with its own shim and `ctr`,
//! and a runc, of a [`Version`] (Debian's containerd 1.6.20 with runc 1.1.5, or the stripped
//! 1.7.34 and 2.3.4 release builds with runc 1.4.3), driven over CRI the way kubelet drives
//! it, and the containerd#9770 stall staged on it deterministically.
//!
//! - [`Version`] ([`version`]): which binaries, and which config format (`version = 2` for
//!   1.x, `version = 3` with the split CRI plugins for 2.x).
//! - [`Containerd`] ([`daemon`]): a private `containerd` with its own config, `root`, `state`,
//!   socket and bin dir (the version's binaries under the names containerd looks for) in a
//!   temp dir (its root or only its overlayfs snapshots optionally on a
//!   [`crate::LoopFs`]), its shims running the real runc or a [`Runc::StopBefore`] wrapper
//!   that freezes one runc subcommand with SIGSTOP. Dropping it stops it by PID, then cleans
//!   up after it: the shims and containers it left (found by the shims' `-address`
//!   argument), their cgroups, the mounts under its dirs, and the dirs.
//! - [`image`]: OCI image-layout archives built here from `/bin/busybox` (no registry can be
//!   reached), imported with `ctr images import`: [`image::PAUSE`] and [`image::BUSYBOX`].
//! - [`Cri`] ([`cri`]): a blocking CRI v1 client over the unix socket (tonic, on a runtime of
//!   its own), [`Pod`] (a pod sandbox removed on drop) and [`RelistDriver`], which calls
//!   `ListPodSandbox` + `ListContainers` on a period like kubelet's PLEG relist and times each
//!   call.
//! - [`procs`]: the shims of a daemon, their threads, and what `/proc` says about a thread
//!   (`syscall`, `stack`, `wchan`); [`procs::UmountWatch`] times a shim's umount2 as the
//!   kernel shows it (syscall 166 stays in `/proc/TID/syscall` through the task_work sync).
//! - [`issue9770`]: the stall itself: a container writes into its rootfs on a throttled disk
//!   and exits, the shim's rootfs umount syncs it, and an `UpdateContainerResources` issued
//!   meanwhile holds the container's status lock, so every `ListContainers` waits.
//! - [`runc_stopped`]: the same lock held by `UpdateContainerResources` while the
//!   `runc update` it starts under the shim is stopped (SIGSTOP), for as long as the test
//!   keeps it so.
//! - [`systemd_dbus`]: seed incident 002: a container start whose `runc create` (systemd
//!   cgroup driver) waits on a frozen stand-in for systemd over D-Bus, with containerd, its
//!   shims and runc in a mount namespace whose `/run` is the test's.
//! - [`bed`]: what those two beds and their scenarios share: the [`bed::Stage`] (containerd,
//!   images, pod, relist driver), the `UpdateContainerResources` they send and measure
//!   against the relists, and [`bed::Watched`], a stall staged with plegwatch looking on.
//!
//! Declare guards in the order they are set up (locals drop in reverse): the [`crate::LoopFs`]
//! first, then the [`Containerd`], the [`Cri`], [`Pod`]s and a [`RelistDriver`], and a
//! [`crate::WriteThrottle`] last, so that it is lifted before anything is torn down.
//! [`issue9770::Bed`] holds all of these in that order itself.

pub mod bed;
pub mod cri;
pub mod daemon;
pub mod image;
pub mod issue9770;
pub mod procs;
pub mod runc_stopped;
pub mod systemd_dbus;
pub mod version;

pub use cri::{Cri, Pod, RelistDriver};
pub use daemon::{Containerd, Placement, Runc, SystemdCgroups};
pub use version::Version;

/// The CRI namespace kubelet's containers live in; images must be imported into it.
pub const K8S_NAMESPACE: &str = "k8s.io";

/// The programs the bed runs on [`Version::DEBIAN`] (Debian packages containerd, runc and
/// busybox-static).
pub const TOOLS: &[&str] = &["containerd", "ctr", "containerd-shim-runc-v2", "runc"];

/// Panics unless the test runs as root and every program in [`TOOLS`] and
/// [`image::BUSYBOX_BIN`] is there. Unlike [`crate::preflight::require`] it does not ask for
/// `PLEGWATCH_BIN`: the baseline scenarios of this bed run no plegwatch.
pub fn require() {
    require_root_and_busybox();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> = TOOLS.iter().copied().filter(|tool| !std::env::split_paths(&path).any(|d| d.join(tool).is_file())).collect();
    assert!(
        missing.is_empty(),
        "not found in PATH ({}): {} (Debian packages containerd and runc; `cargo xtask setup` \
         installs them)",
        path.to_string_lossy(),
        missing.join(", ")
    );
}

/// [`require`] for a bed on `version`: panics unless root and busybox are there; then
/// whether every binary of `version` is. [`Version::DEBIAN`]'s missing fail the test as
/// [`require`] does; a release build missing is a [`crate::preflight::skip`] of `scenario`
/// (a failure under CI), naming each missing file.
pub fn require_version(version: Version, scenario: &str) -> bool {
    if version == Version::DEBIAN {
        require();
        return true;
    }
    require_root_and_busybox();
    match version.binaries() {
        Ok(_) => true,
        Err(missing) => {
            crate::preflight::skip(scenario, &missing);
            false
        }
    }
}

fn require_root_and_busybox() {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "the containerd scenarios need root (euid is {euid}): they run containerd and runc, \
         attach loop devices and mount filesystems"
    );
    assert!(std::path::Path::new(image::BUSYBOX_BIN).is_file(), "{} is missing (Debian package busybox-static)", image::BUSYBOX_BIN);
}
