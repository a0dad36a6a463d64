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
    dbus: OffLoop<WaitKey, DbusOpen, Option<Answerer>>,
}

impl RequestHolders {
    /// Starts the two worker threads.
    pub fn start() -> std::io::Result<Self> {
        let mut owners = SocketOwners::new();
        let netlink = OffLoop::start("netlink-holder", move |o: NetlinkOpen| netlink_answerer(&o, &mut owners))?;
        let mut holders = DbusHolders::default();
        let dbus = OffLoop::start("dbus-holder", move |o: DbusOpen| {
            let holder = holders.holder_of(&o);
            if let DbusHolder::Unknown(why) = &holder {
                tracing::debug!(pid = o.tgid, serial = o.serial, why, "no holder for a D-Bus call");
            }
            holder.answerer()
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
    /// otherwise `None`, and the worker is asked (once while pending).
    pub fn ask_dbus(&mut self, key: WaitKey, o: &DbusOpen) -> Option<Option<Answerer>> {
        if let Some(pid) = o.holder_pid {
            return Some(DbusHolder::UnreadQueue { pid, name: o.destination.clone() }.answerer());
        }
        match self.dbus.ask(key, o.clone()) {
            Ok(_) => None,
            Err(WorkerGone) => Some(None),
        }
    }

    /// The answers the workers sent back since the last call (none for a call whose
    /// holder was not found); never waits.
    pub fn answers(&mut self) -> Vec<(WaitKey, Option<Answerer>)> {
        let mut out: Vec<_> = self.netlink.answers().into_iter().map(|(k, a)| (k, Some(a))).collect();
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

/// How long the bus daemon gets to say who owns a name.
pub const OWNER_TIMEOUT: Duration = Duration::from_millis(500);

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

/// The blocking lookup: who owns `name` on the bus at `path`.
fn ask_owner(path: &std::path::Path, name: &str) -> Owner {
    bus_owner::owner_of(path, name, OWNER_TIMEOUT)
}

impl DbusHolders {
    fn holder_of(&mut self, o: &DbusOpen) -> DbusHolder {
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
        let owner = if name == "org.freedesktop.DBus" { Owner::BusNotAnswering } else { self.names.get(&reach, &name, ask_owner) };
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
