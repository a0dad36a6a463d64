//! Netlink attributes (`struct nlattr { __u16 nla_len; __u16 nla_type; }`,
//! then the payload, each attribute aligned to 4).

use super::header::{align, u16_at};

/// `NLA_F_NESTED`.
pub const NLA_F_NESTED: u16 = 1 << 15;
/// `NLA_F_NET_BYTEORDER`.
pub const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
/// The bits of `nla_type` that are the type.
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

/// One attribute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attr<'a> {
    /// The type, without the NESTED and NET_BYTEORDER bits.
    pub kind: u16,
    pub nested: bool,
    pub payload: &'a [u8],
}

/// The attributes of a buffer, in order. Stops at the first one whose length
/// is below 4 or runs past the buffer (a cut capture).
#[derive(Clone, Debug)]
pub struct Attrs<'a> {
    buf: &'a [u8],
}

impl<'a> Attrs<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Attrs { buf }
    }
}

impl<'a> Iterator for Attrs<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let len = u16_at(self.buf, 0)? as usize;
        let raw_kind = u16_at(self.buf, 2)?;
        if len < 4 || len > self.buf.len() {
            self.buf = &[];
            return None;
        }
        let payload = &self.buf[4..len];
        self.buf = self.buf.get(align(len)..).unwrap_or(&[]);
        Some(Attr { kind: raw_kind & NLA_TYPE_MASK, nested: raw_kind & NLA_F_NESTED != 0, payload })
    }
}

/// A NUL-terminated string attribute, at most `max` bytes with its NUL.
/// `None` if it has no NUL within `max` bytes or is not UTF-8.
pub fn c_string(payload: &[u8], max: usize) -> Option<String> {
    let within = &payload[..payload.len().min(max)];
    let end = within.iter().position(|&c| c == 0)?;
    std::str::from_utf8(&within[..end]).ok().map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::header::build::attr;

    #[test]
    fn walks_and_stops() {
        let mut buf = attr(1, &[0x1d, 0]);
        buf.extend(attr(2 | NLA_F_NESTED, &attr(7, b"x\0")));
        buf.extend(attr(3, b"abc\0"));
        let all: Vec<_> = Attrs::new(&buf).collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[0], Attr { kind: 1, nested: false, payload: &[0x1d, 0] });
        assert!(all[1].nested && all[1].kind == 2);
        assert_eq!(Attrs::new(all[1].payload).next().map(|a| a.payload), Some(&b"x\0"[..]));
        assert_eq!(c_string(all[2].payload, 16).as_deref(), Some("abc"));
        for cut in 0..buf.len() {
            let n = Attrs::new(&buf[..cut]).count();
            assert!(n <= 3);
        }
        // Zero length, and a length past the end.
        assert_eq!(Attrs::new(&[0, 0, 1, 0, 9, 9, 9, 9]).count(), 0);
        assert_eq!(Attrs::new(&[200, 0, 1, 0, 9, 9, 9, 9]).count(), 0);
        assert_eq!(c_string(b"abc", 16), None);
        assert_eq!(c_string(b"aaaaaaaaaaaaaaaaaaaa\0", 16), None);
    }
}
