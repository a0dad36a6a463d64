//! The D-Bus message header (spec: "Message Protocol", "Message Format").
//!
//! ```text
//! BYTE endianness ('l' or 'B'), BYTE type (1..4), BYTE flags, BYTE version (1),
//! UINT32 body length, UINT32 serial,
//! ARRAY of STRUCT of (BYTE code, VARIANT value)      // header fields
//! ... padding to 8 ..., body
//! ```
//! Offsets and alignment count from the start of the message. The body is
//! never read.

use std::fmt;

/// The fixed part plus the header-fields array's length.
pub const FIXED_LEN: usize = 16;
/// The spec's maximum message length (128 MiB).
pub const MAX_MESSAGE_LEN: usize = 1 << 27;
/// The spec's maximum array length (64 MiB), so of the header-fields array.
pub const MAX_ARRAY_LEN: usize = 1 << 26;

/// Header strings are kept up to this many bytes (bus, interface, member
/// and error names are at most 255 by the spec; object paths have no limit).
pub const MAX_KEPT_STRING: usize = 255;

pub const FLAG_NO_REPLY_EXPECTED: u8 = 0x1;
pub const FLAG_NO_AUTO_START: u8 = 0x2;
pub const FLAG_ALLOW_INTERACTIVE_AUTHORIZATION: u8 = 0x4;

pub const FIELD_PATH: u8 = 1;
pub const FIELD_INTERFACE: u8 = 2;
pub const FIELD_MEMBER: u8 = 3;
pub const FIELD_ERROR_NAME: u8 = 4;
pub const FIELD_REPLY_SERIAL: u8 = 5;
pub const FIELD_DESTINATION: u8 = 6;
pub const FIELD_SENDER: u8 = 7;
pub const FIELD_SIGNATURE: u8 = 8;
pub const FIELD_UNIX_FDS: u8 = 9;

/// Rounds `n` up to a multiple of `a` (a power of two).
pub const fn align_to(n: usize, a: usize) -> usize {
    (n + a - 1) & !(a - 1)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

impl Endian {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'l' => Some(Endian::Little),
            b'B' => Some(Endian::Big),
            _ => None,
        }
    }

    pub fn byte(self) -> u8 {
        match self {
            Endian::Little => b'l',
            Endian::Big => b'B',
        }
    }

    fn u32(self, b: [u8; 4]) -> u32 {
        match self {
            Endian::Little => u32::from_le_bytes(b),
            Endian::Big => u32::from_be_bytes(b),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MessageKind {
    MethodCall = 1,
    MethodReturn = 2,
    Error = 3,
    Signal = 4,
}

impl MessageKind {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(MessageKind::MethodCall),
            2 => Some(MessageKind::MethodReturn),
            3 => Some(MessageKind::Error),
            4 => Some(MessageKind::Signal),
            _ => None,
        }
    }
}

impl fmt::Display for MessageKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MessageKind::MethodCall => "method_call",
            MessageKind::MethodReturn => "method_return",
            MessageKind::Error => "error",
            MessageKind::Signal => "signal",
        })
    }
}

/// Why 16 bytes are not the start of a message.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    #[error("D-Bus header: {0} bytes, need 16")]
    Short(usize),
    #[error("D-Bus header: endianness byte {0:#04x}, not 'l' or 'B'")]
    Endianness(u8),
    #[error("D-Bus header: message type {0}, not 1..4")]
    Type(u8),
    #[error("D-Bus header: protocol version {0}, not 1")]
    Version(u8),
    #[error("D-Bus header: serial 0")]
    ZeroSerial,
    #[error("D-Bus header: header fields of {fields} bytes and a body of {body} exceed the spec's limits")]
    TooLong { fields: u32, body: u32 },
}

/// The first 16 bytes of a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fixed {
    pub endian: Endian,
    pub kind: MessageKind,
    pub flags: u8,
    pub body_len: u32,
    pub serial: u32,
    /// Length of the header-fields array's contents.
    pub fields_len: u32,
}

impl Fixed {
    /// Checks and reads the first 16 bytes of `buf`.
    pub fn parse(buf: &[u8]) -> Result<Fixed, HeaderError> {
        let b: &[u8; FIXED_LEN] = buf.get(..FIXED_LEN).and_then(|s| s.try_into().ok()).ok_or(HeaderError::Short(buf.len()))?;
        let endian = Endian::from_byte(b[0]).ok_or(HeaderError::Endianness(b[0]))?;
        let kind = MessageKind::from_byte(b[1]).ok_or(HeaderError::Type(b[1]))?;
        if b[3] != 1 {
            return Err(HeaderError::Version(b[3]));
        }
        let body_len = endian.u32([b[4], b[5], b[6], b[7]]);
        let serial = endian.u32([b[8], b[9], b[10], b[11]]);
        let fields_len = endian.u32([b[12], b[13], b[14], b[15]]);
        if serial == 0 {
            return Err(HeaderError::ZeroSerial);
        }
        let fixed = Fixed { endian, kind, flags: b[2], body_len, serial, fields_len };
        if fields_len as usize > MAX_ARRAY_LEN || fixed.message_len() > MAX_MESSAGE_LEN {
            return Err(HeaderError::TooLong { fields: fields_len, body: body_len });
        }
        Ok(fixed)
    }

    /// Where the header fields end.
    pub fn fields_end(&self) -> usize {
        FIXED_LEN + self.fields_len as usize
    }

    /// The header's length with its padding: where the body starts.
    pub fn header_len(&self) -> usize {
        align_to(self.fields_end(), 8)
    }

    /// The whole message's length.
    pub fn message_len(&self) -> usize {
        self.header_len() + self.body_len as usize
    }
}

/// What a message's header says. Strings are kept as sent (lossily decoded
/// when not UTF-8), cut at [`MAX_KEPT_STRING`] bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub kind: MessageKind,
    pub flags: u8,
    pub serial: u32,
    pub body_len: u32,
    pub reply_serial: Option<u32>,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
    pub error_name: Option<String>,
    pub destination: Option<String>,
    pub sender: Option<String>,
    pub signature: Option<String>,
    pub unix_fds: Option<u32>,
    /// Every header field was read. False when a field with a complex
    /// signature stopped the walk, or the fields were cut or malformed.
    pub fields_complete: bool,
}

impl Message {
    pub fn no_reply_expected(&self) -> bool {
        self.flags & FLAG_NO_REPLY_EXPECTED != 0
    }

    /// `org.freedesktop.systemd1.Manager.StartTransientUnit`.
    pub fn method(&self) -> String {
        match (&self.interface, &self.member) {
            (Some(i), Some(m)) => format!("{i}.{m}"),
            (None, Some(m)) => m.clone(),
            (Some(i), None) => i.clone(),
            (None, None) => String::new(),
        }
    }
}

/// Parses a message header from the start of `buf`, which holds at least the
/// fixed 16 bytes and, ideally, the header fields (a cut is tolerated:
/// `fields_complete` is then false).
pub fn parse(buf: &[u8]) -> Result<Message, HeaderError> {
    let fixed = Fixed::parse(buf)?;
    Ok(parse_fields(&fixed, buf))
}

/// Reads the header fields of a message whose fixed part is `fixed`, from
/// `buf` (the message from its first byte).
pub fn parse_fields(fixed: &Fixed, buf: &[u8]) -> Message {
    let mut m = Message {
        kind: fixed.kind,
        flags: fixed.flags,
        serial: fixed.serial,
        body_len: fixed.body_len,
        reply_serial: None,
        path: None,
        interface: None,
        member: None,
        error_name: None,
        destination: None,
        sender: None,
        signature: None,
        unix_fds: None,
        fields_complete: false,
    };
    let r = Reader { buf: &buf[..buf.len().min(fixed.fields_end())], endian: fixed.endian };
    let mut pos = FIXED_LEN;
    let end = fixed.fields_end();
    loop {
        pos = align_to(pos, 8);
        if pos >= end {
            m.fields_complete = true;
            break;
        }
        let Some(code) = r.byte(pos) else { break };
        let Some((sig, after_sig)) = r.signature(pos + 1) else { break };
        let Some((value, next)) = r.value(sig, after_sig) else { break };
        pos = next;
        match (code, sig, value) {
            (FIELD_PATH, b"o", Value::Str(s)) => m.path = Some(s),
            (FIELD_INTERFACE, b"s", Value::Str(s)) => m.interface = Some(s),
            (FIELD_MEMBER, b"s", Value::Str(s)) => m.member = Some(s),
            (FIELD_ERROR_NAME, b"s", Value::Str(s)) => m.error_name = Some(s),
            (FIELD_REPLY_SERIAL, b"u", Value::U32(v)) => m.reply_serial = Some(v),
            (FIELD_DESTINATION, b"s", Value::Str(s)) => m.destination = Some(s),
            (FIELD_SENDER, b"s", Value::Str(s)) => m.sender = Some(s),
            (FIELD_SIGNATURE, b"g", Value::Str(s)) => m.signature = Some(s),
            (FIELD_UNIX_FDS, b"u", Value::U32(v)) => m.unix_fds = Some(v),
            // Unknown codes, or a known code with the wrong type: skipped.
            _ => {}
        }
    }
    m
}

enum Value {
    Str(String),
    U32(u32),
    Other,
}

/// Bounds-checked reads within the header fields.
struct Reader<'a> {
    buf: &'a [u8],
    endian: Endian,
}

impl<'a> Reader<'a> {
    fn byte(&self, pos: usize) -> Option<u8> {
        self.buf.get(pos).copied()
    }

    fn bytes(&self, pos: usize, n: usize) -> Option<&'a [u8]> {
        self.buf.get(pos..pos.checked_add(n)?)
    }

    fn u32(&self, pos: usize) -> Option<u32> {
        let b = self.bytes(pos, 4)?;
        Some(self.endian.u32([b[0], b[1], b[2], b[3]]))
    }

    /// A SIGNATURE: BYTE length, the bytes, NUL. Returns it and the position after.
    fn signature(&self, pos: usize) -> Option<(&'a [u8], usize)> {
        let n = self.byte(pos)? as usize;
        let s = self.bytes(pos + 1, n)?;
        (self.byte(pos + 1 + n)? == 0).then_some((s, pos + n + 2))
    }

    /// A STRING or OBJECT_PATH: UINT32 length (aligned 4), the bytes, NUL.
    fn string(&self, pos: usize) -> Option<(&'a [u8], usize)> {
        let pos = align_to(pos, 4);
        let n = self.u32(pos)? as usize;
        let s = self.bytes(pos + 4, n)?;
        (self.byte(pos + 4 + n)? == 0).then_some((s, pos + 4 + n + 1))
    }

    /// A variant's value of single complete type `sig`, if it is a basic
    /// type. `None` for container types (the walk stops) or a cut.
    fn value(&self, sig: &[u8], pos: usize) -> Option<(Value, usize)> {
        let text = |s: &[u8]| String::from_utf8_lossy(&s[..s.len().min(MAX_KEPT_STRING)]).into_owned();
        let fixed = |align: usize, size: usize| {
            let p = align_to(pos, align);
            self.bytes(p, size).map(|_| p + size)
        };
        match sig {
            b"s" | b"o" => self.string(pos).map(|(s, next)| (Value::Str(text(s)), next)),
            b"g" => self.signature(pos).map(|(s, next)| (Value::Str(text(s)), next)),
            b"u" | b"i" | b"b" | b"h" => {
                let p = align_to(pos, 4);
                self.u32(p).map(|v| (Value::U32(v), p + 4))
            }
            b"y" => fixed(1, 1).map(|next| (Value::Other, next)),
            b"n" | b"q" => fixed(2, 2).map(|next| (Value::Other, next)),
            b"x" | b"t" | b"d" => fixed(8, 8).map(|next| (Value::Other, next)),
            _ => None,
        }
    }
}

/// Whether `b`, the start of a captured buffer, may be the start of a
/// message: the checks used to regain sync, stricter than [`Fixed::parse`]
/// (at least the 16 fixed bytes, known flags only, some header fields of at
/// most [`MAX_HEADER_FIELDS`](super::stream::MAX_HEADER_FIELDS) bytes, the
/// first field's code known and its signature one character long).
pub fn plausible_start(b: &[u8]) -> bool {
    let Ok(f) = Fixed::parse(b) else { return false };
    f.flags & !0x7 == 0
        && f.fields_len >= 8
        && f.fields_len as usize <= super::stream::MAX_HEADER_FIELDS
        && b.get(16).is_none_or(|code| (1..=9).contains(code))
        && b.get(17).is_none_or(|&n| n == 1)
}

/// A test-only message builder, both endiannesses (for plegwatch's own
/// tests too, through the `builders` feature).
#[cfg(any(test, feature = "builders"))]
pub mod build {
    use super::*;

    pub struct Builder {
        pub endian: Endian,
        pub kind: MessageKind,
        pub flags: u8,
        pub serial: u32,
        pub fields: Vec<(u8, &'static str, FieldValue)>,
        pub body: Vec<u8>,
    }

    pub enum FieldValue {
        Str(String),
        U32(u32),
        /// Raw value bytes after the signature (caller aligns).
        Raw(Vec<u8>),
    }

    impl Builder {
        pub fn new(endian: Endian, kind: MessageKind, serial: u32) -> Self {
            Builder { endian, kind, flags: 0, serial, fields: Vec::new(), body: Vec::new() }
        }
        pub fn str(mut self, code: u8, sig: &'static str, s: &str) -> Self {
            self.fields.push((code, sig, FieldValue::Str(s.to_string())));
            self
        }
        pub fn u32(mut self, code: u8, v: u32) -> Self {
            self.fields.push((code, "u", FieldValue::U32(v)));
            self
        }
        pub fn raw(mut self, code: u8, sig: &'static str, v: Vec<u8>) -> Self {
            self.fields.push((code, sig, FieldValue::Raw(v)));
            self
        }
        pub fn flags(mut self, f: u8) -> Self {
            self.flags = f;
            self
        }
        pub fn body(mut self, b: &[u8]) -> Self {
            self.body = b.to_vec();
            self
        }

        fn put_u32(&self, out: &mut Vec<u8>, v: u32) {
            match self.endian {
                Endian::Little => out.extend_from_slice(&v.to_le_bytes()),
                Endian::Big => out.extend_from_slice(&v.to_be_bytes()),
            }
        }

        pub fn build(&self) -> Vec<u8> {
            let mut out = vec![self.endian.byte(), self.kind as u8, self.flags, 1];
            self.put_u32(&mut out, self.body.len() as u32);
            self.put_u32(&mut out, self.serial);
            self.put_u32(&mut out, 0); // fields length, patched below
            for (code, sig, v) in &self.fields {
                out.resize(align_to(out.len(), 8), 0);
                out.push(*code);
                out.push(sig.len() as u8);
                out.extend_from_slice(sig.as_bytes());
                out.push(0);
                match v {
                    FieldValue::Str(s) if *sig == "g" => {
                        out.push(s.len() as u8);
                        out.extend_from_slice(s.as_bytes());
                        out.push(0);
                    }
                    FieldValue::Str(s) => {
                        out.resize(align_to(out.len(), 4), 0);
                        self.put_u32(&mut out, s.len() as u32);
                        out.extend_from_slice(s.as_bytes());
                        out.push(0);
                    }
                    FieldValue::U32(x) => {
                        out.resize(align_to(out.len(), 4), 0);
                        self.put_u32(&mut out, *x);
                    }
                    FieldValue::Raw(b) => out.extend_from_slice(b),
                }
            }
            let fields_len = (out.len() - FIXED_LEN) as u32;
            let mut len_bytes = Vec::new();
            self.put_u32(&mut len_bytes, fields_len);
            out[12..16].copy_from_slice(&len_bytes);
            out.resize(align_to(out.len(), 8), 0);
            out.extend_from_slice(&self.body);
            out
        }
    }

    /// A METHOD_CALL as runc sends it to systemd.
    pub fn call(endian: Endian, serial: u32, member: &str) -> Builder {
        Builder::new(endian, MessageKind::MethodCall, serial)
            .str(FIELD_PATH, "o", "/org/freedesktop/systemd1")
            .str(FIELD_DESTINATION, "s", "org.freedesktop.systemd1")
            .str(FIELD_INTERFACE, "s", "org.freedesktop.systemd1.Manager")
            .str(FIELD_MEMBER, "s", member)
            .str(FIELD_SIGNATURE, "g", "ssa(sv)a(sa(sv))")
            .body(&[0u8; 100])
    }

    /// The METHOD_RETURN to `reply_serial`.
    pub fn reply(endian: Endian, serial: u32, reply_serial: u32, dest: &str) -> Builder {
        Builder::new(endian, MessageKind::MethodReturn, serial)
            .u32(FIELD_REPLY_SERIAL, reply_serial)
            .str(FIELD_DESTINATION, "s", dest)
            .str(FIELD_SENDER, "s", ":1.1")
            .str(FIELD_SIGNATURE, "g", "o")
            .body(b"\x2c\0\0\0/org/freedesktop/systemd1/job/1234567890123456789012\0\0\0\0")
    }
}

#[cfg(test)]
mod tests {
    use super::build::*;
    use super::*;

    #[test]
    fn both_endiannesses() {
        for endian in [Endian::Little, Endian::Big] {
            let bytes = call(endian, 7, "StartTransientUnit").build();
            assert_eq!(bytes.len() % 8, (100 % 8), "header padded to 8");
            let f = Fixed::parse(&bytes).unwrap();
            assert_eq!(f.message_len(), bytes.len());
            assert_eq!(f.header_len() % 8, 0);
            let m = parse(&bytes).unwrap();
            assert_eq!(m.kind, MessageKind::MethodCall);
            assert_eq!(m.serial, 7);
            assert_eq!(m.body_len, 100);
            assert_eq!(m.path.as_deref(), Some("/org/freedesktop/systemd1"));
            assert_eq!(m.destination.as_deref(), Some("org.freedesktop.systemd1"));
            assert_eq!(m.method(), "org.freedesktop.systemd1.Manager.StartTransientUnit");
            assert_eq!(m.signature.as_deref(), Some("ssa(sv)a(sa(sv))"));
            assert!(m.fields_complete, "{m:?}");
            assert!(plausible_start(&bytes));

            let r = reply(endian, 9, 7, ":1.42").build();
            let m = parse(&r).unwrap();
            assert_eq!((m.kind, m.reply_serial, m.destination.as_deref()), (MessageKind::MethodReturn, Some(7), Some(":1.42")));
        }
    }

    #[test]
    fn error_and_unix_fds() {
        let e = Builder::new(Endian::Big, MessageKind::Error, 3)
            .u32(FIELD_REPLY_SERIAL, 2)
            .str(FIELD_ERROR_NAME, "s", "org.freedesktop.DBus.Error.NoReply")
            .u32(FIELD_UNIX_FDS, 1)
            .build();
        let m = parse(&e).unwrap();
        assert_eq!(m.error_name.as_deref(), Some("org.freedesktop.DBus.Error.NoReply"));
        assert_eq!((m.reply_serial, m.unix_fds), (Some(2), Some(1)));
    }

    #[test]
    fn unknown_fields_skipped_or_stop() {
        // An unknown code with a simple type (t, aligned 8) is skipped.
        let m = Builder::new(Endian::Little, MessageKind::Signal, 5)
            .str(FIELD_PATH, "o", "/a")
            .raw(42, "t", vec![0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
            .str(FIELD_MEMBER, "s", "Changed")
            .build();
        let p = parse(&m).unwrap();
        assert_eq!((p.path.as_deref(), p.member.as_deref(), p.fields_complete), (Some("/a"), Some("Changed"), true));
        // A container type stops the walk, keeping what came before.
        let m = Builder::new(Endian::Little, MessageKind::Signal, 5)
            .str(FIELD_PATH, "o", "/a")
            .raw(43, "as", vec![0, 0, 0, 0, 0, 0, 0, 0])
            .str(FIELD_MEMBER, "s", "Changed")
            .build();
        let p = parse(&m).unwrap();
        assert_eq!((p.path.as_deref(), p.member.as_deref(), p.fields_complete), (Some("/a"), None, false));
        // A known code with the wrong type is skipped, not taken.
        let m = Builder::new(Endian::Little, MessageKind::MethodReturn, 5).raw(FIELD_REPLY_SERIAL, "y", vec![9]).build();
        assert_eq!(parse(&m).unwrap().reply_serial, None);
    }

    #[test]
    fn long_strings_are_cut() {
        let long = "/a".repeat(1000);
        let m = Builder::new(Endian::Little, MessageKind::Signal, 1).str(FIELD_PATH, "o", &long).str(FIELD_MEMBER, "s", "M").build();
        let p = parse(&m).unwrap();
        assert_eq!(p.path.as_deref(), Some(&long[..MAX_KEPT_STRING]));
        assert_eq!(p.member.as_deref(), Some("M"));
    }

    #[test]
    fn fixed_errors() {
        let good = call(Endian::Little, 1, "Ping").build();
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            Fixed::parse(&b)
        };
        assert_eq!(with(0, b'x'), Err(HeaderError::Endianness(b'x')));
        assert_eq!(with(1, 0), Err(HeaderError::Type(0)));
        assert_eq!(with(1, 5), Err(HeaderError::Type(5)));
        assert_eq!(with(3, 2), Err(HeaderError::Version(2)));
        assert_eq!(Fixed::parse(&good[..15]), Err(HeaderError::Short(15)));
        let mut z = good.clone();
        z[8..12].copy_from_slice(&[0; 4]);
        assert_eq!(Fixed::parse(&z), Err(HeaderError::ZeroSerial));
        let mut big = good.clone();
        big[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Fixed::parse(&big), Err(HeaderError::TooLong { .. })));
        let mut big = good;
        big[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(Fixed::parse(&big), Err(HeaderError::TooLong { .. })));
    }

    #[test]
    fn cut_and_garbage_fields() {
        let bytes = call(Endian::Big, 7, "StartTransientUnit").build();
        let f = Fixed::parse(&bytes).unwrap();
        for cut in FIXED_LEN..f.fields_end() {
            let m = parse(&bytes[..cut]).unwrap();
            assert!(!m.fields_complete, "cut {cut}");
        }
        // Garbage after a valid fixed part never panics.
        let mut x = 0x9e37_79b9u32;
        for _ in 0..5000 {
            let mut b = bytes[..16].to_vec();
            let n = (x % 200) as usize;
            for _ in 0..n {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                b.push(x as u8);
            }
            b[12..16].copy_from_slice(&(n as u32).to_be_bytes());
            let _ = parse(&b);
        }
    }
}
