//! One `runtime.g` as read from another process's memory, decoded with a Go
//! version's layout and checked: a read of a running process's memory can be
//! torn, so every value that cannot be a goroutine's is refused, never
//! trusted. Pure: the bytes and the clock are passed in.

use super::gstruct::GLayout;
use super::GStatus;

/// One goroutine as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Goroutine {
    /// Where its `g` is in the process.
    pub g: u64,
    /// `goid`: the number a goroutine dump prints.
    pub goid: u64,
    /// Its status (`_Gscan` bit removed).
    pub status: GStatus,
    /// True if the GC was scanning its stack (`_Gscan` set).
    pub scanning: bool,
    /// Why it is parked, named for this Go version (`chan receive`,
    /// `semacquire`, `sync.RWMutex.RLock`, …); only for a waiting goroutine.
    pub wait_reason: Option<&'static str>,
    /// `waitsince`: the runtime's `nanotime()` (`CLOCK_MONOTONIC` ns),
    /// "approx time when the g became blocked"; `None` when the runtime has
    /// not set it (the age is then unknown). Only a GC's mark sets it, on a
    /// goroutine it finds parked with none, and to the end of the
    /// *previous* cycle's mark (`work.tstart`, 0 before a first cycle ends,
    /// so the first cycle sets nothing). So the goroutine was parked by the
    /// end of the cycle that set it, and `now - waitsince` may exceed its
    /// real wait by up to one GC interval: what a goroutine dump's
    /// "[semacquire, 3 minutes]" shows, with the same slack. Cleared when it
    /// runs again.
    pub waitsince_ns: Option<u64>,
    /// Saved registers (`sched`): valid while the goroutine is not running.
    pub pc: u64,
    pub sp: u64,
    pub bp: u64,
    /// `stack.lo`, `stack.hi`.
    pub stack: (u64, u64),
    /// Its M (`*m`): non-zero while running or in a system call.
    pub m: u64,
}

/// Why a `g` read did not make sense (a torn read, or not a `g`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inconsistent(pub &'static str);

/// Decodes and checks one `g` read as `buf` (at least [`GLayout::span`]
/// bytes) from address `g`; `now` is `CLOCK_MONOTONIC` in ns. Pure, for
/// tests: `Ok(None)` for a dead descriptor, `Err` for values that cannot
/// be a goroutine's (a torn read), naming the first that was wrong.
pub fn decode_g(layout: &GLayout, g: u64, buf: &[u8], now: u64) -> Result<Option<Goroutine>, Inconsistent> {
    let short = Inconsistent("the read is shorter than the layout");
    let u64_at = |off: u64| -> Result<u64, Inconsistent> {
        let o = off as usize;
        buf.get(o..o + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes).ok_or(short)
    };
    let o = layout.atomicstatus as usize;
    let raw_status = buf.get(o..o + 4).and_then(|b| b.try_into().ok()).map(u32::from_le_bytes).ok_or(short)?;
    let status = GStatus::from_raw(raw_status).ok_or(Inconsistent("atomicstatus is no status"))?;
    if status.is_dead() {
        return Ok(None);
    }
    let goid = u64_at(layout.goid)?;
    let (lo, hi) = (u64_at(layout.stack_lo)?, u64_at(layout.stack_lo + 8)?);
    let sp = u64_at(layout.sched_sp)?;
    let pc = u64_at(layout.sched_pc)?;
    // goid 0 is only ever the g0s, which are not in allgs.
    if goid == 0 || goid > 1 << 62 {
        return Err(Inconsistent("goid out of range"));
    }
    if lo >= hi || hi - lo > 1 << 30 {
        return Err(Inconsistent("stack bounds"));
    }
    // A parked goroutine's saved sp is on its own stack, and its pc is set.
    if matches!(status, GStatus::Waiting | GStatus::Runnable | GStatus::Preempted) && (sp < lo || sp > hi || pc == 0) {
        return Err(Inconsistent("saved sp off its stack, or no saved pc"));
    }
    let reason_raw = *buf.get(layout.waitreason as usize).ok_or(short)?;
    let wait_reason = match status {
        GStatus::Waiting => Some(layout.wait_reason(reason_raw).ok_or(Inconsistent("waitreason unknown to this version"))?),
        _ => None,
    };
    let since = u64_at(layout.waitsince)? as i64;
    let waitsince_ns = (since > 0 && (since as u64) <= now).then_some(since as u64);
    Ok(Some(Goroutine {
        g,
        goid,
        status,
        scanning: raw_status & super::gstruct::G_SCAN != 0,
        wait_reason,
        waitsince_ns,
        pc,
        sp,
        bp: u64_at(layout.sched_bp)?,
        stack: (lo, hi),
        m: u64_at(layout.m)?,
    }))
}
