//! Netlink at the message level: what a process asked the kernel over a
//! netlink socket, and whether the kernel answered (stall pattern 5, a CNI
//! daemon blocked in `recvfrom` on AF_NETLINK).
//!
//! The kernel side captures a prefix (about 512 bytes) of each buffer a
//! process sends or receives on a netlink socket. This module turns those
//! prefixes into requests and replies:
//!
//! - [`header`] parses a buffer as a chain of `nlmsghdr`s, keeping every header
//!   that is whole even when the buffer ends early;
//! - [`attr`] walks `nlattr`s;
//! - [`names`] names protocols, message types and flags;
//! - [`genl`] maps generic netlink family ids to names, from the wire or from
//!   a dump of our own;
//! - [`dump`] reads the answer to a request of our own to the end (plegwatch's
//!   `kernel::netlink` owns the socket);
//! - [`tracker`] pairs requests with their replies per socket, and lists the
//!   requests still waiting.
//!
//! Everything here reads untrusted bytes: no parser panics, and none
//! allocates more than its input's size. Nothing here does I/O.

pub mod attr;
pub mod dump;
pub mod genl;
pub mod header;
pub mod names;
pub mod tracker;

pub use genl::GenlFamilies;
pub use header::{parse, NlHeader, NlMsg, Parsed};
pub use tracker::{Completed, Outstanding, SocketTracker, Trackers};
