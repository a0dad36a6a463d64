//! The common header first in every ring-buffer record, and what all records share.

use core::mem::size_of;

/// Bytes of a task's comm, NUL included.
pub const COMM_LEN: usize = 16;

/// The kind of a ring-buffer record, first in every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A [`WaitEnd`](crate::WaitEnd).
    WaitEnd = 1,
    /// A [`SockIo`](crate::SockIo).
    SockIo = 2,
    /// A [`SockClosed`](crate::SockClosed).
    SockClosed = 3,
    /// A [`GoCallEnd`](crate::GoCallEnd).
    GoCallEnd = 4,
    /// An [`ExecEvent`](crate::ExecEvent).
    Exec = 5,
    /// A [`SocksForgotten`](crate::SocksForgotten).
    SocksForgotten = 6,
    /// A [`GoExit`](crate::GoExit).
    GoExit = 7,
    /// A [`TtrpcIo`](crate::TtrpcIo).
    TtrpcIo = 8,
    /// A [`TtrpcBind`](crate::TtrpcBind).
    TtrpcBind = 9,
}

impl EventKind {
    /// The kind numbered `n`, if any.
    pub const fn from_u32(n: u32) -> Option<Self> {
        Some(match n {
            1 => Self::WaitEnd,
            2 => Self::SockIo,
            3 => Self::SockClosed,
            4 => Self::GoCallEnd,
            5 => Self::Exec,
            6 => Self::SocksForgotten,
            7 => Self::GoExit,
            8 => Self::TtrpcIo,
            9 => Self::TtrpcBind,
            _ => return None,
        })
    }
}

/// Header first in every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct EventHeader {
    /// An [`EventKind`] as u32.
    pub kind: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<EventHeader>() == 8);
