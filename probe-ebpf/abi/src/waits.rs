//! Watched syscall waits: the open ones in `INFLIGHT`, the ended ones on `EVENTS`.

use core::mem::size_of;

use crate::{EventHeader, COMM_LEN};

/// Map names, as the userspace loader looks them up.
pub mod maps {
    /// `HashMap<u32 tid, Wait>`: every watched wait still open, keyed by thread.
    /// Userspace only inserts (the startup sweep, with `BPF_NOEXIST`) and never
    /// deletes: a delete by tid could hit the thread's next wait. A wait it
    /// judges over by `/proc` is hidden until the kernel replaces or removes it.
    pub const INFLIGHT: &str = "INFLIGHT";
    /// `RingBuf` of [`super::WaitEnd`] records for waits longer than `REPORT_MIN_NS`.
    pub const EVENTS: &str = "EVENTS";
    /// `PerCpuArray<u64>` indexed by [`super::Stat`](crate::Stat).
    pub const STATS: &str = "STATS";
    /// `PerCpuArray<u64>` log2 latency histogram, `slot * HIST_BUCKETS + bucket`.
    pub const HIST: &str = "HIST";
    /// `Array<u64>` with two entries, the gate of the tail-end probe (open while
    /// either is non-zero). Each slot has one writer, so neither can leak:
    /// - slot 0, written by the kernel only: the number of [`INFLIGHT`] entries
    ///   in their task_work tail without [`super::WAIT_SWEPT_TAIL`]. +1 when
    ///   `sys_exit` of umount2 starts a tail (once per entry), -1 only when a
    ///   delete of such an entry succeeds. Userspace never writes it, and never
    ///   deletes entries, so the count is the entries;
    /// - slot 1, written by userspace only, read by the kernel: the number of
    ///   tails the startup sweep put in the map ([`super::WAIT_SWEPT_TAIL`])
    ///   that are still there and not judged over. Set before they are
    ///   inserted, then from each scan's snapshot.
    pub const TAIL_PENDING: &str = "TAIL_PENDING";
}

/// Read-only globals the loader overrides (`EbpfLoader::override_global`).
pub mod globals {
    /// `u32`: the tracer's own TGID; its waits are never recorded.
    pub const TRACER_TGID: &str = "TRACER_TGID";
    /// `u64`: waits at least this long get a [`super::WaitEnd`] record on the ring buffer.
    pub const REPORT_MIN_NS: &str = "REPORT_MIN_NS";
    /// `[u32; WATCHED_SLOTS]`: syscall numbers of the watched syscalls, by slot.
    /// Slot [`super::SLOT_UMOUNT2`] must hold umount2. Unused slots hold `u32::MAX`.
    pub const WATCHED_NR: &str = "WATCHED_NR";
    /// `[u32; SOCK_SLOTS]`: syscall numbers of write, writev, sendto, sendmsg,
    /// read, readv, recvfrom, recvmsg, in that order (see [`super::SockSlot`](crate::SockSlot)).
    pub const SOCK_NR: &str = "SOCK_NR";
    /// `u32`: the offset of `task_struct.task_works` (`struct callback_head *`), from
    /// BTF; `u32::MAX` when unknown. At a umount2's sys_exit, an empty list means no
    /// task_work tail is to come: the wait ends there.
    pub const TASK_WORKS_OFF: &str = "TASK_WORKS_OFF";
}

/// Maximum number of waits open at once in [`maps::INFLIGHT`] (the default; the
/// loader may resize it).
pub const INFLIGHT_MAX: u32 = 16_384;
/// Ring buffer size in bytes (a power of two, a multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;
/// Bytes kept of a path argument (umount2's target), NUL included.
pub const PATH_LEN: usize = 128;

/// Number of watched-syscall slots.
pub const WATCHED_SLOTS: usize = 8;
/// The slot of umount2, whose wait continues after `sys_exit` in task_work.
pub const SLOT_UMOUNT2: u32 = 0;

/// Where a wait stands.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Inside the syscall, between `sys_enter` and `sys_exit`.
    Syscall = 0,
    /// After `sys_exit` but before the thread got back to user space (task_work:
    /// `cleanup_mnt → deactivate_locked_super → sync_filesystem` for umount2).
    TaskWork = 1,
}

/// One open wait, the value of [`maps::INFLIGHT`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Wait {
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC) at `sys_enter`.
    pub start_ns: u64,
    /// `bpf_ktime_get_ns()` at `sys_exit`, or 0 while still in the syscall.
    pub sys_exit_ns: u64,
    /// The syscall's first argument (an fd, or umount2's target pointer).
    pub arg0: u64,
    /// The syscall's second argument (umount2's flags).
    pub arg1: u64,
    /// The syscall's return value once it has exited.
    pub ret: i64,
    /// Thread group (process) id.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// The syscall number, as `__syscall_nr` in the tracepoint.
    pub nr: u32,
    /// Index into [`globals::WATCHED_NR`].
    pub slot: u32,
    /// `WAIT_*` flags.
    pub flags: u32,
    /// The thread's user stack, taken at the wait's first sleep (the syscall's
    /// user registers), an id in the off-CPU probe's `STACKS` map (walked by
    /// frame pointers), or -1 (none: not slept yet, swept, or the walk failed).
    pub user_stack: i32,
    /// The goroutine (`g`) running on the thread, read from thread-local
    /// storage at the wait's first sleep in processes of
    /// [`go_maps::GO_PROCS`](crate::go_maps::GO_PROCS); 0 elsewhere, and until then.
    pub g: u64,
    /// The task's comm, taken at the wait's first sleep (empty until then).
    pub comm: [u8; COMM_LEN],
    /// umount2's target path (NUL-terminated), empty for other syscalls.
    pub path: [u8; PATH_LEN],
}
const _: () = assert!(size_of::<Wait>() == 216);

/// [`Wait::flags`]: the wait was found by plegwatch's startup sweep of `/proc`,
/// so it began before the probes were attached and `start_ns` is a lower bound
/// of its age.
pub const WAIT_BEFORE_ATTACH: u32 = 1;
/// [`Wait::flags`]: the startup sweep found the wait already in its task_work
/// tail, and put it in the map so. Counted by userspace in `TAIL_PENDING[1]`,
/// never by the kernel (a swept wait whose tail starts later, at the kernel's
/// `sys_exit`, lacks it and is counted in slot 0 like any other).
pub const WAIT_SWEPT_TAIL: u32 = 2;
/// [`Wait::flags`]: the wait's user stack, comm and goroutine are still to be
/// taken, at the thread's first switch-out inside it (`sched_switch`), so a
/// wait that never sleeps costs none of that work (its end record takes the
/// comm then). Counted by the kernel in `DETAILS_PENDING`.
pub const WAIT_DETAILS_PENDING: u32 = 4;

/// How a wait ended.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// `sys_exit` of the syscall itself.
    SysExit = 0,
    /// The thread entered its next syscall after a task_work tail.
    NextSyscall = 1,
    /// The thread exited.
    ThreadExit = 2,
    /// A new wait on the same thread replaced one whose end was missed.
    Replaced = 3,
}

/// A wait that ended, sent when it lasted at least `REPORT_MIN_NS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct WaitEnd {
    pub header: EventHeader,
    pub start_ns: u64,
    pub sys_exit_ns: u64,
    pub end_ns: u64,
    pub ret: i64,
    pub tgid: u32,
    pub tid: u32,
    pub nr: u32,
    pub slot: u32,
    /// An [`EndReason`] as u32.
    pub reason: u32,
    /// The wait's `WAIT_*` flags.
    pub flags: u32,
    /// The task's comm at `sys_enter`.
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<WaitEnd>() == 80);
