//! Go function timing on stripped binaries: a uprobe at each function's entry
//! and at every RET instruction in it (never a uretprobe: those crash Go when a
//! goroutine's stack moves). Userspace finds both in `.gopclntab` and decodes
//! the RETs. The attach cookie names the function (Linux >= 5.15); before
//! 5.15 there are no cookies, and the `_at` variants find the function in
//! `GO_ADDRS` by where the point sits in the process's code (see
//! [`plegwatch_abi::GoAddrKey`]). Userspace loads one pair or the other.
//!
//! Calls are keyed by process and goroutine: under Go's register ABI (Go >=
//! 1.17, amd64) R14 holds the current `g` at function entry and at return.

use aya_ebpf::{
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_probe_read_user,
        generated::bpf_get_attach_cookie,
    },
    macros::{map, tracepoint, uprobe},
    maps::{Array, HashMap, RingBuf},
    programs::{ProbeContext, TracePointContext},
    EbpfContext as _,
};
use plegwatch_abi::{
    EventHeader, EventKind, ExecEvent, GoAddrKey, GoArgSpec, GoCall, GoCallEnd, GoCallKey, GoExit, GoProc, Stat, COMM_LEN, GO_ADDRS_MAX,
    GO_ARG_LEN, GO_EVENTS_BYTES, GO_FUNCS_MAX,
};

use crate::waits::{count, report_min_ns, tracer_tgid};

#[map]
static GO_CALLS: HashMap<GoCallKey, GoCall> = HashMap::with_max_entries(16_384, 0);
#[map]
static GO_EVENTS: RingBuf = RingBuf::with_byte_size(GO_EVENTS_BYTES, 0);
#[map]
static GO_PROCS: HashMap<u32, GoProc> = HashMap::with_max_entries(1024, 0);
#[map]
static GO_ARGS: Array<GoArgSpec> = Array::with_max_entries(GO_FUNCS_MAX, 0);

#[map]
static GO_ADDRS: HashMap<GoAddrKey, u32> = HashMap::with_max_entries(GO_ADDRS_MAX, 0);

#[unsafe(no_mangle)]
static TASK_FSBASE_OFF: u32 = u32::MAX;
#[unsafe(no_mangle)]
static TASK_MM_OFF: u32 = u32::MAX;
#[unsafe(no_mangle)]
static MM_START_CODE_OFF: u32 = u32::MAX;
#[unsafe(no_mangle)]
static MM_END_CODE_OFF: u32 = u32::MAX;

/// The goroutine running on the current thread, read from its thread-local
/// storage (`*(fsbase + g_tls_off)`) if `tgid` runs a probed Go binary, else
/// 0. Valid anywhere the thread runs (a syscall tracepoint, a sleep): unlike
/// R14, which holds `g` only inside Go code. x86-64 only.
#[inline(always)]
pub(crate) fn current_g(tgid: u32) -> u64 {
    // SAFETY: copied out at once.
    let Some(proc) = (unsafe { GO_PROCS.get(&tgid) }).copied() else { return 0 };
    // SAFETY: a read-only global patched by the loader.
    let off = unsafe { core::ptr::read_volatile(&TASK_FSBASE_OFF) };
    if off == u32::MAX {
        return 0;
    }
    // SAFETY: a plain helper call; the task is only read through probe_read.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: bounds and faults are checked by the helper.
    let Ok(fsbase) = (unsafe { bpf_probe_read_kernel(task.wrapping_add(off as usize) as *const u64) }) else {
        return 0;
    };
    if fsbase == 0 {
        return 0;
    }
    let slot = (fsbase as i64).wrapping_add(proc.g_tls_off) as u64;
    // SAFETY: as above, for user memory of the current task.
    unsafe { bpf_probe_read_user(slot as *const u64) }.unwrap_or(0)
}

/// The call's receiver as `GO_ARGS` says where it is: a register plus an offset
/// (RAX, the method receiver, when the function has no entry).
#[inline(always)]
fn receiver(ctx: &ProbeContext, func: u32) -> u64 {
    // SAFETY: `regs` is the probed task's saved registers, each read at a constant offset.
    let regs = unsafe { &*ctx.regs };
    let Some(spec) = GO_ARGS.get(func) else { return regs.rax };
    let all = [regs.rax, regs.rbx, regs.rcx, regs.rdi, regs.rsi, regs.r8, regs.r9, regs.r10, regs.r11];
    match all.get(spec.recv_reg as usize) {
        Some(&r) => r.wrapping_add(u64::from(spec.recv_off)),
        None => regs.rax,
    }
}

/// Copies the string argument `GO_ARGS[func]` names into `call`.
#[inline(always)]
fn capture_arg(ctx: &ProbeContext, func: u32, call: &mut GoCall) {
    let Some(spec) = GO_ARGS.get(func) else { return };
    // SAFETY: `regs` is the probed task's saved registers. Each is read at a
    // constant offset: the verifier refuses a ctx pointer moved by a variable.
    let regs = unsafe { &*ctx.regs };
    let all = [regs.rax, regs.rbx, regs.rcx, regs.rdi, regs.rsi, regs.r8, regs.r9, regs.r10, regs.r11];
    let Some(&base) = all.get(spec.reg as usize) else { return };
    if base == 0 {
        return;
    }
    // A Go string header: data pointer, then length.
    let hdr = base.wrapping_add(u64::from(spec.off)) as *const [u64; 2];
    // SAFETY: the helper checks the user pointer.
    let Ok([data, len]) = (unsafe { bpf_probe_read_user(hdr) }) else { return };
    if len == 0 || data == 0 {
        return;
    }
    let capped = if len > GO_ARG_LEN as u64 { GO_ARG_LEN as u64 } else { len };
    // In 1..=GO_ARG_LEN in a form the verifier can bound (a mask).
    let n = (((capped - 1) as u32) & (GO_ARG_LEN as u32 - 1)) + 1;
    // SAFETY: `n` is in 1..=GO_ARG_LEN, the size of `call.arg`; the helper checks `data`.
    let rc =
        unsafe { aya_ebpf::helpers::generated::bpf_probe_read_user(call.arg.as_mut_ptr().cast(), n, data as *const core::ffi::c_void) };
    if rc == 0 {
        call.arg_len = n;
    }
}

/// The function id of a cookie-less probe: the point's place in the
/// current process's code (`regs->ip`, which a uprobe handler sees set back
/// to the probed instruction), looked up in `GO_ADDRS`.
#[inline(always)]
fn func_at(ctx: &ProbeContext) -> Option<u32> {
    // SAFETY: read-only globals patched by the loader.
    let (mm_off, start_off, end_off) = unsafe {
        (core::ptr::read_volatile(&TASK_MM_OFF), core::ptr::read_volatile(&MM_START_CODE_OFF), core::ptr::read_volatile(&MM_END_CODE_OFF))
    };
    if mm_off == u32::MAX || start_off == u32::MAX || end_off == u32::MAX {
        return None;
    }
    // SAFETY: a plain helper call; the task is only read through probe_read.
    let task = unsafe { bpf_get_current_task() } as *const u8;
    // SAFETY: bounds and faults are checked by the helper.
    let mm = unsafe { bpf_probe_read_kernel(task.wrapping_add(mm_off as usize) as *const u64) }.ok()? as *const u8;
    // SAFETY: as above.
    let start = unsafe { bpf_probe_read_kernel(mm.wrapping_add(start_off as usize) as *const u64) }.ok()?;
    // SAFETY: as above.
    let end = unsafe { bpf_probe_read_kernel(mm.wrapping_add(end_off as usize) as *const u64) }.ok()?;
    // SAFETY: `regs` is the probed task's saved registers, readable here.
    let ip = unsafe { (*ctx.regs).rip };
    let key = GoAddrKey { code_len: end.wrapping_sub(start) as u32, rel: ip.wrapping_sub(start) as u32 };
    // SAFETY: copied out at once.
    let func = unsafe { GO_ADDRS.get(&key) }.copied();
    if func.is_none() {
        count(Stat::GoAddrUnknown);
    }
    func
}

#[inline(always)]
fn key(ctx: &ProbeContext, func: u32, tgid: u32) -> GoCallKey {
    // SAFETY: `regs` is the probed task's saved registers, readable here.
    let g = unsafe { (*ctx.regs).r14 };
    GoCallKey { g, func, tgid }
}

/// The function id of a probe attached with a cookie (Linux >= 5.15).
#[inline(always)]
fn cookie(ctx: &ProbeContext) -> u32 {
    // SAFETY: a plain helper call on this program's context.
    (unsafe { bpf_get_attach_cookie(ctx.as_ptr()) }) as u32
}

/// Entry of a probed Go function (Go >= 1.17 amd64 register ABI: `g` in R14,
/// the receiver or first argument in RAX). Checked on Go 1.19 (Debian's
/// containerd 1.6.20, its shim and runc 1.1.5), Go 1.25.5 (containerd 1.7.34
/// and its shim), Go 1.26.6 (containerd 2.3.4, its shim, runc 1.4.3) and the
/// fake-kubelet fixture built with Go 1.19, 1.21, 1.23, 1.25 and 1.27.
#[uprobe]
pub fn go_entry(ctx: ProbeContext) -> u32 {
    entry(&ctx, cookie(&ctx))
}

/// `go_entry` without a cookie (Linux 5.10 to 5.14). Checked on Debian's
/// 5.10.0-32 (the fake-kubelet fixture, Go 1.19; Debian's containerd 1.6.20,
/// its shim and runc 1.1.5; containerd 2.3.4 and its shim, Go 1.26.6) and,
/// forced with `--go-uprobes address`, on 6.18 (the fixture; containerd
/// 1.6.20, 1.7.34 and 2.3.4 with their shims).
#[uprobe]
pub fn go_entry_at(ctx: ProbeContext) -> u32 {
    match func_at(&ctx) {
        Some(func) => entry(&ctx, func),
        None => 0,
    }
}

#[inline(always)]
fn entry(ctx: &ProbeContext, func: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == tracer_tgid() {
        return 0;
    }
    let k = key(ctx, func, tgid);
    let receiver = receiver(ctx, k.func);
    let mut call = GoCall {
        // SAFETY: a plain helper call.
        start_ns: unsafe { bpf_ktime_get_ns() },
        receiver,
        tgid,
        tid: pid_tgid as u32,
        arg_len: 0,
        _pad: 0,
        arg: [0u8; GO_ARG_LEN],
    };
    capture_arg(ctx, k.func, &mut call);
    if GO_CALLS.insert(&k, &call, 0).is_err() {
        count(Stat::GoCallsFull);
    }
    0
}

/// A RET instruction of a probed Go function: `g` is still in R14 (the same
/// binaries and Go versions as `go_entry`).
#[uprobe]
pub fn go_ret(ctx: ProbeContext) -> u32 {
    ret(&ctx, cookie(&ctx))
}

/// `go_ret` without a cookie: a RET of a probed function, found as
/// `go_entry_at` finds its entry (the same kernels and binaries).
#[uprobe]
pub fn go_ret_at(ctx: ProbeContext) -> u32 {
    match func_at(&ctx) {
        Some(func) => ret(&ctx, func),
        None => 0,
    }
}

#[inline(always)]
fn ret(ctx: &ProbeContext, func: u32) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let k = key(ctx, func, (pid_tgid >> 32) as u32);
    // SAFETY: copied out before removal.
    let Some(call) = (unsafe { GO_CALLS.get(&k) }).copied() else { return 0 };
    let _ = GO_CALLS.remove(&k);
    let rec = GoCallEnd {
        header: EventHeader { kind: EventKind::GoCallEnd as u32, _pad: 0 },
        g: k.g,
        start_ns: call.start_ns,
        // SAFETY: a plain helper call.
        end_ns: unsafe { bpf_ktime_get_ns() },
        receiver: call.receiver,
        func: k.func,
        tgid: call.tgid,
        tid: pid_tgid as u32,
        arg_len: call.arg_len,
        arg: call.arg,
    };
    // Most calls are short and only feed the latency tables: userspace drains
    // them at its next scan without being woken. A long one may close a
    // reported stall, so it wakes userspace at once.
    let flags = if rec.end_ns.saturating_sub(rec.start_ns) >= report_min_ns() { BPF_RB_FORCE_WAKEUP } else { BPF_RB_NO_WAKEUP };
    if GO_EVENTS.output::<GoCallEnd>(&rec, flags).is_err() {
        count(Stat::GoEventsFull);
    }
    0
}

/// Entry of `runtime.goexit0(gp *g)`: the goroutine `gp` is done, and its `g`
/// goes back to the free list for reuse. It runs on g0 (`mcall` switched
/// stacks), so R14 is g0 and the dead goroutine is the argument, in RAX
/// (register ABI). Checked on Go 1.19 (Debian's containerd, its shim, runc,
/// the fake-kubelet fixture); the same signature through Go 1.26. Sent
/// without a wakeup: userspace drains it at its next scan and drops any call
/// still open on that goroutine that began before it ended.
#[uprobe]
pub fn go_exit(ctx: ProbeContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == tracer_tgid() {
        return 0;
    }
    let rec = GoExit {
        header: EventHeader { kind: EventKind::GoExit as u32, _pad: 0 },
        // SAFETY: `regs` is the probed task's saved registers, readable here.
        g: unsafe { (*ctx.regs).rax },
        // SAFETY: a plain helper call.
        exit_ns: unsafe { bpf_ktime_get_ns() },
        tgid,
        _pad: 0,
    };
    if GO_EVENTS.output::<GoExit>(&rec, BPF_RB_NO_WAKEUP).is_err() {
        count(Stat::GoEventsFull);
    }
    0
}

/// `bpf_ringbuf_output` flags (include/uapi/linux/bpf.h).
const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;

/// `sched:sched_process_exec` (format on Linux 6.18: `__data_loc char[]
/// filename` at 8, `pid_t pid` at 12, `pid_t old_pid` at 16; only the current
/// task's ids and new comm are used). Tells userspace at once that a process
/// runs a new binary, so a restarted or upgraded containerd or kubelet is
/// probed again without waiting for the next poll.
#[tracepoint]
pub fn proc_exec(_ctx: TracePointContext) -> u32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let rec = ExecEvent {
        header: EventHeader { kind: EventKind::Exec as u32, _pad: 0 },
        tgid,
        _pad: 0,
        comm: bpf_get_current_comm().unwrap_or([0u8; COMM_LEN]),
    };
    if GO_EVENTS.output::<ExecEvent>(&rec, 0).is_err() {
        count(Stat::GoEventsFull);
    }
    0
}
