//! plegwatch: catches the waits that stall kubelet's PLEG while they are still
//! in flight, and says who holds them.
//!
//! The binary is a thin shell over this library, so every piece of logic here
//! can be unit-tested without root.

// The data flows down this list: the kernel (probes, maps) and pure parsers,
// cached /proc and socket lookups, the sources of open waits, the wait-for
// graph and its incidents, the typed events, and the sinks that print them.
// `engine` (the scheduler) runs the loop; `cli` and `doctor` are on top.
// `architecture` checks the `use` lines: no cycles, the graph never reaches a
// source or the kernel, no source takes a sink, a sink never calls back into
// the engine, only `cli` and `sinks` print, and the pure parsers (`proto`) do
// no I/O.
pub mod kernel;
/// The pure parsers (crate `plegwatch-proto`, in `probe-user/proto/`).
pub use plegwatch_proto as proto;
pub mod cli;
pub mod doctor;
pub mod engine;
pub mod events;
pub mod export;
pub mod graph;
pub mod observe;
pub mod sinks;
pub mod sources;

// Shared vocabulary, imported by any of the above.
pub mod clock;
pub mod durations;
pub mod heap;
pub mod latency;
pub mod levels;
pub mod logging;
pub mod style;
pub mod syscalls;

#[cfg(test)]
mod architecture;
