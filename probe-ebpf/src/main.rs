//! plegwatch's kernel programs.
//!
//! The programs are thin: they record when a watched wait starts and ends, in
//! the `INFLIGHT` map, count into per-CPU maps, and send a `WaitEnd` record for
//! long waits. Everything else (thresholds, details, stacks, output) is
//! userspace. Failures are counted in the `STATS` map, never logged on the hot path.
//!
//! Built only for `bpfel-unknown-none` (by probe-user's build.rs); on the host
//! this crate is an empty binary so that workspace-wide cargo commands work.
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(core_intrinsics))]
#![cfg_attr(target_arch = "bpf", allow(internal_features))]

#[cfg(target_arch = "bpf")]
mod block;
#[cfg(target_arch = "bpf")]
mod children;
#[cfg(target_arch = "bpf")]
mod ctxread;
#[cfg(target_arch = "bpf")]
mod doctor;
#[cfg(target_arch = "bpf")]
mod gate;
#[cfg(target_arch = "bpf")]
mod gofuncs;
#[cfg(target_arch = "bpf")]
mod locks;
#[cfg(target_arch = "bpf")]
mod offcpu;
#[cfg(target_arch = "bpf")]
mod sockets;
#[cfg(target_arch = "bpf")]
mod syscall_functions;
#[cfg(target_arch = "bpf")]
mod ttrpc;
#[cfg(target_arch = "bpf")]
mod waits;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    // SAFETY: the verifier rejects any program that could reach this.
    unsafe { core::hint::unreachable_unchecked() }
}

#[cfg(target_arch = "bpf")]
#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(target_arch = "bpf"))]
fn main() {}
