//! D-state sleeps by kernel stack, and the contended kernel mutexes among them.

use core::mem::size_of;

/// Off-CPU maps (D-state sleeps by kernel stack).
pub mod offcpu_maps {
    /// `HashMap<u32 tgid, u8>`: the processes whose D sleeps are recorded.
    pub const INTERESTING: &str = "INTERESTING";
    /// `HashMap<u32 tid, OffCpuStart>`: D sleeps in progress.
    pub const OFFCPU_START: &str = "OFFCPU_START";
    /// `HashMap<OffCpuKey, OffCpuVal>`: ended D sleeps, aggregated.
    pub const OFFCPU: &str = "OFFCPU";
    /// `StackTrace`: kernel stacks by id.
    pub const STACKS: &str = "STACKS";
    /// `u32` global: offset of `pid` in `struct task_struct` (from BTF).
    pub const TASK_PID_OFF: &str = "TASK_PID_OFF";
}

/// Kernel lock contention (`lock:contention_begin/end`, Linux >= 5.19).
pub mod lock_maps {
    /// `HashMap<u32 tid, LockWait>`: threads waiting on a contended kernel mutex now.
    pub const LOCK_WAITS: &str = "LOCK_WAITS";
    /// `Array<u64>`, one slot written by the kernel only: how many
    /// [`LOCK_WAITS`] entries there are (+1 only when an insert made one, -1
    /// only when a delete removed one), so that `contention_end`, which fires
    /// for every contended lock on the node, costs one array read while none is.
    pub const LOCK_WAITS_OPEN: &str = "LOCK_WAITS_OPEN";
    /// `u32` global: offset of `owner` in `struct mutex` (from BTF).
    pub const MUTEX_OWNER_OFF: &str = "MUTEX_OWNER_OFF";
}

/// `LCB_F_MUTEX` in `lock:contention_begin`'s flags (include/trace/events/lock.h).
pub const LCB_F_MUTEX: u32 = 1 << 5;

/// A thread waiting on a contended kernel mutex.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct LockWait {
    pub lock: u64,
    pub start_ns: u64,
    /// The mutex owner's thread id when the wait began (0 if unknown).
    pub owner_tid: u32,
    /// The waiter's kernel stack id in `STACKS` (names the lock: `rtnl_lock`, ...).
    pub stack_id: i32,
}
const _: () = assert!(size_of::<LockWait>() == 24);

/// `TASK_UNINTERRUPTIBLE` in a task's state (include/linux/sched.h, stable).
pub const TASK_UNINTERRUPTIBLE: u64 = 2;

/// A D sleep in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct OffCpuStart {
    pub start_ns: u64,
    /// Id in the `STACKS` map, or negative when the stack could not be taken.
    pub stack_id: i32,
    pub tgid: u32,
}
const _: () = assert!(size_of::<OffCpuStart>() == 16);

/// Key of the aggregated D sleeps.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct OffCpuKey {
    pub tgid: u32,
    pub tid: u32,
    pub stack_id: i32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<OffCpuKey>() == 16);

/// Aggregated D sleeps of one (tgid, tid, stack).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuVal {
    pub total_ns: u64,
    pub count: u64,
    pub max_ns: u64,
}
const _: () = assert!(size_of::<OffCpuVal>() == 24);
