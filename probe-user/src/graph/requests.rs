//! The request resolver: an open netlink request or D-Bus call → who must answer it.
//!
//! The socket source finds each request's answerer (a netlink port id's owner, a D-Bus
//! name's owner asked of the bus daemon, a peer-to-peer socket's peer, or the kernel)
//! and hands it over as an [`Answerer`]; the edge goes to the answering process's own
//! oldest open wait when it has one, else to the process, else to the kernel.
//!
//! | edge | from → to | exact when |
//! |---|---|---|
//! | `netlink_peer` | a request sent to a process's port id → the process holding that socket | always (`/proc/net/netlink`) |
//! | `no_reply` | a request to the kernel (port 0) → the kernel | unless it was sent before plegwatch started |
//! | `dbus_owner` | a D-Bus call → the owner of its destination (or the bus daemon, when it does not answer) | unless the bus daemon does not answer |
//! | `unix_peer` | a peer-to-peer D-Bus call → the socket's peer | always (sock_diag) |

use super::model::{Edge, EdgeKind, Exactness, HeldBy, Terminal, WaitKey};
use super::resolvers::{held_by_process, Procs};

/// Who must answer a request, as its source found it.
#[derive(Clone, Debug, PartialEq)]
pub struct Answerer {
    /// The answering process; none for the kernel (or a port id no process holds).
    pub pid: Option<u32>,
    pub kind: EdgeKind,
    pub exactness: Exactness,
    pub evidence: String,
}

/// One edge per (request, answerer): to the answering process's oldest open wait, the
/// process itself, or the kernel.
pub fn answer_edges(answers: &[(WaitKey, Answerer)], waits: &[super::model::OpenWait], procs: &mut dyn Procs) -> Vec<Edge> {
    answers.iter().map(|(from, a)| answer_edge(*from, a.clone(), waits, procs)).collect()
}

fn answer_edge(from: WaitKey, a: Answerer, waits: &[super::model::OpenWait], procs: &mut dyn Procs) -> Edge {
    let to = match a.pid {
        Some(pid) => held_by_process(waits, procs, pid),
        None => HeldBy::Terminal(Terminal {
            id: None,
            kind: "kernel",
            pid: None,
            comm: None,
            what: match a.kind {
                EdgeKind::NetlinkPeer => "the destination port id is held by no process".into(),
                _ => "the kernel: no reply".into(),
            },
        }),
    };
    Edge { from, to, kind: a.kind, evidence: a.evidence, exactness: a.exactness }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::fakes::FakeProcs;
    use crate::graph::model::{OpenWait, StartTiming, Who};
    use crate::syscalls::WaitKind;

    fn request() -> WaitKey {
        WaitKey::Netlink { sock: 5 << 32 | 3, start_ns: 10 }
    }

    #[test]
    fn an_answering_process_with_an_open_wait_is_held_by_that_wait() {
        let theirs = OpenWait {
            key: WaitKey::Kernel { tid: 42, start_ns: 5 },
            who: Who { pid: 40, tid: 42, comm: "cni".into(), goroutine: None },
            kind: WaitKind::NetlinkRequest,
            what: "x".into(),
            start_ns: 5,
            start: StartTiming::Exact,
            pleg_path: false,
        };
        let a = Answerer { pid: Some(40), kind: EdgeKind::NetlinkPeer, exactness: Exactness::Exact, evidence: "port".into() };
        let edges = answer_edges(&[(request(), a)], &[theirs], &mut FakeProcs::default());
        assert_eq!(edges[0].to, HeldBy::Wait(WaitKey::Kernel { tid: 42, start_ns: 5 }));
        assert_eq!(edges[0].kind, EdgeKind::NetlinkPeer);
    }

    #[test]
    fn a_request_to_the_kernel_ends_at_the_kernel_and_a_lost_port_says_so() {
        let kernel = Answerer { pid: None, kind: EdgeKind::NoReply, exactness: Exactness::Exact, evidence: "seq".into() };
        let lost = Answerer { pid: None, kind: EdgeKind::NetlinkPeer, exactness: Exactness::Exact, evidence: "gone".into() };
        let edges = answer_edges(&[(request(), kernel), (request(), lost)], &[], &mut FakeProcs::default());
        let what = |e: &Edge| match &e.to {
            HeldBy::Terminal(t) => (t.kind, t.what.clone()),
            other => panic!("not a terminal: {other:?}"),
        };
        assert_eq!(what(&edges[0]), ("kernel", "the kernel: no reply".to_string()));
        assert_eq!(what(&edges[1]), ("kernel", "the destination port id is held by no process".to_string()));
    }
}
