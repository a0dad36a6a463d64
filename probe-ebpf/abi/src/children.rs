//! Threads blocked in `wait4`/`waitid` for a child.

use core::mem::size_of;

/// Child-wait maps: threads blocked in `wait4`/`waitid` for a child.
pub mod child_maps {
    /// `HashMap<u32 tid, ChildWait>`: threads blocked in a `wait4` or `waitid`
    /// without `WNOHANG`. Written by the kernel only: an entry goes in at
    /// `sys_enter`, out at `sys_exit` or when the thread exits. Its gate
    /// `CHILD_GATE[0]` is the number of entries (+1 only when an insert made
    /// one, -1 only when a delete removed one), so the exit program costs one
    /// array read while no thread waits.
    pub const CHILD_WAITS: &str = "CHILD_WAITS";
    /// `Array<u64>` with one entry: the gate of [`CHILD_WAITS`].
    pub const CHILD_GATE: &str = "CHILD_GATE";
}

/// Most threads blocked in `wait4`/`waitid` tracked at once.
pub const CHILD_WAITS_MAX: u32 = 4096;
/// `wait4`'s and `waitid`'s `WNOHANG` (include/uapi/linux/wait.h): a poll, not a wait.
pub const WNOHANG: u32 = 1;
/// `waitid`'s `idtype` (include/uapi/linux/wait.h); `wait4`'s pid argument is
/// recorded as is, with [`ChildWait::which`] = [`CHILD_WAIT_WAIT4`].
pub const P_ALL: u32 = 0;
pub const P_PID: u32 = 1;
pub const P_PGID: u32 = 2;
pub const P_PIDFD: u32 = 3;
/// [`ChildWait::which`] for `wait4` (its pid argument carries the selector).
pub const CHILD_WAIT_WAIT4: u32 = u32::MAX;

/// A thread blocked in `wait4(pid, …, options)` or `waitid(which, id, …, options)`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChildWait {
    /// `bpf_ktime_get_ns` at `sys_enter`.
    pub start_ns: u64,
    /// The goroutine, for probed Go targets (read from TLS); else 0.
    pub g: u64,
    pub tgid: u32,
    pub tid: u32,
    /// `wait4`'s `pid` or `waitid`'s `id`.
    pub id: i32,
    /// `waitid`'s `idtype` ([`P_ALL`], [`P_PID`], [`P_PGID`], [`P_PIDFD`]) or
    /// [`CHILD_WAIT_WAIT4`].
    pub which: u32,
    pub options: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<ChildWait>() == 40);
