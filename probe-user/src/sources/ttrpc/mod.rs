//! ttrpc requests from containerd to its shims, outstanding by stream id.
//!
//! The kernel (probe-ebpf `ttrpc.rs`) classifies a unix socket as ttrpc when
//! it connects to a shim socket, and reads the 10-byte header of every frame
//! written or read on it, never a payload. Here those headers become
//! outstanding requests per (process, socket, stream id) ([`tracker`]), each
//! with the goroutine that waits for its reply, and, once a request is old
//! enough to matter, the shim at the socket's other end: the client socket's
//! inode from `/proc/PID/fd`, its peer's inode from sock_diag
//! (`UNIX_DIAG_PEER`), and the process holding that peer. The graph joins
//! them to containerd's Go calls by goroutine (`graph::ttrpc`).
//!
//! **Why classify by the connect() path, in the kernel**, rather than by a
//! sock_diag lookup of the peer being a shim: frames are length-prefixed, so
//! the kernel must follow the stream from a frame boundary to find headers
//! without reading payloads. At `connect()` the stream is at its start; a
//! socket learnt later from userspace could be joined mid-frame. The path is
//! the one containerd itself computes (`shim.SocketAddress`: sha256 of the
//! containerd address, namespace and id, under `<state>/s/`, checked in the
//! 1.6.20, 1.7 and 2.x sources), so no lookup is needed at connect. Sockets
//! that existed before plegwatch started are found by their peer's name and
//! seeded as at a frame boundary: an idle ttrpc connection is between
//! frames, and a header that makes no sense drops the socket in the kernel.
//!
//! **Who waits.** ttrpc ≥ 1.2 (containerd 1.7, 2.x) writes a request from
//! the calling goroutine (`(*Client).send` under `sendLock`, then
//! `channel.send`), so the goroutine read from TLS at the write is the
//! caller. ttrpc 1.1 does not: checked in v1.1.1 (`client.go`), which
//! Debian's containerd 1.6.20 is built with (its `.gopclntab` has
//! `(*Client).run` and no `createStream`), the caller hands the request to
//! the client's sender goroutine over a channel in `(*Client).dispatch`, and
//! that goroutine writes every frame. Two entry uprobes bridge it: at
//! `dispatch` the caller's goroutine and the `*Request`, at the sender's
//! `(*Client).send` the same `*Request` and the stream id; the kernel sends
//! that pairing ([`plegwatch_abi::TtrpcBind`]) before the frame is written.

pub mod tracker;

use crate::{
    graph::ttrpc::{TtrpcFacts, TtrpcRequest},
    observe::{
        holders::{unix_peer::parse_socket_link, SocketOwners, UnixPeers},
        procfs,
    },
    proto::ttrpc::Header,
};
use plegwatch_abi::{Record, SOCK_FIRST_RECV, TTRPC_FRAMES};
use std::{collections::HashMap, os::unix::ffi::OsStrExt as _};
use tracker::{Io, SockKey, Tracker};

/// Requests younger than this get no peer lookup (most are answered in
/// well under a millisecond).
const RESOLVE_AFTER_NS: u64 = 500_000_000;

/// Whether a unix socket address is a containerd shim's ttrpc socket:
/// `…/s/` and 64 lowercase hex digits (the kernel makes the same check at
/// `connect()`).
pub fn is_shim_socket_name(name: &str) -> bool {
    let b = name.as_bytes();
    let Some(tail) = b.len().checked_sub(67).map(|i| &b[i..]) else { return false };
    tail.starts_with(b"/s/") && tail[3..].iter().all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
}

/// The shim at the other end of a client socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Peer {
    ino: u64,
    pid: u32,
}

/// The ttrpc source: outstanding requests and the shims they wait on.
#[derive(Default)]
pub struct TtrpcWatch {
    tracker: Tracker,
    peers: UnixPeers,
    owners: SocketOwners,
    /// Each client socket's shim, once found (a miss is asked again later).
    resolved: HashMap<SockKey, Peer>,
}

impl TtrpcWatch {
    /// Takes a `SOCK_EVENTS` record if it is a ttrpc one; says whether it was.
    pub fn on_record(&mut self, rec: &Record<'_>) -> bool {
        if let Record::TtrpcIo(rec) = rec {
            let n = (rec.n as usize).min(TTRPC_FRAMES);
            // The kernel checked each header as this parser does.
            let headers: Vec<Header> = rec.frames[..n].iter().filter_map(|f| Header::from_frame(f).ok()).collect();
            self.tracker.on_io(&Io {
                tgid: rec.tgid,
                tid: rec.tid,
                fd: rec.fd,
                g: rec.g,
                send: rec.slot < SOCK_FIRST_RECV,
                start_ns: rec.start_ns,
                comm: "",
                headers: &headers,
            });
            return true;
        }
        if let Record::TtrpcBind(b) = rec {
            self.tracker.on_bind(b.tgid, b.sender_g, b.caller_g, b.stream);
            return true;
        }
        false
    }

    /// A tracked socket was closed or replaced (or the kernel lost step).
    pub fn on_closed(&mut self, tgid: u32, fd: u32) {
        self.tracker.on_closed(tgid, fd);
        self.resolved.remove(&tracker::sock_key(tgid, fd));
    }

    pub fn forget_process(&mut self, tgid: u32) {
        self.tracker.forget_process(tgid);
        self.resolved.retain(|k, _| (k >> 32) as u32 != tgid);
    }

    /// Drops what belongs to processes that are gone.
    pub fn retain_live(&mut self) {
        self.tracker.retain_live(procfs::thread_exists);
        self.resolved.retain(|k, _| procfs::thread_exists((k >> 32) as u32));
    }

    /// (requests written, responses read) since the start.
    pub fn seen(&self) -> (u64, u64) {
        (self.tracker.requests, self.tracker.answered)
    }

    /// The outstanding requests at `now_ns`, with the shim of each one old
    /// enough to be looked up.
    pub fn facts(&mut self, now_ns: u64) -> TtrpcFacts {
        let open: Vec<(SockKey, u32, u32, tracker::Outstanding)> =
            self.tracker.outstanding().map(|(k, c, o)| (k, c.tgid, c.fd, o.clone())).collect();
        let mut requests = Vec::with_capacity(open.len());
        for (key, tgid, fd, o) in open {
            let peer = if now_ns.saturating_sub(o.start_ns) >= RESOLVE_AFTER_NS { self.peer(key, tgid, fd) } else { None };
            requests.push(TtrpcRequest {
                tgid,
                caller_g: o.caller_g,
                writer_tid: o.writer_tid,
                stream: o.stream,
                fd,
                sock_ino: peer.map(|p| p.ino),
                start_ns: o.start_ns,
                shim_pid: peer.map(|p| p.pid),
            });
        }
        TtrpcFacts { now_ns, requests }
    }

    /// The shim holding the other end of `tgid`'s socket `fd`.
    fn peer(&mut self, key: SockKey, tgid: u32, fd: u32) -> Option<Peer> {
        if let Some(p) = self.resolved.get(&key) {
            return Some(*p);
        }
        let link = std::fs::read_link(format!("/proc/{tgid}/fd/{fd}")).ok()?;
        let ino = parse_socket_link(link.as_os_str().as_bytes())?;
        let info = self.peers.peer_of(ino)?;
        let pid = self.owners.pids_of(info.peer_inode).into_iter().find(|p| *p != tgid)?;
        let p = Peer { ino, pid };
        self.resolved.insert(key, p);
        Some(p)
    }
}

/// The client ends of shim connections open now, as (process, fd): sockets
/// with no name of their own whose peer is named like a shim socket.
pub fn client_sockets(self_tgid: u32) -> Vec<(u32, u32)> {
    let mut peers = UnixPeers::new();
    if let Err(e) = peers.refresh() {
        tracing::warn!("ttrpc: no unix socket dump, connections made before start are not followed: {e}");
        return Vec::new();
    }
    let mut out = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else { return out };
    for p in procs.flatten() {
        let Some(tgid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if tgid == self_tgid {
            continue;
        }
        for (fd, inode) in procfs::socket_fds(tgid) {
            let Some(info) = peers.peer_of(inode) else { continue };
            if info.name.is_none() && info.peer_name.as_deref().is_some_and(is_shim_socket_name) {
                out.push((tgid, fd));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shim_socket_names_are_recognised() {
        let hex = "0123456789abcdef".repeat(4);
        assert!(is_shim_socket_name(&format!("/run/containerd/s/{hex}")));
        assert!(is_shim_socket_name(&format!("/var/lib/x/state/s/{hex}")));
        assert!(!is_shim_socket_name(&format!("/run/containerd/s/{hex}.debug")));
        assert!(!is_shim_socket_name(&format!("/run/containerd/x/{hex}")));
        assert!(!is_shim_socket_name(&format!("/run/containerd/s/{}", hex.to_uppercase())));
        assert!(!is_shim_socket_name("/run/containerd/containerd.sock.ttrpc"));
    }
}
