//! Block device I/O per device: requests in flight and bytes written, the
//! last hop of a chain whose root waits on writeback (umount's sync, fsync).
//!
//! Aggregated in the kernel (a per-CPU hash by device, no records): userspace
//! sums the CPUs each scan and turns bytes written into a rate.

use aya_ebpf::{
    macros::{map, tracepoint},
    maps::PerCpuHashMap,
    programs::TracePointContext,
};
use plegwatch_abi::{block_tp, DevIo, DEV_IO_MAX};

use crate::ctxread::field;

#[map]
static DEV_IO: PerCpuHashMap<u32, DevIo> = PerCpuHashMap::with_max_entries(DEV_IO_MAX, 0);

/// Where `rwbs` is in block_rq_issue's record: set by the loader from the
/// tracepoint's format (see the ABI's `block_tp::RWBS_OFF`).
#[unsafe(no_mangle)]
static BLOCK_RWBS_OFF: u32 = u32::MAX;

/// Whether a request's `rwbs` is a write (`W`, or `FW` for a flush+write).
/// Read through a helper: a tracepoint record may only be read directly at
/// offsets the verifier knows, and this one is known at load time only.
#[inline(always)]
fn is_write(ctx: &TracePointContext) -> bool {
    // SAFETY: a read-only global patched by the loader.
    let off = unsafe { core::ptr::read_volatile(&BLOCK_RWBS_OFF) };
    if off == u32::MAX {
        return false;
    }
    // SAFETY: the helper checks the read; the loader found rwbs (at least 2 bytes) at `off`.
    let Ok([a, b]) = (unsafe { ctx.read_at::<[u8; 2]>(off as usize) }) else { return false };
    a == b'W' || (a == b'F' && b == b'W')
}

#[inline(always)]
fn add(dev: u32, issued: u64, completed: u64, write_bytes: u64) {
    if let Some(p) = DEV_IO.get_ptr_mut(&dev) {
        // SAFETY: this CPU's own value; no concurrent writer on this CPU.
        unsafe {
            (*p).issued += issued;
            (*p).completed += completed;
            (*p).write_bytes += write_bytes;
        }
    } else {
        if DEV_IO.insert(&dev, &DevIo { issued, completed, write_bytes }, 0).is_err() {
            crate::waits::count(plegwatch_abi::Stat::DevIoFull);
        }
    }
}

/// `block:block_rq_issue`: a request handed to the driver.
///
/// Format (Linux 6.18): `dev_t dev` @8, `sector_t sector` @16, `unsigned int
/// nr_sector` @24, `unsigned int bytes` @28, `unsigned short ioprio` @32,
/// `char rwbs[10]` @34, `char comm[16]` @44, `__data_loc char[] cmd` @60.
/// Linux 5.10 and 6.1: the same up to `bytes`, then `char rwbs[8]` @32.
#[tracepoint]
pub fn block_issue(ctx: TracePointContext) -> u32 {
    // SAFETY: dev @8 and bytes @28 lie inside the record (format above).
    let (dev, bytes): (u32, u32) = unsafe { (field(&ctx, block_tp::DEV_OFF), field(&ctx, block_tp::ISSUE_BYTES_OFF)) };
    let written = if is_write(&ctx) { u64::from(bytes) } else { 0 };
    add(dev, 1, 0, written);
    0
}

/// `block:block_rq_complete`: a request finished.
///
/// Format (Linux 6.18): `dev_t dev` @8, `sector_t sector` @16, `unsigned int
/// nr_sector` @24, `int error` @28, `unsigned short ioprio` @32, `char
/// rwbs[10]` @34, `__data_loc char[] cmd` @44. Linux 5.10 and 6.1: `dev` @8 too.
#[tracepoint]
pub fn block_complete(ctx: TracePointContext) -> u32 {
    // SAFETY: dev @8 lies inside the record (format above).
    let dev: u32 = unsafe { field(&ctx, block_tp::DEV_OFF) };
    add(dev, 0, 1, 0);
    0
}
