//! `plegwatch watch`'s engine: scans the kernel's open waits, takes its end
//! records, and prints stalls and resolutions.
//!
//! Two inputs, one loop:
//! - every `interval` (250 ms by default) a snapshot of the `INFLIGHT` map goes
//!   to the [`Registry`], which says which waits crossed a level;
//! - the `EVENTS` ring buffer, drained whenever it is readable, says when long
//!   waits ended and how long they took, to the nanosecond.
//!
//! The high-rate rings (`SOCK_EVENTS`, and `GO_EVENTS` for short calls) wake
//! the loop only when filling up; every scan drains them first.

use crate::{
    clock::{monotonic_ns, wall_of},
    events::{Event, Ready, Sink, Stall, Summary},
    graph::{
        children as graph_children, ids,
        incidents::{Change, Clocks, Incidents},
        model::{Edge, EdgeKind, Exactness, HeldBy, OpenWait},
        parked::parked_graph,
        resolvers,
    },
    kernel::loader::{self, LoadOptions},
    kernel::loader::{take_map, WatchError},
    kernel::probes::{self, Choice},
    levels::{budget_used, Thresholds},
    observe::k8s::Pods,
    observe::mounts::{self, SharedMounts},
    observe::namespaces,
    observe::procfs::{self, SyscallState},
    observe::ustack::UserSymbolizer,
    observe::Observe,
    sources::children::ChildWaits,
    sources::detail,
    sources::devices::DeviceIo,
    sources::ended::EndedWaits,
    sources::gowatch::{chain::KernelWaits, Background, GoWatch},
    sources::inflight::note_open,
    sources::inflight::{Action, Filter, Registry, WaitInfo, WaitKey},
    sources::offcpu::OffCpu,
    sources::parked::{self, Sampler},
    sources::reqwatch::ReqWatch,
    sources::stats,
    sources::sweep,
    syscalls::{by_slot, WaitKind},
};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, RingBuf};
use plegwatch_abi::{child_maps, go_maps, maps, record_kind, sock_maps, Record, Stat, Wait, WaitEnd};
use serde_json::{Map, Value};
use std::{
    collections::HashMap,
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
    pub go_paths: Vec<(&'static str, std::path::PathBuf)>,
    /// How Go probe points name their function (`--go-uprobes`).
    pub go_uprobes: crate::sources::gowatch::GoUprobes,
    /// Emit a `status` event this often (the daemon's metrics); `None` for `watch`.
    pub status_every: Option<Duration>,
    /// The CRI socket asked for pod and container names (none: bundles only).
    pub runtime_socket: Option<std::path::PathBuf>,
}

/// Runs until Ctrl-C, SIGTERM or `--duration`; returns the summary it printed.
pub async fn watch(cfg: WatchConfig, sink: &mut dyn Sink) -> Result<Summary, WatchError> {
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

    let mut inflight: BpfHashMap<MapData, u32, Wait> = take_map(&mut ebpf, maps::INFLIGHT)?;
    let mut tails: Array<MapData, u64> = take_map(&mut ebpf, maps::TAIL_PENDING)?;
    let (swept, raced) = seed_swept(&mut inflight, &mut tails, me);
    // Startup sweep results are news only when they found something.
    if swept.is_empty() {
        tracing::debug!("startup sweep: no thread already in a watched wait");
    } else {
        tracing::info!(swept = swept.len(), "startup sweep: threads already in a watched wait");
    }
    let mut ring = async_ring(&mut ebpf, maps::EVENTS)?;

    let mut engine = Engine::new(&cfg, mounts, &choices, inflight, raced, tails);
    let mut req = ReqWatch::new(&mut ebpf, cfg.thresholds, cfg.filter.clone())?;
    // `/proc` listed off the loop, once for every reader.
    let lister = crate::observe::lister::Lister::start();
    let mut go = GoWatch::new(&mut ebpf, cfg.thresholds, cfg.filter.clone(), cfg.go_uprobes, lister.clone())?;
    let go_paths: Vec<(&str, std::path::PathBuf)> = cfg.go_paths.iter().map(|(t, p)| (*t, p.clone())).collect();
    go.start(&mut ebpf, &go_paths, sink)?;
    let mut go_ring = async_ring(&mut ebpf, go_maps::GO_EVENTS)?;
    let mut sock_ring = async_ring(&mut ebpf, sock_maps::SOCK_EVENTS)?;
    let mut ustack = UserSymbolizer::new();
    // Read now, while the swept threads are still blocked: a swept wait whose age is a
    // low bound may cross --warn only as it ends, and is then reported from its end.
    for w in &swept {
        ustack.pin_blocked(w.tgid, w.tid);
        if let Some(k) = procfs::kernel_stack(w.tid) {
            engine.swept_kstacks.insert(w.tid, (w.start_ns, k));
        }
    }
    let mut offcpu = match choices.iter().any(|c| c.probe == "offcpu" && !c.is_off()) {
        true => Some(OffCpu::new(&mut ebpf, &cfg.filter.comms, lister.clone())?),
        false => None,
    };
    if choices.iter().any(|c| c.probe == "socket_io" && !c.is_off()) {
        let (socks, waiters) = req.seed(me);
        if waiters > 0 {
            tracing::info!(
                netlink_sockets = socks,
                blocked_on_them = waiters,
                "startup sweep: threads already blocked on a netlink socket"
            );
        } else {
            tracing::debug!(netlink_sockets = socks, "startup sweep: netlink sockets already open, none blocked on");
        }
        let shims = req.seed_ttrpc(me);
        tracing::debug!(ttrpc_connections = shims, "startup sweep: containerd → shim connections already open");
    }
    let mut drops = DropWatch::default();
    let sampler = match choices.iter().any(|c| c.probe == "parked_threads" && !c.is_off()) {
        true => Sampler::start(me)
            .map_err(|e| tracing::warn!(error = %e, "parked-thread sampler not started: unix-peer and futex-sibling links are off"))
            .ok(),
        false => None,
    };
    let mut incidents = Incidents::new(cfg.thresholds);
    let mut observe = Observe::new(lister);
    let mut pods = Pods::new(cfg.runtime_socket.clone());
    let mut scans = ScanClock::default();
    let mut devices = match choices.iter().any(|c| c.probe == "block_io" && !c.is_off()) {
        true => Some(DeviceIo::new(&mut ebpf)?),
        false => None,
    };
    let mut children = match choices.iter().any(|c| c.probe == "child_wait" && !c.is_off()) {
        true => Some(ChildWaits::new(take_map(&mut ebpf, child_maps::CHILD_WAITS)?)),
        false => None,
    };
    // Ctrl-C and SIGTERM are caught from here: before the ready line, which tells a
    // caller that a stop now gets the summary (a fresh-clone CI run sent SIGINT right
    // after it, and plegwatch died of the signal). During setup they still kill at once.
    let mut sigint = tokio::signal::unix::signal(SignalKind::interrupt()).map_err(|e| WatchError::Io("SIGINT handler", e))?;
    let mut sigterm = tokio::signal::unix::signal(SignalKind::terminate()).map_err(|e| WatchError::Io("SIGTERM handler", e))?;
    sink.emit(&Event::Ready(Ready {
        pid: me,
        probes: choices.iter().map(Choice::to_output).collect(),
        warn_s: cfg.thresholds.warn.as_secs_f64(),
        critical_s: cfg.thresholds.critical.as_secs_f64(),
        imminent_s: cfg.thresholds.imminent.as_secs_f64(),
    }));

    let deadline = tokio::time::sleep(cfg.duration.unwrap_or(Duration::from_secs(100 * 365 * 86_400)));
    tokio::pin!(deadline);
    let mut last_status = Instant::now();
    let mut late_since: Vec<f64> = Vec::new();
    let mut tick = tokio::time::interval(cfg.interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    loop {
        tokio::select! {
            scheduled = tick.tick() => {
                let began = std::time::Instant::now();
                let late = began.saturating_duration_since(scheduled.into_std());
                scans.late(late);
                if cfg.status_every.is_some() && late_since.len() < 4096 {
                    late_since.push(late.as_secs_f64());
                }
                if let Some(o) = offcpu.as_mut() {
                    let mut tgids = engine.open_tgids.clone();
                    tgids.extend(req.tgids());
                    o.refresh(&tgids);
                    if o.prune_due() {
                        let user_stacks: Vec<i32> = engine.inflight.iter().filter_map(Result::ok).map(|(_, w)| w.user_stack).collect();
                        let (entries, stacks) = o.prune(&user_stacks);
                        tracing::debug!(entries, stacks, "pruned the off-CPU aggregate and the stack map");
                    }
                }
                // Short Go calls are queued without a wakeup: take them now.
                while let Some(item) = go_ring.get_mut().next() {
                    go.on_record(&mut ebpf, &item, sink);
                }
                // So are socket records (the kernel wakes us only once a quarter full).
                while let Some(item) = sock_ring.get_mut().next() {
                    req.on_record(&item);
                }
                let mut open_waits = engine.open_by_pid.clone();
                for (pid, (kind, start)) in req.open_by_pid() {
                    note_open(&mut open_waits, pid, kind, start);
                }
                {
                    let mut sink = Enrich { inner: &mut *sink, offcpu: offcpu.as_ref(), ustack: &mut ustack, open_waits: &open_waits, pods: &mut pods };
                    engine.scan(&mut sink);
                    req.scan(monotonic_ns(), &mut sink);
                    let waits = KernelWaits { by_tid: &engine.open_by_tid, by_g: &engine.open_by_g, longest_by_pid: &open_waits };
                    go.scan(monotonic_ns(), &waits, &mut sink);
                }
                let mut graph = Graph { incidents: &mut incidents, observe: &mut observe, offcpu: offcpu.as_ref(), devices: devices.as_mut(), children: children.as_mut(), filter: &cfg.filter, parked: sampler.as_ref(), pods: &mut pods };
                graph.step(&mut engine, &mut req, &go, sink);
                go.poll(&mut ebpf, sink);
                drops.check(&ebpf);
                if let Some(every) = cfg.status_every {
                    if last_status.elapsed() >= every {
                        last_status = Instant::now();
                        let status = status(&ebpf, &incidents, &go, &mut late_since);
                        sink.emit(&Event::Status(Box::new(status)));
                    }
                }
                scans.took(began.elapsed());
            }
            guard = go_ring.readable_mut() => {
                let mut guard = guard.map_err(|e| WatchError::Io("polling the Go ring buffer", e))?;
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    go.on_record(&mut ebpf, &item, sink);
                }
                guard.clear_ready();
            }
            done = go.background() => match done {
                // A new Go binary, read off the loop: its uprobes are attached below.
                Background::Inspected(done) => go.on_inspected(done),
                // A newly probed process's goroutines, read off the loop.
                Background::Late(found) => {
                    let threads = go.on_late(found, sink);
                    engine.note_goroutines(&threads);
                }
            },
            _ = std::future::ready(()), if go.attaching() => {
                // A slice of uprobe attaches per turn: a scan due meanwhile runs in between.
                let began = std::time::Instant::now();
                go.attach_some(&mut ebpf, ATTACH_SLICE, sink);
                scans.attach_took(began.elapsed());
            }
            guard = sock_ring.readable_mut() => {
                let mut guard = guard.map_err(|e| WatchError::Io("polling the socket ring buffer", e))?;
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    req.on_record(&item);
                }
                guard.clear_ready();
            }
            guard = ring.readable_mut() => {
                let mut guard = guard.map_err(|e| WatchError::Io("polling the ring buffer", e))?;
                let none = HashMap::new();
                let mut sink = Enrich { inner: &mut *sink, offcpu: offcpu.as_ref(), ustack: &mut ustack, open_waits: &none, pods: &mut pods };
                engine.drain(guard.get_inner_mut(), &mut sink);
                guard.clear_ready();
            }
            _ = sigint.recv() => { tracing::info!("SIGINT: detaching"); break; }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: detaching"); break; }
            _ = &mut deadline => { tracing::info!("--duration reached: detaching"); break; }
        }
    }
    engine.drain(ring.get_mut(), sink);
    while let Some(item) = go_ring.get_mut().next() {
        go.on_record(&mut ebpf, &item, sink);
    }
    while let Some(item) = sock_ring.get_mut().next() {
        req.on_record(&item);
    }
    // One last look, so that incidents whose waits just ended are resolved.
    engine.scan(sink);
    req.scan(monotonic_ns(), sink);
    let mut graph = Graph {
        incidents: &mut incidents,
        observe: &mut observe,
        offcpu: offcpu.as_ref(),
        devices: devices.as_mut(),
        children: children.as_mut(),
        filter: &cfg.filter,
        parked: sampler.as_ref(),
        pods: &mut pods,
    };
    graph.step(&mut engine, &mut req, &go, sink);

    let counters = stats::counters(&ebpf);
    let (stalls, resolved) = engine.registry.counts();
    let (req_stalls, req_resolved, req_open) = req.counts();
    let (go_stalls, go_resolved, go_open) = go.counts();
    let summary = Summary {
        ran_s: started.elapsed().as_secs_f64(),
        stalls: stalls + req_stalls + go_stalls,
        resolved: resolved + req_resolved + go_resolved,
        still_open: engine.registry.open().count() as u64 + req_open + go_open,
        waits_started: stats::counter(&counters, Stat::WaitsStarted),
        dropped_waits: stats::counter(&counters, Stat::InflightFull),
        dropped_events: stats::counter(&counters, Stat::RingbufFull) + stats::counter(&counters, Stat::SockEventsFull),
        dropped: stats::drops(&counters),
        syscalls: stats::latency(&ebpf, &engine.measured),
        offcpu_top: offcpu.as_ref().map(|o| o.top(10)).unwrap_or_default(),
        go_latency: go.latency(),
        relists: go.relists(monotonic_ns()),
        go_locks: go.locks(10),
        go_funcs_in_use: go.ids_in_use().0,
        go_binaries_retired: go.ids_in_use().1,
        go_calls_orphaned: go.orphaned(),
        incidents: incidents.counts().0,
        incidents_resolved: incidents.counts().1,
        scans: scans.summary(),
        requests_seen: crate::events::RequestsSeen { ttrpc_lost_step: stats::counter(&counters, Stat::TtrpcDesync), ..req.seen() },
    };
    if summary.dropped_waits + summary.dropped_events > 0 {
        tracing::warn!(
            dropped_waits = summary.dropped_waits,
            dropped_events = summary.dropped_events,
            "the kernel dropped records (the summary's `dropped` has them by probe): some waits or requests may be missing or timed approximately"
        );
    }
    sink.emit(&Event::Summary(summary.clone()));
    // Nothing but closing is left: a child makes the last closes (see `handoff`).
    let handoff = crate::kernel::handoff::fork_last_closer();
    go.detach(&mut ebpf);
    drop(ebpf); // detaches every other program
    drop(handoff);
    Ok(summary)
}

/// The daemon's periodic snapshot; takes the scan lateness gathered since the last one.
fn status(ebpf: &aya::Ebpf, incidents: &Incidents, go: &GoWatch, late_since: &mut Vec<f64>) -> crate::events::Status {
    let counters = stats::counters(ebpf);
    let (cpu_s, rss_bytes) = procfs::self_usage().unwrap_or((0.0, 0));
    crate::events::Status {
        incidents: incidents.open_now(),
        relists: go.relists(monotonic_ns()),
        dropped: stats::drops(&counters),
        syscalls: stats::histograms(ebpf),
        go_latency: go.latency(),
        scan_late_s: std::mem::take(late_since),
        cpu_s,
        rss_bytes,
    }
}

/// Puts the waits that began before the probes were attached into the
/// kernel's map, so the kernel closes them like its own. Returns how many, and
/// those that ended as they were put in (marked over, never deleted: see
/// [`EndedWaits`]).
fn seed_swept(inflight: &mut BpfHashMap<MapData, u32, Wait>, tails: &mut Array<MapData, u64>, me: u32) -> (Vec<Wait>, EndedWaits) {
    const BPF_NOEXIST: u64 = 1;
    let mut n = Vec::new();
    let mut raced = EndedWaits::default();
    let found = sweep::sweep(me, monotonic_ns());
    // The gate opens before the tails go in: a tail's end (the thread's next
    // syscall) may come at once. The first scan sets it from the map.
    let tails_found = found.iter().filter(|s| s.tail).count() as u64;
    if tails_found > 0 {
        let _ = tails.set(1, tails_found, 0);
    }
    for s in found {
        let tid = s.wait.tid;
        // NOEXIST: a wait the kernel saw start after attach knows better.
        if inflight.insert(tid, s.wait, BPF_NOEXIST).is_err() {
            continue;
        }
        // It may have ended between the look and the insert: hidden, not
        // deleted (the thread's next wait may have replaced it already).
        if !sweep::still_in(&s.wait) {
            raced.mark((tid, s.wait.start_ns));
            continue;
        }
        n.push(s.wait);
    }
    (n, raced)
}

/// A ring buffer map, registered with the runtime to wake the loop when it has records.
fn async_ring(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<AsyncFd<RingBuf<MapData>>, WatchError> {
    let ring: RingBuf<MapData> = take_map(ebpf, name)?;
    // SAFETY: the RingBuf owns its map fd, which stays open and the same for as
    // long as the AsyncFd holds it.
    unsafe { AsyncFd::register(ring) }.map_err(|e| WatchError::Map(name, format!("cannot poll it: {e}")))
}

/// Adds what the kernel's off-CPU aggregates say of a stall's thread to its
/// `detail.offcpu` on the way out.
struct Enrich<'a> {
    inner: &'a mut dyn Sink,
    offcpu: Option<&'a OffCpu>,
    /// Names the user stacks the kernel took at a wait's start.
    ustack: &'a mut UserSymbolizer,
    /// Each process's longest open wait: (kind, start ns).
    open_waits: &'a HashMap<u32, (&'static str, u64)>,
    /// Who is in which pod.
    pods: &'a mut Pods,
}

impl Sink for Enrich<'_> {
    fn emit(&mut self, event: &Event) {
        if let Event::Resolved(r) = event {
            self.ustack.unpin(r.tid);
        }
        if let Event::Stall(s) = event {
            let now = monotonic_ns();
            let mut s = s.clone();
            s.pod = self.pods.of_pid(s.pid);
            // The holder's own longest open wait, if it has one: the next link.
            if let Some(Value::Object(h)) = &mut s.holder {
                let pid = h.get("pid").and_then(Value::as_u64).map(|p| p as u32);
                if let Some((kind, start)) = pid.and_then(|p| self.open_waits.get(&p)) {
                    h.insert(
                        "longest_open_wait".into(),
                        serde_json::json!({ "kind": kind, "waited_s": now.saturating_sub(*start) as f64 / 1e9 }),
                    );
                }
            }
            if s.user_stack.is_empty() {
                if let Some(o) = self.offcpu {
                    // Innermost first from the kernel, as the kernel stack.
                    s.user_stack = self.ustack.frames(s.pid, &o.user_ips(s.user_stack_id));
                }
            }
            if s.user_stack.is_empty() && s.started_before_attach {
                // Begun before the probes: a Go thread's stack is unwound from outside.
                s.user_stack = self.ustack.blocked_go_thread(s.pid, s.tid);
            }
            let Some(o) = self.offcpu else { return self.inner.emit(&Event::Stall(s)) };
            if let (Some(v), Value::Object(d)) = (o.for_tid(s.tid, now), &mut s.detail) {
                d.insert("offcpu".into(), v);
            }
            // A thread waiting on a kernel mutex is held by its owner, before
            // anything vaguer ("the kernel").
            let vague = s.holder.as_ref().is_none_or(|h| h.get("kind").and_then(Value::as_str) == Some("kernel"));
            if vague {
                if let Some(h) = o.lock_holder(s.tid, now) {
                    s.holder = Some(h);
                }
            }
            return self.inner.emit(&Event::Stall(s));
        }
        self.inner.emit(event);
    }
}

/// The wait-for graph's step of a scan: every source's open waits, the
/// resolvers' edges, and the incidents they make.
struct Graph<'a> {
    incidents: &'a mut Incidents,
    observe: &'a mut Observe,
    offcpu: Option<&'a OffCpu>,
    devices: Option<&'a mut DeviceIo>,
    children: Option<&'a mut ChildWaits>,
    filter: &'a Filter,
    /// The `parked_threads` sampler (off the event loop).
    parked: Option<&'a Sampler>,
    /// Who is in which pod, for the hops as they are printed.
    pods: &'a mut Pods,
}

impl Graph<'_> {
    fn step(&mut self, engine: &mut Engine, req: &mut ReqWatch, go: &GoWatch, sink: &mut dyn Sink) {
        let now = monotonic_ns();
        let mut waits = engine.open_waits.clone();
        waits.extend(req.open_waits().iter().cloned());
        waits.extend(go.open_waits(now));
        let mut facts = go.facts();
        facts.ttrpc = req.ttrpc_facts(now);
        // Threads in wait4/waitid go in first: a Go call joins them by goroutine.
        let child_waits = self.children.as_deref_mut().map(ChildWaits::scan).unwrap_or_default();
        let child_waits: Vec<_> = child_waits.into_iter().filter(|f| graph_children::matters(f, &facts, &waits, self.observe)).collect();
        waits.extend(child_waits.iter().map(|f| graph_children::open_wait(f, procfs::comm(f.tid).unwrap_or_default())));
        // Threads parked where no probe sees them (last round's sample); then the next round.
        let mut parked_edges = Vec::new();
        if let Some(s) = self.parked {
            let sampled: Vec<_> = s.latest().iter().filter(|p| parked::still_parked(p)).cloned().collect();
            let (pw, pe) = parked_graph(&sampled, &waits, &facts, now, self.observe);
            waits.extend(pw);
            parked_edges = pe;
            s.request(waits.iter().filter(|w| now.saturating_sub(w.start_ns) >= parked::ANCHOR_MIN_NS).map(|w| w.who.pid).collect());
        }
        let mut edges = req.edges(&waits, now, self.observe);
        edges.extend(parked_edges);
        edges.extend(graph_children::child_wait_edges(&child_waits, &waits, self.observe));
        edges.extend(graph_children::shim_child_edges(&facts, &waits, self.observe, now));
        edges.extend(resolvers::go_edges(&facts, &waits, self.observe));
        edges.extend(resolvers::relist_edges(&facts, self.observe));
        if let Some(o) = self.offcpu {
            let mut mutex_of = |tid: u32| mutex_wait(o, tid, now);
            edges.extend(resolvers::kernel_mutex_edges(&waits, now, &mut mutex_of, self.observe));
        }
        if let Some(io) = self.devices.as_deref_mut() {
            io.sample(now);
            edges.extend(engine.device_edges(io, now));
        }
        let clocks = Clocks { now_ns: now, wall: SystemTime::now(), relist_start_ns: go.relist_start_ns() };
        let filter = self.filter;
        for change in self.incidents.scan(&waits, &edges, clocks, &|w| filter.matches_wait(w), &mut ids::id_of) {
            match change {
                Change::Raised(mut i) => {
                    let hops = i.root.iter_mut().chain([&mut i.symptom]).chain(i.chain.iter_mut()).chain(i.attached.iter_mut());
                    name_pods(hops, self.pods);
                    sink.emit(&Event::Incident(Box::new(i)))
                }
                Change::Resolved(mut r) => {
                    name_pods(r.longest_chain.iter_mut(), self.pods);
                    sink.emit(&Event::IncidentResolved(r))
                }
            }
        }
    }
}

/// Each hop's pod and container, by its process, as the incident is printed (after the
/// incident builder decided what changed: names never make a line of their own).
fn name_pods<'h>(hops: impl Iterator<Item = &'h mut crate::graph::model::Hop>, pods: &mut Pods) {
    for h in hops {
        if let Some(pid) = h.pid {
            h.pod = pods.of_pid(pid);
        }
    }
}

/// The kernel mutex thread `tid` waits on, as the off-CPU probe saw it.
fn mutex_wait(offcpu: &OffCpu, tid: u32, now_ns: u64) -> Option<resolvers::MutexWait> {
    let h = offcpu.lock_holder(tid, now_ns)?;
    let owner_tid = h.pointer("/owner/pid").and_then(Value::as_u64)? as u32;
    let lock = h.get("lock").and_then(Value::as_str).unwrap_or("a kernel mutex").to_string();
    Some(resolvers::MutexWait { owner_tid, lock })
}

/// How late each scan starts after its tick, and how long it takes (µs;
/// none if the histogram could not be made, which fixed bounds rule out).
/// How long one turn of the loop may spend attaching uprobes (each takes
/// 1–20 ms, more under load; a new containerd has about 80).
const ATTACH_SLICE: Duration = Duration::from_millis(20);

struct ScanClock {
    late: Option<hdrhistogram::Histogram<u64>>,
    took: Option<hdrhistogram::Histogram<u64>>,
    attach_max: Duration,
}

impl Default for ScanClock {
    fn default() -> Self {
        let h = || hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2).ok();
        ScanClock { late: h(), took: h(), attach_max: Duration::ZERO }
    }
}

impl ScanClock {
    fn late(&mut self, d: Duration) {
        if let Some(h) = self.late.as_mut() {
            let _ = h.record(d.as_micros().max(1) as u64);
        }
    }

    fn took(&mut self, d: Duration) {
        if let Some(h) = self.took.as_mut() {
            let _ = h.record(d.as_micros().max(1) as u64);
        }
    }

    fn attach_took(&mut self, d: Duration) {
        self.attach_max = self.attach_max.max(d);
    }

    fn summary(&self) -> crate::events::ScanSummary {
        let q = |h: &Option<hdrhistogram::Histogram<u64>>, q: f64| h.as_ref().map_or(0.0, |h| h.value_at_quantile(q) as f64 / 1e3);
        crate::events::ScanSummary {
            scans: self.late.as_ref().map_or(0, |h| h.len()),
            late_p50_ms: q(&self.late, 0.5),
            late_p99_ms: q(&self.late, 0.99),
            late_max_ms: q(&self.late, 1.0),
            took_p50_ms: q(&self.took, 0.5),
            took_p99_ms: q(&self.took, 0.99),
            go_attach_max_ms: self.attach_max.as_secs_f64() * 1e3,
            took_max_ms: q(&self.took, 1.0),
        }
    }
}

/// Warns, at most every few seconds, when any of the kernel's drop counters
/// grows: one line per probe and reason that grew.
#[derive(Default)]
struct DropWatch {
    last_check: Option<Instant>,
    seen: HashMap<(&'static str, &'static str), u64>,
}

impl DropWatch {
    const EVERY: Duration = Duration::from_secs(5);

    fn check(&mut self, ebpf: &aya::Ebpf) {
        if self.last_check.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return;
        }
        self.last_check = Some(Instant::now());
        for d in stats::drops(&stats::counters(ebpf)) {
            let seen = self.seen.entry((d.probe, d.reason)).or_default();
            if d.count > *seen {
                tracing::warn!(
                    probe = d.probe,
                    reason = d.reason,
                    new = d.count - *seen,
                    total = d.count,
                    "the kernel dropped records: {}",
                    drop_effect(d.reason)
                );
                *seen = d.count;
            }
        }
    }
}

/// What a drop of `reason` costs the output, for the warning.
fn drop_effect(reason: &str) -> &'static str {
    match reason {
        "inflight_full" | "ringbuf_full" => "affected waits are missed or timed approximately",
        "offcpu_start_full" | "offcpu_full" => "some D-state time is missing from the off-CPU figures",
        "lock_waits_full" => "some kernel-mutex waits are not linked to their owner",
        "stack_failed" | "user_stack_failed" => "some stacks are missing (a full stack map, or a hash collision)",
        _ => "some requests or details are missing",
    }
}

/// A wait's block device and how it was found (see `detail::device_of`).
type DeviceFound = ((u32, u32), String);

/// The collector's state between wakeups.
struct Engine {
    registry: Registry,
    mounts: SharedMounts,
    inflight: BpfHashMap<MapData, u32, Wait>,
    /// The task_work tail's end is found by polling /proc (no kernel probe).
    poll_tails: bool,
    /// The fixed part of each reported wait's detail.
    fixed: HashMap<WaitKey, Map<String, Value>>,
    /// Processes with a wait open in the kernel at the last scan.
    open_tgids: Vec<u32>,
    /// Their earliest open wait: (kind, start ns).
    open_by_pid: HashMap<u32, (&'static str, u64)>,
    /// Each thread's open kernel wait, as a small JSON object.
    open_by_tid: HashMap<u32, Value>,
    /// The same by (process, goroutine), for waits made by Go targets: (tid, object).
    open_by_g: HashMap<(u32, u64), (u32, Value)>,
    /// Scans in a row that found a tail's thread running outside umount2.
    running_seen: HashMap<WaitKey, u32>,
    /// Every kernel wait open at the last scan, as graph nodes.
    open_waits: Vec<OpenWait>,
    /// The same waits as the kernel gave them.
    open_infos: Vec<WaitInfo>,
    /// The device each wait's writeback goes to, looked up once per wait.
    devices: HashMap<WaitKey, Option<DeviceFound>>,
    /// Waits judged over by `/proc` whose entries the kernel still holds.
    ended: EndedWaits,
    /// The goroutine each swept wait's thread runs (the goroutine scan's), by thread: a
    /// swept wait carries none (the kernel reads it from TLS at `sys_enter`).
    swept_g: HashMap<u32, (u64, Option<u64>)>,
    /// The kernel stacks of the startup sweep's waits, read while they were blocked:
    /// by thread, with the wait's start.
    swept_kstacks: HashMap<u32, (u64, Vec<String>)>,
    /// `TAIL_PENDING`: userspace writes slot 1 only (see the ABI's invariant).
    tails: Array<MapData, u64>,
    /// What slot 1 was last set to, if it was.
    swept_tails: Option<u64>,
    /// The exact durations of the waits that got an end record (those over
    /// `--warn`), by syscall: the summary's measured quantiles.
    measured: crate::latency::LatencyTables,
}

impl Engine {
    fn new(
        cfg: &WatchConfig,
        mounts: SharedMounts,
        choices: &[Choice],
        inflight: BpfHashMap<MapData, u32, Wait>,
        ended: EndedWaits,
        tails: Array<MapData, u64>,
    ) -> Self {
        let poll_tails = choices.iter().any(|c| c.probe == "umount_tail_end" && c.is_proc_poll());
        Engine {
            registry: Registry::new(cfg.thresholds, cfg.filter.clone()),
            mounts,
            inflight,
            poll_tails,
            fixed: HashMap::new(),
            open_tgids: Vec::new(),
            open_by_pid: HashMap::new(),
            open_by_tid: HashMap::new(),
            open_by_g: HashMap::new(),
            running_seen: HashMap::new(),
            open_waits: Vec::new(),
            open_infos: Vec::new(),
            devices: HashMap::new(),
            ended,
            swept_kstacks: HashMap::new(),
            swept_g: HashMap::new(),
            tails,
            swept_tails: None,
            measured: Default::default(),
        }
    }

    fn scan(&mut self, sink: &mut dyn Sink) {
        let now = monotonic_ns();
        let snapshot: Vec<Wait> = self.inflight.iter().filter_map(Result::ok).map(|(_, w)| w).collect();
        let live = self.ended.open(snapshot, |w| (w.tid, w.start_ns), now);
        let swept_tails = sweep::swept_tails_open(&live);
        if self.swept_tails != Some(swept_tails) && self.tails.set(1, swept_tails, 0).is_ok() {
            self.swept_tails = Some(swept_tails);
        }
        let mut open: Vec<WaitInfo> = live.iter().map(WaitInfo::from).collect();
        if !self.swept_g.is_empty() {
            for w in open.iter_mut().filter(|w| w.before_attach && w.g == 0) {
                w.g = self.swept_g.get(&w.tid).map(|(g, _)| *g).unwrap_or(0);
            }
            self.swept_g.retain(|tid, _| open.iter().any(|w| w.tid == *tid && w.before_attach));
        }
        self.open_tgids = open.iter().map(|w| w.tgid).collect();
        self.open_by_pid.clear();
        self.open_by_tid.clear();
        self.open_by_g.clear();
        for w in &open {
            let kind = by_slot(w.slot).map(|s| s.kind.as_str()).unwrap_or("sync");
            note_open(&mut self.open_by_pid, w.tgid, kind, w.start_ns);
            let v = serde_json::json!({
                "kind": kind,
                "syscall": by_slot(w.slot).map(|s| s.name),
                "phase": if w.sys_exit_ns != 0 { "task_work" } else { "syscall" },
                "waited_s": now.saturating_sub(w.start_ns) as f64 / 1e9,
            });
            if w.g != 0 {
                self.open_by_g.insert((w.tgid, w.g), (w.tid, v.clone()));
            }
            self.open_by_tid.insert(w.tid, v);
        }
        self.open_waits = open.iter().map(|w| self.open_wait(w)).collect();
        self.open_infos = open.clone();
        self.devices.retain(|k, _| open.iter().any(|w| w.key() == *k));
        let actions = self.registry.scan(open.iter(), now);
        self.act(actions, sink);
        self.check_reported(now, sink);
    }

    /// Waits whose end the kernel can't see: their thread vanished, or (without
    /// the tail probe, or for a thread that went back to user space without a
    /// syscall) their task_work tail is over by `/proc/TID/syscall`.
    fn check_reported(&mut self, now: u64, sink: &mut dyn Sink) {
        let candidates: Vec<(WaitKey, u64, u32, bool)> =
            self.registry.open().map(|t| (t.info.key(), t.info.sys_exit_ns, t.info.nr, t.info.before_attach)).collect();
        for (key, sys_exit_ns, nr, before_attach) in candidates {
            let tid = key.0;
            let ended = if !procfs::thread_exists(tid) {
                true
            } else if sys_exit_ns == 0 && before_attach {
                // Swept while blocked: the kernel will see its exit, unless it
                // raced the sweep.
                !matches!(procfs::syscall(tid), Some(SyscallState::In { nr: n, .. }) if n as u32 == nr)
            } else if sys_exit_ns != 0 {
                match procfs::syscall(tid) {
                    Some(SyscallState::In { nr, .. }) => nr != libc::SYS_umount2,
                    Some(SyscallState::Running) => {
                        let n = self.running_seen.entry(key).or_insert(0);
                        *n += 1;
                        // One sample can catch the tail on CPU; two in a row is back in user space.
                        *n >= 2 || self.poll_tails
                    }
                    _ => false,
                }
            } else {
                false
            };
            // Only when the kernel still holds it: otherwise the kernel closed it
            // and its exact end record is on the way. The entry stays: marked
            // over, never deleted by tid (see `EndedWaits`).
            let in_kernel = matches!(self.inflight.get(&tid, 0), Ok(w) if w.start_ns == key.1);
            if ended && in_kernel {
                self.ended.mark(key);
                if let Some(a) = self.registry.vanished(key, now) {
                    self.act(vec![a], sink);
                }
            }
        }
    }

    /// Edges from each umount or sync wait (a second old or more) to the
    /// block device its writeback goes to, with that device's state now.
    fn device_edges(&mut self, io: &mut DeviceIo, now_ns: u64) -> Vec<Edge> {
        let mut out = Vec::new();
        for info in &self.open_infos {
            if now_ns.saturating_sub(info.start_ns) < 1_000_000_000 {
                continue;
            }
            let key = info.key();
            let found = match self.devices.get(&key) {
                Some(d) => d.clone(),
                None => {
                    let d = self.mounts.lock().ok().and_then(|m| detail::device_of(info, &m));
                    self.devices.insert(key, d.clone());
                    d
                }
            };
            let Some((dev, how)) = found else { continue };
            let Some(state) = io.state(dev) else { continue };
            out.push(Edge {
                from: crate::sources::inflight::Item::wait_key(info),
                to: HeldBy::Terminal(state.terminal()),
                kind: EdgeKind::Device,
                evidence: format!("{how}; block:block_rq_issue/complete count its requests"),
                exactness: Exactness::Exact,
            });
        }
        out
    }

    fn drain(&mut self, ring: &mut RingBuf<MapData>, sink: &mut dyn Sink) {
        while let Some(item) = ring.next() {
            let bytes: &[u8] = &item;
            // Anything but a WaitEnd is skipped: as one too short for a WaitEnd, else as
            // one of an unknown kind.
            let rec = match Record::parse(bytes) {
                Ok(Record::WaitEnd(rec)) => rec,
                _ if bytes.len() < std::mem::size_of::<WaitEnd>() => {
                    tracing::warn!(len = bytes.len(), "short ring buffer record skipped");
                    continue;
                }
                _ => {
                    tracing::warn!(kind = record_kind(bytes).unwrap_or_default(), "unknown ring buffer record skipped");
                    continue;
                }
            };
            let mut info = WaitInfo::from(&rec);
            if let Some(w) = crate::syscalls::by_slot(rec.slot) {
                self.measured.record("syscall", w.name, Duration::from_nanos(rec.end_ns.saturating_sub(rec.start_ns)));
            }
            if self.ended.take_end(&info.key()) {
                // Already resolved as over; the kernel only now saw its end.
                continue;
            }
            // An end record carries no path, argument or goroutine; the last scan's snapshot
            // of the same wait does. A wait that crosses --warn only as it ends is reported
            // from this record, so it needs them (a swept umount's target, say).
            let waited = Duration::from_nanos(rec.end_ns.saturating_sub(info.start_ns));
            if self.registry.wants_end(&info.key(), waited) {
                if let Some(seen) = self.open_infos.iter().find(|w| w.key() == info.key()) {
                    info = WaitInfo { sys_exit_ns: info.sys_exit_ns, ..seen.clone() };
                }
            }
            let actions = self.registry.end(info, rec.end_ns);
            self.act(actions, sink);
        }
    }

    /// A wait as a graph node. A swept wait's start is a lower bound: the time since its
    /// thread last ran, which is close to now for a umount whose thread wakes at every
    /// page. For a Go thread whose goroutine a GC found in the call, its `waitsince` (the
    /// goroutine scan's) goes further back: the node starts there, marked `waitsince`
    /// (the key, and the stall lines, keep the sweep's bound).
    fn open_wait(&self, w: &WaitInfo) -> OpenWait {
        let mut node = w.open_wait();
        if let Some((_, Some(since))) = self.swept_g.get(&w.tid).filter(|_| w.before_attach) {
            if *since < node.start_ns {
                node.start_ns = *since;
                node.start = crate::graph::model::StartTiming::Waitsince;
            }
        }
        node
    }

    /// Takes the goroutine scan's (thread, goroutine, waitsince): those of threads in a
    /// swept wait give it its goroutine (the next scan keeps only those).
    fn note_goroutines(&mut self, threads: &[(u32, u64, Option<u64>)]) {
        self.swept_g.extend(threads.iter().map(|(t, g, since)| (*t, (*g, *since))));
    }

    /// The kernel stack of a wait being reported: the thread's now while it is still in
    /// the wait (in its syscall, or in umount2's task_work tail), else the one the
    /// startup sweep read, else none (a wait reported from its end record has left).
    fn kernel_stack(&self, info: &WaitInfo) -> Vec<String> {
        let live = procfs::kernel_stack(info.tid).unwrap_or_default();
        let in_wait = match procfs::syscall(info.tid) {
            Some(SyscallState::In { nr, .. }) => nr as u32 == info.nr,
            _ => info.sys_exit_ns != 0 && live.iter().any(|f| f == "task_work_run"),
        };
        if in_wait {
            return live;
        }
        match self.swept_kstacks.get(&info.tid) {
            Some((start, k)) if *start == info.start_ns => k.clone(),
            _ => Vec::new(),
        }
    }

    fn act(&mut self, actions: Vec<Action>, sink: &mut dyn Sink) {
        for a in actions {
            match a {
                Action::Report { key, level, waited } => {
                    let Some(t) = self.registry.get(&key) else {
                        continue;
                    };
                    let info = t.info.clone();
                    let id = t.id;
                    let fixed = match self.fixed.get(&key) {
                        Some(f) => f.clone(),
                        None => {
                            let f = match self.mounts.lock() {
                                Ok(m) => detail::fixed(&info, &m),
                                Err(_) => Map::new(),
                            };
                            self.fixed.insert(key, f.clone());
                            f
                        }
                    };
                    let kind = by_slot(info.slot).map(|w| w.kind).unwrap_or(WaitKind::Sync);
                    let stall = Stall {
                        pod: Default::default(),
                        level,
                        id,
                        kind,
                        pid: info.tgid,
                        tid: info.tid,
                        comm: info.comm.clone(),
                        waited_s: waited.as_secs_f64(),
                        started_at: humantime::format_rfc3339_millis(wall_of(info.start_ns)).to_string(),
                        budget_used: budget_used(waited),
                        started_before_attach: info.before_attach,
                        detail: detail::now(&fixed, &info),
                        holder: None,
                        cause: None,
                        chain: Vec::new(),
                        kernel_stack: self.kernel_stack(&info),
                        user_stack: Vec::new(),
                        user_stack_id: info.user_stack,
                    };
                    sink.emit(&Event::Stall(stall));
                }
                Action::Resolve { key, waited, exact } => {
                    let Some(t) = self.registry.get(&key) else { continue };
                    let kind = by_slot(t.info.slot).map(|w| w.kind).unwrap_or(WaitKind::Sync);
                    self.fixed.remove(&key);
                    self.running_seen.remove(&key);
                    if self.swept_kstacks.get(&key.0).is_some_and(|(start, _)| *start == key.1) {
                        self.swept_kstacks.remove(&key.0);
                    }
                    if let Some(r) = self.registry.resolve(&key, waited, exact, kind) {
                        sink.emit(&Event::Resolved(r));
                    }
                }
            }
        }
    }
}
