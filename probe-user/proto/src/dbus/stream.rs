//! One direction of a D-Bus connection, reassembled into message headers
//! from what the kernel captured of each syscall.
//!
//! Each [`Stream::feed`] gets the captured prefix of one buffer (a syscall's,
//! or one iovec's) and the buffer's full length. The stream
//!
//! 1. skips the SASL phase: from the client, a NUL byte then CRLF lines up to
//!    `BEGIN`; from the server, CRLF lines (`OK <guid>`, `AGREE_UNIX_FD`, ...)
//!    until, after `OK`, a line starts with an endianness byte;
//! 2. then collects each message's header (bytes may arrive split at any
//!    point, or many messages per buffer), emits it, and skips the padding
//!    and body by count, including bytes never captured;
//! 3. loses sync when header bytes were not captured, and regains it at the
//!    start of a later buffer that looks like a message header.
//!
//! A stream first seen mid-connection (plegwatch started after the
//! handshake) starts in step 2 when its first buffer looks like a header.

use super::header::{self, Fixed, Message, FIXED_LEN};

/// Header fields longer than this are not buffered whole: the fields past it
/// are not read (the message is still emitted, and sync kept).
pub const MAX_HEADER_FIELDS: usize = 64 * 1024;
/// A SASL line longer than this loses sync.
pub const MAX_AUTH_LINE: usize = 16 * 1024;
/// At most this many bytes of the server's GUID are kept.
const MAX_GUID: usize = 64;

/// Which way the bytes go.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Written by the connecting side (runc, kubelet, a bus client).
    ClientToServer,
    /// Written by the accepting side (dbus-daemon, dbus-broker, systemd on
    /// `/run/systemd/private`).
    ServerToClient,
}

/// What the SASL phase showed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AuthSeen {
    /// Complete lines seen.
    pub lines: u32,
    /// The first word after `AUTH` (client), e.g. `EXTERNAL`.
    pub mechanism: Option<String>,
    /// The GUID of `OK <guid>` (server).
    pub guid: Option<String>,
    /// `NEGOTIATE_UNIX_FD` (client) or `AGREE_UNIX_FD` (server).
    pub unix_fd: bool,
    /// The phase ended (`BEGIN`, or the server's first message).
    pub done: bool,
}

/// Counters of a stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StreamStats {
    pub messages: u64,
    /// Times sync was lost.
    pub desyncs: u64,
    /// Times sync was regained.
    pub resyncs: u64,
    /// Bytes passed over while out of sync (captured or not).
    pub bytes_lost: u64,
    /// Messages whose header fields were longer than [`MAX_HEADER_FIELDS`].
    pub oversized_headers: u64,
}

/// What one [`Stream::feed`] produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Fed {
    pub messages: Vec<Message>,
    /// Sync was lost during this buffer.
    pub desynced: bool,
    /// Sync was regained at the start of this buffer.
    pub resynced: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Nothing seen yet.
    Start,
    /// In the SASL lines; `line` holds a partial line.
    Auth { seen_ok: bool },
    /// Collecting a header into `Stream::hdr` (empty: between messages).
    Header { fixed: Option<Fixed> },
    /// Skipping `left` bytes of padding and body.
    Skip { left: usize },
    /// Lost: waiting for a buffer that starts with a header.
    Desynced,
}

/// One direction of one connection.
#[derive(Clone, Debug)]
pub struct Stream {
    direction: Direction,
    state: State,
    /// The header being collected, from the message's first byte.
    hdr: Vec<u8>,
    /// The SASL line being collected.
    line: Vec<u8>,
    auth: AuthSeen,
    stats: StreamStats,
}

impl Stream {
    pub fn new(direction: Direction) -> Self {
        Stream {
            direction,
            state: State::Start,
            hdr: Vec::new(),
            line: Vec::new(),
            auth: AuthSeen::default(),
            stats: StreamStats::default(),
        }
    }

    pub fn direction(&self) -> Direction {
        self.direction
    }

    pub fn auth(&self) -> &AuthSeen {
        &self.auth
    }

    pub fn stats(&self) -> &StreamStats {
        &self.stats
    }

    /// Whether the stream is between or inside messages, in sync.
    pub fn in_sync(&self) -> bool {
        matches!(self.state, State::Header { .. } | State::Skip { .. })
    }

    /// Feeds one buffer: `captured` is the prefix of the `total_len` bytes the
    /// syscall moved (a `total_len` below `captured.len()` is taken as
    /// `captured.len()`).
    pub fn feed(&mut self, captured: &[u8], total_len: usize) -> Fed {
        let total_len = total_len.max(captured.len());
        let desyncs_before = self.stats.desyncs;
        let mut fed = Fed::default();
        if self.state == State::Desynced {
            if header::plausible_start(captured) {
                self.begin_message();
                self.stats.resyncs += 1;
                fed.resynced = true;
            } else {
                self.lost(total_len);
                return fed;
            }
        }
        if matches!(self.state, State::Auth { .. }) && self.line.is_empty() && header::plausible_start(captured) {
            // SASL lines never look like a header: the handshake went unseen.
            self.auth.done = true;
            self.begin_message();
        }
        let mut data = captured;
        while !data.is_empty() {
            let used = match self.state {
                State::Start => {
                    self.start(data);
                    0
                }
                State::Auth { seen_ok } => self.auth_step(data, seen_ok),
                State::Header { fixed } => self.header_step(data, fixed, &mut fed),
                State::Skip { left } => {
                    let n = left.min(data.len());
                    self.skip(left - n);
                    n
                }
                State::Desynced => {
                    self.lost(data.len());
                    data.len()
                }
            };
            data = data.get(used..).unwrap_or(&[]);
        }
        let unseen = total_len - captured.len();
        if unseen > 0 {
            match self.state {
                State::Skip { left } if left >= unseen => self.skip(left - unseen),
                State::Desynced => self.lost(unseen),
                _ => {
                    // A header, a SASL line or a new message lies in bytes
                    // that were not captured.
                    self.desync();
                    self.lost(unseen);
                }
            }
        }
        fed.desynced = self.stats.desyncs > desyncs_before;
        fed
    }

    fn lost(&mut self, n: usize) {
        self.stats.bytes_lost = self.stats.bytes_lost.saturating_add(n as u64);
    }

    fn desync(&mut self) {
        self.state = State::Desynced;
        self.hdr.clear();
        self.line.clear();
        self.stats.desyncs += 1;
    }

    fn begin_message(&mut self) {
        self.hdr.clear();
        self.state = State::Header { fixed: None };
    }

    fn skip(&mut self, left: usize) {
        if left == 0 {
            self.begin_message();
        } else {
            self.state = State::Skip { left };
        }
    }

    /// The first bytes of the stream: SASL, or (first seen mid-connection) a message.
    fn start(&mut self, data: &[u8]) {
        match data.first() {
            Some(0) if self.direction == Direction::ClientToServer => self.state = State::Auth { seen_ok: false },
            Some(_) if header::plausible_start(data) => self.begin_message(),
            Some(b) if b.is_ascii_uppercase() => self.state = State::Auth { seen_ok: false },
            _ => self.desync(),
        }
    }

    /// SASL: consumes up to the end of one line, or switches to messages.
    fn auth_step(&mut self, data: &[u8], seen_ok: bool) -> usize {
        if self.direction == Direction::ClientToServer && self.line.is_empty() && self.auth.lines == 0 && data.first() == Some(&0) {
            // The client's credentials byte.
            return 1;
        }
        if self.direction == Direction::ServerToClient
            && seen_ok
            && self.line.is_empty()
            && data.first().is_some_and(|&b| header::Endian::from_byte(b).is_some())
        {
            self.auth.done = true;
            self.begin_message();
            return 0;
        }
        let nl = data.iter().position(|&b| b == b'\n');
        let text = &data[..nl.unwrap_or(data.len())];
        if !text.iter().all(|&b| b == b'\r' || b == b'\t' || b == b' ' || b.is_ascii_graphic()) {
            // SASL is ASCII text: these are not SASL lines.
            self.desync();
            return data.len().min(nl.map_or(data.len(), |n| n + 1));
        }
        let Some(nl) = nl else {
            if self.line.len() + data.len() > MAX_AUTH_LINE {
                self.desync();
            } else {
                self.line.extend_from_slice(data);
            }
            return data.len();
        };
        if self.line.len() + nl > MAX_AUTH_LINE {
            self.desync();
            return nl + 1;
        }
        self.line.extend_from_slice(&data[..nl]);
        let line = std::mem::take(&mut self.line);
        self.auth_line(line.strip_suffix(b"\r").unwrap_or(&line), seen_ok);
        nl + 1
    }

    fn auth_line(&mut self, line: &[u8], seen_ok: bool) {
        self.auth.lines = self.auth.lines.saturating_add(1);
        let mut words = line.split(|&b| b == b' ').filter(|w| !w.is_empty());
        let cmd = words.next().unwrap_or(&[]);
        let arg = words.next();
        let text = |w: &[u8], max: usize| String::from_utf8_lossy(&w[..w.len().min(max)]).into_owned();
        let mut seen_ok = seen_ok;
        match (self.direction, cmd) {
            (Direction::ClientToServer, b"BEGIN") => {
                self.auth.done = true;
                self.begin_message();
                return;
            }
            (Direction::ClientToServer, b"AUTH") => self.auth.mechanism = arg.map(|a| text(a, 32)),
            (Direction::ClientToServer, b"NEGOTIATE_UNIX_FD") => self.auth.unix_fd = true,
            (Direction::ServerToClient, b"OK") => {
                seen_ok = true;
                self.auth.guid = arg.map(|a| text(a, MAX_GUID));
            }
            (Direction::ServerToClient, b"REJECTED") => seen_ok = false,
            (Direction::ServerToClient, b"AGREE_UNIX_FD") => self.auth.unix_fd = true,
            _ => {}
        }
        self.state = State::Auth { seen_ok };
    }

    /// Collects header bytes; emits the message once its fields are in.
    fn header_step(&mut self, data: &[u8], fixed: Option<Fixed>, fed: &mut Fed) -> usize {
        let mut used = 0;
        let mut fixed = fixed;
        loop {
            let need = match fixed {
                None => FIXED_LEN,
                Some(f) => f.fields_end().min(FIXED_LEN + MAX_HEADER_FIELDS),
            };
            let n = need.saturating_sub(self.hdr.len()).min(data.len() - used);
            self.hdr.extend_from_slice(&data[used..used + n]);
            used += n;
            if self.hdr.len() < need {
                self.state = State::Header { fixed };
                return used;
            }
            let Some(f) = fixed else {
                match Fixed::parse(&self.hdr) {
                    Ok(f) => {
                        fixed = Some(f);
                        continue;
                    }
                    Err(_) => {
                        self.desync();
                        return used;
                    }
                }
            };
            if f.fields_len as usize > MAX_HEADER_FIELDS {
                self.stats.oversized_headers += 1;
            }
            fed.messages.push(header::parse_fields(&f, &self.hdr));
            self.stats.messages += 1;
            let left = f.message_len().saturating_sub(self.hdr.len());
            self.hdr.clear();
            self.skip(left);
            return used;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dbus::header::{
        build::{call, reply, Builder},
        Endian, MessageKind, FIELD_DESTINATION, FIELD_INTERFACE, FIELD_MEMBER, FIELD_PATH,
    };

    const CLIENT_SASL: &[u8] = b"\0AUTH EXTERNAL 30\r\nNEGOTIATE_UNIX_FD\r\nBEGIN\r\n";
    const SERVER_SASL: &[u8] = b"OK 4b3a2c1d0e9f8a7b6c5d4e3f2a1b0c9d\r\nAGREE_UNIX_FD\r\n";

    fn hello(endian: Endian) -> Vec<u8> {
        Builder::new(endian, MessageKind::MethodCall, 1)
            .str(FIELD_PATH, "o", "/org/freedesktop/DBus")
            .str(FIELD_DESTINATION, "s", "org.freedesktop.DBus")
            .str(FIELD_INTERFACE, "s", "org.freedesktop.DBus")
            .str(FIELD_MEMBER, "s", "Hello")
            .build()
    }

    fn serials(msgs: &[Message]) -> Vec<u32> {
        msgs.iter().map(|m| m.serial).collect()
    }

    /// Feeds `chunks` whole; returns every message.
    fn feed_all(s: &mut Stream, chunks: &[&[u8]]) -> Vec<Message> {
        chunks.iter().flat_map(|c| s.feed(c, c.len()).messages).collect()
    }

    #[test]
    fn client_sasl_then_begin_and_message_in_one_write() {
        for endian in [Endian::Little, Endian::Big] {
            // go-dbus: NUL alone, then lines, then BEGIN with the first message.
            let mut s = Stream::new(Direction::ClientToServer);
            let h = hello(endian);
            let begin_and_hello = [b"BEGIN\r\n".as_slice(), &h].concat();
            let msgs = feed_all(&mut s, &[b"\0", b"AUTH EXTERNAL 30\r\n", b"NEGOTIATE_UNIX_FD\r\n", &begin_and_hello]);
            assert_eq!(msgs.len(), 1);
            assert_eq!(msgs[0].member.as_deref(), Some("Hello"));
            assert_eq!(s.auth().mechanism.as_deref(), Some("EXTERNAL"));
            assert!(s.auth().unix_fd && s.auth().done);
            assert!(s.in_sync());

            // sd-bus: everything pipelined in one write.
            let mut s = Stream::new(Direction::ClientToServer);
            let all = [CLIENT_SASL, &h, &call(endian, 2, "StartTransientUnit").build()].concat();
            assert_eq!(serials(&s.feed(&all, all.len()).messages), [1, 2]);
            assert_eq!(s.stats().desyncs, 0);
        }
    }

    #[test]
    fn server_sasl_lines_then_messages() {
        let r = reply(Endian::Little, 1, 1, ":1.42").build();
        // Lines in their own reads, then the message.
        let mut s = Stream::new(Direction::ServerToClient);
        let msgs = feed_all(&mut s, &[b"REJECTED EXTERNAL\r\n", b"DATA\r\n", SERVER_SASL, &r]);
        assert_eq!(serials(&msgs), [1]);
        assert_eq!(s.auth().guid.as_deref(), Some("4b3a2c1d0e9f8a7b6c5d4e3f2a1b0c9d"));
        assert!(s.auth().unix_fd);
        // Lines and message in one read.
        let mut s = Stream::new(Direction::ServerToClient);
        let all = [SERVER_SASL, &r].concat();
        assert_eq!(serials(&s.feed(&all, all.len()).messages), [1]);
        // A 'B' line before OK is not a message.
        let mut s = Stream::new(Direction::ServerToClient);
        let msgs = feed_all(&mut s, &[b"ERROR \"B?\"\r\n", b"OK abc\r\n", &reply(Endian::Big, 5, 1, ":1.9").build()]);
        assert_eq!(serials(&msgs), [5]);
    }

    #[test]
    fn split_at_every_offset() {
        for endian in [Endian::Little, Endian::Big] {
            let stream = [
                CLIENT_SASL,
                &hello(endian),
                &call(endian, 2, "StartTransientUnit").build(),
                &call(endian, 3, "SetUnitProperties").flags(1).build(),
            ]
            .concat();
            let mut whole = Stream::new(Direction::ClientToServer);
            let expect = whole.feed(&stream, stream.len()).messages;
            assert_eq!(serials(&expect), [1, 2, 3]);
            for cut in 0..=stream.len() {
                let mut s = Stream::new(Direction::ClientToServer);
                let got = feed_all(&mut s, &[&stream[..cut], &stream[cut..]]);
                assert_eq!(got, expect, "cut at {cut}");
                assert_eq!(s.stats().desyncs, 0, "cut at {cut}");
            }
            // One byte per write.
            let mut s = Stream::new(Direction::ClientToServer);
            let chunks: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(feed_all(&mut s, &chunks), expect);
        }
    }

    #[test]
    fn many_messages_in_one_read() {
        let mut buf = Vec::new();
        for i in 1..=50 {
            let e = if i % 2 == 0 { Endian::Big } else { Endian::Little };
            buf.extend(reply(e, 100 + i, i, ":1.42").build());
        }
        let mut s = Stream::new(Direction::ServerToClient);
        let fed = s.feed(&buf, buf.len());
        assert_eq!(fed.messages.len(), 50);
        assert_eq!(fed.messages[49].reply_serial, Some(50));
        assert!(!fed.desynced);
    }

    #[test]
    fn body_past_capture_keeps_sync() {
        // A 10 KiB body of which the capture holds the first 512 bytes.
        let big = call(Endian::Little, 2, "StartTransientUnit").body(&[7u8; 10_000]).build();
        let mut s = Stream::new(Direction::ClientToServer);
        let fed = s.feed(&big[..512], big.len());
        assert_eq!(serials(&fed.messages), [2]);
        assert!(!fed.desynced && s.in_sync());
        let next = call(Endian::Little, 3, "Ping").build();
        assert_eq!(serials(&s.feed(&next, next.len()).messages), [3]);

        // The body split over writes, each cut.
        let mut s = Stream::new(Direction::ClientToServer);
        s.feed(&big[..100], 100);
        for chunk in big[100..].chunks(4096) {
            let fed = s.feed(&chunk[..chunk.len().min(512)], chunk.len());
            assert!(!fed.desynced);
        }
        assert_eq!(serials(&s.feed(&next, next.len()).messages), [3]);
        assert_eq!(s.stats().desyncs, 0);
    }

    #[test]
    fn lost_header_desyncs_then_resyncs() {
        let a = call(Endian::Little, 2, "A").body(&[1u8; 300]).build();
        let b = call(Endian::Little, 3, "B").build();
        let c = call(Endian::Big, 4, "C").build();
        let mut s = Stream::new(Direction::ClientToServer);
        // One write of A then B; only 512 bytes captured: B's header is cut.
        let ab = [a.clone(), b.clone()].concat();
        let fed = s.feed(&ab[..512], ab.len());
        assert_eq!(serials(&fed.messages), [2]);
        assert!(fed.desynced);
        // A write that starts mid-message does not resync.
        let fed = s.feed(&b[20..], b.len() - 20);
        assert!(fed.messages.is_empty() && !fed.resynced);
        // One that starts with a header does.
        let fed = s.feed(&c, c.len());
        assert!(fed.resynced && !fed.desynced);
        assert_eq!(serials(&fed.messages), [4]);
        assert_eq!((s.stats().desyncs, s.stats().resyncs), (1, 1));

        // A new message starting in bytes not captured also loses sync.
        let mut s = Stream::new(Direction::ClientToServer);
        let fed = s.feed(&b, b.len() + 100);
        assert_eq!((fed.messages.len(), fed.desynced), (1, true));
        // Header bytes missing from a write cut inside the header.
        let mut s = Stream::new(Direction::ClientToServer);
        let fed = s.feed(&b[..20], b.len());
        assert!(fed.messages.is_empty() && fed.desynced);
    }

    #[test]
    fn starts_mid_connection() {
        let mut s = Stream::new(Direction::ServerToClient);
        let r = reply(Endian::Big, 9, 8, ":1.3").build();
        assert_eq!(serials(&s.feed(&r, r.len()).messages), [9]);
        let mut s = Stream::new(Direction::ClientToServer);
        // First seen with AUTH (the NUL went unseen).
        let msgs = feed_all(&mut s, &[b"AUTH EXTERNAL 30\r\nBEGIN\r\n", &hello(Endian::Little)]);
        assert_eq!(serials(&msgs), [1]);
        // Mid-message: lost until a header starts a buffer.
        let mut s = Stream::new(Direction::ServerToClient);
        let fed = s.feed(&r[5..], r.len() - 5);
        assert!(fed.desynced && fed.messages.is_empty());
        assert_eq!(serials(&s.feed(&r, r.len()).messages), [9]);
    }

    #[test]
    fn binary_in_auth_is_not_sasl() {
        // Binary bytes where SASL lines were expected: lost, and a later
        // buffer with a header resyncs.
        let mut s = Stream::new(Direction::ClientToServer);
        let fed = s.feed(b"\0\x01\x02\xff\xfe", 5);
        assert!(fed.desynced);
        let m = call(Endian::Little, 2, "X").build();
        assert_eq!(serials(&s.feed(&m, m.len()).messages), [2]);
        // A header at a buffer start in the SASL phase (the rest of it unseen).
        let mut s = Stream::new(Direction::ClientToServer);
        s.feed(b"\0AUTH EXTERNAL 30\r\n", 20);
        assert_eq!(serials(&s.feed(&m, m.len()).messages), [2]);
    }

    #[test]
    fn bad_header_in_stream_desyncs() {
        let mut s = Stream::new(Direction::ClientToServer);
        let mut bad = call(Endian::Little, 2, "X").build();
        bad[3] = 2; // version
        let good = call(Endian::Little, 3, "Y").build();
        let both = [good.clone(), bad].concat();
        let fed = s.feed(&both, both.len());
        assert_eq!((serials(&fed.messages), fed.desynced), (vec![3], true));
        assert_eq!(serials(&s.feed(&good, good.len()).messages), [3]);
    }

    #[test]
    fn oversized_header_is_bounded_and_keeps_sync() {
        let long = "x".repeat(MAX_HEADER_FIELDS + 100);
        let big = Builder::new(Endian::Little, MessageKind::Signal, 5).str(FIELD_MEMBER, "s", "Big").str(FIELD_PATH, "o", &long).build();
        let mut s = Stream::new(Direction::ServerToClient);
        let first = reply(Endian::Little, 4, 1, ":1.1").build();
        let mut got = s.feed(&first, first.len()).messages;
        got.clear();
        for chunk in big.chunks(4096) {
            got.extend(s.feed(chunk, chunk.len()).messages);
        }
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].member.as_deref(), Some("Big"));
        assert!(!got[0].fields_complete && got[0].path.is_none());
        assert_eq!(s.stats().oversized_headers, 1);
        let next = reply(Endian::Little, 6, 1, ":1.1").build();
        assert_eq!(serials(&s.feed(&next, next.len()).messages), [6]);
    }

    #[test]
    fn garbage_never_panics_and_stays_bounded() {
        let mut x = 0x2545_f491u32;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        for dir in [Direction::ClientToServer, Direction::ServerToClient] {
            let mut s = Stream::new(dir);
            for i in 0..3000 {
                let n = (rnd() % 700) as usize;
                let mut g: Vec<u8> = (0..n).map(|_| rnd() as u8).collect();
                if i % 7 == 0 && g.len() > 4 {
                    // Plausible-looking starts, to exercise the header paths.
                    g[..4].copy_from_slice(&[b'l', 1 + (rnd() % 4) as u8, 0, 1]);
                }
                let total = n + (rnd() % 3 * 1000) as usize;
                let _ = s.feed(&g, total);
                assert!(s.hdr.len() <= FIXED_LEN + MAX_HEADER_FIELDS);
                assert!(s.line.len() <= MAX_AUTH_LINE);
            }
        }
    }
}
