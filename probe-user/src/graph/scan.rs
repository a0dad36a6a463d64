//! One scan of the wait-for graph: every source's open waits and facts in, the
//! incidents' changes out.
//!
//! The step, in order:
//! 1. the threads in `wait4`/`waitid` that matter (a Go call's goroutine, or a parent
//!    whose child is stopped or blocked alone) become waits;
//! 2. the threads parked where no probe sees them (the sampler's last round) become
//!    waits, with their unix-peer and futex-sibling edges;
//! 3. every resolver adds its edges: requests' answerers, children, shims' children,
//!    Go calls, relists, kernel mutexes, devices;
//! 4. [`Incidents::scan`] turns the graph into raised, escalated and resolved incidents.
//!
//! Pure: the only lookups go through [`Lookups`] (the `observe` layer implements it;
//! the tests use fakes), so it is tested without root.

use super::{
    children::{self, ChildProcs, ChildWaitFact},
    devices::{device_edges, DeviceFact},
    incidents::{Change, Clocks, Graph, Incidents, Links},
    model::{Edge, OpenWait, WaitKey},
    parked::{parked_graph, ParkedThread},
    requests::{answer_edges, Answerer},
    resolvers::{self, GoFacts, MutexWait},
};

/// What the resolvers may look up besides the facts handed over: processes and
/// sockets, children's pipes and start times, and kernel mutexes.
pub trait Lookups: ChildProcs {
    /// The kernel mutex thread `tid` waits on now, if the off-CPU probe saw it block on one.
    fn mutex_wait(&mut self, tid: u32, now_ns: u64) -> Option<MutexWait>;
}

/// Every source's view at one instant.
pub struct Snapshot {
    pub clocks: Clocks,
    /// The open waits of the kernel, request and Go sources.
    pub waits: Vec<OpenWait>,
    /// The Go calls open now, parked goroutines and outstanding ttrpc requests.
    pub facts: GoFacts,
    /// Threads in `wait4`/`waitid` (empty without the `child_wait` probe).
    pub child_waits: Vec<ChildWaitFact>,
    /// Threads still parked where no probe sees them; `None` without the sampler.
    pub parked: Option<Vec<ParkedThread>>,
    /// Who must answer each request open a second or more.
    pub answers: Vec<(WaitKey, Answerer)>,
    /// Each umount or sync wait's writeback device, with its state now.
    pub devices: Vec<DeviceFact>,
}

/// What a scan found.
pub struct Scanned {
    /// Incidents raised, escalated or resolved, in order.
    pub changes: Vec<Change>,
    /// Every wait in the graph, those the graph added (children, parked) included.
    pub waits: Vec<OpenWait>,
    /// Every edge the resolvers found.
    pub edges: Vec<Edge>,
}

impl Scanned {
    /// Each of `keys`' links in this scan's graph (its holder, cause and chain, as the
    /// incidents show them), in order; empty links for a wait not in it.
    pub fn links(&self, keys: &[WaitKey], now_ns: u64, ids: &mut dyn FnMut(WaitKey) -> u64) -> Vec<Links> {
        if keys.is_empty() {
            return Vec::new();
        }
        let graph = Graph::new(&self.waits, &self.edges);
        keys.iter().map(|k| graph.links(*k, now_ns, ids)).collect()
    }
}

/// One scan (see the module doc). `keep` says which waits may make incidents (the
/// filters); `ids` gives each wait its stall id.
pub fn scan<L: Lookups>(
    incidents: &mut Incidents,
    snapshot: Snapshot,
    lookups: &mut L,
    keep: &dyn Fn(&OpenWait) -> bool,
    ids: &mut dyn FnMut(WaitKey) -> u64,
) -> Scanned {
    let Snapshot { clocks, mut waits, facts, child_waits, parked, answers, devices } = snapshot;
    let now = clocks.now_ns;
    // Threads in wait4/waitid go in first: a Go call joins them by goroutine.
    let child_waits: Vec<ChildWaitFact> = child_waits
        .into_iter()
        .filter_map(|f| children::matters(&f, &facts, &waits, lookups, now).map(|why| f.as_it_matters(why)))
        .collect();
    for f in &child_waits {
        let comm = lookups.comm(f.tid).unwrap_or_default();
        waits.push(children::open_wait(f, comm));
    }
    let mut parked_edges = Vec::new();
    if let Some(parked) = parked {
        let (pw, pe) = parked_graph(&parked, &waits, &facts, now, lookups);
        waits.extend(pw);
        parked_edges = pe;
    }
    let mut edges = answer_edges(&answers, &waits, lookups);
    edges.extend(parked_edges);
    edges.extend(children::child_wait_edges(&child_waits, &waits, lookups));
    edges.extend(children::shim_child_edges(&facts, &waits, lookups, now));
    edges.extend(resolvers::go_edges(&facts, &waits, lookups));
    edges.extend(resolvers::relist_edges(&facts, lookups));
    // The mutex lookups and the process lookups share one `Lookups`: the mutexes of the
    // waits the resolver looks at are taken first.
    let mutexes: std::collections::HashMap<u32, MutexWait> = waits
        .iter()
        .filter(|w| resolvers::mutex_may_hold(w, now))
        .filter_map(|w| lookups.mutex_wait(w.who.tid, now).map(|m| (w.who.tid, m)))
        .collect();
    let mutex_edges = resolvers::kernel_mutex_edges(&waits, now, &mut |tid| mutexes.get(&tid).cloned(), lookups);
    edges.extend(mutex_edges);
    edges.extend(device_edges(&devices));
    let changes = incidents.scan(&waits, &edges, clocks, keep, ids);
    Scanned { changes, waits, edges }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{
        children::{PipeLink, WaitTarget},
        fakes::FakeProcs,
        incidents::Change,
        model::{EdgeKind, Exactness, HolderId, StartTiming, Terminal, Who},
        resolvers::Procs,
    };
    use crate::levels::Thresholds;
    use crate::syscalls::WaitKind;
    use std::collections::HashMap;
    use std::time::{Duration, SystemTime};

    const S: u64 = 1_000_000_000;

    /// `FakeProcs`, no pipes, and the kernel mutexes a test sets.
    #[derive(Default)]
    struct World {
        procs: FakeProcs,
        mutexes: HashMap<u32, MutexWait>,
        /// Every thread whose mutex was asked for.
        asked: Vec<u32>,
    }

    impl Procs for World {
        fn children(&mut self, pid: u32) -> Vec<u32> {
            self.procs.children(pid)
        }
        fn state(&mut self, pid: u32) -> Option<char> {
            self.procs.state(pid)
        }
        fn stuck_since(&mut self, pid: u32, now_ns: u64) -> Option<u64> {
            self.procs.stuck_since(pid, now_ns)
        }
        fn comm(&mut self, pid: u32) -> Option<String> {
            self.procs.comm(pid)
        }
        fn connected(&mut self, client: u32, server: u32) -> bool {
            self.procs.connected(client, server)
        }
    }

    impl ChildProcs for World {
        fn child_pipes(&mut self, _pid: u32) -> Vec<PipeLink> {
            Vec::new()
        }
        fn started_ns(&mut self, _pid: u32) -> Option<u64> {
            None
        }
    }

    impl Lookups for World {
        fn mutex_wait(&mut self, tid: u32, _now_ns: u64) -> Option<MutexWait> {
            self.asked.push(tid);
            self.mutexes.get(&tid).cloned()
        }
    }

    fn kernel_wait(pid: u32, tid: u32, kind: WaitKind, what: &str, start_s: u64) -> OpenWait {
        OpenWait {
            key: WaitKey::Kernel { tid, start_ns: start_s * S },
            who: Who { pid, tid, comm: format!("c{pid}"), goroutine: None },
            kind,
            what: what.into(),
            start_ns: start_s * S,
            start: StartTiming::Exact,
            pleg_path: false,
        }
    }

    fn snapshot(now_s: u64, waits: Vec<OpenWait>) -> Snapshot {
        Snapshot {
            clocks: Clocks { now_ns: now_s * S, wall: SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000), relist_start_ns: None },
            waits,
            facts: GoFacts::default(),
            child_waits: Vec::new(),
            parked: None,
            answers: Vec::new(),
            devices: Vec::new(),
        }
    }

    fn incidents() -> Incidents {
        Incidents::new(
            Thresholds::new(Duration::from_secs(10), Duration::from_secs(60), Duration::from_secs(150)).unwrap_or_else(|e| panic!("{e}")),
        )
    }

    fn raised(s: &Scanned) -> Vec<&crate::graph::incidents::Incident> {
        s.changes.iter().filter_map(|c| if let Change::Raised(i) = c { Some(i) } else { None }).collect()
    }

    fn ids(k: WaitKey) -> u64 {
        match k {
            WaitKey::Kernel { tid, .. } => u64::from(tid),
            _ => 0,
        }
    }

    #[test]
    fn a_umount_on_a_busy_device_is_one_incident_ending_at_the_device() {
        let umount = kernel_wait(10, 11, WaitKind::Umount, "umount2 /mnt", 0);
        let mut s = snapshot(12, vec![umount.clone()]);
        let device = Terminal { id: Some(HolderId::Device(7, 0)), kind: "device", pid: None, comm: None, what: "block device 7:0".into() };
        s.devices = vec![DeviceFact { wait: umount.key, device, how: "the mount's device".into() }];
        let out = scan(&mut incidents(), s, &mut World::default(), &|_| true, &mut ids);
        let raised = raised(&out);
        assert_eq!(raised.len(), 1, "{:?}", out.changes.len());
        let kinds: Vec<&str> = raised[0].chain.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(kinds, ["umount", "device"]);
        assert_eq!(raised[0].chain[0].edge, Some(EdgeKind::Device));
    }

    #[test]
    fn a_request_answered_by_a_process_in_its_own_wait_is_one_chain_of_both() {
        let request = OpenWait {
            key: WaitKey::Netlink { sock: 20 << 32 | 3, start_ns: 0 },
            ..kernel_wait(20, 21, WaitKind::NetlinkRequest, "usersock", 0)
        };
        let theirs = kernel_wait(30, 31, WaitKind::Sync, "fsync", 1);
        let mut s = snapshot(15, vec![request.clone(), theirs.clone()]);
        s.answers = vec![(
            request.key,
            Answerer { pid: Some(30), kind: EdgeKind::NetlinkPeer, exactness: Exactness::Exact, evidence: "port".into() },
        )];
        let out = scan(&mut incidents(), s, &mut World::default(), &|_| true, &mut ids);
        let raised = raised(&out);
        assert_eq!(raised.len(), 1, "one incident, not one per wait");
        let pids: Vec<Option<u32>> = raised[0].chain.iter().map(|h| h.pid).collect();
        assert_eq!(pids, [Some(20), Some(30)]);
        assert!(raised[0].chain[1].root, "the answering process's own wait is the root");
    }

    #[test]
    fn a_thread_on_a_kernel_mutex_is_held_by_the_owner_threads_wait() {
        let waiter = kernel_wait(40, 41, WaitKind::Sync, "fsync", 0);
        let owner = kernel_wait(50, 51, WaitKind::Umount, "umount2 /x", 0);
        let mut world = World::default();
        world.mutexes.insert(41, MutexWait { owner_tid: 51, lock: "rtnl_mutex".into() });
        let out = scan(&mut incidents(), snapshot(12, vec![waiter, owner]), &mut world, &|_| true, &mut ids);
        let raised = raised(&out);
        assert_eq!(raised.len(), 1);
        assert_eq!(raised[0].chain.iter().map(|h| h.tid).collect::<Vec<_>>(), [Some(41), Some(51)]);
        assert_eq!(raised[0].chain[0].edge, Some(EdgeKind::KernelMutex));
        // Only threads' own waits open a second or more are asked about.
        world.asked.sort_unstable();
        assert_eq!(world.asked, [41, 51]);
    }

    #[test]
    fn a_parent_in_wait4_on_a_stopped_child_joins_the_graph_and_names_the_child() {
        let mut world = World::default();
        world.procs.states.insert(61, 'T');
        let f = ChildWaitFact {
            key: WaitKey::Kernel { tid: 60, start_ns: 0 },
            tgid: 60,
            tid: 60,
            g: None,
            target: WaitTarget::Pid(61),
            syscall: "wait4",
            start_ns: 0,
            start: StartTiming::Exact,
            stuck: None,
        };
        let mut s = snapshot(12, Vec::new());
        s.child_waits = vec![f];
        let out = scan(&mut incidents(), s, &mut world, &|_| true, &mut ids);
        assert_eq!(out.waits.len(), 1, "the wait4 is a wait of the graph");
        assert_eq!(out.waits[0].who.comm, "p60", "named by the lookups");
        let raised = raised(&out);
        assert_eq!(raised.len(), 1);
        let last = raised[0].chain.last().map(|h| (h.kind.as_str(), h.pid));
        assert_eq!(last, Some(("process", Some(61))), "{:?}", raised[0].chain);
    }

    /// A `stall` line's holder, cause and chain are the incident's hops from that wait
    /// down: decided once, by the same graph.
    #[test]
    fn a_waits_links_are_the_incidents_hops_from_it_down() {
        let request = OpenWait {
            key: WaitKey::Netlink { sock: 20 << 32 | 3, start_ns: 0 },
            ..kernel_wait(20, 21, WaitKind::NetlinkRequest, "usersock", 0)
        };
        let theirs = kernel_wait(30, 31, WaitKind::Umount, "umount2 /z", 1);
        let mut s = snapshot(15, vec![request.clone(), theirs.clone()]);
        s.answers = vec![(
            request.key,
            Answerer { pid: Some(30), kind: EdgeKind::NetlinkPeer, exactness: Exactness::Exact, evidence: "port id 9".into() },
        )];
        let device = Terminal { id: Some(HolderId::Device(7, 0)), kind: "device", pid: None, comm: None, what: "block device 7:0".into() };
        s.devices = vec![DeviceFact { wait: theirs.key, device, how: "the mount's device".into() }];
        let out = scan(&mut incidents(), s, &mut World::default(), &|_| true, &mut ids);
        let raised = raised(&out);
        assert_eq!(raised.len(), 1);
        let links = out.links(&[request.key, theirs.key, WaitKey::Kernel { tid: 99, start_ns: 0 }], 15 * S, &mut ids);
        assert_eq!(links[0].chain, raised[0].chain, "the requester's chain is the incident's");
        assert_eq!(links[0].holder.as_ref().map(|h| (h.kind.as_str(), h.pid)), Some(("umount", Some(30))));
        assert_eq!(links[0].chain[0].evidence.as_deref(), Some("port id 9"), "the link to the holder, on the waiter's hop");
        assert_eq!(links[0].cause.as_ref().map(|h| h.wait_id), Some(Some(31)), "the root wait");
        assert_eq!(links[1].chain, raised[0].chain[1..], "the holder's own chain is the rest");
        assert_eq!(links[1].holder.as_ref().map(|h| h.kind.as_str()), Some("device"));
        assert!(links[1].cause.is_none(), "the root has no cause of its own");
        assert_eq!(links[2], Default::default(), "a wait not in the graph has no links");
    }

    #[test]
    fn waits_the_filters_drop_raise_nothing() {
        let w = kernel_wait(70, 71, WaitKind::Umount, "umount2 /y", 0);
        let out = scan(&mut incidents(), snapshot(12, vec![w]), &mut World::default(), &|_| false, &mut ids);
        assert!(raised(&out).is_empty());
        assert_eq!(out.waits.len(), 1, "still in the graph");
    }
}
