//! Questions to the kernel over a netlink socket of our own: one request, and
//! the reads that take in its answer (the generic netlink family dump, and
//! unix sock_diag for `observe::holders`).
//!
//! This is the kernel layer's because it is a channel of ours to the kernel,
//! like the probes, their maps and the BTF reads; not a read of another
//! process (`observe`). The bytes are built and read by the pure parsers
//! (`proto::netlink`: [`Dump`] for the answer, [`GenlFamilies::from_dump`]
//! for the family table); only the socket is here.

use crate::proto::netlink::{
    dump::{Dump, DumpError},
    genl::{getfamily_dump, GenlFamilies},
    header::{NlHeader, NlMsg},
    names::NETLINK_GENERIC,
};
use std::{ops::ControlFlow, time::Duration};

/// How long the few kernel queries here wait for an answer: plegwatch must
/// never be the process stuck in `recvfrom` on a netlink socket.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(2);

/// Datagrams are read into a buffer of this size (the kernel sends a dump in
/// datagrams of at most 32 KiB).
const RECV_BUF: usize = 64 * 1024;

/// Errors of the queries here that name their protocol and request.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    #[error("netlink {what} on a NETLINK_{protocol} socket: {source}")]
    Io { what: &'static str, protocol: &'static str, source: std::io::Error },
    #[error("NETLINK_{protocol} request {request} failed: {source}")]
    Kernel { protocol: &'static str, request: &'static str, source: std::io::Error },
    #[error("NETLINK_{protocol} request {request}: no NLMSG_DONE after {messages} messages")]
    Unfinished { protocol: &'static str, request: &'static str, messages: usize },
}

/// Sends `request` (a whole netlink message) on a new socket of `protocol`
/// bound to an automatic port id, then reads the answer through [`Dump`], at
/// most `max_reads` datagrams, each waited for at most [`QUERY_TIMEOUT`].
pub fn request(
    protocol: u32,
    request: &[u8],
    max_reads: usize,
    mut each: impl FnMut(&NlMsg<'_>, &[u8]) -> ControlFlow<()>,
) -> Result<(), DumpError> {
    let io = |what, source| DumpError::Io { what, source };
    let mut sock = netlink_sys::Socket::new(protocol as isize).map_err(|e| io("socket", e))?;
    sock.bind_auto().map_err(|e| io("bind", e))?;
    set_recv_timeout(&sock).map_err(|e| io("setsockopt(SO_RCVTIMEO)", e))?;
    sock.send_to(request, &netlink_sys::SocketAddr::new(0, 0), 0).map_err(|e| io("send", e))?;

    let seq = NlHeader::read(request).map_or(0, |h| h.seq);
    let mut dump = Dump::new(protocol, seq);
    let mut buf = vec![0u8; RECV_BUF];
    for _ in 0..max_reads {
        let n = sock.recv(&mut &mut buf[..], 0).map_err(|e| io("recv", e))?;
        if let ControlFlow::Break(end) = dump.feed(buf.get(..n).unwrap_or(&buf[..]), &mut each) {
            return end;
        }
    }
    Err(DumpError::Unfinished(dump.seen()))
}

/// SO_RCVTIMEO = [`QUERY_TIMEOUT`] on a netlink socket.
fn set_recv_timeout(sock: &netlink_sys::Socket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let tv = libc::timeval { tv_sec: QUERY_TIMEOUT.as_secs() as libc::time_t, tv_usec: QUERY_TIMEOUT.subsec_micros() as libc::suseconds_t };
    // SAFETY: a valid fd, and a pointer to a timeval of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            std::mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Asks the kernel for every generic netlink family (a CTRL_CMD_GETFAMILY
/// dump on a NETLINK_GENERIC socket), waiting at most [`QUERY_TIMEOUT`] per
/// read. Needs no privilege. Families of the caller's network namespace.
pub fn genl_families() -> Result<GenlFamilies, NetlinkError> {
    const PROTOCOL: &str = "GENERIC";
    const REQUEST: &str = "CTRL_CMD_GETFAMILY";
    let mut replies: Vec<Vec<u8>> = Vec::new();
    // A dump of a few dozen families is a handful of datagrams; bound the
    // loop anyway.
    let done = request(NETLINK_GENERIC, &getfamily_dump(1), 1024, |_, raw| {
        replies.push(raw.to_vec());
        ControlFlow::Continue(())
    });
    match done {
        Ok(()) => Ok(GenlFamilies::from_dump(replies.iter().map(Vec::as_slice))),
        Err(DumpError::Io { what, source }) => Err(NetlinkError::Io { what, protocol: PROTOCOL, source }),
        Err(DumpError::Kernel(errno)) => {
            Err(NetlinkError::Kernel { protocol: PROTOCOL, request: REQUEST, source: DumpError::kernel_io(errno) })
        }
        Err(DumpError::Unfinished(messages)) => Err(NetlinkError::Unfinished { protocol: PROTOCOL, request: REQUEST, messages }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::netlink::header::GENL_ID_CTRL;

    #[test]
    fn asks_the_kernel() {
        // Unprivileged and always available on Linux; nlctrl lists itself.
        let f = match genl_families() {
            Ok(f) => f,
            Err(e) if std::env::var_os("CI").is_some() => panic!("generic netlink must answer under CI: {e}"),
            Err(e) => {
                eprintln!("skipping: generic netlink not available here: {e}");
                return;
            }
        };
        assert_eq!(f.id("nlctrl"), Some(GENL_ID_CTRL));
        // Every kernel registers a few more (ethtool, devlink, thermal, ...).
        assert!(f.len() >= 2, "{f:?}");
        eprintln!("{} generic netlink families: {f:?}", f.len());
    }
}
