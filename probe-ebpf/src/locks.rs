//! Who holds the kernel mutex a thread waits on (`rtnl_mutex` behind a netlink
//! request, for one).
//!
//! At `lock:contention_begin` for a mutex, the owner is read from the mutex
//! itself (`struct mutex.owner`: the owning task pointer with flag bits in the
//! low 3 bits) and its pid from the task; the waiter's kernel stack names the
//! lock (`rtnl_lock`, ...). The entry lives until `lock:contention_end`, so
//! userspace sees the waits in progress.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{map, tracepoint},
    maps::HashMap,
    programs::TracePointContext,
};
use plegwatch_abi::{LCB_F_MUTEX, LockWait};

use crate::offcpu::{STACKS, TASK_PID_OFF};
use aya_ebpf::programs::tracing::StackIdContext as _;

#[map]
static LOCK_WAITS: HashMap<u32, LockWait> = HashMap::with_max_entries(4_096, 0);

/// Byte offset of `owner` in `struct mutex` (from BTF at load time); the lock
/// probes are off when unknown.
#[unsafe(no_mangle)]
static MUTEX_OWNER_OFF: u32 = u32::MAX;

/// `lock:contention_begin` (format on Linux 6.18: `void *lock_addr` at 8,
/// `unsigned int flags` at 16).
#[tracepoint]
pub fn lock_begin(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from the format above.
    let flags: u32 = unsafe { ctx.read_at(16) }.unwrap_or(0);
    if flags & LCB_F_MUTEX == 0 {
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
    let owner_tid = if task == 0 {
        0
    } else {
        unsafe { bpf_probe_read_kernel((task + pid_off as u64) as *const u32) }.unwrap_or(0)
    };
    let wait = LockWait {
        lock,
        // SAFETY: a plain helper call.
        start_ns: unsafe { bpf_ktime_get_ns() },
        owner_tid,
        stack_id: ctx.get_stackid(&STACKS, 0).map(|id| id as i32).unwrap_or(-1),
    };
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = LOCK_WAITS.insert(&tid, &wait, 0);
    0
}

/// `lock:contention_end` (format on Linux 6.18: `void *lock_addr` at 8, `int
/// ret` at 16).
#[tracepoint]
pub fn lock_end(_ctx: TracePointContext) -> u32 {
    let tid = bpf_get_current_pid_tgid() as u32;
    let _ = LOCK_WAITS.remove(&tid);
    0
}
