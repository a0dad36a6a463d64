//! Ring-buffer records decoded from their bytes: the one place userspace turns a
//! record into its struct (feature `user`). [`Record::parse`] reads the common
//! header's kind, checks the length that kind needs, and copies the record out
//! with `zerocopy` (a ring record's bytes need not be aligned for its struct).

use core::fmt;
use core::mem::{offset_of, size_of};

use zerocopy::{FromBytes, FromZeros, IntoBytes};

use crate::{
    EventHeader, EventKind, ExecEvent, GoCallEnd, GoExit, NlSummary, SockClosed, SockIo, SockKind, SocksForgotten, TtrpcBind, TtrpcIo,
    WaitEnd, NL_SUMMARIES, SOCK_IO_HEADER_LEN,
};

/// One ring-buffer record, by its [`EventKind`].
#[derive(Clone, Copy, Debug)]
pub enum Record<'a> {
    WaitEnd(WaitEnd),
    /// Borrowed: the kernel sends a [`SockIo`] cut after its captured bytes, and
    /// a whole one is 2.8 KiB (see [`SockIoRecord::copy_into`]).
    SockIo(SockIoRecord<'a>),
    SockClosed(SockClosed),
    GoCallEnd(GoCallEnd),
    Exec(ExecEvent),
    SocksForgotten(SocksForgotten),
    GoExit(GoExit),
    TtrpcIo(TtrpcIo),
    TtrpcBind(TtrpcBind),
}

/// Why [`Record::parse`] refused a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordError {
    /// Shorter than the common [`EventHeader`].
    NoHeader { len: usize },
    /// Shorter than the record its kind names (bytes `len`, needed `need`).
    Short { kind: EventKind, len: usize, need: usize },
    /// A kind no record has.
    UnknownKind { kind: u32, len: usize },
}

impl fmt::Display for RecordError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoHeader { len } => write!(f, "ring record of {len} bytes is shorter than its {}-byte header", size_of::<EventHeader>()),
            Self::Short { kind, len, need } => write!(f, "{kind:?} ring record of {len} bytes is shorter than its {need} bytes"),
            Self::UnknownKind { kind, len } => write!(f, "ring record of unknown kind {kind} ({len} bytes)"),
        }
    }
}

impl core::error::Error for RecordError {}

/// The raw kind in a record's header, `None` when it is shorter than the header.
pub fn record_kind(bytes: &[u8]) -> Option<u32> {
    EventHeader::read_from_prefix(bytes).ok().map(|(h, _)| h.kind)
}

/// Copies a `T` out of the front of `bytes` (any alignment; longer is fine).
fn read<T: FromBytes>(bytes: &[u8], kind: EventKind) -> Result<T, RecordError> {
    T::read_from_prefix(bytes).map(|(t, _)| t).map_err(|_| RecordError::Short { kind, len: bytes.len(), need: size_of::<T>() })
}

impl<'a> Record<'a> {
    /// Decodes one record: its header's kind picks the struct, which the bytes
    /// must hold (a [`SockIo`] at least up to [`SOCK_IO_HEADER_LEN`]); bytes
    /// past it are ignored. The bytes need not be aligned.
    pub fn parse(bytes: &'a [u8]) -> Result<Self, RecordError> {
        let len = bytes.len();
        let (header, _) = EventHeader::read_from_prefix(bytes).map_err(|_| RecordError::NoHeader { len })?;
        let kind = EventKind::from_u32(header.kind).ok_or(RecordError::UnknownKind { kind: header.kind, len })?;
        Ok(match kind {
            EventKind::WaitEnd => Self::WaitEnd(read(bytes, kind)?),
            EventKind::SockIo if len < SOCK_IO_HEADER_LEN => return Err(RecordError::Short { kind, len, need: SOCK_IO_HEADER_LEN }),
            EventKind::SockIo => Self::SockIo(SockIoRecord { bytes }),
            EventKind::SockClosed => Self::SockClosed(read(bytes, kind)?),
            EventKind::GoCallEnd => Self::GoCallEnd(read(bytes, kind)?),
            EventKind::Exec => Self::Exec(read(bytes, kind)?),
            EventKind::SocksForgotten => Self::SocksForgotten(read(bytes, kind)?),
            EventKind::GoExit => Self::GoExit(read(bytes, kind)?),
            EventKind::TtrpcIo => Self::TtrpcIo(read(bytes, kind)?),
            EventKind::TtrpcBind => Self::TtrpcBind(read(bytes, kind)?),
        })
    }

    /// The record's kind.
    pub fn kind(&self) -> EventKind {
        match self {
            Self::WaitEnd(_) => EventKind::WaitEnd,
            Self::SockIo(_) => EventKind::SockIo,
            Self::SockClosed(_) => EventKind::SockClosed,
            Self::GoCallEnd(_) => EventKind::GoCallEnd,
            Self::Exec(_) => EventKind::Exec,
            Self::SocksForgotten(_) => EventKind::SocksForgotten,
            Self::GoExit(_) => EventKind::GoExit,
            Self::TtrpcIo(_) => EventKind::TtrpcIo,
            Self::TtrpcBind(_) => EventKind::TtrpcBind,
        }
    }
}

/// A [`SockIo`] record as the kernel sent it: at least [`SOCK_IO_HEADER_LEN`]
/// bytes (checked by [`Record::parse`]), then the first `captured` bytes of `data`.
#[derive(Clone, Copy, Debug)]
pub struct SockIoRecord<'a> {
    bytes: &'a [u8],
}

impl SockIoRecord<'_> {
    /// The record's bytes, as sent.
    pub fn bytes(&self) -> &[u8] {
        self.bytes
    }

    /// Makes the record whole in `rec`, which is reused from record to record: no
    /// 2.8 KiB zeroing per record, and the bytes past what is copied are left from
    /// earlier records and never read. A netlink record is read by its `n_nl` header
    /// summaries alone: its unused summaries and data bytes are not copied (the copy
    /// is most of a record's cost, in cache misses). Others are copied whole.
    pub fn copy_into(&self, rec: &mut SockIo) {
        let bytes = self.bytes;
        let fixed = offset_of!(SockIo, nl);
        rec.as_mut_bytes()[..fixed].copy_from_slice(&bytes[..fixed]);
        let n = if rec.class.kind == SockKind::Netlink as u32 {
            fixed + (rec.n_nl as usize).min(NL_SUMMARIES) * size_of::<NlSummary>()
        } else {
            bytes.len()
        };
        let n = n.min(bytes.len()).min(size_of::<SockIo>());
        rec.as_mut_bytes()[fixed..n].copy_from_slice(&bytes[fixed..n]);
    }
}

impl SockIo {
    /// An all-zero record, to [`SockIoRecord::copy_into`].
    pub fn zeroed() -> Self {
        Self::new_zeroed()
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::ToString;
    use std::vec::Vec;

    use super::*;
    use crate::{TtrpcFrame, COMM_LEN, GO_ARG_LEN, TTRPC_FRAMES};

    fn header(kind: EventKind) -> EventHeader {
        EventHeader { kind: kind as u32, _pad: 0 }
    }

    /// `bytes` behind one byte, so that they are not aligned for any record.
    fn unaligned(bytes: &[u8]) -> Vec<u8> {
        let mut v = Vec::with_capacity(bytes.len() + 1);
        v.push(0xee);
        v.extend_from_slice(bytes);
        v
    }

    /// Parses `bytes` as given and one byte off, and checks that a byte less is refused.
    fn parse_all_ways(bytes: &[u8]) -> Record<'_> {
        let kind = Record::parse(bytes).expect("whole record").kind();
        let off = unaligned(bytes);
        assert_eq!(Record::parse(&off[1..]).expect("unaligned record").kind(), kind);
        assert_eq!(
            Record::parse(&bytes[..bytes.len() - 1]).unwrap_err(),
            RecordError::Short { kind, len: bytes.len() - 1, need: bytes.len() }
        );
        Record::parse(bytes).unwrap()
    }

    #[test]
    fn wait_end_round_trips() {
        let w = WaitEnd {
            header: header(EventKind::WaitEnd),
            start_ns: 1,
            sys_exit_ns: 2,
            end_ns: 3,
            ret: -4,
            tgid: 5,
            tid: 6,
            nr: 166,
            slot: 0,
            reason: 1,
            flags: 2,
            comm: *b"containerd\0\0\0\0\0\0",
        };
        let Record::WaitEnd(r) = parse_all_ways(w.as_bytes()) else { panic!("not a WaitEnd") };
        assert_eq!(r.as_bytes(), w.as_bytes());
        let off = unaligned(w.as_bytes());
        let Ok(Record::WaitEnd(r)) = Record::parse(&off[1..]) else { panic!("not a WaitEnd") };
        assert_eq!((r.start_ns, r.end_ns, r.ret, r.tid, r.comm), (1, 3, -4, 6, w.comm));
    }

    #[test]
    fn sock_closed_and_forgotten_round_trip() {
        let c = SockClosed { header: header(EventKind::SockClosed), tgid: 7, fd: 9 };
        let Record::SockClosed(r) = parse_all_ways(c.as_bytes()) else { panic!("not a SockClosed") };
        assert_eq!((r.tgid, r.fd), (7, 9));
        let f = SocksForgotten { header: header(EventKind::SocksForgotten), tgid: 8, _pad: 0 };
        let Record::SocksForgotten(r) = parse_all_ways(f.as_bytes()) else { panic!("not a SocksForgotten") };
        assert_eq!(r.tgid, 8);
    }

    #[test]
    fn go_records_round_trip() {
        let e = ExecEvent { header: header(EventKind::Exec), tgid: 11, _pad: 0, comm: [b'x'; COMM_LEN] };
        let Record::Exec(r) = parse_all_ways(e.as_bytes()) else { panic!("not an ExecEvent") };
        assert_eq!(r.as_bytes(), e.as_bytes());
        let x = GoExit { header: header(EventKind::GoExit), g: 0xc000_0010, exit_ns: 12, tgid: 13, _pad: 0 };
        let Record::GoExit(r) = parse_all_ways(x.as_bytes()) else { panic!("not a GoExit") };
        assert_eq!((r.g, r.exit_ns, r.tgid), (0xc000_0010, 12, 13));
        let mut arg = [0; GO_ARG_LEN];
        arg[..3].copy_from_slice(b"abc");
        let c = GoCallEnd {
            header: header(EventKind::GoCallEnd),
            g: 1,
            start_ns: 2,
            end_ns: 3,
            receiver: 4,
            func: 5,
            tgid: 6,
            tid: 7,
            arg_len: 3,
            arg,
        };
        let Record::GoCallEnd(r) = parse_all_ways(c.as_bytes()) else { panic!("not a GoCallEnd") };
        assert_eq!(r.as_bytes(), c.as_bytes());
    }

    #[test]
    fn ttrpc_records_round_trip() {
        let mut frames = [TtrpcFrame::default(); TTRPC_FRAMES];
        frames[1] = TtrpcFrame { len: 42, stream: 3, kind: 2, flags: 0, _pad: 0 };
        let io = TtrpcIo {
            header: header(EventKind::TtrpcIo),
            start_ns: 1,
            end_ns: 2,
            g: 3,
            tgid: 4,
            tid: 5,
            fd: 6,
            slot: 7,
            n: 2,
            _pad: 0,
            frames,
        };
        let Record::TtrpcIo(r) = parse_all_ways(io.as_bytes()) else { panic!("not a TtrpcIo") };
        assert_eq!((r.n, r.frames[1]), (2, frames[1]));
        let b = TtrpcBind { header: header(EventKind::TtrpcBind), sender_g: 1, caller_g: 2, tgid: 3, stream: 5 };
        let Record::TtrpcBind(r) = parse_all_ways(b.as_bytes()) else { panic!("not a TtrpcBind") };
        assert_eq!((r.sender_g, r.caller_g, r.tgid, r.stream), (1, 2, 3, 5));
    }

    /// A `SockIo` as the kernel sends it: cut after its captured bytes.
    fn sock_io(kind: SockKind, n_nl: u32, captured: usize, fill: u8) -> Vec<u8> {
        let mut r = SockIo::zeroed();
        r.header = header(EventKind::SockIo);
        r.class.kind = kind as u32;
        r.n_nl = n_nl;
        r.captured = captured as u32;
        r.tgid = 7;
        for (i, s) in r.nl.iter_mut().enumerate() {
            *s = NlSummary { len: 16, msg_type: 16 + i as u16, flags: 0, seq: 100 + i as u32, error: 0, pid: 0 };
        }
        r.data[..captured].fill(fill);
        r.as_bytes()[..SOCK_IO_HEADER_LEN + captured].to_vec()
    }

    fn sock_io_record(bytes: &[u8]) -> SockIoRecord<'_> {
        match Record::parse(bytes) {
            Ok(Record::SockIo(r)) => r,
            other => panic!("not a SockIo: {other:?}"),
        }
    }

    #[test]
    fn sock_io_needs_its_header_and_summaries_only() {
        let bytes = sock_io(SockKind::Dbus, 0, 0, 0);
        assert_eq!(bytes.len(), SOCK_IO_HEADER_LEN);
        assert_eq!(sock_io_record(&bytes).bytes().len(), SOCK_IO_HEADER_LEN);
        let off = unaligned(&bytes);
        assert_eq!(sock_io_record(&off[1..]).bytes(), &bytes[..]);
        assert_eq!(
            Record::parse(&bytes[..SOCK_IO_HEADER_LEN - 1]).unwrap_err(),
            RecordError::Short { kind: EventKind::SockIo, len: SOCK_IO_HEADER_LEN - 1, need: SOCK_IO_HEADER_LEN }
        );
    }

    #[test]
    fn netlink_copies_its_summaries_only() {
        let mut rec = SockIo::zeroed();
        let bytes = unaligned(&sock_io(SockKind::Netlink, 2, 64, 0xab));
        sock_io_record(&bytes[1..]).copy_into(&mut rec);
        assert_eq!((rec.tgid, rec.n_nl, rec.captured), (7, 2, 64));
        assert_eq!((rec.nl[0].seq, rec.nl[1].seq), (100, 101));
        assert_eq!(rec.nl[2].seq, 0, "a summary past n_nl is not copied");
        assert!(rec.data.iter().all(|&b| b == 0), "nor are the data bytes");
    }

    #[test]
    fn dbus_copies_its_data_and_a_reused_record_is_overwritten() {
        let mut rec = SockIo::zeroed();
        sock_io_record(&sock_io(SockKind::Dbus, 0, 40, 0xcd)).copy_into(&mut rec);
        assert_eq!(rec.captured, 40);
        assert!(rec.data[..40].iter().all(|&b| b == 0xcd));
        sock_io_record(&sock_io(SockKind::Netlink, 1, 0, 0)).copy_into(&mut rec);
        assert_eq!((rec.class.kind, rec.n_nl, rec.captured, rec.nl[0].seq), (SockKind::Netlink as u32, 1, 0, 100));
        // A record too short is refused rather than read past its end.
        let e = Record::parse(&[2, 0, 0, 0, 0, 0, 0, 0, 3]).unwrap_err();
        assert_eq!(e, RecordError::Short { kind: EventKind::SockIo, len: 9, need: SOCK_IO_HEADER_LEN });
        assert_eq!(e.to_string(), "SockIo ring record of 9 bytes is shorter than its 736 bytes");
    }

    #[test]
    fn short_and_unknown_records_are_refused() {
        assert_eq!(Record::parse(&[]).unwrap_err(), RecordError::NoHeader { len: 0 });
        assert_eq!(Record::parse(&[3, 0, 0, 0]).unwrap_err(), RecordError::NoHeader { len: 4 });
        assert_eq!(record_kind(&[3, 0, 0, 0]), None);
        let c = SockClosed { header: header(EventKind::SockClosed), tgid: 7, fd: 9 };
        assert_eq!(Record::parse(&c.as_bytes()[..12]).unwrap_err(), RecordError::Short { kind: EventKind::SockClosed, len: 12, need: 16 });
        let mut bytes = [0u8; 200];
        bytes[..4].copy_from_slice(&0u32.to_ne_bytes());
        assert_eq!(Record::parse(&bytes).unwrap_err(), RecordError::UnknownKind { kind: 0, len: 200 });
        bytes[..4].copy_from_slice(&10u32.to_ne_bytes());
        let e = Record::parse(&bytes).unwrap_err();
        assert_eq!(e, RecordError::UnknownKind { kind: 10, len: 200 });
        assert_eq!(e.to_string(), "ring record of unknown kind 10 (200 bytes)");
        assert_eq!(record_kind(&bytes), Some(10));
        assert_eq!(RecordError::NoHeader { len: 3 }.to_string(), "ring record of 3 bytes is shorter than its 8-byte header");
    }

    #[test]
    fn every_kind_has_its_number() {
        for n in 0..=10 {
            assert_eq!(EventKind::from_u32(n).map(|k| k as u32), (1..=9).contains(&n).then_some(n));
        }
    }
}
