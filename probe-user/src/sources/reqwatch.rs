//! The request source: netlink requests left unanswered, D-Bus calls, and
//! containerd's ttrpc requests to its shims (`crate::sources::ttrpc`). It hands
//! its open requests to the graph, with who must answer each (the graph's
//! `requests` resolver makes the edges), and its events to the scheduler.
//!
//! Inputs: the kernel's `SOCK_EVENTS` records (what went through tracked
//! sockets), its `SOCK_CALLS` map (who is blocked in a receive right now), and
//! at startup a sweep of `/proc` for netlink sockets that already existed and
//! threads already blocked on them.

use crate::{
    clock::monotonic_ns,
    events::{Event, Stall, Sweep},
    graph::ttrpc::TtrpcFacts,
    graph::{
        model::{EdgeKind, Exactness, OpenWait, StartTiming, WaitKey, Who},
        requests::Answerer,
    },
    kernel::loader::{take_map, WatchError},
    levels::Thresholds,
    observe::holders::{
        bus_owner::{self, Owner},
        owner_lookups::OwnerLookups,
        SocketOwners, UnixPeers,
    },
    observe::procfs::{self, SyscallState},
    sources::dbus_sweep,
    sources::inflight::Item,
    sources::inflight::{Action, Filter, Registry},
    sources::sockets::{sock_key, DbusOpen, NetlinkOpen, Sockets},
    sources::sweep::{self, AgeClock},
    sources::ttrpc::TtrpcWatch,
    syscalls::WaitKind,
};
use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    Ebpf,
};
use plegwatch_abi::{sock_maps, ttrpc_maps, Record, SockCall, SockClass, SockIo, SockKind, TtrpcPos};
use std::{collections::HashMap, time::Duration};

/// The receive syscalls a thread blocked on a netlink reply may sit in.
const RECV_NRS: [i64; 4] = [libc::SYS_recvfrom, libc::SYS_recvmsg, libc::SYS_read, libc::SYS_readv];

pub struct ReqWatch {
    registry: Registry<NetlinkOpen>,
    dbus: Registry<DbusOpen>,
    holders: DbusHolders,
    sockets: Sockets,
    socks: BpfHashMap<MapData, u64, SockClass>,
    /// `SOCK_GEN`: each process's socket generation, stamped into the entries seeded.
    gens: BpfHashMap<MapData, u32, u32>,
    calls: BpfHashMap<MapData, u32, SockCall>,
    /// Threads found blocked in a receive on a request socket (no multicast
    /// groups) when plegwatch started: what they sent is unknown.
    swept: Vec<NetlinkOpen>,
    /// D-Bus calls found queued unread at startup.
    swept_dbus: Vec<DbusOpen>,
    /// Sockets of processes seen dead are dropped at most this often.
    last_gc_ns: u64,
    /// Every request open at the last scan, as graph nodes.
    open_waits: Vec<OpenWait>,
    /// Who answers each open request old enough to be resolved: (pid, edge
    /// kind, exactness, evidence), looked up once per request.
    answerers: HashMap<WaitKey, Option<Answerer>>,
    /// The open requests behind [`Self::open_waits`].
    last_netlink: Vec<NetlinkOpen>,
    last_dbus: Vec<DbusOpen>,
    /// ttrpc requests from containerd to its shims, by stream id.
    ttrpc: TtrpcWatch,
    /// `TTRPC_POS`: the kernel's place in each ttrpc stream, dropped with dead processes.
    ttrpc_pos: BpfHashMap<MapData, u64, TtrpcPos>,
    /// The last `SockIo` record, made whole (see [`plegwatch_abi::SockIoRecord::copy_into`]).
    scratch: Box<SockIo>,
}

/// Requests younger than this get no holder lookup (most are answered in microseconds).
const RESOLVE_AFTER_NS: u64 = 1_000_000_000;
/// A D-Bus call this old has its destination's owner asked of the bus daemon already,
/// though it is linked to it only from [`RESOLVE_AFTER_NS`]: the answer comes from
/// another thread and is taken in at a later scan, and a loaded node took over a second
/// for that (a guest's first `dbus_call` warn line went out with no holder, the holder
/// came 85 ms later). Asked this early, the answer is in long before the warn line.
const DBUS_ASK_AFTER_NS: u64 = 200_000_000;
const _: () = assert!(DBUS_ASK_AFTER_NS < RESOLVE_AFTER_NS);

impl ReqWatch {
    pub fn new(ebpf: &mut Ebpf, thresholds: Thresholds, filter: Filter) -> Result<Self, WatchError> {
        Ok(ReqWatch {
            registry: Registry::new(thresholds, filter.clone()),
            dbus: Registry::new(thresholds, filter),
            holders: DbusHolders {
                peers: UnixPeers::default(),
                owners: SocketOwners::new(),
                lookups: OwnerLookups::start(ask_owner).map_err(|e| WatchError::Io("starting the bus-owner lookup thread", e))?,
            },
            sockets: Sockets::with_families(crate::kernel::netlink::genl_families().unwrap_or_else(|e| {
                tracing::warn!("generic netlink families unknown until seen on the wire: {e}");
                Default::default()
            })),
            socks: take_map(ebpf, sock_maps::SOCKS)?,
            gens: take_map(ebpf, sock_maps::SOCK_GEN)?,
            calls: take_map(ebpf, sock_maps::SOCK_CALLS)?,
            swept: Vec::new(),
            swept_dbus: Vec::new(),
            last_gc_ns: 0,
            open_waits: Vec::new(),
            answerers: HashMap::new(),
            last_netlink: Vec::new(),
            last_dbus: Vec::new(),
            ttrpc: TtrpcWatch::default(),
            ttrpc_pos: take_map(ebpf, ttrpc_maps::TTRPC_POS)?,
            scratch: Box::new(SockIo::zeroed()),
        })
    }

    /// The startup sweep of every socket kind: netlink sockets already open and the
    /// threads already blocked on them, D-Bus calls already queued unanswered, and
    /// containerd → shim connections; what it found goes into `found`.
    pub fn seed_all(&mut self, self_tgid: u32, found: &mut Sweep) {
        (found.netlink_sockets, found.netlink_waiters) = self.seed(self_tgid);
        (found.dbus_connections, found.dbus_calls) = self.seed_dbus(self_tgid);
        found.ttrpc_connections = self.seed_ttrpc(self_tgid);
    }

    /// Learns the netlink sockets that existed before plegwatch started, tells
    /// the kernel to track them, and finds the threads already blocked on them.
    /// Returns (sockets seeded, waiters swept).
    pub fn seed(&mut self, self_tgid: u32) -> (usize, usize) {
        const BPF_NOEXIST: u64 = 1;
        // Netlink sockets by inode, per network namespace.
        let mut by_netns: HashMap<String, HashMap<u64, procfs::NetlinkSock>> = HashMap::new();
        let mut request_socks: HashMap<(u32, u32), u32> = HashMap::new();
        let mut seeded = 0;
        let Ok(procs) = std::fs::read_dir("/proc") else { return (0, 0) };
        for p in procs.flatten() {
            let Some(tgid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if tgid == self_tgid {
                continue;
            }
            let fds = procfs::socket_fds(tgid);
            if fds.is_empty() {
                continue;
            }
            let Ok(ns) = std::fs::read_link(format!("/proc/{tgid}/ns/net")) else { continue };
            let table = by_netns
                .entry(ns.to_string_lossy().into_owned())
                .or_insert_with(|| procfs::netlink_sockets(tgid).into_iter().map(|s| (s.inode, s)).collect());
            let comm = procfs::comm(tgid).unwrap_or_default();
            for (fd, inode) in fds {
                let Some(nl) = table.get(&inode) else { continue };
                let Some(gen) = self.seed_gen(tgid) else { continue };
                let class = SockClass { kind: SockKind::Netlink as u32, proto: nl.protocol, gen, _pad: 0 };
                let _ = self.socks.insert(sock_key(tgid, fd), class, BPF_NOEXIST);
                self.sockets.seed_netlink(tgid, fd, nl.protocol, comm.clone());
                if nl.groups == 0 {
                    request_socks.insert((tgid, fd), nl.protocol);
                }
                seeded += 1;
            }
        }
        let clock = AgeClock::new(self_tgid, monotonic_ns());
        for b in sweep::blocked_threads(self_tgid) {
            if !RECV_NRS.contains(&b.nr) {
                continue;
            }
            let fd = b.args[0] as u32;
            let Some(&protocol) = request_socks.get(&(b.tgid, fd)) else { continue };
            let since = clock.blocked_since_ns(b.tid);
            self.swept.push(NetlinkOpen {
                sock: sock_key(b.tgid, fd),
                tgid: b.tgid,
                tid: b.tid,
                comm: procfs::comm(b.tid).unwrap_or_default(),
                fd,
                protocol,
                msg_type: 0,
                flags: 0,
                seq: None,
                start_ns: since,
                reply_expected: true,
                recv_since_ns: Some(since),
                recv_tid: Some(b.tid),
                before_attach: true,
                in_send: false,
                dst_portid: 0,
            });
        }
        (seeded, self.swept.len())
    }

    /// Tracks the containerd → shim ttrpc connections that existed, as at a
    /// frame boundary (see `crate::sources::ttrpc`). Returns how many.
    pub fn seed_ttrpc(&mut self, self_tgid: u32) -> usize {
        const BPF_NOEXIST: u64 = 1;
        let mut n = 0;
        for (tgid, fd) in crate::sources::ttrpc::client_sockets(self_tgid) {
            let Some(gen) = self.seed_gen(tgid) else { continue };
            let class = SockClass { kind: SockKind::Ttrpc as u32, proto: 0, gen, _pad: 0 };
            n += usize::from(self.socks.insert(sock_key(tgid, fd), class, BPF_NOEXIST).is_ok());
        }
        n
    }

    /// The outstanding ttrpc requests, for the graph.
    pub fn ttrpc_facts(&mut self, now_ns: u64) -> TtrpcFacts {
        self.ttrpc.facts(now_ns)
    }

    /// ttrpc (requests written, responses read) since the start.
    pub fn ttrpc_seen(&self) -> (u64, u64) {
        self.ttrpc.seen()
    }

    /// The socket generation to stamp on a seeded entry of `tgid`'s, made 0 if
    /// the process has none yet (as the kernel does for its first socket), so
    /// that an exec forgets the seeded sockets too. `None` if `SOCK_GEN` is full.
    fn seed_gen(&mut self, tgid: u32) -> Option<u32> {
        const BPF_NOEXIST: u64 = 1;
        let _ = self.gens.insert(tgid, 0, BPF_NOEXIST);
        self.gens.get(&tgid, 0).ok()
    }

    /// Tracks the bus connections that existed, and turns calls found queued
    /// unread into open calls. Returns (connections, calls).
    fn seed_dbus(&mut self, self_tgid: u32) -> (usize, usize) {
        const BPF_NOEXIST: u64 = 1;
        let found = dbus_sweep::sweep(self_tgid);
        for c in found.connections.iter().filter(|c| !c.daemon_side) {
            let Some(gen) = self.seed_gen(c.tgid) else { continue };
            let class = SockClass { kind: SockKind::Dbus as u32, proto: 0, gen, _pad: 0 };
            let _ = self.socks.insert(sock_key(c.tgid, c.fd), class, BPF_NOEXIST);
            self.sockets.seed_dbus(c.tgid, c.fd, procfs::comm(c.tgid).unwrap_or_default());
        }
        let clock = AgeClock::new(self_tgid, monotonic_ns());
        for q in &found.queued {
            // The caller: named by the sender the bus stamped on the call, or
            // the other end of the daemon's socket the call sits in.
            let caller = match (&q.sender, q.peer_pid) {
                (Some(sender), _) if !found.connections.iter().any(|c| c.tgid == q.holder_pid && c.daemon_side) => {
                    // At startup, before the scan loop: waiting here delays nothing.
                    match self.holders.lookups.wait(&q.bus_path, sender, OWNER_TIMEOUT * 2) {
                        Some(Owner::Pid(p)) => Some(p),
                        _ => None,
                    }
                }
                (_, peer) => peer,
            };
            let Some(caller) = caller else { continue };
            let Some(conn) = found.connections.iter().find(|c| c.tgid == caller && !c.daemon_side && c.bus_path == q.bus_path) else {
                continue;
            };
            let (tid, since) = clock.process_blocked_since_ns(caller);
            self.swept_dbus.push(DbusOpen {
                sock: sock_key(conn.tgid, conn.fd),
                tgid: caller,
                tid,
                comm: procfs::comm(caller).unwrap_or_default(),
                fd: conn.fd,
                serial: q.serial,
                destination: q.destination.clone(),
                path: q.path.clone(),
                interface: q.interface.clone(),
                member: q.member.clone(),
                sender: q.sender.clone(),
                start_ns: since,
                before_attach: true,
                holder_pid: Some(q.holder_pid),
            });
        }
        (found.connections.len(), self.swept_dbus.len())
    }

    /// Takes one `SOCK_EVENTS` record.
    /// A record too short for its kind, or of a kind this ring does not carry, is skipped.
    pub fn on_record(&mut self, bytes: &[u8]) {
        let Ok(rec) = Record::parse(bytes) else { return };
        if self.ttrpc.on_record(&rec) {
            return;
        }
        match rec {
            Record::SockClosed(c) => {
                self.sockets.on_closed(c.tgid, c.fd);
                self.ttrpc.on_closed(c.tgid, c.fd);
                self.swept.retain(|s| s.sock != sock_key(c.tgid, c.fd));
            }
            Record::SocksForgotten(f) => {
                self.sockets.forget_process(f.tgid);
                self.ttrpc.forget_process(f.tgid);
                self.swept.retain(|s| s.tgid != f.tgid);
                self.swept_dbus.retain(|c| (c.sock >> 32) as u32 != f.tgid);
            }
            Record::SockIo(io) => {
                io.copy_into(&mut self.scratch);
                self.sockets.on_io(&self.scratch);
            }
            _ => {}
        }
    }

    /// Looks at every open request at `now_ns` and prints what crossed a level.
    pub fn scan(&mut self, now_ns: u64, out: &mut Vec<Event>) {
        let calls: Vec<(u32, SockCall)> = self.calls.iter().filter_map(Result::ok).collect();
        self.sockets.retain_live_open(procfs::thread_exists);
        self.swept.retain(
            |s| matches!(procfs::syscall(s.tid), Some(SyscallState::In { nr, args }) if RECV_NRS.contains(&nr) && args[0] as u32 == s.fd),
        );
        let mut open = self.sockets.open_netlink(&calls, now_ns);
        open.extend(self.swept.iter().cloned());
        let actions = self.registry.scan(open.iter(), now_ns);
        self.act(actions, now_ns, out);
        self.last_netlink = open;
        let replies = self.sockets.take_replies();
        self.swept_dbus.retain(|c| procfs::thread_exists(c.tgid) && !replies.contains(&(c.sock, c.serial)));
        let mut open = self.sockets.open_dbus(now_ns);
        open.extend(self.swept_dbus.iter().cloned());
        let actions = self.dbus.scan(open.iter(), now_ns);
        self.act_dbus(actions, out);
        self.last_dbus = open;
        self.open_waits = self.last_netlink.iter().map(|o| self.netlink_node(o)).collect();
        self.open_waits.extend(self.last_dbus.iter().map(dbus_node));
        if now_ns.saturating_sub(self.last_gc_ns) > 10_000_000_000 {
            self.last_gc_ns = now_ns;
            self.sockets.retain_live(procfs::thread_exists);
            self.ttrpc.retain_live();
            // An exit closes its sockets without a close() the kernel side
            // sees: drop the dead processes' entries so SOCKS never fills up.
            let dead: Vec<u64> = self.socks.keys().filter_map(Result::ok).filter(|k| !procfs::thread_exists((k >> 32) as u32)).collect();
            for k in dead {
                let _ = self.socks.remove(&k);
            }
            let dead: Vec<u64> =
                self.ttrpc_pos.keys().filter_map(Result::ok).filter(|k| !procfs::thread_exists((k >> 32) as u32)).collect();
            for k in dead {
                let _ = self.ttrpc_pos.remove(&k);
            }
            let dead: Vec<u32> = self.gens.keys().filter_map(Result::ok).filter(|t| !procfs::thread_exists(*t)).collect();
            for t in dead {
                let _ = self.gens.remove(&t);
            }
        }
    }

    fn act(&mut self, actions: Vec<Action<(u64, u64)>>, now_ns: u64, out: &mut Vec<Event>) {
        for a in actions {
            match a {
                Action::Report { key, level, waited } => {
                    let Some(t) = self.registry.get(&key) else { continue };
                    let o = &t.info;
                    let tid = o.recv_tid.unwrap_or(o.tid);
                    let detail = o.detail(&self.sockets.families, now_ns);
                    out.push(Event::Stall(Box::new(Stall {
                        tid,
                        started_before_attach: o.before_attach,
                        kernel_stack: procfs::kernel_stack(tid).unwrap_or_default(),
                        ..crate::sources::inflight::stall_line(o, level, t.id, WaitKind::NetlinkRequest, waited, detail)
                    })));
                }
                Action::Resolve { key, waited, exact } => {
                    if let Some(r) = self.registry.resolve(&key, waited, exact, WaitKind::NetlinkRequest) {
                        out.push(Event::Resolved(r));
                    }
                }
            }
        }
    }

    fn act_dbus(&mut self, actions: Vec<Action<(u64, u64)>>, out: &mut Vec<Event>) {
        for a in actions {
            match a {
                Action::Report { key, level, waited } => {
                    let Some(t) = self.dbus.get(&key) else { continue };
                    let o = t.info.clone();
                    out.push(Event::Stall(Box::new(Stall {
                        started_before_attach: o.before_attach,
                        kernel_stack: procfs::kernel_stack(o.tid).unwrap_or_default(),
                        ..crate::sources::inflight::stall_line(&o, level, t.id, WaitKind::DbusCall, waited, o.detail())
                    })));
                }
                Action::Resolve { key, waited, exact } => {
                    if let Some(r) = self.dbus.resolve(&key, waited, exact, WaitKind::DbusCall) {
                        out.push(Event::Resolved(r));
                    }
                }
            }
        }
    }

    /// Every request open at the last scan, as graph nodes.
    pub fn open_waits(&self) -> &[OpenWait] {
        &self.open_waits
    }

    fn netlink_node(&self, o: &NetlinkOpen) -> OpenWait {
        let protocol =
            crate::proto::netlink::names::protocol_name(o.protocol).map(String::from).unwrap_or_else(|| format!("netlink {}", o.protocol));
        let what = if o.before_attach {
            format!("{protocol} reply (request sent before plegwatch started)")
        } else {
            let fam = (o.protocol == crate::proto::netlink::names::NETLINK_GENERIC).then_some(&self.sockets.families);
            let ty = crate::proto::netlink::names::type_name(o.protocol, o.msg_type, fam);
            format!(
                "{protocol} {ty} seq {}{}",
                o.seq.map(|s| s.to_string()).unwrap_or_else(|| "?".into()),
                if o.in_send { " (still inside the send)" } else { "" }
            )
        };
        OpenWait {
            key: Item::wait_key(o),
            who: Who { pid: o.tgid, tid: Item::tid(o), comm: o.comm.clone(), goroutine: None },
            kind: WaitKind::NetlinkRequest,
            what,
            start_ns: o.start_ns,
            start: if o.before_attach { StartTiming::LowerBound } else { StartTiming::Exact },
            pleg_path: false,
        }
    }

    /// Who must answer each request open a second or more (looked up once per request;
    /// a D-Bus call's from [`DBUS_ASK_AFTER_NS`], and a name still being asked of the
    /// bus daemon is looked up again next scan).
    pub fn answers(&mut self, now_ns: u64) -> Vec<(WaitKey, Answerer)> {
        let open: std::collections::HashSet<WaitKey> = self.open_waits.iter().map(|w| w.key).collect();
        self.answerers.retain(|k, _| open.contains(k));
        let mut out = Vec::new();
        for o in self.last_netlink.clone() {
            if now_ns.saturating_sub(o.start_ns) < RESOLVE_AFTER_NS {
                continue;
            }
            let key = Item::wait_key(&o);
            if !self.answerers.contains_key(&key) {
                let a = netlink_answerer(&o, &mut self.holders.owners);
                self.answerers.insert(key, Some(a));
            }
            let a = self.answerers.get(&key).cloned().flatten();
            out.extend(a.map(|a| (key, a)));
        }
        for o in self.last_dbus.clone() {
            let age = now_ns.saturating_sub(o.start_ns);
            if age < DBUS_ASK_AFTER_NS {
                continue;
            }
            let key = Item::wait_key(&o);
            let a = match self.answerers.get(&key) {
                Some(a) => a.clone(),
                None => {
                    let holder = self.holders.holder_of(&o);
                    let a = holder.answerer();
                    // Asked off the loop: looked up again at the next scan.
                    if holder != DbusHolder::Pending {
                        if let DbusHolder::Unknown(why) = &holder {
                            tracing::debug!(pid = o.tgid, serial = o.serial, why, "no holder for a D-Bus call");
                        }
                        self.answerers.insert(key, a.clone());
                    }
                    a
                }
            };
            if age >= RESOLVE_AFTER_NS {
                out.extend(a.map(|a| (key, a)));
            }
        }
        out
    }

    /// The processes holding tracked netlink or D-Bus sockets.
    pub fn tgids(&self) -> Vec<u32> {
        self.sockets.tgids()
    }

    /// The netlink requests, D-Bus calls and ttrpc requests seen since the start.
    pub fn seen(&self) -> crate::events::RequestsSeen {
        let mut seen = self.sockets.seen;
        (seen.ttrpc_requests, seen.ttrpc_answered) = self.ttrpc.seen();
        seen
    }

    /// (stall lines, resolutions, still open).
    pub fn counts(&self) -> (u64, u64, u64) {
        let (s, r) = self.registry.counts();
        let (ds, dr) = self.dbus.counts();
        (s + ds, r + dr, (self.registry.open().count() + self.dbus.open().count()) as u64)
    }
}

/// A D-Bus call as a graph node.
fn dbus_node(o: &DbusOpen) -> OpenWait {
    let member = o.member.as_deref().unwrap_or("a method");
    let what = match (&o.interface, &o.destination) {
        (Some(i), Some(d)) => format!("D-Bus {i}.{member} to {d}"),
        (None, Some(d)) => format!("D-Bus {member} to {d}"),
        (_, None) => format!("D-Bus {member} (peer to peer)"),
    };
    OpenWait {
        key: Item::wait_key(o),
        who: Who { pid: o.tgid, tid: o.tid, comm: o.comm.clone(), goroutine: None },
        kind: WaitKind::DbusCall,
        what,
        start_ns: o.start_ns,
        start: if o.before_attach { StartTiming::LowerBound } else { StartTiming::Exact },
        pleg_path: false,
    }
}

/// The process holding a netlink request's destination port id (0: the kernel), from
/// the watch's one socket-owner table (its /proc scan is rate-limited).
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
    /// Being asked of the bus daemon, off the loop.
    Pending,
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
            DbusHolder::Pending | DbusHolder::Unknown(_) => return None,
        };
        Some(Answerer { pid: Some(pid), kind, exactness, evidence })
    }
}

/// How long the bus daemon gets to say who owns a name.
const OWNER_TIMEOUT: Duration = Duration::from_millis(500);

/// Finds who holds a D-Bus call: the owner of its destination, asked of the
/// bus daemon; the daemon itself when it does not answer; the socket's peer
/// for a peer-to-peer connection (no bus).
struct DbusHolders {
    peers: UnixPeers,
    owners: SocketOwners,
    /// Name owners, asked of the bus daemon off the scan loop.
    lookups: OwnerLookups,
}

/// The blocking lookup the worker thread makes.
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
        let owner = if name == "org.freedesktop.DBus" {
            Owner::BusNotAnswering
        } else {
            match self.lookups.get(&reach, &name) {
                Some(o) => o,
                None => return DbusHolder::Pending,
            }
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
