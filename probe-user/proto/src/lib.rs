//! Pure parsers of what the probes capture and of the binaries they attach to:
//! D-Bus, netlink and ttrpc frame headers (truncated captures included), and Go's
//! symbol tables in stripped binaries. Bytes in, values out: no I/O (the
//! callers read files and sockets and hand the bytes over); no dependency on
//! the rest of the crate.

pub mod dbus;
pub mod gosym;
pub mod netlink;
pub mod ttrpc;
