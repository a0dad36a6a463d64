//! Gates: counters in an `Array<u64>` slot that say whether a hot program has
//! anything to do, so that it can return after one array read when not.
//!
//! A kernel-owned gate counts the entries of one hash map and cannot leak: it
//! goes up only when an insert made a new entry ([`insert_counted`]), and down
//! only when a delete removed one. Userspace never writes a kernel-owned slot
//! (see the invariants in the ABI crate).

use aya_ebpf::maps::{Array, HashMap};

/// `bpf_map_update_elem` flags (include/uapi/linux/bpf.h).
pub(crate) const BPF_NOEXIST: u64 = 1;
pub(crate) const BPF_EXIST: u64 = 2;
pub(crate) const EEXIST: i32 = 17;

/// Adds `delta` to `map[slot]` atomically (BPF_ATOMIC add, Linux >= 5.12).
#[inline(always)]
pub(crate) fn add(map: &Array<u64>, slot: u32, delta: i64) {
    if let Some(p) = map.get_ptr_mut(slot) {
        // SAFETY: `p` points at a live map value; the add is atomic.
        unsafe { core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(p, delta as u64) };
    }
}

/// Whether `map[slot]` is non-zero.
#[inline(always)]
pub(crate) fn open(map: &Array<u64>, slot: u32) -> bool {
    map.get(slot).is_some_and(|v| *v != 0)
}

/// Puts `key → value` in `hash` and counts it in `gate[slot]` only if the key
/// was absent; an entry already there (a call whose end went unseen) is
/// replaced without counting it twice. Errs with the map's errno (`-E2BIG`
/// when it is full).
#[inline(always)]
pub(crate) fn insert_counted<K, V>(hash: &HashMap<K, V>, key: &K, value: &V, gate: &Array<u64>, slot: u32) -> Result<(), i32> {
    match hash.insert(key, value, BPF_NOEXIST) {
        Ok(()) => {
            add(gate, slot, 1);
            Ok(())
        }
        Err(e) if e == -EEXIST => hash.insert(key, value, BPF_EXIST),
        Err(e) => Err(e),
    }
}
