//! A buffer as a chain of netlink messages (`struct nlmsghdr`, native
//! endianness, each message aligned to 4 bytes).
//!
//! ```text
//! struct nlmsghdr { __u32 nlmsg_len; __u16 nlmsg_type; __u16 nlmsg_flags;
//!                   __u32 nlmsg_seq; __u32 nlmsg_pid; };          // 16 bytes
//! struct nlmsgerr { int error; struct nlmsghdr msg; /* + payload, TLVs */ };
//! struct genlmsghdr { __u8 cmd; __u8 version; __u16 reserved; };
//! ```
//! (`include/uapi/linux/netlink.h`, `genetlink.h`; stable kernel ABI.)
//!
//! The buffer is usually a captured prefix of a longer one, so parsing keeps
//! every message whose 16-byte header is present and says where it stopped;
//! it never fails as a whole.

use super::{attr, names::NETLINK_GENERIC};

/// `sizeof(struct nlmsghdr)`.
pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_NOOP: u16 = 1;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLMSG_OVERRUN: u16 = 4;
/// Types below this are netlink's own control messages.
pub const NLMSG_MIN_TYPE: u16 = 0x10;

pub const NLM_F_REQUEST: u16 = 0x01;
pub const NLM_F_MULTI: u16 = 0x02;
pub const NLM_F_ACK: u16 = 0x04;
pub const NLM_F_ECHO: u16 = 0x08;
pub const NLM_F_DUMP_INTR: u16 = 0x10;
pub const NLM_F_DUMP_FILTERED: u16 = 0x20;
/// GET modifiers.
pub const NLM_F_ROOT: u16 = 0x100;
pub const NLM_F_MATCH: u16 = 0x200;
pub const NLM_F_ATOMIC: u16 = 0x400;
pub const NLM_F_DUMP: u16 = NLM_F_ROOT | NLM_F_MATCH;
/// NEW modifiers.
pub const NLM_F_REPLACE: u16 = 0x100;
pub const NLM_F_EXCL: u16 = 0x200;
pub const NLM_F_CREATE: u16 = 0x400;
pub const NLM_F_APPEND: u16 = 0x800;
/// DELETE modifiers.
pub const NLM_F_NONREC: u16 = 0x100;
pub const NLM_F_BULK: u16 = 0x200;
/// Flags of an NLMSG_ERROR (ack) message.
pub const NLM_F_CAPPED: u16 = 0x100;
pub const NLM_F_ACK_TLVS: u16 = 0x200;

/// `sizeof(struct genlmsghdr)`.
pub const GENL_HDRLEN: usize = 4;
/// The generic netlink controller's family id (`nlctrl`).
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_NEWFAMILY: u8 = 1;
pub const CTRL_CMD_DELFAMILY: u8 = 2;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// `GENL_NAMSIZ`: a family name's size with its NUL.
pub const GENL_NAMSIZ: usize = 16;

/// `NLMSG_ALIGN`.
pub const fn align(len: usize) -> usize {
    (len + 3) & !3
}

/// A netlink message header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct NlHeader {
    /// Length of the whole message, header included.
    pub len: u32,
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    pub pid: u32,
}

impl NlHeader {
    /// Reads a header from the first 16 bytes, if there are 16.
    pub fn read(buf: &[u8]) -> Option<Self> {
        Some(NlHeader {
            len: u32_at(buf, 0)?,
            msg_type: u16_at(buf, 4)?,
            flags: u16_at(buf, 6)?,
            seq: u32_at(buf, 8)?,
            pid: u32_at(buf, 12)?,
        })
    }

    /// The 16 bytes of this header.
    pub fn to_bytes(&self) -> [u8; NLMSG_HDRLEN] {
        let mut b = [0u8; NLMSG_HDRLEN];
        b[0..4].copy_from_slice(&self.len.to_ne_bytes());
        b[4..6].copy_from_slice(&self.msg_type.to_ne_bytes());
        b[6..8].copy_from_slice(&self.flags.to_ne_bytes());
        b[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        b[12..16].copy_from_slice(&self.pid.to_ne_bytes());
        b
    }
}

/// One message of a buffer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NlMsg<'a> {
    pub header: NlHeader,
    /// Where the message starts in the buffer.
    pub offset: usize,
    /// The payload bytes present in the buffer: all of them when `complete`,
    /// else the captured part.
    pub payload: &'a [u8],
    /// Whether the whole message (`header.len` bytes) is in the buffer.
    pub complete: bool,
    /// NLMSG_ERROR: `nlmsgerr.error`, 0 for an ack, else a negative errno as
    /// the kernel sends it. NLMSG_DONE: the dump's result, when present.
    pub errno: Option<i32>,
    /// NLMSG_ERROR: the header of the request it answers.
    pub request: Option<NlHeader>,
    /// NETLINK_GENERIC, a family's message: `genlmsghdr.cmd`.
    pub genl_cmd: Option<u8>,
    /// NETLINK_GENERIC, nlctrl's CTRL_CMD_NEWFAMILY/DELFAMILY: (id, name).
    pub family: Option<(u16, String)>,
}

impl NlMsg<'_> {
    pub fn is_error(&self) -> bool {
        self.header.msg_type == NLMSG_ERROR
    }
    pub fn is_done(&self) -> bool {
        self.header.msg_type == NLMSG_DONE
    }
    pub fn is_multi(&self) -> bool {
        self.header.flags & NLM_F_MULTI != 0
    }
}

/// What [`parse`] found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed<'a> {
    pub messages: Vec<NlMsg<'a>>,
    /// The buffer ended inside a message: in its header (then that message
    /// is not listed) or in its payload (then it is, with `complete: false`).
    pub truncated: bool,
    /// A header's length was below 16: parsing stopped there, as the kernel's
    /// `NLMSG_OK` would.
    pub malformed: bool,
}

/// Parses `buf` as a chain of netlink messages of protocol `protocol`
/// (`NETLINK_ROUTE`, `NETLINK_GENERIC`, ...; it decides how payloads read).
pub fn parse(buf: &[u8], protocol: u32) -> Parsed<'_> {
    let mut out = Parsed::default();
    let mut off = 0usize;
    while off < buf.len() {
        let rest = &buf[off..];
        let Some(header) = NlHeader::read(rest) else {
            out.truncated = true;
            break;
        };
        let len = header.len as usize;
        if len < NLMSG_HDRLEN {
            out.malformed = true;
            break;
        }
        let complete = len <= rest.len();
        let end = len.min(rest.len());
        let payload = &rest[NLMSG_HDRLEN..end];
        let mut msg = NlMsg { header, offset: off, payload, complete, errno: None, request: None, genl_cmd: None, family: None };
        decode_payload(&mut msg, protocol);
        out.messages.push(msg);
        if !complete {
            out.truncated = true;
            break;
        }
        // The last message's padding may be missing (the kernel's nlmsg_next
        // ends the walk there too).
        off = off.saturating_add(align(len));
    }
    out
}

fn decode_payload(msg: &mut NlMsg<'_>, protocol: u32) {
    let p = msg.payload;
    match msg.header.msg_type {
        NLMSG_ERROR => {
            msg.errno = i32_at(p, 0);
            msg.request = p.get(4..).and_then(NlHeader::read);
        }
        NLMSG_DONE => msg.errno = i32_at(p, 0),
        t if t >= NLMSG_MIN_TYPE && protocol == NETLINK_GENERIC => {
            msg.genl_cmd = p.first().copied();
            if t == GENL_ID_CTRL && matches!(msg.genl_cmd, Some(CTRL_CMD_NEWFAMILY | CTRL_CMD_DELFAMILY)) {
                msg.family = p.get(GENL_HDRLEN..).and_then(family_of);
            }
        }
        _ => {}
    }
}

/// CTRL_ATTR_FAMILY_ID and CTRL_ATTR_FAMILY_NAME out of nlctrl's attributes.
pub fn family_of(attrs: &[u8]) -> Option<(u16, String)> {
    let mut id = None;
    let mut name = None;
    for a in attr::Attrs::new(attrs) {
        match a.kind {
            CTRL_ATTR_FAMILY_ID => id = u16_at(a.payload, 0),
            CTRL_ATTR_FAMILY_NAME => name = attr::c_string(a.payload, GENL_NAMSIZ),
            _ => {}
        }
        if id.is_some() && name.is_some() {
            break;
        }
    }
    Some((id?, name?))
}

pub(crate) fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(off..off.checked_add(2)?)?.try_into().ok()?))
}

pub(crate) fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(off..off.checked_add(4)?)?.try_into().ok()?))
}

pub(crate) fn i32_at(b: &[u8], off: usize) -> Option<i32> {
    u32_at(b, off).map(|v| v as i32)
}

/// Test-only builders of real netlink byte layouts, shared by this module's
/// tests.
#[cfg(test)]
pub(crate) mod build {
    use super::*;

    /// One message: header with `len` filled in, then `payload`, padded to 4.
    pub fn msg(msg_type: u16, flags: u16, seq: u32, pid: u32, payload: &[u8]) -> Vec<u8> {
        let len = (NLMSG_HDRLEN + payload.len()) as u32;
        let mut v = NlHeader { len, msg_type, flags, seq, pid }.to_bytes().to_vec();
        v.extend_from_slice(payload);
        v.resize(align(v.len()), 0);
        v
    }

    /// An NLMSG_ERROR answering `req` (capped: only the request's header).
    pub fn error(errno: i32, req: &NlHeader, pid: u32) -> Vec<u8> {
        let mut p = errno.to_ne_bytes().to_vec();
        p.extend_from_slice(&req.to_bytes());
        let flags = if errno == 0 { NLM_F_CAPPED } else { 0 };
        msg(NLMSG_ERROR, flags, req.seq, pid, &p)
    }

    /// NLMSG_DONE with the dump's result.
    pub fn done(seq: u32, pid: u32) -> Vec<u8> {
        msg(NLMSG_DONE, NLM_F_MULTI, seq, pid, &0i32.to_ne_bytes())
    }

    /// An attribute, padded to 4.
    pub fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
        let mut v = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
        v.extend_from_slice(&kind.to_ne_bytes());
        v.extend_from_slice(payload);
        v.resize(align(v.len()), 0);
        v
    }

    /// `struct ifinfomsg` (16 bytes) for RTM_GETLINK/NEWLINK.
    pub fn ifinfomsg(index: i32) -> Vec<u8> {
        let mut v = vec![0u8; 16];
        v[4..8].copy_from_slice(&index.to_ne_bytes());
        v
    }

    /// A CTRL_CMD_NEWFAMILY message for family `name` with id `id`.
    pub fn newfamily(id: u16, name: &str, seq: u32, flags: u16) -> Vec<u8> {
        let mut p = vec![CTRL_CMD_NEWFAMILY, 2, 0, 0];
        let mut n = name.as_bytes().to_vec();
        n.push(0);
        p.extend(attr(CTRL_ATTR_FAMILY_NAME, &n));
        p.extend(attr(CTRL_ATTR_FAMILY_ID, &id.to_ne_bytes()));
        p.extend(attr(3, &1u32.to_ne_bytes())); // CTRL_ATTR_VERSION
        msg(GENL_ID_CTRL, flags, seq, 4242, &p)
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;
    use crate::netlink::names::{NETLINK_ROUTE, RTM_GETLINK, RTM_NEWADDR, RTM_NEWLINK};

    #[test]
    fn dump_request_and_replies() {
        let req = msg(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 7, 0, &ifinfomsg(0));
        assert_eq!(req.len(), 32);
        let p = parse(&req, NETLINK_ROUTE);
        assert!(!p.truncated && !p.malformed);
        assert_eq!(p.messages.len(), 1);
        let m = &p.messages[0];
        assert_eq!(m.header, NlHeader { len: 32, msg_type: RTM_GETLINK, flags: 0x301, seq: 7, pid: 0 });
        assert!(m.complete);
        assert_eq!(m.payload.len(), 16);

        // Two links and NLMSG_DONE in one datagram, as the kernel sends a small dump.
        let mut reply = msg(RTM_NEWLINK, NLM_F_MULTI, 7, 99, &[ifinfomsg(1), attr(3, b"lo\0")].concat());
        reply.extend(msg(RTM_NEWLINK, NLM_F_MULTI, 7, 99, &[ifinfomsg(2), attr(3, b"eth0\0")].concat()));
        reply.extend(done(7, 99));
        let p = parse(&reply, NETLINK_ROUTE);
        assert!(!p.truncated);
        let types: Vec<_> = p.messages.iter().map(|m| m.header.msg_type).collect();
        assert_eq!(types, [RTM_NEWLINK, RTM_NEWLINK, NLMSG_DONE]);
        assert!(p.messages.iter().all(|m| m.header.seq == 7 && m.is_multi()));
        assert_eq!(p.messages[2].errno, Some(0));
        assert_eq!(p.messages[1].offset, p.messages[0].header.len as usize);
    }

    #[test]
    fn ack_and_error() {
        let req = NlHeader { len: 40, msg_type: RTM_NEWADDR, flags: NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE, seq: 9, pid: 0 };
        let ack = error(0, &req, 77);
        let p = parse(&ack, NETLINK_ROUTE);
        assert_eq!(p.messages.len(), 1);
        assert!(p.messages[0].is_error());
        assert_eq!(p.messages[0].errno, Some(0));
        assert_eq!(p.messages[0].request, Some(req));

        let err = error(-libc::EEXIST, &req, 77);
        let p = parse(&err, NETLINK_ROUTE);
        assert_eq!(p.messages[0].errno, Some(-17));
        assert_eq!(p.messages[0].header.seq, 9);
    }

    #[test]
    fn genl_cmd_and_family() {
        let m = newfamily(0x1d, "devlink", 3, 0);
        let p = parse(&m, NETLINK_GENERIC);
        assert_eq!(p.messages[0].genl_cmd, Some(CTRL_CMD_NEWFAMILY));
        assert_eq!(p.messages[0].family, Some((0x1d, "devlink".to_string())));
        // The same bytes on NETLINK_ROUTE are just a message of type 16.
        let p = parse(&m, NETLINK_ROUTE);
        assert_eq!(p.messages[0].genl_cmd, None);
        assert_eq!(p.messages[0].family, None);
    }

    #[test]
    fn truncated_at_every_offset() {
        let mut buf = msg(RTM_GETLINK, NLM_F_REQUEST | NLM_F_DUMP, 1, 0, &ifinfomsg(0));
        let req = NlHeader::read(&buf).unwrap();
        buf.extend(error(-libc::EPERM, &req, 5));
        buf.extend(newfamily(0x20, "nl80211", 2, NLM_F_MULTI));
        buf.extend(done(1, 5));
        let full = parse(&buf, NETLINK_GENERIC);
        assert_eq!(full.messages.len(), 4);
        assert!(!full.truncated);
        for cut in 0..buf.len() {
            let p = parse(&buf[..cut], NETLINK_GENERIC);
            // Every message whose start lies before the cut, with a whole header, is kept.
            let starts: Vec<_> = full.messages.iter().filter(|m| m.offset + NLMSG_HDRLEN <= cut).collect();
            assert_eq!(p.messages.len(), starts.len(), "cut {cut}");
            for (a, b) in p.messages.iter().zip(&starts) {
                assert_eq!(a.header, b.header);
                assert_eq!(a.offset, b.offset);
            }
            let at_boundary = full.messages.iter().any(|m| m.offset == cut);
            assert_eq!(p.truncated, cut != 0 && !at_boundary, "cut {cut}");
            assert!(!p.malformed);
        }
    }

    #[test]
    fn garbage_lengths() {
        // len < 16: stop there, keep what came before.
        let mut buf = msg(RTM_GETLINK, NLM_F_REQUEST, 1, 0, &ifinfomsg(0));
        let mut bad = msg(RTM_GETLINK, NLM_F_REQUEST, 2, 0, &[]);
        bad[0..4].copy_from_slice(&8u32.to_ne_bytes());
        buf.extend(&bad);
        buf.extend(msg(RTM_GETLINK, NLM_F_REQUEST, 3, 0, &[]));
        let p = parse(&buf, NETLINK_ROUTE);
        assert_eq!(p.messages.len(), 1);
        assert!(p.malformed);

        // len 0 (would loop forever if not caught).
        let p = parse(&[0u8; 64], NETLINK_ROUTE);
        assert!(p.messages.is_empty() && p.malformed);

        // len > buffer: the header is kept, marked incomplete.
        let mut big = msg(RTM_NEWLINK, NLM_F_MULTI, 4, 1, &ifinfomsg(1));
        big[0..4].copy_from_slice(&u32::MAX.to_ne_bytes());
        let p = parse(&big, NETLINK_ROUTE);
        assert_eq!(p.messages.len(), 1);
        assert!(!p.messages[0].complete && p.truncated);
        assert_eq!(p.messages[0].payload.len(), 16);

        // An unaligned last message without its padding.
        let mut odd = msg(RTM_NEWLINK, 0, 5, 1, &[1, 2, 3, 4, 5]);
        odd.truncate(21);
        let p = parse(&odd, NETLINK_ROUTE);
        assert_eq!(p.messages.len(), 1);
        assert!(!p.truncated && p.messages[0].complete);

        // Error messages too short for their nlmsgerr.
        let short = msg(NLMSG_ERROR, 0, 6, 1, &[0xff, 0xff]);
        let p = parse(&short, NETLINK_ROUTE);
        assert_eq!(p.messages[0].errno, None);
        assert_eq!(p.messages[0].request, None);
        assert!(parse(&[], NETLINK_ROUTE).messages.is_empty());
    }
}
