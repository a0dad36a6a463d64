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
}

/// kubelet's relist, newest name first: `Relist` from v1.26 (Evented PLEG PR
/// #111384), `relist` up to v1.25.
pub const KUBELET: &[GoFuncSpec] = &[
    GoFuncSpec { symbol: "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Relist", role: Role::Relist },
    GoFuncSpec { symbol: "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).relist", role: Role::Relist },
];

/// How often running processes are checked for new binaries to probe.
const DISCOVER_EVERY: Duration = Duration::from_secs(2);

/// A probed function, by attach cookie.
#[derive(Clone, Debug)]
struct ProbedFunc {
    symbol: &'static str,
    role: Role,
    binary: PathBuf,
}

/// An open Go call: the registry's item for kind `pleg_relist`.
#[derive(Clone, Debug, PartialEq)]
pub struct GoOpen {
    pub g: u64,
    pub func: u32,
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
    pub start_ns: u64,
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
            if pid == std::process::id() || !procfs::comm(pid).is_some_and(|c| c.contains("kubelet")) {
                continue;
            }
            let exe = PathBuf::from(format!("/proc/{pid}/exe"));
            let Ok(meta) = std::fs::metadata(&exe) else { continue };
            if !self.seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            match self.attach_binary(ebpf, pid, KUBELET) {
                Ok((path, symbol, rets)) => tracing::info!(
                    pid,
                    binary = %path.display(),
                    symbol,
                    rets,
                    "probing kubelet's relist (entry + every RET)"
                ),
                Err(e) => tracing::warn!(pid, "kubelet binary not probed: {e}"),
            }
        }
    }

    /// Probes the first function of `specs` that the binary of `pid` has.
    fn attach_binary(
        &mut self,
        ebpf: &mut Ebpf,
        pid: u32,
        specs: &'static [GoFuncSpec],
    ) -> Result<(PathBuf, &'static str, usize), String> {
        let path = std::fs::read_link(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
        // Through /proc, so a binary replaced on disk since it started still opens.
        let bin = GoBinary::open(format!("/proc/{pid}/exe")).map_err(|e| e.to_string())?;
        let spec = specs
            .iter()
            .find(|s| bin.symbols().lookup(s.symbol).is_some())
            .ok_or_else(|| format!("{}: none of {:?} in its .gopclntab", path.display(), specs.iter().map(|s| s.symbol).collect::<Vec<_>>()))?;
        let points = bin.probe_points(spec.symbol).map_err(|e| e.to_string())?;
        let id = self.funcs.len() as u32 + 1;
        let target = format!("/proc/{pid}/exe");
        let attach = |ebpf: &mut Ebpf, program: &str, offset: u64| -> Result<(), String> {
            let prog: &mut UProbe = crate::probes::program_mut(ebpf, program)?;
            prog.load().or_else(|e| match e {
                aya::programs::ProgramError::AlreadyLoaded => Ok(()),
                e => Err(e),
            })
            .map_err(|e| format!("load {program}: {e}"))?;
            let point = UProbeAttachPoint { location: UProbeAttachLocation::AbsoluteOffset(offset), cookie: Some(u64::from(id)) };
            prog.attach(point, &target, UProbeScope::AllProcesses).map(|_| ()).map_err(|e| format!("attach {program} at {offset:#x}: {e}"))
        };
        attach(ebpf, "go_entry", points.entry_offset)?;
        for off in &points.ret_offsets {
            attach(ebpf, "go_ret", *off)?;
        }
        self.funcs.insert(id, ProbedFunc { symbol: spec.symbol, role: spec.role, binary: path.clone() });
        Ok((path, spec.symbol, points.ret_offsets.len()))
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
        };
        let actions = self.registry.end(info, rec.end_ns);
        self.act(actions, rec.end_ns, sink);
    }

    /// Looks at the Go calls open now.
    pub fn scan(&mut self, now_ns: u64, sink: &mut dyn Sink) {
        let open: Vec<GoOpen> = self
            .calls
            .iter()
            .filter_map(Result::ok)
            .filter(|(k, _)| self.funcs.contains_key(&k.func))
            .map(|(k, c)| GoOpen {
                g: k.g,
                func: k.func,
                tgid: c.tgid,
                tid: c.tid,
                comm: procfs::comm(c.tgid).unwrap_or_default(),
                start_ns: c.start_ns,
            })
            .collect();
        let actions = self.registry.scan(open.iter(), now_ns);
        self.act(actions, now_ns, sink);
    }

    fn act(&mut self, actions: Vec<Action<(u64, u32)>>, now_ns: u64, sink: &mut dyn Sink) {
        for a in actions {
            match a {
                Action::Report { key, level, waited } => {
                    let Some(t) = self.registry.get(&key) else { continue };
                    let o = &t.info;
                    let f = self.funcs.get(&o.func);
                    sink.emit(&Event::Stall(Stall {
                        level,
                        id: t.id,
                        kind: WaitKind::PlegRelist,
                        pid: o.tgid,
                        tid: o.tid,
                        comm: o.comm.clone(),
                        waited_s: waited.as_secs_f64(),
                        started_at: humantime::format_rfc3339_millis(wall_of(o.start_ns)).to_string(),
                        budget_used: budget_used(waited),
                        started_before_attach: false,
                        detail: json!({
                            "function": f.map(|f| f.symbol),
                            "binary": f.map(|f| f.binary.display().to_string()),
                            "goroutine": format!("{:#x}", o.g),
                            "since_relist_start_s": now_ns.saturating_sub(o.start_ns) as f64 / 1e9,
                            "last_relist_s": self.last_relist.get(&o.tgid).map(Duration::as_secs_f64),
                        }),
                        holder: None,
                        chain: Vec::new(),
                        kernel_stack: Vec::new(),
                        user_stack: Vec::new(),
                    }));
                }
                Action::Resolve { key, waited, exact } => {
                    self.registry.resolve(&key, waited, exact, WaitKind::PlegRelist, sink);
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
