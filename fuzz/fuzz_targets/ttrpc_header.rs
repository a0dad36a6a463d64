//! ttrpc frame headers read off containerd's shim sockets: the parser must never
//! panic, must accept only what it can encode back byte for byte, and the stream
//! tracker over any sequence of them must stay bounded.
//!
//! Input: a run of 10-byte headers (a partial last one is parsed too).
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegwatch_proto::ttrpc::Header;

/// A ttrpc frame header: length (4), stream id (4), type, flags.
const TTRPC_HEADER_LEN: usize = 10;

fuzz_target!(|data: &[u8]| {
    for chunk in data.chunks(TTRPC_HEADER_LEN) {
        match Header::parse(chunk) {
            Ok(h) => {
                assert_eq!(chunk.len(), TTRPC_HEADER_LEN);
                assert_eq!(&h.encode()[..], chunk, "a parsed header encodes back to its bytes");
                let _ = h.closes();
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
});
