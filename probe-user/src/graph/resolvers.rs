//! Resolvers: the edges from each waiter to what holds it.
//!
//! Each resolver reads facts the sources hand over (the Go calls open now,
//! the lock each parked goroutine waits on, who answers a D-Bus or netlink
//! request) plus process lookups behind [`Procs`], and returns typed
//! [`Edge`]s, each with its evidence and how exact it is:
//!
//! | edge | from → to | exact when |
//! |---|---|---|
//! | `nested_call` | a Go call → the call it made, open on the same goroutine | always (same goroutine, entered later) |
//! | `go_lock` | a CRI handler (or a lock holder's call waiting its turn) whose goroutine is parked on a held lock's semaphore (a reader, or a writer) → the call holding that lock (containerd's Status store, CRI-O's `opLock`) | always (the semaphore's place in the lock is known by the function it parks in; the lock is the one the holder's receiver names) |
//! | `same_goroutine` | a Go call → the kernel wait its goroutine is in | always (g read from TLS at `sys_enter`) |
//! | `ttrpc` | containerd's call → the shim at the other end of the socket its goroutine's ttrpc request is outstanding on (`graph::ttrpc`); with no stream seen, the shim's task call for the same container C | exact by stream id; the container-id and socket-peer fallbacks are inferred |
//! | `shim_mutex` | a shim task call → the earlier task call for the same container in that shim | inferred (the shim's per-process mutex is not probed) |
//! | `child` | a shim task call → its stopped or blocked child (runc), or that child's open wait | exact when one child is stopped or blocked (or it has one child), inferred otherwise |
//! | `cri_call` | kubelet's open relist → containerd's open list handler | inferred (kubelet is connected to containerd, and the call began after the relist) |
//! | `nested_call` (runc) | runc's systemd call → its D-Bus call | inferred (same process, began later) |
//! | `dbus_owner`, `netlink_peer`, `no_reply`, `unix_peer` | a request → who must answer it (see `graph::requests`) | |
//! | `device` | a umount or sync → its writeback device (see `graph::devices`) | always |
//!
//! A Go call's edges start from its innermost open call only: the outer
//! ones reach the same holder through `nested_call`.

use super::model::{Edge, EdgeKind, Exactness, HeldBy, HolderId, OpenWait, Terminal, WaitKey};
use crate::syscalls::WaitKind;
use std::collections::HashMap;

/// What a probed Go function is, for the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallRole {
    Relist,
    /// Holds a Status lock for writing (`(*statusStorage).Update`/`UpdateSync`).
    StatusHolder,
    /// A CRI handler; `list` for ListContainers/ListPodSandbox (what a relist calls).
    CriHandler {
        list: bool,
    },
    ShimTask,
    RuncSystemd,
}

/// An open Go call, as the resolvers need it.
#[derive(Clone, Debug, PartialEq)]
pub struct GoCallFact {
    pub key: WaitKey,
    pub tgid: u32,
    pub g: u64,
    pub role: CallRole,
    /// The receiver: for a Status holder, the lock's address.
    pub receiver: u64,
    /// The container id captured from its request, if any.
    pub container: Option<String>,
    pub start_ns: u64,
    /// The function's short name, for evidence.
    pub function: &'static str,
    /// Found open by the goroutine scan: its start is not when it began, so the
    /// order of starts between it and other calls proves nothing.
    pub late: bool,
}

/// The Go side of the graph at one scan.
#[derive(Clone, Debug, Default)]
pub struct GoFacts {
    pub calls: Vec<GoCallFact>,
    /// Goroutines parked on a held lock (a reader, or a writer waiting its turn):
    /// (tgid, g) → lock address.
    pub parked: HashMap<(u32, u64), u64>,
    /// Outstanding ttrpc requests, for the exact containerd → shim edge.
    pub ttrpc: super::ttrpc::TtrpcFacts,
}

/// Process lookups (`/proc`, sock_diag) the resolvers need.
pub trait Procs {
    fn children(&mut self, pid: u32) -> Vec<u32>;
    fn state(&mut self, pid: u32) -> Option<char>;
    /// When process `pid` was first seen stopped (`T`, `t`) or in `D` without a break,
    /// if it is now: a real lookup remembers it across scans. By default (the tests'
    /// fakes), since ever.
    fn stuck_since(&mut self, pid: u32, _now_ns: u64) -> Option<u64> {
        matches!(self.state(pid), Some('T' | 't' | 'D')).then_some(0)
    }
    fn comm(&mut self, pid: u32) -> Option<String>;
    /// Whether a unix socket of `client` has its peer in `server`.
    fn connected(&mut self, client: u32, server: u32) -> bool;
}

fn edge(from: WaitKey, to: HeldBy, kind: EdgeKind, exactness: Exactness, evidence: impl Into<String>) -> Edge {
    Edge { from, to, kind, evidence: evidence.into(), exactness }
}

/// The process's oldest open wait, if it has one.
pub fn oldest_wait_of(waits: &[OpenWait], pid: u32) -> Option<&OpenWait> {
    waits.iter().filter(|w| w.who.pid == pid).min_by_key(|w| w.start_ns)
}

/// A process as a chain's end, in words.
pub fn process_terminal(procs: &mut dyn Procs, pid: u32) -> Terminal {
    let state = procs.state(pid);
    let what = match state {
        Some('T') | Some('t') => "stopped (state T)".to_string(),
        Some('D') => "blocked in the kernel (state D)".to_string(),
        Some('Z') => "a zombie (state Z)".to_string(),
        Some(s) => format!("not answering (state {s})"),
        None => "gone".to_string(),
    };
    Terminal { id: Some(HolderId::Process(pid)), kind: "process", pid: Some(pid), comm: procs.comm(pid), what }
}

/// What holds process `pid` as a whole: its oldest open wait, else the process itself.
pub fn held_by_process(waits: &[OpenWait], procs: &mut dyn Procs, pid: u32) -> HeldBy {
    match oldest_wait_of(waits, pid) {
        Some(w) => HeldBy::Wait(w.key),
        None => HeldBy::Terminal(process_terminal(procs, pid)),
    }
}

/// A kernel mutex a thread waits on (`lock:contention_begin`): its owner thread, and the
/// lock's name for the evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MutexWait {
    pub owner_tid: u32,
    pub lock: String,
}

/// A waiter that is a thread: its thread's kernel facts are its own. A Go call's `tid` is
/// only the thread it entered on, and its goroutine may have moved since (a blocking
/// syscall hands the thread's other goroutines to a new one): a Go call reaches a kernel
/// mutex through its goroutine's own kernel wait (the `same_goroutine` edge), never
/// through that thread.
fn is_thread_wait(key: &WaitKey) -> bool {
    !matches!(key, WaitKey::Go { .. } | WaitKey::RelistOverdue { .. })
}

/// Whether `w` is a wait [`kernel_mutex_edges`] looks up a kernel mutex for: a thread's
/// own wait, open a second or more.
pub fn mutex_may_hold(w: &OpenWait, now_ns: u64) -> bool {
    is_thread_wait(&w.key) && now_ns.saturating_sub(w.start_ns) >= 1_000_000_000
}

/// Waits (open a second or more) whose thread is blocked on a kernel mutex → the wait of
/// its owner thread, else the owner's process. Exact: the mutex's owner field names the
/// owner (read when the wait began).
pub fn kernel_mutex_edges(
    waits: &[OpenWait],
    now_ns: u64,
    mutex_of: &mut dyn FnMut(u32) -> Option<MutexWait>,
    procs: &mut dyn Procs,
) -> Vec<Edge> {
    let mut out = Vec::new();
    for w in waits.iter().filter(|w| mutex_may_hold(w, now_ns)) {
        let Some(m) = mutex_of(w.who.tid) else { continue };
        let to = match waits.iter().find(|o| o.who.tid == m.owner_tid && is_thread_wait(&o.key)) {
            Some(o) => HeldBy::Wait(o.key),
            None => HeldBy::Terminal(process_terminal(procs, m.owner_tid)),
        };
        out.push(edge(
            w.key,
            to,
            EdgeKind::KernelMutex,
            Exactness::Exact,
            format!("waits on {} (lock:contention_begin); its owner field names thread {}", m.lock, m.owner_tid),
        ));
    }
    out
}

/// Every Go edge (see the module table).
pub fn go_edges(facts: &GoFacts, waits: &[OpenWait], procs: &mut dyn Procs) -> Vec<Edge> {
    let mut out = Vec::new();
    // Innermost call per goroutine; outer calls point at the next one in.
    let mut by_g: HashMap<(u32, u64), Vec<&GoCallFact>> = HashMap::new();
    for c in &facts.calls {
        by_g.entry((c.tgid, c.g)).or_default().push(c);
    }
    let mut innermost = Vec::new();
    for calls in by_g.values_mut() {
        calls.sort_by_key(|c| c.start_ns);
        for pair in calls.windows(2) {
            out.push(edge(
                pair[0].key,
                HeldBy::Wait(pair[1].key),
                EdgeKind::NestedCall,
                Exactness::Exact,
                format!("{} called {} on the same goroutine", pair[0].function, pair[1].function),
            ));
        }
        if let Some(last) = calls.last() {
            innermost.push((*last, calls.iter().find_map(|c| c.container.clone())));
        }
    }
    // Kernel waits by goroutine.
    let kernel_by_g: HashMap<(u32, u64), &OpenWait> =
        waits.iter().filter(|w| matches!(w.key, WaitKey::Kernel { .. })).filter_map(|w| Some(((w.who.pid, w.who.goroutine?), w))).collect();
    for (c, container) in innermost {
        if let Some(k) = kernel_by_g.get(&(c.tgid, c.g)) {
            // A wait the kernel saw begin carries the g it read from TLS; one found by the
            // startup sweep, the g the goroutine scan matched to its thread.
            let how = if k.start.is_exact() {
                "g read from TLS at sys_enter"
            } else {
                "g found by the goroutine scan: the thread's stack pointer lies in its stack"
            };
            out.push(edge(
                c.key,
                HeldBy::Wait(k.key),
                EdgeKind::SameGoroutine,
                Exactness::Exact,
                format!("{}'s goroutine is in {} ({how})", c.function, k.what),
            ));
            continue;
        }
        match c.role {
            CallRole::CriHandler { .. } | CallRole::StatusHolder => {
                if let Some(e) = lock_edge(c, facts) {
                    out.push(e);
                    continue;
                }
                out.extend(to_shim(c, container.as_deref(), facts, waits, procs));
            }
            CallRole::ShimTask => out.extend(shim_inner_edge(c, facts, waits, procs, &kernel_by_g)),
            CallRole::RuncSystemd => {
                let dbus = waits
                    .iter()
                    .filter(|w| w.kind == WaitKind::DbusCall && w.who.pid == c.tgid && w.start_ns >= c.start_ns)
                    .min_by_key(|w| w.start_ns);
                if let Some(d) = dbus {
                    out.push(edge(
                        c.key,
                        HeldBy::Wait(d.key),
                        EdgeKind::NestedCall,
                        Exactness::Inferred,
                        format!("{} is runc's systemd call; this D-Bus call began in it", c.function),
                    ));
                }
            }
            CallRole::Relist => {}
        }
    }
    out
}

/// containerd's call → the shim it waits on: by the ttrpc stream its
/// goroutine has outstanding (exact, see [`super::ttrpc`]), else by container.
/// A call whose goroutine is parked on a lock (a reader, or a writer waiting its turn)
/// → the call holding that lock: the oldest holder call on it whose own goroutine is
/// not parked on it (a second update parks as a writer on the lock its call names).
fn lock_edge(c: &GoCallFact, facts: &GoFacts) -> Option<Edge> {
    let lock = *facts.parked.get(&(c.tgid, c.g))?;
    let h = facts
        .calls
        .iter()
        .filter(|h| h.role == CallRole::StatusHolder && h.tgid == c.tgid && h.receiver == lock && h.g != c.g)
        .filter(|h| facts.parked.get(&(h.tgid, h.g)) != Some(&lock))
        .min_by_key(|h| h.start_ns)?;
    Some(edge(c.key, HeldBy::Wait(h.key), EdgeKind::GoLock, Exactness::Exact, format!("parked on lock {lock:#x}; {} holds it", h.function)))
}

fn to_shim(c: &GoCallFact, container: Option<&str>, facts: &GoFacts, waits: &[OpenWait], procs: &mut dyn Procs) -> Option<Edge> {
    super::ttrpc::stream_edge(c, container, facts, waits, procs).or_else(|| shim_edge(c, container, facts, procs))
}

/// The fallback with no ttrpc stream seen: the shim's task call for the
/// same container, inferred (the container ids match, but nothing ties this
/// call to that shim's call): the first one for
/// the same container that began after it; for a retry (handleContainerExit
/// calls Delete again after its 10 s timeout) whose shim call began before
/// it, the latest one for that container, inferred.
fn shim_edge(c: &GoCallFact, container: Option<&str>, facts: &GoFacts, procs: &mut dyn Procs) -> Option<Edge> {
    let shim_calls = || facts.calls.iter().filter(|s| s.role == CallRole::ShimTask);
    if let Some(id) = container {
        let same = || shim_calls().filter(|s| s.container.as_deref() == Some(id));
        if let Some(s) = same().filter(|s| s.start_ns >= c.start_ns).min_by_key(|s| s.start_ns) {
            let evidence = format!("no ttrpc stream seen; the shim's {} is for the same container {}", s.function, short_id(id));
            return Some(edge(c.key, HeldBy::Wait(s.key), EdgeKind::Ttrpc, Exactness::Inferred, evidence));
        }
        let s = same().max_by_key(|s| s.start_ns)?;
        let evidence = format!("the shim's {} for the same container {} began before this call (a retry)", s.function, short_id(id));
        return Some(edge(c.key, HeldBy::Wait(s.key), EdgeKind::Ttrpc, Exactness::Inferred, evidence));
    }
    let mut best: Option<&GoCallFact> = None;
    for s in shim_calls().filter(|s| s.start_ns >= c.start_ns || s.late || c.late) {
        if best.is_some_and(|b| b.start_ns <= s.start_ns) || !procs.connected(c.tgid, s.tgid) {
            continue;
        }
        best = Some(s);
    }
    let s = best?;
    let evidence = if s.late || c.late {
        format!(
            "no container id, no request seen (open before plegwatch started); a task call ({}) open in a shim containerd is connected to",
            s.function
        )
    } else {
        format!("no container id; the first task call ({}) in a shim containerd is connected to since", s.function)
    };
    Some(edge(c.key, HeldBy::Wait(s.key), EdgeKind::Ttrpc, Exactness::Inferred, evidence))
}

/// A shim task call with no kernel wait of its own: an earlier call for the
/// same container (the shim's mutex), else a child it waits for.
fn shim_inner_edge(
    c: &GoCallFact,
    facts: &GoFacts,
    waits: &[OpenWait],
    procs: &mut dyn Procs,
    kernel_by_g: &HashMap<(u32, u64), &OpenWait>,
) -> Option<Edge> {
    let earlier = facts
        .calls
        .iter()
        .filter(|s| s.role == CallRole::ShimTask && s.tgid == c.tgid && s.key != c.key && s.start_ns < c.start_ns)
        .filter(|s| c.container.is_none() || s.container == c.container)
        .min_by_key(|s| s.start_ns);
    if let Some(e) = earlier {
        return Some(edge(
            c.key,
            HeldBy::Wait(e.key),
            EdgeKind::ShimMutex,
            Exactness::Inferred,
            format!("the shim runs one task call per container at a time; {} began first", e.function),
        ));
    }
    // Found open by the goroutine scan, the starts say nothing: the call whose goroutine
    // is in a kernel wait is the one doing the work, and holds the mutex.
    if c.late {
        let working = facts
            .calls
            .iter()
            .filter(|s| s.role == CallRole::ShimTask && s.tgid == c.tgid && s.key != c.key)
            .find(|s| kernel_by_g.contains_key(&(s.tgid, s.g)));
        if let Some(e) = working {
            return Some(edge(
                c.key,
                HeldBy::Wait(e.key),
                EdgeKind::ShimMutex,
                Exactness::Inferred,
                format!("found open by the goroutine scan; the shim runs one task call per container at a time, and {} is the one in a kernel wait", e.function),
            ));
        }
    }
    let kids = procs.children(c.tgid);
    let stuck: Vec<u32> = kids.iter().copied().filter(|k| matches!(procs.state(*k), Some('T' | 't' | 'D'))).collect();
    let with_wait = kids.iter().copied().find(|k| oldest_wait_of(waits, *k).is_some());
    let child = stuck.first().copied().or(with_wait)?;
    // The one child that is stopped or blocked (a shim's other child is the container's
    // init, running), or its only child: exact; a pick among several: inferred.
    let exactness = if stuck.len() == 1 || kids.len() == 1 { Exactness::Exact } else { Exactness::Inferred };
    let name = procs.comm(child).unwrap_or_default();
    Some(edge(
        c.key,
        held_by_process(waits, procs, child),
        EdgeKind::Child,
        exactness,
        format!("{} waits for its child {name} pid {child}", c.function),
    ))
}

/// kubelet's open relist → the CRI list call it waits on in containerd.
///
/// A relist found open by the goroutine scan takes a list call found open the same way
/// before one a uprobe saw begin: its call was open before plegwatch attached. Another
/// client's call that began since (plegwatch's own `--runtime-endpoint` lookup parks on
/// the same Status lock) is not it, though its start, exact, may read earlier than the
/// one counted from when containerd's goroutines were read.
pub fn relist_edges(facts: &GoFacts, procs: &mut dyn Procs) -> Vec<Edge> {
    let mut out = Vec::new();
    for r in facts.calls.iter().filter(|c| c.role == CallRole::Relist) {
        let call = facts
            .calls
            .iter()
            .filter(|c| c.role == CallRole::CriHandler { list: true } && (c.start_ns >= r.start_ns || c.late || r.late) && c.tgid != r.tgid)
            .filter(|c| procs.connected(r.tgid, c.tgid))
            .min_by_key(|c| (r.late && !c.late, c.start_ns));
        if let Some(c) = call {
            let evidence = if c.late || r.late {
                format!(
                    "pid {} is connected to pid {}'s socket and {} is open (both found open by the goroutine scan)",
                    r.tgid, c.tgid, c.function
                )
            } else {
                format!("pid {} is connected to pid {}'s socket and {} began during the relist", r.tgid, c.tgid, c.function)
            };
            out.push(edge(r.key, HeldBy::Wait(c.key), EdgeKind::CriCall, Exactness::Inferred, evidence));
        }
    }
    out
}

fn short_id(id: &str) -> &str {
    id.get(..12).unwrap_or(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::model::{StartTiming, Who};

    use crate::graph::fakes::{go_call as call, FakeProcs};

    const CTRD: u32 = 100;
    const SHIM: u32 = 200;
    const KUBELET: u32 = 300;

    fn kernel(pid: u32, tid: u32, g: Option<u64>, kind: WaitKind, start_ns: u64) -> OpenWait {
        OpenWait {
            key: WaitKey::Kernel { tid, start_ns },
            who: Who { pid, tid, comm: "shim".into(), goroutine: g },
            kind,
            what: "umount2 /rootfs (task_work)".into(),
            start_ns,
            start: StartTiming::Exact,
            pleg_path: false,
        }
    }

    fn find(edges: &[Edge], from: WaitKey) -> Vec<&Edge> {
        edges.iter().filter(|e| e.from == from).collect()
    }

    /// A Go call's entry thread now runs another goroutine, blocked on rtnl_mutex: the
    /// call is not blamed on that mutex; the thread's own kernel wait is.
    #[test]
    fn a_go_call_is_not_blamed_on_its_entry_threads_mutex() {
        const TID: u32 = 101;
        let relist = call(KUBELET, 0x1, 7, CallRole::Relist, 10, None);
        let go = OpenWait {
            key: relist.key,
            who: Who { pid: KUBELET, tid: TID, comm: "kubelet".into(), goroutine: Some(0x1) },
            kind: WaitKind::PlegRelist,
            what: "Relist".into(),
            start_ns: 10,
            start: StartTiming::Exact,
            pleg_path: false,
        };
        let other = kernel(KUBELET, TID, Some(0x2), WaitKind::Sync, 20);
        let owner = kernel(CTRD, 555, None, WaitKind::Sync, 5);
        let waits = [go.clone(), other.clone(), owner.clone()];
        let mut mutex_of = |tid: u32| (tid == TID).then(|| MutexWait { owner_tid: 555, lock: "rtnl_mutex".into() });
        let edges = kernel_mutex_edges(&waits, 5_000_000_000, &mut mutex_of, &mut FakeProcs::default());
        assert!(find(&edges, go.key).is_empty(), "{edges:?}");
        let from_thread = find(&edges, other.key);
        assert_eq!(from_thread.len(), 1, "{edges:?}");
        assert_eq!(from_thread[0].to, HeldBy::Wait(owner.key));
        assert_eq!(from_thread[0].kind, EdgeKind::KernelMutex);
    }

    /// containerd#9770: relist → ListContainers (parked) → UpdateSync holder
    /// → shim Update → shim Delete → umount.
    #[test]
    fn the_9770_chain_is_linked_hop_by_hop() {
        let relist = call(KUBELET, 0x1, 1, CallRole::Relist, 10, None);
        let list = call(CTRD, 0x2, 2, CallRole::CriHandler { list: true }, 20, None);
        let ucr = call(CTRD, 0x3, 3, CallRole::CriHandler { list: false }, 5, Some("abc123abc123abc123"));
        let sync = call(CTRD, 0x3, 4, CallRole::StatusHolder, 6, None);
        let shim_update = call(SHIM, 0x5, 5, CallRole::ShimTask, 7, Some("abc123abc123abc123"));
        let shim_delete = call(SHIM, 0x6, 6, CallRole::ShimTask, 1, Some("abc123abc123abc123"));
        let other = call(SHIM, 0x7, 5, CallRole::ShimTask, 8, Some("someone-else"));
        let umount = kernel(SHIM, 201, Some(0x6), WaitKind::Umount, 2);
        let facts = GoFacts {
            calls: vec![relist.clone(), list.clone(), ucr.clone(), sync.clone(), shim_update.clone(), shim_delete.clone(), other],
            parked: HashMap::from([((CTRD, 0x2), 0xc000)]),
            ..Default::default()
        };
        let mut procs = FakeProcs { connected: vec![(KUBELET, CTRD)], ..Default::default() };
        let waits = vec![umount.clone()];
        let mut edges = go_edges(&facts, &waits, &mut procs);
        edges.extend(relist_edges(&facts, &mut procs));
        let to = |from: &GoCallFact| -> Vec<(HeldBy, EdgeKind, Exactness)> {
            find(&edges, from.key).into_iter().map(|e| (e.to.clone(), e.kind, e.exactness)).collect()
        };
        assert_eq!(to(&relist), vec![(HeldBy::Wait(list.key), EdgeKind::CriCall, Exactness::Inferred)]);
        assert_eq!(to(&list), vec![(HeldBy::Wait(sync.key), EdgeKind::GoLock, Exactness::Exact)]);
        assert_eq!(to(&ucr), vec![(HeldBy::Wait(sync.key), EdgeKind::NestedCall, Exactness::Exact)]);
        assert_eq!(
            to(&sync),
            vec![(HeldBy::Wait(shim_update.key), EdgeKind::Ttrpc, Exactness::Inferred)],
            "by container id, from the handler on the same goroutine: no stream seen"
        );
        assert_eq!(to(&shim_update), vec![(HeldBy::Wait(shim_delete.key), EdgeKind::ShimMutex, Exactness::Inferred)]);
        assert_eq!(to(&shim_delete), vec![(HeldBy::Wait(umount.key), EdgeKind::SameGoroutine, Exactness::Exact)]);
    }

    /// CRI-O: an update holds a container's `opLock` while its `runc update` hangs; a
    /// second update parks as a writer on the same lock, and `ListContainerStats` as a
    /// writer too. Each is linked to the first update, never to itself.
    #[test]
    fn writers_waiting_their_turn_are_held_by_the_holder() {
        const CRIO: u32 = 300;
        let first = call(CRIO, 0x10, 4, CallRole::StatusHolder, 5, None);
        let second = call(CRIO, 0x20, 4, CallRole::StatusHolder, 6, None);
        let stats = call(CRIO, 0x30, 7, CallRole::CriHandler { list: false }, 7, None);
        let facts = GoFacts {
            calls: vec![first.clone(), second.clone(), stats.clone()],
            parked: HashMap::from([((CRIO, 0x20), 0xc000), ((CRIO, 0x30), 0xc000)]),
            ..Default::default()
        };
        let edges = go_edges(&facts, &[], &mut FakeProcs::default());
        for waiter in [&second, &stats] {
            let e = find(&edges, waiter.key);
            assert_eq!(e.len(), 1, "{edges:?}");
            assert_eq!((e[0].kind, &e[0].to, e[0].exactness), (EdgeKind::GoLock, &HeldBy::Wait(first.key), Exactness::Exact));
        }
        assert!(find(&edges, first.key).iter().all(|e| e.kind != EdgeKind::GoLock), "the holder waits on no lock: {edges:?}");
    }

    #[test]
    fn the_holders_own_syscall_comes_first() {
        let ucr = call(CTRD, 0x3, 3, CallRole::CriHandler { list: false }, 5, Some("abc"));
        let sync = call(CTRD, 0x3, 4, CallRole::StatusHolder, 6, None);
        let shim_update = call(SHIM, 0x5, 5, CallRole::ShimTask, 7, Some("abc"));
        let fsync = kernel(CTRD, 101, Some(0x3), WaitKind::Sync, 8);
        let facts = GoFacts { calls: vec![ucr, sync.clone(), shim_update], parked: HashMap::new(), ..Default::default() };
        let edges = go_edges(&facts, std::slice::from_ref(&fsync), &mut FakeProcs::default());
        let e = find(&edges, sync.key);
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].kind, &e[0].to), (EdgeKind::SameGoroutine, &HeldBy::Wait(fsync.key)));
    }

    #[test]
    fn another_goroutines_wait_is_not_joined() {
        let sync = call(CTRD, 0x3, 4, CallRole::StatusHolder, 6, None);
        let fsync = kernel(CTRD, 101, Some(0x99), WaitKind::Sync, 8);
        let facts = GoFacts { calls: vec![sync.clone()], parked: HashMap::new(), ..Default::default() };
        let edges = go_edges(&facts, &[fsync], &mut FakeProcs::default());
        assert!(find(&edges, sync.key).is_empty(), "{edges:?}");
    }

    #[test]
    fn a_stopped_runc_ends_the_chain_or_leads_to_its_own_wait() {
        let update = call(SHIM, 0x5, 5, CallRole::ShimTask, 7, Some("abc"));
        let facts = GoFacts { calls: vec![update.clone()], parked: HashMap::new(), ..Default::default() };
        let mut procs =
            FakeProcs { children: HashMap::from([(SHIM, vec![400])]), states: HashMap::from([(400, 'T')]), ..Default::default() };
        let edges = go_edges(&facts, &[], &mut procs);
        let e = find(&edges, update.key);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].kind, EdgeKind::Child);
        assert_eq!(e[0].exactness, Exactness::Exact);
        match &e[0].to {
            HeldBy::Terminal(t) => assert_eq!((t.pid, t.what.as_str()), (Some(400), "stopped (state T)")),
            other => panic!("{other:?}"),
        }
        // A runc with an open D-Bus call: the chain goes on into it.
        let startunit = call(400, 0x9, 9, CallRole::RuncSystemd, 8, None);
        let dbus =
            OpenWait { kind: WaitKind::DbusCall, key: WaitKey::Dbus { sock: 1, tag: 2 }, ..kernel(400, 401, None, WaitKind::DbusCall, 9) };
        let facts = GoFacts { calls: vec![update.clone(), startunit.clone()], parked: HashMap::new(), ..Default::default() };
        procs.states.insert(400, 'S');
        let waits = vec![dbus.clone()];
        let edges = go_edges(&facts, &waits, &mut procs);
        let e = find(&edges, update.key);
        assert_eq!(e[0].to, HeldBy::Wait(dbus.key), "runc's oldest open wait");
        let e = find(&edges, startunit.key);
        assert_eq!((e[0].kind, &e[0].to), (EdgeKind::NestedCall, &HeldBy::Wait(dbus.key)));
    }

    /// Seed incident 002: a container start whose `runc create` waits on systemd over D-Bus.
    /// StartContainer → the shim's Create for the same container → its runc child (beside the
    /// pod's running pause process) → runc's startUnit → its D-Bus call. The call's owner edge
    /// (to the frozen systemd) comes from the socket source.
    #[test]
    fn a_container_start_leads_to_runcs_systemd_call() {
        const RUNC: u32 = 400;
        const PAUSE: u32 = 401;
        let id = "c0ffee00c0ffee00c0ffee00";
        let start = call(CTRD, 0x3, 3, CallRole::CriHandler { list: false }, 5, Some(id));
        let create = call(SHIM, 0x5, 5, CallRole::ShimTask, 6, Some(id));
        let pause_start = call(SHIM, 0x6, 6, CallRole::ShimTask, 1, Some("the-pods-sandbox"));
        let startunit = call(RUNC, 0x9, 9, CallRole::RuncSystemd, 7, None);
        let dbus = OpenWait { key: WaitKey::Dbus { sock: 1, tag: 2 }, ..kernel(RUNC, 402, None, WaitKind::DbusCall, 8) };
        let mut procs = FakeProcs {
            children: HashMap::from([(SHIM, vec![PAUSE, RUNC])]),
            states: HashMap::from([(PAUSE, 'S'), (RUNC, 'S')]),
            ..Default::default()
        };
        let facts = GoFacts {
            calls: vec![start.clone(), create.clone(), pause_start, startunit.clone()],
            parked: HashMap::new(),
            ..Default::default()
        };
        // The graph's waits hold the Go calls too (runc's startUnit began first).
        let startunit_wait =
            OpenWait { key: startunit.key, what: "systemd.startUnit".into(), ..kernel(RUNC, 403, Some(0x9), WaitKind::GoCall, 7) };
        let waits = vec![dbus.clone(), startunit_wait];
        let edges = go_edges(&facts, &waits, &mut procs);
        let one = |from: &GoCallFact| {
            let e = find(&edges, from.key);
            assert_eq!(e.len(), 1, "{edges:?}");
            (e[0].to.clone(), e[0].kind, e[0].exactness)
        };
        assert_eq!(one(&start), (HeldBy::Wait(create.key), EdgeKind::Ttrpc, Exactness::Inferred), "by container id");
        // Another container's task call in the same shim is no mutex for this one; the child
        // with an open wait is runc, picked among two running children: inferred.
        assert_eq!(one(&create), (HeldBy::Wait(startunit.key), EdgeKind::Child, Exactness::Inferred), "runc's oldest open wait");
        assert_eq!(one(&startunit), (HeldBy::Wait(dbus.key), EdgeKind::NestedCall, Exactness::Inferred));
        // runc's startUnit missed (runc probed only after it began): the child edge goes
        // straight to the D-Bus call.
        let facts = GoFacts { calls: vec![start, create.clone()], parked: HashMap::new(), ..Default::default() };
        let edges = go_edges(&facts, std::slice::from_ref(&dbus), &mut procs);
        let e = find(&edges, create.key);
        assert_eq!((e[0].to.clone(), e[0].kind), (HeldBy::Wait(dbus.key), EdgeKind::Child));
    }

    #[test]
    fn a_retry_links_to_the_shim_call_already_running() {
        let exit = call(CTRD, 0x3, 3, CallRole::CriHandler { list: false }, 50, Some("abc"));
        let delete = call(SHIM, 0x6, 6, CallRole::ShimTask, 10, Some("abc"));
        let facts = GoFacts { calls: vec![exit.clone(), delete.clone()], parked: HashMap::new(), ..Default::default() };
        let edges = go_edges(&facts, &[], &mut FakeProcs::default());
        let e = find(&edges, exit.key);
        assert_eq!((e[0].to.clone(), e[0].exactness), (HeldBy::Wait(delete.key), Exactness::Inferred));
    }

    #[test]
    fn without_a_container_id_only_connected_shims_count() {
        let sync = call(CTRD, 0x3, 4, CallRole::StatusHolder, 6, None);
        let far = call(SHIM + 1, 0x5, 5, CallRole::ShimTask, 7, None);
        let near = call(SHIM, 0x6, 5, CallRole::ShimTask, 8, None);
        let facts = GoFacts { calls: vec![sync.clone(), far, near.clone()], parked: HashMap::new(), ..Default::default() };
        let mut procs = FakeProcs { connected: vec![(CTRD, SHIM)], ..Default::default() };
        let edges = go_edges(&facts, &[], &mut procs);
        let e = find(&edges, sync.key);
        assert_eq!((e[0].to.clone(), e[0].exactness), (HeldBy::Wait(near.key), Exactness::Inferred));
    }

    #[test]
    fn a_relist_links_only_to_a_runtime_it_is_connected_to() {
        let relist = call(KUBELET, 0x1, 1, CallRole::Relist, 10, None);
        let before = call(CTRD, 0x2, 2, CallRole::CriHandler { list: true }, 5, None);
        let facts = GoFacts { calls: vec![relist.clone(), before], parked: HashMap::new(), ..Default::default() };
        let mut procs = FakeProcs { connected: vec![(KUBELET, CTRD)], ..Default::default() };
        assert!(relist_edges(&facts, &mut procs).is_empty(), "a call that began before the relist is not its call");
        let during = call(CTRD, 0x4, 2, CallRole::CriHandler { list: true }, 12, None);
        let facts = GoFacts { calls: vec![relist, during.clone()], parked: HashMap::new(), ..Default::default() };
        assert_eq!(relist_edges(&facts, &mut procs)[0].to, HeldBy::Wait(during.key));
        assert!(relist_edges(&facts, &mut FakeProcs::default()).is_empty(), "not connected: no link");
    }

    /// Started mid-stall: the relist and its ListContainers were both open before attach and
    /// found by the goroutine scan, containerd's read after plegwatch's own lookup parked
    /// a second ListContainers on the lock (seen by its uprobe, with an earlier start).
    #[test]
    fn a_relist_found_open_takes_the_list_call_found_open() {
        let mut relist = call(KUBELET, 0x1, 1, CallRole::Relist, 100, None);
        relist.late = true;
        let ours = call(CTRD, 0x2, 2, CallRole::CriHandler { list: true }, 400, None);
        let mut theirs = call(CTRD, 0x4, 2, CallRole::CriHandler { list: true }, 500, None);
        theirs.late = true;
        let facts = GoFacts { calls: vec![relist.clone(), ours.clone(), theirs.clone()], parked: HashMap::new(), ..Default::default() };
        let mut procs = FakeProcs { connected: vec![(KUBELET, CTRD)], ..Default::default() };
        assert_eq!(relist_edges(&facts, &mut procs)[0].to, HeldBy::Wait(theirs.key));
        // With no call found open, one seen since is still taken.
        let facts = GoFacts { calls: vec![relist.clone(), ours.clone()], parked: HashMap::new(), ..Default::default() };
        assert_eq!(relist_edges(&facts, &mut procs)[0].to, HeldBy::Wait(ours.key));
        // A relist seen to begin is unchanged: the first list call since.
        relist.late = false;
        let facts = GoFacts { calls: vec![relist, ours.clone(), theirs], parked: HashMap::new(), ..Default::default() };
        assert_eq!(relist_edges(&facts, &mut procs)[0].to, HeldBy::Wait(ours.key));
    }
}
