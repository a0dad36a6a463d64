//! Off-CPU D-state time by kernel stack, read from the kernel's aggregates.
//!
//! The kernel records D sleeps only for the processes in its `INTERESTING`
//! map; this module keeps that map current (by comm, and with the processes
//! plegwatch is reporting on) and turns the aggregates into the `offcpu` part
//! of a stall's detail and the summary's top stacks. It also prunes the
//! kernel's `OFFCPU` and `STACKS` maps, which the kernel only adds to
//! ([`OffCpu::prune`], what goes: [`super::offcpu_prune`]).

use crate::{
    kernel::loader::{take_map, WatchError},
    observe::{lister::Lister, procfs},
    sources::offcpu_prune,
};
use aya::{
    maps::{HashMap as BpfHashMap, MapData, StackTraceMap},
    Ebpf,
};
use plegwatch_abi::{lock_maps, offcpu_maps, LockWait, OffCpuKey, OffCpuStart, OffCpuVal};
use serde_json::{json, Value};
use std::{
    collections::{BTreeMap, HashMap, HashSet},
    time::{Duration, Instant},
};

/// The processes whose D sleeps matter by default (stall-catalog.md): a
/// trailing `*` matches a prefix.
pub const DEFAULT_COMMS: &[&str] = &["kubelet", "containerd", "containerd-shim*", "runc", "dbus-daemon", "dbus-broker", "systemd"];

/// How often the set of interesting processes is refreshed from `/proc`.
const REFRESH: Duration = Duration::from_secs(2);

pub struct OffCpu {
    interesting: BpfHashMap<MapData, u32, u8>,
    open: BpfHashMap<MapData, u32, OffCpuStart>,
    agg: BpfHashMap<MapData, OffCpuKey, OffCpuVal>,
    stacks: StackTraceMap<MapData>,
    locks: BpfHashMap<MapData, u32, LockWait>,
    ksyms: BTreeMap<u64, String>,
    comms: Vec<String>,
    last_refresh: Option<Instant>,
    /// `/proc` as the last refresh listed it, each comm read once per process.
    listing: Lister,
    marked: HashSet<u32>,
    /// Comms of the processes marked, kept for the summary after they exit.
    comm_of: HashMap<u32, String>,
    /// D time of processes that are gone, pruned from the kernel's aggregate:
    /// (tgid, symbolized stack) → sums, at most [`RETIRED_MAX`] rows (the
    /// most D time), for the summary's top stacks.
    retired: HashMap<(u32, Vec<String>), OffCpuVal>,
    /// When the maps were last pruned, and the stack ids then unreferenced.
    last_prune: Option<Instant>,
    unreferenced: HashSet<u32>,
}

/// The kernel's D-sleep aggregate as one read saw it: (stack id, sums) by thread.
#[derive(Default)]
pub struct DSleeps(HashMap<u32, Vec<(i32, OffCpuVal)>>);

/// Most rows kept of processes pruned from the aggregate.
const RETIRED_MAX: usize = 64;

/// Most comms kept for processes that exited.
const COMM_MAX: usize = 4096;

fn comm_matches(patterns: &[String], comm: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => comm.starts_with(prefix),
        None => comm == p,
    })
}

impl OffCpu {
    /// Takes the maps; `extra_comms` adds to [`DEFAULT_COMMS`] (from `--comm`).
    pub fn new(ebpf: &mut Ebpf, extra_comms: &[String], listing: Lister) -> Result<Self, WatchError> {
        let mut comms: Vec<String> = DEFAULT_COMMS.iter().map(|s| s.to_string()).collect();
        comms.extend(extra_comms.iter().cloned());
        Ok(OffCpu {
            interesting: take_map(ebpf, offcpu_maps::INTERESTING)?,
            open: take_map(ebpf, offcpu_maps::OFFCPU_START)?,
            agg: take_map(ebpf, offcpu_maps::OFFCPU)?,
            stacks: take_map(ebpf, offcpu_maps::STACKS)?,
            locks: take_map(ebpf, lock_maps::LOCK_WAITS)?,
            ksyms: aya::util::kernel_symbols().unwrap_or_default(),
            comms,
            last_refresh: None,
            listing,
            marked: HashSet::new(),
            comm_of: HashMap::new(),
            retired: HashMap::new(),
            last_prune: None,
            unreferenced: HashSet::new(),
        })
    }

    /// Marks the processes whose comm matches, plus `extra` (the processes of
    /// waits being reported), at most every [`REFRESH`] unless `extra` is new.
    pub fn refresh(&mut self, extra: &[u32]) {
        let due = self.last_refresh.is_none_or(|t| t.elapsed() >= REFRESH);
        if !due && extra.iter().all(|t| self.marked.contains(t)) {
            return;
        }
        self.last_refresh = Some(Instant::now());
        let mut want: HashSet<u32> = extra.iter().copied().collect();
        want.extend(self.listing.latest().iter().filter(|(_, c)| c.is_some_and(|c| comm_matches(&self.comms, c))).map(|(pid, _)| pid));
        want.remove(&crate::observe::namespaces::self_tgid());
        for gone in self.marked.difference(&want).copied().collect::<Vec<_>>() {
            let _ = self.interesting.remove(&gone);
        }
        // The kernel marks umount2 callers itself (value 2): drop the dead ones.
        let dead: Vec<u32> = self.interesting.keys().filter_map(Result::ok).filter(|t| !procfs::thread_exists(*t)).collect();
        for t in dead {
            let _ = self.interesting.remove(&t);
        }
        for add in want.difference(&self.marked).copied().collect::<Vec<_>>() {
            let _ = self.interesting.insert(add, 1, 0);
            if let Some(c) = procfs::comm(add) {
                self.comm_of.insert(add, c);
            }
        }
        self.marked = want;
        // Bounded in a long run: keep the comms the summary can still name (processes
        // marked now, or with D time in the kernel's aggregate).
        if self.comm_of.len() > COMM_MAX {
            let mut keep: HashSet<u32> = self.agg.keys().filter_map(Result::ok).map(|k| k.tgid).collect();
            keep.extend(self.marked.iter().copied());
            keep.extend(self.retired.keys().map(|(tgid, _)| *tgid));
            self.comm_of.retain(|pid, _| keep.contains(pid));
        }
    }

    /// Whether a pruning pass is due (every [`offcpu_prune::EVERY`]; the first
    /// one a period after the start).
    pub fn prune_due(&mut self) -> bool {
        match self.last_prune {
            None => {
                self.last_prune = Some(Instant::now());
                false
            }
            Some(t) => t.elapsed() >= offcpu_prune::EVERY,
        }
    }

    /// One pruning pass (see [`super::offcpu_prune`]): deletes the `OFFCPU`
    /// entries of processes that are gone, folding their D time into the
    /// summary's rows, and the stack ids nothing references. `inflight_stacks`
    /// are the user stack ids of the watched waits open now. Returns how many
    /// entries and stacks went.
    pub fn prune(&mut self, inflight_stacks: &[i32]) -> (usize, usize) {
        self.last_prune = Some(Instant::now());
        let agg: Vec<OffCpuKey> = self.agg.keys().filter_map(Result::ok).collect();
        let mut referenced: HashSet<i32> = inflight_stacks.iter().copied().collect();
        referenced.extend(self.open.iter().filter_map(Result::ok).map(|(_, s)| s.stack_id));
        referenced.extend(self.locks.iter().filter_map(Result::ok).map(|(_, w)| w.stack_id));
        let ids: Vec<u32> = self.stacks.stack_ids().filter_map(Result::ok).collect();
        let plan = offcpu_prune::plan(&agg, procfs::thread_exists, &referenced, &ids, &self.unreferenced, offcpu_prune::MAX_DELETES);
        let mut gone = 0;
        for k in &plan.offcpu {
            let v = self.agg.get(k, 0).ok();
            if self.agg.remove(k).is_ok() {
                gone += 1;
                if let Some(v) = v {
                    self.retire(k, v);
                }
            }
        }
        let mut stacks = 0;
        for id in &plan.stacks {
            if self.stacks.remove(id).is_ok() {
                stacks += 1;
            }
        }
        self.unreferenced = plan.unreferenced;
        (gone, stacks)
    }

    /// Keeps a pruned entry's D time for the summary (the rows with the most).
    fn retire(&mut self, k: &OffCpuKey, v: OffCpuVal) {
        let e = self.retired.entry((k.tgid, self.symbolize(k.stack_id))).or_default();
        e.total_ns += v.total_ns;
        e.count += v.count;
        e.max_ns = e.max_ns.max(v.max_ns);
        if self.retired.len() > RETIRED_MAX {
            if let Some(least) = self.retired.iter().min_by_key(|(_, v)| v.total_ns).map(|(k, _)| k.clone()) {
                self.retired.remove(&least);
            }
        }
    }

    /// The user addresses of stack `stack_id` (taken with `BPF_F_USER_STACK`),
    /// innermost first; none for -1 or an id no longer in the map.
    pub fn user_ips(&self, stack_id: i32) -> Vec<u64> {
        if stack_id < 0 {
            return Vec::new();
        }
        match self.stacks.get(&(stack_id as u32), 0) {
            Ok(trace) => trace.frames().iter().map(|f| f.ip).collect(),
            Err(_) => Vec::new(),
        }
    }

    fn symbolize(&self, stack_id: i32) -> Vec<String> {
        if stack_id < 0 {
            return Vec::new();
        }
        let Ok(trace) = self.stacks.get(&(stack_id as u32), 0) else { return Vec::new() };
        trace
            .frames()
            .iter()
            .map(|f| match self.ksyms.range(..=f.ip).next_back() {
                Some((_, name)) => name.clone(),
                None => format!("{:#x}", f.ip),
            })
            // The first frames are plegwatch's own program and the tracepoint glue.
            .skip_while(|name| name.contains("[bpf]") || name.starts_with("bpf_trace_run") || name.starts_with("__bpf_trace"))
            .collect()
    }

    /// The kernel's D-sleep aggregate, read once, by thread: a batch of stall lines
    /// reads the map once, not once a line (each entry is two syscalls to read, and
    /// a busy node's map holds thousands).
    pub fn d_sleeps(&self) -> DSleeps {
        let mut by_tid: HashMap<u32, Vec<(i32, OffCpuVal)>> = HashMap::new();
        for (k, v) in self.agg.iter().filter_map(Result::ok) {
            by_tid.entry(k.tid).or_default().push((k.stack_id, v));
        }
        DSleeps(by_tid)
    }

    /// The `offcpu` detail of thread `tid` at `now_ns`: its D time recorded
    /// so far, the D sleep it is in now, and the stack it spent most D time in.
    pub fn for_tid(&self, sleeps: &DSleeps, tid: u32, now_ns: u64) -> Option<Value> {
        let mut total = 0u64;
        let mut count = 0u64;
        let mut by_stack: HashMap<i32, u64> = HashMap::new();
        for &(stack_id, v) in sleeps.0.get(&tid).map_or(&[][..], Vec::as_slice) {
            total += v.total_ns;
            count += v.count;
            *by_stack.entry(stack_id).or_default() += v.total_ns;
        }
        let current = self.open.get(&tid, 0).ok();
        if let Some(c) = &current {
            *by_stack.entry(c.stack_id).or_default() += now_ns.saturating_sub(c.start_ns);
        }
        if count == 0 && current.is_none() {
            return None;
        }
        let top = by_stack.iter().max_by_key(|(_, ns)| **ns).map(|(id, _)| *id).unwrap_or(-1);
        Some(json!({
            "d_state_s": total as f64 / 1e9,
            "d_sleeps": count,
            "in_d_now_s": current.map(|c| now_ns.saturating_sub(c.start_ns) as f64 / 1e9),
            "top_stack": self.symbolize(top),
        }))
    }

    /// The kernel mutex `tid` waits on now, as the graph's mutex resolver needs it: its
    /// owner thread (none when the lock's owner field was empty) and the lock's name
    /// (`rtnl_mutex`, else the function that took it).
    pub fn mutex_wait(&self, tid: u32, _now_ns: u64) -> Option<crate::graph::resolvers::MutexWait> {
        let w = self.locks.get(&tid, 0).ok()?;
        if w.owner_tid == 0 {
            return None;
        }
        let lock = match lock_site(&self.symbolize(w.stack_id)) {
            Some("rtnl_lock") => "rtnl_mutex".to_string(),
            Some(f) => format!("mutex taken in {f}"),
            None => "a kernel mutex".to_string(),
        };
        Some(crate::graph::resolvers::MutexWait { owner_tid: w.owner_tid, lock })
    }

    /// The `n` (process, stack) pairs with the most D time, for the summary.
    pub fn top(&self, n: usize) -> Vec<Value> {
        let mut by: HashMap<(u32, i32), OffCpuVal> = HashMap::new();
        for (k, v) in self.agg.iter().filter_map(Result::ok) {
            let e = by.entry((k.tgid, k.stack_id)).or_default();
            e.total_ns += v.total_ns;
            e.count += v.count;
            e.max_ns = e.max_ns.max(v.max_ns);
        }
        let mut rows: Vec<_> = by.into_iter().collect();
        rows.sort_by_key(|(_, v)| std::cmp::Reverse(v.total_ns));
        // The live rows, then those of processes pruned since they exited (a
        // process pruned and still running under a reused pid is two rows).
        let mut rows: Vec<((u32, Vec<String>), OffCpuVal)> =
            rows.into_iter().take(n).map(|((tgid, stack), v)| ((tgid, self.symbolize(stack)), v)).collect();
        rows.extend(self.retired.iter().map(|(k, v)| (k.clone(), *v)));
        rows.sort_by_key(|(_, v)| std::cmp::Reverse(v.total_ns));
        rows.into_iter()
            .take(n)
            .map(|((tgid, stack), v)| {
                json!({
                    "pid": tgid,
                    "comm": self.comm_of.get(&tgid).cloned().or_else(|| procfs::comm(tgid)),
                    "d_state_s": v.total_ns as f64 / 1e9,
                    "d_sleeps": v.count,
                    "longest_s": v.max_ns as f64 / 1e9,
                    "stack": stack,
                })
            })
            .collect()
    }
}

/// The function that took the lock: the first frame of a waiter's stack past
/// the mutex and scheduler internals.
fn lock_site(stack: &[String]) -> Option<&str> {
    const INTERNAL: &[&str] = &["__schedule", "schedule", "preempt_schedule", "__mutex", "mutex_", "__ww_mutex", "io_schedule"];
    stack.iter().map(String::as_str).find(|f| !INTERNAL.iter().any(|p| f.starts_with(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_site_skips_mutex_internals() {
        let s: Vec<String> =
            ["__schedule", "schedule", "schedule_preempt_disabled", "__mutex_lock.constprop.0", "rtnl_lock", "rtnetlink_rcv_msg"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        assert_eq!(lock_site(&s), Some("rtnl_lock"));
    }

    #[test]
    fn default_comms_match_the_catalog() {
        let p: Vec<String> = DEFAULT_COMMS.iter().map(|s| s.to_string()).collect();
        assert!(comm_matches(&p, "containerd-shim"));
        assert!(comm_matches(&p, "containerd"));
        assert!(comm_matches(&p, "kubelet"));
        assert!(!comm_matches(&p, "bash"));
    }
}
