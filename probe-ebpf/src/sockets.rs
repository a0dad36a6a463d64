//! Netlink and D-Bus sockets: which fds to look at, and what goes through them.
//!
//! Classification happens here, in the kernel, so that the hot `read`/`write`
//! path costs one hash lookup that misses for every socket and file that does
//! not matter:
//! - `socket(AF_NETLINK, ...)` marks the returned fd [`SockKind::Netlink`];
//! - `connect()` of an AF_UNIX socket marks it a [`SockKind::UnixCandidate`],
//!   and its first send decides: a D-Bus client starts with a NUL byte (then
//!   the SASL `AUTH`), anything else is forgotten;
//! - `close()` forgets the fd.
//!
//! Userspace seeds the map with sockets that existed before it started. For a
//! tracked socket, each send or receive sends one [`SockIo`] record with the
//! first bytes of the buffer and, for netlink, a summary of every message
//! header in it. Parsing and request/reply matching happen in userspace.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, bpf_probe_read_user_buf},
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use plegwatch_abi::{
    COMM_LEN, EventHeader, EventKind, NL_SUMMARIES, NlSummary, SOCK_DATA_CAP, SOCK_FIRST_RECV, SOCK_IO_HEADER_LEN,
    SOCK_SLOTS, SockCall, SockClass, SockClosed, SockIo, SockKind, Stat,
};

use crate::waits::{count, tracer_tgid};

#[map]
static SOCKS: HashMap<u64, SockClass> = HashMap::with_max_entries(16_384, 0);
#[map]
static SOCK_CALLS: HashMap<u32, SockCall> = HashMap::with_max_entries(8_192, 0);
#[map]
static SOCK_EVENTS: RingBuf = RingBuf::with_byte_size(1 << 20, 0);
/// Per-CPU scratch for building a [`SockIo`] (too big for the stack).
#[map]
static SOCK_SCRATCH: PerCpuArray<SockIo> = PerCpuArray::with_max_entries(1, 0);
/// `socket()` calls in flight: tid → netlink protocol.
#[map]
static SOCKET_CALLS: HashMap<u32, u32> = HashMap::with_max_entries(1_024, 0);
/// Slot 0: how many [`SOCK_CALLS`] entries are open, so that `sys_exit` costs
/// one array read while none is. Kernel-owned: up only when an insert made an
/// entry ([`crate::gate::insert_counted`]), down only when `sock_exit`'s delete
/// removed one; userspace never writes `SOCK_CALLS`.
#[map]
static SOCK_CALLS_OPEN: Array<u64> = Array::with_max_entries(1, 0);

#[unsafe(no_mangle)]
static SOCK_NR: [u32; SOCK_SLOTS] = [u32::MAX; SOCK_SLOTS];

const AF_UNIX: u16 = 1;
const AF_NETLINK: u64 = 16;
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
    let _ = SOCKET_CALLS.insert(&tid, &(proto as u32), 0);
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
    if ret < 0 || (pid_tgid >> 32) as u32 == tracer_tgid() {
        return 0;
    }
    let class = SockClass { kind: SockKind::Netlink as u32, proto };
    if SOCKS.insert(&key((pid_tgid >> 32) as u32, ret as u32), &class, 0).is_err() {
        count(Stat::SocksFull);
    }
    0
}

/// `syscalls:sys_enter_connect`: `(int fd, struct sockaddr *uservaddr, int addrlen)`
/// (Linux 6.18). An AF_UNIX connect makes the fd a D-Bus candidate.
#[tracepoint]
pub fn connect_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == tracer_tgid() {
        return 0;
    }
    // SAFETY: offsets from the format above; the helper checks the user pointer.
    let fd: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG0) };
    let addr: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG1) };
    let Ok(family) = (unsafe { bpf_probe_read_user(addr as *const u16) }) else { return 0 };
    if family != AF_UNIX {
        return 0;
    }
    let class = SockClass { kind: SockKind::UnixCandidate as u32, proto: 0 };
    if SOCKS.insert(&key(tgid, fd as u32), &class, 0).is_err() {
        count(Stat::SocksFull);
    }
    0
}

/// `syscalls:sys_enter_close`: `(unsigned int fd)` (Linux 6.18). Forgets the fd.
#[tracepoint]
pub fn close_enter(ctx: TracePointContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: offset from the format above.
    let fd: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG0) };
    let k = key(tgid, fd as u32);
    // SAFETY: read-only peek.
    let Some(class) = (unsafe { SOCKS.get(&k) }).copied() else { return 0 };
    if SOCKS.remove(&k).is_ok() && class.kind != SockKind::UnixCandidate as u32 {
        let rec = SockClosed {
            header: EventHeader { kind: EventKind::SockClosed as u32, _pad: 0 },
            tgid,
            fd: fd as u32,
        };
        if SOCK_EVENTS.output::<SockClosed>(&rec, 0).is_err() {
            count(Stat::SockEventsFull);
        }
    }
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
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    // SAFETY: offsets from the format above.
    let fd: u64 = unsafe { crate::ctxread::field(ctx, OFF_ARG0) };
    // SAFETY: read-only peek; the hot path ends here for untracked fds.
    let Some(class) = (unsafe { SOCKS.get(&key(tgid, fd as u32)) }).copied() else { return Ok(()) };
    if tgid == tracer_tgid() {
        return Ok(());
    }
    let nr: i32 = unsafe { crate::ctxread::field(ctx, OFF_NR) };
    let Some(slot) = sock_slot(nr as u32) else { return Ok(()) };
    let arg1: u64 = unsafe { crate::ctxread::field(ctx, OFF_ARG1) };
    let arg2: u64 = unsafe { crate::ctxread::field(&ctx, OFF_ARG2) };
    let (buf, buf_len) = match slot % 4 {
        1 => first_iovec(arg1),
        3 => {
            // SAFETY: the helper checks the user pointer.
            let iov: u64 = unsafe { bpf_probe_read_user((arg1 + MSGHDR_IOV) as *const u64) }.unwrap_or(0);
            first_iovec(iov)
        }
        _ => (arg1, arg2),
    };
    let mut call = SockCall {
        start_ns: now(),
        buf,
        buf_len,
        tgid,
        fd: fd as u32,
        slot,
        nl_seq: 0,
        nl_type: 0,
        nl_flags: 0,
        nl_dst: 0,
        class,
    };
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
            // Through a helper: `write`'s record ends before arg4.
            2 => unsafe { ctx.read_at(OFF_ARG4) }.unwrap_or(0),
            // SAFETY: the helper checks the user pointer.
            3 => unsafe { bpf_probe_read_user(arg1 as *const u64) }.unwrap_or(0),
            _ => 0,
        };
        if addr != 0 {
            // SAFETY: as above.
            call.nl_dst = unsafe { bpf_probe_read_user((addr + 4) as *const u32) }.unwrap_or(0);
        }
    }
    let tid = pid_tgid as u32;
    if crate::gate::insert_counted(&SOCK_CALLS, &tid, &call, &SOCK_CALLS_OPEN, 0).is_err() {
        count(Stat::SockCallsFull);
    }
    Ok(())
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
#[tracepoint]
pub fn sock_exit(ctx: TracePointContext) -> u32 {
    if !crate::gate::open(&SOCK_CALLS_OPEN, 0) {
        return 0;
    }
    let _ = try_sock_exit(&ctx);
    0
}

fn try_sock_exit(ctx: &TracePointContext) -> Result<(), i64> {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    // SAFETY: copied out before removal.
    let Some(call) = (unsafe { SOCK_CALLS.get(&tid) }).copied() else { return Ok(()) };
    if SOCK_CALLS.remove(&tid).is_ok() {
        crate::gate::add(&SOCK_CALLS_OPEN, 0, -1);
    }
    // SAFETY: offset from the format above.
    let ret: i64 = unsafe { crate::ctxread::field(ctx, OFF_RET) };
    if ret <= 0 || call.buf == 0 {
        return Ok(());
    }
    let tgid = (pid_tgid >> 32) as u32;
    let mut class = call.class;
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
    }
    let Some(rec) = SOCK_SCRATCH.get_ptr_mut(0) else { return Ok(()) };
    // SAFETY: this CPU's scratch slot; programs don't nest on one CPU here.
    let rec = unsafe { &mut *rec };
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
    rec.n_nl = if class.kind == SockKind::Netlink as u32 { walk_netlink(rec, call.buf, avail) } else { 0 };
    let mut n = avail as usize;
    if n > SOCK_DATA_CAP {
        n = SOCK_DATA_CAP;
    }
    // SAFETY: the helper checks the user pointer; `n` is bounded by the slice.
    if unsafe { bpf_probe_read_user_buf(call.buf as *const u8, &mut rec.data[..n]) }.is_err() {
        count(Stat::SockReadFailed);
        n = 0;
    }
    rec.captured = n as u32;
    // SAFETY: SockIo is plain old data; the first SOCK_IO_HEADER_LEN + n bytes are its header and data.
    let bytes = unsafe { core::slice::from_raw_parts((rec as *const SockIo).cast::<u8>(), SOCK_IO_HEADER_LEN + n) };
    if SOCK_EVENTS.output::<[u8]>(bytes, 0).is_err() {
        count(Stat::SockEventsFull);
    }
    Ok(())
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
