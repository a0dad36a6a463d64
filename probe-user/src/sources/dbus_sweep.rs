//! The startup sweep for D-Bus: bus connections that already existed, and
//! method calls already stuck when plegwatch started.
//!
//! A call made before plegwatch started was never seen being written. But a
//! call that nobody has answered is often still *queued*: unread in the
//! receive queue of the callee's bus socket (a frozen or stuck service reads
//! nothing), or of the bus daemon's socket for the caller (a stuck daemon).
//! plegwatch duplicates that socket (`pidfd_getfd`, root only) and peeks at the
//! queue (`MSG_PEEK` at `SO_PEEK_OFF` offsets: nothing is consumed), reading
//! only message headers: each body is jumped over, never read. The
//! queue's owner is the holder; the caller is named by the call's `sender`.

use crate::{
    observe::holders::unix_peer,
    observe::procfs,
    proto::dbus::{
        header::{self, Fixed, MessageKind, FIXED_LEN},
        stream::MAX_HEADER_FIELDS,
    },
};
use std::{
    collections::{HashMap, HashSet},
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
};

/// Paths that are D-Bus buses on any node, besides those dbus-daemon or
/// dbus-broker are found listening on.
pub const KNOWN_BUS_PATHS: &[&str] = &["/run/dbus/system_bus_socket", "/var/run/dbus/system_bus_socket", "/run/systemd/private"];

/// A bus connection that existed at startup.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BusConn {
    pub tgid: u32,
    pub fd: u32,
    pub inode: u64,
    pub bus_path: String,
    /// The bus daemon's end (an accepted socket), or a client's.
    pub daemon_side: bool,
}

/// A method call found unread in a socket's receive queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueuedCall {
    /// Who has not read it.
    pub holder_pid: u32,
    /// The process at the other end of that socket (the caller, when the
    /// queue is the bus daemon's).
    pub peer_pid: Option<u32>,
    pub bus_path: String,
    pub serial: u32,
    pub sender: Option<String>,
    pub destination: Option<String>,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
}

/// What the sweep found.
#[derive(Clone, Debug, Default)]
pub struct BusSweep {
    pub connections: Vec<BusConn>,
    pub queued: Vec<QueuedCall>,
}

/// How far into a queue calls are looked for (header bytes only are read).
const PEEK_MAX: usize = 64 * 1024;

/// Sweeps every process but `self_tgid`.
pub fn sweep(self_tgid: u32) -> BusSweep {
    let Ok(sockets) = unix_peer::query(None) else { return BusSweep::default() };
    let by_inode: HashMap<u64, &unix_peer::UnixSocketInfo> = sockets.iter().map(|s| (s.inode, s)).collect();
    // Every socket fd of every process.
    let mut owner: HashMap<u64, (u32, u32)> = HashMap::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if pid == self_tgid {
                continue;
            }
            for (fd, inode) in procfs::socket_fds(pid) {
                owner.entry(inode).or_insert((pid, fd));
            }
        }
    }
    // Bus paths: the known ones, and every path a bus daemon listens on.
    let mut bus_paths: HashSet<String> = KNOWN_BUS_PATHS.iter().map(|s| s.to_string()).collect();
    for s in sockets.iter().filter(|s| s.state == 10) {
        let (Some(name), Some((pid, _))) = (&s.name, owner.get(&s.inode)) else { continue };
        if procfs::comm(*pid).is_some_and(|c| c == "dbus-daemon" || c.starts_with("dbus-broker")) {
            bus_paths.insert(name.clone());
        }
    }
    let mut out = BusSweep::default();
    for s in sockets.iter().filter(|s| s.state == 1) {
        let Some(&(tgid, fd)) = owner.get(&s.inode) else { continue };
        let peer_name = s.peer_inode.and_then(|p| by_inode.get(&p)).and_then(|p| p.name.clone());
        let (path, daemon_side) = match (&s.name, peer_name) {
            (Some(n), _) if bus_paths.contains(n) => (n.clone(), true),
            (None, Some(p)) if bus_paths.contains(&p) => (p, false),
            _ => continue,
        };
        out.connections.push(BusConn { tgid, fd, inode: s.inode, bus_path: path.clone(), daemon_side });
        let peer_pid = s.peer_inode.and_then(|p| owner.get(&p)).map(|o| o.0);
        for m in peek_calls(tgid, fd) {
            out.queued.push(QueuedCall { holder_pid: tgid, peer_pid, bus_path: path.clone(), ..m });
        }
    }
    out
}

/// The METHOD_CALLs (that want a reply) queued unread on `fd` of `pid`.
///
/// Only header bytes are peeked: the fixed header at the socket's peek
/// offset (`SO_PEEK_OFF`), then the header fields, then the offset jumps over
/// the body, which is never read. The offset is put back to -1 (off) after.
fn peek_calls(pid: u32, fd: u32) -> Vec<QueuedCall> {
    let Some(dup) = dup_fd(pid, fd) else { return Vec::new() };
    let mut out = Vec::new();
    let mut off = 0usize;
    let mut hdr = Vec::new();
    while off < PEEK_MAX {
        let mut fixed = [0u8; FIXED_LEN];
        if peek_at(&dup, off, &mut fixed) != Some(FIXED_LEN) {
            break;
        }
        let Ok(f) = Fixed::parse(&fixed) else { break };
        if f.fields_len as usize > MAX_HEADER_FIELDS {
            break;
        }
        hdr.resize(f.header_len(), 0);
        if peek_at(&dup, off, &mut hdr) != Some(f.header_len()) {
            break;
        }
        let Ok(m) = header::parse(&hdr) else { break };
        off = off.saturating_add(f.message_len());
        if m.kind == MessageKind::MethodCall && !m.no_reply_expected() {
            out.push(QueuedCall {
                holder_pid: pid,
                peer_pid: None,
                bus_path: String::new(),
                serial: m.serial,
                sender: m.sender,
                destination: m.destination,
                path: m.path,
                interface: m.interface,
                member: m.member,
            });
        }
    }
    set_peek_off(&dup, -1);
    out
}

fn set_peek_off(fd: &OwnedFd, off: libc::c_int) -> bool {
    // SAFETY: a valid fd and an int option of the right size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEEK_OFF,
            (&off as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
    }
}

/// Peeks `buf.len()` bytes at `off` of the queue: how many came.
fn peek_at(fd: &OwnedFd, off: usize, buf: &mut [u8]) -> Option<usize> {
    if !set_peek_off(fd, libc::c_int::try_from(off).ok()?) {
        return None;
    }
    // SAFETY: a valid fd and buffer; MSG_PEEK leaves the queue as it is.
    let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    usize::try_from(n).ok()
}

/// A copy of another process's fd (`pidfd_open` + `pidfd_getfd`, Linux >= 5.6).
fn dup_fd(pid: u32, fd: u32) -> Option<OwnedFd> {
    // SAFETY: plain syscalls; the returned fds are owned below.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if pidfd < 0 {
        return None;
    }
    // SAFETY: a fresh fd we own.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    // SAFETY: as above.
    let dup = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd as libc::c_int, 0) };
    if dup < 0 {
        return None;
    }
    // SAFETY: a fresh fd we own.
    Some(unsafe { OwnedFd::from_raw_fd(dup as i32) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peeks_without_consuming() {
        use std::io::Write as _;
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        use crate::proto::dbus::header::{build, Endian};
        let call = build::call(Endian::Little, 7, "Hello").build();
        a.write_all(&call).unwrap();
        let me = std::process::id();
        let calls = peek_calls(me, b.as_raw_fd() as u32);
        assert_eq!(calls.len(), 1, "{calls:?}");
        assert_eq!(calls[0].serial, 7);
        assert_eq!(calls[0].member.as_deref(), Some("Hello"));
        // Still there.
        assert_eq!(peek_calls(me, b.as_raw_fd() as u32).len(), 1);
        // A call behind a body is found by jumping over it.
        let mut with_body = build::call(Endian::Little, 8, "Second");
        with_body.body = vec![0xAB; 5000];
        a.write_all(&with_body.build()).unwrap();
        a.write_all(&build::call(Endian::Little, 9, "Third").build()).unwrap();
        let calls = peek_calls(me, b.as_raw_fd() as u32);
        assert_eq!(calls.iter().map(|c| c.serial).collect::<Vec<_>>(), [7, 8, 9], "{calls:?}");
        assert_eq!(calls[2].member.as_deref(), Some("Third"));
    }
}
