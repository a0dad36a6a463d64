//! netlink and D-Bus sockets: their classes, calls in flight, and the `SOCK_EVENTS` records.

use core::mem::size_of;

use crate::{EventHeader, COMM_LEN};

/// Socket maps (netlink and D-Bus request/reply tracking).
pub mod sock_maps {
    /// `HashMap<u64 (tgid << 32 | fd), SockClass>`: the sockets worth looking at.
    /// An entry holds only while its [`super::SockClass::gen`] is the process's
    /// [`SOCK_GEN`]; a stale one is ignored, then replaced or removed.
    pub const SOCKS: &str = "SOCKS";
    /// `HashMap<u32 tgid, u32>`: how many times the process forgot all its
    /// sockets at once (an exec, which may have closed any of them by
    /// CLOEXEC; a `close_range` too wide to walk). Created at 0 when the
    /// process's first socket is tracked (absent: nothing tracked, generation
    /// 0); the kernel bumps it, and the kernel or the seeding userspace stamps
    /// it into each new [`SOCKS`] entry. The kernel cannot walk `SOCKS` to
    /// delete a process's keys; with this it needs no walk.
    pub const SOCK_GEN: &str = "SOCK_GEN";
    /// `LruHashMap<u64 (tgid << 32 | fd), DbusPos>`: where the kernel is in
    /// each D-Bus connection's two streams, so that it copies out message
    /// headers and never a body (see [`super::dbus_walk`](crate::dbus_walk)). Kernel only.
    pub const DBUS_POS: &str = "DBUS_POS";
    /// `HashMap<u32 tid, SockCall>`: send/recv calls in flight on those sockets.
    /// Written by the kernel only; its gate `SOCK_CALLS_OPEN[0]` is the number
    /// of entries (+1 only when an insert made one, -1 only when a delete
    /// removed one).
    pub const SOCK_CALLS: &str = "SOCK_CALLS";
    /// `RingBuf` of [`super::SockIo`], [`super::SockClosed`] and
    /// [`super::SocksForgotten`] records, in the order each process made them.
    pub const SOCK_EVENTS: &str = "SOCK_EVENTS";
    /// `ProgramArray`s of one, `SOCK_EXIT_BODY_<slot>` for each syscall slot: the
    /// socket probe's fexit body (`sock_fexit_body`), which that syscall's fexit program
    /// tail-calls into. Set by userspace before it attaches them.
    pub const SOCK_EXIT_BODY: &str = "SOCK_EXIT_BODY";
}

/// Number of socket syscall slots in [`globals::SOCK_NR`](crate::globals::SOCK_NR).
pub const SOCK_SLOTS: usize = 8;
/// The socket syscalls, by slot. Slots 0-3 send, 4-7 receive; `slot % 4` is the
/// buffer's shape: 0 and 2 a plain buffer in arg1, 1 an iovec array in arg1, 3
/// a `struct user_msghdr` in arg1.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockSlot {
    Write = 0,
    Writev = 1,
    Sendto = 2,
    Sendmsg = 3,
    Read = 4,
    Readv = 5,
    Recvfrom = 6,
    Recvmsg = 7,
}
/// The first slot that receives.
pub const SOCK_FIRST_RECV: u32 = 4;

/// What a tracked socket is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockKind {
    /// AF_NETLINK; [`SockClass::proto`] is the netlink protocol.
    Netlink = 1,
    /// A connected AF_UNIX socket not yet judged: its first send decides (a
    /// D-Bus client starts with a NUL byte, then the SASL `AUTH`).
    UnixCandidate = 2,
    /// A D-Bus connection (client side).
    Dbus = 3,
    /// A ttrpc connection to a containerd shim (client side): connected to a
    /// socket named `…/s/<64 hex digits>` ([`TTRPC_SHIM_SUFFIX_LEN`](crate::TTRPC_SHIM_SUFFIX_LEN)). Only
    /// the 10-byte frame headers are read, never a payload.
    Ttrpc = 4,
}

/// The value of [`sock_maps::SOCKS`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct SockClass {
    /// A [`SockKind`] as u32.
    pub kind: u32,
    /// The netlink protocol, for [`SockKind::Netlink`].
    pub proto: u32,
    /// The process's [`sock_maps::SOCK_GEN`] when the entry was made.
    pub gen: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<SockClass>() == 16);

/// The value of [`sock_maps::SOCK_CALLS`]: a send or recv in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SockCall {
    pub start_ns: u64,
    /// User buffer (the first iovec's base for vectored calls).
    pub buf: u64,
    /// Its length.
    pub buf_len: u64,
    pub tgid: u32,
    pub fd: u32,
    /// A [`SockSlot`] as u32.
    pub slot: u32,
    /// For a netlink send: the first message's seq, type and flags (read at
    /// `sys_enter`, so a send blocked in the kernel, behind `rtnl_mutex` say,
    /// is known before it returns).
    pub nl_seq: u32,
    pub nl_type: u16,
    pub nl_flags: u16,
    /// For a netlink `sendto`/`sendmsg`: the destination port id (0: the kernel).
    pub nl_dst: u32,
    pub class: SockClass,
}
const _: () = assert!(size_of::<SockCall>() == 64);

/// Bytes of a socket buffer copied into a [`SockIo`] record, at their
/// offsets: for D-Bus only header and handshake bytes (body bytes read as
/// 0), for netlink none (the headers are in [`SockIo::nl`]).
pub const SOCK_DATA_CAP: usize = 2048;
/// netlink message headers summarised per [`SockIo`] record, walking the whole
/// buffer (a dump's NLMSG_DONE may lie past [`SOCK_DATA_CAP`]).
pub const NL_SUMMARIES: usize = 32;

/// One netlink message header, as walked by the kernel program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct NlSummary {
    pub len: u32,
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    /// The errno of an NLMSG_ERROR (0 for an ack), else 0.
    pub error: i32,
    /// `nlmsg_pid`: the port id a reply is addressed to (0 for the kernel).
    pub pid: u32,
}
const _: () = assert!(size_of::<NlSummary>() == 20);

/// A send or receive on a tracked socket. Sent with only the first
/// `captured` bytes of `data`.
#[repr(C)]
#[derive(Clone, Copy)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct SockIo {
    pub header: EventHeader,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Bytes the syscall transferred.
    pub ret: i64,
    pub tgid: u32,
    pub tid: u32,
    pub fd: u32,
    /// A [`SockSlot`] as u32.
    pub slot: u32,
    pub class: SockClass,
    /// Valid entries of `nl` (netlink sockets only).
    pub n_nl: u32,
    /// Valid bytes of `data`.
    pub captured: u32,
    /// For a netlink send: the destination port id (0: the kernel).
    pub nl_dst: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
    pub nl: [NlSummary; NL_SUMMARIES],
    pub data: [u8; SOCK_DATA_CAP],
}
/// Bytes of a [`SockIo`] before `data`.
pub const SOCK_IO_HEADER_LEN: usize = 96 + NL_SUMMARIES * 20;
const _: () = assert!(size_of::<SockIo>() == SOCK_IO_HEADER_LEN + SOCK_DATA_CAP);

/// A tracked socket was closed (or its fd replaced: `dup2`/`dup3` onto it,
/// `close_range` over it).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct SockClosed {
    pub header: EventHeader,
    pub tgid: u32,
    pub fd: u32,
}
const _: () = assert!(size_of::<SockClosed>() == 16);

/// A process with tracked sockets forgot them all (an exec, a wide
/// `close_range`): none of its fds is tracked until classified again.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct SocksForgotten {
    pub header: EventHeader,
    pub tgid: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<SocksForgotten>() == 16);
