//! Go function timing on stripped binaries: kubelet's PLEG relist clock.
//!
//! Finds running kubelets (by comm), reads their `.gopclntab`, and puts a
//! uprobe at the entry and at every RET of the relist function (see
//! `probe-ebpf/src/gofuncs.rs`). A relist still open past the thresholds is a
//! `pleg_relist` stall; its wait is the time since that relist started, which
//! is kubelet's own clock (`relistTime` is stamped at the start of a relist).
//! Binaries are attached once per (device, inode): a restarted kubelet runs
//! the same file and is covered by the same probes; an upgraded one is a new
//! inode, found at the next discovery pass.

use crate::{
    collector::{WatchError, take_map, wall_of},
    gosym::GoBinary,
    inflight::{Action, Filter, Item, Registry},
    levels::{Thresholds, budget_used},
    output::{Event, Sink, Stall},
    procfs,
    syscalls::WaitKind,
};
use aya::{
    Ebpf,
    maps::{HashMap as BpfHashMap, MapData},
    programs::{
        UProbe,
        uprobe::{UProbeAttachLocation, UProbeAttachPoint, UProbeScope},
    },
};
use plegwatch_abi::{EventKind, GoCall, GoCallEnd, GoCallKey, go_maps};
use serde_json::json;
use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::PathBuf,
    time::{Duration, Instant},
};

/// A Go function plegwatch probes.
#[derive(Clone, Copy, Debug)]
pub struct GoFuncSpec {
    /// The exact name in `.gopclntab`.
    pub symbol: &'static str,
    pub role: Role,
}

/// What a probed function means for the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// kubelet's PLEG relist.
    Relist,
    /// containerd's CRI container `(*statusStorage).Get`: takes the Status
    /// lock for reading (the receiver is the lock: the RWMutex is at offset 0).
    StatusGet,
    /// `(*statusStorage).Update`/`UpdateSync`: holds it for writing.
    StatusUpdate,
    /// A CRI handler (ListContainers, UpdateContainerResources, ...).
    CriHandler,
}

const fn spec(symbol: &'static str, role: Role) -> GoFuncSpec {
    GoFuncSpec { symbol, role }
}

/// A group of names for one function across versions: the first found is probed.
pub type Group = &'static [GoFuncSpec];

/// kubelet's relist, newest name first: `Relist` from v1.26 (Evented PLEG PR
/// #111384), `relist` up to v1.25.
pub const KUBELET: &[Group] = &[&[
    spec("k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Relist", Role::Relist),
    spec("k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).relist", Role::Relist),
]];

/// containerd's CRI Status store and handlers: 1.6/1.7 (`pkg/cri/server`,
/// and 1.7's `pkg/cri/sbserver`), 2.x (`v2/internal/cri/server`). Checked on
/// Debian's containerd 1.6.20 (Go 1.19.8); 1.7 and 2.x names are from the
/// catalog, not checked on a binary here.
pub const CONTAINERD: &[Group] = &[
    &[
        spec("github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).Get", Role::StatusGet),
        spec("github.com/containerd/containerd/v2/internal/cri/store/container.(*statusStorage).Get", Role::StatusGet),
    ],
    &[
        spec("github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).Update", Role::StatusUpdate),
        spec("github.com/containerd/containerd/v2/internal/cri/store/container.(*statusStorage).Update", Role::StatusUpdate),
    ],
    &[
        spec("github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).UpdateSync", Role::StatusUpdate),
        spec("github.com/containerd/containerd/v2/internal/cri/store/container.(*statusStorage).UpdateSync", Role::StatusUpdate),
    ],
    &[
        spec("github.com/containerd/containerd/pkg/cri/server.(*criService).ListContainers", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/server.(*criService).ListContainers", Role::CriHandler),
    ],
    &[
        spec("github.com/containerd/containerd/pkg/cri/server.(*criService).ListPodSandbox", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/server.(*criService).ListPodSandbox", Role::CriHandler),
    ],
    &[
        spec("github.com/containerd/containerd/pkg/cri/server.(*criService).ContainerStatus", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/server.(*criService).ContainerStatus", Role::CriHandler),
    ],
    &[
        spec("github.com/containerd/containerd/pkg/cri/server.(*criService).PodSandboxStatus", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/server.(*criService).PodSandboxStatus", Role::CriHandler),
    ],
    &[
        spec("github.com/containerd/containerd/pkg/cri/server.(*criService).UpdateContainerResources", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/server.(*criService).UpdateContainerResources", Role::CriHandler),
    ],
    &[spec("github.com/containerd/containerd/pkg/cri/server.handleContainerExit", Role::CriHandler)],
    &[spec("github.com/containerd/containerd/pkg/cri/sbserver.(*criService).ListContainers", Role::CriHandler)],
    &[spec("github.com/containerd/containerd/pkg/cri/sbserver.(*criService).UpdateContainerResources", Role::CriHandler)],
];

/// Whether a process (by comm) gets a set of probes.
type CommTest = fn(&str) -> bool;

/// Which processes get which probes: (comm test, groups).
const TARGETS: &[(CommTest, &[Group])] = &[(|c| c.contains("kubelet"), KUBELET), (|c| c == "containerd", CONTAINERD)];

/// How often running processes are checked for new binaries to probe.
const DISCOVER_EVERY: Duration = Duration::from_secs(2);

/// A probed function, by attach cookie.
#[derive(Clone, Debug)]
struct ProbedFunc {
    symbol: &'static str,
    role: Role,
    binary: PathBuf,
}

/// Attaches `program` at file offset `offset` of `target`, for every process
/// running it, with `cookie` naming the function.
fn attach_point(ebpf: &mut Ebpf, program: &str, target: &str, offset: u64, cookie: u32) -> Result<(), String> {
    let prog: &mut UProbe = crate::probes::program_mut(ebpf, program)?;
    prog.load()
        .or_else(|e| match e {
            aya::programs::ProgramError::AlreadyLoaded => Ok(()),
            e => Err(e),
        })
        .map_err(|e| format!("load {program}: {e}"))?;
    let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(u64::from(cookie)) };
    prog.attach(point, target, UProbeScope::AllProcesses)
        .map(|_| ())
        .map_err(|e| format!("attach {program} at {offset:#x} of {target}: {e}"))
}

/// The shim a containerd call is likely waiting on: among the processes at
/// the other end of containerd's unix sockets whose comm is `containerd-shim*`
/// (containerd is the client of each shim's ttrpc socket), the one with the
/// oldest open wait (`open_waits`: pid → (kind, start)), else the first found.
/// A blocked ttrpc call parks its goroutine in the netpoller, so which shim it
/// waits on is inferred, not read: `why` says so.
fn shim_holder(containerd: u32, open_waits: &HashMap<u32, (&'static str, u64)>) -> Option<serde_json::Value> {
    let mut peers = crate::holders::UnixPeers::new();
    let mut owners = crate::holders::SocketOwners::new();
    let mut shims: Vec<u32> = Vec::new();
    for (_, inode) in procfs::socket_fds(containerd) {
        let Some(peer) = peers.peer_of(inode) else { continue };
        for pid in owners.pids_of(peer.peer_inode) {
            if pid != containerd && procfs::comm(pid).is_some_and(|c| c.starts_with("containerd-shim")) && !shims.contains(&pid) {
                shims.push(pid);
            }
        }
    }
    let pick = shims
        .iter()
        .filter_map(|p| open_waits.get(p).map(|(_, start)| (*p, *start)))
        .min_by_key(|(_, start)| *start)
        .map(|(p, _)| p)
        .or_else(|| shims.first().copied())?;
    Some(json!({
        "kind": "shim",
        "pid": pick,
        "comm": procfs::comm(pick),
        "state": procfs::state(pick).map(String::from),
        "wchan": procfs::wchan(pick),
        "shims": shims,
        "why": "containerd waits on a shim's ttrpc reply; of the shims it is connected to, this one has the oldest open wait",
    }))
}

/// `pkg.(*T).Method` without the import path.
fn short(symbol: &str) -> &str {
    symbol.rsplit('/').next().unwrap_or(symbol)
}

/// An open Go call: the registry's item for kinds `pleg_relist`, `go_lock`, `cri_call`.
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
}

impl Item for GoOpen {
    type Key = (u64, u32);
    fn key(&self) -> Self::Key {
        (self.g, self.func)
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
}

pub struct GoWatch {
    registry: Registry<GoOpen>,
    calls: BpfHashMap<MapData, GoCallKey, GoCall>,
    funcs: HashMap<u32, ProbedFunc>,
    /// Binaries already looked at, by (device, inode).
    seen: HashSet<(u64, u64)>,
    last_discover: Option<Instant>,
    /// Per kubelet process: the last relist's duration.
    last_relist: HashMap<u32, Duration>,
    /// Status `Get`s open now, by lock address: (how many, earliest start).
    gets: HashMap<u64, (u32, u64)>,
}

impl GoWatch {
    pub fn new(ebpf: &mut Ebpf, thresholds: Thresholds, filter: Filter) -> Result<Self, WatchError> {
        Ok(GoWatch {
            registry: Registry::new(thresholds, filter),
            calls: take_map(ebpf, go_maps::GO_CALLS)?,
            funcs: HashMap::new(),
            seen: HashSet::new(),
            last_discover: None,
            last_relist: HashMap::new(),
            gets: HashMap::new(),
        })
    }

    /// Looks for kubelets whose binary is not probed yet and probes them.
    pub fn discover(&mut self, ebpf: &mut Ebpf) {
        if self.last_discover.is_some_and(|t| t.elapsed() < DISCOVER_EVERY) {
            return;
        }
        self.last_discover = Some(Instant::now());
        let Ok(dir) = std::fs::read_dir("/proc") else { return };
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            if pid == std::process::id() {
                continue;
            }
            let Some(comm) = procfs::comm(pid) else { continue };
            let Some((_, groups)) = TARGETS.iter().find(|(wants, _)| wants(&comm)) else { continue };
            let exe = PathBuf::from(format!("/proc/{pid}/exe"));
            let Ok(meta) = std::fs::metadata(&exe) else { continue };
            if !self.seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            match self.attach_binary(ebpf, pid, groups) {
                Ok((path, probed)) => tracing::info!(
                    pid,
                    comm,
                    binary = %path.display(),
                    functions = probed.len(),
                    "probing Go functions (entry + every RET): {}",
                    probed.join(", ")
                ),
                Err(e) => tracing::warn!(pid, comm, "Go binary not probed: {e}"),
            }
        }
    }

    /// Probes, for each group, the first function the binary of `pid` has.
    /// Returns the binary's path and the functions probed (with their RET
    /// counts); an error when none is found.
    fn attach_binary(&mut self, ebpf: &mut Ebpf, pid: u32, groups: &[Group]) -> Result<(PathBuf, Vec<String>), String> {
        let path = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
        // Through /proc, so a binary replaced on disk since it started still opens.
        let target = format!("/proc/{pid}/exe");
        let bin = GoBinary::open(&target).map_err(|e| e.to_string())?;
        let mut probed = Vec::new();
        for group in groups {
            let Some(spec) = group.iter().find(|s| bin.symbols().lookup(s.symbol).is_some()) else { continue };
            let points = match bin.probe_points(spec.symbol) {
                Ok(p) => p,
                Err(e) => {
                    tracing::warn!(symbol = spec.symbol, "not probed: {e}");
                    continue;
                }
            };
            let id = self.funcs.len() as u32 + 1;
            attach_point(ebpf, "go_entry", &target, points.entry_offset, id)?;
            for off in &points.ret_offsets {
                attach_point(ebpf, "go_ret", &target, *off, id)?;
            }
            self.funcs.insert(id, ProbedFunc { symbol: spec.symbol, role: spec.role, binary: path.clone() });
            probed.push(format!("{} ({} RETs)", short(spec.symbol), points.ret_offsets.len()));
        }
        if probed.is_empty() {
            return Err(format!("{}: none of the expected functions in its .gopclntab (unknown version?)", path.display()));
        }
        Ok((path, probed))
    }

    /// Takes one `GO_EVENTS` record.
    pub fn on_record(&mut self, bytes: &[u8], sink: &mut dyn Sink) {
        if bytes.len() < std::mem::size_of::<GoCallEnd>() {
            return;
        }
        // SAFETY: length checked; plain old data; read_unaligned copies.
        let rec: GoCallEnd = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        if rec.header.kind != EventKind::GoCallEnd as u32 {
            return;
        }
        let took = Duration::from_nanos(rec.end_ns.saturating_sub(rec.start_ns));
        if self.funcs.get(&rec.func).is_some_and(|f| f.role == Role::Relist) {
            self.last_relist.insert(rec.tgid, took);
        }
        let info = GoOpen {
            g: rec.g,
            func: rec.func,
            tgid: rec.tgid,
            tid: rec.tid,
            comm: procfs::comm(rec.tgid).unwrap_or_default(),
            start_ns: rec.start_ns,
            receiver: rec.receiver,
        };
        if self.funcs.get(&rec.func).is_some_and(|f| f.role == Role::StatusGet) {
            return;
        }
        let actions = self.registry.end(info, rec.end_ns);
        self.act(actions, rec.end_ns, &HashMap::new(), &HashMap::new(), sink);
    }

    /// Looks at the Go calls open now; `thread_waits` are the kernel waits open
    /// by thread (a goroutine in a syscall stays on its thread, so a lock
    /// holder's thread's wait is what the lock waits on).
    pub fn scan(
        &mut self,
        now_ns: u64,
        thread_waits: &HashMap<u32, serde_json::Value>,
        open_waits: &HashMap<u32, (&'static str, u64)>,
        sink: &mut dyn Sink,
    ) {
        let mut open = Vec::new();
        self.gets.clear();
        for (k, c) in self.calls.iter().filter_map(Result::ok) {
            let Some(f) = self.funcs.get(&k.func) else { continue };
            if f.role == Role::StatusGet {
                let e = self.gets.entry(c.receiver).or_insert((0, c.start_ns));
                e.0 += 1;
                e.1 = e.1.min(c.start_ns);
                continue;
            }
            open.push(GoOpen {
                g: k.g,
                func: k.func,
                tgid: c.tgid,
                tid: c.tid,
                comm: procfs::comm(c.tgid).unwrap_or_default(),
                start_ns: c.start_ns,
                receiver: c.receiver,
            });
        }
        let actions = self.registry.scan(open.iter(), now_ns);
        self.act(actions, now_ns, thread_waits, open_waits, sink);
    }

    fn act(
        &mut self,
        actions: Vec<Action<(u64, u32)>>,
        now_ns: u64,
        thread_waits: &HashMap<u32, serde_json::Value>,
        open_waits: &HashMap<u32, (&'static str, u64)>,
        sink: &mut dyn Sink,
    ) {
        for a in actions {
            match a {
                Action::Report { key, level, waited } => {
                    let Some(t) = self.registry.get(&key) else { continue };
                    let o = &t.info;
                    let f = self.funcs.get(&o.func);
                    let role = f.map(|f| f.role).unwrap_or(Role::CriHandler);
                    let holder = match role {
                        Role::StatusUpdate => shim_holder(o.tgid, open_waits),
                        _ => None,
                    };
                    let (kind, detail) = match role {
                        Role::Relist => (
                            WaitKind::PlegRelist,
                            json!({
                                "function": f.map(|f| f.symbol),
                                "binary": f.map(|f| f.binary.display().to_string()),
                                "goroutine": format!("{:#x}", o.g),
                                "since_relist_start_s": now_ns.saturating_sub(o.start_ns) as f64 / 1e9,
                                "last_relist_s": self.last_relist.get(&o.tgid).map(Duration::as_secs_f64),
                            }),
                        ),
                        Role::StatusUpdate | Role::StatusGet => {
                            let gets = self.gets.get(&o.receiver);
                            (
                                WaitKind::GoLock,
                                json!({
                                    "lock": format!("{:#x}", o.receiver),
                                    "lock_type": "sync.RWMutex (CRI container Status)",
                                    "holder_function": f.map(|f| f.symbol),
                                    "goroutine": format!("{:#x}", o.g),
                                    "thread": o.tid,
                                    "thread_wait": thread_waits.get(&o.tid),
                                    "waiting_gets": gets.map(|g| g.0).unwrap_or(0),
                                    "longest_get_wait_s": gets.map(|g| now_ns.saturating_sub(g.1) as f64 / 1e9),
                                    "binary": f.map(|f| f.binary.display().to_string()),
                                }),
                            )
                        }
                        Role::CriHandler => (
                            WaitKind::CriCall,
                            json!({
                                "function": f.map(|f| f.symbol),
                                "goroutine": format!("{:#x}", o.g),
                                "thread": o.tid,
                                "thread_wait": thread_waits.get(&o.tid),
                                "binary": f.map(|f| f.binary.display().to_string()),
                            }),
                        ),
                    };
                    sink.emit(&Event::Stall(Stall {
                        level,
                        id: t.id,
                        kind,
                        pid: o.tgid,
                        tid: o.tid,
                        comm: o.comm.clone(),
                        waited_s: waited.as_secs_f64(),
                        started_at: humantime::format_rfc3339_millis(wall_of(o.start_ns)).to_string(),
                        budget_used: budget_used(waited),
                        started_before_attach: false,
                        detail,
                        holder,
                        chain: Vec::new(),
                        kernel_stack: Vec::new(),
                        user_stack: Vec::new(),
                    }));
                }
                Action::Resolve { key, waited, exact } => {
                    let kind = match self.registry.get(&key).and_then(|t| self.funcs.get(&t.info.func)).map(|f| f.role) {
                        Some(Role::Relist) => WaitKind::PlegRelist,
                        Some(Role::StatusUpdate | Role::StatusGet) => WaitKind::GoLock,
                        _ => WaitKind::CriCall,
                    };
                    self.registry.resolve(&key, waited, exact, kind, sink);
                }
            }
        }
    }

    /// (stall lines, resolutions, still open).
    pub fn counts(&self) -> (u64, u64, u64) {
        let (s, r) = self.registry.counts();
        (s, r, self.registry.open().count() as u64)
    }
}
