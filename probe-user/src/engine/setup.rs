//! The watch's setup: load and attach the probes, take the kernel's maps, and start
//! every source (the startup sweeps included).

use super::{emit_all, Rings, Watch};
use crate::{
    events::{Event, Sink, Sweep},
    graph::incidents::Incidents,
    kernel::loader::{self, take_map, LoadOptions, WatchError},
    kernel::probes::{self, Choice},
    levels::Thresholds,
    observe::{k8s::Pods, mounts, namespaces, ustack::UserSymbolizer, Observe},
    sources::{
        children::ChildWaits,
        devices::DeviceIo,
        gowatch::{GoUprobes, GoWatch},
        inflight::Filter,
        offcpu::OffCpu,
        parked::Sampler,
        reqwatch::ReqWatch,
        sweep,
        syscall_waits::SyscallWaits,
    },
};
use aya::maps::{MapData, RingBuf};
use plegwatch_abi::{child_maps, go_maps, maps, sock_maps};
use std::{
    path::PathBuf,
    time::{Duration, Instant},
};
use tokio::io::unix::AsyncFd;

/// What `plegwatch watch` was asked to do.
#[derive(Clone, Debug)]
pub struct WatchConfig {
    pub thresholds: Thresholds,
    pub filter: Filter,
    /// How often the open waits are scanned.
    pub interval: Duration,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Go binaries to probe by path (`--containerd`, `--kubelet`), as (target, path).
    pub go_paths: Vec<(&'static str, PathBuf)>,
    /// How Go probe points name their function (`--go-uprobes`).
    pub go_uprobes: GoUprobes,
    /// Emit a `status` event this often (the daemon's metrics); `None` for `watch`.
    pub status_every: Option<Duration>,
    /// The CRI socket asked for pod and container names (none: bundles only).
    pub runtime_socket: Option<PathBuf>,
}

/// Loads and attaches the probes, and starts every source. Go targets given by path
/// are attached here, and say so on `sink`.
pub(super) fn setup(cfg: WatchConfig, sink: &mut dyn Sink) -> Result<(Watch, Rings, Vec<Choice>), WatchError> {
    let started = Instant::now();
    loader::require_root()?;
    loader::ensure_tracefs()?;
    let host = namespaces::resolve().map_err(|e| WatchError::Namespace(e.to_string()))?;
    let me = host.tgid;
    let mounts = mounts::watch(host.mountinfo).map_err(|e| WatchError::Io(host.mountinfo, e))?;
    // The runtime is asked for pod names now, off the loop, so that its first answer is
    // in by the first scan (loading and attaching take a second or more): an incident
    // found at once (one begun before the start) is then named on its first line.
    let pods = Pods::new(cfg.runtime_socket.clone());
    // End records for waits shorter than --warn would be thrown away.
    let (mut ebpf, offsets) = loader::load(LoadOptions { report_min: cfg.thresholds.warn, tracer_tgid: me })?;
    let loaded = started.elapsed();
    let env = probes::AttachEnv::probe(offsets.task_pid.offset().is_some());
    let choices = probes::attach_all(&mut ebpf, &env)?;
    let attached = started.elapsed();
    let on = |probe: &str| choices.iter().any(|c| c.probe == probe && !c.is_off());

    // Threads already blocked in a system call, listed once, now that the probes see
    // every new one: the syscall and child-wait sources seed from the same list.
    let clock = sweep::AgeClock::new(me, crate::clock::monotonic_ns());
    let blocked = sweep::blocked_threads(me);
    let (syscalls, swept) = SyscallWaits::attach(&mut ebpf, cfg.thresholds, cfg.filter.clone(), mounts, &choices, &blocked, &clock)?;
    let mut found = Sweep { kernel_waits: swept.len(), ..Sweep::default() };
    let events = async_ring(&mut ebpf, maps::EVENTS)?;
    let mut req = ReqWatch::new(&mut ebpf, cfg.thresholds, cfg.filter.clone())?;
    // `/proc` listed off the loop, once for every reader.
    let lister = crate::observe::lister::Lister::start();
    let mut go = GoWatch::new(&mut ebpf, cfg.thresholds, cfg.filter.clone(), cfg.go_uprobes, lister.clone())?;
    let mut out = Vec::new();
    go.start(&mut ebpf, &cfg.go_paths, &mut out)?;
    emit_all(&mut out, sink);
    let go_started = started.elapsed();
    let go_ring = async_ring(&mut ebpf, go_maps::GO_EVENTS)?;
    let sock = async_ring(&mut ebpf, sock_maps::SOCK_EVENTS)?;
    let mut ustack = UserSymbolizer::new();
    // Read now, while the swept threads are still blocked (see `SyscallWaits::attach`).
    for w in &swept {
        ustack.pin_blocked(w.tgid, w.tid);
    }
    let offcpu = if on("offcpu") { Some(OffCpu::new(&mut ebpf, &cfg.filter.comms, lister.clone())?) } else { None };
    if on("socket_io") {
        req.seed_all(me, &mut found);
    }
    let mut children = if on("child_wait") { Some(ChildWaits::new(take_map(&mut ebpf, child_maps::CHILD_WAITS)?)) } else { None };
    if let Some(c) = children.as_mut() {
        found.child_waits = c.seed(&blocked, &clock);
    }
    // The startup sweep is news only when it found a wait.
    tracing::debug!(?found, "startup sweep");
    if found.found_waits() {
        sink.emit(&Event::Sweep(found));
    }
    let sampler = match on("parked_threads") {
        true => Sampler::start(me)
            .map_err(|e| tracing::warn!(error = %e, "parked-thread sampler not started: unix-peer and futex-sibling links are off"))
            .ok(),
        false => None,
    };
    let devices = if on("block_io") { Some(DeviceIo::new(&mut ebpf)?) } else { None };
    let w = Watch {
        incidents: Incidents::new(cfg.thresholds),
        observe: Observe::new(lister),
        pods,
        cfg,
        started,
        me,
        ebpf,
        syscalls,
        req,
        go,
        offcpu,
        sampler,
        devices,
        children,
        ustack,
        scans: Default::default(),
        drops: Default::default(),
        last_status: Instant::now(),
        late_since: Vec::new(),
        out,
        last_graph: None,
    };
    // What loading parsed (BTF, the object, the sweep's reads) is freed by now (see `heap`).
    crate::heap::give_back();
    // Where a slow start went (a loaded node, an emulated guest): each phase's end.
    let ms = |d: Duration| d.as_millis() as u64;
    tracing::info!(
        loaded_ms = ms(loaded),
        attached_ms = ms(attached),
        go_ms = ms(go_started),
        total_ms = ms(started.elapsed()),
        "probes loaded and attached, sources started"
    );
    Ok((w, Rings { events, go: go_ring, sock }, choices))
}

/// A ring buffer map, registered with the runtime to wake the loop when it has records.
fn async_ring(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<AsyncFd<RingBuf<MapData>>, WatchError> {
    let ring: RingBuf<MapData> = take_map(ebpf, name)?;
    // SAFETY: the RingBuf owns its map fd, which stays open and the same for as
    // long as the AsyncFd holds it.
    unsafe { AsyncFd::register(ring) }.map_err(|e| WatchError::Map(name, format!("cannot poll it: {e}")))
}
