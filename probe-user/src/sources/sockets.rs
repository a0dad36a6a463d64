//! The tracked sockets and their protocol state: what the kernel's `SockIo`
//! records say was sent and received, turned into open netlink requests.
//!
//! A netlink request is open while its reply has not come:
//! - a request that expects a reply (an ack asked for, a get or a dump) until
//!   that reply, by seq (`netlink::tracker`);
//! - a request that expects none (say `RTM_NEWADDR` without `NLM_F_ACK`) when
//!   its sender then blocks in a receive on the same socket: it is waiting for
//!   something that will not come.
//!
//! A socket that never sent a request (a multicast listener such as `ip
//! monitor`) has nothing open, however long it blocks in recv.

use crate::{
    events::RequestsSeen,
    graph::model::WaitKey,
    proto::dbus::{
        calls::{Connection, Side},
        header::MessageKind,
    },
    proto::netlink::{
        genl::GenlFamilies,
        names,
        tracker::{Request, SocketTracker},
    },
    sources::inflight::{cstr, Item},
};
use plegwatch_abi::{NlSummary, SockCall, SockIo, SockKind, SOCK_FIRST_RECV};
use serde_json::{json, Value};
use std::collections::HashMap;

/// A socket is named by `tgid << 32 | fd`, as in the kernel's `SOCKS` map.
pub type SockKey = u64;

pub fn sock_key(tgid: u32, fd: u32) -> SockKey {
    (u64::from(tgid) << 32) | u64::from(fd)
}

const NLMSG_ERROR: u16 = 2;

/// The last request a netlink socket sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sent {
    /// The destination port id (0: the kernel).
    pub dst: u32,
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub sent_ns: u64,
    pub tid: u32,
}

/// One netlink socket.
#[derive(Clone, Debug)]
pub struct NetlinkSocket {
    pub tgid: u32,
    pub fd: u32,
    pub protocol: u32,
    pub comm: String,
    pub tracker: SocketTracker,
    /// The last request sent, and whether anything came back since.
    pub last_sent: Option<Sent>,
    pub replied_since: bool,
}

/// An open netlink request: the registry's item for kind `netlink_request`.
#[derive(Clone, Debug, PartialEq)]
pub struct NetlinkOpen {
    pub sock: SockKey,
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
    pub fd: u32,
    pub protocol: u32,
    pub msg_type: u16,
    pub flags: u16,
    pub seq: Option<u32>,
    pub start_ns: u64,
    /// Whether the request asked for a reply (an ack, a get, a dump).
    pub reply_expected: bool,
    /// When the thread blocked in its current receive on this socket, if it is in one.
    pub recv_since_ns: Option<u64>,
    pub recv_tid: Option<u32>,
    /// Found by the startup sweep, blocked in recv: what it sent is unknown.
    pub before_attach: bool,
    /// Its sender is still inside the send syscall (the kernel is processing
    /// it, maybe behind `rtnl_mutex`), rather than waiting for a reply.
    pub in_send: bool,
    /// The destination port id: 0 for the kernel, else a process's socket
    /// (NETLINK_USERSOCK peers, for one).
    pub dst_portid: u32,
}

impl Item for NetlinkOpen {
    type Key = (SockKey, u64);
    fn key(&self) -> Self::Key {
        (self.sock, self.start_ns)
    }
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn tid(&self) -> u32 {
        self.recv_tid.unwrap_or(self.tid)
    }
    fn comm(&self) -> &str {
        &self.comm
    }
    fn start_ns(&self) -> u64 {
        self.start_ns
    }
    fn refresh(&mut self, newer: &Self) {
        self.recv_since_ns = newer.recv_since_ns;
        self.recv_tid = newer.recv_tid;
    }
    fn wait_key(&self) -> WaitKey {
        WaitKey::Netlink { sock: self.sock, start_ns: self.start_ns }
    }
}

impl NetlinkOpen {
    /// The stall's `detail`.
    pub fn detail(&self, families: &GenlFamilies, now_ns: u64) -> Value {
        let fam = (self.protocol == names::NETLINK_GENERIC).then_some(families);
        json!({
            "protocol": names::protocol_name(self.protocol).map(String::from).unwrap_or_else(|| format!("netlink {}", self.protocol)),
            "message_type": if self.before_attach { Value::Null } else { json!(names::type_name(self.protocol, self.msg_type, fam)) },
            "flags": if self.before_attach { Value::Null } else { json!(names::flag_names(self.flags, names::flag_context(self.protocol, self.msg_type))) },
            "seq": self.seq,
            "fd": self.fd,
            "reply_expected": if self.before_attach { Value::Null } else { json!(self.reply_expected) },
            "recv_blocked_s": self.recv_since_ns.map(|t| now_ns.saturating_sub(t) as f64 / 1e9),
            "phase": if self.in_send { "send" } else { "reply" },
        })
    }
}

/// One D-Bus connection, client side.
#[derive(Clone, Debug)]
pub struct DbusSocket {
    pub tgid: u32,
    pub fd: u32,
    pub comm: String,
    pub conn: Connection,
    /// The thread that wrote last (the caller).
    pub writer_tid: u32,
}

/// An open D-Bus method call: the registry's item for kind `dbus_call`.
#[derive(Clone, Debug, PartialEq)]
pub struct DbusOpen {
    pub sock: SockKey,
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
    pub fd: u32,
    pub serial: u32,
    pub destination: Option<String>,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
    /// The caller's unique name on the bus, when seen.
    pub sender: Option<String>,
    pub start_ns: u64,
    pub before_attach: bool,
    /// Who has not read it, when the startup sweep found it queued.
    pub holder_pid: Option<u32>,
}

impl Item for DbusOpen {
    type Key = (SockKey, u64);
    fn key(&self) -> Self::Key {
        (self.sock, (u64::from(self.serial) << 32) ^ self.start_ns)
    }
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn tid(&self) -> u32 {
        self.tid
    }
    fn comm(&self) -> &str {
        &self.comm
    }
    fn start_ns(&self) -> u64 {
        self.start_ns
    }
    fn refresh(&mut self, _newer: &Self) {}
    fn wait_key(&self) -> WaitKey {
        let (sock, tag) = Item::key(self);
        WaitKey::Dbus { sock, tag }
    }
}

impl DbusOpen {
    /// The stall's `detail`.
    pub fn detail(&self) -> Value {
        json!({
            "destination": self.destination,
            "path": self.path,
            "interface": self.interface,
            "member": self.member,
            "serial": self.serial,
            "sender": self.sender,
            "fd": self.fd,
        })
    }
}

/// Every tracked socket.
#[derive(Debug, Default)]
pub struct Sockets {
    netlink: HashMap<SockKey, NetlinkSocket>,
    dbus: HashMap<SockKey, DbusSocket>,
    /// Replies read on D-Bus connections since last taken: (socket, reply_serial).
    replies: Vec<(SockKey, u32)>,
    pub families: GenlFamilies,
    /// Requests and calls seen since the start, for the summary.
    pub seen: RequestsSeen,
}

/// The bytes of netlink headers the kernel walked, rebuilt as a buffer the
/// parser reads (each message cut to its header, and an NLMSG_ERROR to its errno).
pub fn headers_buffer(nl: &[NlSummary]) -> Vec<u8> {
    let mut out = Vec::with_capacity(nl.len() * 20);
    for m in nl {
        let is_err = m.msg_type == NLMSG_ERROR;
        let len: u32 = if is_err { 20 } else { 16 };
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&m.msg_type.to_ne_bytes());
        out.extend_from_slice(&m.flags.to_ne_bytes());
        out.extend_from_slice(&m.seq.to_ne_bytes());
        out.extend_from_slice(&m.pid.to_ne_bytes());
        if is_err {
            out.extend_from_slice(&m.error.to_ne_bytes());
        }
    }
    out
}

impl Sockets {
    /// An empty table that already knows the generic netlink families.
    pub fn with_families(families: GenlFamilies) -> Self {
        Sockets { families, ..Default::default() }
    }

    /// Learns of a netlink socket that existed before plegwatch started.
    pub fn seed_netlink(&mut self, tgid: u32, fd: u32, protocol: u32, comm: String) {
        self.netlink.entry(sock_key(tgid, fd)).or_insert_with(|| NetlinkSocket {
            tgid,
            fd,
            protocol,
            comm,
            tracker: SocketTracker::new(protocol),
            last_sent: None,
            replied_since: false,
        });
    }

    /// Takes one send or receive record.
    pub fn on_io(&mut self, rec: &SockIo) {
        if rec.class.kind == SockKind::Dbus as u32 {
            self.on_dbus_io(rec);
            return;
        }
        if rec.class.kind != SockKind::Netlink as u32 {
            return;
        }
        let key = sock_key(rec.tgid, rec.fd);
        let s = self.netlink.entry(key).or_insert_with(|| NetlinkSocket {
            tgid: rec.tgid,
            fd: rec.fd,
            protocol: rec.class.proto,
            comm: cstr(&rec.comm),
            tracker: SocketTracker::new(rec.class.proto),
            last_sent: None,
            replied_since: false,
        });
        let n = (rec.n_nl as usize).min(rec.nl.len());
        let buf = headers_buffer(&rec.nl[..n]);
        // All headers walked unless the kernel's summary table filled up.
        let total = if n == rec.nl.len() { buf.len() + 1 } else { buf.len() };
        if rec.slot < SOCK_FIRST_RECV {
            let opened = s.tracker.on_send_captured(&buf, total, rec.end_ns);
            self.seen.netlink_requests += opened as u64;
            if let Some(m) = rec.nl[..n].iter().rev().find(|m| m.msg_type >= 16) {
                s.last_sent =
                    Some(Sent { dst: rec.nl_dst, msg_type: m.msg_type, flags: m.flags, seq: m.seq, sent_ns: rec.start_ns, tid: rec.tid });
                s.replied_since = false;
            }
        } else {
            let done = s.tracker.on_recv_captured(&buf, total, rec.end_ns, Some(&mut self.families));
            self.seen.netlink_answered += done.iter().filter(|c| !c.assumed).count() as u64;
            if n > 0 {
                s.replied_since = true;
            }
        }
    }

    fn on_dbus_io(&mut self, rec: &SockIo) {
        let key = sock_key(rec.tgid, rec.fd);
        let s = self.dbus.entry(key).or_insert_with(|| DbusSocket {
            tgid: rec.tgid,
            fd: rec.fd,
            comm: cstr(&rec.comm),
            conn: Connection::new(Side::Client),
            writer_tid: rec.tid,
        });
        let n = (rec.captured as usize).min(rec.data.len());
        let total = usize::try_from(rec.ret).unwrap_or(0);
        if rec.slot < SOCK_FIRST_RECV {
            s.writer_tid = rec.tid;
            let fed = s.conn.on_write(&rec.data[..n], total, rec.start_ns);
            self.seen.dbus_calls +=
                fed.messages.iter().filter(|m| m.kind == MessageKind::MethodCall && !m.no_reply_expected()).count() as u64;
        } else {
            let (fed, answered) = s.conn.on_read(&rec.data[..n], total, rec.end_ns);
            self.seen.dbus_answered += answered.len() as u64;
            for m in &fed.messages {
                if let (MessageKind::MethodReturn | MessageKind::Error, Some(r)) = (m.kind, m.reply_serial) {
                    self.replies.push((key, r));
                }
            }
        }
    }

    /// Learns of a D-Bus client connection that existed before plegwatch started.
    pub fn seed_dbus(&mut self, tgid: u32, fd: u32, comm: String) {
        self.dbus.entry(sock_key(tgid, fd)).or_insert_with(|| DbusSocket {
            tgid,
            fd,
            comm,
            conn: Connection::new(Side::Client),
            writer_tid: tgid,
        });
    }

    /// The replies read since the last call.
    pub fn take_replies(&mut self) -> Vec<(SockKey, u32)> {
        std::mem::take(&mut self.replies)
    }

    /// The open D-Bus calls.
    pub fn open_dbus(&self, now_ns: u64) -> Vec<DbusOpen> {
        let mut out = Vec::new();
        for (key, s) in &self.dbus {
            for o in s.conn.outstanding(now_ns) {
                out.push(DbusOpen {
                    sock: *key,
                    tgid: s.tgid,
                    tid: s.writer_tid,
                    comm: s.comm.clone(),
                    fd: s.fd,
                    serial: o.call.serial,
                    destination: o.call.destination.clone(),
                    path: o.call.path.clone(),
                    interface: o.call.interface.clone(),
                    member: o.call.member.clone(),
                    sender: s.conn.calls().unique_name().map(String::from),
                    start_ns: o.call.at_ns,
                    before_attach: false,
                    holder_pid: None,
                });
            }
        }
        out
    }

    /// A socket was closed, or its fd given to another file (`dup2` onto
    /// it, `close_range`): its requests are gone with it.
    pub fn on_closed(&mut self, tgid: u32, fd: u32) {
        self.netlink.remove(&sock_key(tgid, fd));
        self.dbus.remove(&sock_key(tgid, fd));
    }

    /// A process forgot all its sockets (an exec, a wide `close_range`): what
    /// it sent and read is gone; a socket it still uses starts anew.
    pub fn forget_process(&mut self, tgid: u32) {
        self.netlink.retain(|_, s| s.tgid != tgid);
        self.dbus.retain(|_, s| s.tgid != tgid);
        self.replies.retain(|(k, _)| (k >> 32) as u32 != tgid);
    }

    /// The processes holding tracked netlink sockets.
    pub fn tgids(&self) -> Vec<u32> {
        let mut t: Vec<u32> = self.netlink.values().map(|s| s.tgid).collect();
        t.sort_unstable();
        t.dedup();
        t
    }

    /// Forgets the sockets with something open whose process is gone (an
    /// exit closes its sockets without a `close()` the kernel side sees).
    pub fn retain_live_open(&mut self, alive: impl Fn(u32) -> bool) {
        self.netlink.retain(|_, s| (s.tracker.is_idle() && s.last_sent.is_none()) || alive(s.tgid));
        self.dbus.retain(|_, s| s.conn.outstanding(0).is_empty() || alive(s.tgid));
    }

    /// Forgets the sockets of processes that are gone.
    pub fn retain_live(&mut self, alive: impl Fn(u32) -> bool) {
        self.netlink.retain(|_, s| alive(s.tgid));
        self.dbus.retain(|_, s| alive(s.tgid));
    }

    /// The open netlink requests at `now_ns`, given the socket calls in flight
    /// in the kernel (`SOCK_CALLS`: tid → call).
    pub fn open_netlink(&self, calls: &[(u32, SockCall)], _now_ns: u64) -> Vec<NetlinkOpen> {
        let recv_on = |tgid: u32, fd: u32| {
            calls
                .iter()
                .filter(|(_, c)| c.tgid == tgid && c.fd == fd && c.slot >= SOCK_FIRST_RECV)
                .min_by_key(|(_, c)| c.start_ns)
                .map(|(tid, c)| (*tid, c.start_ns))
        };
        let mut out = Vec::new();
        for (key, s) in &self.netlink {
            let recv = recv_on(s.tgid, s.fd);
            let outstanding = s.tracker.outstanding(0);
            for o in &outstanding {
                out.push(open_of(*key, s, &o.request, recv));
            }
            if outstanding.is_empty() && !s.replied_since {
                if let (Some(sent), Some((_, since))) = (&s.last_sent, recv) {
                    if since >= sent.sent_ns {
                        out.push(NetlinkOpen {
                            sock: *key,
                            tgid: s.tgid,
                            tid: sent.tid,
                            comm: s.comm.clone(),
                            fd: s.fd,
                            protocol: s.protocol,
                            msg_type: sent.msg_type,
                            flags: sent.flags,
                            seq: Some(sent.seq),
                            start_ns: sent.sent_ns,
                            reply_expected: false,
                            recv_since_ns: recv.map(|r| r.1),
                            recv_tid: recv.map(|r| r.0),
                            before_attach: false,
                            in_send: false,
                            dst_portid: sent.dst,
                        });
                    }
                }
            }
        }
        // Sends still inside the kernel: the request is being processed.
        for (tid, c) in calls.iter().filter(|(_, c)| c.slot < SOCK_FIRST_RECV && c.class.kind == SockKind::Netlink as u32) {
            let key = sock_key(c.tgid, c.fd);
            let s = self.netlink.get(&key);
            out.push(NetlinkOpen {
                sock: key,
                tgid: c.tgid,
                tid: *tid,
                comm: s.map(|s| s.comm.clone()).unwrap_or_default(),
                fd: c.fd,
                protocol: c.class.proto,
                msg_type: c.nl_type,
                flags: c.nl_flags,
                seq: Some(c.nl_seq),
                start_ns: c.start_ns,
                reply_expected: false,
                recv_since_ns: None,
                recv_tid: None,
                before_attach: false,
                in_send: true,
                dst_portid: c.nl_dst,
            });
        }
        out
    }
}

fn open_of(key: SockKey, s: &NetlinkSocket, r: &Request, recv: Option<(u32, u64)>) -> NetlinkOpen {
    NetlinkOpen {
        sock: key,
        tgid: s.tgid,
        tid: recv.map(|r| r.0).unwrap_or(0),
        comm: s.comm.clone(),
        fd: s.fd,
        protocol: s.protocol,
        msg_type: r.msg_type,
        flags: r.flags,
        seq: Some(r.seq),
        start_ns: r.sent_ns,
        reply_expected: true,
        recv_since_ns: recv.map(|r| r.1),
        recv_tid: recv.map(|r| r.0),
        before_attach: false,
        in_send: false,
        dst_portid: s.last_sent.as_ref().map(|l| l.dst).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegwatch_abi::{EventHeader, SockClass, NL_SUMMARIES, SOCK_DATA_CAP};

    const RTM_NEWADDR: u16 = 20;
    const RTM_GETLINK: u16 = 18;
    const REQUEST: u16 = 1;
    const ACK: u16 = 4;
    const DUMP: u16 = 0x300;
    const MULTI: u16 = 2;

    fn rec(slot: u32, start_ns: u64, msgs: &[(u16, u16, u32, i32)]) -> SockIo {
        let mut nl = [NlSummary::default(); NL_SUMMARIES];
        for (i, m) in msgs.iter().enumerate() {
            nl[i] = NlSummary { len: 16, msg_type: m.0, flags: m.1, seq: m.2, error: m.3, pid: 0 };
        }
        SockIo {
            header: EventHeader { kind: 2, _pad: 0 },
            start_ns,
            end_ns: start_ns + 10,
            ret: 16,
            tgid: 7,
            tid: 8,
            fd: 3,
            slot,
            class: SockClass { kind: SockKind::Netlink as u32, proto: 0, gen: 0, _pad: 0 },
            n_nl: msgs.len() as u32,
            captured: 0,
            nl_dst: 0,
            _pad: 0,
            comm: *b"terwayd\0\0\0\0\0\0\0\0\0",
            nl,
            data: [0; SOCK_DATA_CAP],
        }
    }

    fn recv_call(start_ns: u64) -> (u32, SockCall) {
        let class = SockClass { kind: SockKind::Netlink as u32, proto: 0, gen: 0, _pad: 0 };
        (8, SockCall { start_ns, buf: 1, buf_len: 4096, tgid: 7, fd: 3, slot: 6, nl_seq: 0, nl_type: 0, nl_flags: 0, nl_dst: 0, class })
    }

    #[test]
    fn no_ack_request_then_blocking_recv_is_open() {
        let mut s = Sockets::default();
        s.on_io(&rec(2, 100, &[(RTM_NEWADDR, REQUEST, 42, 0)]));
        assert!(s.open_netlink(&[], 200).is_empty(), "not open until the sender waits for it");
        let open = s.open_netlink(&[recv_call(150)], 200);
        assert_eq!(open.len(), 1);
        let o = &open[0];
        assert_eq!((o.msg_type, o.seq, o.start_ns, o.reply_expected, o.recv_since_ns), (RTM_NEWADDR, Some(42), 100, false, Some(150)));
        assert_eq!(o.comm, "terwayd");
        let d = o.detail(&s.families, 1_000_000_150);
        assert_eq!(d["protocol"], "route");
        assert_eq!(d["message_type"], "RTM_NEWADDR");
        assert!((d["recv_blocked_s"].as_f64().unwrap() - 1.0).abs() < 1e-6);
    }

    #[test]
    fn acked_and_dumped_requests_close() {
        let mut s = Sockets::default();
        s.on_io(&rec(2, 100, &[(RTM_NEWADDR, REQUEST | ACK, 1, 0)]));
        assert_eq!(s.open_netlink(&[], 150).len(), 1, "an ack is expected");
        s.on_io(&rec(6, 160, &[(NLMSG_ERROR, 0, 1, 0)]));
        assert!(s.open_netlink(&[recv_call(170)], 200).is_empty());

        s.on_io(&rec(2, 300, &[(RTM_GETLINK, REQUEST | DUMP, 2, 0)]));
        s.on_io(&rec(6, 310, &[(16, MULTI, 2, 0), (16, MULTI, 2, 0)]));
        assert_eq!(s.open_netlink(&[], 320).len(), 1, "the dump is not done");
        s.on_io(&rec(6, 330, &[(3, MULTI, 2, 0)]));
        assert!(s.open_netlink(&[recv_call(340)], 350).is_empty());
    }

    #[test]
    fn listener_is_never_open() {
        let mut s = Sockets::default();
        s.seed_netlink(7, 3, 0, "ip".into());
        s.on_io(&rec(6, 100, &[(RTM_NEWADDR, 0, 0, 0)]));
        assert!(s.open_netlink(&[recv_call(200)], 10_000_000_000).is_empty());
        s.on_closed(7, 3);
        assert!(s.netlink.is_empty());
    }

    /// A D-Bus client's send (`slot` < SOCK_FIRST_RECV) or receive of `bytes`.
    fn dbus_rec(slot: u32, start_ns: u64, bytes: &[u8]) -> SockIo {
        let mut r = rec(slot, start_ns, &[]);
        r.class = SockClass { kind: SockKind::Dbus as u32, proto: 0, gen: 0, _pad: 0 };
        r.captured = bytes.len() as u32;
        r.ret = bytes.len() as i64;
        r.data[..bytes.len()].copy_from_slice(bytes);
        r
    }

    #[test]
    fn seen_counts_requests_that_expect_a_reply_and_their_answers() {
        let mut s = Sockets::default();
        // A get answered, a dump ended by NLMSG_DONE.
        s.on_io(&rec(2, 100, &[(RTM_GETLINK, REQUEST, 1, 0)]));
        s.on_io(&rec(6, 110, &[(16, 0, 1, 0)]));
        s.on_io(&rec(2, 200, &[(RTM_GETLINK, REQUEST | DUMP, 2, 0)]));
        s.on_io(&rec(6, 210, &[(16, MULTI, 2, 0)]));
        s.on_io(&rec(6, 220, &[(3, MULTI, 2, 0)]));
        // Not requests: a NEW without an ack (the kernel answers only failures), and what
        // a multicast listener reads.
        s.on_io(&rec(2, 300, &[(RTM_NEWADDR, REQUEST, 3, 0)]));
        let mut listener = rec(6, 400, &[(RTM_NEWADDR, 0, 0, 0), (RTM_NEWADDR, 0, 0, 0)]);
        listener.fd = 4;
        s.on_io(&listener);
        // One still waiting.
        s.on_io(&rec(2, 500, &[(RTM_NEWADDR, REQUEST | ACK, 4, 0)]));
        assert_eq!(s.seen, RequestsSeen { netlink_requests: 3, netlink_answered: 2, ..Default::default() });
    }

    #[test]
    fn seen_counts_dbus_calls_written_and_answered() {
        use crate::proto::dbus::header::{
            build::{call, reply},
            Endian, FLAG_NO_REPLY_EXPECTED,
        };
        let mut s = Sockets::default();
        let first = [b"\0AUTH EXTERNAL 30\r\nBEGIN\r\n".as_slice(), &call(Endian::Little, 1, "Hello").build()].concat();
        s.on_io(&dbus_rec(2, 100, &first));
        s.on_io(&dbus_rec(2, 110, &call(Endian::Little, 2, "NoReply").flags(FLAG_NO_REPLY_EXPECTED).build()));
        s.on_io(&dbus_rec(2, 120, &call(Endian::Little, 3, "GetId").build()));
        let got = [b"OK 0123456789abcdef\r\n".as_slice(), &reply(Endian::Little, 7, 1, ":1.42").build()].concat();
        s.on_io(&dbus_rec(6, 130, &got));
        // A second reply to the same serial answers nothing more.
        s.on_io(&dbus_rec(6, 140, &reply(Endian::Little, 8, 1, ":1.42").build()));
        assert_eq!(s.seen, RequestsSeen { dbus_calls: 2, dbus_answered: 1, ..Default::default() });
        assert_eq!(s.open_dbus(200).iter().map(|o| o.serial).collect::<Vec<_>>(), [3]);
    }

    #[test]
    fn a_reused_fd_starts_anew() {
        let mut s = Sockets::default();
        // A no-reply request, then one that expects an ack, on fd 3.
        s.on_io(&rec(2, 100, &[(RTM_NEWADDR, REQUEST, 41, 0)]));
        s.on_io(&rec(2, 110, &[(RTM_NEWADDR, REQUEST | ACK, 42, 0)]));
        assert_eq!(s.open_netlink(&[recv_call(150)], 200).len(), 1);
        // dup2 onto fd 3 (or close_range over it): the kernel sends SockClosed.
        s.on_closed(7, 3);
        assert!(s.open_netlink(&[recv_call(300)], 400).is_empty(), "a read on the new file at fd 3 waits for nothing");
    }

    #[test]
    fn forgetting_a_process_keeps_the_others_sockets() {
        let mut s = Sockets::default();
        s.on_io(&rec(2, 100, &[(RTM_NEWADDR, REQUEST | ACK, 1, 0)]));
        let mut other = rec(2, 100, &[(RTM_NEWADDR, REQUEST | ACK, 2, 0)]);
        other.tgid = 70;
        other.tid = 71;
        s.on_io(&other);
        assert_eq!(s.open_netlink(&[], 150).len(), 2);
        // Process 7 execs: everything it had is forgotten; 70's request stays.
        s.forget_process(7);
        let open = s.open_netlink(&[], 150);
        assert_eq!(open.iter().map(|o| (o.tgid, o.seq)).collect::<Vec<_>>(), [(70, Some(2))]);
        // The new program's first send on fd 3 is a new socket's.
        s.on_io(&rec(2, 200, &[(RTM_NEWADDR, REQUEST | ACK, 3, 0)]));
        assert_eq!(s.open_netlink(&[], 250).iter().filter(|o| o.tgid == 7).map(|o| o.seq).collect::<Vec<_>>(), [Some(3)]);
    }

    #[test]
    fn headers_buffer_round_trips_through_the_parser() {
        let nl = [
            NlSummary { len: 100, msg_type: 16, flags: MULTI, seq: 9, error: 0, pid: 0 },
            NlSummary { len: 36, msg_type: NLMSG_ERROR, flags: 0, seq: 9, error: -17, pid: 0 },
        ];
        let buf = headers_buffer(&nl);
        let parsed = crate::proto::netlink::header::parse(&buf, 0);
        assert_eq!(parsed.messages.len(), 2);
        assert!(!parsed.truncated && !parsed.malformed);
        assert_eq!(parsed.messages[1].errno, Some(-17));
    }
}
