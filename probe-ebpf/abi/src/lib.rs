//! The event ABI shared by plegwatch's eBPF programs and its userspace collector.
//!
//! Everything that crosses the kernel/user boundary lives here: map names, the
//! layout of map values and ring-buffer records, stat slots and limits. Every
//! type is `#[repr(C)]`, `Copy`, built from fixed-width integers with explicit
//! padding, and its size is asserted at compile time so that both sides agree.
//! Numbers given to kinds never change; new kinds take new numbers.
#![no_std]

use core::mem::size_of;

mod dbus_walk;
pub use dbus_walk::*;

/// Map names, as the userspace loader looks them up.
pub mod maps {
    /// `HashMap<u32 tid, Wait>`: every watched wait still open, keyed by thread.
    /// Userspace only inserts (the startup sweep, with `BPF_NOEXIST`) and never
    /// deletes: a delete by tid could hit the thread's next wait. A wait it
    /// judges over by `/proc` is hidden until the kernel replaces or removes it.
    pub const INFLIGHT: &str = "INFLIGHT";
    /// `RingBuf` of [`super::WaitEnd`] records for waits longer than `REPORT_MIN_NS`.
    pub const EVENTS: &str = "EVENTS";
    /// `PerCpuArray<u64>` indexed by [`super::Stat`].
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

/// Socket maps (netlink and D-Bus request/reply tracking).
pub mod sock_maps {
    /// `HashMap<u64 (tgid << 32 | fd), SockClass>`: the sockets worth looking at.
    /// An entry holds only while its [`super::SockClass::gen`] is the process's
    /// [`SOCK_GEN`]; a stale one is ignored, then replaced or removed.
    pub const SOCKS: &str = "SOCKS";
    /// `HashMap<u32 tgid, u32>`: how many times the process forgot all its
    /// sockets at once (an exec, which may have closed any of them by
    /// CLOEXEC; a `close_range` too wide to walk). Created at 0 when the
    /// process's first socket is tracked (absent: nothing tracked, generation
    /// 0); the kernel bumps it, and the kernel or the seeding userspace stamps
    /// it into each new [`SOCKS`] entry. The kernel cannot walk `SOCKS` to
    /// delete a process's keys; with this it needs no walk.
    pub const SOCK_GEN: &str = "SOCK_GEN";
    /// `LruHashMap<u64 (tgid << 32 | fd), DbusPos>`: where the kernel is in
    /// each D-Bus connection's two streams, so that it copies out message
    /// headers and never a body (see [`super::dbus_walk`]). Kernel only.
    pub const DBUS_POS: &str = "DBUS_POS";
    /// `HashMap<u32 tid, SockCall>`: send/recv calls in flight on those sockets.
    /// Written by the kernel only; its gate `SOCK_CALLS_OPEN[0]` is the number
    /// of entries (+1 only when an insert made one, -1 only when a delete
    /// removed one).
    pub const SOCK_CALLS: &str = "SOCK_CALLS";
    /// `RingBuf` of [`super::SockIo`], [`super::SockClosed`] and
    /// [`super::SocksForgotten`] records, in the order each process made them.
    pub const SOCK_EVENTS: &str = "SOCK_EVENTS";
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
    /// read, readv, recvfrom, recvmsg, in that order (see [`super::SockSlot`]).
    pub const SOCK_NR: &str = "SOCK_NR";
}

/// Maximum number of waits open at once in [`maps::INFLIGHT`] (the default; the
/// loader may resize it).
pub const INFLIGHT_MAX: u32 = 16_384;
/// Ring buffer size in bytes (a power of two, a multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;
/// Bytes kept of a path argument (umount2's target), NUL included.
pub const PATH_LEN: usize = 128;
/// Bytes of a task's comm, NUL included.
pub const COMM_LEN: usize = 16;
/// Number of watched-syscall slots.
pub const WATCHED_SLOTS: usize = 8;
/// The slot of umount2, whose wait continues after `sys_exit` in task_work.
pub const SLOT_UMOUNT2: u32 = 0;
/// Buckets per slot in [`maps::HIST`]: bucket `b` counts waits in `[2^b, 2^(b+1))` µs;
/// bucket 0 also counts waits under 1 µs, and the last bucket everything above.
pub const HIST_BUCKETS: u32 = 32;
/// Total entries in [`maps::HIST`].
pub const HIST_ENTRIES: u32 = WATCHED_SLOTS as u32 * HIST_BUCKETS;

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

/// Which string a probed function's entry captures: the Go `string` header
/// (pointer, length) at `off` bytes into the struct that integer argument
/// register `reg` points to (Go register ABI order: 0 RAX, 1 RBX, 2 RCX,
/// 3 RDI, 4 RSI, 5 R8, 6 R9, 7 R10, 8 R11), e.g. a CRI request's ContainerId.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoArgSpec {
    /// A register index, or [`GO_ARG_NONE`].
    pub reg: u32,
    pub off: u32,
}
const _: () = assert!(size_of::<GoArgSpec>() == 8);

/// A process called `execve`: userspace looks at its binary at once, so a
/// restarted or upgraded target is probed again without waiting for a poll.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
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

/// Number of socket syscall slots in [`globals::SOCK_NR`].
pub const SOCK_SLOTS: usize = 8;
/// The socket syscalls, by slot. Slots 0-3 send, 4-7 receive; `slot % 4` is the
/// buffer's shape: 0 and 2 a plain buffer in arg1, 1 an iovec array in arg1, 3
/// a `struct user_msghdr` in arg1.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockSlot {
    Write = 0,
    Writev = 1,
    Sendto = 2,
    Sendmsg = 3,
    Read = 4,
    Readv = 5,
    Recvfrom = 6,
    Recvmsg = 7,
}
/// The first slot that receives.
pub const SOCK_FIRST_RECV: u32 = 4;

/// What a tracked socket is.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SockKind {
    /// AF_NETLINK; [`SockClass::proto`] is the netlink protocol.
    Netlink = 1,
    /// A connected AF_UNIX socket not yet judged: its first send decides (a
    /// D-Bus client starts with a NUL byte, then the SASL `AUTH`).
    UnixCandidate = 2,
    /// A D-Bus connection (client side).
    Dbus = 3,
    /// A ttrpc connection to a containerd shim (client side): connected to a
    /// socket named `…/s/<64 hex digits>` ([`TTRPC_SHIM_SUFFIX_LEN`]). Only
    /// the 10-byte frame headers are read, never a payload.
    Ttrpc = 4,
}

/// Bytes of a ttrpc frame header: length u32 BE, stream id u32 BE, type u8, flags u8.
pub const TTRPC_HEADER_LEN: usize = 10;
/// Bytes that end a shim socket's path: `/s/` then the sha256 in hex.
pub const TTRPC_SHIM_SUFFIX_LEN: usize = 67;
/// Frame headers one [`TtrpcIo`] record carries at most; a receive that
/// brought more sends several records.
pub const TTRPC_FRAMES: usize = 8;
/// The largest frame length believed (ttrpc's default limit is 4 MiB); a
/// bigger one, or an unknown type or flag, means the stream was joined out of
/// step: the socket is forgotten.
pub const TTRPC_MAX_LEN: u32 = 16 << 20;

/// ttrpc maps.
pub mod ttrpc_maps {
    /// `HashMap<u64 (tgid << 32 | fd), TtrpcPos>`: where each ttrpc socket's
    /// byte stream stands, each way, so that only headers are read.
    pub const TTRPC_POS: &str = "TTRPC_POS";
    /// `LruHashMap<TtrpcReqKey, u64 g>`: ttrpc 1.1 only, the goroutine that
    /// called `(*Client).dispatch` with this request, until the client's
    /// sender goroutine sends it.
    pub const TTRPC_CALLERS: &str = "TTRPC_CALLERS";
}

/// One direction of a ttrpc byte stream.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TtrpcDir {
    /// Bytes of the current frame's payload still to come.
    pub skip: u32,
    /// Bytes of a header cut by the end of the last syscall, kept in `part`.
    pub have: u32,
    pub part: [u8; 16],
}
const _: () = assert!(size_of::<TtrpcDir>() == 24);

/// The value of [`ttrpc_maps::TTRPC_POS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct TtrpcPos {
    pub tx: TtrpcDir,
    pub rx: TtrpcDir,
    /// The socket's [`SockClass::gen`]: a stale position is started afresh.
    pub gen: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<TtrpcPos>() == 56);

/// Key of [`ttrpc_maps::TTRPC_CALLERS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TtrpcReqKey {
    /// The `*ttrpc.Request`.
    pub req: u64,
    pub tgid: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<TtrpcReqKey>() == 16);

/// One ttrpc frame header, as read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TtrpcFrame {
    pub len: u32,
    pub stream: u32,
    /// 1 request, 2 response, 3 data.
    pub kind: u8,
    pub flags: u8,
    pub _pad: u16,
}
const _: () = assert!(size_of::<TtrpcFrame>() == 12);

/// ttrpc's known flags: remote closed, remote open, no data (v1.2).
pub const TTRPC_KNOWN_FLAGS: u8 = 0x7;
/// Most frames walked in one syscall's bytes; past it the socket is
/// forgotten (a 4 KiB bufio read of the smallest responses holds fewer).
pub const TTRPC_WALK_MAX: usize = 48;

/// Parses a ttrpc frame header, or refuses one that makes no sense: an
/// unknown type or flag, or a length over [`TTRPC_MAX_LEN`].
#[inline(always)]
pub fn ttrpc_parse(h: &[u8; TTRPC_HEADER_LEN]) -> Option<TtrpcFrame> {
    let f = TtrpcFrame {
        len: u32::from_be_bytes([h[0], h[1], h[2], h[3]]),
        stream: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        kind: h[8],
        flags: h[9],
        _pad: 0,
    };
    if f.kind == 0 || f.kind > 3 || f.flags & !TTRPC_KNOWN_FLAGS != 0 || f.len > TTRPC_MAX_LEN {
        return None;
    }
    Some(f)
}

/// How [`ttrpc_walk`] reads a syscall's bytes: `bpf_probe_read_user` in the
/// kernel, a slice in tests.
pub trait TtrpcBytes {
    /// The 10 bytes at `off`.
    fn header(&mut self, off: u64) -> Option<[u8; TTRPC_HEADER_LEN]>;
    /// `n` bytes (1..=9) at `off` into `dst[at..at + n]` (`at + n <= 16`).
    fn part(&mut self, dst: &mut [u8; 16], at: u32, off: u64, n: u32) -> Option<()>;
}

/// Walks the ttrpc frames in one syscall's `len` bytes from where `d` left
/// off, handing each header to `emit` and reading nothing but headers: the
/// rest of the current frame's payload is skipped, a header cut by the end
/// of the bytes is kept in `d.part` and completed by the next call. `None`
/// when a header makes no sense or the bytes hold more than
/// [`TTRPC_WALK_MAX`] frames: the stream's place is lost.
#[inline(always)]
pub fn ttrpc_walk<B: TtrpcBytes, E: FnMut(TtrpcFrame)>(d: &mut TtrpcDir, len: u64, bytes: &mut B, emit: &mut E) -> Option<()> {
    const HDR: u64 = TTRPC_HEADER_LEN as u64;
    let mut off: u64 = 0;
    if len == 0 {
        return Some(());
    }
    if d.have > 0 {
        // The rest of a header the last call cut (or as much of it as came).
        if d.have as u64 >= HDR {
            return None;
        }
        let need = HDR - d.have as u64;
        let take = if len < need { len } else { need };
        bytes.part(&mut d.part, d.have, 0, take as u32)?;
        d.have += take as u32;
        if (d.have as u64) < HDR {
            return Some(());
        }
        let p = &d.part;
        let f = ttrpc_parse(&[p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9]])?;
        emit(f);
        d.have = 0;
        d.skip = f.len;
        off = take;
    }
    let mut i = 0;
    while i < TTRPC_WALK_MAX {
        let left = len - off;
        if d.skip as u64 >= left {
            d.skip -= left as u32;
            return Some(());
        }
        off += d.skip as u64;
        d.skip = 0;
        let left = len - off;
        if left == 0 {
            return Some(());
        }
        if left < HDR {
            bytes.part(&mut d.part, 0, off, left as u32)?;
            d.have = left as u32;
            return Some(());
        }
        let f = ttrpc_parse(&bytes.header(off)?)?;
        emit(f);
        off += HDR;
        d.skip = f.len;
        i += 1;
    }
    // The last frame walked may end at or past the end of the bytes.
    let left = len - off;
    if d.skip as u64 >= left {
        d.skip -= left as u32;
        return Some(());
    }
    None
}

/// The frame headers one send or receive on a ttrpc socket moved.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TtrpcIo {
    pub header: EventHeader,
    pub start_ns: u64,
    pub end_ns: u64,
    /// The goroutine that made the syscall (read from TLS; 0 if unknown).
    pub g: u64,
    pub tgid: u32,
    pub tid: u32,
    pub fd: u32,
    /// A [`SockSlot`] as u32.
    pub slot: u32,
    /// Valid entries of `frames`.
    pub n: u32,
    pub _pad: u32,
    pub frames: [TtrpcFrame; TTRPC_FRAMES],
}
const _: () = assert!(size_of::<TtrpcIo>() == 56 + TTRPC_FRAMES * 12);

/// ttrpc 1.1's client writes requests from one sender goroutine per
/// connection, not from the caller's: at `(*Client).send` the sender names
/// the stream id and the request, which `(*Client).dispatch` had tied to its
/// caller. Sent before the frame is written, on `SOCK_EVENTS`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct TtrpcBind {
    pub header: EventHeader,
    /// The client's sender goroutine, which writes the frame next.
    pub sender_g: u64,
    /// The goroutine that called `dispatch` and waits for the reply.
    pub caller_g: u64,
    pub tgid: u32,
    pub stream: u32,
}
const _: () = assert!(size_of::<TtrpcBind>() == 32);

/// The value of [`sock_maps::SOCKS`].
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SockClass {
    /// A [`SockKind`] as u32.
    pub kind: u32,
    /// The netlink protocol, for [`SockKind::Netlink`].
    pub proto: u32,
    /// The process's [`sock_maps::SOCK_GEN`] when the entry was made.
    pub gen: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<SockClass>() == 16);

/// The value of [`sock_maps::SOCK_CALLS`]: a send or recv in flight.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SockCall {
    pub start_ns: u64,
    /// User buffer (the first iovec's base for vectored calls).
    pub buf: u64,
    /// Its length.
    pub buf_len: u64,
    pub tgid: u32,
    pub fd: u32,
    /// A [`SockSlot`] as u32.
    pub slot: u32,
    /// For a netlink send: the first message's seq, type and flags (read at
    /// `sys_enter`, so a send blocked in the kernel, behind `rtnl_mutex` say,
    /// is known before it returns).
    pub nl_seq: u32,
    pub nl_type: u16,
    pub nl_flags: u16,
    /// For a netlink `sendto`/`sendmsg`: the destination port id (0: the kernel).
    pub nl_dst: u32,
    pub class: SockClass,
}
const _: () = assert!(size_of::<SockCall>() == 64);

/// Bytes of a socket buffer copied into a [`SockIo`] record, at their
/// offsets: for D-Bus only header and handshake bytes (body bytes read as
/// 0), for netlink none (the headers are in [`SockIo::nl`]).
pub const SOCK_DATA_CAP: usize = 2048;
/// netlink message headers summarised per [`SockIo`] record, walking the whole
/// buffer (a dump's NLMSG_DONE may lie past [`SOCK_DATA_CAP`]).
pub const NL_SUMMARIES: usize = 32;

/// One netlink message header, as walked by the kernel program.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct NlSummary {
    pub len: u32,
    pub msg_type: u16,
    pub flags: u16,
    pub seq: u32,
    /// The errno of an NLMSG_ERROR (0 for an ack), else 0.
    pub error: i32,
    /// `nlmsg_pid`: the port id a reply is addressed to (0 for the kernel).
    pub pid: u32,
}
const _: () = assert!(size_of::<NlSummary>() == 20);

/// A send or receive on a tracked socket. Sent with only the first
/// `captured` bytes of `data`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SockIo {
    pub header: EventHeader,
    pub start_ns: u64,
    pub end_ns: u64,
    /// Bytes the syscall transferred.
    pub ret: i64,
    pub tgid: u32,
    pub tid: u32,
    pub fd: u32,
    /// A [`SockSlot`] as u32.
    pub slot: u32,
    pub class: SockClass,
    /// Valid entries of `nl` (netlink sockets only).
    pub n_nl: u32,
    /// Valid bytes of `data`.
    pub captured: u32,
    /// For a netlink send: the destination port id (0: the kernel).
    pub nl_dst: u32,
    pub _pad: u32,
    pub comm: [u8; COMM_LEN],
    pub nl: [NlSummary; NL_SUMMARIES],
    pub data: [u8; SOCK_DATA_CAP],
}
/// Bytes of a [`SockIo`] before `data`.
pub const SOCK_IO_HEADER_LEN: usize = 96 + NL_SUMMARIES * 20;
const _: () = assert!(size_of::<SockIo>() == SOCK_IO_HEADER_LEN + SOCK_DATA_CAP);

/// A tracked socket was closed (or its fd replaced: `dup2`/`dup3` onto it,
/// `close_range` over it).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SockClosed {
    pub header: EventHeader,
    pub tgid: u32,
    pub fd: u32,
}
const _: () = assert!(size_of::<SockClosed>() == 16);

/// A process with tracked sockets forgot them all (an exec, a wide
/// `close_range`): none of its fds is tracked until classified again.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SocksForgotten {
    pub header: EventHeader,
    pub tgid: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<SocksForgotten>() == 16);

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
    /// [`go_maps::GO_PROCS`]; 0 elsewhere, and until then.
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

/// The kind of a ring-buffer record, first in every record.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// A [`WaitEnd`].
    WaitEnd = 1,
    /// A [`SockIo`].
    SockIo = 2,
    /// A [`SockClosed`].
    SockClosed = 3,
    /// A [`GoCallEnd`].
    GoCallEnd = 4,
    /// An [`ExecEvent`].
    Exec = 5,
    /// A [`SocksForgotten`].
    SocksForgotten = 6,
    /// A [`GoExit`].
    GoExit = 7,
    /// A [`TtrpcIo`].
    TtrpcIo = 8,
    /// A [`TtrpcBind`].
    TtrpcBind = 9,
}

/// Header first in every ring-buffer record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct EventHeader {
    /// An [`EventKind`] as u32.
    pub kind: u32,
    pub _pad: u32,
}
const _: () = assert!(size_of::<EventHeader>() == 8);

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

/// Slots of [`maps::STATS`]. Counters only grow.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// Waits recorded at `sys_enter`.
    WaitsStarted = 0,
    /// Waits that could not be recorded: [`maps::INFLIGHT`] was full.
    InflightFull = 1,
    /// End records lost: the ring buffer was full.
    RingbufFull = 2,
    /// umount2 target paths that could not be read.
    PathReadFailed = 3,
    /// Waits that entered the task_work tail.
    TailsStarted = 4,
    /// Waits ended by a thread exit.
    EndedByExit = 5,
    /// Socket records lost: `SOCK_EVENTS` was full.
    SockEventsFull = 6,
    /// Sockets that could not be tracked: `SOCKS` (or `SOCK_GEN`) was full.
    SocksFull = 7,
    /// Socket calls that could not be tracked: `SOCK_CALLS` was full.
    SockCallsFull = 8,
    /// User buffers that could not be read.
    SockReadFailed = 9,
    /// ttrpc sockets forgotten because a header made no sense (the stream was
    /// joined out of step, or more frames came at once than a record holds).
    TtrpcDesync = 10,
    /// D sleeps not recorded: `OFFCPU_START` was full.
    OffcpuStartFull = 11,
    /// Ended D sleeps not added up: `OFFCPU` was full.
    OffcpuFull = 12,
    /// D sleeps recorded without their kernel stack (`bpf_get_stackid` failed:
    /// `STACKS` full, or a hash collision with another stack).
    OffcpuStackFailed = 13,
    /// Kernel mutex waits not recorded: `LOCK_WAITS` was full.
    LockWaitsFull = 14,
    /// Kernel mutex waits recorded without the waiter's stack (so without the
    /// lock's name).
    LockStackFailed = 15,
    /// Watched waits recorded without their user stack.
    UserStackFailed = 16,
    /// Cookie-less Go probe hits whose point is not in `GO_ADDRS` (a binary
    /// being attached or retired, or a code size the loader computed
    /// differently from userspace).
    GoAddrUnknown = 17,
    /// Go calls not recorded: `GO_CALLS` was full.
    GoCallsFull = 18,
    /// Go call ends, goroutine exits or execs lost: the `GO_EVENTS` ring was full.
    GoEventsFull = 19,
    /// Child waits (wait4/waitid) not recorded: `CHILD_WAITS` was full.
    ChildWaitsFull = 20,
    /// netlink `socket()` calls not followed: `SOCKET_CALLS` was full.
    SocketCallsFull = 21,
    /// dup2/dup3 calls on a tracked fd not followed: `DUP_CALLS` was full (the
    /// target fd is forgotten at once, rather than left with its old class).
    DupCallsFull = 22,
    /// Block devices not counted: `DEV_IO` was full.
    DevIoFull = 23,
    /// Processes not marked for D-sleep recording: `INTERESTING` was full.
    InterestingFull = 24,
    /// ttrpc sockets not followed: `TTRPC_POS` was full.
    TtrpcPosFull = 25,
    /// ttrpc requests whose caller goroutine was not noted: `TTRPC_CALLERS` was full.
    TtrpcCallersFull = 26,
    /// D-Bus sockets not followed: `DBUS_POS` was full.
    DbusPosFull = 27,
}
/// Number of [`Stat`] slots (one more than the last [`Stat`]).
pub const STAT_COUNT: u32 = Stat::DbusPosFull as u32 + 1;

/// The histogram bucket of a duration: floor(log2(µs)), clamped to the table.
/// Written without loops or `leading_zeros` so the eBPF verifier takes it as is.
#[inline(always)]
pub fn hist_bucket(duration_ns: u64) -> u32 {
    let mut v = duration_ns >> 10; // ~µs, cheap
    let mut b: u32 = 0;
    if v >= 1 << 32 {
        v >>= 32;
        b += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        b += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        b += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        b += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        b += 2;
    }
    if v >= 1 << 1 {
        b += 1;
    }
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// Lower bound, in nanoseconds, of a histogram bucket (the inverse of [`hist_bucket`]).
pub const fn bucket_floor_ns(bucket: u32) -> u64 {
    if bucket == 0 {
        0
    } else {
        (1u64 << bucket) << 10
    }
}

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

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all are #[repr(C)], Copy, made of integers, with explicit padding.
    unsafe impl aya::Pod for super::Wait {}
    unsafe impl aya::Pod for super::DevIo {}
    unsafe impl aya::Pod for super::WaitEnd {}
    unsafe impl aya::Pod for super::EventHeader {}
    unsafe impl aya::Pod for super::SockClass {}
    unsafe impl aya::Pod for super::SockCall {}
    unsafe impl aya::Pod for super::OffCpuStart {}
    unsafe impl aya::Pod for super::OffCpuKey {}
    unsafe impl aya::Pod for super::OffCpuVal {}
    unsafe impl aya::Pod for super::LockWait {}
    unsafe impl aya::Pod for super::GoCallKey {}
    unsafe impl aya::Pod for super::GoCall {}
    unsafe impl aya::Pod for super::GoProc {}
    unsafe impl aya::Pod for super::GoAddrKey {}
    unsafe impl aya::Pod for super::GoArgSpec {}
    unsafe impl aya::Pod for super::TtrpcPos {}
    unsafe impl aya::Pod for super::TtrpcReqKey {}
    unsafe impl aya::Pod for super::ChildWait {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_of_microseconds() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1023), 0);
        assert_eq!(hist_bucket(2 * 1024), 1);
        assert_eq!(hist_bucket(3 * 1024), 1);
        assert_eq!(hist_bucket(4 * 1024), 2);
        assert_eq!(hist_bucket(1 << 30), 20);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
        for b in 1..HIST_BUCKETS - 1 {
            assert_eq!(hist_bucket(bucket_floor_ns(b)), b);
            assert_eq!(hist_bucket(bucket_floor_ns(b + 1) - 1), b);
        }
    }
}
