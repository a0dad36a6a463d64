//! ttrpc connections to containerd shims: frame headers walked in the kernel.

use core::mem::size_of;

use crate::EventHeader;

/// Bytes of a ttrpc frame header: length u32 BE, stream id u32 BE, type u8, flags u8.
pub const TTRPC_HEADER_LEN: usize = 10;
/// Bytes that end a shim socket's path: `/s/` then the sha256 in hex.
pub const TTRPC_SHIM_SUFFIX_LEN: usize = 67;
/// Frame headers one [`TtrpcIo`] record carries at most; a receive that
/// brought more sends several records.
pub const TTRPC_FRAMES: usize = 8;
/// The largest frame length believed (ttrpc's default limit is 4 MiB); a
/// bigger one, or an unknown type or flag, means the stream was joined out of
/// step: the socket is forgotten.
pub const TTRPC_MAX_LEN: u32 = 16 << 20;

/// ttrpc maps.
pub mod ttrpc_maps {
    /// `HashMap<u64 (tgid << 32 | fd), TtrpcPos>`: where each ttrpc socket's
    /// byte stream stands, each way, so that only headers are read.
    pub const TTRPC_POS: &str = "TTRPC_POS";
    /// `LruHashMap<TtrpcReqKey, u64 g>`: ttrpc 1.1 only, the goroutine that
    /// called `(*Client).dispatch` with this request, until the client's
    /// sender goroutine sends it.
    pub const TTRPC_CALLERS: &str = "TTRPC_CALLERS";
}

/// One direction of a ttrpc byte stream.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TtrpcDir {
    /// Bytes of the current frame's payload still to come.
    pub skip: u32,
    /// Bytes of a header cut by the end of the last syscall, kept in `part`.
    pub have: u32,
    pub part: [u8; 16],
}
const _: () = assert!(size_of::<TtrpcDir>() == 24);

/// The value of [`ttrpc_maps::TTRPC_POS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TtrpcPos {
    pub tx: TtrpcDir,
    pub rx: TtrpcDir,
    /// The socket's [`SockClass::gen`](crate::SockClass::gen): a stale position is started afresh.
    pub gen: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<TtrpcPos>() == 56);

/// Key of [`ttrpc_maps::TTRPC_CALLERS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TtrpcReqKey {
    /// The `*ttrpc.Request`.
    pub req: u64,
    pub tgid: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<TtrpcReqKey>() == 16);

/// One ttrpc frame header, as read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct TtrpcFrame {
    pub len: u32,
    pub stream: u32,
    /// 1 request, 2 response, 3 data.
    pub kind: u8,
    pub flags: u8,
    pub _pad: u16,
}
const _: () = assert!(size_of::<TtrpcFrame>() == 12);

/// ttrpc's known flags: remote closed, remote open, no data (v1.2).
pub const TTRPC_KNOWN_FLAGS: u8 = 0x7;
/// Most frames walked in one syscall's bytes; past it the socket is
/// forgotten (a 4 KiB bufio read of the smallest responses holds fewer).
pub const TTRPC_WALK_MAX: usize = 48;

/// Parses a ttrpc frame header, or refuses one that makes no sense: an
/// unknown type or flag, or a length over [`TTRPC_MAX_LEN`].
#[inline(always)]
pub fn ttrpc_parse(h: &[u8; TTRPC_HEADER_LEN]) -> Option<TtrpcFrame> {
    let f = TtrpcFrame {
        len: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
        stream: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        kind: h[8],
        flags: h[9],
        _pad: 0,
    };
    if f.kind == 0 || f.kind > 3 || f.flags & !TTRPC_KNOWN_FLAGS != 0 || f.len > TTRPC_MAX_LEN {
        return None;
    }
    Some(f)
}

/// How [`ttrpc_walk`] reads a syscall's bytes: `bpf_probe_read_user` in the
/// kernel, a slice in tests.
pub trait TtrpcBytes {
    /// The 10 bytes at `off`.
    fn header(&mut self, off: u64) -> Option<[u8; TTRPC_HEADER_LEN]>;
    /// `n` bytes (1..=9) at `off` into `dst[at..at + n]` (`at + n <= 16`).
    fn part(&mut self, dst: &mut [u8; 16], at: u32, off: u64, n: u32) -> Option<()>;
}

/// Walks the ttrpc frames in one syscall's `len` bytes from where `d` left
/// off, handing each header to `emit` and reading nothing but headers: the
/// rest of the current frame's payload is skipped, a header cut by the end
/// of the bytes is kept in `d.part` and completed by the next call. `None`
/// when a header makes no sense or the bytes hold more than
/// [`TTRPC_WALK_MAX`] frames: the stream's place is lost.
#[inline(always)]
pub fn ttrpc_walk<B: TtrpcBytes, E: FnMut(TtrpcFrame)>(d: &mut TtrpcDir, len: u64, bytes: &mut B, emit: &mut E) -> Option<()> {
    const HDR: u64 = TTRPC_HEADER_LEN as u64;
    let mut off: u64 = 0;
    if len == 0 {
        return Some(());
    }
    if d.have > 0 {
        // The rest of a header the last call cut (or as much of it as came).
        if d.have as u64 >= HDR {
            return None;
        }
        let need = HDR - d.have as u64;
        let take = if len < need { len } else { need };
        bytes.part(&mut d.part, d.have, 0, take as u32)?;
        d.have += take as u32;
        if (d.have as u64) < HDR {
            return Some(());
        }
        let p = &d.part;
        let f = ttrpc_parse(&[p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]])?;
        emit(f);
        d.have = 0;
        d.skip = f.len;
        off = take;
    }
    let mut i = 0;
    while i < TTRPC_WALK_MAX {
        let left = len - off;
        if d.skip as u64 >= left {
            d.skip -= left as u32;
            return Some(());
        }
        off += d.skip as u64;
        d.skip = 0;
        let left = len - off;
        if left == 0 {
            return Some(());
        }
        if left < HDR {
            bytes.part(&mut d.part, 0, off, left as u32)?;
            d.have = left as u32;
            return Some(());
        }
        let f = ttrpc_parse(&bytes.header(off)?)?;
        emit(f);
        off += HDR;
        d.skip = f.len;
        i += 1;
    }
    // The last frame walked may end at or past the end of the bytes.
    let left = len - off;
    if d.skip as u64 >= left {
        d.skip -= left as u32;
        return Some(());
    }
    None
}

/// The frame headers one send or receive on a ttrpc socket moved.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct TtrpcIo {
    pub header: EventHeader,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The goroutine that made the syscall (read from TLS; 0 if unknown).
    pub g: u64,
    pub tgid: u32,
    pub tid: u32,
    pub fd: u32,
    /// A [`SockSlot`](crate::SockSlot) as u32.
    pub slot: u32,
    /// Valid entries of `frames`.
    pub n: u32,
    pub _pad: u32,
    pub frames: [TtrpcFrame; TTRPC_FRAMES],
}
const _: () = assert!(size_of::<TtrpcIo>() == 56 + TTRPC_FRAMES * 12);

/// ttrpc 1.1's client writes requests from one sender goroutine per
/// connection, not from the caller's: at `(*Client).send` the sender names
/// the stream id and the request, which `(*Client).dispatch` had tied to its
/// caller. Sent before the frame is written, on `SOCK_EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct TtrpcBind {
    pub header: EventHeader,
    /// The client's sender goroutine, which writes the frame next.
    pub sender_g: u64,
    /// The goroutine that called `dispatch` and waits for the reply.
    pub caller_g: u64,
    pub tgid: u32,
    pub stream: u32,
}
const _: () = assert!(size_of::<TtrpcBind>() == 32);
