//! The event ABI shared by plegwatch's eBPF programs and its userspace collector.
//!
//! Everything that crosses the kernel/user boundary lives here: map names, the
//! layout of map values and ring-buffer records, stat slots and limits. Every
//! type is `#[repr(C)]`, `Copy`, built from fixed-width integers with explicit
//! padding, and its size is asserted at compile time so that both sides agree.
//! Numbers given to kinds never change; new kinds take new numbers.
//!
//! One module per feature, each with its map names, limits and types (all
//! re-exported here, so `plegwatch_abi::Wait` and `plegwatch_abi::maps::INFLIGHT`
//! are the paths to use):
//! - `header`: [`EventKind`] and [`EventHeader`], first in every ring record;
//! - `waits`: watched syscall waits ([`Wait`], [`WaitEnd`], [`maps`], [`globals`]);
//! - `stats`: [`Stat`] counters and the latency histogram;
//! - `sockets`: netlink and D-Bus sockets ([`SockIo`], [`sock_maps`]);
//! - `dbus_walk`: the D-Bus stream walk shared by the kernel and the tests;
//! - `ttrpc`: ttrpc frame headers ([`TtrpcIo`], [`ttrpc_walk`], [`ttrpc_maps`]);
//! - `go`: Go call timing, execs, goroutine exits ([`GoCallEnd`], [`go_maps`]);
//! - `offcpu`: D sleeps by kernel stack and kernel mutex waits ([`offcpu_maps`], [`lock_maps`]);
//! - `children`: threads blocked in `wait4`/`waitid` ([`ChildWait`], [`child_maps`]);
//! - `block`: block device I/O counters ([`DevIo`], [`block_maps`]);
//! - `record` (feature `user`): `Record::parse`, the one decoder of ring records.
#![no_std]

mod block;
mod children;
mod dbus_walk;
mod go;
mod header;
mod offcpu;
#[cfg(feature = "user")]
mod record;
mod sockets;
mod stats;
mod ttrpc;
mod waits;

pub use block::*;
pub use children::*;
pub use dbus_walk::*;
pub use go::*;
pub use header::*;
pub use offcpu::*;
#[cfg(feature = "user")]
pub use record::*;
pub use sockets::*;
pub use stats::*;
pub use ttrpc::*;
pub use waits::*;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are #[repr(C)], Copy, made of integers, with explicit padding.
    unsafe impl aya::Pod for super::Wait {}
    unsafe impl aya::Pod for super::DevIo {}
    unsafe impl aya::Pod for super::WaitEnd {}
    unsafe impl aya::Pod for super::EventHeader {}
    unsafe impl aya::Pod for super::SockClass {}
    unsafe impl aya::Pod for super::SockCall {}
    unsafe impl aya::Pod for super::OffCpuStart {}
    unsafe impl aya::Pod for super::OffCpuKey {}
    unsafe impl aya::Pod for super::OffCpuVal {}
    unsafe impl aya::Pod for super::LockWait {}
    unsafe impl aya::Pod for super::GoCallKey {}
    unsafe impl aya::Pod for super::GoCall {}
    unsafe impl aya::Pod for super::GoProc {}
    unsafe impl aya::Pod for super::GoAddrKey {}
    unsafe impl aya::Pod for super::GoArgSpec {}
    unsafe impl aya::Pod for super::TtrpcPos {}
    unsafe impl aya::Pod for super::TtrpcReqKey {}
    unsafe impl aya::Pod for super::ChildWait {}
}
