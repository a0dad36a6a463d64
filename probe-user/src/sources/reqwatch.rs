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
        model::{OpenWait, StartTiming, WaitKey, Who},
        requests::Answerer,
    },
    kernel::loader::{take_map, WatchError},
    levels::Thresholds,
    observe::holders::{
        bus_owner::{self, Owner},
        owner_cache::OwnerCache,
    },
    observe::procfs::{self, SyscallState},
    sources::dbus_sweep,
    sources::inflight::Item,
    sources::inflight::{Action, Filter, Registry},
    sources::request_holders::{RequestHolders, OWNER_TIMEOUT},
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
use std::collections::HashMap;

/// The receive syscalls a thread blocked on a netlink reply may sit in.
const RECV_NRS: [i64; 4] = [libc::SYS_recvfrom, libc::SYS_recvmsg, libc::SYS_read, libc::SYS_readv];

pub struct ReqWatch {
    registry: Registry<NetlinkOpen>,
    dbus: Registry<DbusOpen>,
    /// Who answers each request, found on worker threads.
    holders: RequestHolders,
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
    /// kind, exactness, evidence), looked up once per request, and again from the
    /// given time while the answer is not settled.
    answerers: HashMap<WaitKey, (Option<Answerer>, Option<u64>)>,
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
const ASK_AFTER_NS: u64 = 200_000_000;
/// Requests this old are linked to their holder. The holder is looked up from
/// [`ASK_AFTER_NS`] on: the answer comes from a worker thread and is taken in at a
/// later scan, and a loaded node took over a second for that (a guest's first
/// `dbus_call` warn line went out with no holder, the holder came 85 ms later). Asked
/// this early, the answer is in long before the warn line.
const RESOLVE_AFTER_NS: u64 = 1_000_000_000;
const _: () = assert!(ASK_AFTER_NS < RESOLVE_AFTER_NS);
/// An unsettled answer (the bus daemon did not say who owns a name) is asked again
/// this long after it came.
const ASK_AGAIN_AFTER_NS: u64 = 2_000_000_000;

impl ReqWatch {
    pub fn new(ebpf: &mut Ebpf, thresholds: Thresholds, filter: Filter) -> Result<Self, WatchError> {
        Ok(ReqWatch {
            registry: Registry::new(thresholds, filter.clone()),
            dbus: Registry::new(thresholds, filter),
            holders: RequestHolders::start().map_err(|e| WatchError::Io("starting the request-holder lookup threads", e))?,
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
        let mut names = OwnerCache::default();
        for q in &found.queued {
            // The caller: named by the sender the bus stamped on the call, or
            // the other end of the daemon's socket the call sits in.
            let caller = match (&q.sender, q.peer_pid) {
                (Some(sender), _) if !found.connections.iter().any(|c| c.tgid == q.holder_pid && c.daemon_side) => {
                    // At startup, before the scan loop: waiting here delays nothing.
                    match names.get(&q.bus_path, sender, |bus, name| bus_owner::owner_of(bus, name, OWNER_TIMEOUT * 2)) {
                        Owner::Pid(p) => Some(p),
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

    /// Who must answer each request open a second or more. Each is looked up once, from
    /// [`ASK_AFTER_NS`], on a worker thread when that takes I/O; an answer not in yet
    /// is taken at a later scan. An unsettled answer is used meanwhile, and asked about
    /// again [`ASK_AGAIN_AFTER_NS`] after it came.
    pub fn answers(&mut self, now_ns: u64) -> Vec<(WaitKey, Answerer)> {
        let open: std::collections::HashSet<WaitKey> = self.open_waits.iter().map(|w| w.key).collect();
        self.answerers.retain(|k, _| open.contains(k));
        for (key, found) in self.holders.answers() {
            if open.contains(&key) {
                let again = (!found.settled).then(|| now_ns.saturating_add(ASK_AGAIN_AFTER_NS));
                self.answerers.insert(key, (found.answerer, again));
            }
        }
        let mut out = Vec::new();
        for o in &self.last_netlink {
            let age = now_ns.saturating_sub(o.start_ns);
            if age < ASK_AFTER_NS {
                continue;
            }
            let key = Item::wait_key(o);
            if !self.answerers.contains_key(&key) {
                if let Some(a) = self.holders.ask_netlink(key, o) {
                    self.answerers.insert(key, (Some(a), None));
                }
            }
            if age >= RESOLVE_AFTER_NS {
                out.extend(self.answerers.get(&key).and_then(|(a, _)| a.clone()).map(|a| (key, a)));
            }
        }
        for o in &self.last_dbus {
            let age = now_ns.saturating_sub(o.start_ns);
            if age < ASK_AFTER_NS {
                continue;
            }
            let key = Item::wait_key(o);
            let again = match self.answerers.get(&key) {
                None => Some(false),
                Some((_, Some(at))) if *at <= now_ns => Some(true),
                Some(_) => None,
            };
            if let Some(again) = again {
                if let Some(found) = self.holders.ask_dbus(key, o, again) {
                    self.answerers.insert(key, (found.answerer, None));
                } else if let Some((_, at)) = self.answerers.get_mut(&key) {
                    // Asked again: the answer in hand stands until the new one comes.
                    *at = None;
                }
            }
            if age >= RESOLVE_AFTER_NS {
                out.extend(self.answerers.get(&key).and_then(|(a, _)| a.clone()).map(|a| (key, a)));
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
