//! Gates: counters in an `Array<u64>` slot that say whether a hot program has
//! anything to do, so that it can return after one array read when not.

use aya_ebpf::maps::Array;

/// Adds `delta` to `map[slot]` atomically (BPF_ATOMIC add, Linux >= 5.12).
#[inline(always)]
pub(crate) fn add(map: &Array<u64>, slot: u32, delta: i64) {
    if let Some(p) = map.get_ptr_mut(slot) {
        // SAFETY: `p` points at a live map value; the add is atomic.
        unsafe {
            core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, delta as u64)
        };
    }
}

/// Whether `map[slot]` is non-zero.
#[inline(always)]
pub(crate) fn open(map: &Array<u64>, slot: u32) -> bool {
    map.get(slot).is_some_and(|v| *v != 0)
}
