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
    incidents::{Change, Clocks, Incidents},
    model::{OpenWait, WaitKey},
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
    let child_waits: Vec<ChildWaitFact> = child_waits.into_iter().filter(|f| children::matters(f, &facts, &waits, lookups)).collect();
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
    Scanned { changes, waits }
}
