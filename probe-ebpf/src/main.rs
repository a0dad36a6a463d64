//! plegwatch's kernel programs.
//!
//! The programs are thin: they record when a watched wait starts and ends, in
//! [`INFLIGHT`], count into per-CPU maps, and send a [`WaitEnd`] record for long
//! waits. Everything else (thresholds, details, stacks, output) is userspace.
//! Each entry point calls a fallible `try_*` body; failures are counted in
//! [`STATS`], never logged on the hot path.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]

mod doctor;
mod waits;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach this.
    unsafe { core::hint::unreachable_unchecked() }
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
