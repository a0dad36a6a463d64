//! Who must answer an open request, found off the scan loop.
//!
//! A netlink request sent to a port id other than the kernel's is answered by the
//! process holding that port's socket; a D-Bus call by the owner of its destination
//! name (asked of the bus daemon), by the bus daemon when it does not say, or by the
//! peer of a peer-to-peer socket. Finding them reads `/proc` (who holds a socket:
//! every `/proc/PID/fd`), asks sock_diag and the bus daemon: blocking work, which took
//! up to 875 ms of a scan in a loaded guest when it was done on the loop. So two
//! worker threads do it ([`OffLoop`]), one for netlink and one for D-Bus (a stuck bus
//! daemon, up to [`OWNER_TIMEOUT`] a name, then delays no netlink answer); each scan
//! takes in the answers that are ready. What needs no I/O is answered at once: a
//! request to the kernel (port id 0), a call found unread in a socket at startup.
//!
//! "The bus daemon does not answer" is not a settled answer: a loaded node's daemon
//! can be slow rather than stuck (a TCG guest's took over 500 ms for the lookup's
//! connect, Hello and two calls while idle). That answer holds until the call is
//! asked about again ([`Found::settled`]), with a longer deadline
//! ([`OWNER_RETRY_TIMEOUT`]), and an owner found then replaces it.

use crate::{
    graph::{
        model::{EdgeKind, Exactness, WaitKey},
        requests::Answerer,
    },
    observe::holders::{
        bus_owner::{self, Owner},
        off_loop::{OffLoop, WorkerGone},
        owner_cache::OwnerCache,
        SocketOwners, UnixPeers,
    },
    observe::procfs,
    sources::sockets::{DbusOpen, NetlinkOpen},
};
use std::time::Duration;

/// The two workers.
pub struct RequestHolders {
    netlink: OffLoop<WaitKey, NetlinkOpen, Answerer>,
    dbus: OffLoop<WaitKey, (DbusOpen, Duration), Found>,
}

/// A worker's answer about one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// Who must answer; `None` when not found.
    pub answerer: Option<Answerer>,
    /// False when the answer may change if asked again: the bus daemon did not say who
    /// owns the name within the deadline.
    pub settled: bool,
}

impl Found {
    fn settled(answerer: Option<Answerer>) -> Self {
        Found { answerer, settled: true }
    }
}

impl RequestHolders {
    /// Starts the two worker threads.
    pub fn start() -> std::io::Result<Self> {
        let mut owners = SocketOwners::new();
        let netlink = OffLoop::start("netlink-holder", move |o: NetlinkOpen| netlink_answerer(&o, &mut owners))?;
        let mut holders = DbusHolders::default();
        let dbus = OffLoop::start("dbus-holder", move |(o, timeout): (DbusOpen, Duration)| {
            let holder = holders.holder_of(&o, timeout);
            if let DbusHolder::Unknown(why) = &holder {
                tracing::debug!(pid = o.tgid, serial = o.serial, why, "no holder for a D-Bus call");
            }
            Found { answerer: holder.answerer(), settled: holder.settled() }
        })?;
        Ok(RequestHolders { netlink, dbus })
    }

    /// Who answers the netlink request `o`: at once for a request to the kernel;
    /// otherwise `None`, and the worker is asked (once while pending).
    pub fn ask_netlink(&mut self, key: WaitKey, o: &NetlinkOpen) -> Option<Answerer> {
        if o.dst_portid == 0 {
            return Some(kernel_answerer(o));
        }
        self.netlink.ask(key, o.clone()).err().map(|WorkerGone| gone_answerer(EdgeKind::NetlinkPeer))
    }

    /// Who answers the D-Bus call `o`: at once for a call found unread at startup;
    /// otherwise `None`, and the worker is asked (once while pending), with the longer
    /// deadline when this is asking `again` after an unsettled answer.
    pub fn ask_dbus(&mut self, key: WaitKey, o: &DbusOpen, again: bool) -> Option<Found> {
        if let Some(pid) = o.holder_pid {
            return Some(Found::settled(DbusHolder::UnreadQueue { pid, name: o.destination.clone() }.answerer()));
        }
        let timeout = if again { OWNER_RETRY_TIMEOUT } else { OWNER_TIMEOUT };
        match self.dbus.ask(key, (o.clone(), timeout)) {
            Ok(_) => None,
            Err(WorkerGone) => Some(Found::settled(None)),
        }
    }

    /// The answers the workers sent back since the last call; never waits.
    pub fn answers(&mut self) -> Vec<(WaitKey, Found)> {
        let mut out: Vec<_> = self.netlink.answers().into_iter().map(|(k, a)| (k, Found::settled(Some(a)))).collect();
        out.extend(self.dbus.answers());
        out
    }
}

/// When a worker thread is gone (it panicked): no holder, and the evidence says why.
fn gone_answerer(kind: EdgeKind) -> Answerer {
    Answerer { pid: None, kind, exactness: Exactness::Inferred, evidence: "the holder lookup thread is gone".into() }
}

/// The process holding a netlink request's destination port id (0: the kernel), from
/// the netlink worker's socket-owner table (its /proc scan is rate-limited).
fn netlink_peer(o: &NetlinkOpen, owners: &mut SocketOwners) -> Option<u32> {
    procfs::netlink_sockets(o.tgid)
        .into_iter()
        .find(|s| s.portid == o.dst_portid && s.protocol == o.protocol)
        .and_then(|s| owners.pids_of(s.inode).into_iter().next())
}

fn netlink_answerer(o: &NetlinkOpen, owners: &mut SocketOwners) -> Answerer {
    if o.dst_portid != 0 {
        return match netlink_peer(o, owners) {
            Some(pid) => Answerer {
                pid: Some(pid),
                kind: EdgeKind::NetlinkPeer,
                exactness: Exactness::Exact,
                evidence: format!("port id {} is this process's socket (/proc/net/netlink)", o.dst_portid),
            },
            None => Answerer {
                pid: None,
                kind: EdgeKind::NetlinkPeer,
                exactness: Exactness::Exact,
                evidence: format!("no process holds port id {} now", o.dst_portid),
            },
        };
    }
    kernel_answerer(o)
}

/// A request to the kernel (port id 0): no process answers it.
fn kernel_answerer(o: &NetlinkOpen) -> Answerer {
    let evidence = if o.in_send {
        "the sender is still inside the send: the kernel has not taken the request yet"
    } else if o.before_attach {
        "blocked in a receive on a request socket since before plegwatch started"
    } else {
        "sent to the kernel (port 0); no reply matched its seq, and the sender waits in a receive"
    };
    Answerer {
        pid: None,
        kind: EdgeKind::NoReply,
        exactness: if o.before_attach { Exactness::Inferred } else { Exactness::Exact },
        evidence: evidence.into(),
    }
}

/// Who holds a D-Bus call, as the socket source finds it.
#[derive(Clone, Debug, PartialEq)]
enum DbusHolder {
    /// The call sits unread in this process's socket (found by the startup sweep).
    UnreadQueue { pid: u32, name: Option<String> },
    /// The owner of the destination name, asked of the bus daemon at `bus` (its path as
    /// the daemon bound it), reached at `reached_at` when that differs.
    NameOwner { pid: u32, name: String, bus: String, reached_at: Option<String> },
    /// The bus daemon (when known) does not answer who owns the name.
    BusDaemon { pid: Option<u32>, name: String, bus: String },
    /// The peer of a peer-to-peer connection (no bus).
    SocketPeer { pid: u32, path: Option<String> },
    /// Not found, and why.
    Unknown(String),
}

impl DbusHolder {
    /// Whether asking again could give another answer: only when the bus daemon did not
    /// say who owns a name. A call to the bus itself (`org.freedesktop.DBus`) is the
    /// daemon's to answer, and settled.
    fn settled(&self) -> bool {
        !matches!(self, DbusHolder::BusDaemon { name, .. } if name != BUS_NAME)
    }

    /// The holder as the graph's request resolver takes it: who must answer, and the
    /// evidence (the bus and the name it was asked about).
    fn answerer(&self) -> Option<Answerer> {
        let (pid, kind, exactness, evidence) = match self {
            DbusHolder::UnreadQueue { pid, name } => (
                *pid,
                EdgeKind::DbusOwner,
                Exactness::Exact,
                format!("the call to {} sits unread in this process's socket", name.as_deref().unwrap_or("it")),
            ),
            DbusHolder::NameOwner { pid, name, bus, reached_at } => (
                *pid,
                EdgeKind::DbusOwner,
                Exactness::Exact,
                match reached_at {
                    Some(at) => format!("owner of {name} on the bus {bus}, asked at {at} (GetConnectionUnixProcessID)"),
                    None => format!("owner of {name} on the bus {bus} (GetConnectionUnixProcessID)"),
                },
            ),
            DbusHolder::BusDaemon { pid, name, bus } => {
                ((*pid)?, EdgeKind::DbusOwner, Exactness::Inferred, format!("the bus daemon of {bus} does not answer who owns {name}"))
            }
            DbusHolder::SocketPeer { pid, path } => (
                *pid,
                EdgeKind::UnixPeer,
                Exactness::Exact,
                format!(
                    "the peer of a peer-to-peer D-Bus socket{} (sock_diag)",
                    path.as_ref().map(|p| format!(" at {p}")).unwrap_or_default()
                ),
            ),
            DbusHolder::Unknown(_) => return None,
        };
        Some(Answerer { pid: Some(pid), kind, exactness, evidence })
    }
}

/// The bus daemon's own name: a call to it is held by the daemon.
const BUS_NAME: &str = "org.freedesktop.DBus";

/// How long the bus daemon gets to say who owns a name, the first time it is asked
/// about a call. A stuck daemon costs the D-Bus worker this much per name (the answer
/// is kept for a while, [`crate::observe::holders::owner_cache`]); asked from 200 ms
/// into a call, the answer is in before the call's 2 s warn line.
pub const OWNER_TIMEOUT: Duration = Duration::from_millis(1000);
/// The deadline when asking again about a call the daemon did not answer for.
pub const OWNER_RETRY_TIMEOUT: Duration = Duration::from_millis(2000);

/// Finds who holds a D-Bus call: the owner of its destination, asked of the
/// bus daemon; the daemon itself when it does not answer; the socket's peer
/// for a peer-to-peer connection (no bus).
/// Owned by the D-Bus worker thread; every method may block.
#[derive(Default)]
struct DbusHolders {
    peers: UnixPeers,
    owners: SocketOwners,
    /// Name owners, as the bus daemon said.
    names: OwnerCache,
}

impl DbusHolders {
    fn holder_of(&mut self, o: &DbusOpen, timeout: Duration) -> DbusHolder {
        if let Some(pid) = o.holder_pid {
            // Found queued unread in this process's socket.
            return DbusHolder::UnreadQueue { pid, name: o.destination.clone() };
        }
        let inode = std::fs::read_link(format!("/proc/{}/fd/{}", o.tgid, o.fd))
            .ok()
            .and_then(|l| crate::observe::holders::unix_peer::parse_socket_link(l.as_os_str().as_encoded_bytes()));
        let peer = inode.and_then(|i| self.peers.peer_of(i));
        let daemon = |me: &mut Self| -> Option<u32> {
            let p = peer.as_ref()?;
            me.owners.pids_of(p.peer_inode).into_iter().next()
        };
        let bus_path = peer.as_ref().and_then(|p| p.path().map(String::from));
        let Some(name) = o.destination.clone() else {
            // No destination: a peer-to-peer connection; the peer answers.
            return match daemon(self) {
                Some(pid) => DbusHolder::SocketPeer { pid, path: bus_path },
                None => DbusHolder::Unknown("no destination and no socket peer found".into()),
            };
        };
        let Some(bus) = bus_path else {
            return DbusHolder::Unknown(format!("the bus socket's path is unknown (call to {name})"));
        };
        // The path is the daemon's: reach it in the daemon's mount namespace.
        let daemon_pid = daemon(self);
        let same_ns = daemon_pid.is_none_or(bus_owner::in_my_mount_ns);
        let Some(reach) = bus_owner::reachable_bus_path(&bus, daemon_pid, same_ns) else {
            return DbusHolder::Unknown(format!(
                "the bus daemon of {bus} is in another mount namespace and /proc/PID/root plus the path is too long for a socket address"
            ));
        };
        let owner = if name == BUS_NAME {
            Owner::BusNotAnswering
        } else {
            self.names.get(&reach, &name, |path, name| bus_owner::owner_of(path, name, timeout))
        };
        match owner {
            Owner::Pid(pid) => {
                let reached_at = (reach != bus).then_some(reach);
                DbusHolder::NameOwner { pid, name, bus, reached_at }
            }
            Owner::BusNotAnswering => DbusHolder::BusDaemon { pid: daemon_pid, name, bus },
            Owner::Unknown(why) => DbusHolder::Unknown(format!("{why} (owner of {name} on {bus})")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_daemon_that_did_not_say_who_owns_a_name_is_asked_again() {
        let daemon = |name: &str| DbusHolder::BusDaemon { pid: Some(7), name: name.into(), bus: "/bus".into() };
        assert!(!daemon("com.example.Frozen").settled(), "the daemon may only be slow: ask again");
        assert!(daemon(BUS_NAME).settled(), "a call to the bus itself is the daemon's");
        let owner = DbusHolder::NameOwner { pid: 9, name: "com.example.Frozen".into(), bus: "/bus".into(), reached_at: None };
        assert!(owner.settled());
        assert!(DbusHolder::Unknown("no peer".into()).settled());
        let a = daemon("com.example.Frozen").answerer().expect("an answerer");
        assert_eq!((a.pid, a.exactness), (Some(7), Exactness::Inferred));
    }
}
