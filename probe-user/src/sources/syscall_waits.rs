//! The kernel-wait source: threads in a watched syscall (umount2, sync, fsync…) or in
//! umount2's task_work tail, from the kernel's `INFLIGHT` map and `EVENTS` ring.
//!
//! Two inputs:
//! - every scan, a snapshot of `INFLIGHT` goes to the [`Registry`], which says which
//!   waits crossed a level (a `stall` event) and which are over by `/proc` (a thread
//!   gone, a tail back in user space);
//! - the `EVENTS` ring says when long waits ended and how long they took, to the
//!   nanosecond (a `resolved` event).
//!
//! It hands its open waits to the graph as [`OpenWait`]s, with the facts only it has
//! (the block device each umount or sync writes back to), and its events to the
//! scheduler, in the order they happened. It never prints and never takes a sink.

use crate::{
    clock::{monotonic_ns, wall_of},
    events::{Event, Stall},
    graph::{devices::DeviceFact, model::OpenWait},
    kernel::loader::{take_map, WatchError},
    kernel::probes::Choice,
    levels::{budget_used, Thresholds},
    observe::mounts::SharedMounts,
    observe::procfs::{self, SyscallState},
    sources::detail,
    sources::devices::DeviceIo,
    sources::ended::EndedWaits,
    sources::inflight::{Action, Filter, Item, Registry, TidStart, WaitInfo},
    sources::on_cpu::OnCpu,
    sources::sweep,
    syscalls::{by_slot, WaitKind},
};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, RingBuf};
use plegwatch_abi::{maps, record_kind, Record, Wait, WaitEnd};
use serde_json::{Map, Value};
use std::{collections::HashMap, time::Duration};

/// A wait's block device and how it was found (see `detail::device_of`).
type DeviceFound = ((u32, u32), String);

/// The kernel waits' state between wakeups.
pub struct SyscallWaits {
    registry: Registry,
    mounts: SharedMounts,
    inflight: BpfHashMap<MapData, u32, Wait>,
    /// The task_work tail's end is found by polling /proc (no kernel probe).
    poll_tails: bool,
    /// The fixed part of each reported wait's detail.
    fixed: HashMap<TidStart, Map<String, Value>>,
    /// Processes with a wait open in the kernel at the last scan.
    open_tgids: Vec<u32>,
    /// Each thread's open kernel wait, as a small JSON object.
    open_by_tid: HashMap<u32, Value>,
    /// The same by (process, goroutine), for waits made by Go targets: (tid, object).
    open_by_g: HashMap<(u32, u64), (u32, Value)>,
    /// Tails and swept waits whose thread the scans keep finding on CPU.
    on_cpu: OnCpu,
    /// Every kernel wait open at the last scan, as graph nodes.
    open_waits: Vec<OpenWait>,
    /// The same waits as the kernel gave them.
    open_infos: Vec<WaitInfo>,
    /// The device each wait's writeback goes to, looked up once per wait.
    devices: HashMap<TidStart, Option<DeviceFound>>,
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

impl SyscallWaits {
    /// Takes the kernel's `INFLIGHT` and `TAIL_PENDING` maps, and puts in the waits that
    /// began before the probes were attached (the startup sweep). Returns the source and
    /// those swept waits, whose kernel stacks it read while they were blocked.
    pub fn attach(
        ebpf: &mut aya::Ebpf,
        thresholds: Thresholds,
        filter: Filter,
        mounts: SharedMounts,
        choices: &[Choice],
        blocked: &[sweep::Blocked],
        clock: &sweep::AgeClock,
    ) -> Result<(Self, Vec<Wait>), WatchError> {
        let mut inflight: BpfHashMap<MapData, u32, Wait> = take_map(ebpf, maps::INFLIGHT)?;
        let mut tails: Array<MapData, u64> = take_map(ebpf, maps::TAIL_PENDING)?;
        let (swept, ended) = seed_swept(&mut inflight, &mut tails, sweep::sweep(blocked, clock));
        let poll_tails = choices.iter().any(|c| c.probe == "umount_tail_end" && c.is_proc_poll());
        let mut waits = SyscallWaits {
            registry: Registry::new(thresholds, filter),
            mounts,
            inflight,
            poll_tails,
            fixed: HashMap::new(),
            open_tgids: Vec::new(),
            open_by_tid: HashMap::new(),
            open_by_g: HashMap::new(),
            on_cpu: OnCpu::default(),
            open_waits: Vec::new(),
            open_infos: Vec::new(),
            devices: HashMap::new(),
            ended,
            swept_kstacks: HashMap::new(),
            swept_g: HashMap::new(),
            tails,
            swept_tails: None,
            measured: Default::default(),
        };
        // Read now, while the swept threads are still blocked: a swept wait whose age is a
        // low bound may cross --warn only as it ends, and is then reported from its end.
        for w in &swept {
            if let Some(k) = procfs::kernel_stack(w.tid) {
                waits.swept_kstacks.insert(w.tid, (w.start_ns, k));
            }
        }
        Ok((waits, swept))
    }

    /// Processes with a wait open in the kernel at the last scan.
    pub fn open_tgids(&self) -> &[u32] {
        &self.open_tgids
    }

    /// Each thread's open kernel wait, as a small JSON object (the Go chain's view).
    pub fn open_by_tid(&self) -> &HashMap<u32, Value> {
        &self.open_by_tid
    }

    /// The same by (process, goroutine), for waits made by Go targets: (tid, object).
    pub fn open_by_g(&self) -> &HashMap<(u32, u64), (u32, Value)> {
        &self.open_by_g
    }

    /// Every kernel wait open at the last scan, as graph nodes.
    pub fn open_waits(&self) -> &[OpenWait] {
        &self.open_waits
    }

    /// The user-stack ids the kernel holds for open waits (kept by the off-CPU prune).
    pub fn user_stacks(&self) -> Vec<i32> {
        self.inflight.iter().filter_map(Result::ok).map(|(_, w)| w.user_stack).collect()
    }

    /// The exact durations of the waits that got an end record, by syscall.
    pub fn measured(&self) -> &crate::latency::LatencyTables {
        &self.measured
    }

    /// (stall lines, resolutions, still open).
    pub fn counts(&self) -> (u64, u64, u64) {
        let (stalls, resolved) = self.registry.counts();
        (stalls, resolved, self.registry.open().count() as u64)
    }

    /// Looks at every open kernel wait now: what crossed a level, and what is over by
    /// `/proc`, as events in `out`.
    pub fn scan(&mut self, out: &mut Vec<Event>) {
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
        self.open_by_tid.clear();
        self.open_by_g.clear();
        for w in &open {
            let kind = by_slot(w.slot).map(|s| s.kind.as_str()).unwrap_or("sync");
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
        self.act(actions, out);
        self.check_reported(now, out);
    }

    /// Waits whose end the kernel can't see: their thread vanished, or (without
    /// the tail probe, or for a thread that went back to user space without a
    /// syscall) their task_work tail is over by `/proc/TID/syscall`.
    fn check_reported(&mut self, now: u64, out: &mut Vec<Event>) {
        let candidates: Vec<(TidStart, u64, u32, bool)> =
            self.registry.open().map(|t| (t.info.key(), t.info.sys_exit_ns, t.info.nr, t.info.before_attach)).collect();
        for (key, sys_exit_ns, nr, before_attach) in candidates {
            let tid = key.0;
            let ended = if !procfs::thread_exists(tid) {
                Some(now)
            } else if sys_exit_ns == 0 && before_attach {
                // Swept while blocked: the kernel will see its exit, unless it
                // raced the sweep. On CPU says nothing (woken in the call, or waiting
                // for a CPU): judged as a tail's thread is, the kernel's exit probe standing
                // for the tail probe.
                match procfs::syscall(tid) {
                    Some(SyscallState::Running) => self.on_cpu.on_cpu(key, now, procfs::cpu_use(tid), false),
                    state => {
                        self.on_cpu.off_cpu(&key);
                        (!matches!(state, Some(SyscallState::In { nr: n, .. }) if n as u32 == nr)).then_some(now)
                    }
                }
            } else if sys_exit_ns != 0 {
                match procfs::syscall(tid) {
                    Some(SyscallState::Running) => self.on_cpu.on_cpu(key, now, procfs::cpu_use(tid), self.poll_tails),
                    state => {
                        self.on_cpu.off_cpu(&key);
                        matches!(state, Some(SyscallState::In { nr, .. }) if nr != libc::SYS_umount2).then_some(now)
                    }
                }
            } else {
                None
            };
            // Only when the kernel still holds it: otherwise the kernel closed it
            // and its exact end record is on the way. The entry stays: marked
            // over, never deleted by tid (see `EndedWaits`).
            let in_kernel = matches!(self.inflight.get(&tid, 0), Ok(w) if w.start_ns == key.1);
            if let (Some(end_ns), true) = (ended, in_kernel) {
                self.ended.mark(key);
                if let Some(a) = self.registry.vanished(key, end_ns) {
                    self.act(vec![a], out);
                }
            }
        }
    }

    /// Each umount or sync wait a second old or more, with the block device its
    /// writeback goes to and that device's state now (for the graph's device edges).
    pub fn device_facts(&mut self, io: &mut DeviceIo, now_ns: u64) -> Vec<DeviceFact> {
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
            out.push(DeviceFact { wait: crate::sources::inflight::Item::wait_key(info), device: state.terminal(), how });
        }
        out
    }

    /// Takes every end record in `ring`: resolutions (and stalls that crossed --warn
    /// only as they ended) as events in `out`.
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>, out: &mut Vec<Event>) {
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
            self.act(actions, out);
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
    pub fn note_goroutines(&mut self, threads: &[(u32, u64, Option<u64>)]) {
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

    fn act(&mut self, actions: Vec<Action>, out: &mut Vec<Event>) {
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
                        wait: Some(info.wait_key()),
                        kernel_stack: self.kernel_stack(&info),
                        user_stack: Vec::new(),
                        user_stack_id: info.user_stack,
                    };
                    out.push(Event::Stall(Box::new(stall)));
                }
                Action::Resolve { key, waited, exact } => {
                    let Some(t) = self.registry.get(&key) else { continue };
                    let kind = by_slot(t.info.slot).map(|w| w.kind).unwrap_or(WaitKind::Sync);
                    self.fixed.remove(&key);
                    self.on_cpu.off_cpu(&key);
                    if self.swept_kstacks.get(&key.0).is_some_and(|(start, _)| *start == key.1) {
                        self.swept_kstacks.remove(&key.0);
                    }
                    if let Some(r) = self.registry.resolve(&key, waited, exact, kind) {
                        out.push(Event::Resolved(r));
                    }
                }
            }
        }
    }
}

/// Puts the waits that began before the probes were attached into the
/// kernel's map, so the kernel closes them like its own. Returns how many, and
/// those that ended as they were put in (marked over, never deleted: see
/// [`EndedWaits`]).
fn seed_swept(
    inflight: &mut BpfHashMap<MapData, u32, Wait>,
    tails: &mut Array<MapData, u64>,
    found: Vec<sweep::Swept>,
) -> (Vec<Wait>, EndedWaits) {
    const BPF_NOEXIST: u64 = 1;
    let mut n = Vec::new();
    let mut raced = EndedWaits::default();
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
