//! Block device I/O, counted in the kernel per device.

use core::mem::size_of;

/// Block device I/O, aggregated in the kernel per device (the chain's last
/// hop when a disk is slow).
pub mod block_maps {
    /// `PerCpuHashMap<u32 dev_t, DevIo>`: requests issued and completed, and
    /// bytes written, per block device (kernel `dev_t`: major << 20 | minor).
    pub const DEV_IO: &str = "DEV_IO";
}

/// Most block devices [`block_maps::DEV_IO`] counts.
pub const DEV_IO_MAX: u32 = 256;

/// Field offsets in `block:block_rq_issue` and `block:block_rq_complete`
/// records (Linux 6.18, read from tracefs `format`; userspace checks them
/// against the running kernel's format before attaching).
pub mod block_tp {
    /// `dev_t dev` (4 bytes), in both records.
    pub const DEV_OFF: usize = 8;
    /// `unsigned int bytes` (4 bytes), in block_rq_issue.
    pub const ISSUE_BYTES_OFF: usize = 28;
    /// The global holding where `char rwbs[]` (`W` write, `R` read, `F` flush, ...) is in
    /// block_rq_issue's record, read by the loader from the tracepoint's format: it moved
    /// when `ioprio` came before it (34, size 10, on 6.18; 32, size 8, on 5.10 and 6.1).
    pub const RWBS_OFF: &str = "BLOCK_RWBS_OFF";
}

/// One block device's I/O counters on one CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevIo {
    /// Requests issued to the driver.
    pub issued: u64,
    /// Requests completed.
    pub completed: u64,
    /// Bytes of write requests issued.
    pub write_bytes: u64,
}
const _: () = assert!(size_of::<DevIo>() == 24);
