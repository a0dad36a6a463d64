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
//!   the kernel;
//! - [`dump`] sends a request of our own and reads its answer to the end;
//! - [`tracker`] pairs requests with their replies per socket, and lists the
//!   requests still waiting.
//!
//! Everything here reads untrusted bytes: no parser panics, and none
//! allocates more than its input's size.

pub mod attr;
pub mod dump;
pub mod genl;
pub mod header;
pub mod names;
pub mod tracker;

pub use genl::GenlFamilies;
pub use header::{parse, NlHeader, NlMsg, Parsed};
pub use tracker::{Completed, Outstanding, SocketTracker, Trackers};

/// Errors of the few functions here that talk to the kernel.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink {what} on a NETLINK_{protocol} socket: {source}")]
    Io { what: &'static str, protocol: &'static str, source: std::io::Error },
    #[error("NETLINK_{protocol} request {request} failed: {source}")]
    Kernel { protocol: &'static str, request: &'static str, source: std::io::Error },
    #[error("NETLINK_{protocol} request {request}: no NLMSG_DONE after {messages} messages")]
    Unfinished { protocol: &'static str, request: &'static str, messages: usize },
}

/// How long the few kernel queries here wait for an answer: plegwatch must
/// never be the process stuck in `recvfrom` on a netlink socket.
pub const QUERY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);
