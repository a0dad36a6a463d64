//! Go function timing (uprobes at the entry and at every RET), execs and goroutine exits.

use core::mem::size_of;

use crate::{EventHeader, COMM_LEN};

/// Go function timing (uprobes at the entry and at every RET).
pub mod go_maps {
    /// `HashMap<GoCallKey, GoCall>`: Go calls in progress, by process, goroutine and function.
    pub const GO_CALLS: &str = "GO_CALLS";
    /// `RingBuf` of [`super::GoCallEnd`] and [`super::ExecEvent`] records.
    pub const GO_EVENTS: &str = "GO_EVENTS";
    /// `HashMap<u32 tgid, GoProc>`: processes running a probed Go binary, whose
    /// kernel waits carry the goroutine read from thread-local storage.
    pub const GO_PROCS: &str = "GO_PROCS";
    /// `Array<GoArgSpec>` indexed by function id (the attach cookie): which
    /// string argument [`super::GoCall::arg`] captures at entry.
    pub const GO_ARGS: &str = "GO_ARGS";
    /// `u32` global: offset of `thread.fsbase` in `struct task_struct` (from
    /// BTF), or `u32::MAX` when unknown (then no goroutine is read from TLS).
    pub const TASK_FSBASE_OFF: &str = "TASK_FSBASE_OFF";
    /// `HashMap<GoAddrKey, u32 function id>`: the probe points of every
    /// probed binary by where they sit in its code, for kernels without
    /// uprobe attach cookies (before Linux 5.15): see [`super::GoAddrKey`].
    pub const GO_ADDRS: &str = "GO_ADDRS";
    /// `u32` global: offset of `mm` in `struct task_struct` (from BTF), or
    /// `u32::MAX` when unknown (then the cookie-less Go probes see nothing).
    pub const TASK_MM_OFF: &str = "TASK_MM_OFF";
    /// `u32` global: offset of `start_code` in `struct mm_struct` (from BTF).
    pub const MM_START_CODE_OFF: &str = "MM_START_CODE_OFF";
    /// `u32` global: offset of `end_code` in `struct mm_struct` (from BTF).
    pub const MM_END_CODE_OFF: &str = "MM_END_CODE_OFF";
}

/// Most entries of [`go_maps::GO_ADDRS`]: about 80 points per probed
/// containerd, 20 per shim, 10 per runc, with room for upgrades in flight.
pub const GO_ADDRS_MAX: u32 = 8192;

/// A Go probe point named without an attach cookie (Linux 5.10 to 5.14 have
/// none), by what the kernel knows of the process that hit it: the size of
/// its executable's code (`mm->end_code - mm->start_code`, which the ELF
/// loader sets from the executable `PT_LOAD` segments) and the point's
/// distance from `mm->start_code`. Both are the same in every process
/// running a binary, PIE or not, and are computed by userspace from the
/// ELF's program headers; two different binaries with equal code sizes and a
/// probe at the same distance would have to be two copies of one build.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GoAddrKey {
    pub code_len: u32,
    pub rel: u32,
}
const _: () = assert!(size_of::<GoAddrKey>() == 8);

/// Size of [`go_maps::GO_EVENTS`]: short calls are sent without waking
/// userspace, which drains them every scan (250 ms), so it holds a scan's
/// worth of calls: about 8,700 [`GoCallEnd`] records.
pub const GO_EVENTS_BYTES: u32 = 1024 * 1024;

/// Most function ids (attach cookies) [`go_maps::GO_ARGS`] holds.
pub const GO_FUNCS_MAX: u32 = 256;
/// Bytes kept of a Go string argument (a container id is 64 hex digits).
pub const GO_ARG_LEN: usize = 64;
const _: () = assert!(GO_ARG_LEN.is_power_of_two());
/// [`GoArgSpec::reg`] for "capture nothing".
pub const GO_ARG_NONE: u32 = u32::MAX;

/// A process running a probed Go binary.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoProc {
    /// Where `g` sits relative to the thread pointer (`fsbase`): −8 for
    /// internally linked binaries, read from the code for the others.
    pub g_tls_off: i64,
}
const _: () = assert!(size_of::<GoProc>() == 8);

/// What a probed function's entry captures, by integer argument register (Go
/// register ABI order: 0 RAX, 1 RBX, 2 RCX, 3 RDI, 4 RSI, 5 R8, 6 R9, 7 R10, 8 R11):
/// - a string: the Go `string` header (pointer, length) at `off` bytes into the
///   struct that register `reg` points to, e.g. a CRI request's ContainerId;
/// - the call's receiver, [`super::GoCall::receiver`]: register `recv_reg` plus
///   `recv_off` (RAX plus 0, the method's receiver, for a zeroed entry; CRI-O's
///   `(*runtimeOCI).UpdateContainer(ctx, c)` gives RDI plus the offset of the
///   container's `opLock`, the lock it takes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoArgSpec {
    /// A register index, or [`GO_ARG_NONE`].
    pub reg: u32,
    pub off: u32,
    /// A register index (an unknown one gives RAX).
    pub recv_reg: u32,
    pub recv_off: u32,
}
const _: () = assert!(size_of::<GoArgSpec>() == 16);

/// A process called `execve`: userspace looks at its binary at once, so a
/// restarted or upgraded target is probed again without waiting for a poll.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct ExecEvent {
    pub header: EventHeader,
    pub tgid: u32,
    pub _pad: u32,
    /// The new comm.
    pub comm: [u8; COMM_LEN],
}
const _: () = assert!(size_of::<ExecEvent>() == 32);

/// A Go call in progress is named by its process, its goroutine (`g`, in R14
/// under the register ABI at entry and at return) and the probed function's
/// id (the uprobe's attach cookie). The process is part of the key: function
/// ids are per binary inode, shared by every process running it, and Go heap
/// addresses (`g`) repeat from process to process, so two shims' concurrent
/// calls would otherwise overwrite or close each other's entries.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GoCallKey {
    pub g: u64,
    pub func: u32,
    pub tgid: u32,
}
const _: () = assert!(size_of::<GoCallKey>() == 16);

/// A Go call in progress.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct GoCall {
    pub start_ns: u64,
    /// The receiver or first argument (RAX).
    pub receiver: u64,
    pub tgid: u32,
    /// The thread the goroutine ran on at entry.
    pub tid: u32,
    /// Bytes used in `arg`.
    pub arg_len: u32,
    pub _pad: u32,
    /// The string argument [`GoArgSpec`] names (not NUL-terminated).
    pub arg: [u8; GO_ARG_LEN],
}
const _: () = assert!(size_of::<GoCall>() == 96);

/// A goroutine of a probed process ended (`runtime.goexit0`): any call
/// still open on it that began before `exit_ns` never returns through a
/// probed RET (a panic unwound past it, or `runtime.Goexit`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct GoExit {
    pub header: EventHeader,
    /// The goroutine (`g`).
    pub g: u64,
    pub exit_ns: u64,
    pub tgid: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<GoExit>() == 32);

/// A Go call that returned.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
#[cfg_attr(feature = "user", derive(zerocopy::FromBytes, zerocopy::IntoBytes, zerocopy::KnownLayout, zerocopy::Immutable))]
pub struct GoCallEnd {
    pub header: EventHeader,
    pub g: u64,
    pub start_ns: u64,
    pub end_ns: u64,
    pub receiver: u64,
    pub func: u32,
    pub tgid: u32,
    pub tid: u32,
    /// Bytes used in `arg`.
    pub arg_len: u32,
    /// The call's captured string argument.
    pub arg: [u8; GO_ARG_LEN],
}
const _: () = assert!(size_of::<GoCallEnd>() == 120);
