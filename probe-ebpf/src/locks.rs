//! Who holds the kernel mutex a thread waits on (`rtnl_mutex` behind a netlink
//! request, for one).
//!
//! At `lock:contention_begin` for a mutex, the owner is read from the mutex
//! itself (`struct mutex.owner`: the owning task pointer with flag bits in the
//! low 3 bits) and its pid from the task; the waiter's kernel stack names the
//! lock (`rtnl_lock`, ...). The entry lives until `lock:contention_end`, so
//! userspace sees the waits in progress.
//!
//! Both tracepoints fire for every contended lock on the node (spinlocks and
//! rwsems too), so each returns early and cheaply:
//! - `contention_begin` records only a mutex, and only for a thread that can be
//!   a waiter userspace links to the owner (`mutex_edges`, `lock_holder`): one
//!   of a process in `INTERESTING` (the runtime's processes by comm, umount2
//!   callers, the processes being reported), or one that is in a watched wait
//!   (`INFLIGHT`) or a tracked socket call (`SOCK_CALLS`: a netlink request,
//!   a D-Bus or ttrpc call) right now. The last two catch a waiter whose
//!   process userspace has not marked yet (it marks at its next scan, after a
//!   request that blocks on `rtnl_mutex` at once has already begun to wait).
//!   That is up to three hash lookups (the socket one behind its gate) where
//!   every contended mutex used to cost a stack walk, a stack-map update and
//!   an insert; the owner is read only past the gate too.
//! - `contention_end` reads the [`LOCK_WAITS_OPEN`] gate and deletes only while
//!   an entry exists.
//!
//! Drops are counted in `STATS`: `LockWaitsFull` (the map was full),
//! `LockStackFailed` (recorded without the waiter's stack, so without the
//! lock's name).
//!
//! Map memory: [`LOCK_WAITS`] is preallocated, 4,096 × ~96 B (element header,
//! key, 24 B value) ≈ 385 KiB as the kernel charges it (bpftool's
//! `bytes_memlock`, Linux 6.18 x86-64); [`LOCK_WAITS_OPEN`] one `u64`. An entry lives only while a thread that matters
//! is blocked on a mutex: a few at a time normally, the threads of the
//! runtime's processes at worst (a stuck `rtnl_mutex` blocks every netlink
//! user behind it); 4,096 covers that on a node of a few hundred pods.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, tracepoint},
    maps::{Array, HashMap},
    programs::TracePointContext,
};
use plegwatch_abi::{LockWait, Stat, LCB_F_MUTEX};

use crate::offcpu::{INTERESTING, STACKS, TASK_PID_OFF};
use crate::waits::count;
use aya_ebpf::programs::tracing::StackIdContext as _;

#[map]
static LOCK_WAITS: HashMap<u32, LockWait> = HashMap::with_max_entries(4_096, 0);
/// Slot 0: how many [`LOCK_WAITS`] entries there are (kernel-owned, see `gate`).
#[map]
static LOCK_WAITS_OPEN: Array<u64> = Array::with_max_entries(1, 0);

/// Byte offset of `owner` in `struct mutex` (from BTF at load time); the lock
/// probes are off when unknown.
#[unsafe(no_mangle)]
static MUTEX_OWNER_OFF: u32 = u32::MAX;

/// Whether thread `tid` of process `tgid` is one whose mutex waits userspace
/// can use (see the module doc).
#[inline(always)]
fn matters(tgid: u32, tid: u32) -> bool {
    // SAFETY: read-only peeks.
    unsafe {
        INTERESTING.get(&tgid).is_some()
            || crate::waits::INFLIGHT.get(&tid).is_some()
            || (crate::gate::open(&crate::sockets::SOCK_CALLS_OPEN, 0) && crate::sockets::SOCK_CALLS.get(&tid).is_some())
    }
}

/// `lock:contention_begin` (format on Linux 6.18: `void *lock_addr` at 8,
/// `unsigned int flags` at 16).
#[tracepoint]
pub fn lock_begin(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from the format above.
    let flags: u32 = unsafe { ctx.read_at(16) }.unwrap_or(0);
    if flags & LCB_F_MUTEX == 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if !matters((pid_tgid >> 32) as u32, tid) {
        return 0;
    }
    let lock: u64 = unsafe { ctx.read_at(8) }.unwrap_or(0);
    // SAFETY: read-only globals patched by the loader.
    let owner_off = unsafe { core::ptr::read_volatile(&MUTEX_OWNER_OFF) };
    let pid_off = unsafe { core::ptr::read_volatile(&TASK_PID_OFF) };
    if lock == 0 || owner_off == u32::MAX || pid_off == 0 {
        return 0;
    }
    // SAFETY: the helper checks kernel pointers.
    let owner_word: u64 = unsafe { bpf_probe_read_kernel((lock + owner_off as u64) as *const u64) }.unwrap_or(0);
    let task = owner_word & !0x7;
    let owner_tid = if task == 0 { 0 } else { unsafe { bpf_probe_read_kernel((task + pid_off as u64) as *const u32) }.unwrap_or(0) };
    let stack_id = match ctx.get_stackid(&STACKS, 0) {
        Ok(id) => id as i32,
        Err(_) => {
            count(Stat::LockStackFailed);
            -1
        }
    };
    let wait = LockWait {
        lock,
        // SAFETY: a plain helper call.
        start_ns: unsafe { bpf_ktime_get_ns() },
        owner_tid,
        stack_id,
    };
    if crate::gate::insert_counted(&LOCK_WAITS, &tid, &wait, &LOCK_WAITS_OPEN, 0).is_err() {
        count(Stat::LockWaitsFull);
    }
    0
}

/// `lock:contention_end` (format on Linux 6.18: `void *lock_addr` at 8, `int
/// ret` at 16).
#[tracepoint]
pub fn lock_end(_ctx: TracePointContext) -> u32 {
    if !crate::gate::open(&LOCK_WAITS_OPEN, 0) {
        return 0;
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if LOCK_WAITS.remove(&tid).is_ok() {
        crate::gate::add(&LOCK_WAITS_OPEN, 0, -1);
    }
    0
}
