//! The ttrpc frame header: 10 bytes before every message.
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | payload length, u32 big-endian |
//! | 4..8 | stream id, u32 big-endian (odd: opened by the client) |
//! | 8 | type: 1 request, 2 response, 3 data (ttrpc ≥ 1.2 streams) |
//! | 9 | flags: 0x1 remote closed, 0x2 remote open, 0x4 no data (≥ 1.2) |
//!
//! (`channel.go` in containerd/ttrpc, v1.1.1 to v1.2.x: `messageHeader`,
//! `readMessageHeader`, `writeMessageHeader`.) Only headers are parsed:
//! plegwatch never reads a payload. The kernel program follows the byte
//! stream with `plegwatch_abi::ttrpc_walk`, tested here on every way of
//! cutting a stream into syscalls.

use plegwatch_abi::{TtrpcFrame, TTRPC_HEADER_LEN, TTRPC_MAX_LEN};

/// A frame's type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    Request,
    Response,
    Data,
}

impl FrameKind {
    pub fn from_u8(b: u8) -> Option<Self> {
        match b {
            1 => Some(FrameKind::Request),
            2 => Some(FrameKind::Response),
            3 => Some(FrameKind::Data),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            FrameKind::Request => "request",
            FrameKind::Response => "response",
            FrameKind::Data => "data",
        }
    }
}

/// `flagRemoteClosed`: the sender will send no more on this stream.
pub const FLAG_REMOTE_CLOSED: u8 = 0x1;
/// `flagRemoteOpen`: the sender keeps the stream open (a streaming call).
pub const FLAG_REMOTE_OPEN: u8 = 0x2;
/// `flagNoData`: a data frame with no payload.
pub const FLAG_NO_DATA: u8 = 0x4;
const KNOWN_FLAGS: u8 = FLAG_REMOTE_CLOSED | FLAG_REMOTE_OPEN | FLAG_NO_DATA;

/// One frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// Payload bytes after the header.
    pub len: u32,
    pub stream: u32,
    pub kind: FrameKind,
    pub flags: u8,
}

/// Why bytes are not a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("ttrpc header cut short: {0} of 10 bytes")]
    Short(usize),
    #[error("unknown ttrpc frame type {0}")]
    Type(u8),
    #[error("unknown ttrpc flags {0:#x}")]
    Flags(u8),
    #[error("ttrpc frame length {0} over the {TTRPC_MAX_LEN}-byte limit")]
    TooLong(u32),
}

impl Header {
    /// Parses the first 10 bytes of `b`, with the same checks the kernel
    /// program makes before it believes a header.
    pub fn parse(b: &[u8]) -> Result<Header, HeaderError> {
        let h: &[u8; TTRPC_HEADER_LEN] = b.get(..TTRPC_HEADER_LEN).and_then(|s| s.try_into().ok()).ok_or(HeaderError::Short(b.len()))?;
        let len = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        let stream = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
        let kind = FrameKind::from_u8(h[8]).ok_or(HeaderError::Type(h[8]))?;
        if h[9] & !KNOWN_FLAGS != 0 {
            return Err(HeaderError::Flags(h[9]));
        }
        if len > TTRPC_MAX_LEN {
            return Err(HeaderError::TooLong(len));
        }
        Ok(Header { len, stream, kind, flags: h[9] })
    }

    /// The header as the kernel program summarised it.
    pub fn from_frame(f: &TtrpcFrame) -> Result<Header, HeaderError> {
        let mut b = [0u8; TTRPC_HEADER_LEN];
        b[..4].copy_from_slice(&f.len.to_be_bytes());
        b[4..8].copy_from_slice(&f.stream.to_be_bytes());
        b[8] = f.kind;
        b[9] = f.flags;
        Header::parse(&b)
    }

    /// The 10 bytes on the wire.
    pub fn encode(&self) -> [u8; TTRPC_HEADER_LEN] {
        let mut b = [0u8; TTRPC_HEADER_LEN];
        b[..4].copy_from_slice(&self.len.to_be_bytes());
        b[4..8].copy_from_slice(&self.stream.to_be_bytes());
        b[8] = match self.kind {
            FrameKind::Request => 1,
            FrameKind::Response => 2,
            FrameKind::Data => 3,
        };
        b[9] = self.flags;
        b
    }

    /// Whether this frame ends the stream from its sender's side: a response
    /// always does in unary ttrpc; a data frame when flagged remote-closed.
    pub fn closes(&self) -> bool {
        match self.kind {
            FrameKind::Response => true,
            FrameKind::Data => self.flags & FLAG_REMOTE_CLOSED != 0,
            FrameKind::Request => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use plegwatch_abi::{ttrpc_parse, ttrpc_walk, TtrpcBytes, TtrpcDir, TTRPC_WALK_MAX};

    /// containerd's Update request to a shim: a 10-byte header, then the
    /// marshalled `ttrpc.Request` (bytes as written by ttrpc v1.1.1's
    /// `channel.send`).
    #[test]
    fn a_request_header_parses() {
        let b = [0, 0, 0x01, 0x2c, 0, 0, 0, 7, 1, 0];
        let h = Header::parse(&b).unwrap();
        assert_eq!(h, Header { len: 300, stream: 7, kind: FrameKind::Request, flags: 0 });
        assert!(!h.closes());
        assert_eq!(h.encode(), b);
    }

    #[test]
    fn a_response_closes_its_stream_and_data_only_when_flagged() {
        let resp = Header::parse(&[0, 0, 0, 2, 0, 0, 0, 7, 2, 0]).unwrap();
        assert!(resp.closes());
        let data = Header::parse(&[0, 0, 0, 0, 0, 0, 0, 9, 3, FLAG_NO_DATA]).unwrap();
        assert!(!data.closes());
        let last = Header::parse(&[0, 0, 0, 0, 0, 0, 0, 9, 3, FLAG_REMOTE_CLOSED | FLAG_NO_DATA]).unwrap();
        assert!(last.closes());
    }

    #[test]
    fn nonsense_is_refused() {
        assert_eq!(Header::parse(&[0, 0, 0, 1, 0, 0, 0, 1, 1]), Err(HeaderError::Short(9)));
        assert_eq!(Header::parse(&[0, 0, 0, 1, 0, 0, 0, 1, 0, 0]), Err(HeaderError::Type(0)));
        assert_eq!(Header::parse(&[0, 0, 0, 1, 0, 0, 0, 1, 4, 0]), Err(HeaderError::Type(4)));
        assert_eq!(Header::parse(&[0, 0, 0, 1, 0, 0, 0, 1, 1, 0x8]), Err(HeaderError::Flags(8)));
        assert_eq!(Header::parse(&[0x10, 0, 0, 1, 0, 0, 0, 1, 1, 0]), Err(HeaderError::TooLong(0x1000_0001)));
        // Payload bytes read as a header (a stream joined mid-frame).
        assert_eq!(Header::parse(b"GET / HTTP"), Err(HeaderError::Type(b'T')));
    }

    #[test]
    fn the_kernel_summary_round_trips() {
        let f = TtrpcFrame { len: 12, stream: 3, kind: 2, flags: 0, _pad: 0 };
        assert_eq!(Header::from_frame(&f).unwrap(), Header { len: 12, stream: 3, kind: FrameKind::Response, flags: 0 });
        assert!(Header::from_frame(&TtrpcFrame { kind: 9, ..f }).is_err());
    }

    /// A syscall's bytes, for the kernel's own walk (`plegwatch_abi::ttrpc_walk`).
    struct Slice<'a>(&'a [u8]);

    impl TtrpcBytes for Slice<'_> {
        fn header(&mut self, off: u64) -> Option<[u8; TTRPC_HEADER_LEN]> {
            self.0.get(off as usize..off as usize + TTRPC_HEADER_LEN)?.try_into().ok()
        }
        fn part(&mut self, dst: &mut [u8; 16], at: u32, off: u64, n: u32) -> Option<()> {
            let (at, off, n) = (at as usize, off as usize, n as usize);
            dst.get_mut(at..at + n)?.copy_from_slice(self.0.get(off..off + n)?);
            Some(())
        }
    }

    /// The kernel's walk over `chunks` in turn (one syscall each): the headers it hands out.
    fn walk(chunks: &[&[u8]]) -> Option<(Vec<Header>, TtrpcDir)> {
        let mut d = TtrpcDir::default();
        let mut out = Vec::new();
        for c in chunks {
            ttrpc_walk(&mut d, c.len() as u64, &mut Slice(c), &mut |f| out.push(Header::from_frame(&f).unwrap()))?;
        }
        Some((out, d))
    }

    fn stream(frames: &[(FrameKind, u32, u32)]) -> (Vec<u8>, Vec<Header>) {
        let mut bytes = Vec::new();
        let mut headers = Vec::new();
        for &(kind, stream, len) in frames {
            let h = Header { len, stream, kind, flags: 0 };
            bytes.extend_from_slice(&h.encode());
            bytes.extend(std::iter::repeat_n(0xee, len as usize));
            headers.push(h);
        }
        (bytes, headers)
    }

    /// Every way of cutting a stream into three syscalls, headers cut in two
    /// included, yields every header once, and ends at a frame boundary.
    #[test]
    fn the_kernel_walk_finds_every_header_however_the_stream_is_cut() {
        let (bytes, want) =
            stream(&[(FrameKind::Request, 1, 7), (FrameKind::Response, 1, 0), (FrameKind::Response, 3, 12), (FrameKind::Data, 5, 1)]);
        for i in 0..=bytes.len() {
            for j in i..=bytes.len() {
                let (got, d) = walk(&[&bytes[..i], &bytes[i..j], &bytes[j..]]).unwrap_or_else(|| panic!("lost step at cuts {i}, {j}"));
                assert_eq!(got, want, "cuts {i}, {j}");
                assert_eq!((d.skip, d.have), (0, 0), "cuts {i}, {j}");
            }
        }
    }

    /// A large payload (containerd's Create with its spec) is skipped across
    /// syscalls without being read; the next header is found after it.
    #[test]
    fn a_payload_longer_than_a_syscall_is_skipped() {
        let (bytes, want) = stream(&[(FrameKind::Request, 7, 10_000), (FrameKind::Request, 9, 3)]);
        let chunks: Vec<&[u8]> = bytes.chunks(4096).collect();
        assert_eq!(walk(&chunks).unwrap().0, want);
        let (_, d) = walk(&[&bytes[..5000]]).unwrap();
        assert_eq!((d.skip, d.have), (10_000 + 10 - 5000, 0));
    }

    /// Joined mid-frame (payload bytes where a header should be), or more
    /// frames in one syscall than the kernel walks: the place is lost.
    #[test]
    fn the_kernel_walk_gives_up_rather_than_misread() {
        assert!(walk(&[b"GET / HTTP/1.1\r\n"]).is_none());
        let many: Vec<(FrameKind, u32, u32)> = (0..=TTRPC_WALK_MAX as u32).map(|i| (FrameKind::Response, 2 * i + 1, 0)).collect();
        let (bytes, _) = stream(&many);
        assert!(walk(&[&bytes]).is_none());
        let (bytes, want) = stream(&many[..TTRPC_WALK_MAX]);
        assert_eq!(walk(&[&bytes]).unwrap().0, want);
    }

    /// The kernel's check and this parser agree on every type and flag byte.
    #[test]
    fn the_kernel_and_the_parser_agree() {
        for kind in 0..=255u8 {
            for flags in [0u8, 1, 2, 4, 7, 8, 0x80] {
                let b = [0, 0, 1, 0, 0, 0, 0, 3, kind, flags];
                assert_eq!(ttrpc_parse(&b).is_some(), Header::parse(&b).is_ok(), "type {kind} flags {flags}");
            }
        }
        let long = [0x01, 0, 0, 1, 0, 0, 0, 3, 1, 0];
        assert!(ttrpc_parse(&long).is_none() && Header::parse(&long).is_err());
    }
}
