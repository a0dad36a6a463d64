//! Which bytes of a D-Bus stream the kernel may copy out: message headers
//! and the SASL handshake, never a message body.
//!
//! A D-Bus message is a 16-byte fixed header (endianness `l`/`B`, type,
//! flags, version 1, body length u32, serial u32, header-fields length u32),
//! the header fields, padding to 8, then the body. [`dbus_walk`] follows one
//! direction of a connection across syscalls ([`DbusDir`]: header bytes and
//! body bytes still to come) and tells the caller which byte ranges of a
//! syscall's buffer are header (to copy); the body bytes in between are
//! counted and skipped, never read. Where it cannot know (a connection
//! older than plegwatch, a header that makes no sense, bytes past the first
//! iovec) it copies nothing until a buffer *starts* with a plausible header.
//!
//! Hand-written, like [`crate::ttrpc_walk`]: it runs in the kernel (no_std, no
//! allocation, bounded loops the verifier accepts), so no crate fits.

/// [`DbusDir::mode`]: the SASL handshake (text lines) is still going on.
pub const DBUS_AUTH: u32 = 0;
/// [`DbusDir::mode`]: between or inside messages, in step.
pub const DBUS_SYNC: u32 = 1;
/// [`DbusDir::mode`]: out of step: nothing is copied until a buffer starts
/// with a plausible message header.
pub const DBUS_LOST: u32 = 2;

/// Most handshake bytes looked at per buffer: a longer handshake buffer
/// (none is: `AUTH EXTERNAL <uid hex>` is the longest line) loses step.
pub const DBUS_AUTH_SCAN: usize = 256;
/// Most messages walked in one buffer; past it the stream loses step.
pub const DBUS_WALK_MAX: usize = 16;
/// Largest header fields accepted (the parser's limit too).
pub const DBUS_MAX_FIELDS: u32 = 64 * 1024;
/// Largest body accepted (the spec's 128 MiB message limit).
pub const DBUS_MAX_BODY: u32 = 128 << 20;

/// One direction of a D-Bus connection, as the kernel follows it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DbusDir {
    /// [`DBUS_AUTH`], [`DBUS_SYNC`] or [`DBUS_LOST`].
    pub mode: u32,
    /// Header bytes (fields and padding) of the current message still to come.
    pub hdr_left: u32,
    /// Body bytes of the current message still to come after them.
    pub body_left: u32,
    /// Bytes of a fixed header cut by the end of the last buffer, in `part`.
    pub have: u32,
    pub part: [u8; 16],
}
const _: () = assert!(core::mem::size_of::<DbusDir>() == 32);

/// The value of [`crate::sock_maps::DBUS_POS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DbusPos {
    pub tx: DbusDir,
    pub rx: DbusDir,
    /// The socket's [`crate::SockClass::gen`]: a stale position is lost.
    pub gen: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<DbusPos>() == 72);

impl DbusPos {
    /// A connection seen from its first byte: both ways in the handshake.
    pub fn fresh(gen: u32) -> Self {
        DbusPos { gen, ..Default::default() }
    }

    /// A connection joined in the middle.
    pub fn lost(gen: u32) -> Self {
        let d = DbusDir { mode: DBUS_LOST, ..Default::default() };
        DbusPos { tx: d, rx: d, gen, _pad: 0 }
    }
}

/// How [`dbus_walk`] reads a syscall's buffer: `bpf_probe_read_user` in the
/// kernel, a slice in tests. Only header bytes are ever asked for, and the
/// handshake's text.
pub trait DbusBytes {
    /// The 16 bytes at `off` (a fixed header, or where one should be).
    fn fixed(&mut self, off: u64) -> Option<[u8; 16]>;
    /// How many of the first `len` (at most [`DBUS_AUTH_SCAN`]) bytes are
    /// handshake text: printable ASCII, CR and LF, and a NUL at offset 0.
    fn text_len(&mut self, len: u64) -> u64;
    /// Bytes `[off, off + n)` are header or handshake: copy them out.
    fn copy(&mut self, off: u64, n: u64);
}

/// A fixed header's (header length with padding, body length), or `None`
/// when it makes no sense.
#[inline(always)]
pub fn dbus_fixed(h: &[u8; 16]) -> Option<(u32, u32)> {
    let le = match h[0] {
        b'l' => true,
        b'B' => false,
        _ => return None,
    };
    if h[1] == 0 || h[1] > 4 || h[2] & !0x7 != 0 || h[3] != 1 {
        return None;
    }
    let word = |i: usize| {
        let b = [h[i], h[i + 1], h[i + 2], h[i + 3]];
        if le {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        }
    };
    let (body, fields) = (word(4), word(12));
    if !(8..=DBUS_MAX_FIELDS).contains(&fields) || body > DBUS_MAX_BODY {
        return None;
    }
    Some(((16 + fields + 7) & !7, body))
}

/// [`DbusCursor::known`] while a walk goes on.
pub const DBUS_GOING: u64 = u64::MAX;

/// One buffer's walk in progress: [`dbus_start`], then [`dbus_step`] until
/// it says stop. Plain data, so that the kernel can keep it in a map value
/// that a `bpf_loop` callback steps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DbusCursor {
    /// Bytes the syscall moved.
    pub len: u64,
    /// Of them, how many can be read (never more than `len`).
    pub avail: u64,
    /// The next byte to look at.
    pub off: u64,
    /// Once the walk is over, how many leading bytes it followed;
    /// [`DBUS_GOING`] until then.
    pub known: u64,
}

/// Walks one syscall that moved `len` bytes, of which the first `avail` can
/// be read (a vectored call's first iovec), from where `d` left off. Calls
/// `bytes.copy` for each header (or handshake) range and returns how many
/// leading bytes were followed: within them, what was not copied is body.
/// Past them the caller knows nothing (and copies nothing).
///
/// The kernel runs the same two halves, [`dbus_start`] and up to
/// [`DBUS_WALK_MAX`] + 1 [`dbus_step`]s, the steps in a `bpf_loop`.
#[inline(always)]
pub fn dbus_walk<B: DbusBytes>(d: &mut DbusDir, len: u64, avail: u64, bytes: &mut B) -> u64 {
    let mut c = DbusCursor::default();
    dbus_start(d, &mut c, len, avail, bytes);
    let mut i = 0;
    while c.known == DBUS_GOING && i <= DBUS_WALK_MAX {
        dbus_step(d, &mut c, bytes, i == DBUS_WALK_MAX);
        i += 1;
    }
    c.known
}

/// The first half of [`dbus_walk`]: the handshake, a lost stream's resync
/// and the rest of a fixed header cut by the last buffer. Sets `c` for
/// [`dbus_step`] (its `known` set if the walk is already over): an out
/// parameter, so that the kernel keeps it in a map value, off its stack.
#[inline(always)]
pub fn dbus_start<B: DbusBytes>(d: &mut DbusDir, c: &mut DbusCursor, len: u64, avail: u64, bytes: &mut B) {
    let avail = if avail < len { avail } else { len };
    *c = DbusCursor { len, avail, off: 0, known: DBUS_GOING };
    if len == 0 {
        c.known = 0;
        return;
    }
    if d.mode == DBUS_AUTH {
        let scan = if avail < DBUS_AUTH_SCAN as u64 { avail } else { DBUS_AUTH_SCAN as u64 };
        let t = bytes.text_len(scan);
        if t == len {
            bytes.copy(0, t);
            c.known = t;
            return;
        }
        // The first byte past the text is a message's type byte: the header
        // starts one before, at a line's start.
        let h = if t == 0 { 0 } else { t - 1 };
        if t == scan || (h > 0 && h < 2) {
            c.known = lose(d, 0);
            return;
        }
        if h > 0 {
            bytes.copy(0, h);
        }
        d.mode = DBUS_SYNC;
        d.hdr_left = 0;
        d.body_left = 0;
        d.have = 0;
        c.off = h;
    } else if d.mode != DBUS_SYNC {
        // Lost: only a buffer that starts with a header is followed.
        let ok = avail >= 16 && matches!(bytes.fixed(0), Some(h) if dbus_fixed(&h).is_some());
        if !ok {
            c.known = 0;
            return;
        }
        *d = DbusDir { mode: DBUS_SYNC, ..Default::default() };
    }
    if d.have > 0 {
        // The rest of a fixed header cut by the last buffer.
        match rest_of_fixed(d, len, avail, bytes) {
            Some(known) => c.known = known,
            None => {
                c.off = 16 - d.have as u64;
                d.have = 0;
            }
        }
    }
}

/// [`dbus_start`]'s end of a fixed header cut by the last buffer: `None`
/// when the header is now whole (`d` set for its fields and body, `d.have`
/// still the cut part's length), else what the walk ends with.
#[inline(always)]
fn rest_of_fixed<B: DbusBytes>(d: &mut DbusDir, len: u64, avail: u64, bytes: &mut B) -> Option<u64> {
    if d.have >= 16 {
        return Some(lose(d, 0));
    }
    let need = 16 - d.have as u64;
    let got = if len < need { len } else { need };
    if avail < got {
        return Some(lose(d, 0));
    }
    let Some(h) = bytes.fixed(0) else { return Some(lose(d, 0)) };
    let mut p = d.part;
    let mut i = 0;
    while i < 16 {
        if i as u64 >= d.have as u64 && ((i - d.have as usize) as u64) < got {
            p[i] = h[(i - d.have as usize) & 15];
        }
        i += 1;
    }
    bytes.copy(0, got);
    if got < need {
        d.part = p;
        d.have += got as u32;
        return Some(len);
    }
    let Some((hdr, body)) = dbus_fixed(&p) else { return Some(lose(d, 0)) };
    d.hdr_left = hdr - 16;
    d.body_left = body;
    None
}

/// One message of [`dbus_walk`]: the rest of the current message's header
/// (copied) and body (skipped), then the next fixed header, if any. Returns
/// whether to step on; when not, `c.known` is set. `last`: the walk may take
/// no more messages (past [`DBUS_WALK_MAX`] the stream loses step).
#[inline(always)]
pub fn dbus_step<B: DbusBytes>(d: &mut DbusDir, c: &mut DbusCursor, bytes: &mut B, last: bool) -> bool {
    let (len, avail) = (c.len, c.avail);
    let mut off = c.off;
    // Out of range only through a corrupted cursor: lose step.
    if off > len || avail > len {
        c.known = lose(d, 0);
        return false;
    }
    // The current message's header, then its body.
    let left = len - off;
    let take = if (d.hdr_left as u64) < left { d.hdr_left as u64 } else { left };
    if take > 0 {
        if off + take > avail {
            c.known = lose(d, off);
            return false;
        }
        bytes.copy(off, take);
        off += take;
        d.hdr_left -= take as u32;
    }
    let left = len - off;
    if d.body_left as u64 >= left {
        d.body_left -= left as u32;
        c.known = len;
        return false;
    }
    off += d.body_left as u64;
    d.body_left = 0;
    let left = len - off;
    if left == 0 {
        c.known = len;
        return false;
    }
    if last {
        c.known = lose(d, off);
        return false;
    }
    if left < 16 {
        // A fixed header cut by the end of the buffer: kept for the next.
        if off + left > avail {
            c.known = lose(d, off);
            return false;
        }
        let Some(h) = bytes.fixed(off) else {
            c.known = lose(d, off);
            return false;
        };
        let mut k = 0;
        while k < 16 {
            if (k as u64) < left {
                d.part[k] = h[k];
            }
            k += 1;
        }
        d.have = left as u32;
        bytes.copy(off, left);
        c.known = len;
        return false;
    }
    let fixed = if off + 16 > avail { None } else { bytes.fixed(off) };
    let Some((hdr, body)) = fixed.as_ref().and_then(dbus_fixed) else {
        c.known = lose(d, off);
        return false;
    };
    d.hdr_left = hdr;
    d.body_left = body;
    c.off = off;
    true
}

#[inline(always)]
fn lose(d: &mut DbusDir, off: u64) -> u64 {
    *d = DbusDir { mode: DBUS_LOST, ..Default::default() };
    off
}

#[cfg(test)]
mod tests {
    use super::*;
    extern crate std;
    use std::vec::Vec;

    /// A buffer in memory; records what was copied.
    struct Mem<'a> {
        b: &'a [u8],
        copied: Vec<(u64, u64)>,
    }

    impl DbusBytes for Mem<'_> {
        fn fixed(&mut self, off: u64) -> Option<[u8; 16]> {
            // Like bpf_probe_read_user: the page may go on past the buffer.
            let mut h = [0u8; 16];
            for (i, x) in h.iter_mut().enumerate() {
                *x = self.b.get(off as usize + i).copied().unwrap_or(0);
            }
            Some(h)
        }
        fn text_len(&mut self, len: u64) -> u64 {
            let b = &self.b[..len as usize];
            b.iter()
                .enumerate()
                .position(|(i, &c)| !((0x20..0x7f).contains(&c) || c == b'\r' || c == b'\n' || (i == 0 && c == 0)))
                .unwrap_or(b.len()) as u64
        }
        fn copy(&mut self, off: u64, n: u64) {
            assert!(off + n <= self.b.len() as u64);
            self.copied.push((off, n));
        }
    }

    /// A message: a 24-byte header (fields "MEMBER" plus padding), then `body`.
    fn msg(body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&[b'l', 1, 0, 1]);
        m.extend_from_slice(&(body.len() as u32).to_le_bytes());
        m.extend_from_slice(&7u32.to_le_bytes());
        m.extend_from_slice(&8u32.to_le_bytes());
        m.extend_from_slice(&[3, 1, b's', 0, 1, 0, 0, b'X']);
        m.extend_from_slice(body);
        m
    }

    fn copied_bytes(b: &[u8], c: &[(u64, u64)]) -> Vec<u8> {
        c.iter().flat_map(|&(o, n)| b[o as usize..(o + n) as usize].iter().copied()).collect()
    }

    const SECRET: &[u8] = b"SECRET-BODY-BYTES-0123456789";

    #[test]
    fn headers_and_handshake_only() {
        let mut d = DbusDir::default();
        let auth = b"\0AUTH EXTERNAL 30\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n";
        let mut m = Mem { b: auth, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, auth.len() as u64, auth.len() as u64, &mut m), auth.len() as u64);
        assert_eq!(copied_bytes(auth, &m.copied), auth);
        assert_eq!(d.mode, DBUS_AUTH);
        // Three messages in one buffer.
        let mut buf = Vec::new();
        for _ in 0..3 {
            buf.extend(msg(SECRET));
        }
        let mut m = Mem { b: &buf, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, buf.len() as u64, buf.len() as u64, &mut m), buf.len() as u64);
        assert_eq!(m.copied, [(0, 24), (24 + 28, 24), (2 * 52, 24)]);
        assert_eq!(d, DbusDir { mode: DBUS_SYNC, ..Default::default() });
    }

    #[test]
    fn handshake_then_message_in_one_read() {
        let mut d = DbusDir::default();
        let mut buf = b"OK 1234deadbeef\r\nAGREE_UNIX_FD\r\n".to_vec();
        let text = buf.len() as u64;
        buf.extend(msg(SECRET));
        let mut m = Mem { b: &buf, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, buf.len() as u64, buf.len() as u64, &mut m), buf.len() as u64);
        assert_eq!(m.copied, [(0, text), (text, 24)]);
    }

    #[test]
    fn split_anywhere_never_copies_body() {
        let mut stream = Vec::new();
        for i in 0..4 {
            stream.extend(msg(&SECRET[..10 + i * 5]));
        }
        for cut in 1..stream.len() {
            for cut2 in cut..stream.len() {
                let mut d = DbusDir { mode: DBUS_SYNC, ..Default::default() };
                let mut all = Vec::new();
                for (a, b) in [(0, cut), (cut, cut2), (cut2, stream.len())] {
                    let part = &stream[a..b];
                    let mut m = Mem { b: part, copied: Vec::new() };
                    let n = dbus_walk(&mut d, part.len() as u64, part.len() as u64, &mut m);
                    assert_eq!(n, part.len() as u64, "cut {cut} {cut2}");
                    all.extend(m.copied.iter().map(|&(o, n)| (o + a as u64, n)));
                }
                let got = copied_bytes(&stream, &all);
                assert_eq!(got.len(), 4 * 24, "cut {cut} {cut2}");
                assert!(!got.windows(4).any(|w| w == b"SECR"), "cut {cut} {cut2}");
            }
        }
    }

    #[test]
    fn cut_fixed_header_then_nonsense_loses_step() {
        // 10 bytes of a fixed header end one buffer; the next goes on with
        // bytes that make no header: lost, nothing past the 6 bytes that
        // would have ended the header is copied.
        let m0 = msg(SECRET);
        let mut d = DbusDir { mode: DBUS_SYNC, ..Default::default() };
        let mut m = Mem { b: &m0[..10], copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, 10, 10, &mut m), 10);
        assert_eq!((d.have, m.copied.as_slice()), (10, &[(0, 10)][..]));
        let mut bad = m0[10..16].to_vec();
        bad[4] = 0xff; // header fields of 16 MiB: above DBUS_MAX_FIELDS
        bad.extend_from_slice(SECRET);
        let mut m = Mem { b: &bad, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, bad.len() as u64, bad.len() as u64, &mut m), 0);
        assert_eq!(m.copied, [(0, 6)]);
        assert_eq!(d, DbusDir { mode: DBUS_LOST, ..Default::default() });
    }

    #[test]
    fn unseen_iovec_and_lost_step() {
        // libdbus: writev(header, body): the body is in the unread iovec.
        let m0 = msg(SECRET);
        let mut d = DbusDir { mode: DBUS_SYNC, ..Default::default() };
        let mut m = Mem { b: &m0[..24], copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, m0.len() as u64, 24, &mut m), m0.len() as u64);
        assert_eq!(m.copied, [(0, 24)]);
        // A header in the unread part: lost, and only the part before counts.
        let two = [m0.clone(), m0.clone()].concat();
        let mut m = Mem { b: &two[..30], copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, two.len() as u64, 30, &mut m), m0.len() as u64);
        assert_eq!(d.mode, DBUS_LOST);
        // Lost: a body continuation copies nothing; a header start resyncs.
        let mut m = Mem { b: SECRET, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, SECRET.len() as u64, SECRET.len() as u64, &mut m), 0);
        assert!(m.copied.is_empty());
        let mut m = Mem { b: &m0, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, m0.len() as u64, m0.len() as u64, &mut m), m0.len() as u64);
        assert_eq!(m.copied, [(0, 24)]);
        // Nonsense where a header should be.
        let bad = [m0.clone(), SECRET.to_vec()].concat();
        let mut m = Mem { b: &bad, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, bad.len() as u64, bad.len() as u64, &mut m), m0.len() as u64);
        assert_eq!(m.copied, [(0, 24)]);
        assert_eq!(d.mode, DBUS_LOST);
        // Text in the handshake that runs past the scan: lost, nothing copied.
        let mut d = DbusDir::default();
        let long = [b'A'; DBUS_AUTH_SCAN + 10];
        let mut m = Mem { b: &long, copied: Vec::new() };
        assert_eq!(dbus_walk(&mut d, long.len() as u64, long.len() as u64, &mut m), 0);
        assert!(m.copied.is_empty());
    }
}
