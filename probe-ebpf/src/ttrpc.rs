//! ttrpc between containerd and its shims: frame headers only, never payloads.
//!
//! A ttrpc frame is a 10-byte header (length u32 BE, stream id u32 BE, type
//! u8, flags u8) then `length` bytes of payload. A socket is classified at
//! `connect()` by the path it connects to: containerd's shim sockets are
//! `<root>/s/<sha256 hex>` (`shim.SocketAddress`: `/run/containerd/s/…` in
//! 1.6 and 1.7, under the state directory in 2.x; a debug socket's extra
//! `.debug` suffix keeps it out). Userspace seeds the connections that
//! existed before it started, on their peer's name.
//!
//! Each send or receive on such a socket walks the frames it moved, from
//! where the last one left off ([`TtrpcPos`]: payload bytes still to skip,
//! and a header cut in two by the end of a syscall), and sends one
//! [`TtrpcIo`] with the headers it found. Only header bytes are ever read.
//! A header that makes no sense (the stream joined out of step) ends the
//! socket's tracking: it is forgotten like a closed one.
//!
//! ttrpc 1.1 (Debian's containerd 1.6.20 has v1.1.1) writes every request
//! from one sender goroutine per client; two uprobes name the caller (see
//! [`ttrpc_dispatch`], [`ttrpc_send`]). From 1.2 the caller writes its own
//! request, and the goroutine of the write is the caller's.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated},
    macros::{map, uprobe},
    maps::{HashMap, LruHashMap, PerCpuArray},
    programs::ProbeContext,
};
use plegwatch_abi::{
    ttrpc_walk, EventHeader, EventKind, SockCall, Stat, TtrpcBind, TtrpcBytes, TtrpcFrame, TtrpcIo, TtrpcPos, TtrpcReqKey, SOCK_FIRST_RECV,
    TTRPC_FRAMES, TTRPC_HEADER_LEN, TTRPC_SHIM_SUFFIX_LEN,
};

use crate::waits::{count, tracer_tgid};

#[map]
static TTRPC_POS: HashMap<u64, TtrpcPos> = HashMap::with_max_entries(4_096, 0);
#[map]
static TTRPC_CALLERS: LruHashMap<TtrpcReqKey, u64> = LruHashMap::with_max_entries(4_096, 0);
/// Per-CPU scratch for building a [`TtrpcIo`].
#[map]
static TTRPC_SCRATCH: PerCpuArray<TtrpcIo> = PerCpuArray::with_max_entries(1, 0);

/// ttrpc's `messageTypeRequest`.
const TYPE_REQUEST: u64 = 1;

/// Whether the `sockaddr_un` at `addr` (`addrlen` bytes, as given to
/// `connect`) names a shim socket: a path ending in `/s/` and 64 hex digits.
#[inline(always)]
pub(crate) fn is_shim_path(addr: u64, addrlen: u64) -> bool {
    // sun_path is 108 bytes after the 2-byte family.
    if addrlen < 2 + TTRPC_SHIM_SUFFIX_LEN as u64 || addrlen > 110 {
        return false;
    }
    let mut plen = addrlen - 2;
    // Go (and libc callers that count it) pass the NUL in addrlen.
    // SAFETY: the helper checks the user pointer.
    let last: u8 = unsafe { bpf_probe_read_user((addr + 2 + plen - 1) as *const u8) }.unwrap_or(1);
    if last == 0 {
        plen -= 1;
    }
    if plen < TTRPC_SHIM_SUFFIX_LEN as u64 {
        return false;
    }
    // SAFETY: as above.
    let Ok(tail) = (unsafe { bpf_probe_read_user((addr + 2 + plen - TTRPC_SHIM_SUFFIX_LEN as u64) as *const [u8; TTRPC_SHIM_SUFFIX_LEN]) })
    else {
        return false;
    };
    if tail[0] != b'/' || tail[1] != b's' || tail[2] != b'/' {
        return false;
    }
    let mut i = 3;
    while i < TTRPC_SHIM_SUFFIX_LEN {
        let c = tail[i];
        if !(c.is_ascii_digit() || (b'a'..=b'f').contains(&c)) {
            return false;
        }
        i += 1;
    }
    true
}

/// Forgets a ttrpc socket's stream position (its fd was closed or replaced).
#[inline(always)]
pub(crate) fn forget_pos(key: u64) {
    let _ = TTRPC_POS.remove(&key);
}

/// A completed send or receive of `ret` bytes on a ttrpc socket.
#[inline(always)]
pub(crate) fn on_io(call: &SockCall, ret: i64, tid: u32) {
    let tgid = call.tgid;
    let key = ((tgid as u64) << 32) | call.fd as u64;
    if walk_call(call, ret, key, tid).is_err() {
        count(Stat::TtrpcDesync);
        forget_pos(key);
        crate::sockets::forget(tgid, call.fd);
    }
}

#[inline(always)]
fn walk_call(call: &SockCall, ret: i64, key: u64, tid: u32) -> Result<(), ()> {
    // Only the first buffer is walked: Go writes and reads a conn with plain
    // write/read, so a larger count means a vectored call this cannot follow.
    if ret as u64 > call.buf_len {
        return Err(());
    }
    let fresh = TtrpcPos { gen: call.class.gen, ..Default::default() };
    let pos = match TTRPC_POS.get_ptr_mut(&key) {
        Some(p) => p,
        None => {
            if TTRPC_POS.insert(&key, &fresh, 0).is_err() {
                crate::waits::count(plegwatch_abi::Stat::TtrpcPosFull);
                return Err(());
            }
            TTRPC_POS.get_ptr_mut(&key).ok_or(())?
        }
    };
    // SAFETY: a live map value; one syscall per thread, and ttrpc sends and
    // receives on one socket from one goroutine each (sendLock, the receiver).
    let pos = unsafe { &mut *pos };
    if pos.gen != call.class.gen {
        *pos = fresh;
    }
    let rec = TTRPC_SCRATCH.get_ptr_mut(0).ok_or(())?;
    // SAFETY: this CPU's scratch slot; programs don't nest on one CPU here.
    let rec = unsafe { &mut *rec };
    rec.header = EventHeader { kind: EventKind::TtrpcIo as u32, _pad: 0 };
    rec.start_ns = call.start_ns;
    // SAFETY: a plain helper call.
    rec.end_ns = unsafe { bpf_ktime_get_ns() };
    rec.g = crate::gofuncs::current_g(call.tgid);
    rec.tgid = call.tgid;
    rec.tid = tid;
    rec.fd = call.fd;
    rec.slot = call.slot;
    rec.n = 0;
    let dir = if call.slot < SOCK_FIRST_RECV { &mut pos.tx } else { &mut pos.rx };
    ttrpc_walk(dir, ret as u64, &mut UserBuf(call.buf), &mut |f| push(rec, f)).ok_or(())?;
    if rec.n > 0 {
        crate::sockets::output(rec);
    }
    Ok(())
}

/// Adds a header to the record, sending it first if it is full (a read
/// that brought many small responses at once).
#[inline(always)]
fn push(rec: &mut TtrpcIo, f: TtrpcFrame) {
    if rec.n as usize >= TTRPC_FRAMES {
        crate::sockets::output(rec);
        rec.n = 0;
    }
    rec.frames[rec.n as usize & (TTRPC_FRAMES - 1)] = f;
    rec.n += 1;
}

/// The syscall's buffer in the traced process.
struct UserBuf(u64);

impl TtrpcBytes for UserBuf {
    #[inline(always)]
    fn header(&mut self, off: u64) -> Option<[u8; TTRPC_HEADER_LEN]> {
        // SAFETY: the helper checks the user pointer.
        unsafe { bpf_probe_read_user((self.0 + off) as *const [u8; TTRPC_HEADER_LEN]) }.ok()
    }

    #[inline(always)]
    fn part(&mut self, dst: &mut [u8; 16], at: u32, off: u64, n: u32) -> Option<()> {
        let at = (at & 15) as usize;
        // Bounded by a constant, on a value LLVM cannot see through: it knows
        // `n <= 10` from the caller and would drop the check, while the 5.10
        // and 6.1 verifiers learn no bound from the caller's comparison of
        // two registers (`take = min(len, need)`): the length reached the
        // helper unbounded there ("R2 unbounded memory access").
        let n = core::hint::black_box(u64::from(n));
        if n == 0 || n > TTRPC_HEADER_LEN as u64 || at as u64 + n > 16 {
            return None;
        }
        // SAFETY: `at + n <= 16`, inside `dst`; the helper checks the user pointer.
        let rc = unsafe {
            generated::bpf_probe_read_user(dst.as_mut_ptr().add(at).cast(), n as u32, (self.0 + off) as *const core::ffi::c_void)
        };
        (rc == 0).then_some(())
    }
}

/// Entry of ttrpc v1.1's `func (c *Client) dispatch(ctx context.Context, req
/// *Request, resp *Response) error` (v1.1.1 as built into Debian's containerd
/// 1.6.20, Go 1.19 register ABI: RAX c, RBX:RCX ctx, RDI req, RSI resp; R14
/// g). The caller hands the request to the client's sender goroutine and
/// waits for the reply here: remembers who called with this request.
#[uprobe]
pub fn ttrpc_dispatch(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == tracer_tgid() {
        return 0;
    }
    // SAFETY: `regs` is the probed task's saved registers, readable here.
    let (req, g) = unsafe { ((*ctx.regs).rdi, (*ctx.regs).r14) };
    if TTRPC_CALLERS.insert(&TtrpcReqKey { req, tgid, _pad: 0 }, &g, 0).is_err() {
        crate::waits::count(plegwatch_abi::Stat::TtrpcCallersFull);
    }
    0
}

/// Entry of ttrpc v1.1's `func (c *Client) send(streamID uint32, mtype
/// messageType, msg interface{}) error` (v1.1.1, Go 1.19 register ABI: RAX c,
/// RBX streamID, RCX mtype, RDI:RSI msg, whose data word is the `*Request`;
/// R14 the sender goroutine, which writes the frame next). Ties the stream id
/// to the goroutine that dispatched the request.
#[uprobe]
pub fn ttrpc_send(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // SAFETY: as above.
    let (stream, mtype, req, sender_g) = unsafe { ((*ctx.regs).rbx, (*ctx.regs).rcx, (*ctx.regs).rsi, (*ctx.regs).r14) };
    if mtype & 0xff != TYPE_REQUEST {
        return 0;
    }
    let k = TtrpcReqKey { req, tgid, _pad: 0 };
    // SAFETY: copied out at once.
    let Some(caller_g) = (unsafe { TTRPC_CALLERS.get(&k) }).copied() else { return 0 };
    let _ = TTRPC_CALLERS.remove(&k);
    let rec =
        TtrpcBind { header: EventHeader { kind: EventKind::TtrpcBind as u32, _pad: 0 }, sender_g, caller_g, tgid, stream: stream as u32 };
    crate::sockets::output(&rec);
    0
}
