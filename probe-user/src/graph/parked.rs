//! Threads no probe sees wait, found parked by `/proc` sampling (the
//! `parked` source), made into waits and edges:
//!
//! | edge | from → to | exactness |
//! |---|---|---|
//! | `unix_peer` | a thread blocked in a receive on a connected unix socket (stream, seqpacket or datagram) → the process holding the peer socket: its oldest thread-level open wait, else the process itself | exact: sock_diag's `UNIX_DIAG_PEER` names the peer inode, `/proc/PID/fd` its holder (inferred when several processes hold it) |
//! | `sibling` | a thread parked on a contended lock's futex → the oldest long open wait of another thread of the same process | heuristic: the futex's holder is not recorded; the lock is likely held by the thread that is stuck |
//! | `child` | containerd's open `RunPodSandbox`/`StopPodSandbox`/`RemovePodSandbox` → a child of containerd with an open wait (the CNI plugin it runs for the sandbox's network) | inferred: parent and child, and the child's wait began during the call |
//!
//! A futex wait only becomes a wait of the graph together with its `sibling`
//! edge: a thread parked on a futex with no long wait beside it is no stall
//! (Go runtimes park idle threads on futexes for ever), and is never a root.
//! A receive on a unix socket is a wait of its own (a client waiting on a
//! slow server is one), unless its thread already has an open wait that a
//! probe saw (a D-Bus call, a netlink request), which knows better.

use super::model::{Edge, EdgeKind, Exactness, HeldBy, OpenWait, StartTiming, WaitKey, Who};
use super::resolvers::{process_terminal, CallRole, GoFacts, Procs};
use crate::syscalls::WaitKind;

/// How long a sibling's wait must have lasted before the futex waiters beside it are
/// attached to it.
pub const SIBLING_MIN_NS: u64 = 1_000_000_000;

/// A thread the sampler found parked in a syscall.
#[derive(Clone, Debug, PartialEq)]
pub struct ParkedThread {
    pub pid: u32,
    pub tid: u32,
    /// The process's parent.
    pub ppid: u32,
    pub comm: String,
    /// CLOCK_MONOTONIC ns: when the thread last ran (a lower bound of its wait's start,
    /// exact for a thread that slept since it blocked).
    pub start_ns: u64,
    /// The syscall number, and its first argument (the fd, or the futex's address).
    pub nr: u32,
    pub arg0: u64,
    pub what: Parked,
}

/// What a sampled thread is parked in.
#[derive(Clone, Debug, PartialEq)]
pub enum Parked {
    /// `read`, `readv`, `recvfrom` or `recvmsg` on a unix socket.
    UnixRecv {
        syscall: &'static str,
        fd: u32,
        inode: u64,
        /// `stream`, `dgram`, `seqpacket`.
        sock_type: &'static str,
        /// The connected peer's inode (sock_diag `UNIX_DIAG_PEER`); none for an
        /// unconnected socket.
        peer_inode: Option<u64>,
        /// The processes holding the peer inode (`/proc/PID/fd`), this one left out.
        peer_pids: Vec<u32>,
        /// The connection's address (the server end's path), if bound.
        path: Option<String>,
    },
    /// `futex` waiting on a word that says "locked, with waiters".
    Futex { uaddr: u64, op: &'static str, val: u32 },
}

/// The key of a parked thread's wait.
pub fn key_of(p: &ParkedThread) -> WaitKey {
    WaitKey::Parked { tid: p.tid, start_ns: p.start_ns, nr: p.nr }
}

fn open_wait(p: &ParkedThread, kind: WaitKind, what: String) -> OpenWait {
    OpenWait {
        key: key_of(p),
        who: Who { pid: p.pid, tid: p.tid, comm: p.comm.clone(), goroutine: None },
        kind,
        what,
        start_ns: p.start_ns,
        start: StartTiming::LowerBound,
        pleg_path: false,
    }
}

/// A wait made by one thread in the kernel (not a Go call, which is a goroutine's, nor a
/// relist that is overdue, nor a futex sibling).
fn thread_level(w: &OpenWait) -> bool {
    match w.key {
        WaitKey::Kernel { .. } | WaitKey::Netlink { .. } | WaitKey::Dbus { .. } => true,
        WaitKey::Parked { .. } => w.kind != WaitKind::Futex,
        WaitKey::Go { .. } | WaitKey::RelistOverdue { .. } => false,
    }
}

/// The peer process's wait a client waits on: its oldest thread-level open wait, else
/// its oldest open wait.
fn peer_wait(waits: &[OpenWait], pid: u32) -> Option<&OpenWait> {
    let of = || waits.iter().filter(|w| w.who.pid == pid);
    of().filter(|w| thread_level(w)).min_by_key(|w| w.start_ns).or_else(|| of().min_by_key(|w| w.start_ns))
}

/// The waits and edges of the parked threads (see the module table). `waits` are the
/// other sources' open waits; the parked waits returned are to be added to them.
pub fn parked_graph(
    parked: &[ParkedThread],
    waits: &[OpenWait],
    facts: &GoFacts,
    now_ns: u64,
    procs: &mut dyn Procs,
) -> (Vec<OpenWait>, Vec<Edge>) {
    let mut out_waits: Vec<OpenWait> = Vec::new();
    let mut edges = Vec::new();
    // Receives on unix sockets first: a peer's own receive is a wait the next one may lead to.
    for p in parked {
        let Parked::UnixRecv { syscall, fd, inode, sock_type, path, .. } = &p.what else { continue };
        if waits.iter().any(|w| w.who.tid == p.tid) {
            continue;
        }
        let on = path.as_deref().map(|s| format!(" to {s}")).unwrap_or_default();
        let what = format!("{syscall} on unix {sock_type} socket fd {fd} (inode {inode}){on}");
        out_waits.push(open_wait(p, WaitKind::UnixRecv, what));
    }
    let all: Vec<OpenWait> = waits.iter().chain(out_waits.iter()).cloned().collect();
    for p in parked {
        let Parked::UnixRecv { fd, inode, sock_type, peer_inode: Some(peer), peer_pids, .. } = &p.what else { continue };
        if !out_waits.iter().any(|w| w.key == key_of(p)) {
            continue;
        }
        let Some(&pid) = peer_pids.first() else { continue };
        let exactness = if peer_pids.len() == 1 { Exactness::Exact } else { Exactness::Inferred };
        let name = procs.comm(pid).unwrap_or_default();
        let to = match peer_wait(&all, pid) {
            Some(w) => HeldBy::Wait(w.key),
            None => HeldBy::Terminal(process_terminal(procs, pid)),
        };
        let others = if peer_pids.len() > 1 {
            format!(" (and {} other process(es); the first is taken)", peer_pids.len() - 1)
        } else {
            String::new()
        };
        edges.push(Edge {
            from: key_of(p),
            to,
            kind: EdgeKind::UnixPeer,
            evidence: format!(
                "fd {fd} is unix {sock_type} socket inode {inode}; sock_diag UNIX_DIAG_PEER names inode {peer}, held by {name} pid {pid}{others} (/proc/PID/fd)"
            ),
            exactness,
        });
    }
    // Futex waiters beside a sibling's long wait.
    for p in parked {
        let Parked::Futex { uaddr, op, val } = &p.what else { continue };
        let sibling = all
            .iter()
            .filter(|w| w.who.pid == p.pid && w.who.tid != p.tid && thread_level(w))
            .filter(|w| now_ns.saturating_sub(w.start_ns) >= SIBLING_MIN_NS)
            .min_by_key(|w| w.start_ns);
        let Some(s) = sibling else { continue };
        let wait = open_wait(p, WaitKind::Futex, format!("futex {op} on {uaddr:#x} (word {val}: a contended lock)"));
        edges.push(Edge {
            from: wait.key,
            to: HeldBy::Wait(s.key),
            kind: EdgeKind::Sibling,
            evidence: format!(
                "parked on a contended lock's futex {uaddr:#x} while sibling thread {} has been in {} for {:.1}s; the lock's holder is not recorded",
                s.who.tid,
                s.what,
                now_ns.saturating_sub(s.start_ns) as f64 / 1e9
            ),
            exactness: Exactness::Heuristic,
        });
        out_waits.push(wait);
    }
    // containerd's sandbox calls → the CNI plugin it runs as a child.
    for c in facts.calls.iter().filter(|c| matches!(c.role, CallRole::CriHandler { .. }) && is_sandbox_network_call(c.function)) {
        let child = parked
            .iter()
            .filter(|p| p.ppid == c.tgid && p.start_ns >= c.start_ns)
            .filter_map(|p| peer_wait(&out_waits, p.pid).filter(|w| w.kind == WaitKind::UnixRecv).map(|w| (p, w)))
            .min_by_key(|(_, w)| w.start_ns);
        let Some((p, w)) = child else { continue };
        edges.push(Edge {
            from: c.key,
            to: HeldBy::Wait(w.key),
            kind: EdgeKind::Child,
            exactness: Exactness::Inferred,
            evidence: format!(
                "{} runs the pod's CNI plugins as children of pid {}; its child {} pid {} began waiting during the call",
                c.function, c.tgid, p.comm, p.pid
            ),
        });
    }
    (out_waits, edges)
}

/// The CRI calls that run CNI plugins (ADD in RunPodSandbox, DEL in Stop/RemovePodSandbox).
fn is_sandbox_network_call(function: &str) -> bool {
    ["RunPodSandbox", "StopPodSandbox", "RemovePodSandbox"].iter().any(|f| function.ends_with(f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{
        incidents::{Change, Clocks, Incidents},
        resolvers::GoCallFact,
    };
    use crate::levels::Thresholds;
    use std::collections::HashMap;
    use std::time::{Duration, SystemTime};

    const CTRD: u32 = 100;
    const PLUGIN: u32 = 200;
    const DAEMON: u32 = 300;
    const S: u64 = 1_000_000_000;

    #[derive(Default)]
    struct FakeProcs;
    impl Procs for FakeProcs {
        fn children(&mut self, _: u32) -> Vec<u32> {
            Vec::new()
        }
        fn state(&mut self, _: u32) -> Option<char> {
            Some('S')
        }
        fn comm(&mut self, pid: u32) -> Option<String> {
            Some(format!("p{pid}"))
        }
        fn connected(&mut self, _: u32, _: u32) -> bool {
            false
        }
    }

    fn recv(pid: u32, tid: u32, ppid: u32, start_s: u64, peer_pids: Vec<u32>, sock_type: &'static str) -> ParkedThread {
        ParkedThread {
            pid,
            tid,
            ppid,
            comm: format!("c{pid}"),
            start_ns: start_s * S,
            nr: 0,
            arg0: 3,
            what: Parked::UnixRecv {
                syscall: "read",
                fd: 3,
                inode: 545549,
                sock_type,
                peer_inode: Some(545544),
                peer_pids,
                path: Some("/run/daemon.sock".into()),
            },
        }
    }

    fn futex(pid: u32, tid: u32, start_s: u64) -> ParkedThread {
        ParkedThread {
            pid,
            tid,
            ppid: 1,
            comm: "daemon".into(),
            start_ns: start_s * S,
            nr: 202,
            arg0: 0x5573fde0e1a0,
            what: Parked::Futex { uaddr: 0x5573fde0e1a0, op: "FUTEX_WAIT_PRIVATE", val: 2 },
        }
    }

    fn netlink(pid: u32, tid: u32, start_s: u64) -> OpenWait {
        OpenWait {
            key: WaitKey::Netlink { sock: (u64::from(pid) << 32) | 8, start_ns: start_s * S },
            who: Who { pid, tid, comm: "daemon".into(), goroutine: None },
            kind: WaitKind::NetlinkRequest,
            what: "RTM_NEWLINK to route".into(),
            start_ns: start_s * S,
            start: StartTiming::Exact,
            pleg_path: false,
        }
    }

    fn run_pod_sandbox(start_s: u64) -> (GoCallFact, OpenWait) {
        let key = WaitKey::Go { tgid: CTRD, g: 0xc0, func: 7, start_ns: 1 };
        let fact = GoCallFact {
            key,
            tgid: CTRD,
            g: 0xc0,
            role: CallRole::CriHandler { list: false },
            receiver: 0,
            container: None,
            start_ns: start_s * S,
            function: "server.(*instrumentedService).RunPodSandbox",
            late: false,
        };
        let wait = OpenWait {
            key,
            who: Who { pid: CTRD, tid: 101, comm: "containerd".into(), goroutine: Some(0xc0) },
            kind: WaitKind::CriCall,
            what: "server.(*instrumentedService).RunPodSandbox".into(),
            start_ns: start_s * S,
            start: StartTiming::Exact,
            pleg_path: false,
        };
        (fact, wait)
    }

    fn edge_from(edges: &[Edge], from: WaitKey) -> &Edge {
        let e: Vec<&Edge> = edges.iter().filter(|e| e.from == from).collect();
        assert_eq!(e.len(), 1, "{edges:?}");
        e[0]
    }

    /// Seed incident 000 (Terway): RunPodSandbox → the CNI plugin (child) → the daemon
    /// (unix peer) → its thread in the netlink request, with the mutex waiters attached.
    #[test]
    fn the_terway_chain_is_one_incident_with_its_mutex_waiters() {
        let (rps, rps_wait) = run_pod_sandbox(10);
        let plugin = recv(PLUGIN, PLUGIN, CTRD, 11, vec![DAEMON], "stream");
        let nl = netlink(DAEMON, DAEMON, 12);
        let waiters = [futex(DAEMON, 301, 12), futex(DAEMON, 302, 12)];
        let mut parked = vec![plugin.clone()];
        parked.extend(waiters.iter().cloned());
        let facts = GoFacts { calls: vec![rps], parked: HashMap::new(), ..Default::default() };
        let waits = vec![rps_wait.clone(), nl.clone()];
        let (pw, mut edges) = parked_graph(&parked, &waits, &facts, 20 * S, &mut FakeProcs);
        assert_eq!(pw.iter().map(|w| w.kind).collect::<Vec<_>>(), [WaitKind::UnixRecv, WaitKind::Futex, WaitKind::Futex]);
        let e = edge_from(&edges, rps_wait.key);
        assert_eq!((e.kind, e.exactness, &e.to), (EdgeKind::Child, Exactness::Inferred, &HeldBy::Wait(key_of(&plugin))));
        let e = edge_from(&edges, key_of(&plugin));
        assert_eq!((e.kind, e.exactness, &e.to), (EdgeKind::UnixPeer, Exactness::Exact, &HeldBy::Wait(nl.key)));
        assert!(e.evidence.contains("inode 545544"), "{}", e.evidence);
        for w in &waiters {
            let e = edge_from(&edges, key_of(w));
            assert_eq!((e.kind, e.exactness, &e.to), (EdgeKind::Sibling, Exactness::Heuristic, &HeldBy::Wait(nl.key)));
        }
        // The netlink request's own edge (from the socket source): the kernel.
        edges.push(Edge {
            from: nl.key,
            to: HeldBy::Terminal(super::super::model::Terminal {
                id: None,
                kind: "kernel",
                pid: None,
                comm: None,
                what: "no reply".into(),
            }),
            kind: EdgeKind::NoReply,
            evidence: "test".into(),
            exactness: Exactness::Exact,
        });
        let mut all = waits.clone();
        all.extend(pw);
        let mut b = Incidents::new(Thresholds {
            warn: Duration::from_secs(2),
            critical: Duration::from_secs(60),
            imminent: Duration::from_secs(150),
        });
        let clocks = Clocks { now_ns: 20 * S, wall: SystemTime::now(), relist_start_ns: None };
        let mut n = 0;
        let changes = b.scan(&all, &edges, clocks, &|_| true, &mut |_| {
            n += 1;
            n
        });
        let raised: Vec<_> = changes.iter().filter_map(|c| if let Change::Raised(i) = c { Some(i) } else { None }).collect();
        assert_eq!(raised.len(), 1, "one incident: {raised:#?}");
        let i = raised[0];
        let kinds: Vec<&str> = i.chain.iter().map(|h| h.kind.as_str()).collect();
        assert_eq!(kinds, ["cri_call", "unix_recv", "netlink_request", "kernel"]);
        assert_eq!(i.root.as_ref().map(|r| r.pid), Some(Some(DAEMON)));
        assert_eq!(i.waits.len(), 5, "the two mutex waiters are in it");
    }

    #[test]
    fn futex_waiters_without_a_long_sibling_wait_are_not_waits() {
        // A Go runtime's idle threads, or a daemon at rest: nothing beside them waits long.
        let parked = vec![futex(DAEMON, 301, 1), futex(DAEMON, 302, 1)];
        let young = netlink(DAEMON, DAEMON, 19);
        let other_process = netlink(DAEMON + 1, DAEMON + 1, 1);
        let (pw, edges) = parked_graph(&parked, &[young, other_process], &GoFacts::default(), 19 * S + S / 2, &mut FakeProcs);
        assert!(pw.is_empty() && edges.is_empty(), "{pw:?} {edges:?}");
        // A Go call (a goroutine, not a thread) is no sibling wait either.
        let (_, mut go) = run_pod_sandbox(1);
        go.who.pid = DAEMON;
        let (pw, _) = parked_graph(&parked, &[go], &GoFacts::default(), 20 * S, &mut FakeProcs);
        assert!(pw.is_empty(), "{pw:?}");
    }

    #[test]
    fn a_datagram_peer_without_a_wait_is_the_end_of_the_chain() {
        let client = recv(PLUGIN, PLUGIN, 1, 5, vec![DAEMON], "dgram");
        let (pw, edges) = parked_graph(std::slice::from_ref(&client), &[], &GoFacts::default(), 10 * S, &mut FakeProcs);
        assert_eq!(pw.len(), 1);
        assert!(pw[0].what.contains("unix dgram socket"), "{}", pw[0].what);
        let e = edge_from(&edges, key_of(&client));
        match &e.to {
            HeldBy::Terminal(t) => assert_eq!(t.pid, Some(DAEMON)),
            other => panic!("{other:?}"),
        }
        // Several holders of the peer socket: the link is only inferred.
        let shared = recv(PLUGIN, PLUGIN, 1, 5, vec![DAEMON, DAEMON + 1], "stream");
        let (_, edges) = parked_graph(std::slice::from_ref(&shared), &[], &GoFacts::default(), 10 * S, &mut FakeProcs);
        assert_eq!(edge_from(&edges, key_of(&shared)).exactness, Exactness::Inferred);
    }

    #[test]
    fn a_thread_whose_wait_a_probe_saw_is_not_doubled() {
        // dbus-send blocked in its reply's receive is already a dbus_call wait.
        let client = recv(PLUGIN, PLUGIN, 1, 5, vec![DAEMON], "stream");
        let dbus = OpenWait { key: WaitKey::Dbus { sock: 1, tag: 2 }, kind: WaitKind::DbusCall, ..netlink(PLUGIN, PLUGIN, 5) };
        let (pw, edges) = parked_graph(&[client], &[dbus], &GoFacts::default(), 10 * S, &mut FakeProcs);
        assert!(pw.is_empty() && edges.is_empty());
    }

    #[test]
    fn only_sandbox_calls_lead_to_a_cni_child() {
        let (mut list, _) = run_pod_sandbox(10);
        list.function = "server.(*criService).ListContainers";
        let plugin = recv(PLUGIN, PLUGIN, CTRD, 11, vec![DAEMON], "stream");
        let facts = GoFacts { calls: vec![list.clone()], parked: HashMap::new(), ..Default::default() };
        let (_, edges) = parked_graph(std::slice::from_ref(&plugin), &[], &facts, 20 * S, &mut FakeProcs);
        assert!(edges.iter().all(|e| e.from != list.key), "{edges:?}");
        // A child that began waiting before the call is not its plugin.
        let (rps, _) = run_pod_sandbox(12);
        let facts = GoFacts { calls: vec![rps.clone()], parked: HashMap::new(), ..Default::default() };
        let (_, edges) = parked_graph(&[plugin], &[], &facts, 20 * S, &mut FakeProcs);
        assert!(edges.iter().all(|e| e.from != rps.key), "{edges:?}");
    }
}
