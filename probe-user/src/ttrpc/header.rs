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
//! plegwatch never reads a payload.

use plegwatch_abi::{TTRPC_HEADER_LEN, TTRPC_MAX_LEN, TtrpcFrame};

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

/// Walks a whole byte stream of frames, as the kernel does buffer by buffer
/// (for tests and fuzzing of the kernel's logic in userspace): the headers
/// in `bytes`, starting at a frame boundary, and the bytes of a frame cut
/// at the end.
pub fn headers_in(bytes: &[u8]) -> Result<(Vec<Header>, usize), HeaderError> {
    let mut out = Vec::new();
    let mut off = 0usize;
    while off < bytes.len() {
        let h = Header::parse(&bytes[off..])?;
        let end = off + TTRPC_HEADER_LEN + h.len as usize;
        out.push(h);
        if end > bytes.len() {
            return Ok((out, end - bytes.len()));
        }
        off = end;
    }
    Ok((out, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_stream_of_frames_is_walked_header_to_header() {
        let mut s = Vec::new();
        for (stream, len) in [(1u32, 3u32), (3, 0), (5, 20)] {
            s.extend_from_slice(&Header { len, stream, kind: FrameKind::Response, flags: 0 }.encode());
            s.extend(std::iter::repeat_n(0xee, len as usize));
        }
        let (h, cut) = headers_in(&s).unwrap();
        assert_eq!(h.iter().map(|h| h.stream).collect::<Vec<_>>(), vec![1, 3, 5]);
        assert_eq!(cut, 0);
        let (h, cut) = headers_in(&s[..s.len() - 5]).unwrap();
        assert_eq!((h.len(), cut), (3, 5));
    }
}
