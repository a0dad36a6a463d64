//! Finding Go targets and putting the probes on them.
//!
//! Processes are matched to a [`Target`] by comm, at startup, at every
//! `execve` (the `proc_exec` tracepoint: a restarted or upgraded containerd
//! is probed again at once), and by a poll every [`POLL_EVERY`] as a safety
//! net; binaries can also be named by path (`--containerd`, `--kubelet`).
//! Each binary is attached once per (device, inode): uprobes live on the
//! file, so every process running it, now or later, is covered. Each process
//! of a probed binary also goes into `GO_PROCS` with `g`'s TLS offset, so
//! that its kernel waits carry the goroutine that made them.
//!
//! Each probe point names its function with a BPF attach cookie (Linux ≥
//! 5.15). Kernels before that have no cookies: there the `_at` programs are
//! attached instead, and every point goes into `GO_ADDRS` by where it sits in
//! the binary's code ([`plegwatch_abi::GoAddrKey`]). The mode is chosen once,
//! at start, by loading the cookie program ([`GoUprobes`]).

use super::inspector::{Done, Inspector, Job};
use super::late::{Job as LateJob, LateFunc, LateScanner};
use super::targets::{arg_spec, short, target_named, target_of, Arg, GoFuncSpec, Recv, Role, Target};
use crate::{
    events::Event, kernel::loader::take_map, kernel::loader::WatchError, observe::go_binary, observe::lister::Lister, observe::procfs,
};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData},
    programs::{
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
        UProbe,
    },
    Ebpf,
};
use plegwatch_abi::{go_maps, GoAddrKey, GoArgSpec, GoProc, GO_FUNCS_MAX};
use std::{
    collections::{HashMap, HashSet, VecDeque},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

/// How often running processes are checked for binaries the exec events missed.
pub const POLL_EVERY: Duration = Duration::from_secs(2);

/// How Go probe points tell which function they are in (`--go-uprobes`,
/// hidden: `auto` everywhere but tests, which run both on one kernel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum GoUprobes {
    /// Cookies where the kernel has them (5.15+), else addresses.
    #[default]
    Auto,
    /// An attach cookie per point (`go_entry`, `go_ret`).
    Cookie,
    /// The point's place in the code, looked up in `GO_ADDRS` (`go_entry_at`, `go_ret_at`).
    Address,
}

impl GoUprobes {
    /// The name `doctor` and the target lines give the mode in use.
    pub fn name(self) -> &'static str {
        match self {
            GoUprobes::Auto => "auto",
            GoUprobes::Cookie => "cookie",
            GoUprobes::Address => "address",
        }
    }

    /// The programs for a function's entry and its RETs.
    fn programs(self) -> (&'static str, &'static str) {
        match self {
            GoUprobes::Address => ("go_entry_at", "go_ret_at"),
            _ => ("go_entry", "go_ret"),
        }
    }
}

/// Resolves `auto`: cookies if this kernel loads the cookie program (its
/// helper, `bpf_get_attach_cookie`, and cookies on perf links both came in
/// Linux 5.15), else addresses; returns the reason for a fallback too.
pub fn choose_mode(ebpf: &mut Ebpf, want: GoUprobes) -> (GoUprobes, Option<String>) {
    if want != GoUprobes::Auto {
        return (want, None);
    }
    match load_program(ebpf, "go_entry") {
        Ok(()) => (GoUprobes::Cookie, None),
        Err(e) => {
            // One line: the error's first sentence, and the verifier's own reason when it
            // names the missing helper (`invalid func unknown#174`: bpf_get_attach_cookie).
            let first = e.lines().next().unwrap_or_default();
            let first = first.split(". Verifier output").next().unwrap_or(first);
            let helper =
                e.lines().find(|l| l.starts_with("invalid func")).map(|l| format!(" ({l}: no bpf_get_attach_cookie)")).unwrap_or_default();
            let why = format!("no uprobe attach cookies on this kernel (before Linux 5.15): {first}{helper}");
            tracing::info!("Go probes find their function by address: {why}");
            (GoUprobes::Address, Some(why))
        }
    }
}

fn load_program(ebpf: &mut Ebpf, program: &'static str) -> Result<(), String> {
    let prog: &mut UProbe = crate::kernel::probes::program_mut(ebpf, program)?;
    prog.load()
        .or_else(|e| match e {
            aya::programs::ProgramError::AlreadyLoaded => Ok(()),
            e => Err(e),
        })
        .map_err(|e| format!("load {program}: {e}"))
}

/// A probed function, by function id (its attach cookie, or its `GO_ADDRS` value).
#[derive(Clone, Debug)]
pub struct ProbedFunc {
    pub symbol: &'static str,
    pub role: Role,
    pub arg: Option<Arg>,
    /// Where its receiver is, when not RAX (resolved for this binary).
    pub recv: Option<Recv>,
    pub target: &'static str,
    pub binary: PathBuf,
}

/// What became of a binary.
#[derive(Debug)]
enum Binary {
    /// Probed; processes running it get `g_tls` in `GO_PROCS`. Its function
    /// ids and links are kept so that they can be given back (see [`retire`]).
    /// `addrs` are its points in `GO_ADDRS` (address mode only).
    Probed {
        target: &'static Target,
        g_tls: Option<i64>,
        ids: Vec<u32>,
        links: Vec<Link>,
        addrs: Vec<(GoAddrKey, u32)>,
        path: PathBuf,
        by_flag: bool,
    },
    /// Looked at and left alone.
    Skipped,
}

/// A binary inspected without attaching anything (for `doctor`, and before attaching).
#[derive(Clone, Debug)]
pub struct Inspection {
    pub go_version: Option<String>,
    /// The function chosen for each group the binary has, with its probe points.
    pub found: Vec<(GoFuncSpec, crate::proto::gosym::ProbePoints)>,
    /// Groups left out: none of their names is in the binary (named by the
    /// first), or the one found could not be probed.
    pub missing: Vec<Missing>,
    pub g_tls: Result<i64, String>,
    /// The entry of `runtime.goexit0`, where goroutines end (see `go_exit`).
    pub goexit: Option<u64>,
    /// A ttrpc 1.1 client (requests written by a sender goroutine): the
    /// entries of `(*Client).dispatch` and `(*Client).send` (see `crate::sources::ttrpc`).
    pub ttrpc11: Option<(u64, u64)>,
    /// The binary's program headers, to place its probe points in its code
    /// (address mode).
    pub elf: crate::proto::gosym::elf::Elf,
    /// A target's parsed symbols, for naming its stall lines' user stacks without
    /// parsing the binary again on the scan loop (`UserSymbolizer::prime`); none
    /// for a binary that is no target.
    pub symbols: Option<std::sync::Arc<crate::proto::gosym::GoSymbols>>,
}

/// An expected function that is not probed, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missing {
    pub symbol: &'static str,
    pub why: String,
}

impl Missing {
    /// `pkg.(*T).M (why)`, for the target line and `doctor`.
    pub fn describe(&self) -> String {
        format!("{} ({})", short(self.symbol), self.why)
    }
}

/// Where a goroutine ends: `func goexit0(gp *g)` (Go 1.19–1.26), entry only.
pub const GOEXIT: &str = "runtime.goexit0";

/// ttrpc's client: 1.1 hands requests to a sender goroutine in `dispatch`
/// and writes them in `send`; 1.2 added streams (`createStream`) and writes
/// from the caller, where nothing more is needed.
const TTRPC_DISPATCH: &str = "github.com/containerd/ttrpc.(*Client).dispatch";
const TTRPC_SEND: &str = "github.com/containerd/ttrpc.(*Client).send";
const TTRPC_CREATE_STREAM: &str = "github.com/containerd/ttrpc.(*Client).createStream";

/// Reads `path` and picks, for each of `target`'s groups, the first function it has.
pub fn inspect(path: &Path, target: &Target) -> Result<Inspection, crate::proto::gosym::GoSymError> {
    let bin = go_binary::read(path)?;
    let mut found = Vec::new();
    let mut missing = Vec::new();
    let mut own = 0;
    for group in target.groups {
        if group.only_with.is_some_and(|m| bin.symbols().lookup(m).is_none()) {
            continue;
        }
        let Some(spec) = group.funcs.iter().find(|s| bin.symbols().lookup(s.symbol).is_some()) else {
            if !group.optional {
                missing.push(Missing { symbol: group.funcs[0].symbol, why: "not in the binary's .gopclntab".into() });
            }
            continue;
        };
        match bin.probe_points(spec.symbol) {
            Ok(p) => {
                // The argument's field offset as this binary lays it out.
                let arg = spec.arg.and_then(|a| {
                    a.resolve(&bin).inspect_err(|e| tracing::warn!(symbol = spec.symbol, "{} not captured: {e}", a.name)).ok()
                });
                // A lock holder without its lock's place would name no lock: left out.
                let recv = match spec.recv.map(|r| r.resolve(&bin)).transpose() {
                    Ok(r) => r,
                    Err(e) => {
                        missing.push(Missing { symbol: spec.symbol, why: format!("the lock it holds is not found: {e}") });
                        continue;
                    }
                };
                own += usize::from(!group.runtime);
                found.push((GoFuncSpec { arg, recv, ..*spec }, p));
            }
            Err(e) => {
                tracing::warn!(symbol = spec.symbol, "not probed: {e}");
                missing.push(Missing { symbol: spec.symbol, why: e.to_string() });
            }
        }
    }
    if own == 0 {
        // Only runtime functions, which every Go binary has: not this target.
        found.clear();
    }
    let probed = !found.is_empty();
    let g_tls = bin.g_tls().map(|t| t.offset).map_err(|e| e.to_string());
    let goexit = bin.entry_offset(GOEXIT).ok();
    let ttrpc11 = match bin.symbols().lookup(TTRPC_CREATE_STREAM) {
        Some(_) => None,
        None => bin.entry_offset(TTRPC_DISPATCH).ok().zip(bin.entry_offset(TTRPC_SEND).ok()),
    };
    let go_version = bin.symbols().version();
    let elf = bin.symbols().elf().clone();
    Ok(Inspection {
        go_version,
        found,
        missing,
        g_tls,
        goexit,
        ttrpc11,
        elf,
        symbols: probed.then(|| std::sync::Arc::new(bin.into_symbols())),
    })
}

/// Attaches `program` at file offset `offset` of `target`, for every process
/// running it, with `cookie` (if any) naming the function.
///
/// One link per point: aya 0.14 (pinned: later releases need a newer rustc)
/// has no `uprobe_multi` link, so each entry and RET is its own perf-event
/// uprobe, with a BPF cookie on Linux ≥ 5.15. On Debian's containerd 1.6.20
/// that is 50 links for 12 functions; its shim 16, runc 8.
fn attach_point(ebpf: &mut Ebpf, program: &'static str, target: &Path, offset: u64, cookie: Option<u32>) -> Result<Link, String> {
    load_program(ebpf, program)?;
    let prog: &mut UProbe = crate::kernel::probes::program_mut(ebpf, program)?;
    let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: cookie.map(u64::from) };
    prog.attach(point, target, UProbeScope::AllProcesses)
        .map(|id| (program, id))
        .map_err(|e| format!("attach {program} at {offset:#x} of {}: {e}", target.display()))
}

/// An attached point: its program and link.
type Link = (&'static str, aya::programs::uprobe::UProbeLinkId);

/// Detaches `links` (a binary whose attach failed half-way).
fn detach_all(ebpf: &mut Ebpf, links: Vec<Link>) {
    for (program, id) in links {
        if let Ok(prog) = crate::kernel::probes::program_mut::<UProbe>(ebpf, program) {
            let _ = prog.detach(id);
        }
    }
}

/// How many threads close uprobe links at once on the way out.
const DETACH_THREADS: usize = 32;

/// Detaches `links` from several threads at once, and returns how many.
///
/// Closing one uprobe link waits for several RCU grace periods in the kernel
/// (`perf_event_detach_bpf_prog`, `uprobe_unregister_sync`, the
/// `perf_trace_event_unreg` of its perf event: Linux 6.18), each step under
/// its own global mutex. One after the other that was 150–250 ms per link on
/// this machine kind under load, so 78 links (Debian's containerd, shim and
/// runc, a kubelet) kept plegwatch from exiting for 11–20 s. From several
/// threads the steps of different links overlap: 95 ms per link measured
/// side by side (1.6–2.5× faster).
fn detach_parallel(ebpf: &mut Ebpf, links: Vec<Link>) -> usize {
    let mut taken = Vec::with_capacity(links.len());
    for (program, id) in links {
        if let Ok(prog) = crate::kernel::probes::program_mut::<UProbe>(ebpf, program) {
            if let Ok(link) = prog.take_link(id) {
                taken.push(link);
            }
        }
    }
    let n = taken.len();
    let per = n.div_ceil(DETACH_THREADS).max(1);
    std::thread::scope(|scope| {
        let mut rest = taken;
        while !rest.is_empty() {
            let chunk: Vec<_> = rest.drain(..per.min(rest.len())).collect();
            // A thread that can't be made drops its links here instead.
            let _ = std::thread::Builder::new().name("detach".into()).spawn_scoped(scope, move || drop(chunk));
        }
    });
    n
}

/// The path to attach to for a process's binary: its own path when that is
/// still the same file (stable, unlike `/proc/PID/exe` of a short-lived
/// process: the shim's first process and runc exit within milliseconds),
/// else `/proc/PID/exe` (a binary replaced or deleted on disk since).
fn stable_path(pid: u32, key: (u64, u64)) -> (PathBuf, PathBuf) {
    let exe = PathBuf::from(format!("/proc/{pid}/exe"));
    let path = std::fs::read_link(&exe).unwrap_or_else(|_| exe.clone());
    let same = std::fs::metadata(&path).is_ok_and(|m| (m.dev(), m.ino()) == key);
    (if same { path.clone() } else { exe }, path)
}

/// The smallest function id (attach cookie) not in use, if any is left.
pub fn free_id(in_use: &HashMap<u32, ProbedFunc>) -> Option<u32> {
    (1..GO_FUNCS_MAX).find(|id| !in_use.contains_key(id))
}

/// Whether a probed binary can be given up: no process runs it any more, and
/// its file was replaced or deleted (an upgrade), so none ever will again.
pub fn retire(running: bool, file_is_same: bool) -> bool {
    !running && !file_is_same
}

pub struct Attacher {
    pub funcs: HashMap<u32, ProbedFunc>,
    binaries: HashMap<(u64, u64), Binary>,
    procs: BpfHashMap<MapData, u32, GoProc>,
    args: Array<MapData, GoArgSpec>,
    /// Probe points by place in the code (address mode).
    addrs: BpfHashMap<MapData, GoAddrKey, u32>,
    /// How points name their function: `Cookie` or `Address`, never `Auto`.
    mode: GoUprobes,
    /// Processes in `GO_PROCS`.
    known: HashSet<u32>,
    last_poll: Option<Instant>,
    /// `/proc` as the listing thread last saw it, each comm read once per process.
    listing: Lister,
    /// Processes running a target's binary that was left alone (not Go, or no
    /// function found), by pid: (`/proc/PID` inode, binary), not looked at again.
    left_alone: HashMap<u32, (u64, (u64, u64))>,
    /// Binaries given up after an upgrade (see [`Attacher::retire_upgraded`]).
    retired: u64,
    /// Reads binaries found at an exec or by the poll, off the loop.
    inspector: Option<Inspector>,
    /// Binaries being read or attached: the processes found running each, and how.
    pending: HashMap<(u64, u64), Vec<(u32, &'static str)>>,
    /// Binaries read off the loop, being attached a slice at a time.
    attaching: VecDeque<Plan>,
    /// Reads the goroutines of each newly probed process, off the loop (see `late`).
    late: Option<LateScanner>,
    /// Processes whose goroutines were queued for reading.
    late_queued: HashSet<u32>,
    /// Why the last binary left alone was (for a binary named by flag).
    last_why: Option<String>,
    /// Probed binaries' parsed symbols, by (dev, inode), until the engine takes them
    /// ([`Attacher::take_symbols`]) for naming user stacks.
    symbols: Vec<((u64, u64), std::sync::Arc<crate::proto::gosym::GoSymbols>)>,
    /// The same tables for as long as anyone holds them (the user-stack cache), for the
    /// goroutine reader, which would otherwise parse the binary again.
    shared: HashMap<(u64, u64), std::sync::Weak<crate::proto::gosym::GoSymbols>>,
}

impl Attacher {
    pub fn new(ebpf: &mut Ebpf, want: GoUprobes, listing: Lister) -> Result<Self, WatchError> {
        let (mode, _) = choose_mode(ebpf, want);
        Ok(Attacher {
            funcs: HashMap::new(),
            binaries: HashMap::new(),
            procs: take_map(ebpf, go_maps::GO_PROCS)?,
            args: take_map(ebpf, go_maps::GO_ARGS)?,
            addrs: take_map(ebpf, go_maps::GO_ADDRS)?,
            mode,
            known: HashSet::new(),
            last_poll: None,
            listing,
            left_alone: HashMap::new(),
            retired: 0,
            inspector: Inspector::start()
                .inspect_err(|e| tracing::warn!("no worker thread to read Go binaries, reading them on the scan loop: {e}"))
                .ok(),
            pending: HashMap::new(),
            attaching: VecDeque::new(),
            late: LateScanner::start()
                .inspect_err(|e| {
                    tracing::warn!("no worker thread to read goroutines: calls begun before plegwatch started are not seen: {e}")
                })
                .ok(),
            late_queued: HashSet::new(),
            last_why: None,
            symbols: Vec::new(),
            shared: HashMap::new(),
        })
    }

    /// Detaches every Go probe, many at once (see [`detach_parallel`]); the
    /// eBPF object would otherwise close them one by one when dropped.
    pub fn detach(&mut self, ebpf: &mut Ebpf) {
        let started = Instant::now();
        let mut links = Vec::new();
        for b in self.binaries.values_mut() {
            if let Binary::Probed { links: l, .. } = b {
                links.append(l);
            }
        }
        let n = detach_parallel(ebpf, links);
        tracing::info!(links = n, took_ms = started.elapsed().as_millis() as u64, "Go probes detached");
    }

    /// Probes a binary named on the command line, whether or not it runs now.
    pub fn attach_path(&mut self, ebpf: &mut Ebpf, target: &str, path: &Path, out: &mut Vec<Event>) -> Result<(), String> {
        let t = target_named(target).ok_or_else(|| format!("unknown target {target}"))?;
        let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.last_why = None;
        self.probe_binary(ebpf, t, (meta.dev(), meta.ino()), path, path, 0, "flag", out);
        match self.binaries.get(&(meta.dev(), meta.ino())) {
            Some(Binary::Probed { .. }) => Ok(()),
            _ => {
                let shown = path.display().to_string();
                let why = self.last_why.take().unwrap_or_else(|| "see the target line".into());
                // The reason often starts with the path already.
                let why = why.strip_prefix(&format!("{shown}: ")).map(str::to_string).unwrap_or(why);
                Err(format!("{shown}: not probed: {why}"))
            }
        }
    }

    /// Polls `/proc` for target processes, at most every [`POLL_EVERY`].
    pub fn poll(&mut self, ebpf: &mut Ebpf, found_by: &'static str, out: &mut Vec<Event>) {
        if self.last_poll.is_some_and(|t| t.elapsed() < POLL_EVERY) {
            return;
        }
        self.last_poll = Some(Instant::now());
        let listed: Vec<(u32, u64, Option<String>)> =
            self.listing.latest().identified().map(|(pid, ino, comm)| (pid, ino, comm.map(String::from))).collect();
        let mut alive = HashSet::new();
        let mut running = HashSet::new();
        for (pid, ino, comm) in listed {
            alive.insert(pid);
            // A comm that names no target needs no further look (the listing read it once).
            if !self.known.contains(&pid) && comm.as_deref().is_some_and(|c| target_of(c).is_none()) {
                continue;
            }
            // Nor does a process already seen running a binary left alone.
            if let Some((seen_ino, key)) = self.left_alone.get(&pid) {
                if *seen_ino == ino && matches!(self.binaries.get(key), Some(Binary::Skipped)) {
                    running.insert(*key);
                    continue;
                }
            }
            let key = self.look_at(ebpf, pid, found_by, out);
            match key {
                Some(k) if matches!(self.binaries.get(&k), Some(Binary::Skipped)) => {
                    self.left_alone.insert(pid, (ino, k));
                }
                _ => {
                    self.left_alone.remove(&pid);
                }
            }
            running.extend(key);
        }
        self.left_alone.retain(|p, _| alive.contains(p));
        self.retire_upgraded(ebpf, &running, out);
        // Forget processes that are gone, so a reused pid is not read as Go.
        let gone: Vec<u32> = self.known.iter().copied().filter(|p| !alive.contains(p)).collect();
        for pid in gone {
            let _ = self.procs.remove(&pid);
            self.known.remove(&pid);
        }
        self.late_queued.retain(|p| alive.contains(p));
    }

    /// A process called `execve` (from the kernel's `proc_exec` record).
    pub fn on_exec(&mut self, ebpf: &mut Ebpf, pid: u32, out: &mut Vec<Event>) {
        self.listing.on_exec(pid);
        self.left_alone.remove(&pid);
        // Its previous image may have been a Go target; the new one decides.
        if self.known.remove(&pid) {
            let _ = self.procs.remove(&pid);
        }
        let _ = self.look_at(ebpf, pid, "exec", out);
    }

    /// Gives back the ids and links of probed binaries that were replaced
    /// or deleted on disk and that no process runs any more (an upgrade
    /// leaves the old inode behind): without this, ids run out after a few
    /// dozen upgrades and nothing new gets probed. A binary named by flag is
    /// probed again at its path.
    fn retire_upgraded(&mut self, ebpf: &mut Ebpf, running: &HashSet<(u64, u64)>, out: &mut Vec<Event>) {
        let gone: Vec<(u64, u64)> = self
            .binaries
            .iter()
            .filter_map(|(key, b)| match b {
                Binary::Probed { path, .. } => {
                    let same = std::fs::metadata(path).is_ok_and(|m| (m.dev(), m.ino()) == *key);
                    retire(running.contains(key), same).then_some(*key)
                }
                Binary::Skipped => None,
            })
            .collect();
        for key in gone {
            let Some(Binary::Probed { target, ids, links, addrs, path, by_flag, .. }) = self.binaries.remove(&key) else { continue };
            detach_all(ebpf, links);
            self.forget_addrs(&addrs);
            for id in &ids {
                self.funcs.remove(id);
            }
            self.retired += 1;
            tracing::debug!(target = target.name, binary = %path.display(), ids = ids.len(), "retired: probes removed, ids freed");
            out.push(Event::Target(crate::events::Target {
                why: Some("replaced on disk and no longer run: its probes are removed".into()),
                ..crate::events::Target::new(target.name, "retired", 0, &path, "poll")
            }));
            if by_flag {
                let _ = self.attach_path(ebpf, target.name, &path, out);
            }
        }
    }

    /// Takes `addrs` out of `GO_ADDRS`, each only if it still names the
    /// same function (a copy of the same build probed since took it over).
    fn forget_addrs(&mut self, addrs: &[(GoAddrKey, u32)]) {
        for (key, id) in addrs {
            if self.addrs.get(key, 0).is_ok_and(|v| v == *id) {
                let _ = self.addrs.remove(key);
            }
        }
    }

    /// Function ids in use, and binaries retired so far.
    pub fn ids_in_use(&self) -> (usize, u64) {
        (self.funcs.len(), self.retired)
    }

    /// Probes the binary of `pid` if it is a target not seen yet, and
    /// registers the process for goroutine ids at kernel probes. Returns the
    /// binary's (dev, inode) when the process runs a target.
    fn look_at(&mut self, ebpf: &mut Ebpf, pid: u32, found_by: &'static str, out: &mut Vec<Event>) -> Option<(u64, u64)> {
        if pid == crate::observe::namespaces::self_tgid() {
            return None;
        }
        if self.known.contains(&pid) {
            let meta = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
            return Some((meta.dev(), meta.ino()));
        }
        let comm = procfs::comm(pid)?;
        let target = target_of(&comm)?;
        let meta = std::fs::metadata(format!("/proc/{pid}/exe")).ok()?;
        let key = (meta.dev(), meta.ino());
        if let Some(pids) = self.pending.get_mut(&key) {
            pids.push((pid, found_by));
            return Some(key);
        }
        let (open_path, path) = stable_path(pid, key);
        if !self.binaries.contains_key(&key) {
            // At an exec or by the poll, the binary is read off the loop ([`Attacher::finish`]
            // attaches it); at startup and for a flag, here.
            let queued = match (&self.inspector, found_by) {
                (Some(inspector), "exec" | "poll") => match std::fs::File::open(&open_path) {
                    Ok(file) => inspector.submit(Job { key, target, file, path: path.clone() }).is_ok(),
                    // Gone already: the next process running it is looked at again.
                    Err(_) => return None,
                },
                _ => false,
            };
            if queued {
                self.pending.insert(key, vec![(pid, found_by)]);
                return Some(key);
            }
            self.probe_binary(ebpf, target, key, &open_path, &path, pid, found_by, out);
        } else if let Some(Binary::Probed { target, .. }) = self.binaries.get(&key) {
            if target.name != "runc" {
                out.push(Event::Target(crate::events::Target::new(target.name, "traced", pid, &path, found_by)));
            }
        }
        if let Some(Binary::Probed { g_tls: Some(off), .. }) = self.binaries.get(&key) {
            if self.procs.insert(pid, GoProc { g_tls_off: *off }, 0).is_ok() {
                self.known.insert(pid);
            }
        }
        self.queue_late(pid, key);
        Some(key)
    }

    /// Queues the reading of `pid`'s goroutines, once per process, when its binary
    /// `key` is probed (its uprobes on: a call found open then is closed by its RET
    /// probe). Not for runc, which lives for milliseconds.
    fn queue_late(&mut self, pid: u32, key: (u64, u64)) {
        let Some(Binary::Probed { target, ids, .. }) = self.binaries.get(&key) else { return };
        if target.name == "runc" || self.late_queued.contains(&pid) {
            return;
        }
        let Some(late) = &self.late else { return };
        let funcs = ids
            .iter()
            .filter_map(|id| {
                self.funcs.get(id).map(|f| LateFunc {
                    id: *id,
                    symbol: f.symbol,
                    role: f.role,
                    recv: f.recv,
                    arg: f.arg.map(|a| (a.reg, a.off)),
                })
            })
            .collect();
        let syms = self.shared.get(&key).and_then(std::sync::Weak::upgrade);
        if late.submit(LateJob { pid, target: target.name, funcs, syms }) {
            self.late_queued.insert(pid);
        }
    }

    /// The binary reader and the goroutine reader, for the loop's `select!`.
    pub fn workers(&mut self) -> (Option<&mut Inspector>, Option<&mut LateScanner>) {
        (self.inspector.as_mut(), self.late.as_mut())
    }

    /// Inspects and attaches one binary at once; reports it with a `target`
    /// line (startup, `--containerd`/`--kubelet`, and when there is no worker).
    #[allow(clippy::too_many_arguments)]
    fn probe_binary(
        &mut self,
        ebpf: &mut Ebpf,
        target: &'static Target,
        key: (u64, u64),
        open_path: &Path,
        path: &Path,
        pid: u32,
        found_by: &'static str,
        out: &mut Vec<Event>,
    ) {
        let inspected = inspect(open_path, target);
        let mut plan = self.plan(target, key, open_path, path, pid, found_by, inspected, None);
        if plan.why.is_none() {
            self.attach_points(ebpf, &mut plan, None);
        }
        self.conclude(ebpf, plan, out);
    }

    /// The symbols of the binaries probed since the last call (read at startup on the
    /// loop, or off it by the inspector), by `stat`'s (dev, inode).
    pub fn take_symbols(&mut self) -> Vec<((u64, u64), std::sync::Arc<crate::proto::gosym::GoSymbols>)> {
        std::mem::take(&mut self.symbols)
    }

    /// A binary read off the loop: plans its attach (see [`Attacher::attach_some`]).
    pub fn finish(&mut self, done: Done) {
        let Done { job, inspected, took } = done;
        let Some(&(first, found_by)) = self.pending.get(&job.key).and_then(|p| p.first()) else { return };
        tracing::debug!(binary = %job.path.display(), took_ms = took.as_millis() as u64, "Go binary read off the scan loop");
        let open_path = job.open_path();
        let plan = self.plan(job.target, job.key, &open_path, &job.path, first, found_by, inspected, Some(job.file));
        // Attached a slice at a time by [`Attacher::attach_some`]; its processes stay in
        // `pending` until then, so that none is looked at twice.
        self.attaching.push_back(plan);
    }

    /// What attaching an inspected binary takes: its function ids taken, the
    /// points to attach listed, or why not.
    #[allow(clippy::too_many_arguments)]
    fn plan(
        &mut self,
        target: &'static Target,
        key: (u64, u64),
        open_path: &Path,
        path: &Path,
        pid: u32,
        found_by: &'static str,
        inspected: Result<Inspection, crate::proto::gosym::GoSymError>,
        file: Option<std::fs::File>,
    ) -> Plan {
        let mut plan = Plan {
            target,
            key,
            open_path: open_path.to_path_buf(),
            path: path.to_path_buf(),
            found_by,
            line: crate::events::Target::new(target.name, "probed", pid, path, found_by),
            todo: VecDeque::new(),
            links: Vec::new(),
            addrs: Vec::new(),
            ids: Vec::new(),
            g_tls: None,
            why: None,
            transient: false,
            _file: file,
        };
        let mut i = match inspected {
            Ok(i) => i,
            Err(e) => {
                // The process may be gone already (a short-lived runc): try again with the next one.
                plan.transient = !open_path.exists();
                // Not a Go binary we can read (a wrapper script named runc, a stripped C binary).
                plan.line.status = "unmatched";
                plan.why = Some(e.to_string());
                return plan;
            }
        };
        plan.line.go_version = i.go_version.clone();
        if let Some(symbols) = i.symbols.take() {
            self.shared.retain(|_, w| w.strong_count() > 0);
            self.shared.insert(key, std::sync::Arc::downgrade(&symbols));
            self.symbols.push((key, symbols));
        }
        if i.found.is_empty() {
            plan.line.status = "unmatched";
            plan.why = Some(format!(
                "none of the expected functions in its .gopclntab (unknown {} version?); looked for {}",
                target.name,
                i.missing.iter().map(|m| short(m.symbol)).collect::<Vec<_>>().join(", ")
            ));
            return plan;
        }
        plan.g_tls = i.g_tls.as_ref().ok().copied();
        if let Err(e) = &i.g_tls {
            tracing::warn!(binary = %path.display(), "no goroutine ids at kernel probes: {e}");
        }
        let (entry, ret) = self.mode.programs();
        let by_address = self.mode == GoUprobes::Address;
        for (spec, points) in &i.found {
            let Some(id) = free_id(&self.funcs) else {
                plan.why = Some(format!("all {} function ids are in use by other binaries", GO_FUNCS_MAX - 1));
                return plan;
            };
            let _ = self.args.set(id, arg_spec(spec.arg, spec.recv), 0);
            let cookie = (!by_address).then_some(id);
            plan.todo.push_back((entry, points.entry_offset, cookie));
            plan.todo.extend(points.ret_offsets.iter().map(|off| (ret, *off, cookie)));
            if by_address {
                for off in std::iter::once(&points.entry_offset).chain(&points.ret_offsets) {
                    let Some((code_len, rel)) = i.elf.code_place(*off) else {
                        plan.why = Some(format!("{} at file offset {off:#x} is outside the binary's executable code", short(spec.symbol)));
                        return plan;
                    };
                    plan.addrs.push((GoAddrKey { code_len, rel }, id));
                }
            }
            self.funcs.insert(
                id,
                ProbedFunc {
                    symbol: spec.symbol,
                    role: spec.role,
                    arg: spec.arg,
                    recv: spec.recv,
                    target: target.name,
                    binary: path.to_path_buf(),
                },
            );
            plan.ids.push(id);
            plan.line.functions.push(format!("{} ({} RETs)", short(spec.symbol), points.ret_offsets.len()));
        }
        // Goroutine ends, so that a call a panic unwound past is dropped.
        match i.goexit {
            Some(off) => plan.todo.push_back(("go_exit", off, None)),
            None => tracing::warn!(binary = %path.display(), "no {GOEXIT}: a call a panic unwinds past stays open until its process exits"),
        }
        // containerd's ttrpc 1.1 client: who each request is for.
        if let (Some((dispatch, send)), "containerd") = (i.ttrpc11, target.name) {
            plan.todo.push_back(("ttrpc_dispatch", dispatch, None));
            plan.todo.push_back(("ttrpc_send", send, None));
            plan.line.functions.push("ttrpc.(*Client).dispatch, send (entry, ttrpc 1.1)".into());
        }
        plan.line.g_tls_offset = plan.g_tls;
        plan.line.uprobes = Some(self.mode.name());
        // In the map before the first point is attached, so that no hit goes unnamed.
        for (key, id) in &plan.addrs {
            if let Err(e) = self.addrs.insert(key, id, 0) {
                plan.why = Some(format!("GO_ADDRS: {e} (full at {} points?)", plegwatch_abi::GO_ADDRS_MAX));
                return plan;
            }
        }
        // Attached, but not everything expected: `partial`, never `probed`.
        if !i.missing.is_empty() {
            plan.line.status = "partial";
            plan.line.left_out = i.missing.iter().map(Missing::describe).collect();
        }
        plan
    }

    /// Attaches the plan's points, all of them or until `budget` is spent;
    /// returns whether some are left. A failure ends the plan (`why`).
    fn attach_points(&mut self, ebpf: &mut Ebpf, plan: &mut Plan, budget: Option<Duration>) -> bool {
        let started = Instant::now();
        while let Some((program, offset, cookie)) = plan.todo.pop_front() {
            match attach_point(ebpf, program, &plan.open_path, offset, cookie) {
                Ok(l) => plan.links.push(l),
                Err(e) => {
                    plan.transient = !plan.open_path.exists();
                    plan.why = Some(e);
                    plan.todo.clear();
                    return false;
                }
            }
            if budget.is_some_and(|b| started.elapsed() >= b) {
                return !plan.todo.is_empty();
            }
        }
        false
    }

    /// Ends a plan: the binary probed, or left alone (its points detached and
    /// ids given back); its `target` line.
    fn conclude(&mut self, ebpf: &mut Ebpf, mut plan: Plan, out: &mut Vec<Event>) {
        let (pid, target, path) = (plan.line.pid, plan.target, plan.path.clone());
        match plan.why.take() {
            None => {
                tracing::debug!(pid, target = target.name, binary = %path.display(), "probing Go functions (entry + every RET): {}", plan.line.functions.join(", "));
                if !plan.line.left_out.is_empty() {
                    tracing::warn!(pid, target = target.name, binary = %path.display(), "partly probed; left out: {}", plan.line.left_out.join("; "));
                }
                let links = std::mem::take(&mut plan.links);
                let addrs = std::mem::take(&mut plan.addrs);
                self.binaries.insert(
                    plan.key,
                    Binary::Probed { target, g_tls: plan.g_tls, ids: plan.ids, links, addrs, path, by_flag: plan.found_by == "flag" },
                );
            }
            Some(why) => {
                detach_all(ebpf, std::mem::take(&mut plan.links));
                let addrs = std::mem::take(&mut plan.addrs);
                self.forget_addrs(&addrs);
                for id in &plan.ids {
                    self.funcs.remove(id);
                }
                if matches!(plan.line.status, "probed" | "partial") {
                    plan.line.status = "failed";
                }
                if plan.transient {
                    // Not remembered: the next process running it is tried again.
                    tracing::debug!(pid, target = target.name, binary = %path.display(), "Go binary gone before it was probed: {why}");
                    return;
                }
                tracing::warn!(pid, target = target.name, binary = %path.display(), "Go binary not probed: {why}");
                self.last_why = Some(why.clone());
                plan.line.why = Some(why);
                self.binaries.insert(plan.key, Binary::Skipped);
            }
        }
        out.push(Event::Target(plan.line));
    }

    /// Whether a binary read off the loop is being attached, a slice at a time.
    pub fn attaching(&self) -> bool {
        !self.attaching.is_empty()
    }

    /// Attaches up to `budget`'s worth of the first binary's points; once all
    /// are on, reports it and registers the processes found running it.
    pub fn attach_some(&mut self, ebpf: &mut Ebpf, budget: Duration, out: &mut Vec<Event>) {
        let Some(mut plan) = self.attaching.pop_front() else { return };
        if plan.why.is_none() && self.attach_points(ebpf, &mut plan, Some(budget)) {
            self.attaching.push_front(plan);
            return;
        }
        let key = plan.key;
        self.conclude(ebpf, plan, out);
        let pids = self.pending.remove(&key).unwrap_or_default();
        for (i, &(pid, found_by)) in pids.iter().enumerate() {
            if i == 0 {
                if let Some(Binary::Probed { g_tls: Some(off), .. }) = self.binaries.get(&key) {
                    if self.procs.insert(pid, GoProc { g_tls_off: *off }, 0).is_ok() {
                        self.known.insert(pid);
                    }
                }
                self.queue_late(pid, key);
                continue;
            }
            // The others found meanwhile: a `traced` line each, and GO_PROCS.
            let _ = self.look_at(ebpf, pid, found_by, out);
        }
    }
}

/// Attaching one binary: its points still to attach, those attached, and its
/// `target` line, or why it failed.
struct Plan {
    target: &'static Target,
    key: (u64, u64),
    open_path: PathBuf,
    path: PathBuf,
    found_by: &'static str,
    line: crate::events::Target,
    /// (program, offset, cookie) still to attach.
    todo: VecDeque<(&'static str, u64, Option<u32>)>,
    links: Vec<Link>,
    /// Its points by place in the code, in `GO_ADDRS` (address mode).
    addrs: Vec<(GoAddrKey, u32)>,
    ids: Vec<u32>,
    g_tls: Option<i64>,
    why: Option<String>,
    transient: bool,
    /// The binary, held open while `open_path` (`/proc/self/fd/N`) is in use.
    _file: Option<std::fs::File>,
}

/// Where the targets' binaries usually live, looked at by `doctor` even when
/// no process runs them.
const USUAL_PATHS: &[(&str, &str)] = &[
    ("containerd", "/usr/bin/containerd"),
    ("containerd", "/usr/local/bin/containerd"),
    ("containerd-shim", "/usr/bin/containerd-shim-runc-v2"),
    ("containerd-shim", "/usr/local/bin/containerd-shim-runc-v2"),
    ("kubelet", "/usr/bin/kubelet"),
    ("kubelet", "/usr/local/bin/kubelet"),
    ("runc", "/usr/sbin/runc"),
    ("runc", "/usr/bin/runc"),
    ("runc", "/usr/local/sbin/runc"),
];

/// A target binary on this node: where it is and which processes run it.
#[derive(Clone, Debug)]
pub struct Found {
    pub target: &'static Target,
    pub path: PathBuf,
    pub pids: Vec<u32>,
}

/// Every target binary running now (by comm, one entry per inode) or at a usual path.
pub fn survey() -> Vec<Found> {
    survey_with(&[])
}

/// [`survey`], plus binaries named by path with their target (`doctor
/// --containerd PATH`); a named path comes first for its inode.
pub fn survey_with(named: &[(&str, PathBuf)]) -> Vec<Found> {
    let mut by_inode: HashMap<(u64, u64), Found> = HashMap::new();
    for (name, path) in named {
        let (Some(target), Ok(meta)) = (target_named(name), std::fs::metadata(path)) else { continue };
        by_inode.entry((meta.dev(), meta.ino())).or_insert(Found { target, path: path.clone(), pids: Vec::new() });
    }
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Some(target) = procfs::comm(pid).and_then(|c| target_of(&c)) else { continue };
            let exe = PathBuf::from(format!("/proc/{pid}/exe"));
            let Ok(meta) = std::fs::metadata(&exe) else { continue };
            let path = std::fs::read_link(&exe).unwrap_or(exe);
            by_inode.entry((meta.dev(), meta.ino())).or_insert(Found { target, path, pids: Vec::new() }).pids.push(pid);
        }
    }
    for (name, path) in USUAL_PATHS {
        let (Some(target), Ok(meta)) = (target_named(name), std::fs::metadata(path)) else { continue };
        by_inode.entry((meta.dev(), meta.ino())).or_insert(Found { target, path: PathBuf::from(path), pids: Vec::new() });
    }
    let mut out: Vec<Found> = by_inode.into_values().collect();
    out.sort_by(|a, b| (a.target.name, &a.path).cmp(&(b.target.name, &b.path)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gowatch::targets::Role;

    fn func() -> ProbedFunc {
        ProbedFunc { symbol: "f", role: Role::Relist, arg: None, recv: None, target: "kubelet", binary: PathBuf::from("/x") }
    }

    #[test]
    fn ids_given_back_are_reused_and_none_is_handed_out_twice() {
        let mut in_use = HashMap::new();
        for _ in 0..5 {
            let id = free_id(&in_use).unwrap();
            in_use.insert(id, func());
        }
        assert_eq!(in_use.keys().copied().max(), Some(5));
        in_use.remove(&2);
        assert_eq!(free_id(&in_use), Some(2), "the smallest id given back");
        let all: HashMap<u32, ProbedFunc> = (1..GO_FUNCS_MAX).map(|i| (i, func())).collect();
        assert_eq!(free_id(&all), None, "none left: the caller reports it, nothing is overwritten");
    }

    #[test]
    fn only_an_upgraded_binary_nobody_runs_is_retired() {
        assert!(retire(false, false), "replaced on disk, not running: retired");
        assert!(!retire(true, false), "replaced but still running: kept");
        assert!(!retire(false, true), "not running now but still the file at its path (runc between runs): kept");
    }
}
