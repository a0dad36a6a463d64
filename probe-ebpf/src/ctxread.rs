//! Reading tracepoint records directly.
//!
//! A tracepoint program's context is the trace record itself, which the
//! verifier lets a program read at constant offsets; `TracePointContext::read_at`
//! goes through `bpf_probe_read_kernel` instead, a helper call per field that
//! costs tens of nanoseconds on paths as hot as every `write`.

use aya_ebpf::{programs::TracePointContext, EbpfContext as _};

/// The `T` at byte `off` of the tracepoint record.
///
/// # Safety
/// `off + size_of::<T>()` must lie inside the record (its format in tracefs)
/// of *every* tracepoint the program attaches to: the kernel refuses the
/// attach of a program that reads past the end of a record.
#[inline(always)]
pub(crate) unsafe fn field<T: Copy>(ctx: &TracePointContext, off: usize) -> T {
    // SAFETY: per the contract above; the record is readable kernel memory.
    unsafe { core::ptr::read_unaligned(ctx.as_ptr().cast::<u8>().add(off).cast::<T>()) }
}
