//! Netlink, D-Bus and ttrpc sockets: which fds to look at, and what goes through them.
//!
//! Classification happens here, in the kernel, so that the hot `read`/`write`
//! path costs one hash lookup that misses for every socket and file that does
//! not matter:
//! - `socket(AF_NETLINK, ...)` marks the returned fd [`SockKind::Netlink`];
//! - `connect()` of an AF_UNIX socket marks it a [`SockKind::UnixCandidate`],
//!   and its first send decides: a D-Bus client starts with a NUL byte (then
//!   the SASL `AUTH`), anything else is forgotten; one that connects to a
//!   containerd shim socket (`…/s/<64 hex>`) is [`SockKind::Ttrpc`], whose
//!   frame headers [`crate::ttrpc`] reads;
//! - `close()` forgets the fd, and so does anything else that puts another
//!   file at that fd: `dup2`/`dup3` onto it (the fd then takes the class of
//!   the fd duplicated, if tracked), `close_range` over it, and an exec (which
//!   may close any fd by CLOEXEC; every socket of the process is forgotten,
//!   through its [`SOCK_GEN`]).
//!
//! Userspace seeds the map with sockets that existed before it started. For a
//! tracked socket, each send or receive sends one [`SockIo`] record with the
//! first bytes of the buffer and, for netlink, a summary of every message
//! header in it. Parsing and request/reply matching happen in userspace.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel_buf, bpf_probe_read_user,
        generated::bpf_loop,
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use plegwatch_abi::{
    DbusBytes, DbusCursor, DbusDir, DbusPos, EventHeader, EventKind, NlSummary, SockCall, SockClass, SockClosed, SockIo, SockKind,
    SocksForgotten, Stat, COMM_LEN, DBUS_AUTH_SCAN, DBUS_GOING, DBUS_WALK_MAX, NL_SUMMARIES, SOCK_DATA_CAP, SOCK_FIRST_RECV,
    SOCK_IO_HEADER_LEN, SOCK_SLOTS,
};

use crate::waits::{count, tracer_tgid};

#[map]
static SOCKS: HashMap<u64, SockClass> = HashMap::with_max_entries(16_384, 0);
/// tgid → socket generation: an entry of [`SOCKS`] holds only while its
/// `gen` is its process's (see the ABI's `sock_maps::SOCK_GEN`).
#[map]
static SOCK_GEN: HashMap<u32, u32> = HashMap::with_max_entries(16_384, 0);
/// `dup2`/`dup3` calls in flight that touch a tracked fd: tid → `oldfd << 32 | newfd`.
#[map]
static DUP_CALLS: HashMap<u32, u64> = HashMap::with_max_entries(1_024, 0);
#[map]
pub(crate) static SOCK_CALLS: HashMap<u32, SockCall> = HashMap::with_max_entries(8_192, 0);
/// Userspace drains it at every scan and when the kernel wakes it, which it
/// does only once the ring is a quarter full ([`wakeup`]).
#[map]
static SOCK_EVENTS: RingBuf = RingBuf::with_byte_size(SOCK_EVENTS_BYTES, 0);
const SOCK_EVENTS_BYTES: u32 = 1 << 20;
/// Per-CPU scratch for building a [`SockIo`] (too big for the stack).
#[map]
static SOCK_SCRATCH: PerCpuArray<SockScratch> = PerCpuArray::with_max_entries(1, 0);
/// Where the kernel is in each D-Bus connection (see [`plegwatch_abi::dbus_walk`]).
#[map]
static DBUS_POS: LruHashMap<u64, DbusPos> = LruHashMap::with_max_entries(4_096, 0);
/// Per-CPU state of the D-Bus handshake's text scan (see [`dbus_text_cb`]).
#[map]
static DBUS_TEXT: PerCpuArray<TextScan> = PerCpuArray::with_max_entries(1, 0);

/// A handshake text scan: the buffer, how many bytes to look at, and where
/// the text ends ([`DBUS_GOING`] while scanning).
#[repr(C)]
pub struct TextScan {
    buf: u64,
    len: u64,
    end: u64,
}

/// One entry of zeros, never written: blanks a record's data before the
/// header bytes are copied in.
#[map]
static ZEROS: Array<[u8; SOCK_DATA_CAP]> = Array::with_max_entries(1, 0);

/// A [`SockIo`] with room past its `data`, so that the verifier sees every
/// copy at a bounded offset of a bounded length stay inside the value.
/// Only `SOCK_IO_HEADER_LEN + captured` bytes are ever sent. Also the state
/// of a D-Bus walk, which the `bpf_loop` callback [`dbus_step_cb`] steps.
#[repr(C)]
pub struct SockScratch {
    io: SockIo,
    _slack: [u8; SOCK_DATA_CAP],
    walk: DbusWork,
}

/// One D-Bus buffer's walk, in [`SockScratch`]: a map value, whose contents
/// the verifier does not track, so that each `bpf_loop` callback is verified
/// once rather than once per loop turn.
#[repr(C)]
struct DbusWork {
    /// A copy of the direction's [`DbusPos`] half, stored back at the end.
    dir: DbusDir,
    cur: DbusCursor,
    /// The syscall's (first) buffer in the traced process.
    buf: u64,
    /// A header read failed (counted as [`Stat::SockReadFailed`]).
    failed: u64,
}
/// `socket()` calls in flight: tid → netlink protocol.
#[map]
static SOCKET_CALLS: HashMap<u32, u32> = HashMap::with_max_entries(1_024, 0);
/// Slot 0: how many [`SOCK_CALLS`] entries are open, so that `sys_exit` costs
/// one array read while none is. Kernel-owned: up only when an insert made an
/// entry ([`crate::gate::insert_counted`]), down only when `sock_exit`'s delete
/// removed one; userspace never writes `SOCK_CALLS`.
#[map]
pub(crate) static SOCK_CALLS_OPEN: Array<u64> = Array::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static SOCK_NR: [u32; SOCK_SLOTS] = [u32::MAX; SOCK_SLOTS];

const AF_UNIX: u16 = 1;
/// `close_range` flag: mark the fds close-on-exec, close nothing now.
const CLOSE_RANGE_CLOEXEC: u64 = 1 << 2;
/// Widest `close_range` forgotten fd by fd; a wider one forgets the process's
/// every socket (see [`close_range_enter`]).
const CLOSE_RANGE_WALK: u32 = 64;
/// `bpf_map_update_elem` flag (include/uapi/linux/bpf.h).
const BPF_NOEXIST: u64 = 1;
pub(crate) const AF_NETLINK: u64 = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: u64 = 16;

// Offsets in syscall tracepoint records: `int __syscall_nr` at 8, arguments
// from 16 (8 bytes each), `long ret` at 16 on exit (Linux 6.18, checked).
const OFF_NR: usize = 8;
const OFF_ARG0: usize = 16;
const OFF_ARG1: usize = 24;
const OFF_ARG2: usize = 32;
const OFF_ARG4: usize = 48;
const OFF_RET: usize = 16;

/// `struct user_msghdr`: `msg_iov` at 16, stable uapi.
const MSGHDR_IOV: u64 = 16;

#[inline(always)]
fn key(tgid: u32, fd: u32) -> u64 {
    ((tgid as u64) << 32) | fd as u64
}

/// The process's socket generation (0 while it has none).
#[inline(always)]
fn gen_of(tgid: u32) -> u32 {
    // SAFETY: copied out at once.
    unsafe { SOCK_GEN.get(&tgid) }.copied().unwrap_or(0)
}

/// The class of `(tgid, fd)`, if it is tracked and was not forgotten since.
#[inline(always)]
fn class_of(tgid: u32, fd: u32) -> Option<SockClass> {
    // SAFETY: copied out at once.
    let class = (unsafe { SOCKS.get(&key(tgid, fd)) }).copied()?;
    if class.gen != gen_of(tgid) {
        return None;
    }
    Some(class)
}

/// Tracks `(tgid, fd)` as `kind`, stamped with the process's generation
/// (created at 0 for its first socket, so that an exec can bump it).
#[inline(always)]
fn track(tgid: u32, fd: u32, kind: SockKind, proto: u32) {
    // On the stack: a `&0` would be promoted to a constant in .rodata, which
    // the loader does not place where the program reads it.
    let zero: u32 = 0;
    // SAFETY: copied out at once.
    let gen = match unsafe { SOCK_GEN.get(&tgid) }.copied() {
        Some(g) => g,
        // NOEXIST: a concurrent first insert by another thread is as good.
        None if SOCK_GEN.insert(&tgid, &zero, BPF_NOEXIST).is_ok() => 0,
        None => match unsafe { SOCK_GEN.get(&tgid) }.copied() {
            Some(g) => g,
            None => {
                // SOCK_GEN is full: untracked, rather than tracked past the next exec.
                count(Stat::SocksFull);
                return;
            }
        },
    };
    let class = SockClass { kind: kind as u32, proto, gen, _pad: 0 };
    if SOCKS.insert(&key(tgid, fd), &class, 0).is_err() {
        count(Stat::SocksFull);
    }
}

/// Forgets `(tgid, fd)`: its file was closed or replaced. Tells userspace,
/// which holds protocol state for netlink and D-Bus sockets (none for a
/// candidate).
#[inline(always)]
pub(crate) fn forget(tgid: u32, fd: u32) {
    let k = key(tgid, fd);
    // SAFETY: read-only peek.
    let Some(class) = (unsafe { SOCKS.get(&k) }).copied() else { return };
    if class.kind == SockKind::Ttrpc as u32 {
        crate::ttrpc::forget_pos(k);
    }
    if class.kind == SockKind::Dbus as u32 {
        let _ = DBUS_POS.remove(&k);
    }
    if SOCKS.remove(&k).is_ok() && class.kind != SockKind::UnixCandidate as u32 {
        let rec = SockClosed { header: EventHeader { kind: EventKind::SockClosed as u32, _pad: 0 }, tgid, fd };
        if SOCK_EVENTS.output::<SockClosed>(&rec, wakeup()).is_err() {
            count(Stat::SockEventsFull);
        }
    }
}

/// `bpf_ringbuf_output` flags for a `SOCK_EVENTS` record: no wakeup (a
/// wakeup per record, at 100 k records/s, cost userspace most of its CPU in
/// epoll and the event loop), unless the ring is a quarter full, when
/// userspace is woken to drain it, with three quarters left for the time it
/// takes to be scheduled. Nothing waits on a
/// socket record sooner than the next scan (250 ms), which drains the ring
/// first.
#[inline(always)]
fn wakeup() -> u64 {
    /// `bpf_ringbuf_query` and `bpf_ringbuf_output` flags (include/uapi/linux/bpf.h).
    const BPF_RB_AVAIL_DATA: u64 = 0;
    const BPF_RB_NO_WAKEUP: u64 = 1;
    const BPF_RB_FORCE_WAKEUP: u64 = 2;
    if SOCK_EVENTS.query(BPF_RB_AVAIL_DATA) > u64::from(SOCK_EVENTS_BYTES / 4) {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

/// Sends a record on `SOCK_EVENTS`, in order with the process's other socket records.
#[inline(always)]
pub(crate) fn output<T>(rec: &T) {
    if SOCK_EVENTS.output::<T>(rec, wakeup()).is_err() {
        count(Stat::SockEventsFull);
    }
}

/// Forgets every socket of `tgid` at once, by bumping its generation, and
/// tells userspace. Nothing to do for a process with no tracked socket.
#[inline(always)]
fn forget_all(tgid: u32) {
    let Some(gen) = SOCK_GEN.get_ptr_mut(&tgid) else { return };
    // SAFETY: `gen` points at a live map value; the add is atomic.
    unsafe { core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(gen, 1) };
    let rec = SocksForgotten { header: EventHeader { kind: EventKind::SocksForgotten as u32, _pad: 0 }, tgid, _pad: 0 };
    if SOCK_EVENTS.output::<SocksForgotten>(&rec, wakeup()).is_err() {
        count(Stat::SockEventsFull);
    }
}

#[inline(always)]
fn sock_slot(nr: u32) -> Option<u32> {
    let mut i = 0;
    while i < SOCK_SLOTS {
        // SAFETY: a read-only global patched by the loader; `i` is in bounds.
        if unsafe { core::ptr::read_volatile(&SOCK_NR[i]) } == nr {
            return Some(i as u32);
        }
        i += 1;
    }
    None
}

/// `v`, or `max` if greater, in a form every verifier takes as bounded: a
/// constant compared with the register that goes on, after a copy LLVM cannot
/// see through. Otherwise LLVM drops a check it can prove from what it knows
/// of `v` (a `min` of two values), which the 5.10 and 6.1 verifiers do not
/// know: they learn no bound from comparing two registers.
#[inline(always)]
pub(crate) fn at_most(v: u64, max: u64) -> u64 {
    let v = core::hint::black_box(v);
    if v > max {
        max
    } else {
        v
    }
}

#[inline(always)]
fn now() -> u64 {
    // SAFETY: a plain helper call.
    unsafe { bpf_ktime_get_ns() }
}

/// `syscalls:sys_enter_socket`: `(int family, int type, int protocol)` (Linux 6.18).
#[tracepoint]
pub fn socket_enter(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from the format above.
    let family: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG0) };
    if family != AF_NETLINK {
        return 0;
    }
    let proto: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG2) };
    let tid = bpf_get_current_pid_tgid() as u32;
    if SOCKET_CALLS.insert(&tid, &(proto as u32), 0).is_err() {
        count(Stat::SocketCallsFull);
    }
    0
}

/// `syscalls:sys_exit_socket`: `long ret` is the new fd (Linux 6.18).
#[tracepoint]
pub fn socket_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: copied out before removal.
    let Some(proto) = (unsafe { SOCKET_CALLS.get(&tid) }).copied() else { return 0 };
    let _ = SOCKET_CALLS.remove(&tid);
    // SAFETY: offset from the format above.
    let ret: i64 = unsafe { crate::ctxread::field(&ctx, OFF_RET) };
    on_netlink_socket(pid_tgid, proto, ret);
    0
}

/// `syscalls:sys_enter_connect`: `(int fd, struct sockaddr *uservaddr, int addrlen)`
/// (Linux 6.18). An AF_UNIX connect makes the fd a D-Bus candidate, or a
/// ttrpc connection when it names a shim socket (see [`crate::ttrpc`]).
#[tracepoint]
pub fn connect_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == tracer_tgid() {
        return 0;
    }
    // SAFETY: offsets from the format above.
    let fd: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG0) };
    let addr: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG1) };
    let addrlen: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG2) };
    on_connect(tgid, fd, addr, addrlen);
    0
}

/// A `connect(fd, addr, addrlen)` by `tgid` (not plegwatch): an AF_UNIX one is
/// tracked, as a ttrpc connection when it names a shim socket.
#[inline(always)]
pub(crate) fn on_connect(tgid: u32, fd: u64, addr: u64, addrlen: u64) {
    // SAFETY: the helper checks the user pointer.
    let Ok(family) = (unsafe { bpf_probe_read_user(addr as *const u16) }) else { return };
    if family != AF_UNIX {
        return;
    }
    let kind = if crate::ttrpc::is_shim_path(addr, addrlen & 0xffff_ffff) { SockKind::Ttrpc } else { SockKind::UnixCandidate };
    track(tgid, fd as u32, kind, 0);
}

/// A `socket(family, type, protocol)` by `pid_tgid` that returned `ret`: a netlink
/// socket is tracked with its protocol.
#[inline(always)]
pub(crate) fn on_netlink_socket(pid_tgid: u64, proto: u32, ret: i64) {
    if ret < 0 || (pid_tgid >> 32) as u32 == tracer_tgid() {
        return;
    }
    track((pid_tgid >> 32) as u32, ret as u32, SockKind::Netlink, proto);
}

/// `syscalls:sys_enter_close`: `(unsigned int fd)` (Linux 6.18). Forgets the fd.
#[tracepoint]
pub fn close_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: offset from the format above.
    let fd: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG0) };
    forget(tgid, fd as u32);
    0
}

/// `syscalls:sys_enter_dup2`: `(unsigned int oldfd, unsigned int newfd)`, and
/// `syscalls:sys_enter_dup3`: `(unsigned int oldfd, unsigned int newfd, int
/// flags)` (Linux 6.18, checked: oldfd at 16, newfd at 24). Remembers the call
/// for [`dup_exit`] when either fd is tracked.
#[tracepoint]
pub fn dup_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == tracer_tgid() {
        return 0;
    }
    // SAFETY: offsets from the formats above.
    let old: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG0) };
    let new: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG1) };
    let (old, new) = (old as u32, new as u32);
    // dup2(fd, fd) changes nothing (dup3 refuses it).
    if old == new {
        return 0;
    }
    // SAFETY: read-only peeks.
    let tracked = unsafe { SOCKS.get(&key(tgid, old)).is_some() || SOCKS.get(&key(tgid, new)).is_some() };
    if tracked && DUP_CALLS.insert(&(pid_tgid as u32), &(((old as u64) << 32) | new as u64), 0).is_err() {
        // dup_exit will not see this call: newfd must not keep the class of the
        // file this call replaces. Forgotten now (if the call fails, newfd goes
        // untracked: a loss counted, never a wrong class).
        count(Stat::DupCallsFull);
        forget(tgid, new);
    }
    0
}

/// `syscalls:sys_exit_dup2` and `sys_exit_dup3`: `long ret` at 16, the new fd
/// on success (Linux 6.18, checked). newfd's old file was closed: it is
/// forgotten as at `close()`; then newfd takes oldfd's class if oldfd is
/// tracked (the same socket), else stays untracked.
#[tracepoint]
pub fn dup_exit(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: copied out before removal.
    let Some(fds) = (unsafe { DUP_CALLS.get(&tid) }).copied() else { return 0 };
    let _ = DUP_CALLS.remove(&tid);
    // SAFETY: offset from the format above.
    let ret: i64 = unsafe { crate::ctxread::field(&ctx, OFF_RET) };
    dup_done((pid_tgid >> 32) as u32, (fds >> 32) as u32, fds as u32, ret);
    0
}

/// A `dup2`/`dup3` of `old` onto `new` returned `ret`, from [`dup_exit`] or the fexit
/// programs of [`crate::syscall_functions`], which see the arguments and the result at
/// once.
#[inline(always)]
pub(crate) fn dup_done(tgid: u32, old: u32, new: u32, ret: i64) {
    if ret < 0 {
        return;
    }
    // Kind 0 (no kind) when oldfd is untracked: a value written on both
    // paths. Kept as an `Option` across `forget`, LLVM read the class's stack
    // slot before testing whether it was ever written, which the 5.10 and
    // 6.1 verifiers refuse ("invalid read from stack").
    let class = class_of(tgid, old).unwrap_or(SockClass { kind: 0, proto: 0, gen: 0, _pad: 0 });
    forget(tgid, new);
    if class.kind != 0 && SOCKS.insert(&key(tgid, new), &class, 0).is_err() {
        count(Stat::SocksFull);
    }
}

/// `syscalls:sys_enter_close_range`: `(unsigned int fd, unsigned int max_fd,
/// unsigned int flags)` (Linux 6.18, checked: at 16, 24 and 32).
///
/// Forgotten here, in the kernel, not by a record for userspace to act on: at
/// the syscall nothing can reuse the fds yet, while a record leaves a window
/// in which a reused fd is still parsed under its old class, and userspace
/// would have to walk all of `SOCKS` for the process's keys. A range of up to
/// [`CLOSE_RANGE_WALK`] fds is forgotten fd by fd in a bounded loop. A wider
/// one (typically `close_range(3, ~0U)` before an exec or as a daemon starts)
/// forgets all the process's sockets through its generation, as an exec does:
/// no bounded loop covers it, and what that forgets beyond the range (sockets
/// below `fd`, seldom there) only goes untracked, never misparsed.
/// With `CLOSE_RANGE_CLOEXEC` nothing is closed now; the exec forgets them.
#[tracepoint]
pub fn close_range_enter(ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: offsets from the format above.
    let first: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG0) };
    let last: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG1) };
    let flags: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG2) };
    close_range(tgid, first as u32, last as u32, flags);
    0
}

/// `close_range(first, last, flags)` by `tgid`, from [`close_range_enter`] or its fentry
/// program in [`crate::syscall_functions`].
#[inline(always)]
pub(crate) fn close_range(tgid: u32, first: u32, last: u32, flags: u64) {
    if flags & CLOSE_RANGE_CLOEXEC != 0 || first > last {
        return;
    }
    if last - first >= CLOSE_RANGE_WALK {
        forget_all(tgid);
        return;
    }
    let mut i = 0;
    while i < CLOSE_RANGE_WALK {
        if i > last - first {
            break;
        }
        forget(tgid, first + i);
        i += 1;
    }
}

/// `sched:sched_process_exec` (format on Linux 6.18, checked: `__data_loc
/// char[] filename` at 8, `pid_t pid` at 12, `pid_t old_pid` at 16; only the
/// current task's tgid is used). The exec may have closed any of the old
/// program's sockets (CLOEXEC) and freed their fds for the new one: every
/// socket of the process is forgotten. [`crate::gofuncs::proc_exec`] sits on
/// the same tracepoint for the Go targets; this one sends its record on
/// `SOCK_EVENTS`, in order with the process's socket I/O records.
#[tracepoint]
pub fn sock_exec(_ctx: TracePointContext) -> u32 {
    forget_all((bpf_get_current_pid_tgid() >> 32) as u32);
    0
}

/// `syscalls:sys_enter_{write,writev,sendto,sendmsg,read,readv,recvfrom,recvmsg}`
/// (Linux 6.18): `fd` first; arg1 is the buffer (`write`, `read`, `sendto`,
/// `recvfrom`), an `iovec` array (`writev`, `readv`) or a `user_msghdr`
/// (`sendmsg`, `recvmsg`); arg2 the length for plain buffers.
#[tracepoint]
pub fn sock_enter(ctx: TracePointContext) -> u32 {
    let _ = try_sock_enter(&ctx);
    0
}

fn try_sock_enter(ctx: &TracePointContext) -> Result<(), i64> {
    // SAFETY: offsets from the format above.
    let fd: u64 = unsafe { crate::ctxread::field(ctx, OFF_ARG0) };
    // The hot path ends here for untracked fds.
    let Some((tgid, class)) = tracked_call(fd) else { return Ok(()) };
    let nr: i32 = unsafe { crate::ctxread::field(ctx, OFF_NR) };
    let Some(slot) = sock_slot(nr as u32) else { return Ok(()) };
    let arg1: u64 = unsafe { crate::ctxread::field(ctx, OFF_ARG1) };
    let arg2: u64 = unsafe { crate::ctxread::field(ctx, OFF_ARG2) };
    // sendto's destination address: arg4, through a helper (`write`'s record ends before it).
    let arg4 = || if slot == 2 { unsafe { ctx.read_at::<u64>(OFF_ARG4) }.unwrap_or(0) } else { 0 };
    open_call(tgid, class, fd, slot, arg1, arg2, arg4);
    Ok(())
}

/// The calling process and the class of its `fd`, when that fd is a tracked socket
/// (not forgotten since) and the caller is not plegwatch.
#[inline(always)]
pub(crate) fn tracked_call(fd: u64) -> Option<(u32, SockClass)> {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: read-only peek.
    let class = (unsafe { SOCKS.get(&key(tgid, fd as u32)) }).copied()?;
    // Forgotten since (an exec, a wide close_range): another file now.
    if class.gen != gen_of(tgid) || tgid == tracer_tgid() {
        return None;
    }
    Some((tgid, class))
}

/// Opens the [`SOCK_CALLS`] entry of a send or receive on a tracked socket: `slot` says
/// which syscall; `arg1`, `arg2` are its second and third arguments, `arg4` its fifth
/// (asked only for sendto).
#[inline(always)]
pub(crate) fn open_call(tgid: u32, class: SockClass, fd: u64, slot: u32, arg1: u64, arg2: u64, arg4: impl FnOnce() -> u64) {
    let (buf, buf_len) = match slot % 4 {
        1 => first_iovec(arg1),
        3 => {
            // SAFETY: the helper checks the user pointer.
            let iov: u64 = unsafe { bpf_probe_read_user((arg1 + MSGHDR_IOV) as *const u64) }.unwrap_or(0);
            first_iovec(iov)
        }
        _ => (arg1, arg2),
    };
    let mut call =
        SockCall { start_ns: now(), buf, buf_len, tgid, fd: fd as u32, slot, nl_seq: 0, nl_type: 0, nl_flags: 0, nl_dst: 0, class };
    if class.kind == SockKind::Netlink as u32 && slot < SOCK_FIRST_RECV && buf != 0 {
        // SAFETY: the helper checks the user pointer.
        if let Ok(hdr) = unsafe { bpf_probe_read_user(buf as *const [u32; 4]) } {
            call.nl_type = hdr[1] as u16;
            call.nl_flags = (hdr[1] >> 16) as u16;
            call.nl_seq = hdr[2];
        }
        // `struct sockaddr_nl { sa_family_t; unsigned short pad; __u32 nl_pid; ... }`:
        // sendto's arg4, or sendmsg's `msg_name` (offset 0 of `user_msghdr`).
        let addr: u64 = match slot {
            2 => arg4(),
            // SAFETY: the helper checks the user pointer.
            3 => unsafe { bpf_probe_read_user(arg1 as *const u64) }.unwrap_or(0),
            _ => 0,
        };
        if addr != 0 {
            // SAFETY: as above.
            call.nl_dst = unsafe { bpf_probe_read_user((addr + 4) as *const u32) }.unwrap_or(0);
        }
    }
    let tid = bpf_get_current_pid_tgid() as u32;
    if crate::gate::insert_counted(&SOCK_CALLS, &tid, &call, &SOCK_CALLS_OPEN, 0).is_err() {
        count(Stat::SockCallsFull);
    }
}

/// `struct iovec { void *iov_base; size_t iov_len; }` at `iov` (uapi).
#[inline(always)]
fn first_iovec(iov: u64) -> (u64, u64) {
    if iov == 0 {
        return (0, 0);
    }
    // SAFETY: the helper checks the user pointer.
    let base: u64 = unsafe { bpf_probe_read_user(iov as *const u64) }.unwrap_or(0);
    let len: u64 = unsafe { bpf_probe_read_user((iov + 8) as *const u64) }.unwrap_or(0);
    (base, len)
}

/// `syscalls:sys_exit_{write,...,recvmsg}` (the same eight): `long ret` at 16.
/// Steps the D-Bus walk in `bpf_loop`s (Linux >= 5.17).
#[tracepoint]
pub fn sock_exit(ctx: TracePointContext) -> u32 {
    if !crate::gate::open(&SOCK_CALLS_OPEN, 0) {
        return 0;
    }
    // SAFETY: offset from the format above.
    let _ = try_sock_exit::<true>(unsafe { crate::ctxread::field(&ctx, OFF_RET) });
    0
}

/// [`sock_exit`] for kernels without `bpf_loop` (before Linux 5.17): the
/// same, with the D-Bus walk's steps and handshake scan as bounded loops
/// of calls to the `bpf_loop` callbacks, which the verifier follows turn
/// by turn.
#[tracepoint]
pub fn sock_exit_nl(ctx: TracePointContext) -> u32 {
    if !crate::gate::open(&SOCK_CALLS_OPEN, 0) {
        return 0;
    }
    // SAFETY: offset from the format above.
    let _ = try_sock_exit::<false>(unsafe { crate::ctxread::field(&ctx, OFF_RET) });
    0
}

/// Closes thread `tid`'s [`SOCK_CALLS`] entry, if it has one, without a record.
#[inline(always)]
pub(crate) fn drop_call(tid: u32) {
    if SOCK_CALLS.remove(&tid).is_ok() {
        crate::gate::add(&SOCK_CALLS_OPEN, 0, -1);
    }
}

/// `HELPER_LOOP`: step the D-Bus walk with `bpf_loop`, else with bounded loops.
#[inline(always)]
pub(crate) fn try_sock_exit<const HELPER_LOOP: bool>(ret: i64) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: copied out before removal.
    let Some(call) = (unsafe { SOCK_CALLS.get(&tid) }).copied() else { return Ok(()) };
    drop_call(tid);
    if ret <= 0 || call.buf == 0 {
        return Ok(());
    }
    let tgid = (pid_tgid >> 32) as u32;
    let mut class = call.class;
    if class.kind == SockKind::Ttrpc as u32 {
        crate::ttrpc::on_io(&call, ret, tid);
        return Ok(());
    }
    let is_send = call.slot < SOCK_FIRST_RECV;
    if class.kind == SockKind::UnixCandidate as u32 {
        if !is_send {
            return Ok(());
        }
        // SAFETY: the helper checks the user pointer.
        let first: u8 = unsafe { bpf_probe_read_user(call.buf as *const u8) }.unwrap_or(1);
        let k = key(tgid, call.fd);
        if first != 0 {
            let _ = SOCKS.remove(&k);
            return Ok(());
        }
        class.kind = SockKind::Dbus as u32;
        let _ = SOCKS.insert(&k, &class, 0);
        // Seen from its first byte: both ways start in the handshake.
        if DBUS_POS.insert(&k, &DbusPos::fresh(class.gen), 0).is_err() {
            count(Stat::DbusPosFull);
        }
    }
    let Some(scratch) = SOCK_SCRATCH.get_ptr_mut(0) else { return Ok(()) };
    // SAFETY: this CPU's scratch slot; programs don't nest on one CPU here.
    let scratch = unsafe { &mut *scratch };
    let rec = &mut scratch.io;
    rec.header = EventHeader { kind: EventKind::SockIo as u32, _pad: 0 };
    rec.start_ns = call.start_ns;
    rec.end_ns = now();
    rec.ret = ret;
    rec.tgid = tgid;
    rec.tid = tid;
    rec.fd = call.fd;
    rec.slot = call.slot;
    rec.class = class;
    rec.nl_dst = call.nl_dst;
    rec.comm = bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]);
    // What the syscall really moved, within the first buffer.
    let avail = if (ret as u64) < call.buf_len { ret as u64 } else { call.buf_len };
    // netlink: the message headers only, summarised; no byte of a message
    // is copied. D-Bus: the bytes of message headers (and of the SASL
    // handshake) at their offsets, the body bytes between them left 0.
    let n = if class.kind == SockKind::Netlink as u32 {
        rec.n_nl = walk_netlink(rec, call.buf, avail);
        0
    } else {
        rec.n_nl = 0;
        dbus_copy_headers::<HELPER_LOOP>(scratch, &call, tgid, ret as u64, avail)
    };
    let n = at_most(n as u64, SOCK_DATA_CAP as u64) as usize;
    let rec = &mut scratch.io;
    rec.captured = n as u32;
    // SAFETY: SockIo is plain old data; the first SOCK_IO_HEADER_LEN + n bytes are its header and data.
    let bytes = unsafe { core::slice::from_raw_parts((rec as *const SockIo).cast::<u8>(), SOCK_IO_HEADER_LEN + n) };
    if SOCK_EVENTS.output::<[u8]>(bytes, wakeup()).is_err() {
        count(Stat::SockEventsFull);
    }
    Ok(())
}

/// Copies the header bytes of what one send or receive on a D-Bus socket
/// moved (`len` bytes, the first `avail` readable) into the record's data,
/// at their offsets, over zeros. Returns how many leading bytes the record
/// describes (at most [`SOCK_DATA_CAP`]): within them, a 0 that was not
/// copied is a body byte, never read.
#[inline(always)]
fn dbus_copy_headers<const HELPER_LOOP: bool>(scratch: &mut SockScratch, call: &SockCall, tgid: u32, len: u64, avail: u64) -> usize {
    let k = key(tgid, call.fd);
    let pos = match DBUS_POS.get_ptr_mut(&k) {
        Some(p) => p,
        None => {
            // A connection older than plegwatch (seeded), or forgotten by
            // the LRU: joined in the middle.
            if DBUS_POS.insert(&k, &DbusPos::lost(call.class.gen), 0).is_err() {
                count(Stat::DbusPosFull);
                return 0;
            }
            match DBUS_POS.get_ptr_mut(&k) {
                Some(p) => p,
                None => return 0,
            }
        }
    };
    // SAFETY: a live map value; a stream is read or written by one thread at a time.
    let pos = unsafe { &mut *pos };
    if pos.gen != call.class.gen {
        *pos = DbusPos::lost(call.class.gen);
    }
    let mut blank = if avail < SOCK_DATA_CAP as u64 { avail as usize } else { SOCK_DATA_CAP };
    if let Some(z) = ZEROS.get_ptr(0) {
        // SAFETY: kernel memory of the ZEROS map; `blank` is bounded by the slice.
        if unsafe { bpf_probe_read_kernel_buf(z as *const u8, &mut scratch.io.data[..blank]) }.is_err() {
            blank = 0;
        }
    } else {
        blank = 0;
    }
    let dir = if call.slot < SOCK_FIRST_RECV { &mut pos.tx } else { &mut pos.rx };
    let mut bytes = DbusUser::<HELPER_LOOP> { buf: call.buf, data: scratch.io.data.as_mut_ptr(), failed: false };
    let w = &mut scratch.walk;
    w.dir = *dir;
    w.buf = call.buf;
    w.failed = 0;
    plegwatch_abi::dbus_start(&mut w.dir, &mut w.cur, len, avail, &mut bytes);
    if w.cur.known == DBUS_GOING {
        if HELPER_LOOP {
            // The callback finds the walk in this CPU's scratch: bpf_loop's
            // context must be on the stack, whose contents the verifier would
            // follow turn by turn.
            // SAFETY: a plain helper call; no context.
            unsafe {
                bpf_loop((DBUS_WALK_MAX + 1) as u32, dbus_step_cb as *mut c_void, core::ptr::null_mut(), 0);
            }
        } else {
            let mut i: u64 = 0;
            while i <= DBUS_WALK_MAX as u64 {
                if dbus_step_cb(i, core::ptr::null_mut()) != 0 {
                    break;
                }
                i += 1;
            }
        }
    }
    let w = &mut scratch.walk;
    let known = match w.cur.known {
        // Never so after the steps, unless bpf_loop failed.
        DBUS_GOING => {
            w.dir = DbusDir { mode: plegwatch_abi::DBUS_LOST, ..Default::default() };
            0
        }
        k => k,
    };
    *dir = w.dir;
    if w.failed != 0 {
        bytes.failed = true;
    }
    if bytes.failed {
        count(Stat::SockReadFailed);
    }
    let known = if known < blank as u64 { known as usize } else { blank };
    known
}

/// A `bpf_loop` callback: one [`plegwatch_abi::dbus_step`] of the walk in
/// this CPU's [`SockScratch`]. Returns 1 to stop.
#[inline(never)]
extern "C" fn dbus_step_cb(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(s) = SOCK_SCRATCH.get_ptr_mut(0) else { return 1 };
    // SAFETY: this CPU's scratch; dbus_copy_headers, which called the
    // bpf_loop, holds no reference into it across the call.
    let s = unsafe { &mut *s };
    // Never scans the handshake (dbus_start did): the loop kind is moot.
    let mut bytes = DbusUser::<true> { buf: s.walk.buf, data: s.io.data.as_mut_ptr(), failed: false };
    let go = plegwatch_abi::dbus_step(&mut s.walk.dir, &mut s.walk.cur, &mut bytes, index >= DBUS_WALK_MAX as u64);
    if bytes.failed {
        s.walk.failed = 1;
    }
    if go {
        0
    } else {
        1
    }
}

/// A `bpf_loop` callback: handshake text in the 8 bytes at `index * 8` of
/// the buffer of this CPU's [`TextScan`]: printable ASCII, CR and LF, and
/// a NUL at offset 0. Returns 1 to stop, with `end` set where the text ends.
#[inline(never)]
extern "C" fn dbus_text_cb(index: u64, _ctx: *mut c_void) -> i64 {
    let Some(t) = DBUS_TEXT.get_ptr_mut(0) else { return 1 };
    // SAFETY: this CPU's entry, set by DbusUser::text_len.
    let t = unsafe { &mut *t };
    let (len, base) = (t.len, index * 8);
    if base >= len {
        t.end = len;
        return 1;
    }
    // SAFETY: the helper checks the user pointer.
    let Ok(b) = (unsafe { bpf_probe_read_user((t.buf + base) as *const [u8; 8]) }) else {
        t.end = base;
        return 1;
    };
    let mut j: u64 = 0;
    while j < 8 {
        let at = base + j;
        if at >= len {
            t.end = len;
            return 1;
        }
        let c = b[(j & 7) as usize];
        if !((0x20..0x7f).contains(&c) || c == b'\r' || c == b'\n' || (at == 0 && c == 0)) {
            t.end = at;
            return 1;
        }
        j += 1;
    }
    0
}

/// A D-Bus syscall's buffer in the traced process, and the record's data
/// (followed by [`SockScratch`]'s slack) to copy header bytes into.
/// `HELPER_LOOP`: scan the handshake with `bpf_loop`, else with a bounded loop.
struct DbusUser<const HELPER_LOOP: bool> {
    buf: u64,
    data: *mut u8,
    failed: bool,
}

impl<const HELPER_LOOP: bool> DbusBytes for DbusUser<HELPER_LOOP> {
    #[inline(always)]
    fn fixed(&mut self, off: u64) -> Option<[u8; 16]> {
        // SAFETY: the helper checks the user pointer.
        unsafe { bpf_probe_read_user((self.buf + off) as *const [u8; 16]) }.ok()
    }

    #[inline(always)]
    fn text_len(&mut self, len: u64) -> u64 {
        let Some(t) = DBUS_TEXT.get_ptr_mut(0) else { return 0 };
        // SAFETY: this CPU's entry, a live map value.
        unsafe {
            (*t).buf = self.buf;
            (*t).len = len;
            (*t).end = DBUS_GOING;
            if HELPER_LOOP {
                bpf_loop((DBUS_AUTH_SCAN / 8) as u32, dbus_text_cb as *mut c_void, core::ptr::null_mut(), 0);
            } else {
                let mut i: u64 = 0;
                while i < (DBUS_AUTH_SCAN / 8) as u64 {
                    if dbus_text_cb(i, core::ptr::null_mut()) != 0 {
                        break;
                    }
                    i += 1;
                }
            }
            if (*t).end == DBUS_GOING {
                len
            } else {
                (*t).end
            }
        }
    }

    #[inline(always)]
    fn copy(&mut self, off: u64, n: u64) {
        if off >= SOCK_DATA_CAP as u64 || n == 0 {
            return;
        }
        let off = (off as usize) & (SOCK_DATA_CAP - 1);
        let mut n = n as u32;
        if n > SOCK_DATA_CAP as u32 {
            n = SOCK_DATA_CAP as u32;
        }
        // SAFETY: `off < SOCK_DATA_CAP` and `n <= SOCK_DATA_CAP`: inside data
        // and the slack after it; the helper checks the user pointer. What
        // lands in the slack is never sent.
        let rc = unsafe {
            aya_ebpf::helpers::generated::bpf_probe_read_user(
                self.data.add(off).cast(),
                n,
                (self.buf + off as u64) as *const core::ffi::c_void,
            )
        };
        if rc != 0 {
            self.failed = true;
        }
    }
}

/// Summarises every netlink message header in `buf[..len]` (at most
/// [`NL_SUMMARIES`]).
#[inline(always)]
fn walk_netlink(rec: &mut SockIo, buf: u64, len: u64) -> u32 {
    let mut off: u64 = 0;
    let mut i = 0;
    while i < NL_SUMMARIES {
        if off + NLMSG_HDRLEN > len {
            break;
        }
        // The header and the first word after it (an NLMSG_ERROR's errno), in
        // one read with no branch, which keeps the verifier's work small.
        // SAFETY: the helper checks the user pointer.
        let Ok(w) = (unsafe { bpf_probe_read_user((buf + off) as *const [u32; 5]) }) else { break };
        let msg_type = w[1] as u16;
        let error = if msg_type == NLMSG_ERROR { w[4] as i32 } else { 0 };
        rec.nl[i] = NlSummary { len: w[0], msg_type, flags: (w[1] >> 16) as u16, seq: w[2], error, pid: w[3] };
        i += 1;
        let step = ((w[0] as u64) + 3) & !3;
        if step < NLMSG_HDRLEN {
            break;
        }
        // Bounded, so that the verifier sees `off` stay small.
        off = (off + step) & 0xffff_ffff;
    }
    i as u32
}
