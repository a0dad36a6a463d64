//! Sources of open waits: each reads the kernel's maps and events (through
//! [`crate::kernel`]) and describes what is waiting right now as typed open
//! waits and facts for the graph.
//!
//! - `syscall_waits`, with `inflight`, `ended`, `sweep`, `detail`: the kernel waits
//!   (umount, sync, fsync…), their ends, those that began before attach, and their
//!   details;
//! - `sockets`, `reqwatch`, `dbus_sweep`: netlink and D-Bus requests;
//! - `ttrpc`: containerd's ttrpc requests to its shims, outstanding by stream id;
//! - `gowatch`: Go calls at uprobes (containerd, shims, runc, kubelet);
//! - `children`: parents blocked in `wait4`/`waitid`;
//! - `parked`: threads parked where no probe sees them (unix receives, futexes), sampled from `/proc`;
//! - `devices`, `offcpu`, `stats`: per-device block I/O, off-CPU stacks and
//!   per-syscall counts;
//! - `decorate`: what a `stall` event gets on its way out (pod, user stack, off-CPU).
//!
//! No source prints or takes a sink: each call hands its events back in a
//! `Vec<Event>`, which the scheduler (`crate::engine`) passes on in order.

pub mod children;
pub mod dbus_sweep;
pub mod decorate;
pub mod detail;
pub mod devices;
pub mod ended;
pub mod gowatch;
pub mod inflight;
pub mod offcpu;
pub mod offcpu_prune;
pub mod on_cpu;
pub mod parked;
pub mod request_holders;
pub mod reqwatch;
pub mod sockets;
pub mod stats;
pub mod sweep;
pub mod syscall_waits;
pub mod ttrpc;
