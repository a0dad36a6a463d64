//! Names of netlink protocols, message types and flags, as the kernel's
//! headers spell them (`include/uapi/linux/netlink.h`, `rtnetlink.h`,
//! `sock_diag.h`). These numbers are kernel ABI and never change.
//!
//! `netlink-packet-route` keeps its RTM_* constants private, so the route
//! types are a table here, checked against `libc` in the tests.

use super::{
    genl::GenlFamilies,
    header::{
        NLMSG_DONE, NLMSG_ERROR, NLMSG_MIN_TYPE, NLMSG_NOOP, NLMSG_OVERRUN, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_APPEND, NLM_F_ATOMIC,
        NLM_F_BULK, NLM_F_CAPPED, NLM_F_CREATE, NLM_F_DUMP_FILTERED, NLM_F_DUMP_INTR, NLM_F_ECHO, NLM_F_EXCL, NLM_F_MATCH, NLM_F_MULTI,
        NLM_F_NONREC, NLM_F_REPLACE, NLM_F_REQUEST, NLM_F_ROOT,
    },
};
use std::borrow::Cow;

pub const NETLINK_ROUTE: u32 = 0;
pub const NETLINK_USERSOCK: u32 = 2;
pub const NETLINK_SOCK_DIAG: u32 = 4;
pub const NETLINK_AUDIT: u32 = 9;
pub const NETLINK_KOBJECT_UEVENT: u32 = 15;
pub const NETLINK_GENERIC: u32 = 16;

/// The name of netlink protocol `proto` (the third argument of
/// `socket(AF_NETLINK, ..., proto)`), lower case as in `ss` and `/proc/net/netlink`.
pub fn protocol_name(proto: u32) -> Option<&'static str> {
    Some(match proto {
        0 => "route",
        1 => "unused",
        2 => "usersock",
        3 => "firewall",
        4 => "sock_diag",
        5 => "nflog",
        6 => "xfrm",
        7 => "selinux",
        8 => "iscsi",
        9 => "audit",
        10 => "fib_lookup",
        11 => "connector",
        12 => "netfilter",
        13 => "ip6_fw",
        14 => "dnrtmsg",
        15 => "kobject_uevent",
        16 => "generic",
        18 => "scsitransport",
        19 => "ecryptfs",
        20 => "rdma",
        21 => "crypto",
        22 => "smc",
        _ => return None,
    })
}

/// The name of a control message type (below `NLMSG_MIN_TYPE`), any protocol.
pub fn control_type_name(t: u16) -> Option<&'static str> {
    Some(match t {
        NLMSG_NOOP => "NLMSG_NOOP",
        NLMSG_ERROR => "NLMSG_ERROR",
        NLMSG_DONE => "NLMSG_DONE",
        NLMSG_OVERRUN => "NLMSG_OVERRUN",
        _ => return None,
    })
}

pub const RTM_NEWLINK: u16 = 16;
pub const RTM_DELLINK: u16 = 17;
pub const RTM_GETLINK: u16 = 18;
pub const RTM_SETLINK: u16 = 19;
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;
pub const RTM_NEWROUTE: u16 = 24;
pub const RTM_DELROUTE: u16 = 25;
pub const RTM_GETROUTE: u16 = 26;

/// NETLINK_ROUTE message types, from `rtnetlink.h` (through Linux 6.x).
const ROUTE_TYPES: &[(u16, &str)] = &[
    (16, "RTM_NEWLINK"),
    (17, "RTM_DELLINK"),
    (18, "RTM_GETLINK"),
    (19, "RTM_SETLINK"),
    (20, "RTM_NEWADDR"),
    (21, "RTM_DELADDR"),
    (22, "RTM_GETADDR"),
    (24, "RTM_NEWROUTE"),
    (25, "RTM_DELROUTE"),
    (26, "RTM_GETROUTE"),
    (28, "RTM_NEWNEIGH"),
    (29, "RTM_DELNEIGH"),
    (30, "RTM_GETNEIGH"),
    (32, "RTM_NEWRULE"),
    (33, "RTM_DELRULE"),
    (34, "RTM_GETRULE"),
    (36, "RTM_NEWQDISC"),
    (37, "RTM_DELQDISC"),
    (38, "RTM_GETQDISC"),
    (40, "RTM_NEWTCLASS"),
    (41, "RTM_DELTCLASS"),
    (42, "RTM_GETTCLASS"),
    (44, "RTM_NEWTFILTER"),
    (45, "RTM_DELTFILTER"),
    (46, "RTM_GETTFILTER"),
    (48, "RTM_NEWACTION"),
    (49, "RTM_DELACTION"),
    (50, "RTM_GETACTION"),
    (52, "RTM_NEWPREFIX"),
    (58, "RTM_GETMULTICAST"),
    (62, "RTM_GETANYCAST"),
    (64, "RTM_NEWNEIGHTBL"),
    (66, "RTM_GETNEIGHTBL"),
    (67, "RTM_SETNEIGHTBL"),
    (68, "RTM_NEWNDUSEROPT"),
    (72, "RTM_NEWADDRLABEL"),
    (73, "RTM_DELADDRLABEL"),
    (74, "RTM_GETADDRLABEL"),
    (78, "RTM_GETDCB"),
    (79, "RTM_SETDCB"),
    (80, "RTM_NEWNETCONF"),
    (81, "RTM_DELNETCONF"),
    (82, "RTM_GETNETCONF"),
    (84, "RTM_NEWMDB"),
    (85, "RTM_DELMDB"),
    (86, "RTM_GETMDB"),
    (88, "RTM_NEWNSID"),
    (89, "RTM_DELNSID"),
    (90, "RTM_GETNSID"),
    (92, "RTM_NEWSTATS"),
    (94, "RTM_GETSTATS"),
    (95, "RTM_SETSTATS"),
    (96, "RTM_NEWCACHEREPORT"),
    (100, "RTM_NEWCHAIN"),
    (101, "RTM_DELCHAIN"),
    (102, "RTM_GETCHAIN"),
    (104, "RTM_NEWNEXTHOP"),
    (105, "RTM_DELNEXTHOP"),
    (106, "RTM_GETNEXTHOP"),
    (108, "RTM_NEWLINKPROP"),
    (109, "RTM_DELLINKPROP"),
    (110, "RTM_GETLINKPROP"),
    (112, "RTM_NEWVLAN"),
    (113, "RTM_DELVLAN"),
    (114, "RTM_GETVLAN"),
    (116, "RTM_NEWNEXTHOPBUCKET"),
    (117, "RTM_DELNEXTHOPBUCKET"),
    (118, "RTM_GETNEXTHOPBUCKET"),
    (120, "RTM_NEWTUNNEL"),
    (121, "RTM_DELTUNNEL"),
    (122, "RTM_GETTUNNEL"),
];

/// The name of a NETLINK_ROUTE message type (`RTM_NEWLINK`, ...).
pub fn route_type_name(t: u16) -> Option<&'static str> {
    ROUTE_TYPES.iter().find(|(n, _)| *n == t).map(|(_, name)| *name)
}

pub const SOCK_DIAG_BY_FAMILY: u16 = 20;
pub const SOCK_DESTROY: u16 = 21;

/// The name of a NETLINK_SOCK_DIAG message type.
pub fn sock_diag_type_name(t: u16) -> Option<&'static str> {
    Some(match t {
        18 => "TCPDIAG_GETSOCK",
        19 => "DCCPDIAG_GETSOCK",
        SOCK_DIAG_BY_FAMILY => "SOCK_DIAG_BY_FAMILY",
        SOCK_DESTROY => "SOCK_DESTROY",
        _ => return None,
    })
}

/// The name of message type `t` on a socket of protocol `proto`: a control
/// type, a route or sock_diag type, or a generic netlink family's name (from
/// `families`). Falls back to the number.
pub fn type_name(proto: u32, t: u16, families: Option<&GenlFamilies>) -> Cow<'static, str> {
    let known = if t < NLMSG_MIN_TYPE {
        control_type_name(t)
    } else {
        match proto {
            NETLINK_ROUTE => route_type_name(t),
            NETLINK_SOCK_DIAG => sock_diag_type_name(t),
            NETLINK_GENERIC => {
                if let Some(name) = families.and_then(|f| f.name(t)) {
                    return Cow::Owned(name.to_string());
                }
                None
            }
            _ => None,
        }
    };
    match known {
        Some(n) => Cow::Borrowed(n),
        None => Cow::Owned(t.to_string()),
    }
}

/// What the flag bits above 0xff mean depends on the kind of message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlagContext {
    /// A GET request: ROOT, MATCH (both: DUMP), ATOMIC.
    Get,
    /// A NEW request: REPLACE, EXCL, CREATE, APPEND.
    New,
    /// A DELETE request: NONREC, BULK.
    Delete,
    /// An NLMSG_ERROR: CAPPED, ACK_TLVS.
    Ack,
    /// Unknown: DUMP when both its bits are set, else the bits in hex.
    Other,
}

/// The flag context of message type `t` on protocol `proto`. NETLINK_ROUTE
/// types come in fours (NEW, DEL, GET, SET) from RTM_BASE = 16.
pub fn flag_context(proto: u32, t: u16) -> FlagContext {
    if t == NLMSG_ERROR {
        return FlagContext::Ack;
    }
    if t < NLMSG_MIN_TYPE {
        return FlagContext::Other;
    }
    match proto {
        NETLINK_ROUTE => match (t - NLMSG_MIN_TYPE) % 4 {
            0 => FlagContext::New,
            1 => FlagContext::Delete,
            2 => FlagContext::Get,
            _ => FlagContext::Other,
        },
        NETLINK_SOCK_DIAG => match t {
            SOCK_DESTROY => FlagContext::Delete,
            _ => FlagContext::Get,
        },
        _ => FlagContext::Other,
    }
}

/// Flags as `REQUEST|ACK|DUMP`; bits with no name show in hex; no bits: `0`.
pub fn flag_names(flags: u16, ctx: FlagContext) -> String {
    let mut names: Vec<Cow<'static, str>> = Vec::new();
    let mut left = flags;
    fn take(bits: u16, name: &'static str, left: &mut u16, names: &mut Vec<Cow<'static, str>>) {
        if *left & bits == bits {
            *left &= !bits;
            names.push(Cow::Borrowed(name));
        }
    }
    for (bit, name) in [
        (NLM_F_REQUEST, "REQUEST"),
        (NLM_F_MULTI, "MULTI"),
        (NLM_F_ACK, "ACK"),
        (NLM_F_ECHO, "ECHO"),
        (NLM_F_DUMP_INTR, "DUMP_INTR"),
        (NLM_F_DUMP_FILTERED, "DUMP_FILTERED"),
    ] {
        take(bit, name, &mut left, &mut names);
    }
    let upper: &[(u16, &'static str)] = match ctx {
        FlagContext::Get => &[(NLM_F_ROOT | NLM_F_MATCH, "DUMP"), (NLM_F_ROOT, "ROOT"), (NLM_F_MATCH, "MATCH"), (NLM_F_ATOMIC, "ATOMIC")],
        FlagContext::New => &[(NLM_F_REPLACE, "REPLACE"), (NLM_F_EXCL, "EXCL"), (NLM_F_CREATE, "CREATE"), (NLM_F_APPEND, "APPEND")],
        FlagContext::Delete => &[(NLM_F_NONREC, "NONREC"), (NLM_F_BULK, "BULK")],
        FlagContext::Ack => &[(NLM_F_CAPPED, "CAPPED"), (NLM_F_ACK_TLVS, "ACK_TLVS")],
        FlagContext::Other => &[(NLM_F_ROOT | NLM_F_MATCH, "DUMP")],
    };
    for &(bits, name) in upper {
        take(bits, name, &mut left, &mut names);
    }
    if left != 0 {
        names.push(Cow::Owned(format!("{left:#x}")));
    }
    if names.is_empty() {
        return "0".to_string();
    }
    names.join("|")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocols() {
        assert_eq!(protocol_name(0), Some("route"));
        assert_eq!(protocol_name(4), Some("sock_diag"));
        assert_eq!(protocol_name(16), Some("generic"));
        assert_eq!(protocol_name(22), Some("smc"));
        assert_eq!(protocol_name(17), None);
        assert_eq!(protocol_name(u32::MAX), None);
        assert_eq!(libc::NETLINK_SOCK_DIAG as u32, NETLINK_SOCK_DIAG);
        assert_eq!(libc::NETLINK_GENERIC as u32, NETLINK_GENERIC);
        assert_eq!(libc::NETLINK_KOBJECT_UEVENT as u32, NETLINK_KOBJECT_UEVENT);
    }

    #[test]
    fn route_table_matches_libc() {
        for (n, name) in [
            (libc::RTM_NEWLINK, "RTM_NEWLINK"),
            (libc::RTM_GETLINK, "RTM_GETLINK"),
            (libc::RTM_NEWADDR, "RTM_NEWADDR"),
            (libc::RTM_GETROUTE, "RTM_GETROUTE"),
            (libc::RTM_DELNEIGH, "RTM_DELNEIGH"),
            (libc::RTM_GETQDISC, "RTM_GETQDISC"),
            (libc::RTM_GETACTION, "RTM_GETACTION"),
            (libc::RTM_NEWPREFIX, "RTM_NEWPREFIX"),
            (libc::RTM_GETMULTICAST, "RTM_GETMULTICAST"),
            (libc::RTM_SETNEIGHTBL, "RTM_SETNEIGHTBL"),
            (libc::RTM_GETNSID, "RTM_GETNSID"),
            (libc::RTM_GETSTATS, "RTM_GETSTATS"),
            (libc::RTM_NEWCACHEREPORT, "RTM_NEWCACHEREPORT"),
        ] {
            assert_eq!(route_type_name(n), Some(name), "{n}");
        }
        assert_eq!(route_type_name(23), None);
        let mut seen = std::collections::HashSet::new();
        assert!(ROUTE_TYPES.iter().all(|(n, _)| seen.insert(*n)), "duplicate numbers");
    }

    #[test]
    fn type_names() {
        let mut fams = GenlFamilies::new();
        fams.insert(0x1d, "devlink");
        assert_eq!(type_name(NETLINK_ROUTE, 2, None), "NLMSG_ERROR");
        assert_eq!(type_name(NETLINK_GENERIC, 3, None), "NLMSG_DONE");
        assert_eq!(type_name(NETLINK_ROUTE, 18, None), "RTM_GETLINK");
        assert_eq!(type_name(NETLINK_SOCK_DIAG, 20, None), "SOCK_DIAG_BY_FAMILY");
        assert_eq!(type_name(NETLINK_GENERIC, 0x10, Some(&fams)), "nlctrl");
        assert_eq!(type_name(NETLINK_GENERIC, 0x1d, Some(&fams)), "devlink");
        assert_eq!(type_name(NETLINK_GENERIC, 0x1e, Some(&fams)), "30");
        assert_eq!(type_name(NETLINK_AUDIT, 1000, None), "1000");
    }

    #[test]
    fn flags() {
        assert_eq!(flag_names(0x301, flag_context(NETLINK_ROUTE, RTM_GETLINK)), "REQUEST|DUMP");
        assert_eq!(flag_names(0x305, FlagContext::Get), "REQUEST|ACK|DUMP");
        assert_eq!(flag_names(0x100 | 1, FlagContext::Get), "REQUEST|ROOT");
        assert_eq!(flag_names(0x605, flag_context(NETLINK_ROUTE, RTM_NEWADDR)), "REQUEST|ACK|EXCL|CREATE");
        assert_eq!(flag_names(0x105, flag_context(NETLINK_ROUTE, RTM_DELROUTE)), "REQUEST|ACK|NONREC");
        assert_eq!(flag_names(0x100, flag_context(NETLINK_ROUTE, 2)), "CAPPED");
        assert_eq!(flag_names(0x2, FlagContext::Other), "MULTI");
        assert_eq!(flag_names(0x301, flag_context(NETLINK_GENERIC, 0x10)), "REQUEST|DUMP");
        assert_eq!(flag_names(0x8101, FlagContext::Other), "REQUEST|0x8100");
        assert_eq!(flag_names(0, FlagContext::Other), "0");
        assert_eq!(flag_context(NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY), FlagContext::Get);
        assert_eq!(flag_context(NETLINK_ROUTE, RTM_SETLINK), FlagContext::Other);
    }
}
