//! Outstanding ttrpc requests per client socket, from the frame headers the
//! kernel read: a request frame written opens (socket, stream id); the
//! response read back closes it (or a data frame flagged remote-closed, for
//! a ttrpc ≥ 1.2 stream). Pure: no kernel, no `/proc`, time passed in.

use crate::proto::ttrpc::{FrameKind, Header};
use std::collections::{BTreeMap, HashMap};

/// A socket is named by `tgid << 32 | fd`, as in the kernel's `SOCKS` map.
pub type SockKey = u64;

/// Most requests kept outstanding per socket (ttrpc multiplexes; containerd
/// has a handful at once per shim): past it the oldest are dropped.
const PER_SOCKET_MAX: usize = 256;
/// Most ttrpc 1.1 caller bindings waiting for their frame.
const BINDS_MAX: usize = 4096;

/// One request with no response yet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outstanding {
    pub stream: u32,
    pub writer_tid: u32,
    /// The goroutine that wrote the frame.
    pub writer_g: u64,
    /// The goroutine waiting for the reply: the writer's, unless a ttrpc 1.1
    /// sender goroutine wrote it for a `dispatch` caller.
    pub caller_g: u64,
    pub start_ns: u64,
}

/// One client connection.
#[derive(Clone, Debug, Default)]
pub struct Conn {
    pub tgid: u32,
    pub fd: u32,
    pub comm: String,
    pub pending: BTreeMap<u32, Outstanding>,
}

/// What one send or receive moved.
#[derive(Clone, Debug)]
pub struct Io<'a> {
    pub tgid: u32,
    pub tid: u32,
    pub fd: u32,
    pub g: u64,
    pub send: bool,
    pub start_ns: u64,
    pub comm: &'a str,
    pub headers: &'a [Header],
}

/// Every ttrpc client socket and its outstanding requests.
#[derive(Debug, Default)]
pub struct Tracker {
    conns: HashMap<SockKey, Conn>,
    /// ttrpc 1.1: (process, sender goroutine, stream id) → the caller's goroutine.
    binds: HashMap<(u32, u64, u32), u64>,
    pub requests: u64,
    pub answered: u64,
}

pub fn sock_key(tgid: u32, fd: u32) -> SockKey {
    (u64::from(tgid) << 32) | u64::from(fd)
}

impl Tracker {
    /// ttrpc 1.1's sender goroutine is about to write `stream` for `caller_g`.
    pub fn on_bind(&mut self, tgid: u32, sender_g: u64, caller_g: u64, stream: u32) {
        if self.binds.len() >= BINDS_MAX {
            self.binds.clear();
        }
        self.binds.insert((tgid, sender_g, stream), caller_g);
    }

    pub fn on_io(&mut self, io: &Io) {
        let key = sock_key(io.tgid, io.fd);
        let conn =
            self.conns.entry(key).or_insert_with(|| Conn { tgid: io.tgid, fd: io.fd, comm: io.comm.to_string(), pending: BTreeMap::new() });
        for h in io.headers {
            if io.send {
                if h.kind != FrameKind::Request {
                    continue;
                }
                let caller_g = self.binds.remove(&(io.tgid, io.g, h.stream)).unwrap_or(io.g);
                if conn.pending.len() >= PER_SOCKET_MAX {
                    let oldest = conn.pending.iter().min_by_key(|(_, o)| o.start_ns).map(|(s, _)| *s);
                    if let Some(s) = oldest {
                        conn.pending.remove(&s);
                    }
                }
                self.requests += 1;
                conn.pending.insert(
                    h.stream,
                    Outstanding { stream: h.stream, writer_tid: io.tid, writer_g: io.g, caller_g, start_ns: io.start_ns },
                );
            } else if h.closes() && conn.pending.remove(&h.stream).is_some() {
                self.answered += 1;
            }
        }
    }

    /// The socket was closed, its fd given to another file, or the kernel
    /// lost step with its stream: its requests are gone with it.
    pub fn on_closed(&mut self, tgid: u32, fd: u32) {
        self.conns.remove(&sock_key(tgid, fd));
    }

    pub fn forget_process(&mut self, tgid: u32) {
        self.conns.retain(|_, c| c.tgid != tgid);
        self.binds.retain(|k, _| k.0 != tgid);
    }

    /// Drops the sockets of processes that are gone.
    pub fn retain_live(&mut self, alive: impl Fn(u32) -> bool) {
        self.conns.retain(|_, c| alive(c.tgid));
        self.binds.retain(|k, _| alive(k.0));
    }

    /// Every outstanding request, with its socket.
    pub fn outstanding(&self) -> impl Iterator<Item = (SockKey, &Conn, &Outstanding)> {
        self.conns.iter().flat_map(|(k, c)| c.pending.values().map(move |o| (*k, c, o)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(kind: FrameKind, stream: u32, flags: u8) -> Header {
        Header { len: 4, stream, kind, flags }
    }

    fn io<'a>(send: bool, g: u64, at: u64, headers: &'a [Header]) -> Io<'a> {
        Io { tgid: 10, tid: 11, fd: 7, g, send, start_ns: at, comm: "containerd", headers }
    }

    #[test]
    fn a_request_stays_outstanding_until_its_response_is_read() {
        let mut t = Tracker::default();
        t.on_io(&io(true, 0xa, 100, &[h(FrameKind::Request, 1, 0)]));
        t.on_io(&io(true, 0xb, 200, &[h(FrameKind::Request, 3, 0)]));
        // One read brings the response to 3 and another stream's.
        t.on_io(&io(false, 0xe, 300, &[h(FrameKind::Response, 3, 0), h(FrameKind::Response, 99, 0)]));
        let left: Vec<(u32, u64, u64)> = t.outstanding().map(|(_, _, o)| (o.stream, o.caller_g, o.start_ns)).collect();
        assert_eq!(left, vec![(1, 0xa, 100)]);
        assert_eq!((t.requests, t.answered), (2, 1));
        t.on_closed(10, 7);
        assert_eq!(t.outstanding().count(), 0);
    }

    /// ttrpc 1.1: the sender goroutine writes; the bind names the caller.
    #[test]
    fn a_bound_request_belongs_to_its_dispatch_caller() {
        let mut t = Tracker::default();
        t.on_bind(10, 0x5e, 0xca11, 7);
        t.on_io(&io(true, 0x5e, 100, &[h(FrameKind::Request, 7, 0)]));
        t.on_io(&io(true, 0x5e, 110, &[h(FrameKind::Request, 9, 0)]));
        let mut by: Vec<(u32, u64)> = t.outstanding().map(|(_, _, o)| (o.stream, o.caller_g)).collect();
        by.sort();
        assert_eq!(by, vec![(7, 0xca11), (9, 0x5e)], "an unbound request is the writer's own");
    }

    /// ttrpc ≥ 1.2 streams: data frames do not close a stream until flagged.
    #[test]
    fn a_stream_closes_on_its_last_data_frame() {
        let mut t = Tracker::default();
        t.on_io(&io(true, 0xa, 100, &[h(FrameKind::Request, 5, 2)]));
        t.on_io(&io(false, 0xe, 200, &[h(FrameKind::Data, 5, 0)]));
        assert_eq!(t.outstanding().count(), 1);
        t.on_io(&io(false, 0xe, 300, &[h(FrameKind::Data, 5, 1)]));
        assert_eq!(t.outstanding().count(), 0);
    }
}
