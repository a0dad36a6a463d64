//! Arbitrary chunks with arbitrary total lengths into the D-Bus reassembler
//! and call tracker: never panic, never buffer without bound.
//!
//! Input: byte 0 picks the side; then records of (u16 captured length,
//! u16 extra uncaptured length, bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegwatch_proto::dbus::{header, Connection, Side};

fuzz_target!(|data: &[u8]| {
    let Some((&first, mut rest)) = data.split_first() else { return };
    let side = if first & 1 == 0 { Side::Client } else { Side::Server };
    let mut conn = Connection::new(side);
    let mut now = 0u64;
    while rest.len() >= 4 {
        let n = u16::from_le_bytes([rest[0], rest[1]]) as usize;
        let extra = u16::from_le_bytes([rest[2], rest[3]]) as usize;
        rest = &rest[4..];
        let take = n.min(rest.len());
        let (chunk, tail) = rest.split_at(take);
        rest = tail;
        now += 1;
        // Low bit of the extra length picks the direction.
        let fed = if extra & 1 == 0 {
            conn.on_write(chunk, chunk.len() + (extra >> 1), now)
        } else {
            conn.on_read(chunk, chunk.len() + (extra >> 1), now).0
        };
        assert!(fed.messages.len() <= chunk.len() / header::FIXED_LEN + 1);
    }
    // Each message header alone, too.
    let _ = header::parse(rest);
    let _ = header::plausible_start(rest);
    let _ = conn.outstanding(now);
    let _ = conn.calls().unanswered_incoming(now);
});
