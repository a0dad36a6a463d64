//! `plegwatch watch`'s scheduler: it sets the sources up, runs their scans on a
//! tick, drains the kernel's rings when they are readable, and shuts down. It
//! decides nothing itself:
//! - the sources (`crate::sources`) read the kernel and `/proc`, and hand over
//!   their open waits, facts and events;
//! - the graph (`crate::graph::scan`) turns waits and facts into incidents;
//! - the sink gets every event, in the order it was made.
//!
//! Two inputs, one loop: every `interval` (250 ms by default) a scan; and the
//! `EVENTS` ring buffer, drained whenever it is readable (when long waits ended,
//! to the nanosecond). The high-rate rings (`SOCK_EVENTS`, and `GO_EVENTS` for
//! short calls) wake the loop only when filling up; every scan drains them first.

mod drop_watch;
mod lookups;
mod scan_clock;
mod summary;

use crate::{
    clock::monotonic_ns,
    events::{Event, Ready, Sink, Summary},
    graph::{
        ids,
        incidents::{Change, Clocks, Incidents},
        model::Hop,
        scan::{scan, Snapshot},
    },
    kernel::loader::{self, take_map, LoadOptions, WatchError},
    kernel::probes::{self, Choice},
    levels::Thresholds,
    observe::{k8s::Pods, mounts, namespaces, ustack::UserSymbolizer, Observe},
    sources::{
        children::ChildWaits,
        decorate::Decorate,
        devices::DeviceIo,
        gowatch::{chain::KernelWaits, Background, GoUprobes, GoWatch},
        inflight::{note_open, Filter},
        offcpu::OffCpu,
        parked::{self, Sampler},
        reqwatch::ReqWatch,
        syscall_waits::SyscallWaits,
    },
};
use aya::maps::{MapData, RingBuf};
use plegwatch_abi::{child_maps, go_maps, maps, sock_maps};
use std::{
    path::PathBuf,
    time::{Duration, Instant, SystemTime},
};
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};

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

/// How long one turn of the loop may spend attaching uprobes (each takes
/// 1–20 ms, more under load; a new containerd has about 80).
const ATTACH_SLICE: Duration = Duration::from_millis(20);

/// Runs until Ctrl-C, SIGTERM or `--duration`; returns the summary it printed.
pub async fn watch(cfg: WatchConfig, sink: &mut dyn Sink) -> Result<Summary, WatchError> {
    let (mut w, mut rings, choices) = setup(cfg, sink)?;
    // Ctrl-C and SIGTERM are caught from here: before the ready line, which tells a
    // caller that a stop now gets the summary (a fresh-clone CI run sent SIGINT right
    // after it, and plegwatch died of the signal). During setup they still kill at once.
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt()).map_err(|e| WatchError::Io("SIGINT handler", e))?;
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate()).map_err(|e| WatchError::Io("SIGTERM handler", e))?;
    sink.emit(&Event::Ready(Ready {
        pid: w.me,
        probes: choices.iter().map(Choice::to_output).collect(),
        warn_s: w.cfg.thresholds.warn.as_secs_f64(),
        critical_s: w.cfg.thresholds.critical.as_secs_f64(),
        imminent_s: w.cfg.thresholds.imminent.as_secs_f64(),
    }));
    let deadline = tokio::time::sleep(w.cfg.duration.unwrap_or(Duration::from_secs(100 * 365 * 86_400)));
    tokio::pin!(deadline);
    let mut tick = tokio::time::interval(w.cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            scheduled = tick.tick() => w.tick(scheduled.into_std(), &mut rings, sink),
            guard = rings.go.readable_mut() => {
                let mut guard = guard.map_err(|e| WatchError::Io("polling the Go ring buffer", e))?;
                w.drain_go(guard.get_inner_mut(), sink);
                guard.clear_ready();
            }
            done = w.go.background() => w.on_background(done, sink),
            _ = std::future::ready(()), if w.go.attaching() => {
                // A slice of uprobe attaches per turn: a scan due meanwhile runs in between.
                let began = Instant::now();
                w.go.attach_some(&mut w.ebpf, ATTACH_SLICE, &mut w.out);
                w.scans.attach_took(began.elapsed());
                emit_all(&mut w.out, sink);
            }
            guard = rings.sock.readable_mut() => {
                let mut guard = guard.map_err(|e| WatchError::Io("polling the socket ring buffer", e))?;
                w.drain_sock(guard.get_inner_mut());
                guard.clear_ready();
            }
            guard = rings.events.readable_mut() => {
                let mut guard = guard.map_err(|e| WatchError::Io("polling the ring buffer", e))?;
                w.drain_ends(guard.get_inner_mut(), sink);
                guard.clear_ready();
            }
            _ = sigint.recv() => { tracing::info!("SIGINT: detaching"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: detaching"); break; }
            _ = &mut deadline => { tracing::info!("--duration reached: detaching"); break; }
        }
    }
    Ok(w.shutdown(rings, sink))
}

/// The kernel's rings, each registered with the runtime to wake the loop.
struct Rings {
    /// `EVENTS`: the ends of long kernel waits.
    events: AsyncFd<RingBuf<MapData>>,
    /// `GO_EVENTS`: Go calls' ends, exits and execs.
    go: AsyncFd<RingBuf<MapData>>,
    /// `SOCK_EVENTS`: what went through tracked sockets.
    sock: AsyncFd<RingBuf<MapData>>,
}

/// Every source, lookup and graph state of one watch.
struct Watch {
    cfg: WatchConfig,
    started: Instant,
    /// Our own pid (the host's), filtered out by the kernel programs.
    me: u32,
    ebpf: aya::Ebpf,
    syscalls: SyscallWaits,
    req: ReqWatch,
    go: GoWatch,
    offcpu: Option<OffCpu>,
    /// The `parked_threads` sampler (off the event loop).
    sampler: Option<Sampler>,
    devices: Option<DeviceIo>,
    children: Option<ChildWaits>,
    incidents: Incidents,
    observe: Observe,
    pods: Pods,
    ustack: UserSymbolizer,
    scans: scan_clock::ScanClock,
    drops: drop_watch::DropWatch,
    last_status: Instant,
    /// Scan lateness since the last `status` event (the daemon's).
    late_since: Vec<f64>,
    /// The events a source made in its last call, handed on at once.
    out: Vec<Event>,
}

/// Loads and attaches the probes, and starts every source. Go targets given by path
/// are attached here, and say so on `sink`.
fn setup(cfg: WatchConfig, sink: &mut dyn Sink) -> Result<(Watch, Rings, Vec<Choice>), WatchError> {
    let started = Instant::now();
    loader::require_root()?;
    loader::ensure_tracefs()?;
    let host = namespaces::resolve().map_err(|e| WatchError::Namespace(e.to_string()))?;
    let me = host.tgid;
    let mounts = mounts::watch(host.mountinfo).map_err(|e| WatchError::Io(host.mountinfo, e))?;
    // End records for waits shorter than --warn would be thrown away.
    let (mut ebpf, offsets) = loader::load(LoadOptions { report_min: cfg.thresholds.warn, tracer_tgid: me })?;
    let env = probes::AttachEnv::probe(offsets.task_pid.offset().is_some());
    let choices = probes::attach_all(&mut ebpf, &env)?;
    let on = |probe: &str| choices.iter().any(|c| c.probe == probe && !c.is_off());

    let (syscalls, swept) = SyscallWaits::attach(&mut ebpf, cfg.thresholds, cfg.filter.clone(), mounts, &choices, me)?;
    // Startup sweep results are news only when they found something.
    if swept.is_empty() {
        tracing::debug!("startup sweep: no thread already in a watched wait");
    } else {
        tracing::info!(swept = swept.len(), "startup sweep: threads already in a watched wait");
    }
    let events = async_ring(&mut ebpf, maps::EVENTS)?;
    let mut req = ReqWatch::new(&mut ebpf, cfg.thresholds, cfg.filter.clone())?;
    // `/proc` listed off the loop, once for every reader.
    let lister = crate::observe::lister::Lister::start();
    let mut go = GoWatch::new(&mut ebpf, cfg.thresholds, cfg.filter.clone(), cfg.go_uprobes, lister.clone())?;
    let mut out = Vec::new();
    go.start(&mut ebpf, &cfg.go_paths, &mut out)?;
    emit_all(&mut out, sink);
    let go_ring = async_ring(&mut ebpf, go_maps::GO_EVENTS)?;
    let sock = async_ring(&mut ebpf, sock_maps::SOCK_EVENTS)?;
    let mut ustack = UserSymbolizer::new();
    // Read now, while the swept threads are still blocked (see `SyscallWaits::attach`).
    for w in &swept {
        ustack.pin_blocked(w.tgid, w.tid);
    }
    let offcpu = if on("offcpu") { Some(OffCpu::new(&mut ebpf, &cfg.filter.comms, lister.clone())?) } else { None };
    if on("socket_io") {
        req.seed_all(me);
    }
    let sampler = match on("parked_threads") {
        true => Sampler::start(me)
            .map_err(|e| tracing::warn!(error = %e, "parked-thread sampler not started: unix-peer and futex-sibling links are off"))
            .ok(),
        false => None,
    };
    let devices = if on("block_io") { Some(DeviceIo::new(&mut ebpf)?) } else { None };
    let children = if on("child_wait") { Some(ChildWaits::new(take_map(&mut ebpf, child_maps::CHILD_WAITS)?)) } else { None };
    let w = Watch {
        incidents: Incidents::new(cfg.thresholds),
        observe: Observe::new(lister),
        pods: Pods::new(cfg.runtime_socket.clone()),
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
    };
    Ok((w, Rings { events, go: go_ring, sock }, choices))
}

impl Watch {
    /// One scan: every source's open waits and events, then the graph's step.
    fn tick(&mut self, scheduled: Instant, rings: &mut Rings, sink: &mut dyn Sink) {
        let began = Instant::now();
        let late = began.saturating_duration_since(scheduled);
        self.scans.late(late);
        if self.cfg.status_every.is_some() && self.late_since.len() < 4096 {
            self.late_since.push(late.as_secs_f64());
        }
        if let Some(o) = self.offcpu.as_mut() {
            let mut tgids = self.syscalls.open_tgids().to_vec();
            tgids.extend(self.req.tgids());
            o.refresh(&tgids);
            if o.prune_due() {
                let (entries, stacks) = o.prune(&self.syscalls.user_stacks());
                tracing::debug!(entries, stacks, "pruned the off-CPU aggregate and the stack map");
            }
        }
        // Short Go calls and socket records are queued without a wakeup: take them now.
        self.drain_go(rings.go.get_mut(), sink);
        self.drain_sock(rings.sock.get_mut());
        let mut open_waits = self.syscalls.open_by_pid().clone();
        for (pid, (kind, start)) in self.req.open_by_pid() {
            note_open(&mut open_waits, pid, kind, start);
        }
        self.syscalls.scan(&mut self.out);
        self.req.scan(monotonic_ns(), &mut self.out);
        let waits = KernelWaits { by_tid: self.syscalls.open_by_tid(), by_g: self.syscalls.open_by_g(), longest_by_pid: &open_waits };
        self.go.scan(monotonic_ns(), &waits, &mut self.out);
        let mut decorate =
            Decorate { offcpu: self.offcpu.as_ref(), ustack: &mut self.ustack, open_waits: &open_waits, pods: &mut self.pods };
        for e in self.out.drain(..) {
            sink.emit(&decorate.event(e));
        }
        self.step_graph(sink);
        self.go.poll(&mut self.ebpf, &mut self.out);
        emit_all(&mut self.out, sink);
        self.drops.check(&self.ebpf);
        if let Some(every) = self.cfg.status_every {
            if self.last_status.elapsed() >= every {
                self.last_status = Instant::now();
                let status = summary::status(&self.ebpf, &self.incidents, &self.go, &mut self.late_since);
                sink.emit(&Event::Status(Box::new(status)));
            }
        }
        self.scans.took(began.elapsed());
    }

    /// The wait-for graph's step: every source's open waits and facts, the graph's
    /// changes to the sink, each hop named with its pod.
    fn step_graph(&mut self, sink: &mut dyn Sink) {
        let now = monotonic_ns();
        let mut waits = self.syscalls.open_waits().to_vec();
        waits.extend(self.req.open_waits().iter().cloned());
        waits.extend(self.go.open_waits(now));
        let mut facts = self.go.facts();
        facts.ttrpc = self.req.ttrpc_facts(now);
        let child_waits = self.children.as_mut().map(ChildWaits::scan).unwrap_or_default();
        // Threads parked where no probe sees them (last round's sample).
        let parked = self.sampler.as_ref().map(|s| s.latest().iter().filter(|p| parked::still_parked(p)).cloned().collect());
        let answers = self.req.answers(now);
        let devices = match self.devices.as_mut() {
            Some(io) => {
                io.sample(now);
                self.syscalls.device_facts(io, now)
            }
            None => Vec::new(),
        };
        let clocks = Clocks { now_ns: now, wall: SystemTime::now(), relist_start_ns: self.go.relist_start_ns() };
        let snapshot = Snapshot { clocks, waits, facts, child_waits, parked, answers, devices };
        let mut world = lookups::World { observe: &mut self.observe, offcpu: self.offcpu.as_ref() };
        let filter = &self.cfg.filter;
        let scanned = scan(&mut self.incidents, snapshot, &mut world, &|w| filter.matches_wait(w), &mut ids::id_of);
        // The sampler's next round: the processes of waits old enough to anchor one.
        if let Some(s) = &self.sampler {
            s.request(
                scanned.waits.iter().filter(|w| now.saturating_sub(w.start_ns) >= parked::ANCHOR_MIN_NS).map(|w| w.who.pid).collect(),
            );
        }
        for change in scanned.changes {
            let event = match change {
                Change::Raised(mut i) => {
                    let hops = i.root.iter_mut().chain([&mut i.symptom]).chain(i.chain.iter_mut()).chain(i.attached.iter_mut());
                    name_pods(hops, &mut self.pods);
                    Event::Incident(Box::new(i))
                }
                Change::Resolved(mut r) => {
                    name_pods(r.longest_chain.iter_mut(), &mut self.pods);
                    Event::IncidentResolved(r)
                }
            };
            sink.emit(&event);
        }
    }

    /// Every record in the Go ring: calls' ends, exits and execs (a new target is probed).
    fn drain_go(&mut self, ring: &mut RingBuf<MapData>, sink: &mut dyn Sink) {
        while let Some(item) = ring.next() {
            self.go.on_record(&mut self.ebpf, &item, &mut self.out);
        }
        emit_all(&mut self.out, sink);
    }

    /// Every record in the socket ring (requests and replies are matched at the scan).
    fn drain_sock(&mut self, ring: &mut RingBuf<MapData>) {
        while let Some(item) = ring.next() {
            self.req.on_record(&item);
        }
    }

    /// Every end record of a long kernel wait.
    fn drain_ends(&mut self, ring: &mut RingBuf<MapData>, sink: &mut dyn Sink) {
        self.syscalls.drain(ring, &mut self.out);
        let none = Default::default();
        let mut decorate = Decorate { offcpu: self.offcpu.as_ref(), ustack: &mut self.ustack, open_waits: &none, pods: &mut self.pods };
        for e in self.out.drain(..) {
            sink.emit(&decorate.event(e));
        }
    }

    /// Work done off the loop, come back: a Go binary inspected, or a newly probed
    /// process's goroutines read.
    fn on_background(&mut self, done: Background, sink: &mut dyn Sink) {
        match done {
            // A new Go binary, read off the loop: its uprobes are attached by slices.
            Background::Inspected(done) => self.go.on_inspected(done),
            Background::Late(found) => {
                let threads = self.go.on_late(found, &mut self.out);
                self.syscalls.note_goroutines(&threads);
                emit_all(&mut self.out, sink);
            }
        }
    }

    /// The last records and one last look (incidents whose waits just ended are
    /// resolved), the summary, and the probes' detach.
    fn shutdown(mut self, mut rings: Rings, sink: &mut dyn Sink) -> Summary {
        self.syscalls.drain(rings.events.get_mut(), &mut self.out);
        emit_all(&mut self.out, sink);
        self.drain_go(rings.go.get_mut(), sink);
        self.drain_sock(rings.sock.get_mut());
        self.syscalls.scan(&mut self.out);
        self.req.scan(monotonic_ns(), &mut self.out);
        emit_all(&mut self.out, sink);
        self.step_graph(sink);
        let summary = summary::summary(
            &self.ebpf,
            self.started,
            &self.syscalls,
            &self.req,
            &self.go,
            self.offcpu.as_ref(),
            &self.incidents,
            &self.scans,
        );
        sink.emit(&Event::Summary(summary.clone()));
        // Nothing but closing is left: a child makes the last closes (see `handoff`).
        let handoff = crate::kernel::handoff::fork_last_closer();
        self.go.detach(&mut self.ebpf);
        drop(rings);
        drop(self); // detaches every other program
        drop(handoff);
        summary
    }
}

/// Hands `out`'s events to the sink as they are, in order.
fn emit_all(out: &mut Vec<Event>, sink: &mut dyn Sink) {
    for e in out.drain(..) {
        sink.emit(&e);
    }
}

/// Each hop's pod and container, by its process, as the incident is printed (after the
/// incident builder decided what changed: names never make a line of their own).
fn name_pods<'h>(hops: impl Iterator<Item = &'h mut Hop>, pods: &mut Pods) {
    for h in hops {
        if let Some(pid) = h.pid {
            h.pod = pods.of_pid(pid);
        }
    }
}

/// A ring buffer map, registered with the runtime to wake the loop when it has records.
fn async_ring(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<AsyncFd<RingBuf<MapData>>, WatchError> {
    let ring: RingBuf<MapData> = take_map(ebpf, name)?;
    // SAFETY: the RingBuf owns its map fd, which stays open and the same for as
    // long as the AsyncFd holds it.
    unsafe { AsyncFd::register(ring) }.map_err(|e| WatchError::Map(name, format!("cannot poll it: {e}")))
}
