//! Netlink buffers from anywhere: the chain parser, attribute walker, family
//! table and request tracker must never panic, loop or blow up.
//!
//! Input: byte 0 picks the protocol, bytes 1..3 a capture cut, the rest is
//! split into sends and receives at 0xA5 0x5A markers.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegwatch_proto::netlink::{
    attr::Attrs,
    header::{self, NLMSG_HDRLEN},
    names, GenlFamilies, SocketTracker,
};

const PROTOCOLS: [u32; 4] = [names::NETLINK_ROUTE, names::NETLINK_GENERIC, names::NETLINK_SOCK_DIAG, names::NETLINK_AUDIT];

fuzz_target!(|data: &[u8]| {
    if data.len() < 3 {
        return;
    }
    let protocol = PROTOCOLS[data[0] as usize % PROTOCOLS.len()];
    let cut = u16::from_le_bytes([data[1], data[2]]) as usize;
    let body = &data[3..];

    // The parser alone: headers are 16 bytes apart at least, every offset in
    // bounds, every payload inside the buffer.
    let p = header::parse(body, protocol);
    assert!(p.messages.len() <= body.len() / NLMSG_HDRLEN);
    let mut last_end = 0;
    for m in &p.messages {
        assert!(m.offset >= last_end && m.offset + NLMSG_HDRLEN <= body.len());
        assert!(m.payload.len() <= body.len());
        last_end = m.offset + NLMSG_HDRLEN;
        for a in Attrs::new(m.payload) {
            assert!(a.payload.len() <= m.payload.len());
        }
        let _ = names::type_name(protocol, m.header.msg_type, None);
        let _ = names::flag_names(m.header.flags, names::flag_context(protocol, m.header.msg_type));
    }
    let mut fams = GenlFamilies::new();
    fams.learn_all(body);

    // The tracker over a conversation.
    let mut t = SocketTracker::new(protocol);
    let mut now = 0u64;
    for (i, chunk) in body.split(|&b| b == 0xA5).enumerate() {
        now += 1;
        let captured = &chunk[..chunk.len().min(cut.max(1))];
        if i % 2 == 0 {
            t.on_send_captured(captured, chunk.len(), now);
        } else {
            t.on_recv_captured(captured, chunk.len(), now, Some(&mut fams));
        }
    }
    for o in t.outstanding(now) {
        let _ = o.request.describe(Some(&fams));
    }
});
