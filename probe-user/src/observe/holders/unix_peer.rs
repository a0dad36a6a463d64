//! Unix socket peers through NETLINK_SOCK_DIAG (`unix_diag`, as `ss -x`),
//! and socket owners through `/proc/*/fd/*` (as `ss -p`).
//!
//! Both see the caller's network namespace (sock_diag) and the processes it
//! may read (`/proc/PID/fd` needs root for other users' processes).

use super::HolderError;
use crate::kernel::netlink;
use crate::proto::netlink::{dump::DumpError, names::NETLINK_SOCK_DIAG};
use netlink_packet_core::{NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_DUMP, NLM_F_REQUEST};
use netlink_packet_sock_diag::{
    unix::{nlas::UnixDiagName, ShowFlags, StateFlags, UnixRequest, UnixResponse},
    SockDiagMessage,
};
use std::{
    collections::HashMap,
    fs,
    ops::ControlFlow,
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// At most this many sockets are cached; the cache is cleared past it.
const MAX_CACHED: usize = 1 << 16;

/// A unix socket as sock_diag reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnixSocketInfo {
    pub inode: u64,
    /// `SOCK_STREAM`, `SOCK_DGRAM`, `SOCK_SEQPACKET`.
    pub kind: u8,
    /// `TCP_ESTABLISHED` (1), `TCP_LISTEN` (10), ...
    pub state: u8,
    pub peer_inode: Option<u64>,
    /// The address it is bound to: a path, or `@name` for an abstract one.
    /// An accepted socket carries its listener's address.
    pub name: Option<String>,
}

/// The other end of a connected unix socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PeerInfo {
    pub peer_inode: u64,
    /// This socket's own address, if bound (the server end of a connection).
    pub name: Option<String>,
    /// The peer's address, if bound (what a client connected to).
    pub peer_name: Option<String>,
}

impl PeerInfo {
    /// The path that names the connection: the server end's address, from
    /// either side.
    pub fn path(&self) -> Option<&str> {
        self.name.as_deref().or(self.peer_name.as_deref())
    }
}

/// Unix sockets by inode, asked of the kernel on a miss.
#[derive(Debug, Default)]
pub struct UnixPeers {
    cache: HashMap<u64, UnixSocketInfo>,
}

impl UnixPeers {
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the cache with a dump of every connected or listening unix
    /// socket. Returns how many there are.
    pub fn refresh(&mut self) -> Result<usize, HolderError> {
        let all = query(None)?;
        self.cache = all.into_iter().take(MAX_CACHED).map(|s| (s.inode, s)).collect();
        Ok(self.cache.len())
    }

    /// The socket `inode`, from the cache or asked of the kernel. `None` if
    /// it is not a unix socket of this network namespace (or is gone, or
    /// sock_diag failed).
    pub fn info(&mut self, inode: u64) -> Option<UnixSocketInfo> {
        if let Some(s) = self.cache.get(&inode) {
            return Some(s.clone());
        }
        let ino = u32::try_from(inode).ok()?;
        let found = query(Some(ino)).ok()?.into_iter().find(|s| s.inode == inode)?;
        if self.cache.len() >= MAX_CACHED {
            self.cache.clear();
        }
        self.cache.insert(inode, found.clone());
        Some(found)
    }

    /// The socket `inode` as the cache has it (never asks the kernel).
    pub fn cached(&self, inode: u64) -> Option<&UnixSocketInfo> {
        self.cache.get(&inode)
    }

    /// The peer of the connected socket `inode`.
    pub fn peer_of(&mut self, inode: u64) -> Option<PeerInfo> {
        let me = self.info(inode)?;
        let peer_inode = me.peer_inode?;
        let peer_name = self.info(peer_inode).and_then(|p| p.name);
        Some(PeerInfo { peer_inode, name: me.name, peer_name })
    }

    /// Drops a socket from the cache (it was closed).
    pub fn forget(&mut self, inode: u64) {
        self.cache.remove(&inode);
    }
}

/// Asks sock_diag about one unix socket, or dumps them all (connected and
/// listening), with their name and peer.
pub fn query(inode: Option<u32>) -> Result<Vec<UnixSocketInfo>, HolderError> {
    let mut header = NetlinkHeader::default();
    header.flags = if inode.is_some() { NLM_F_REQUEST } else { NLM_F_REQUEST | NLM_F_DUMP };
    header.sequence_number = 1;
    let request = UnixRequest {
        state_flags: StateFlags::ESTABLISHED | StateFlags::LISTEN,
        inode: inode.unwrap_or(0),
        show_flags: ShowFlags::NAME | ShowFlags::PEER,
        // INET_DIAG_NOCOOKIE: look the socket up by inode alone.
        cookie: [0xff; 8],
    };
    let mut packet = NetlinkMessage::new(header, SockDiagMessage::UnixRequest(request).into());
    packet.finalize();
    let mut bytes = vec![0u8; packet.buffer_len()];
    packet.serialize(&mut bytes);

    let mut out = Vec::new();
    // Bounded: a dump of 100k sockets is a few thousand datagrams.
    let done = netlink::request(NETLINK_SOCK_DIAG, &bytes, 100_000, |_, raw| {
        let Ok(msg) = NetlinkMessage::<SockDiagMessage>::deserialize(raw) else { return ControlFlow::Continue(()) };
        if let NetlinkPayload::InnerMessage(SockDiagMessage::UnixResponse(r)) = msg.payload {
            out.push(info_of(&r));
            if inode.is_some() {
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    });
    match done {
        Ok(()) => Ok(out),
        Err(DumpError::Io { what, source }) => Err(HolderError::Io { what, source }),
        // A single socket that is gone is not an error.
        Err(DumpError::Kernel(errno)) if inode.is_some() && errno == -libc::ENOENT => Ok(out),
        Err(DumpError::Kernel(errno)) => Err(HolderError::Kernel(DumpError::kernel_io(errno))),
        Err(DumpError::Unfinished(seen)) => Err(HolderError::Unfinished(seen)),
    }
}

fn info_of(r: &UnixResponse) -> UnixSocketInfo {
    let name = r.name().map(|n| match n {
        UnixDiagName::Pathname(p) => p.to_string_lossy().into_owned(),
        UnixDiagName::Abstract(a) => {
            let end = a.iter().position(|&c| c == 0).unwrap_or(a.len());
            format!("@{}", String::from_utf8_lossy(&a[..end]))
        }
    });
    UnixSocketInfo {
        inode: u64::from(r.header.inode),
        kind: r.header.kind,
        state: r.header.state,
        peer_inode: r.peer().filter(|&p| p != 0).map(u64::from),
        name,
    }
}

/// The inode of a `/proc/PID/fd/N` link target `socket:[INODE]`.
pub fn parse_socket_link(target: &[u8]) -> Option<u64> {
    let inner = target.strip_prefix(b"socket:[")?.strip_suffix(b"]")?;
    std::str::from_utf8(inner).ok()?.parse().ok()
}

/// Which processes hold which sockets, from `/proc/*/fd/*`. Scanned whole on
/// a miss (at most once per `min_rescan`); a hit is checked against the
/// fd link it came from, so a closed fd or an exited process drops out.
#[derive(Debug)]
pub struct SocketOwners {
    proc_root: PathBuf,
    min_rescan: Duration,
    last_scan: Option<Instant>,
    /// inode → (pid, fd).
    by_inode: HashMap<u64, Vec<(u32, u32)>>,
    /// Rescans of `/proc` made (for tests and the curious).
    scans: u64,
}

impl Default for SocketOwners {
    fn default() -> Self {
        Self::new()
    }
}

impl SocketOwners {
    /// Reads `/proc`, rescanning at most once a second.
    pub fn new() -> Self {
        Self::with(Path::new("/proc"), Duration::from_secs(1))
    }

    /// Reads `proc_root`, rescanning at most once per `min_rescan`.
    pub fn with(proc_root: &Path, min_rescan: Duration) -> Self {
        SocketOwners { proc_root: proc_root.to_path_buf(), min_rescan, last_scan: None, by_inode: HashMap::new(), scans: 0 }
    }

    /// The processes that hold socket `inode`, sorted, no duplicates.
    pub fn pids_of(&mut self, inode: u64) -> Vec<u32> {
        if let Some(pids) = self.checked(inode) {
            return pids;
        }
        if self.last_scan.is_some_and(|t| t.elapsed() < self.min_rescan) {
            return Vec::new();
        }
        self.rescan();
        self.checked(inode).unwrap_or_default()
    }

    /// How many times `/proc` was rescanned.
    pub fn scans(&self) -> u64 {
        self.scans
    }

    /// Rereads every `/proc/PID/fd`.
    pub fn rescan(&mut self) {
        self.last_scan = Some(Instant::now());
        self.scans += 1;
        self.by_inode.clear();
        let Ok(procs) = fs::read_dir(&self.proc_root) else { return };
        for p in procs.flatten() {
            let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(fds) = fs::read_dir(p.path().join("fd")) else { continue };
            for fd in fds.flatten() {
                let Some(fdn) = fd.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
                let Ok(target) = fs::read_link(fd.path()) else { continue };
                if let Some(ino) = parse_socket_link(target.as_os_str().as_bytes()) {
                    self.by_inode.entry(ino).or_default().push((pid, fdn));
                }
            }
        }
    }

    /// The cached holders of `inode` that still hold it; `None` if none do.
    fn checked(&mut self, inode: u64) -> Option<Vec<u32>> {
        let root = &self.proc_root;
        let holders = self.by_inode.get_mut(&inode)?;
        holders.retain(|&(pid, fd)| {
            fs::read_link(root.join(format!("{pid}/fd/{fd}"))).ok().and_then(|t| parse_socket_link(t.as_os_str().as_bytes())) == Some(inode)
        });
        if holders.is_empty() {
            self.by_inode.remove(&inode);
            return None;
        }
        let mut pids: Vec<u32> = holders.iter().map(|&(pid, _)| pid).collect();
        pids.sort_unstable();
        pids.dedup();
        Some(pids)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::{
        fs::MetadataExt as _,
        net::{UnixListener, UnixStream},
    };

    fn inode_of(s: &impl std::os::fd::AsFd) -> u64 {
        let fd = s.as_fd().try_clone_to_owned().unwrap();
        std::fs::File::from(fd).metadata().unwrap().ino()
    }

    /// Removes the socket file even when the test fails.
    struct TempSock(PathBuf);
    impl Drop for TempSock {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn sock_diag_available() -> bool {
        match query(Some(1)) {
            Ok(_) => true,
            Err(e) => {
                // Under CI a missing precondition fails, naming it; elsewhere the test moves on.
                assert!(std::env::var_os("CI").is_none(), "unix sock_diag unavailable here: {e}");
                eprintln!("skipping: unix sock_diag unavailable here: {e}");
                false
            }
        }
    }

    #[test]
    fn socket_links() {
        assert_eq!(parse_socket_link(b"socket:[12345]"), Some(12345));
        assert_eq!(parse_socket_link(b"socket:[]"), None);
        assert_eq!(parse_socket_link(b"pipe:[12345]"), None);
        assert_eq!(parse_socket_link(b"socket:[12a]"), None);
        assert_eq!(parse_socket_link(b"/dev/null"), None);
    }

    #[test]
    fn pair_peers_resolve_to_each_other_and_to_us() {
        if !sock_diag_available() {
            return;
        }
        let (a, b) = UnixStream::pair().unwrap();
        let (ia, ib) = (inode_of(&a), inode_of(&b));
        let mut peers = UnixPeers::new();
        let pa = peers.peer_of(ia).expect("peer of a");
        assert_eq!(pa.peer_inode, ib);
        assert_eq!(pa.path(), None, "a socketpair has no address");
        assert_eq!(peers.peer_of(ib).map(|p| p.peer_inode), Some(ia));

        let mut owners = SocketOwners::with(Path::new("/proc"), Duration::ZERO);
        let me = std::process::id();
        assert_eq!(owners.pids_of(ia), [me]);
        assert_eq!(owners.pids_of(ib), [me], "cache hit");
        // Closed: the cached (pid, fd) no longer holds it.
        drop(a);
        assert!(owners.pids_of(ia).is_empty());
    }

    #[test]
    fn listener_and_client_resolve() {
        if !sock_diag_available() {
            return;
        }
        let path = std::env::temp_dir().join(format!("plegwatch-test-{}-{:?}.sock", std::process::id(), std::thread::current().id()));
        let _ = std::fs::remove_file(&path);
        let _guard = TempSock(path.clone());
        let listener = UnixListener::bind(&path).unwrap();
        let client = UnixStream::connect(&path).unwrap();
        let (server, _) = listener.accept().unwrap();
        let (ic, is, il) = (inode_of(&client), inode_of(&server), inode_of(&listener));
        let want = path.to_string_lossy().into_owned();

        let mut peers = UnixPeers::new();
        let pc = peers.peer_of(ic).expect("peer of the client");
        assert_eq!(pc.peer_inode, is);
        assert_eq!(pc.name, None);
        assert_eq!(pc.peer_name.as_deref(), Some(want.as_str()));
        assert_eq!(pc.path(), Some(want.as_str()));
        let ps = peers.peer_of(is).expect("peer of the accepted socket");
        assert_eq!(ps.peer_inode, ic);
        assert_eq!(ps.name.as_deref(), Some(want.as_str()));
        // The listener has a name and no peer.
        let l = peers.info(il).expect("listener");
        assert_eq!((l.state, l.peer_inode, l.name.as_deref()), (10, None, Some(want.as_str())));
        assert!(peers.peer_of(il).is_none());

        // The dump sees them too.
        let mut all = UnixPeers::new();
        assert!(all.refresh().unwrap() >= 3);
        assert_eq!(all.peer_of(ic).map(|p| p.peer_inode), Some(is));

        let mut owners = SocketOwners::with(Path::new("/proc"), Duration::ZERO);
        let me = std::process::id();
        for ino in [ic, is, il] {
            assert_eq!(owners.pids_of(ino), [me]);
        }
        // Not a socket anyone holds.
        assert!(owners.pids_of(u64::MAX).is_empty());
        assert!(peers.peer_of(u64::from(u32::MAX)).is_none());
    }
}
