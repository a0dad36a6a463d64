//! Who is on the other end of a wait: the peer of a unix socket and the
//! processes that hold it (what `ss -xp` shows), so that a call stuck on
//! `/run/dbus/system_bus_socket` is blamed on dbus-daemon, or on systemd for
//! `/run/systemd/private`.

pub mod bus_owner;
pub mod off_loop;
pub mod owner_cache;
pub mod unix_peer;

pub use unix_peer::{PeerInfo, SocketOwners, UnixPeers, UnixSocketInfo};

/// Errors of the lookups that ask the kernel.
#[derive(Debug, thiserror::Error)]
pub enum HolderError {
    #[error("sock_diag (NETLINK_SOCK_DIAG) {what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    #[error("sock_diag (NETLINK_SOCK_DIAG) unix request: kernel said {0}")]
    Kernel(std::io::Error),
    #[error("sock_diag (NETLINK_SOCK_DIAG) unix dump: no NLMSG_DONE after {0} messages")]
    Unfinished(usize),
}
