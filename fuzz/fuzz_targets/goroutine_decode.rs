//! Another process's memory as plegwatch reads it (`/proc/PID/mem`, torn while the
//! process runs): decoding a `runtime.g` with every Go version's layout must never
//! panic, and whatever it accepts must be self-consistent (a parked goroutine's saved
//! SP on its own stack, a known wait reason).
//!
//! Input: byte 0 picks the layout, the rest is the `g`'s bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegwatch_proto::gosym::gdecode::decode_g;
use plegwatch_proto::gosym::gstruct::LAYOUTS;
use plegwatch_proto::gosym::GStatus;

fuzz_target!(|data: &[u8]| {
    let Some((&pick, g)) = data.split_first() else { return };
    let layout = &LAYOUTS[pick as usize % LAYOUTS.len()];
    if let Ok(Some(r)) = decode_g(layout, 0xc000_0000, g, u64::MAX / 2) {
        assert!(r.goid != 0);
        assert!(r.stack.0 < r.stack.1);
        if matches!(r.status, GStatus::Waiting | GStatus::Runnable | GStatus::Preempted) {
            assert!(r.sp >= r.stack.0 && r.sp <= r.stack.1 && r.pc != 0);
        }
        assert_eq!(r.wait_reason.is_some(), r.status == GStatus::Waiting);
    }
});
