//! The exact `ttrpc` edge: containerd's Go call → the shim at the other end
//! of the socket its goroutine's request is outstanding on.
//!
//! The socket source (`crate::sources::ttrpc`) reads ttrpc frame headers in the
//! kernel and keeps, per (process, socket, stream id), each request whose
//! response has not been read back: who made it (the calling goroutine),
//! since when, and the shim that holds the socket's other end (sock_diag
//! peer inode → the process holding it). A Go call open in containerd on
//! that same goroutine, begun before the request, waits on that shim: the
//! join is by goroutine alone, never by time or container.
//!
//! In the shim, the edge goes on to the task call serving it: the first one
//! begun since the request was written (one for the caller's container
//! first, when both name theirs: a shim may serve a whole pod). The shim's
//! end of the stream is not followed to a goroutine, so this pick within
//! the right shim is by time. With no task call probed there: the shim's
//! oldest open wait, else the shim itself.

use super::model::OpenWait;
use super::{
    model::{Edge, EdgeKind, Exactness, HeldBy},
    resolvers::{held_by_process, CallRole, GoCallFact, GoFacts, Procs},
};

/// One ttrpc request with no response read back yet.
#[derive(Clone, Debug, PartialEq)]
pub struct TtrpcRequest {
    /// containerd (the client).
    pub tgid: u32,
    /// The goroutine that called and waits for the reply (for ttrpc 1.1, the
    /// `dispatch` caller, not the client's sender goroutine).
    pub caller_g: u64,
    /// The thread that wrote the request frame.
    pub writer_tid: u32,
    pub stream: u32,
    pub fd: u32,
    /// The client socket's inode, once looked up.
    pub sock_ino: Option<u64>,
    /// When the request frame was written (CLOCK_MONOTONIC ns).
    pub start_ns: u64,
    /// The process holding the socket's other end (the shim), once looked up.
    pub shim_pid: Option<u32>,
}

/// The ttrpc side of the graph at one scan.
#[derive(Clone, Debug, Default)]
pub struct TtrpcFacts {
    /// The scan's time, for the requests' ages.
    pub now_ns: u64,
    pub requests: Vec<TtrpcRequest>,
}

/// The exact edge from `c` (innermost open Go call of its goroutine, made
/// for `container` if known) to the shim its goroutine's oldest outstanding
/// request is for, if there is one.
pub fn stream_edge(c: &GoCallFact, container: Option<&str>, facts: &GoFacts, waits: &[OpenWait], procs: &mut dyn Procs) -> Option<Edge> {
    let r = facts
        .ttrpc
        .requests
        .iter()
        .filter(|r| r.tgid == c.tgid && r.caller_g == c.g && r.start_ns >= c.start_ns)
        .filter(|r| r.shim_pid.is_some())
        .min_by_key(|r| r.start_ns)?;
    let shim = r.shim_pid?;
    // A shim may serve a pod's several containers: one for this container
    // first, when both sides name theirs.
    let begun_since = || facts.calls.iter().filter(|s| s.role == CallRole::ShimTask && s.tgid == shim && s.start_ns >= r.start_ns);
    let serving = begun_since()
        .filter(|s| container.is_some() && s.container.as_deref() == container)
        .min_by_key(|s| s.start_ns)
        .or_else(|| begun_since().min_by_key(|s| s.start_ns));
    let to = match serving {
        Some(s) => HeldBy::Wait(s.key),
        None => held_by_process(waits, procs, shim),
    };
    let sock = match r.sock_ino {
        Some(ino) => format!("socket ino {ino}"),
        None => format!("socket fd {}", r.fd),
    };
    let age = facts.ttrpc.now_ns.saturating_sub(r.start_ns) as f64 / 1e9;
    let evidence = format!("ttrpc stream {} on {sock}, request outstanding {age:.1} s; the socket's peer is held by pid {shim}", r.stream);
    Some(Edge { from: c.key, to, kind: EdgeKind::Ttrpc, evidence, exactness: Exactness::Exact })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::model::{StartTiming, WaitKey, Who};
    use crate::graph::resolvers::go_edges;
    use crate::syscalls::WaitKind;
    use std::collections::HashMap;

    use crate::graph::fakes::{go_call as call, FakeProcs};

    /// Every process sleeping (S), every client connected.
    fn no_procs() -> FakeProcs {
        FakeProcs { default_state: Some('S'), all_connected: true, ..Default::default() }
    }

    const CTRD: u32 = 100;
    const SHIM_A: u32 = 200;
    const SHIM_B: u32 = 201;
    const S: u64 = 1_000_000_000;

    fn req(caller_g: u64, stream: u32, start_ns: u64, shim: u32) -> TtrpcRequest {
        TtrpcRequest { tgid: CTRD, caller_g, writer_tid: 101, stream, fd: 12, sock_ino: Some(4242), start_ns, shim_pid: Some(shim) }
    }

    fn facts(calls: Vec<GoCallFact>, requests: Vec<TtrpcRequest>, now_ns: u64) -> GoFacts {
        GoFacts { calls, parked: HashMap::new(), ttrpc: TtrpcFacts { now_ns, requests } }
    }

    fn from<'a>(edges: &'a [Edge], c: &GoCallFact) -> Vec<&'a Edge> {
        edges.iter().filter(|e| e.from == c.key).collect()
    }

    /// The Status lock holder's goroutine has stream 7 outstanding to shim A;
    /// the container id (which would say shim B) is only the fallback.
    #[test]
    fn the_stream_on_the_same_goroutine_names_the_shim_exactly() {
        let holder = call(CTRD, 0x3, 4, CallRole::StatusHolder, 5 * S, Some("abc"));
        let update_a = call(SHIM_A, 0x50, 9, CallRole::ShimTask, 6 * S + 1, None);
        let older_a = call(SHIM_A, 0x51, 9, CallRole::ShimTask, S, None);
        let by_id_b = call(SHIM_B, 0x52, 9, CallRole::ShimTask, 6 * S + 2, Some("abc"));
        let f = facts(vec![holder.clone(), update_a.clone(), older_a, by_id_b], vec![req(0x3, 7, 6 * S, SHIM_A)], 10 * S);
        let edges = go_edges(&f, &[], &mut no_procs());
        let e = from(&edges, &holder);
        assert_eq!(e.len(), 1, "{edges:?}");
        assert_eq!((e[0].kind, e[0].exactness), (EdgeKind::Ttrpc, Exactness::Exact));
        assert_eq!(e[0].to, HeldBy::Wait(update_a.key), "the shim's call begun since the request");
        assert!(e[0].evidence.starts_with("ttrpc stream 7 on socket ino 4242, request outstanding 4.0 s"), "{}", e[0].evidence);
    }

    /// Another goroutine's request, or one made before the call began (a
    /// goroutine reused), is not this call's.
    #[test]
    fn only_the_same_goroutine_during_the_call_counts() {
        let holder = call(CTRD, 0x3, 4, CallRole::StatusHolder, 5 * S, Some("abc"));
        let by_id = call(SHIM_B, 0x52, 9, CallRole::ShimTask, 6 * S, Some("abc"));
        let f = facts(vec![holder.clone(), by_id.clone()], vec![req(0x4, 7, 6 * S, SHIM_A), req(0x3, 9, 4 * S, SHIM_A)], 10 * S);
        let edges = go_edges(&f, &[], &mut no_procs());
        let e = from(&edges, &holder);
        assert_eq!(e.len(), 1, "{edges:?}");
        assert_eq!(
            (e[0].to.clone(), e[0].exactness),
            (HeldBy::Wait(by_id.key), Exactness::Inferred),
            "the container-id fallback, inferred"
        );
    }

    /// With no task call probed in the shim, the edge goes to its oldest
    /// open wait, else the shim process itself.
    #[test]
    fn an_unprobed_shim_is_the_holder_itself() {
        let holder = call(CTRD, 0x3, 4, CallRole::StatusHolder, 5 * S, None);
        let f = facts(vec![holder.clone()], vec![req(0x3, 1, 6 * S, SHIM_A)], 7 * S);
        let edges = go_edges(&f, &[], &mut no_procs());
        let e = from(&edges, &holder);
        match &e[0].to {
            HeldBy::Terminal(t) => assert_eq!((t.pid, e[0].exactness), (Some(SHIM_A), Exactness::Exact)),
            other => panic!("{other:?}"),
        }
        let umount = OpenWait {
            key: WaitKey::Kernel { tid: SHIM_A + 5, start_ns: 2 * S },
            who: Who { pid: SHIM_A, tid: SHIM_A + 5, comm: "shim".into(), goroutine: None },
            kind: WaitKind::Umount,
            what: "umount2".into(),
            start_ns: 2 * S,
            start: StartTiming::Exact,
            pleg_path: false,
        };
        let edges = go_edges(&f, std::slice::from_ref(&umount), &mut no_procs());
        assert_eq!(from(&edges, &holder)[0].to, HeldBy::Wait(umount.key));
    }

    /// A request whose shim is not known yet (the lookup comes after a
    /// second) leaves the fallback in place.
    #[test]
    fn an_unresolved_peer_falls_back() {
        let holder = call(CTRD, 0x3, 4, CallRole::StatusHolder, 5 * S, None);
        let mut r = req(0x3, 1, 6 * S, SHIM_A);
        r.shim_pid = None;
        let f = facts(vec![holder.clone()], vec![r], 7 * S);
        assert!(stream_edge(&holder, None, &f, &[], &mut no_procs()).is_none());
    }

    /// In a shim serving a pod's containers, the task call for the caller's
    /// container is the one serving the request, even if another began first.
    #[test]
    fn in_a_shared_shim_the_callers_container_is_preferred() {
        let handler = call(CTRD, 0x3, 3, CallRole::CriHandler { list: false }, 5 * S, Some("mine"));
        let other = call(SHIM_A, 0x50, 9, CallRole::ShimTask, 6 * S + 1, Some("the-sandbox"));
        let mine = call(SHIM_A, 0x51, 9, CallRole::ShimTask, 6 * S + 2, Some("mine"));
        let f = facts(vec![handler.clone(), other, mine.clone()], vec![req(0x3, 3, 6 * S, SHIM_A)], 8 * S);
        let edges = go_edges(&f, &[], &mut no_procs());
        let e = from(&edges, &handler);
        assert_eq!((e[0].to.clone(), e[0].exactness), (HeldBy::Wait(mine.key), Exactness::Exact));
    }
}
