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
mod graph_step;
mod lookups;
mod scan_clock;
mod setup;
mod summary;

pub use setup::WatchConfig;

use crate::{
    clock::monotonic_ns,
    events::{Event, Ready, Sink, Summary},
    graph::incidents::Incidents,
    kernel::loader::WatchError,
    kernel::probes::Choice,
    observe::{k8s::Pods, ustack::UserSymbolizer, Observe},
    sources::{
        children::ChildWaits,
        decorate::Decorate,
        devices::DeviceIo,
        gowatch::{thread_waits::KernelWaits, Background, GoWatch},
        offcpu::OffCpu,
        parked::Sampler,
        reqwatch::ReqWatch,
        syscall_waits::SyscallWaits,
    },
};
use aya::maps::{MapData, RingBuf};
use setup::setup;
use std::time::{Duration, Instant};
use tokio::{io::unix::AsyncFd, signal::unix::SignalKind};

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
    sink.emit(&Event::Ready(Ready::new(
        w.me,
        choices.iter().map(Choice::to_output).collect(),
        w.cfg.thresholds.warn.as_secs_f64(),
        w.cfg.thresholds.critical.as_secs_f64(),
        w.cfg.thresholds.imminent.as_secs_f64(),
    )));
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
    /// The last scan's wait-for graph, for the stall lines of waits ended since.
    last_graph: Option<graph_step::LastGraph>,
}

impl Watch {
    /// One scan: every source's open waits and events, then the graph's step.
    fn tick(&mut self, scheduled: Instant, rings: &mut Rings, sink: &mut dyn Sink) {
        let began = Instant::now();
        let mut phases = scan_clock::Phases::start();
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
        phases.mark("offcpu");
        // Short Go calls and socket records are queued without a wakeup: take them now.
        self.drain_go(rings.go.get_mut(), sink);
        phases.mark("go_ring");
        self.drain_sock(rings.sock.get_mut());
        phases.mark("socket_ring");
        self.syscalls.scan(&mut self.out);
        phases.mark("syscall_waits");
        self.req.scan(monotonic_ns(), &mut self.out);
        phases.mark("requests");
        let waits = KernelWaits { by_tid: self.syscalls.open_by_tid(), by_g: self.syscalls.open_by_g() };
        self.go.scan(monotonic_ns(), &waits, &mut self.out);
        phases.mark("go_calls");
        self.step_and_emit(sink, &mut phases);
        self.go.poll(&mut self.ebpf, &mut self.out);
        emit_all(&mut self.out, sink);
        phases.mark("go_poll");
        self.drops.check(&self.ebpf);
        if let Some(every) = self.cfg.status_every {
            if self.last_status.elapsed() >= every {
                self.last_status = Instant::now();
                let status = summary::status(&self.ebpf, &self.incidents, &self.go, &mut self.late_since);
                sink.emit(&Event::Status(Box::new(status)));
            }
        }
        phases.mark("status");
        self.scans.took(began.elapsed(), phases);
    }

    /// Every record in the Go ring: calls' ends, exits and execs (a new target is probed).
    fn drain_go(&mut self, ring: &mut RingBuf<MapData>, sink: &mut dyn Sink) {
        while let Some(item) = ring.next() {
            self.go.on_record(&mut self.ebpf, &item, &mut self.out);
        }
        self.link_ended();
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
        self.link_ended();
        let _ = self.emit_decorated(sink);
    }

    /// The graph's step over the waits the sources just scanned: their `stall` lines
    /// take their holders from it and go first, then the incidents' changes.
    fn step_and_emit(&mut self, sink: &mut dyn Sink, phases: &mut scan_clock::Phases) {
        let changes = self.step_graph(phases);
        let spent = self.emit_decorated(sink);
        phases.mark_parts(&spent, "stall_lines_out");
        for e in changes {
            sink.emit(&e);
        }
        phases.mark("incidents_out");
    }

    /// Hands the events the sources just made to the sink, each stall decorated
    /// (`sources::decorate`).
    fn emit_decorated(&mut self, sink: &mut dyn Sink) -> [(&'static str, Duration); 3] {
        // The probed binaries' symbols, parsed already (at startup or off the loop), name
        // their user stacks: never a second parse on the loop.
        for ((dev, inode), symbols) in self.go.take_symbols() {
            self.ustack.prime(dev, inode, symbols);
        }
        let mut decorate = Decorate::new(self.offcpu.as_ref(), &mut self.ustack, &mut self.pods);
        for e in self.out.drain(..) {
            sink.emit(&decorate.event(e));
        }
        decorate.spent()
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
                if let Some(c) = self.children.as_mut() {
                    c.note_goroutines(&threads);
                }
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
        self.step_and_emit(sink, &mut scan_clock::Phases::start());
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
