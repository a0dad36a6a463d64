//! Harness for plegwatch's privileged scenario tests.
//!
//! Each scenario in `tests/` causes a real stall itself (dirty pages on a loop-mounted ext4
//! whose writes are throttled through blkio), with a thread id it knows, and checks what
//! `plegwatch watch --json` printed about it. Everything a scenario sets up is an RAII guard
//! that undoes itself on drop, also when the test panics:
//!
//! - [`LoopFs`]: a sparse image, its loop device and the ext4 mounted from it;
//! - [`Mount`]: any mount (a tmpfs, or the one inside a [`LoopFs`]);
//! - [`WriteThrottle`]: a `blkio.throttle.write_bps_device` rule;
//! - [`Plegwatch`]: the `plegwatch` process, its parsed stdout and its stderr;
//! - [`child::Proc`]: a child process (a netlink or D-Bus client, `ip monitor`, a daemon)
//!   whose stdout lines are read and stamped, killed by PID;
//! - [`netlink::NetNs`]: a throwaway network namespace;
//! - [`dbus::PrivateBus`], [`dbus::FrozenService`] and [`dbus::BusMonitor`]: a private
//!   `dbus-daemon` in a temp dir, a service on it frozen with SIGSTOP, and a `dbus-monitor`
//!   timing every message to and from it;
//! - [`containerd`]: a private containerd (Debian's 1.6.20, or the 1.7.34 and 2.3.4 release
//!   builds, each with its shim) with runc (1.1.5 or 1.4.3), locally built busybox images, a CRI client and a relist driver standing in for kubelet, the
//!   containerd#9770 test bed, and a `runc update` frozen with SIGSTOP under
//!   `UpdateContainerResources`;
//! - [`gofixture::FakeKubelet`]: a stripped Go test fixture (not kubelet) that carries
//!   kubelet's relist symbol;
//! - [`terway`]: two C fixtures standing in for Terway (a CNI daemon stuck in a netlink
//!   request under its mutex, a CNI plugin waiting on it over a unix socket), run through
//!   a private containerd's own CNI invocation;
//! - [`canary`]: `plegwatch daemon`, a real Prometheus scraping it and a real
//!   node-problem-detector running `plegwatch check`, all on loopback ports of their own;
//! - [`chromium`]: headless Chromium opening a page: a screenshot, its DOM, its console errors;
//! - [`tmux::Tmux`]: a program on a real terminal (a detached tmux session of its own),
//!   whose screen is read with `capture-pane`.
//!
//! Declare guards in the order they are set up: Rust drops locals in reverse, so the throttle
//! goes before the umount that would otherwise crawl through it, and plegwatch goes first.
//!
//! The tests need root, and those that run plegwatch need `PLEGWATCH_BIN` (see
//! [`preflight`]); the containerd baselines check their own needs
//! (`containerd::require`). `cargo xtask test` provides both and runs them with
//! `--test-threads=1`.

pub mod bpfmap;
pub mod canary;
pub mod child;
pub mod chromium;
pub mod containerd;
pub mod crio;
pub mod dbus;
pub mod dirty;
pub mod events;
pub mod flood;
pub mod gofixture;
pub mod incidents;
pub mod loopfs;
pub mod memscan;
pub mod mount;
pub mod namespaces;
pub mod netlink;
pub mod plegwatch;
pub mod preflight;
pub mod stall;
pub mod sys;
pub mod terway;
pub mod throttle;
pub mod timing;
pub mod tmux;
pub mod variants;

pub use events::Event;
pub use loopfs::LoopFs;
pub use mount::Mount;
pub use plegwatch::Plegwatch;
pub use sys::{gettid, DevNum};
pub use throttle::WriteThrottle;
