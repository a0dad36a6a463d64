//! Per-socket matching of netlink requests with their replies.
//!
//! A request is a message sent with NLM_F_REQUEST that the kernel will answer:
//! it asked for an ack (NLM_F_ACK), or it is a GET or a dump (those always
//! get a reply). A NEW/DEL/SET without NLM_F_ACK is answered only on failure,
//! so it is not tracked. Replies carry the request's `nlmsg_seq`:
//!
//! - an NLMSG_ERROR (the ack, errno 0, or a failure) closes the request;
//! - NLM_F_MULTI parts keep it open until NLMSG_DONE;
//! - any other reply (a GET's single answer) closes it.
//!
//! The kernel also puts the socket's port id in every reply's `nlmsg_pid`.
//! Once an ack or error shows that id, messages with another one (multicast
//! notifications, which carry the *originator's* seq and port id) are not
//! taken as replies.
//!
//! Captures are prefixes: a dump datagram's first part may be seen and its
//! NLMSG_DONE, further along, not. Such a request is kept as `maybe_done`,
//! and closed when a later datagram on the socket answers some other request
//! (the kernel sends a dump's datagrams in order).
//!
//! A socket that only receives (a multicast listener) has nothing
//! outstanding and costs nothing here.

use super::{
    genl::GenlFamilies,
    header::{
        self, NlMsg, CTRL_CMD_GETFAMILY, GENL_ID_CTRL, NLMSG_DONE, NLMSG_ERROR, NLMSG_MIN_TYPE, NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST,
    },
    names::{self, FlagContext, NETLINK_GENERIC, NETLINK_ROUTE, NETLINK_SOCK_DIAG},
};
use std::{
    collections::{HashMap, VecDeque},
    hash::Hash,
    time::Duration,
};

/// `CTRL_CMD_GETPOLICY`.
const CTRL_CMD_GETPOLICY: u8 = 10;

/// At most this many open requests per socket; older ones are dropped (and
/// counted) past it.
pub const MAX_OPEN_PER_SOCKET: usize = 1024;

/// A request sent on a socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub protocol: u32,
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
    /// NETLINK_GENERIC: the command.
    pub genl_cmd: Option<u8>,
    pub sent_ns: u64,
    /// Multi-part replies seen so far.
    pub replies: u32,
    pub last_reply_ns: Option<u64>,
    /// The last datagram seen held parts of this dump, and was cut before its
    /// end: NLMSG_DONE may have been in the part not captured.
    pub maybe_done: bool,
}

impl Request {
    /// `RTM_GETLINK REQUEST|DUMP seq 7`, `devlink cmd 5 REQUEST|ACK seq 3`.
    pub fn describe(&self, families: Option<&GenlFamilies>) -> String {
        let ty = names::type_name(self.protocol, self.msg_type, families);
        let flags = names::flag_names(self.flags, names::flag_context(self.protocol, self.msg_type));
        match self.genl_cmd {
            Some(cmd) => format!("{ty} cmd {cmd} {flags} seq {}", self.seq),
            None => format!("{ty} {flags} seq {}", self.seq),
        }
    }
}

/// An open request and how long it has waited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outstanding {
    pub request: Request,
    pub age: Duration,
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Completed {
    pub request: Request,
    /// The NLMSG_ERROR's errno (0: acked) or NLMSG_DONE's status; `None` for
    /// a plain reply, or when the end was inferred (`assumed`).
    pub errno: Option<i32>,
    pub latency: Duration,
    /// Closed because the socket moved on after a `maybe_done` dump, not by a
    /// reply seen.
    pub assumed: bool,
}

/// Whether the kernel will answer `msg` (sent by a process on `protocol`).
pub fn expects_reply(protocol: u32, msg: &NlMsg<'_>) -> bool {
    let h = &msg.header;
    if h.flags & NLM_F_REQUEST == 0 || h.msg_type < NLMSG_MIN_TYPE {
        return false;
    }
    if h.flags & NLM_F_ACK != 0 {
        return true;
    }
    let ctx = names::flag_context(protocol, h.msg_type);
    if matches!(ctx, FlagContext::Get | FlagContext::Other) && h.flags & NLM_F_DUMP == NLM_F_DUMP {
        return true;
    }
    match protocol {
        NETLINK_ROUTE | NETLINK_SOCK_DIAG => ctx == FlagContext::Get,
        NETLINK_GENERIC => h.msg_type == GENL_ID_CTRL && matches!(msg.genl_cmd, Some(CTRL_CMD_GETFAMILY | CTRL_CMD_GETPOLICY)),
        _ => false,
    }
}

/// The requests of one socket.
#[derive(Clone, Debug)]
pub struct SocketTracker {
    protocol: u32,
    open: VecDeque<Request>,
    /// The socket's port id, once a reply showed it.
    portid: Option<u32>,
    dropped: u64,
    /// Buffers seen cut short (capture prefix, or malformed).
    truncated: u64,
}

impl SocketTracker {
    pub fn new(protocol: u32) -> Self {
        SocketTracker { protocol, open: VecDeque::new(), portid: None, dropped: 0, truncated: 0 }
    }

    pub fn protocol(&self) -> u32 {
        self.protocol
    }

    /// The socket's netlink port id, once a reply showed it.
    pub fn portid(&self) -> Option<u32> {
        self.portid
    }

    /// Requests dropped because more than [`MAX_OPEN_PER_SOCKET`] were open.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// Buffers that were cut short.
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    pub fn is_idle(&self) -> bool {
        self.open.is_empty()
    }

    /// A buffer sent in full. Returns how many requests it opened.
    pub fn on_send(&mut self, bytes: &[u8], now_ns: u64) -> usize {
        self.on_send_captured(bytes, bytes.len(), now_ns)
    }

    /// A buffer of `total_len` bytes sent, of which `captured` is the prefix.
    pub fn on_send_captured(&mut self, captured: &[u8], total_len: usize, now_ns: u64) -> usize {
        let parsed = header::parse(captured, self.protocol);
        if parsed.truncated || parsed.malformed || total_len > captured.len() {
            self.truncated += 1;
        }
        let mut opened = 0;
        for m in parsed.messages.iter().filter(|m| expects_reply(self.protocol, m)) {
            if self.open.len() >= MAX_OPEN_PER_SOCKET {
                self.open.pop_front();
                self.dropped += 1;
            }
            self.open.push_back(Request {
                protocol: self.protocol,
                msg_type: m.header.msg_type,
                flags: m.header.flags,
                seq: m.header.seq,
                pid: m.header.pid,
                genl_cmd: m.genl_cmd,
                sent_ns: now_ns,
                replies: 0,
                last_reply_ns: None,
                maybe_done: false,
            });
            opened += 1;
        }
        opened
    }

    /// A buffer received in full. Returns the requests it closed.
    pub fn on_recv(&mut self, bytes: &[u8], now_ns: u64) -> Vec<Completed> {
        self.on_recv_captured(bytes, bytes.len(), now_ns, None)
    }

    /// A buffer of `total_len` bytes received, of which `captured` is the
    /// prefix. On a NETLINK_GENERIC socket, `families` learns from it.
    pub fn on_recv_captured(
        &mut self,
        captured: &[u8],
        total_len: usize,
        now_ns: u64,
        families: Option<&mut GenlFamilies>,
    ) -> Vec<Completed> {
        let parsed = header::parse(captured, self.protocol);
        let cut = parsed.truncated || parsed.malformed || total_len > captured.len();
        if cut {
            self.truncated += 1;
        }
        if let Some(f) = families.filter(|_| self.protocol == NETLINK_GENERIC) {
            for m in &parsed.messages {
                f.learn(m);
            }
        }
        let mut done = Vec::new();
        if self.open.is_empty() {
            return done;
        }
        self.learn_portid(&parsed.messages);
        let replies: Vec<&NlMsg<'_>> = parsed.messages.iter().filter(|m| self.is_reply(m)).collect();

        // A dump whose end may have been missed is over once the socket
        // answers something else.
        if !replies.is_empty() {
            let mut i = 0;
            while i < self.open.len() {
                let r = &self.open[i];
                if r.maybe_done && !replies.iter().any(|m| m.header.seq == r.seq) {
                    if let Some(r) = self.open.remove(i) {
                        done.push(finish(r, None, now_ns, true));
                    }
                } else {
                    i += 1;
                }
            }
        }

        let mut last_multi: Option<u32> = None;
        for m in replies {
            let Some(i) = self.find(m) else { continue };
            match m.header.msg_type {
                NLMSG_ERROR | NLMSG_DONE => {
                    if let Some(r) = self.open.remove(i) {
                        done.push(finish(r, m.errno, now_ns, false));
                    }
                    last_multi = None;
                }
                _ if m.is_multi() => {
                    let r = &mut self.open[i];
                    r.replies = r.replies.saturating_add(1);
                    r.last_reply_ns = Some(now_ns);
                    r.maybe_done = false;
                    last_multi = Some(m.header.seq);
                }
                _ => {
                    if let Some(r) = self.open.remove(i) {
                        done.push(finish(r, None, now_ns, false));
                    }
                    last_multi = None;
                }
            }
        }
        if let (true, Some(seq)) = (cut, last_multi) {
            if let Some(r) = self.open.iter_mut().find(|r| r.seq == seq) {
                r.maybe_done = true;
            }
        }
        done
    }

    /// The open requests, oldest first, with their age at `now_ns`.
    pub fn outstanding(&self, now_ns: u64) -> Vec<Outstanding> {
        self.open.iter().map(|r| Outstanding { request: r.clone(), age: Duration::from_nanos(now_ns.saturating_sub(r.sent_ns)) }).collect()
    }

    fn learn_portid(&mut self, msgs: &[NlMsg<'_>]) {
        if self.portid.is_some() {
            return;
        }
        for m in msgs.iter().filter(|m| m.is_error()) {
            let Some(req) = m.request else { continue };
            if self.open.iter().any(|r| r.seq == req.seq && r.msg_type == req.msg_type && r.seq == m.header.seq) {
                self.portid = Some(m.header.pid);
                return;
            }
        }
    }

    /// Whether `m` is addressed to this socket as an answer.
    fn is_reply(&self, m: &NlMsg<'_>) -> bool {
        match self.portid {
            Some(p) => m.header.pid == p,
            None => true,
        }
    }

    /// The open request `m` answers: the oldest with its seq, preferring
    /// the one of the type an NLMSG_ERROR names.
    fn find(&self, m: &NlMsg<'_>) -> Option<usize> {
        let seq = m.header.seq;
        if let Some(req) = m.request {
            if let Some(i) = self.open.iter().position(|r| r.seq == seq && r.msg_type == req.msg_type) {
                return Some(i);
            }
        }
        self.open.iter().position(|r| r.seq == seq)
    }
}

fn finish(request: Request, errno: Option<i32>, now_ns: u64, assumed: bool) -> Completed {
    let latency = Duration::from_nanos(now_ns.saturating_sub(request.sent_ns));
    Completed { request, errno, latency, assumed }
}

/// The trackers of every socket, by a key of the caller's choosing (socket
/// inode, or (tgid, fd)), and the generic netlink families seen.
#[derive(Debug)]
pub struct Trackers<K> {
    sockets: HashMap<K, SocketTracker>,
    families: GenlFamilies,
}

impl<K: Hash + Eq + Clone> Default for Trackers<K> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Hash + Eq + Clone> Trackers<K> {
    pub fn new() -> Self {
        Trackers { sockets: HashMap::new(), families: GenlFamilies::new() }
    }

    /// Starts from a family table (e.g. [`GenlFamilies::from_dump`] of the kernel's answer).
    pub fn with_families(families: GenlFamilies) -> Self {
        Trackers { sockets: HashMap::new(), families }
    }

    pub fn families(&self) -> &GenlFamilies {
        &self.families
    }

    pub fn socket(&self, key: &K) -> Option<&SocketTracker> {
        self.sockets.get(key)
    }

    /// A send on socket `key` of netlink protocol `protocol`.
    pub fn on_send(&mut self, key: K, protocol: u32, captured: &[u8], total_len: usize, now_ns: u64) -> usize {
        let t = self.sockets.entry(key).or_insert_with(|| SocketTracker::new(protocol));
        t.on_send_captured(captured, total_len, now_ns)
    }

    /// A receive on socket `key`. A socket with no requests (a listener) gets
    /// no tracker.
    pub fn on_recv(&mut self, key: K, protocol: u32, captured: &[u8], total_len: usize, now_ns: u64) -> Vec<Completed> {
        match self.sockets.get_mut(&key) {
            Some(t) => t.on_recv_captured(captured, total_len, now_ns, Some(&mut self.families)),
            None => {
                if protocol == NETLINK_GENERIC {
                    self.families.learn_all(captured);
                }
                Vec::new()
            }
        }
    }

    /// The socket was closed: its requests go.
    pub fn close(&mut self, key: &K) -> Option<SocketTracker> {
        self.sockets.remove(key)
    }

    /// Every open request of every socket, with its age at `now_ns`.
    pub fn outstanding(&self, now_ns: u64) -> Vec<(K, Outstanding)> {
        self.sockets.iter().flat_map(|(k, t)| t.outstanding(now_ns).into_iter().map(move |o| (k.clone(), o))).collect()
    }

    pub fn len(&self) -> usize {
        self.sockets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sockets.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{
        header::{
            build::{self, done, error, ifinfomsg, msg},
            NlHeader, NLM_F_CREATE, NLM_F_EXCL, NLM_F_MULTI,
        },
        names::{RTM_GETLINK, RTM_GETROUTE, RTM_NEWADDR, RTM_NEWLINK},
    };

    const PORT: u32 = 4242;

    fn getlink_dump(seq: u32) -> Vec<u8> {
        msg(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, seq, 0, &ifinfomsg(0))
    }

    fn link(seq: u32, index: i32) -> Vec<u8> {
        msg(RTM_NEWLINK, NLM_F_MULTI, seq, PORT, &[ifinfomsg(index), build::attr(3, &[b'x'; 600])].concat())
    }

    #[test]
    fn dump_stays_open_until_done() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        assert_eq!(t.on_send(&getlink_dump(7), 1_000), 1);
        let out = t.outstanding(3_000);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].age, Duration::from_nanos(2_000));
        assert_eq!(out[0].request.describe(None), "RTM_GETLINK REQUEST|DUMP seq 7");

        let mut d1 = link(7, 1);
        d1.extend(link(7, 2));
        assert!(t.on_recv(&d1, 2_000).is_empty());
        let o = &t.outstanding(2_500)[0];
        assert_eq!((o.request.replies, o.request.last_reply_ns, o.request.maybe_done), (2, Some(2_000), false));

        let mut d2 = link(7, 3);
        d2.extend(done(7, PORT));
        let c = t.on_recv(&d2, 5_000);
        assert_eq!(c.len(), 1);
        assert_eq!(c[0].errno, Some(0));
        assert_eq!(c[0].latency, Duration::from_nanos(4_000));
        assert_eq!(c[0].request.replies, 3);
        assert!(!c[0].assumed);
        assert!(t.outstanding(6_000).is_empty());
    }

    #[test]
    fn newaddr_without_ack_expects_nothing() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        let m = msg(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL, 3, 0, &[0u8; 8]);
        assert_eq!(t.on_send(&m, 0), 0);
        assert!(t.outstanding(10).is_empty());
        // Its failure arrives anyway; nothing to close, nothing breaks.
        let req = NlHeader::read(&m).unwrap();
        assert!(t.on_recv(&error(-libc::EEXIST, &req, PORT), 5).is_empty());
    }

    #[test]
    fn ack_and_error_close() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        let add = msg(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE, 10, 0, &[0u8; 8]);
        let add2 = msg(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL, 11, 0, &[0u8; 8]);
        // Two requests in one sendmsg.
        assert_eq!(t.on_send(&[add.clone(), add2.clone()].concat(), 100), 2);
        let c = t.on_recv(&error(0, &NlHeader::read(&add).unwrap(), PORT), 150);
        assert_eq!((c.len(), c[0].errno, c[0].request.seq), (1, Some(0), 10));
        assert_eq!(t.portid(), Some(PORT));
        let c = t.on_recv(&error(-libc::EEXIST, &NlHeader::read(&add2).unwrap(), PORT), 190);
        assert_eq!((c[0].errno, c[0].latency), (Some(-libc::EEXIST), Duration::from_nanos(90)));
        assert!(t.is_idle());
    }

    #[test]
    fn single_reply_closes_get() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        assert_eq!(t.on_send(&msg(RTM_GETROUTE, NLM_F_REQUEST, 5, 0, &[0u8; 12]), 0), 1);
        let c = t.on_recv(&msg(24, 0, 5, PORT, &[0u8; 12]), 10);
        assert_eq!((c.len(), c[0].errno), (1, None));
    }

    #[test]
    fn notifications_are_not_replies() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        t.on_send(&msg(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK, 1, 0, &[0u8; 8]), 0);
        t.on_recv(&error(0, &NlHeader { len: 24, msg_type: RTM_NEWADDR, flags: 5, seq: 1, pid: 0 }, PORT), 1);
        t.on_send(&msg(RTM_NEWADDR, NLM_F_REQUEST | NLM_F_ACK, 2, 0, &[0u8; 8]), 2);
        // Another process's change, multicast to us, with its seq 2 and port 777.
        assert!(t.on_recv(&msg(RTM_NEWADDR, 0, 2, 777, &[0u8; 8]), 3).is_empty());
        assert_eq!(t.outstanding(4).len(), 1);
    }

    #[test]
    fn listener_has_nothing_outstanding() {
        let mut all: Trackers<u64> = Trackers::new();
        for i in 0..100 {
            assert!(all.on_recv(9, NETLINK_ROUTE, &msg(RTM_NEWLINK, 0, 0, 0, &ifinfomsg(i)), 24 + 16, 0).is_empty());
        }
        assert!(all.outstanding(1_000_000_000).is_empty());
        assert!(all.is_empty(), "a listener gets no tracker");
    }

    #[test]
    fn close_drops_requests() {
        let mut all: Trackers<(u32, u32)> = Trackers::new();
        all.on_send((100, 5), NETLINK_ROUTE, &getlink_dump(1), 32, 0);
        all.on_send((100, 6), NETLINK_ROUTE, &getlink_dump(1), 32, 0);
        assert_eq!(all.outstanding(1).len(), 2);
        assert!(all.close(&(100, 5)).is_some());
        let out = all.outstanding(1);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].0, (100, 6));
    }

    #[test]
    fn cut_dump_is_maybe_done_until_socket_moves_on() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        t.on_send(&getlink_dump(1), 0);
        // A 4 KiB datagram of which 512 bytes were captured: the first link
        // part only; NLMSG_DONE may be further on.
        let mut d = link(1, 1);
        d.extend(link(1, 2));
        d.extend(done(1, PORT));
        let c = t.on_recv_captured(&d[..512], d.len(), 10, None);
        assert!(c.is_empty());
        assert!(t.outstanding(11)[0].request.maybe_done);
        // Next request on the same socket, and its answer: the dump is over.
        t.on_send(&msg(RTM_GETLINK, NLM_F_REQUEST, 2, 0, &ifinfomsg(1)), 20);
        let c = t.on_recv(&msg(RTM_NEWLINK, 0, 2, PORT, &ifinfomsg(1)), 30);
        let seqs: Vec<_> = c.iter().map(|c| (c.request.seq, c.assumed)).collect();
        assert_eq!(seqs, [(1, true), (2, false)]);

        // While parts keep coming, it is not maybe_done.
        t.on_send(&getlink_dump(3), 40);
        t.on_recv_captured(&link(3, 1)[..512], 700, 41, None);
        assert!(t.outstanding(42)[0].request.maybe_done);
        t.on_recv(&link(3, 2), 43);
        assert!(!t.outstanding(44)[0].request.maybe_done);
    }

    #[test]
    fn genl_families_learned_and_named() {
        let mut all: Trackers<u32> = Trackers::new();
        all.on_send(1, NETLINK_GENERIC, &crate::netlink::genl::getfamily_dump(9), 20, 0);
        let o = &all.outstanding(1)[0].1;
        assert_eq!(o.request.describe(Some(all.families())), "nlctrl cmd 3 REQUEST|DUMP seq 9");
        let mut d = build::newfamily(0x18, "wireguard", 9, NLM_F_MULTI);
        d.extend(done(9, 1));
        let c = all.on_recv(1, NETLINK_GENERIC, &d, d.len(), 5);
        assert_eq!(c.len(), 1);
        assert_eq!(all.families().name(0x18), Some("wireguard"));
        // A family request that asks no ack expects nothing.
        let fam = msg(0x18, NLM_F_REQUEST, 10, 0, &[1, 1, 0, 0]);
        assert_eq!(all.on_send(1, NETLINK_GENERIC, &fam, fam.len(), 6), 0);
        let fam = msg(0x18, NLM_F_REQUEST | NLM_F_ACK, 11, 0, &[1, 1, 0, 0]);
        assert_eq!(all.on_send(1, NETLINK_GENERIC, &fam, fam.len(), 6), 1);
        assert_eq!(all.outstanding(7)[0].1.request.describe(Some(all.families())), "wireguard cmd 1 REQUEST|ACK seq 11");
    }

    #[test]
    fn bounded_per_socket() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        for seq in 0..(MAX_OPEN_PER_SOCKET as u32 + 10) {
            t.on_send(&getlink_dump(seq), 0);
        }
        assert_eq!(t.outstanding(0).len(), MAX_OPEN_PER_SOCKET);
        assert_eq!(t.dropped(), 10);
    }

    #[test]
    fn garbage_never_panics() {
        let mut t = SocketTracker::new(NETLINK_ROUTE);
        let mut buf = getlink_dump(1);
        buf.extend(link(1, 1));
        buf.extend(done(1, PORT));
        for cut in 0..buf.len() {
            t.on_send(&buf[..cut], 0);
            t.on_recv_captured(&buf[..cut], buf.len(), 1, None);
        }
        let mut x = 0x1234_5678u32;
        for _ in 0..2000 {
            let mut g = vec![0u8; (x % 96) as usize];
            for b in g.iter_mut() {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            t.on_send(&g, 2);
            t.on_recv(&g, 3);
        }
    }
}
