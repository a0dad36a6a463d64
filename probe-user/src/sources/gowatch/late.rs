//! Go calls begun before plegwatch could see them: read from the goroutines of a
//! probed process, from outside, once its uprobes are on.
//!
//! Uprobes see calls that start after they are attached. A containerd stuck for
//! minutes, or a kubelet whose relist never returned, had its calls open long
//! before: the Status lock held by `UpdateSync`, the `ListContainers` parked
//! behind it in `RLock`, the relist waiting on that list. So once a process's
//! probes are attached, a worker thread reads its goroutines
//! ([`crate::observe::goroutines`]: `/proc/PID/mem`, no signal, no ptrace stop),
//! unwinds each parked goroutine and each one in a system call, and names the
//! probed functions on its stack. Each is an open call, as the uprobe at its
//! entry would have recorded it; the loop puts it in the kernel's `GO_CALLS` map
//! ([`super::GoWatch::on_late`]), so that the probe at its RET closes it like any
//! other.
//!
//! What the entry probe would have read is recovered where Go's register ABI
//! left it in memory: a register argument that is live across a call is spilled
//! to its slot in the caller's frame, the first word above the return address.
//! - `(*statusStorage).Update`/`UpdateSync(s, u)` (containerd): `s` (the lock) is
//!   live across `u()`, so it sits at the frame's argument slot 0.
//! - A holder whose lock is a field of an argument ([`Recv`]; CRI-O's
//!   `(*runtimeOCI).UpdateContainer(r, ctx, c, res)` holding `c.opLock`): the
//!   argument in register `reg` sits at slot `reg` (each argument before it is one
//!   or two whole words in integer registers, so register and slot indices agree;
//!   checked on crio 1.35.6, whose prologue stores RDI at slot 3), and the lock is
//!   that pointer plus the field's offset.
//! - A goroutine parked on a lock's semaphore: `runtime.semacquire1(addr, …)` keeps
//!   `addr` across its park, at its argument slot 0. The lock is `addr` less the
//!   semaphore's offset in `sync.RWMutex` ([`sem_off`]: `readerSem` for a reader,
//!   `writerSem` or the inner mutex's `sema` for a writer).
//!
//! - A call's string argument (the container a CRI handler or a shim task is for): the
//!   pointer in register `reg` is at slot `reg` when the function keeps it across a
//!   call, as the lock's argument above is; the `string` header sits `off` into what it
//!   points to, as the entry probe reads it ([`arg_of`]). Checked on crio 1.35.6, whose
//!   `(*Server).UpdateContainerResources(s, ctx, req)` keeps `req` at slot 3.
//!
//! Each value is checked against the lock itself: a `sync.RWMutex` held for
//! writing has a negative `readerCount`. A value that fails is not used (the
//! lock is then unknown, and the link to its holder is not made). A string is
//! taken only when its length fits what the entry probe keeps and every byte is a
//! hex digit, as container and sandbox ids are (a slot the function never wrote
//! holds whatever was there).
//!
//! A call's start is unknown. The goroutine's `waitsince` (what a goroutine
//! dump's "[semacquire, 3 minutes]" shows) is used where the runtime set it: a
//! GC's mark stamps a goroutine it finds parked with the previous cycle's mark
//! start, so it may read up to one GC interval before the real park. Where it is
//! not set, the start is when the scan found it, and the age is said to be
//! unknown ([`StartTiming::Unknown`]). Calls on one goroutine keep their order:
//! each outer one is given a start one nanosecond per frame earlier.

use super::targets::{sem_off, Recv, Role};
use crate::clock::monotonic_ns;
use crate::events::GoroutineScan;
use crate::graph::model::StartTiming;
use crate::observe::goroutines::{Goroutine, GoroutineReader};
use crate::proto::gosym::{AllGs, GLayout, GStatus, GoSymbols};
use plegwatch_abi::GO_ARG_LEN;
use std::{
    collections::HashMap,
    os::unix::fs::MetadataExt as _,
    sync::{mpsc, Arc},
    time::Instant,
};

/// Offset of `readerCount` in Go's `sync.RWMutex` (`w` 8 bytes, `writerSem`,
/// `readerSem`, then `readerCount`: Go 1.9 to 1.27).
pub const READER_COUNT_OFF: u64 = 16;

/// Binaries whose goroutine list was located, kept by the worker.
const CACHED_BINARIES: usize = 16;

/// A probed function of the binary a process runs.
#[derive(Clone, Debug)]
pub struct LateFunc {
    pub id: u32,
    pub symbol: &'static str,
    pub role: Role,
    /// Where its lock is, when not its first argument itself (a [`Role::LockHold`]).
    pub recv: Option<Recv>,
    /// Its string argument's register and the `string` header's offset in what that
    /// register points to (resolved for this binary), as the entry probe reads it.
    pub arg: Option<(u32, u32)>,
}

/// A process to read.
#[derive(Clone, Debug)]
pub struct Job {
    pub pid: u32,
    pub target: &'static str,
    pub funcs: Vec<LateFunc>,
    /// The binary's tables, when the attacher still holds them: not parsed again (a
    /// containerd's parse took seconds of a 6.12 guest's 22 s scan under emulation).
    pub syms: Option<Arc<GoSymbols>>,
}

/// A probed call found open on a goroutine.
#[derive(Clone, Debug, PartialEq)]
pub struct LateCall {
    pub g: u64,
    pub func: u32,
    pub role: Role,
    /// The thread, for a goroutine in a system call; else the process.
    pub tid: u32,
    pub start_ns: u64,
    pub timing: StartTiming,
    /// What the entry probe reads (the lock, or `&rw.readerSem`), 0 when unknown.
    pub receiver: u64,
    /// Its string argument (a container id), empty when unknown.
    pub arg: Vec<u8>,
}

/// What reading one process gave.
#[derive(Debug)]
pub struct Found {
    pub pid: u32,
    pub event: GoroutineScan,
    pub calls: Vec<LateCall>,
    /// Threads in a system call, with the goroutine they run and its `waitsince` (a GC
    /// stamps goroutines it finds in a system call too).
    pub threads: Vec<(u32, u64, Option<u64>)>,
    /// The goroutines the calls were found on, as read (to check again once the
    /// calls are in the kernel's map).
    pub parked: Vec<Goroutine>,
    pub reader: Option<GoroutineReader>,
}

/// Whether the `sync.RWMutex` at `lock` is held (or wanted) for writing: its
/// `readerCount` is negative. A lock is 4-byte aligned (its fields are 32-bit; inside a
/// struct it need not be 8-byte aligned).
pub fn writer_holds(read_word: &dyn Fn(u64) -> Option<u64>, lock: u64) -> bool {
    lock != 0 && lock.is_multiple_of(4) && read_word(lock + READER_COUNT_OFF).is_some_and(|w| (w as u32 as i32) < 0)
}

/// Whether the `sync.Mutex` at `lock` is locked: bit 0 (`mutexLocked`) of its `state`,
/// its first word. An `RWMutex`'s writer mutex (`w`, first in it) is one too.
pub fn mutex_locked(read_word: &dyn Fn(u64) -> Option<u64>, lock: u64) -> bool {
    lock != 0 && lock.is_multiple_of(4) && read_word(lock).is_some_and(|w| w & 1 == 1)
}

/// The frames (index, function) of `names` (innermost first) that are probed.
pub fn probed_frames<'a>(names: &[&str], funcs: &'a [LateFunc]) -> Vec<(usize, &'a LateFunc)> {
    names.iter().enumerate().filter_map(|(i, n)| funcs.iter().find(|f| f.symbol == *n).map(|f| (i, f))).collect()
}

/// The receiver of the probed call at frame `i` (see the module doc): `names`
/// innermost first, `cfa(j)` the address of frame `j`'s argument slots (the caller's
/// SP), `read_word` the process's memory. 0 when not found or not confirmed. For a
/// [`Role::LockWait`] it is the semaphore's address, as the entry probe reads it.
pub fn receiver_of(
    f: &LateFunc,
    i: usize,
    names: &[&str],
    cfa: &dyn Fn(usize) -> Option<u64>,
    read_word: &dyn Fn(u64) -> Option<u64>,
) -> u64 {
    let slot = |j: usize, k: u32| cfa(j).and_then(|a| read_word(a + 8 * u64::from(k)));
    match f.role {
        Role::LockHold => {
            let (reg, off) = f.recv.map_or((0, 0), |r| (r.reg, r.off));
            let held = |l: &u64| if f.recv.is_some_and(Recv::is_mutex) { mutex_locked(read_word, *l) } else { writer_holds(read_word, *l) };
            slot(i, reg).map(|p| p.wrapping_add(u64::from(off))).filter(held).unwrap_or(0)
        }
        Role::LockWait => {
            let inner = i.checked_sub(1).filter(|j| names.get(*j) == Some(&"runtime.semacquire1"));
            let candidates = inner.into_iter().chain(std::iter::once(i));
            let off = sem_off(f.symbol);
            // A `sync.Mutex`'s semaphore (4 into it): a plain mutex, or an RWMutex's writer
            // mutex; either way that mutex is locked.
            let held = |sem: &u64| {
                if off == 4 {
                    mutex_locked(read_word, sem.wrapping_sub(off))
                } else {
                    writer_holds(read_word, sem.wrapping_sub(off))
                }
            };
            candidates.filter_map(|j| slot(j, 0)).find(held).unwrap_or(0)
        }
        _ => 0,
    }
}

/// The string argument of the probed call at frame `i` (see the module doc): the
/// pointer at its slot `reg`, the `string` header `off` into what it points to, and its
/// bytes; empty when any read fails, the length is 0 or over [`GO_ARG_LEN`], or a byte
/// is not a hex digit (every argument read is a container or sandbox id: 64 of them).
pub fn arg_of(
    f: &LateFunc,
    i: usize,
    cfa: &dyn Fn(usize) -> Option<u64>,
    read_word: &dyn Fn(u64) -> Option<u64>,
    read_bytes: &dyn Fn(u64, usize) -> Option<Vec<u8>>,
) -> Vec<u8> {
    let Some((reg, off)) = f.arg else { return Vec::new() };
    let read = || {
        let ptr = cfa(i).and_then(|a| read_word(a + 8 * u64::from(reg))).filter(|p| *p != 0)?;
        let header = ptr.checked_add(u64::from(off))?;
        let (data, len) = (read_word(header)?, read_word(header + 8)?);
        let len = usize::try_from(len).ok().filter(|l| (1..=GO_ARG_LEN).contains(l))?;
        read_bytes(data, len).filter(|b| b.iter().all(u8::is_ascii_hexdigit))
    };
    read().unwrap_or_default()
}

/// Where `pid`'s binary keeps its goroutines, per binary.
type Located = Result<(Arc<GoSymbols>, AllGs, String, &'static GLayout), String>;

/// Reads one process (on the worker thread).
pub fn read_process(job: &Job, cache: &mut HashMap<(u64, u64), Located>) -> Found {
    let started = Instant::now();
    let mut event = GoroutineScan {
        target: job.target.to_string(),
        pid: job.pid,
        go_version: None,
        goroutines: 0,
        open_calls: 0,
        in_syscall: 0,
        inconsistent: 0,
        took_ms: 0.0,
        error: None,
    };
    let mut found = Found { pid: job.pid, event: event.clone(), calls: Vec::new(), threads: Vec::new(), parked: Vec::new(), reader: None };
    let fail = |mut event: GoroutineScan, e: String, mut found: Found| {
        event.error = Some(e);
        event.took_ms = started.elapsed().as_secs_f64() * 1e3;
        found.event = event;
        found
    };
    let exe = format!("/proc/{}/exe", job.pid);
    let key = match std::fs::metadata(&exe) {
        Ok(m) => (m.dev(), m.ino()),
        Err(e) => return fail(event, format!("{exe}: {e}"), found),
    };
    if !cache.contains_key(&key) {
        if cache.len() >= CACHED_BINARIES {
            cache.clear();
        }
        let located = crate::observe::ustack::map_file(&exe).map_err(|e| format!("{exe}: {e}")).and_then(|data| {
            let syms = match &job.syms {
                Some(shared) => shared.clone(),
                None => Arc::new(GoSymbols::from_elf_named(&data, &exe).map_err(|e| e.to_string())?),
            };
            let (vars, version, layout) = GoroutineReader::locate(&syms, &data).map_err(|e| e.to_string())?;
            Ok((syms, vars, version, layout))
        });
        tracing::debug!(
            pid = job.pid,
            shared = job.syms.is_some(),
            took_ms = started.elapsed().as_secs_f64() * 1e3,
            "goroutine reader: binary located"
        );
        cache.insert(key, located);
    }
    let (syms, vars, version, layout) = match cache.get(&key) {
        Some(Ok(l)) => l.clone(),
        Some(Err(e)) => return fail(event, e.clone(), found),
        None => return fail(event, "not located".into(), found),
    };
    event.go_version = Some(version.clone());
    let reader = match GoroutineReader::with_vars(job.pid, &syms, vars, version, layout, key) {
        Ok(r) => r,
        Err(e) => return fail(event, e.to_string(), found),
    };
    let scan = match reader.scan() {
        Ok(s) => s,
        Err(e) => return fail(event, e.to_string(), found),
    };
    let scanned_ms = started.elapsed().as_secs_f64() * 1e3;
    let found_ns = monotonic_ns();
    let threads = reader.threads_in_syscall();
    let read_word = |a: u64| reader.read_word(a);
    let read_bytes = |a: u64, n: usize| reader.read_bytes(a, n);
    for g in &scan.goroutines {
        if !matches!(g.status, GStatus::Waiting | GStatus::Syscall) {
            continue;
        }
        let Some((unwound, tid)) = reader.stack(g, &syms, &threads) else { continue };
        if let Some(t) = tid {
            found.threads.push((t, g.g, g.waitsince_ns));
        }
        let names = unwound.names();
        let probed = probed_frames(&names, &job.funcs);
        if probed.is_empty() {
            continue;
        }
        let cfa = |j: usize| unwound.frames.get(j + 1).map(|f| f.sp);
        let (base, timing) = match g.waitsince_ns {
            Some(since) => (since, StartTiming::Waitsince),
            None => (found_ns, StartTiming::Unknown),
        };
        for (i, f) in probed {
            found.calls.push(LateCall {
                g: g.g,
                func: f.id,
                role: f.role,
                tid: tid.unwrap_or(job.pid),
                start_ns: base.saturating_sub(i as u64),
                timing,
                receiver: receiver_of(f, i, &names, &cfa, &read_word),
                arg: arg_of(f, i, &cfa, &read_word, &read_bytes),
            });
        }
        found.parked.push(g.clone());
    }
    event.goroutines = scan.goroutines.len();
    event.open_calls = found.calls.len();
    event.in_syscall = found.threads.len();
    event.inconsistent = scan.inconsistent;
    event.took_ms = started.elapsed().as_secs_f64() * 1e3;
    tracing::debug!(pid = job.pid, scanned_ms, took_ms = event.took_ms, "goroutine reader: stacks unwound");
    found.event = event;
    found.reader = Some(reader);
    found
}

/// The worker thread and its two channels.
#[derive(Debug)]
pub struct LateScanner {
    jobs: mpsc::Sender<Job>,
    done: tokio::sync::mpsc::UnboundedReceiver<Found>,
}

impl LateScanner {
    /// Starts the worker; it ends when the scanner is dropped.
    pub fn start() -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = tokio::sync::mpsc::unbounded_channel();
        // A process's goroutines are read in bulk: `heap::jobs` gives the buffers back
        // once the worker is idle.
        std::thread::Builder::new().name("go-goroutines".into()).spawn(move || {
            let mut cache = HashMap::new();
            crate::heap::jobs(&rx, |job| tx.send(read_process(&job, &mut cache)).is_ok())
        })?;
        Ok(LateScanner { jobs, done })
    }

    /// Queues a process; false if the worker is gone.
    pub fn submit(&self, job: Job) -> bool {
        self.jobs.send(job).is_ok()
    }

    /// The next process read (for a `select!` branch); pending for ever once the
    /// worker is gone.
    pub async fn next(&mut self) -> Found {
        match self.done.recv().await {
            Some(d) => d,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gowatch::targets::FoundIn;

    fn funcs() -> Vec<LateFunc> {
        vec![
            LateFunc { id: 1, symbol: "pkg.(*statusStorage).UpdateSync", role: Role::LockHold, recv: None, arg: None },
            LateFunc { id: 2, symbol: "sync.runtime_SemacquireRWMutexR", role: Role::LockWait, recv: None, arg: None },
            LateFunc { id: 3, symbol: "pkg.(*criService).ListContainers", role: Role::CriHandler, recv: None, arg: None },
        ]
    }

    fn func(symbol: &'static str, role: Role) -> LateFunc {
        LateFunc { id: 9, symbol, role, recv: None, arg: None }
    }

    /// A tiny memory: address → word.
    fn mem(words: &[(u64, u64)]) -> impl Fn(u64) -> Option<u64> + '_ {
        move |a| words.iter().find(|(at, _)| *at == a).map(|(_, w)| *w)
    }

    const HELD: u64 = (-(1i64 << 30) as i32) as u32 as u64;

    #[test]
    fn names_the_probed_frames_innermost_first() {
        let names = [
            "runtime.gopark",
            "runtime.semacquire1",
            "sync.runtime_SemacquireRWMutexR",
            "sync.(*RWMutex).RLock",
            "pkg.(*criService).ListContainers",
            "runtime.goexit",
        ];
        let f = funcs();
        let p: Vec<(usize, u32)> = probed_frames(&names, &f).into_iter().map(|(i, f)| (i, f.id)).collect();
        assert_eq!(p, vec![(2, 2), (4, 3)]);
    }

    #[test]
    fn a_parked_readers_semaphore_comes_from_semacquire1s_spill_slot_and_is_checked() {
        let names = ["runtime.gopark", "runtime.semacquire1", "sync.runtime_SemacquireRWMutexR", "pkg.Get"];
        // Frame j's argument slots start at frame j+1's SP.
        let sps = [0x1000u64, 0x1100, 0x1200, 0x1300];
        let cfa = |j: usize| sps.get(j + 1).copied();
        let lock = 0xc000_0100u64;
        let sem = lock + 12;
        // semacquire1's slot 0 (at frame 2's SP) holds &readerSem; the lock is write-held.
        let m = [(0x1200, sem), (lock + READER_COUNT_OFF, HELD)];
        let reader = func("sync.runtime_SemacquireRWMutexR", Role::LockWait);
        assert_eq!(receiver_of(&reader, 2, &names, &cfa, &mem(&m)), sem);
        // Not held for writing: not believed.
        let m = [(0x1200, sem), (lock + READER_COUNT_OFF, 3)];
        assert_eq!(receiver_of(&reader, 2, &names, &cfa, &mem(&m)), 0);
        // Nothing readable: unknown.
        assert_eq!(receiver_of(&reader, 2, &names, &cfa, &mem(&[])), 0);
    }

    #[test]
    fn a_parked_writers_semaphore_is_checked_against_its_own_offset() {
        let names = ["runtime.gopark", "runtime.semacquire1", "internal/sync.runtime_SemacquireMutex", "pkg.Stats"];
        let sps = [0x1000u64, 0x1100, 0x1200, 0x1300];
        let cfa = |j: usize| sps.get(j + 1).copied();
        let lock = 0xc000_0100u64;
        // A writer waiting behind another writer parks on the inner mutex's sema (+4).
        // The RWMutex's writer mutex `w` (first in it) is locked: state = locked | a waiter.
        let m = [(0x1200, lock + 4), (lock, 0b1001), (lock + READER_COUNT_OFF, HELD)];
        let writer = func("internal/sync.runtime_SemacquireMutex", Role::LockWait);
        assert_eq!(receiver_of(&writer, 2, &names, &cfa, &mem(&m)), lock + 4);
        // A plain sync.Mutex (CRI-O's NRI lock) the same: its state is locked.
        let m = [(0x1200, lock + 4), (lock, 0b1001)];
        assert_eq!(receiver_of(&writer, 2, &names, &cfa, &mem(&m)), lock + 4);
        // Unlocked (its holder let go since): not believed.
        let m = [(0x1200, lock + 4), (lock, 0b1000), (lock + READER_COUNT_OFF, HELD)];
        assert_eq!(receiver_of(&writer, 2, &names, &cfa, &mem(&m)), 0);
        let m = [(0x1200, lock + 4), (lock, 0b1001), (lock + READER_COUNT_OFF, HELD)];
        // Read as a reader's semaphore (+12) the same word points at no held lock.
        let reader = func("sync.runtime_SemacquireRWMutexR", Role::LockWait);
        assert_eq!(receiver_of(&reader, 2, &names, &cfa, &mem(&m)), 0);
        // A writer waiting for readers to leave parks on writerSem (+8).
        let m = [(0x1200, lock + 8), (lock + READER_COUNT_OFF, HELD)];
        assert_eq!(receiver_of(&func("sync.runtime_SemacquireRWMutex", Role::LockWait), 2, &names, &cfa, &mem(&m)), lock + 8);
    }

    #[test]
    fn a_holders_lock_comes_from_its_own_spill_slot() {
        let names = ["runtime.gopark", "pkg.(*statusStorage).UpdateSync", "pkg.UpdateContainerResources"];
        let sps = [0x2000u64, 0x2100, 0x2200];
        let cfa = |j: usize| sps.get(j + 1).copied();
        let lock = 0xc000_0200u64;
        let m = [(0x2200, lock), (lock + READER_COUNT_OFF, HELD)];
        let holder = func("pkg.(*statusStorage).UpdateSync", Role::LockHold);
        assert_eq!(receiver_of(&holder, 1, &names, &cfa, &mem(&m)), lock);
        // An unaligned or unheld value is no lock.
        let m = [(0x2200, lock + 1), (lock + 1 + READER_COUNT_OFF, HELD)];
        assert_eq!(receiver_of(&holder, 1, &names, &cfa, &mem(&m)), 0);
        // Other roles read nothing.
        assert_eq!(receiver_of(&func("pkg.ListContainers", Role::CriHandler), 2, &names, &cfa, &mem(&m)), 0);
    }

    #[test]
    fn a_holders_lock_inside_an_argument_comes_from_that_arguments_slot() {
        // crio's (*runtimeOCI).UpdateContainer(r, ctx, c, res): c in RDI (register 3) is
        // stored at slot 3; the opLock is c + 0xd0.
        let names = ["runtime.gopark", "oci.(*runtimeOCI).UpdateContainer", "server.(*Server).UpdateContainerResources"];
        let sps = [0x2000u64, 0x2100, 0x2200];
        let cfa = |j: usize| sps.get(j + 1).copied();
        let c = 0xc000_4000u64;
        let lock = c + 0xd0;
        let recv = Recv { reg: 3, off: 0xd0, found_in: FoundIn::RLock("oci.(*Container).State"), lock: ("opLock", "sync.RWMutex") };
        let holder = LateFunc { id: 4, symbol: "oci.(*runtimeOCI).UpdateContainer", role: Role::LockHold, recv: Some(recv), arg: None };
        let m = [(0x2200, 0xc000_9000), (0x2218, c), (lock + READER_COUNT_OFF, HELD)];
        assert_eq!(receiver_of(&holder, 1, &names, &cfa, &mem(&m)), lock);
        // Slot 0 (the runtime) plus the offset is not a held lock: with no Recv, nothing.
        assert_eq!(receiver_of(&LateFunc { recv: None, ..holder.clone() }, 1, &names, &cfa, &mem(&m)), 0);
        // The container's lock not held (its update returned): not believed.
        let m = [(0x2218, c), (lock + READER_COUNT_OFF, 1)];
        assert_eq!(receiver_of(&holder, 1, &names, &cfa, &mem(&m)), 0);
    }

    #[test]
    fn a_mutex_holders_lock_is_believed_when_its_state_says_locked() {
        // crio's (*local).syncPlugin(l, ctx, syncFn): l in RAX, kept at slot 0; the NRI
        // lock is l itself (its embedded sync.Mutex).
        let names = ["runtime.gopark", "nri.(*local).syncPlugin"];
        let sps = [0x3000u64, 0x3100, 0x3200];
        let cfa = |j: usize| sps.get(j + 1).copied();
        let l = 0xc000_8000u64;
        let recv = Recv { reg: 0, off: 0, found_in: FoundIn::Lock("nri.(*local).syncPlugin"), lock: ("NRI lock", "sync.Mutex") };
        let holder = LateFunc { id: 5, symbol: "nri.(*local).syncPlugin", role: Role::LockHold, recv: Some(recv), arg: None };
        assert_eq!(receiver_of(&holder, 1, &names, &cfa, &mem(&[(0x3200, l), (l, 1)])), l);
        // Unlocked: not believed, whatever an RWMutex's reader count would say there.
        assert_eq!(receiver_of(&holder, 1, &names, &cfa, &mem(&[(0x3200, l), (l, 0), (l + READER_COUNT_OFF, HELD)])), 0);
    }

    /// A handler's container id, from the request its frame keeps at slot 3: taken when
    /// it reads as hex digits of a length the entry probe keeps, else nothing.
    #[test]
    fn a_handlers_container_id_comes_from_its_requests_slot_and_is_checked() {
        let handler = LateFunc { arg: Some((3, 40)), ..func("server.(*Server).UpdateContainerResources", Role::CriHandler) };
        let sps = [0x1000u64, 0x1100];
        let cfa = |j: usize| sps.get(j + 1).copied();
        let (req, data) = (0xc000_2000u64, 0xc000_3000u64);
        let id = b"4f1c0e2a9b7d4a6f8e3c1b2a0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e";
        let words = |len: u64| vec![(0x1100 + 8 * 3, req), (req + 40, data), (req + 48, len)];
        let bytes = |text: &'static [u8]| move |a: u64, n: usize| (a == data && n <= text.len()).then(|| text[..n].to_vec());
        let m = words(64);
        assert_eq!(arg_of(&handler, 0, &cfa, &mem(&m), &bytes(id)), id.to_vec());
        // Garbage where the string should be, a length 0 or past what is kept: nothing.
        assert!(
            arg_of(&handler, 0, &cfa, &mem(&m), &bytes(b"4f1c\x1b[2Jrest-of-it-is-not-an-id-at-all-and-is-long-enough-to-read")).is_empty()
        );
        // A path (printable, not an id).
        assert!(
            arg_of(&handler, 0, &cfa, &mem(&m), &bytes(b"/run/containerd/io.containerd.runtime.v2.task/k8s.io/4f1c0e2a9b7d")).is_empty()
        );
        assert!(arg_of(&handler, 0, &cfa, &mem(&words(0)), &bytes(id)).is_empty());
        assert!(arg_of(&handler, 0, &cfa, &mem(&words(65)), &bytes(id)).is_empty());
        // No argument to read, or an empty slot.
        assert!(arg_of(&LateFunc { arg: None, ..handler.clone() }, 0, &cfa, &mem(&m), &bytes(id)).is_empty());
        assert!(arg_of(&handler, 0, &cfa, &mem(&[]), &bytes(id)).is_empty());
    }
}
