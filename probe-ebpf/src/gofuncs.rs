//! Go function timing on stripped binaries: a uprobe at each function's entry
//! and at every RET instruction in it (never a uretprobe: those crash Go when a
//! goroutine's stack moves). Userspace finds both in `.gopclntab` and decodes
//! the RETs; the attach cookie names the function.
//!
//! Calls are keyed by goroutine: under Go's register ABI (Go >= 1.17, amd64)
//! R14 holds the current `g` at function entry and at return.

use aya_ebpf::{
    EbpfContext as _,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, generated::bpf_get_attach_cookie},
    macros::{map, uprobe},
    maps::{HashMap, RingBuf},
    programs::ProbeContext,
};
use plegwatch_abi::{EventHeader, EventKind, GoCall, GoCallEnd, GoCallKey, Stat};

use crate::waits::{count, tracer_tgid};

#[map]
static GO_CALLS: HashMap<GoCallKey, GoCall> = HashMap::with_max_entries(16_384, 0);
#[map]
static GO_EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

#[inline(always)]
fn key(ctx: &ProbeContext) -> GoCallKey {
    // SAFETY: a plain helper call on this program's context.
    let func = unsafe { bpf_get_attach_cookie(ctx.as_ptr()) } as u32;
    // SAFETY: `regs` is the probed task's saved registers, readable here.
    let g = unsafe { (*ctx.regs).r14 };
    GoCallKey { g, func, _pad: 0 }
}

/// Entry of a probed Go function (Go >= 1.17 amd64 register ABI: `g` in R14,
/// the receiver or first argument in RAX). Checked on Go 1.19 (Debian's
/// containerd 1.6.20, and the fake-kubelet fixture).
#[uprobe]
pub fn go_entry(ctx: ProbeContext) -> u32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == tracer_tgid() {
        return 0;
    }
    let k = key(&ctx);
    // SAFETY: as above.
    let receiver = unsafe { (*ctx.regs).rax };
    // SAFETY: a plain helper call.
    let call = GoCall { start_ns: unsafe { bpf_ktime_get_ns() }, receiver, tgid, tid: pid_tgid as u32 };
    if GO_CALLS.insert(&k, &call, 0).is_err() {
        count(Stat::InflightFull);
    }
    0
}

/// A RET instruction of a probed Go function: `g` is still in R14.
#[uprobe]
pub fn go_ret(ctx: ProbeContext) -> u32 {
    let k = key(&ctx);
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
        tid: bpf_get_current_pid_tgid() as u32,
        _pad: 0,
    };
    if GO_EVENTS.output::<GoCallEnd>(&rec, 0).is_err() {
        count(Stat::RingbufFull);
    }
    0
}
