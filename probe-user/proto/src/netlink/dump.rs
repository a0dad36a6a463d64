//! The answer to one request of our own over a netlink socket, taken in
//! until NLMSG_DONE or NLMSG_ERROR: the parsing behind the few queries
//! plegwatch makes itself (the generic netlink family dump, unix sock_diag).
//!
//! [`Dump`] is fed one datagram at a time, so that it can be tested on
//! recorded bytes; the socket that sends the request and reads the datagrams
//! is plegwatch's (`kernel::netlink`).

use super::header::{self, NlMsg, NLMSG_DONE, NLMSG_ERROR};
use std::ops::ControlFlow;

/// How a request failed.
#[derive(Debug, thiserror::Error)]
pub enum DumpError {
    /// A socket call of whoever runs the request (plegwatch's
    /// `kernel::netlink`): `socket`, `bind`, `setsockopt(SO_RCVTIMEO)`, `send`
    /// or `recv` (a timeout too).
    #[error("netlink {what}: {source}")]
    Io { what: &'static str, source: std::io::Error },
    /// The kernel answered NLMSG_ERROR with this negative errno.
    #[error("netlink request failed: {}", std::io::Error::from_raw_os_error(.0.saturating_neg()))]
    Kernel(i32),
    /// No NLMSG_DONE or NLMSG_ERROR within the reads allowed; the number is
    /// the messages of the request seen.
    #[error("netlink dump: no NLMSG_DONE after {0} messages")]
    Unfinished(usize),
}

impl DumpError {
    /// [`DumpError::Kernel`]'s errno as an [`std::io::Error`].
    pub fn kernel_io(errno: i32) -> std::io::Error {
        std::io::Error::from_raw_os_error(errno.saturating_neg())
    }
}

/// The answer to one request, taken in a datagram at a time: the messages
/// with the request's sequence number that are whole. NLMSG_DONE and an ack
/// (NLMSG_ERROR 0) end it; NLMSG_ERROR with an errno ends it with
/// [`DumpError::Kernel`] (no errno there counts as EIO); every other message
/// goes to the caller, who may end it early.
#[derive(Debug)]
pub struct Dump {
    protocol: u32,
    seq: u32,
    seen: usize,
}

impl Dump {
    /// The answer to the request with sequence number `seq` on a socket of
    /// `protocol` (`NETLINK_GENERIC`, ...; it decides how payloads read).
    pub fn new(protocol: u32, seq: u32) -> Self {
        Dump { protocol, seq, seen: 0 }
    }

    /// How many messages of the request were taken in so far.
    pub fn seen(&self) -> usize {
        self.seen
    }

    /// Takes in one datagram: `each` gets every message of the request that is
    /// neither NLMSG_DONE nor NLMSG_ERROR, with its bytes (header included).
    /// `Break` once the answer ended (or `each` broke): whether it ended well.
    pub fn feed(
        &mut self,
        datagram: &[u8],
        each: &mut impl FnMut(&NlMsg<'_>, &[u8]) -> ControlFlow<()>,
    ) -> ControlFlow<Result<(), DumpError>> {
        for m in header::parse(datagram, self.protocol).messages {
            if m.header.seq != self.seq || !m.complete {
                continue;
            }
            self.seen += 1;
            match m.header.msg_type {
                NLMSG_DONE => return ControlFlow::Break(Ok(())),
                NLMSG_ERROR => {
                    return ControlFlow::Break(match m.errno.unwrap_or(-libc::EIO) {
                        0 => Ok(()),
                        errno => Err(DumpError::Kernel(errno)),
                    })
                }
                _ => {
                    let Some(raw) = datagram.get(m.offset..m.offset + m.header.len as usize) else { continue };
                    if each(&m, raw).is_break() {
                        return ControlFlow::Break(Ok(()));
                    }
                }
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{
        header::{build, NlHeader, NLM_F_MULTI},
        names::NETLINK_GENERIC,
    };

    /// Feeds `datagrams` in turn, as the socket's reader would; returns how it ended
    /// (`None`: it wants more) and the families `each` was given.
    fn replay(seq: u32, datagrams: &[Vec<u8>], stop_after: Option<usize>) -> (Option<Result<(), DumpError>>, Vec<String>, usize) {
        let mut dump = Dump::new(NETLINK_GENERIC, seq);
        let mut got = Vec::new();
        let mut each = |m: &NlMsg<'_>, raw: &[u8]| {
            assert_eq!(raw.len(), m.header.len as usize);
            got.push(m.family.as_ref().map_or_else(|| "?".to_string(), |(_, n)| n.clone()));
            if stop_after == Some(got.len()) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        };
        for d in datagrams {
            if let ControlFlow::Break(end) = dump.feed(d, &mut each) {
                return (Some(end), got, dump.seen());
            }
        }
        (None, got, dump.seen())
    }

    #[test]
    fn a_recorded_dump_ends_at_done() {
        let mut first = build::newfamily(0x15, "devlink", 4, NLM_F_MULTI);
        // Another request's answer on the same socket is passed over.
        first.extend(build::newfamily(0x17, "other", 9, NLM_F_MULTI));
        first.extend(build::newfamily(0x16, "ethtool", 4, NLM_F_MULTI));
        let second = build::newfamily(0x18, "thermal", 4, NLM_F_MULTI);
        let mut third = build::done(4, 1);
        // Nothing after NLMSG_DONE is looked at.
        third.extend(build::newfamily(0x19, "late", 4, NLM_F_MULTI));

        let (end, got, seen) = replay(4, &[first.clone(), second.clone()], None);
        assert!(end.is_none(), "no NLMSG_DONE yet");
        assert_eq!(got, ["devlink", "ethtool", "thermal"]);
        assert_eq!(seen, 3);

        let (end, got, seen) = replay(4, &[first, second, third], None);
        assert!(matches!(end, Some(Ok(()))), "{end:?}");
        assert_eq!(got, ["devlink", "ethtool", "thermal"]);
        assert_eq!(seen, 4);
    }

    #[test]
    fn errors_acks_and_early_stops() {
        let req = NlHeader { len: 20, msg_type: 0x10, flags: 0x301, seq: 5, pid: 0 };
        let mut buf = build::newfamily(0x15, "devlink", 5, NLM_F_MULTI);
        buf.extend(build::error(-libc::ENOENT, &req, 1));
        let (end, got, _) = replay(5, std::slice::from_ref(&buf), None);
        assert_eq!(got, ["devlink"]);
        match end {
            Some(Err(DumpError::Kernel(errno))) => {
                assert_eq!(errno, -libc::ENOENT);
                assert_eq!(DumpError::kernel_io(errno).raw_os_error(), Some(libc::ENOENT));
            }
            other => panic!("{other:?}"),
        }

        // An ack ends it well.
        let (end, got, _) = replay(5, &[build::error(0, &req, 1)], None);
        assert!(matches!(end, Some(Ok(()))), "{end:?}");
        assert!(got.is_empty());

        // The caller has what it wanted: the error after it is not read.
        let (end, got, seen) = replay(5, &[buf], Some(1));
        assert!(matches!(end, Some(Ok(()))), "{end:?}");
        assert_eq!((got.len(), seen), (1, 1));

        // A message cut short is passed over, and a cut buffer does not panic.
        let mut whole = build::newfamily(0x15, "devlink", 5, NLM_F_MULTI);
        whole.extend(build::done(5, 1));
        for cut in 0..whole.len() {
            let (end, got, _) = replay(5, &[whole[..cut].to_vec()], None);
            assert!(end.is_none(), "cut at {cut}: {end:?}");
            assert!(got.len() <= 1);
        }
    }
}
