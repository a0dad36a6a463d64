//! Go function timing on stripped binaries: kubelet's relist clock,
//! containerd's CRI Status lock and handlers, the shim's task calls.
//!
//! [`attach`] finds the binaries and puts a uprobe at the entry and at every
//! RET of each function in [`targets`] (see `probe-ebpf/src/gofuncs.rs`);
//! calls are keyed by process and goroutine. Calls still open past the
//! thresholds are stalls:
//! - `pleg_relist`: a relist still running; its wait is the time since that
//!   relist started, kubelet's own clock (`relistTime` is stamped at the start);
//! - `go_lock`: containerd's Status write lock held by `Update`/`UpdateSync`,
//!   with the `Get`s waiting on it and what the holder waits on ([`chain`]);
//! - `cri_call`: a CRI handler still running (with the lock it waits on);
//! - `go_call`: a shim task call or a runc systemd call still running.
//!
//! Every call that returns goes into the latency tables.

pub mod attach;
pub mod inspector;
pub mod late;
pub mod targets;
pub mod thread_waits;

use crate::{
    clock::wall_of,
    events::{Event, Stall},
    graph::{
        model::{OpenWait, StartTiming, WaitKey, Who},
        resolvers::{CallRole, GoCallFact, GoFacts},
    },
    kernel::loader::{take_map, WatchError},
    latency::{LatencyRow, LatencyTables},
    levels::Thresholds,
    observe::procfs,
    sources::inflight::{Action, Filter, Item, Registry},
    syscalls::WaitKind,
};
use attach::Attacher;
pub use attach::GoUprobes;
use aya::{
    maps::{HashMap as BpfHashMap, MapData},
    Ebpf,
};
use plegwatch_abi::{go_maps, GoCall, GoCallEnd, GoCallKey, Record};
use serde_json::{json, Value};
use std::{collections::HashMap, path::PathBuf, time::Duration};
use targets::{arg_text, parks_a_writer, sem_off, short, Role, READER_SEM_OFF};
use thread_waits::{container_of, KernelWaits};

/// An open Go call: the registry's item for kinds `pleg_relist`, `go_lock`,
/// `cri_call` and `go_call`.
#[derive(Clone, Debug, PartialEq)]
pub struct GoOpen {
    pub g: u64,
    pub func: u32,
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
    pub start_ns: u64,
    /// The receiver (RAX at entry): for the Status store, the lock's address.
    pub receiver: u64,
    /// The captured string argument (a container id), if it looked like one.
    pub arg: Option<String>,
    /// How exact `start_ns` is: `Exact` from the entry probe; otherwise found open by
    /// the goroutine scan (see [`late`]).
    pub start: StartTiming,
}

impl GoOpen {
    fn new(g: u64, func: u32, call: &GoCall) -> Self {
        GoOpen {
            g,
            func,
            tgid: call.tgid,
            tid: call.tid,
            comm: procfs::comm(call.tgid).unwrap_or_default(),
            start_ns: call.start_ns,
            receiver: call.receiver,
            arg: captured(&call.arg, call.arg_len),
            start: StartTiming::Exact,
        }
    }
}

/// A Go call's place: (process, goroutine, function id), as the kernel's
/// [`GoCallKey`]. Goroutine addresses repeat across processes and function ids
/// are per binary, so the process is part of it. One call at a time has it.
pub type CallKey = (u32, u64, u32);

/// One Go call: its [`CallKey`] and its start (ns). kubelet relists on one long-lived
/// goroutine, so every relist has the same place: only the start tells two stalls of it
/// apart, each with its own wait id and its own exact end.
pub type GoKey = (u32, u64, u32, u64);

/// The registry key of a call's end record.
fn end_key(rec: &GoCallEnd) -> GoKey {
    (rec.tgid, rec.g, rec.func, rec.start_ns)
}

/// The place of a call's end record.
fn end_place(rec: &GoCallEnd) -> CallKey {
    (rec.tgid, rec.g, rec.func)
}

fn captured(arg: &[u8], len: u32) -> Option<String> {
    arg.get(..len as usize).and_then(arg_text)
}

impl Item for GoOpen {
    type Key = GoKey;
    fn key(&self) -> Self::Key {
        (self.tgid, self.g, self.func, self.start_ns)
    }
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn tid(&self) -> u32 {
        self.tid
    }
    fn comm(&self) -> &str {
        &self.comm
    }
    fn start_ns(&self) -> u64 {
        self.start_ns
    }
    fn refresh(&mut self, _newer: &Self) {}
    fn wait_key(&self) -> WaitKey {
        WaitKey::Go { tgid: self.tgid, g: self.g, func: self.func, start_ns: self.start_ns }
    }
}

/// Goroutines that ended lately: (tgid, g) → when. A `g` is reused for new
/// goroutines, so only calls that began before its end are its orphans; kept
/// a few scans, bounded.
#[derive(Debug, Default)]
pub struct GoExits {
    ended: HashMap<(u32, u64), u64>,
}

impl GoExits {
    /// How long an end is kept: longer than a scan, so every call open then is judged.
    const KEEP_NS: u64 = 5_000_000_000;
    const MAX: usize = 65_536;

    pub fn note(&mut self, tgid: u32, g: u64, exit_ns: u64) {
        if self.ended.len() >= Self::MAX {
            let newest = self.ended.values().copied().max().unwrap_or(exit_ns);
            self.ended.retain(|_, t| newest.saturating_sub(*t) < Self::KEEP_NS / 5);
        }
        let e = self.ended.entry((tgid, g)).or_insert(exit_ns);
        *e = (*e).max(exit_ns);
    }

    /// When goroutine `g` of `tgid` ended, if it did after `start_ns`.
    pub fn ended_after(&self, tgid: u32, g: u64, start_ns: u64) -> Option<u64> {
        self.ended.get(&(tgid, g)).copied().filter(|t| *t > start_ns)
    }

    pub fn expire(&mut self, now_ns: u64) {
        self.ended.retain(|_, t| now_ns.saturating_sub(*t) < Self::KEEP_NS);
    }
}

/// One Status lock's history: write holds and read waits.
#[derive(Clone, Debug, Default)]
struct LockStats {
    holds: u64,
    max_hold: Duration,
    gets: u64,
    max_get_wait: Duration,
    /// The container the last long hold was for.
    container: Option<String>,
    /// Which lock it is ([`targets::held_lock`]), from its holders.
    name: &'static str,
}

/// How many Status locks' histories are kept.
const LOCKS_MAX: usize = 4096;

/// Whether a CRI handler is one kubelet's relist calls (ListPodSandbox, ListContainers).
fn is_list_call(symbol: &str) -> bool {
    matches!(short(symbol).rsplit('.').next(), Some("ListContainers" | "ListPodSandbox"))
}

/// What a goroutine parked in a probed semaphore wait waits on, given the
/// lock address taken as `RAX - READER_SEM_OFF`. From Go 1.20
/// `runtime_SemacquireRWMutexR` is `RLock`'s alone: a reader of that
/// `sync.RWMutex`. Before, `runtime_SemacquireMutex` is also where
/// `Mutex.Lock` and a waiting writer park, so only the semaphore is certain.
fn parked_what(symbol: Option<&str>, lock: u64) -> String {
    match symbol {
        Some("sync.runtime_SemacquireRWMutexR") => format!("parked on sync.RWMutex {lock:#x}'s read lock"),
        Some(s) if parks_a_writer(s) => format!("parked on sync.RWMutex {lock:#x}'s write lock"),
        _ => format!(
            "parked on a sync lock's semaphore {:#x} (a read lock of sync.RWMutex {lock:#x} if it is one)",
            lock.wrapping_add(READER_SEM_OFF)
        ),
    }
}

/// The latency row of the reader waits of a (fixture) kubelet: the probed
/// function's short name, e.g. `sync.runtime_SemacquireRWMutexR (reader waited)`.
fn reader_wait_row(symbol: &str) -> &'static str {
    match symbol {
        "sync.runtime_SemacquireRWMutexR" => "sync.runtime_SemacquireRWMutexR (reader waited)",
        _ => "sync.runtime_SemacquireMutex (lock waited)",
    }
}

/// What a late call's age means, in words (see [`late`]).
fn late_age(start: StartTiming) -> &'static str {
    match start {
        StartTiming::Waitsince => "from the goroutine's waitsince: a GC's stamp, up to one GC interval early",
        StartTiming::Unknown => "unknown: counted from when the goroutine scan found it",
        StartTiming::LowerBound => "a lower bound",
        StartTiming::Exact => "exact",
    }
}

/// How many kubelet relist clocks are kept before those of exited processes are dropped.
const RELIST_CLOCKS_MAX: usize = 64;

/// How many finished relists each kubelet's clock keeps.
const RECENT_RELISTS: usize = 10;

/// A kubelet's relist clock.
#[derive(Clone, Debug, Default)]
struct RelistClock {
    count: u64,
    last_start_ns: u64,
    last_end_ns: u64,
    last_took: Duration,
    /// The last [`RECENT_RELISTS`] relists: (start ns, end ns).
    recent: std::collections::VecDeque<(u64, u64)>,
}

/// What a worker thread of [`GoWatch`] gives back to the loop.
pub enum Background {
    /// A new Go binary read: its uprobes are attached next ([`GoWatch::on_inspected`]).
    Inspected(inspector::Done),
    /// A newly probed process's goroutines ([`GoWatch::on_late`]).
    Late(late::Found),
}

pub struct GoWatch {
    registry: Registry<GoOpen>,
    calls: BpfHashMap<MapData, GoCallKey, GoCall>,
    attacher: Attacher,
    relists: HashMap<u32, RelistClock>,
    /// Readers parked on a lock now (a Status `Get` waiting), by lock address: (how many, earliest start).
    gets: HashMap<u64, (u32, u64)>,
    /// The lock each goroutine's open `Get` waits on, by (process, goroutine).
    get_by_g: HashMap<(u32, u64), u64>,
    /// When each of those reader waits began, and its probed function's id.
    parked_since: HashMap<(u32, u64), (u64, u32)>,
    /// Every Go call open at the last scan (Gets excluded).
    open: Vec<GoOpen>,
    latency: LatencyTables,
    /// Goroutines that ended lately (`runtime.goexit0`).
    exits: GoExits,
    /// Calls dropped because their goroutine ended without returning from them.
    orphaned: u64,
    /// Per Status lock, by (process, lock address).
    locks: HashMap<(u32, u64), LockStats>,
    /// Calls found open by the goroutine scan and put in `GO_CALLS`: their start and how
    /// exact it is, until they end.
    late: HashMap<CallKey, (u64, StartTiming)>,
}

impl GoWatch {
    pub fn new(
        ebpf: &mut Ebpf,
        thresholds: Thresholds,
        filter: Filter,
        uprobes: GoUprobes,
        listing: crate::observe::lister::Lister,
    ) -> Result<Self, WatchError> {
        Ok(GoWatch {
            registry: Registry::new(thresholds, filter),
            calls: take_map(ebpf, go_maps::GO_CALLS)?,
            attacher: Attacher::new(ebpf, uprobes, listing)?,
            relists: HashMap::new(),
            gets: HashMap::new(),
            get_by_g: HashMap::new(),
            parked_since: HashMap::new(),
            open: Vec::new(),
            latency: LatencyTables::default(),
            exits: GoExits::default(),
            orphaned: 0,
            locks: HashMap::new(),
            late: HashMap::new(),
        })
    }

    /// Probes the binaries named on the command line (`(target, path)`), then
    /// every target running now. A named binary that can't be probed is an error.
    pub fn start(&mut self, ebpf: &mut Ebpf, paths: &[(&str, PathBuf)], out: &mut Vec<Event>) -> Result<(), WatchError> {
        for (target, path) in paths {
            self.attacher.attach_path(ebpf, target, path, out).map_err(WatchError::Target)?;
        }
        self.attacher.poll(ebpf, "startup", out);
        Ok(())
    }

    /// Detaches the Go probes (before the eBPF object is dropped: faster, see `attach`).
    pub fn detach(&mut self, ebpf: &mut Ebpf) {
        self.attacher.detach(ebpf);
    }

    /// The next result of a worker thread (a `select!` branch; cancel-safe): a Go
    /// binary read, or a process's goroutines read.
    pub async fn background(&mut self) -> Background {
        let (inspector, late) = self.attacher.workers();
        tokio::select! {
            d = async { match inspector { Some(i) => i.next().await, None => std::future::pending().await } } => Background::Inspected(d),
            f = async { match late { Some(l) => l.next().await, None => std::future::pending().await } } => Background::Late(f),
        }
    }

    /// Takes the calls a goroutine scan found open (see [`late`]): each goes into the
    /// kernel's `GO_CALLS` unless the entry probe saw it already, so that its RET probe
    /// closes it. A goroutine that ran between the scan and now may have returned from
    /// some (their RET found no entry): its calls are taken out again. Returns the
    /// goroutine each thread in a system call runs (and its `waitsince`), for the kernel
    /// waits the startup sweep found (which carry none).
    pub fn on_late(&mut self, found: late::Found, out: &mut Vec<Event>) -> Vec<(u32, u64, Option<u64>)> {
        const BPF_NOEXIST: u64 = 1;
        out.push(Event::GoroutineScan(found.event.clone()));
        let late::Found { pid, calls, threads, parked, reader, .. } = found;
        let mut seeded: Vec<(GoCallKey, u64)> = Vec::new();
        for c in &calls {
            // A reader's wait on an unknown lock links to nothing: left out.
            if c.role == Role::LockWait && c.receiver == 0 {
                continue;
            }
            let key = GoCallKey { g: c.g, func: c.func, tgid: pid };
            let mut arg = [0; plegwatch_abi::GO_ARG_LEN];
            let len = c.arg.len().min(arg.len());
            arg[..len].copy_from_slice(&c.arg[..len]);
            let call = GoCall { start_ns: c.start_ns, receiver: c.receiver, tgid: pid, tid: c.tid, arg_len: len as u32, _pad: 0, arg };
            if self.calls.insert(key, call, BPF_NOEXIST).is_ok() {
                self.late.insert((pid, c.g, c.func), (c.start_ns, c.timing));
                seeded.push((key, c.start_ns));
            }
        }
        if let Some(reader) = reader {
            for g in parked.iter().filter(|g| !reader.still_parked(g)) {
                for (key, start) in seeded.iter().filter(|(k, _)| k.g == g.g) {
                    if matches!(self.calls.get(key, 0), Ok(now) if now.start_ns == *start) {
                        let _ = self.calls.remove(key);
                    }
                    self.late.remove(&(pid, key.g, key.func));
                }
            }
        }
        threads
    }

    /// Takes a binary read off the loop; its attach follows in slices
    /// ([`GoWatch::attach_some`]).
    pub fn on_inspected(&mut self, done: inspector::Done) {
        self.attacher.finish(done);
    }

    /// The symbols of the Go binaries probed since the last call, by `stat`'s (dev,
    /// inode): already parsed, they name user stacks without a second read.
    pub fn take_symbols(&mut self) -> Vec<((u64, u64), std::sync::Arc<crate::proto::gosym::GoSymbols>)> {
        self.attacher.take_symbols()
    }

    /// Whether uprobes are waiting to be attached.
    pub fn attaching(&self) -> bool {
        self.attacher.attaching()
    }

    /// Attaches uprobes for up to `budget` (one `select!` turn), so that
    /// a binary of 80 probe points never holds a scan back for long.
    pub fn attach_some(&mut self, ebpf: &mut Ebpf, budget: std::time::Duration, out: &mut Vec<Event>) {
        self.attacher.attach_some(ebpf, budget, out);
    }

    /// Looks for target processes the exec records missed.
    pub fn poll(&mut self, ebpf: &mut Ebpf, out: &mut Vec<Event>) {
        self.attacher.poll(ebpf, "poll", out);
    }

    /// Takes one `GO_EVENTS` record.
    /// A record too short for its kind, or of a kind this ring does not carry, is skipped.
    pub fn on_record(&mut self, ebpf: &mut Ebpf, bytes: &[u8], out: &mut Vec<Event>) {
        match Record::parse(bytes) {
            Ok(Record::Exec(rec)) => self.attacher.on_exec(ebpf, rec.tgid, out),
            Ok(Record::GoExit(rec)) => self.exits.note(rec.tgid, rec.g, rec.exit_ns),
            Ok(Record::GoCallEnd(rec)) => self.on_end(&rec, out),
            _ => {}
        }
    }

    fn on_end(&mut self, rec: &GoCallEnd, out: &mut Vec<Event>) {
        let took = Duration::from_nanos(rec.end_ns.saturating_sub(rec.start_ns));
        // Ended: no longer one of the calls open since the last scan (the graph's
        // last step at exit runs on these without another scan).
        self.open.retain(|o| !(o.tgid == rec.tgid && o.g == rec.g && o.func == rec.func && o.start_ns == rec.start_ns));
        let start = match self.late.get(&end_place(rec)) {
            Some((s, timing)) if *s == rec.start_ns => {
                let t = *timing;
                self.late.remove(&end_place(rec));
                t
            }
            _ => StartTiming::Exact,
        };
        let Some(f) = self.attacher.funcs.get(&rec.func) else { return };
        let (role, target, symbol) = (f.role, f.target, f.symbol);
        if role != Role::LockWait {
            self.latency.record(target, short(symbol), took);
        }
        if role == Role::Relist {
            let c = self.relists.entry(rec.tgid).or_default();
            c.count += 1;
            c.last_start_ns = c.last_start_ns.max(rec.start_ns);
            c.last_end_ns = rec.end_ns;
            c.last_took = took;
            if c.recent.len() == RECENT_RELISTS {
                c.recent.pop_front();
            }
            c.recent.push_back((rec.start_ns, rec.end_ns));
        }
        if role == Role::LockWait {
            // Kept only for the locks of held calls: held now, or held before.
            let lock = rec.receiver.wrapping_sub(sem_off(symbol));
            let known = self.locks.contains_key(&(rec.tgid, lock)) || self.lock_holder(rec.tgid, lock).is_some();
            if known {
                let name = self.locks.get(&(rec.tgid, lock)).map(|l| l.name).unwrap_or_default();
                let row = match (target, parks_a_writer(symbol)) {
                    ("crio", true) if name == targets::NRI_LOCK_NAME => "NRI lock (waiting)",
                    ("crio", true) => "opLock write (waiting)",
                    ("crio", false) => "oci.(*Container).State (waiting)",
                    _ => "container.(*statusStorage).Get (waiting)",
                };
                self.latency.record(target, row, took);
                let l = self.locks.entry((rec.tgid, lock)).or_default();
                l.gets += 1;
                l.max_get_wait = l.max_get_wait.max(took);
            } else if target == "kubelet" {
                // Only the fake-kubelet fixture has reader waits probed
                // (targets::FIXTURE_READER_WAITS): every one is kept.
                self.latency.record(target, reader_wait_row(symbol), took);
            }
            return;
        }
        if role == Role::LockHold {
            if self.locks.len() >= LOCKS_MAX && !self.locks.contains_key(&(rec.tgid, rec.receiver)) {
                // Bounded over a long run (a lock per container ever seen):
                // keep the half held longest.
                let mut holds: Vec<Duration> = self.locks.values().map(|l| l.max_hold).collect();
                holds.sort_unstable();
                let cut = holds[holds.len() / 2];
                self.locks.retain(|_, l| l.max_hold > cut);
            }
            let name = targets::held_lock(f.recv).0;
            let l = self.locks.entry((rec.tgid, rec.receiver)).or_default();
            l.name = name;
            l.holds += 1;
            if took >= l.max_hold {
                l.max_hold = took;
                // The CRI handler on the same goroutine names the container.
                let container = self.open.iter().find(|o| o.tgid == rec.tgid && o.g == rec.g && o.arg.is_some());
                l.container = container.and_then(|o| o.arg.clone()).or(l.container.take());
            }
        }
        if !self.registry.wants_end(&end_key(rec), took) {
            return;
        }
        let call = GoCall {
            start_ns: rec.start_ns,
            receiver: rec.receiver,
            tgid: rec.tgid,
            tid: rec.tid,
            arg_len: rec.arg_len,
            _pad: 0,
            arg: rec.arg,
        };
        let actions = self.registry.end(GoOpen { start, ..GoOpen::new(rec.g, rec.func, &call) }, rec.end_ns);
        let none = HashMap::new();
        let no_g = HashMap::new();
        let waits = KernelWaits { by_tid: &none, by_g: &no_g };
        self.act(actions, rec.end_ns, &waits, out);
    }

    /// Looks at the Go calls open now, with the kernel waits open now.
    pub fn scan(&mut self, now_ns: u64, waits: &KernelWaits<'_>, out: &mut Vec<Event>) {
        self.open.clear();
        self.gets.clear();
        self.get_by_g.clear();
        self.parked_since.clear();
        let mut resolved = Vec::new();
        // Calls on a goroutine that ended after they began never return through
        // a probed RET (a panic unwound past them, or Goexit): dropped, counted.
        let orphans: Vec<(GoCallKey, GoCall)> =
            self.calls.iter().filter_map(Result::ok).filter(|(k, c)| self.exits.ended_after(c.tgid, k.g, c.start_ns).is_some()).collect();
        for (k, c) in orphans {
            let still_same = matches!(self.calls.get(&k, 0), Ok(now) if now.start_ns == c.start_ns);
            if still_same && self.calls.remove(&k).is_ok() {
                self.orphaned += 1;
                let end = self.exits.ended_after(c.tgid, k.g, c.start_ns).unwrap_or(now_ns);
                if let Some(a) = self.registry.vanished((c.tgid, k.g, k.func, c.start_ns), end) {
                    resolved.push(a);
                }
            }
        }
        self.exits.expire(now_ns);
        let mut dead = Vec::new();
        for (k, c) in self.calls.iter().filter_map(Result::ok) {
            // A process that died (or restarted) inside a call never returns from it.
            // Checked first: its function id may have been given back and reused.
            if !procfs::thread_exists(c.tgid) {
                dead.push(k);
                continue;
            }
            let Some(f) = self.attacher.funcs.get(&k.func) else { continue };
            if f.role == Role::Relist {
                let clock = self.relists.entry(c.tgid).or_default();
                clock.last_start_ns = clock.last_start_ns.max(c.start_ns);
            }
            if f.role == Role::LockWait {
                // A reader or writer parked on an RWMutex: keyed by the lock it waits on.
                let lock = c.receiver.wrapping_sub(sem_off(f.symbol));
                if !parks_a_writer(f.symbol) {
                    let e = self.gets.entry(lock).or_insert((0, c.start_ns));
                    e.0 += 1;
                    e.1 = e.1.min(c.start_ns);
                }
                self.get_by_g.insert((c.tgid, k.g), lock);
                self.parked_since.insert((c.tgid, k.g), (c.start_ns, k.func));
                continue;
            }
            let mut o = GoOpen::new(k.g, k.func, &c);
            if let Some((start, timing)) = self.late.get(&(c.tgid, k.g, k.func)) {
                if *start == c.start_ns {
                    o.start = *timing;
                }
            }
            self.open.push(o);
        }
        for k in dead {
            let _ = self.calls.remove(&k);
        }
        if !self.late.is_empty() {
            let present: std::collections::HashSet<CallKey> =
                self.calls.keys().filter_map(Result::ok).map(|k| (k.tgid, k.g, k.func)).collect();
            self.late.retain(|k, _| present.contains(k));
        }
        // Bounded in a long run (a clock per kubelet process ever seen, restarts
        // included): past RELIST_CLOCKS_MAX, the clocks of exited processes go.
        if self.relists.len() > RELIST_CLOCKS_MAX {
            self.relists.retain(|pid, _| procfs::thread_exists(*pid));
        }
        let open = std::mem::take(&mut self.open);
        let mut actions = self.registry.scan(open.iter(), now_ns);
        self.open = open;
        actions.extend(resolved);
        self.act(actions, now_ns, waits, out);
    }

    /// The holder of `lock` among the open calls (not one parked on it, waiting to take it).
    fn lock_holder(&self, tgid: u32, lock: u64) -> Option<&GoOpen> {
        self.open
            .iter()
            .filter(|o| self.get_by_g.get(&(o.tgid, o.g)) != Some(&lock))
            .find(|o| o.tgid == tgid && o.receiver == lock && self.attacher.funcs.get(&o.func).is_some_and(|f| f.role == Role::LockHold))
    }

    fn act(&mut self, actions: Vec<Action<GoKey>>, now_ns: u64, waits: &KernelWaits<'_>, out: &mut Vec<Event>) {
        for a in actions {
            match a {
                Action::Report { key, level, waited } => {
                    let Some(t) = self.registry.get(&key) else { continue };
                    let o = t.info.clone();
                    let id = t.id;
                    let Some(f) = self.attacher.funcs.get(&o.func).cloned() else { continue };
                    let thread_wait = waits.of_call(&o);
                    let common = json!({
                        "function": f.symbol,
                        "goroutine": format!("{:#x}", o.g),
                        "thread": o.tid,
                        "thread_wait": thread_wait,
                        "binary": f.binary.display().to_string(),
                    });
                    let (kind, extra) = match f.role {
                        Role::Relist => {
                            let last = self.relists.get(&o.tgid);
                            // The relist's goroutine parked in `RLock` (fixture only, see targets).
                            let reader_wait = self.get_by_g.get(&(o.tgid, o.g)).map(|lock| {
                                let (start, func) = self.parked_since.get(&(o.tgid, o.g)).copied().unwrap_or((now_ns, 0));
                                let symbol = self.attacher.funcs.get(&func).map(|f| f.symbol);
                                json!({
                                    "lock": format!("{lock:#x}"),
                                    "what": parked_what(symbol, *lock),
                                    "function": symbol,
                                    "waited_s": now_ns.saturating_sub(start) as f64 / 1e9,
                                })
                            });
                            (
                                WaitKind::PlegRelist,
                                json!({
                                    "since_relist_start_s": now_ns.saturating_sub(o.start_ns) as f64 / 1e9,
                                    "last_relist_s": last.filter(|c| c.count > 0).map(|c| c.last_took.as_secs_f64()),
                                    "relists_seen": last.map(|c| c.count).unwrap_or(0),
                                    "reader_wait": reader_wait,
                                }),
                            )
                        }
                        Role::LockHold | Role::LockWait => {
                            let gets = self.gets.get(&o.receiver);
                            (
                                WaitKind::GoLock,
                                json!({
                                    "lock": format!("{:#x}", o.receiver),
                                    "lock_type": targets::held_lock(f.recv).1,
                                    "holder_function": f.symbol,
                                    "container": container_of(&o, &self.open, &self.attacher.funcs),
                                    "waiting_gets": gets.map(|g| g.0).unwrap_or(0),
                                    "longest_get_wait_s": gets.map(|g| now_ns.saturating_sub(g.1) as f64 / 1e9),
                                }),
                            )
                        }
                        Role::CriHandler => {
                            let lock = self.get_by_g.get(&(o.tgid, o.g)).copied();
                            (
                                WaitKind::CriCall,
                                json!({
                                    "container": o.arg,
                                    "waiting_on_lock": lock.map(|l| format!("{l:#x}")),
                                }),
                            )
                        }
                        Role::ShimTask | Role::RuncSystemd => (WaitKind::GoCall, json!({ "container": o.arg, "target": f.target })),
                    };
                    let mut detail = common;
                    if let (Value::Object(d), Value::Object(e)) = (&mut detail, extra) {
                        d.extend(e);
                    }
                    if let (false, Value::Object(d)) = (o.start.is_exact(), &mut detail) {
                        d.insert("found_by".into(), json!("goroutine scan (/proc/PID/mem): open before plegwatch started"));
                        d.insert("age".into(), json!(late_age(o.start)));
                    }
                    out.push(Event::Stall(Box::new(Stall {
                        started_before_attach: !o.start.is_exact(),
                        ..crate::sources::inflight::stall_line(&o, level, id, kind, waited, detail)
                    })));
                }
                Action::Resolve { key, waited, exact } => {
                    let role = self.registry.get(&key).and_then(|t| self.attacher.funcs.get(&t.info.func)).map(|f| f.role);
                    let kind = match role {
                        Some(Role::Relist) => WaitKind::PlegRelist,
                        Some(Role::LockHold | Role::LockWait) => WaitKind::GoLock,
                        Some(Role::ShimTask | Role::RuncSystemd) => WaitKind::GoCall,
                        _ => WaitKind::CriCall,
                    };
                    if let Some(r) = self.registry.resolve(&key, waited, exact, kind) {
                        out.push(Event::Resolved(r));
                    }
                }
            }
        }
    }

    /// Every Go call open at the last scan as graph nodes, plus each kubelet
    /// whose next relist is overdue with none open.
    pub fn open_waits(&self, now_ns: u64) -> Vec<OpenWait> {
        let mut out: Vec<OpenWait> = self
            .open
            .iter()
            .filter_map(|o| {
                let f = self.attacher.funcs.get(&o.func)?;
                let kind = match f.role {
                    Role::Relist => WaitKind::PlegRelist,
                    Role::LockHold | Role::LockWait => WaitKind::GoLock,
                    Role::CriHandler => WaitKind::CriCall,
                    Role::ShimTask | Role::RuncSystemd => WaitKind::GoCall,
                };
                let mut what = short(f.symbol).to_string();
                // A holder whose goroutine is parked on its own lock has not taken it yet.
                let parked_on = self.get_by_g.get(&(o.tgid, o.g)).copied();
                let taking = f.role == Role::LockHold && parked_on == Some(o.receiver);
                if f.role == Role::LockHold {
                    let verb = if taking { "waiting to take" } else { "holding" };
                    what = format!("{what} {verb} {} {:#x}", targets::held_lock(f.recv).0, o.receiver);
                }
                if let Some(c) = &o.arg {
                    what.push_str(&format!(" for {} {}", f.arg.map(|a| a.name).unwrap_or("container"), c.get(..12).unwrap_or(c)));
                }
                if let (Some(lock), false) = (parked_on, taking) {
                    if f.role == Role::Relist {
                        let func = self.parked_since.get(&(o.tgid, o.g)).and_then(|(_, id)| self.attacher.funcs.get(id));
                        what.push_str(&format!(", {}", parked_what(func.map(|f| f.symbol), lock)));
                    } else {
                        what.push_str(&format!(", waiting on {} {lock:#x}", self.lock_name(o.tgid, lock)));
                    }
                }
                Some(OpenWait {
                    key: o.wait_key(),
                    who: Who { pid: o.tgid, tid: o.tid, comm: o.comm.clone(), goroutine: Some(o.g) },
                    kind,
                    what,
                    start_ns: o.start_ns,
                    start: o.start,
                    pleg_path: f.role == Role::Relist || (f.role == Role::CriHandler && is_list_call(f.symbol)),
                })
            })
            .collect();
        for (pid, c) in &self.relists {
            let open = self.open.iter().any(|o| o.tgid == *pid && self.role_of(o) == Some(Role::Relist));
            if open || c.count == 0 || !procfs::thread_exists(*pid) {
                continue;
            }
            // Due one period after the last ended: the longest start-to-start gap seen.
            let period = c.recent.iter().zip(c.recent.iter().skip(1)).map(|(a, b)| b.0.saturating_sub(a.0)).max().unwrap_or(1_000_000_000);
            let due = c.last_end_ns.saturating_add(period);
            if due >= now_ns {
                continue;
            }
            out.push(OpenWait {
                key: WaitKey::RelistOverdue { tgid: *pid, since_ns: due },
                who: Who { pid: *pid, tid: *pid, comm: procfs::comm(*pid).unwrap_or_default(), goroutine: None },
                kind: WaitKind::PlegRelist,
                what: format!(
                    "no relist started since one was due ({:.1}s after the last ended): the relist loop is stuck outside Relist",
                    period as f64 / 1e9
                ),
                start_ns: due,
                start: StartTiming::Exact,
                pleg_path: true,
            });
        }
        out
    }

    /// What `lock` is, by the open call holding it: its name, or "a lock" with no holder seen.
    fn lock_name(&self, tgid: u32, lock: u64) -> &'static str {
        self.lock_holder(tgid, lock).and_then(|h| self.attacher.funcs.get(&h.func)).map_or("a lock", |f| targets::held_lock(f.recv).0)
    }

    fn role_of(&self, o: &GoOpen) -> Option<Role> {
        self.attacher.funcs.get(&o.func).map(|f| f.role)
    }

    /// The open Go calls as the resolvers need them, and the lock each parked goroutine waits on.
    pub fn facts(&self) -> GoFacts {
        let calls = self
            .open
            .iter()
            .filter_map(|o| {
                let f = self.attacher.funcs.get(&o.func)?;
                let role = match f.role {
                    Role::Relist => CallRole::Relist,
                    Role::LockHold => CallRole::StatusHolder,
                    Role::CriHandler => CallRole::CriHandler { list: is_list_call(f.symbol) },
                    Role::ShimTask => CallRole::ShimTask,
                    Role::RuncSystemd => CallRole::RuncSystemd,
                    Role::LockWait => return None,
                };
                Some(GoCallFact {
                    key: o.wait_key(),
                    tgid: o.tgid,
                    g: o.g,
                    role,
                    receiver: o.receiver,
                    container: o.arg.clone(),
                    start_ns: o.start_ns,
                    function: short(f.symbol),
                    late: !o.start.is_exact(),
                })
            })
            .collect();
        GoFacts { calls, parked: self.get_by_g.clone(), ..Default::default() }
    }

    /// When the PLEG budget started being used: the oldest open relist's
    /// start, else the last relist's start; none when no kubelet is traced.
    pub fn relist_start_ns(&self) -> Option<u64> {
        let open = self.open.iter().filter(|o| self.role_of(o) == Some(Role::Relist)).map(|o| o.start_ns).min();
        open.or_else(|| self.relists.values().filter(|c| c.count > 0).map(|c| c.last_start_ns).max())
    }

    /// (stall lines, resolutions, still open).
    pub fn counts(&self) -> (u64, u64, u64) {
        let (s, r) = self.registry.counts();
        (s, r, self.registry.open().count() as u64)
    }

    /// Calls dropped because their goroutine ended without returning from them.
    pub fn orphaned(&self) -> u64 {
        self.orphaned
    }

    /// (Go function ids in use, binaries given up after an upgrade), for the summary.
    pub fn ids_in_use(&self) -> (usize, u64) {
        self.attacher.ids_in_use()
    }

    /// The latency tables, for the summary.
    pub fn latency(&self) -> Vec<LatencyRow> {
        self.latency.rows()
    }

    /// The locks held longest (Status locks, opLocks, the NRI lock), for the summary (at most `n`).
    pub fn locks(&self, n: usize) -> Vec<Value> {
        let mut v: Vec<(&(u32, u64), &LockStats)> = self.locks.iter().filter(|(_, l)| l.holds > 0).collect();
        v.sort_by_key(|(_, l)| std::cmp::Reverse(l.max_hold));
        v.into_iter()
            .take(n)
            .map(|((pid, lock), l)| {
                json!({
                    "pid": pid,
                    "lock": format!("{lock:#x}"),
                    "name": l.name,
                    "container": l.container,
                    "holds": l.holds,
                    "max_hold_s": l.max_hold.as_secs_f64(),
                    "gets": l.gets,
                    "max_get_wait_s": l.max_get_wait.as_secs_f64(),
                })
            })
            .collect()
    }

    /// Each kubelet's relist clock, for the summary: relists seen, when the
    /// last one started and ended, how long it took, and whether one is open.
    pub fn relists(&self, now_ns: u64) -> Vec<Value> {
        let mut out: Vec<Value> = self
            .relists
            .iter()
            .map(|(pid, c)| {
                let open =
                    self.open.iter().any(|o| o.tgid == *pid && self.attacher.funcs.get(&o.func).is_some_and(|f| f.role == Role::Relist));
                let at = |ns: u64| (ns != 0).then(|| humantime::format_rfc3339_millis(wall_of(ns)).to_string());
                json!({
                    "pid": pid,
                    "relists": c.count,
                    "last_start": at(c.last_start_ns),
                    "last_end": at(c.last_end_ns),
                    "last_took_s": (c.count > 0).then_some(c.last_took.as_secs_f64()),
                    "since_last_start_s": (c.last_start_ns != 0).then(|| now_ns.saturating_sub(c.last_start_ns) as f64 / 1e9),
                    "open_now": open,
                    "recent": c.recent.iter().map(|(start, end)| json!({
                        "start": at(*start),
                        "end": at(*end),
                        "took_s": end.saturating_sub(*start) as f64 / 1e9,
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        out.sort_by_key(|v| v["pid"].as_u64());
        out
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_calls_that_began_before_their_goroutine_ended_are_orphans() {
        let mut e = super::GoExits::default();
        e.note(7, 0xc000, 5_000);
        assert_eq!(e.ended_after(7, 0xc000, 4_000), Some(5_000), "began before the end: an orphan");
        assert_eq!(e.ended_after(7, 0xc000, 6_000), None, "began after: the g was reused by a new goroutine");
        assert_eq!(e.ended_after(8, 0xc000, 4_000), None, "another process's g");
        e.expire(5_000 + super::GoExits::KEEP_NS);
        assert_eq!(e.ended_after(7, 0xc000, 4_000), None, "forgotten after a while");
    }

    use super::*;
    use plegwatch_abi::{EventHeader, EventKind};

    #[test]
    fn parked_goroutines_name_the_lock_only_where_the_function_says_it_is_one() {
        assert_eq!(parked_what(Some("sync.runtime_SemacquireRWMutexR"), 0xc0000a6010), "parked on sync.RWMutex 0xc0000a6010's read lock");
        // Go ≤ 1.19: the same function parks Mutex.Lock, RLock and a waiting writer.
        assert_eq!(
            parked_what(Some("sync.runtime_SemacquireMutex"), 0xc0000a6010),
            "parked on a sync lock's semaphore 0xc0000a601c (a read lock of sync.RWMutex 0xc0000a6010 if it is one)"
        );
        assert_eq!(reader_wait_row("sync.runtime_SemacquireRWMutexR"), "sync.runtime_SemacquireRWMutexR (reader waited)");
        assert_eq!(reader_wait_row("sync.runtime_SemacquireMutex"), "sync.runtime_SemacquireMutex (lock waited)");
    }

    const S: u64 = 1_000_000_000;
    /// Pids no process has, so /proc lookups find nothing.
    const SHIM_A: u32 = u32::MAX - 11;
    const SHIM_B: u32 = u32::MAX - 12;

    /// A shim's `(*service).Delete` on goroutine 0xc000602000: Go heap
    /// addresses repeat from process to process, and function ids are per binary.
    fn delete_call(tgid: u32, start_ns: u64) -> GoOpen {
        GoOpen {
            g: 0xc000_602000,
            func: 4,
            tgid,
            tid: tgid,
            comm: "containerd-shim".into(),
            start_ns,
            receiver: 0xc000_0a0000,
            arg: None,
            start: Default::default(),
        }
    }

    fn end_of(o: &GoOpen, end_ns: u64) -> GoCallEnd {
        GoCallEnd {
            header: EventHeader { kind: EventKind::GoCallEnd as u32, _pad: 0 },
            g: o.g,
            start_ns: o.start_ns,
            end_ns,
            receiver: o.receiver,
            func: o.func,
            tgid: o.tgid,
            tid: o.tid,
            arg_len: 0,
            arg: [0; plegwatch_abi::GO_ARG_LEN],
        }
    }

    #[test]
    fn two_shims_calls_on_the_same_g_and_function_are_tracked_apart() {
        let t = Thresholds::new(Duration::from_secs(2), Duration::from_secs(10), Duration::from_secs(150)).unwrap();
        let mut reg: Registry<GoOpen> = Registry::new(t, Filter::default());
        let a = delete_call(SHIM_A, 0);
        let b = delete_call(SHIM_B, S / 2);
        let reported = reg.scan([&a, &b], 3 * S).iter().filter(|x| matches!(x, Action::Report { .. })).count();
        assert_eq!(reported, 2, "each shim's call is its own stall");
        assert_eq!(reg.open().count(), 2);

        // Shim A's call returns: its end record names A's call, not B's.
        let rec = end_of(&a, 4 * S);
        let key = end_key(&rec);
        assert_eq!(key, a.key());
        assert_ne!(key, b.key());
        assert!(reg.wants_end(&key, Duration::from_secs(4)));
        let actions = reg.end(a.clone(), rec.end_ns);
        assert_eq!(actions, vec![Action::Resolve { key: a.key(), waited: Duration::from_secs(4), exact: true }]);
        reg.forget(&key);
        // B's call is still open, and still reported as one.
        assert!(reg.get(&b.key()).is_some_and(|t| t.info.tgid == SHIM_B));
        assert!(reg.scan([&b], 5 * S).is_empty());
    }

    /// kubelet relists on one long-lived goroutine: three stalls of the same call on the
    /// same goroutine are three waits, each with its own id, each ended by its own record.
    #[test]
    fn repeated_stalls_of_one_goroutine_are_each_their_own_wait() {
        let t = Thresholds::new(Duration::from_secs(2), Duration::from_secs(10), Duration::from_secs(150)).unwrap();
        let mut reg: Registry<GoOpen> = Registry::new(t, Filter::default());
        let mut ids = Vec::new();
        for round in 0..3u64 {
            let start = round * 10 * S;
            let call = delete_call(SHIM_A, start);
            let reports = reg.scan([&call], start + 3 * S);
            assert!(matches!(reports.as_slice(), [Action::Report { .. }]), "round {round}: {reports:?}");
            let id = reg.get(&call.key()).map(|t| t.id).expect("tracked");
            ids.push(id);
            let rec = end_of(&call, start + 4 * S);
            assert!(reg.wants_end(&end_key(&rec), Duration::from_secs(4)));
            let actions = reg.end(call.clone(), rec.end_ns);
            assert_eq!(
                actions,
                vec![Action::Resolve { key: call.key(), waited: Duration::from_secs(4), exact: true }],
                "round {round}: the end is exact, not dropped as an earlier stall's"
            );
            reg.forget(&call.key());
        }
        ids.dedup();
        assert_eq!(ids.len(), 3, "three ids: {ids:?}");
    }
}
