//! plegwatch: catches the waits that stall kubelet's PLEG while they are still
//! in flight, and says who holds them.
//!
//! The binary is a thin shell over this library, so every piece of logic here
//! can be unit-tested without root.

pub mod btf;
pub mod cli;
pub mod clock;
pub mod collector;
pub mod dbus;
pub mod dbus_sweep;
pub mod detail;
pub mod devices;
pub mod doctor;
pub mod durations;
pub mod events;
pub mod ended;
pub mod gosym;
pub mod gowatch;
pub mod graph;
pub mod holders;
pub mod inflight;
#[cfg(test)]
mod layers;
pub mod latency;
pub mod levels;
pub mod loader;
pub mod logging;
pub mod mounts;
pub mod netlink;
pub mod observe;
pub mod offcpu;
pub mod probes;
pub mod reqwatch;
pub mod sinks;
pub mod procfs;
pub mod sockets;
pub mod stats;
pub mod sweep;
pub mod syscalls;
pub mod ttrpc;
