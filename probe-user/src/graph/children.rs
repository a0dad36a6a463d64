//! The parent → child edge, exact where the kernel or `/proc` names the child.
//!
//! | edge | from → to | exact when |
//! |---|---|---|
//! | `same_goroutine` | a Go call → the `wait4`/`waitid` its goroutine is blocked in | always (g read from TLS at `sys_enter`; built by `go_edges`, which joins kernel waits by goroutine) |
//! | `child` | a `wait4`/`waitid` → the child it waits for (its oldest open wait, else the process) | the pid argument (or a pidfd) names it, or it is the only child; inferred for `wait4(-1)` with several |
//! | `child` | a shim task call with no kernel wait of its own → its child | one child started during the call and holds the write end of a pipe the shim reads; inferred when several do |
//!
//! A Go parent (the shim) reads its child's output pipe through Go's
//! netpoller: no thread is blocked in `read()` on it and the reaper reaps the
//! child with `wait4(-1, WNOHANG)` from its SIGCHLD loop, so neither shows as
//! a blocked syscall. The pipe itself, and when the child started, do.
//!
//! A thread blocked in `wait4`/`waitid` is a graph node only when it matters
//! ([`matters`]): a probed Go call waits on it (same goroutine), or the child
//! it waits for has been stopped or blocked in D for [`STUCK_FOR_NS`], with no
//! open wait of its own (so the parent's wait is the only sign of it). A shell
//! or an init waiting on a running command is none of plegwatch's business, and
//! a child's D state of a moment (a read, a page fault) does not make it so. A
//! wait that matters through its child only is timed from when that child was
//! first seen stuck (a lower bound), not from the parent's call, which may be
//! hours old; its edge goes to that child.

use super::model::{Edge, EdgeKind, Exactness, HeldBy, OpenWait, WaitKey};
use super::resolvers::{held_by_process, oldest_wait_of, CallRole, GoCallFact, GoFacts, Procs};
use std::collections::HashMap;

/// Which children a `wait4`/`waitid` waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitTarget {
    /// One child, named by pid.
    Pid(u32),
    /// One child, named by a pidfd (`waitid(P_PIDFD, fd)`, Go ≥ 1.23's
    /// `os.Process.Wait`), resolved to its pid through `/proc/PID/fdinfo`.
    Pidfd { fd: u32, pid: Option<u32> },
    /// Any child (`wait4(-1)`, `waitid(P_ALL)`).
    Any,
    /// Any child in a process group (0: the caller's own).
    Group(u32),
}

/// A thread blocked in `wait4`/`waitid`, as the child-wait source saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct ChildWaitFact {
    /// The node's key (`WaitKey::Kernel`: one thread is in one syscall at a time).
    pub key: WaitKey,
    pub tgid: u32,
    pub tid: u32,
    /// The goroutine, for probed Go targets.
    pub g: Option<u64>,
    pub target: WaitTarget,
    /// `wait4` or `waitid`.
    pub syscall: &'static str,
    pub start_ns: u64,
    /// Exact when the kernel saw the wait begin; a lower bound for one the startup
    /// sweep found.
    pub start: super::model::StartTiming,
    /// The child that makes it matter ([`matters`]) and since when it is seen stuck;
    /// none when a probed Go call on it does.
    pub stuck: Option<(u32, u64)>,
}

impl ChildWaitFact {
    /// What it waits in, in words: `wait4(pid 123)`, `waitid(P_ALL)`.
    pub fn what(&self) -> String {
        match self.target {
            WaitTarget::Pid(p) if self.syscall == "wait4" => format!("wait4(pid {p})"),
            WaitTarget::Pid(p) => format!("waitid(P_PID, {p})"),
            WaitTarget::Pidfd { fd, pid: Some(p) } => format!("waitid(P_PIDFD, fd {fd} = pid {p})"),
            WaitTarget::Pidfd { fd, pid: None } => format!("waitid(P_PIDFD, fd {fd})"),
            WaitTarget::Any if self.syscall == "wait4" => "wait4(-1: any child)".to_string(),
            WaitTarget::Any => "waitid(P_ALL)".to_string(),
            WaitTarget::Group(0) => format!("{}(any child in its process group)", self.syscall),
            WaitTarget::Group(g) => format!("{}(any child in process group {g})", self.syscall),
        }
    }

    /// The one child its argument names, if it names one.
    fn named(&self) -> Option<u32> {
        match self.target {
            WaitTarget::Pid(p) | WaitTarget::Pidfd { pid: Some(p), .. } => Some(p),
            _ => None,
        }
    }
}

/// A pipe between a process and one of its children: the parent holds its
/// read end, the child its write end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PipeLink {
    pub ino: u64,
    pub child: u32,
    /// The parent's fds on the read end.
    pub reader_fds: Vec<u32>,
    /// The child's fds on the write end.
    pub writer_fds: Vec<u32>,
    /// The parent's threads blocked in `read()` on it (none for a Go parent,
    /// which reads through its netpoller).
    pub blocked_readers: Vec<u32>,
    /// The child's command line (for the evidence and to match a container id).
    pub child_argv: Vec<String>,
}

/// What the child edges need from `/proc` besides [`Procs`].
pub trait ChildProcs: Procs {
    /// The pipes `pid` reads whose write end a child of it holds.
    fn child_pipes(&mut self, pid: u32) -> Vec<PipeLink>;
    /// When process `pid` started, on the CLOCK_MONOTONIC scale (to its
    /// clock tick), if known.
    fn started_ns(&mut self, pid: u32) -> Option<u64>;
}

/// A call is looked into (its pipes) only once it has lasted this long:
/// a short one is gone before anyone asks.
pub const PIPE_LOOKUP_AFTER_NS: u64 = 1_000_000_000;
/// `/proc/PID/stat`'s start time is in clock ticks (10 ms); a child started
/// this much before the call's probe fired still counts as started by it.
const START_SLACK_NS: u64 = 20_000_000;

/// Whether a thread's `wait4`/`waitid` belongs in the graph (see the module doc).
pub fn matters(f: &ChildWaitFact, go: &GoFacts, waits: &[OpenWait], procs: &mut dyn Procs, now_ns: u64) -> Option<Matters> {
    if f.g.is_some_and(|g| go.calls.iter().any(|c| c.tgid == f.tgid && c.g == g)) {
        return Some(Matters::GoCall);
    }
    let candidates = match f.named() {
        Some(p) => vec![p],
        None => procs.children(f.tgid),
    };
    // Every candidate is looked at, so that each one's stuck clock runs from its first scan.
    let mut stuck = None;
    for p in candidates {
        let Some(since) = procs.stuck_since(p, now_ns) else { continue };
        if stuck.is_none() && oldest_wait_of(waits, p).is_none() && now_ns.saturating_sub(since) >= STUCK_FOR_NS {
            stuck = Some((p, since));
        }
    }
    stuck.map(|(pid, since_ns)| Matters::StuckChild { pid, since_ns })
}

/// Why a `wait4`/`waitid` is a graph node ([`matters`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Matters {
    /// A probed Go call waits on it (same goroutine).
    GoCall,
    /// Its child `pid` has been stopped or in D since `since_ns`, with no wait of its own.
    StuckChild { pid: u32, since_ns: u64 },
}

/// How long a child must be seen stopped or in D before the wait on it matters on that
/// account: a page fault's or a read's D lasts milliseconds, and a parent that has
/// waited for hours on a child that runs (a shell, an init) is no stall.
pub const STUCK_FOR_NS: u64 = 1_000_000_000;

impl ChildWaitFact {
    /// This wait as it matters: the stuck child noted, and, when only that child makes it
    /// matter, its start no earlier than when the child was first seen stuck (a parent's
    /// wait on a running child is no stall; the stall is the child's being stuck, and
    /// that began at or before it was seen: a lower bound).
    pub fn as_it_matters(mut self, why: Matters) -> Self {
        if let Matters::StuckChild { pid, since_ns } = why {
            self.stuck = Some((pid, since_ns));
            if since_ns > self.start_ns {
                self.start_ns = since_ns;
                self.start = super::model::StartTiming::LowerBound;
            }
        }
        self
    }
}

/// The graph node of a thread's `wait4`/`waitid`.
pub fn open_wait(f: &ChildWaitFact, comm: String) -> OpenWait {
    OpenWait {
        key: f.key,
        who: super::model::Who { pid: f.tgid, tid: f.tid, comm, goroutine: f.g },
        kind: crate::syscalls::WaitKind::ChildWait,
        what: f.what(),
        start_ns: f.start_ns,
        start: f.start,
        pleg_path: false,
    }
}

fn edge(from: WaitKey, to: HeldBy, exactness: Exactness, evidence: String) -> Edge {
    Edge { from, to, kind: EdgeKind::Child, evidence, exactness }
}

/// Each `wait4`/`waitid` in the graph → the child it waits for.
pub fn child_wait_edges(facts: &[ChildWaitFact], waits: &[OpenWait], procs: &mut dyn Procs) -> Vec<Edge> {
    let mut out = Vec::new();
    for f in facts.iter().filter(|f| waits.iter().any(|w| w.key == f.key)) {
        let what = f.what();
        if let Some(p) = f.named() {
            let name = procs.comm(p).unwrap_or_default();
            let via = if matches!(f.target, WaitTarget::Pidfd { .. }) { " (the pidfd's fdinfo names it)" } else { "" };
            out.push(edge(
                f.key,
                held_by_process(waits, procs, p),
                Exactness::Exact,
                format!("{what} names its child {name} pid {p}{via}"),
            ));
            continue;
        }
        let kids = procs.children(f.tgid);
        // The child that made the wait matter, else one stuck now, one with a wait, any.
        let made_it = f.stuck.map(|(p, _)| p).filter(|p| kids.contains(p));
        let stuck = || kids.iter().copied().find(|k| matches!(procs.state(*k), Some('T' | 't' | 'D')));
        let with_wait = || kids.iter().copied().find(|k| oldest_wait_of(waits, *k).is_some());
        let Some(child) = made_it.or_else(stuck).or_else(with_wait).or(kids.first().copied()) else { continue };
        let name = procs.comm(child).unwrap_or_default();
        let (exactness, why) = if kids.len() == 1 {
            (Exactness::Exact, format!("{what}: {name} pid {child} is its only child"))
        } else {
            (Exactness::Inferred, format!("{what} with {} children: {name} pid {child} is the one stopped, blocked or waiting", kids.len()))
        };
        out.push(edge(f.key, held_by_process(waits, procs, child), exactness, why));
    }
    out
}

/// A shim task call with no kernel wait of its own, open at least
/// [`PIPE_LOOKUP_AFTER_NS`], and first in line for its container → the child
/// it started: the one child that began during the call and writes a pipe
/// the shim reads. Exact when one call and one child fit (or the child's
/// command line names the call's container); inferred when several do.
pub fn shim_child_edges(go: &GoFacts, waits: &[OpenWait], procs: &mut dyn ChildProcs, now_ns: u64) -> Vec<Edge> {
    let mut out = Vec::new();
    let latest_on_g: HashMap<(u32, u64), u64> = go.calls.iter().fold(HashMap::new(), |mut m, c| {
        let e = m.entry((c.tgid, c.g)).or_insert(0);
        *e = (*e).max(c.start_ns);
        m
    });
    let in_kernel = |c: &GoCallFact| {
        waits.iter().any(|w| matches!(w.key, WaitKey::Kernel { .. }) && w.who.pid == c.tgid && w.who.goroutine == Some(c.g))
    };
    let calls: Vec<&GoCallFact> = go
        .calls
        .iter()
        .filter(|c| c.role == CallRole::ShimTask && now_ns.saturating_sub(c.start_ns) >= PIPE_LOOKUP_AFTER_NS)
        .filter(|c| latest_on_g.get(&(c.tgid, c.g)) == Some(&c.start_ns) && !in_kernel(c))
        // A call behind an earlier one for its container waits on that one (shim_mutex).
        .filter(|c| {
            !go.calls.iter().any(|e| {
                e.role == CallRole::ShimTask
                    && e.tgid == c.tgid
                    && e.key != c.key
                    && e.start_ns < c.start_ns
                    && (c.container.is_none() || e.container == c.container)
            })
        })
        .collect();
    let mut shims: Vec<u32> = calls.iter().map(|c| c.tgid).collect();
    shims.sort_unstable();
    shims.dedup();
    for shim in shims {
        let links = procs.child_pipes(shim);
        if links.is_empty() {
            continue;
        }
        // Every open task call in this shim, to tell whose child it is.
        let open: Vec<&GoCallFact> = go.calls.iter().filter(|c| c.role == CallRole::ShimTask && c.tgid == shim).collect();
        for c in calls.iter().filter(|c| c.tgid == shim) {
            let mut fits: Vec<(&PipeLink, bool)> = Vec::new();
            for l in &links {
                let Some(started) = procs.started_ns(l.child) else { continue };
                if started + START_SLACK_NS < c.start_ns {
                    continue;
                }
                // Which open calls could have started it: those begun before it.
                let starters = open.iter().filter(|o| o.start_ns <= started + START_SLACK_NS).count();
                let names_container = c.container.as_deref().is_some_and(|id| l.child_argv.iter().any(|a| a == id));
                if fits.iter().all(|(f, _)| f.child != l.child) {
                    fits.push((l, starters == 1 || names_container));
                }
            }
            let Some(&(l, sure)) = fits.first() else { continue };
            let exactness = if fits.len() == 1 && sure { Exactness::Exact } else { Exactness::Inferred };
            out.push(edge(c.key, held_by_process(waits, procs, l.child), exactness, pipe_evidence(c, l, procs, fits.len())));
        }
    }
    out
}

fn pipe_evidence(c: &GoCallFact, l: &PipeLink, procs: &mut dyn Procs, candidates: usize) -> String {
    let name = procs.comm(l.child).unwrap_or_default();
    let fds = |v: &[u32]| v.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let argv: String = l.child_argv.join(" ").chars().take(160).collect();
    let read = if l.blocked_readers.is_empty() {
        "through Go's netpoller (no thread blocked in read())".to_string()
    } else {
        format!("thread {} blocked in read() on it", fds(&l.blocked_readers))
    };
    let more = if candidates > 1 { format!("; {candidates} children fit") } else { String::new() };
    format!(
        "{} waits for its child {name} pid {} (`{argv}`), started during the call: it holds pipe:[{}] open for writing (fd {}), the shim reads it (fd {}) {read}{more}",
        c.function,
        l.child,
        l.ino,
        fds(&l.writer_fds),
        fds(&l.reader_fds),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::model::{StartTiming, Who};
    use crate::syscalls::WaitKind;

    #[derive(Default)]
    struct Fake {
        children: HashMap<u32, Vec<u32>>,
        states: HashMap<u32, char>,
        started: HashMap<u32, u64>,
        pipes: HashMap<u32, Vec<PipeLink>>,
        pipe_asks: u32,
    }

    impl Procs for Fake {
        fn children(&mut self, pid: u32) -> Vec<u32> {
            self.children.get(&pid).cloned().unwrap_or_default()
        }
        fn state(&mut self, pid: u32) -> Option<char> {
            self.states.get(&pid).copied()
        }
        fn comm(&mut self, pid: u32) -> Option<String> {
            Some(format!("p{pid}"))
        }
        fn connected(&mut self, _: u32, _: u32) -> bool {
            false
        }
    }

    impl ChildProcs for Fake {
        fn child_pipes(&mut self, pid: u32) -> Vec<PipeLink> {
            self.pipe_asks += 1;
            self.pipes.get(&pid).cloned().unwrap_or_default()
        }
        fn started_ns(&mut self, pid: u32) -> Option<u64> {
            self.started.get(&pid).copied()
        }
    }

    const S: u64 = 1_000_000_000;
    const SHIM: u32 = 200;
    const PAUSE: u32 = 201;
    const SLEEPER: u32 = 202;
    const RUNC: u32 = 300;

    fn fact(tgid: u32, tid: u32, g: Option<u64>, target: WaitTarget, start_ns: u64) -> ChildWaitFact {
        ChildWaitFact {
            key: WaitKey::Kernel { tid, start_ns },
            tgid,
            tid,
            g,
            target,
            syscall: "wait4",
            start_ns,
            start: crate::graph::model::StartTiming::Exact,
            stuck: None,
        }
    }

    fn call(tgid: u32, g: u64, start_ns: u64, container: &str) -> GoCallFact {
        GoCallFact {
            key: WaitKey::Go { tgid, g, func: 5, start_ns },
            tgid,
            g,
            role: CallRole::ShimTask,
            receiver: 0,
            container: Some(container.into()),
            start_ns,
            function: "task.(*service).Update",
            late: false,
        }
    }

    fn pipe(child: u32, ino: u64, argv: &[&str]) -> PipeLink {
        PipeLink {
            ino,
            child,
            reader_fds: vec![29],
            writer_fds: vec![1, 2],
            blocked_readers: vec![],
            child_argv: argv.iter().map(|s| s.to_string()).collect(),
        }
    }

    fn kernel_wait(pid: u32, tid: u32, start_ns: u64) -> OpenWait {
        OpenWait {
            key: WaitKey::Kernel { tid, start_ns },
            who: Who { pid, tid, comm: "x".into(), goroutine: None },
            kind: WaitKind::Umount,
            what: "umount2 /x".into(),
            start_ns,
            start: StartTiming::Exact,
            pleg_path: false,
        }
    }

    #[test]
    fn a_pid_argument_names_the_child_exactly() {
        let f = fact(100, 101, None, WaitTarget::Pid(RUNC), 5);
        let mut procs =
            Fake { children: HashMap::from([(100, vec![PAUSE, RUNC])]), states: HashMap::from([(RUNC, 'T')]), ..Default::default() };
        let waits = vec![open_wait(&f, "parent".into())];
        let e = child_wait_edges(std::slice::from_ref(&f), &waits, &mut procs);
        assert_eq!(e.len(), 1);
        assert_eq!((e[0].kind, e[0].exactness), (EdgeKind::Child, Exactness::Exact));
        assert!(e[0].evidence.contains("wait4(pid 300)"), "{}", e[0].evidence);
        match &e[0].to {
            HeldBy::Terminal(t) => assert_eq!((t.pid, t.what.as_str()), (Some(RUNC), "stopped (state T)")),
            other => panic!("{other:?}"),
        }
        // The child's own open wait comes first.
        let mut waits = waits;
        let umount = kernel_wait(RUNC, RUNC, 7);
        waits.push(umount.clone());
        let e = child_wait_edges(std::slice::from_ref(&f), &waits, &mut procs);
        assert_eq!(e[0].to, HeldBy::Wait(umount.key));
    }

    #[test]
    fn any_child_is_exact_only_with_one_child() {
        let f = fact(100, 101, None, WaitTarget::Any, 5);
        let waits = vec![open_wait(&f, "sh".into())];
        let mut procs = Fake { children: HashMap::from([(100, vec![RUNC])]), states: HashMap::from([(RUNC, 'S')]), ..Default::default() };
        let e = child_wait_edges(std::slice::from_ref(&f), &waits, &mut procs);
        assert_eq!(e[0].exactness, Exactness::Exact);
        procs.children.insert(100, vec![PAUSE, RUNC]);
        procs.states.insert(RUNC, 'T');
        let e = child_wait_edges(std::slice::from_ref(&f), &waits, &mut procs);
        assert_eq!(e[0].exactness, Exactness::Inferred);
        assert!(matches!(&e[0].to, HeldBy::Terminal(t) if t.pid == Some(RUNC)), "the stopped one: {:?}", e[0].to);
    }

    #[test]
    fn only_waits_that_matter_are_nodes() {
        let mut procs = Fake { children: HashMap::from([(100, vec![RUNC])]), states: HashMap::from([(RUNC, 'S')]), ..Default::default() };
        let shell = fact(100, 100, None, WaitTarget::Pid(RUNC), 5);
        let now = 10 * S;
        assert_eq!(matters(&shell, &GoFacts::default(), &[], &mut procs, now), None, "a shell waiting on a running command");
        procs.states.insert(RUNC, 'T');
        let stuck = Some(Matters::StuckChild { pid: RUNC, since_ns: 0 });
        assert_eq!(matters(&shell, &GoFacts::default(), &[], &mut procs, now), stuck, "waiting on a stopped child");
        let busy = kernel_wait(RUNC, RUNC, 3);
        procs.states.insert(RUNC, 'D');
        assert_eq!(
            matters(&shell, &GoFacts::default(), std::slice::from_ref(&busy), &mut procs, now),
            None,
            "the child's own wait is reported already"
        );
        // A Go call on the same goroutine: always.
        procs.states.insert(RUNC, 'S');
        let go_wait = fact(100, 102, Some(0xc0), WaitTarget::Pid(RUNC), 5);
        let go = GoFacts { calls: vec![call(100, 0xc0, 1, "abc")], parked: HashMap::new(), ..Default::default() };
        assert_eq!(matters(&go_wait, &go, &[], &mut procs, now), Some(Matters::GoCall));
        let other_g = fact(100, 102, Some(0xc1), WaitTarget::Pid(RUNC), 5);
        assert_eq!(matters(&other_g, &go, &[], &mut procs, now), None, "joined by goroutine only");
    }

    /// A procs whose children were first seen stuck at given times (a real lookup
    /// remembers it across scans).
    struct SeenStuck(Fake, HashMap<u32, u64>);

    impl Procs for SeenStuck {
        fn children(&mut self, pid: u32) -> Vec<u32> {
            self.0.children(pid)
        }
        fn state(&mut self, pid: u32) -> Option<char> {
            self.0.state(pid)
        }
        fn stuck_since(&mut self, pid: u32, _: u64) -> Option<u64> {
            matches!(self.0.state(pid), Some('T' | 't' | 'D')).then(|| self.1.get(&pid).copied()).flatten()
        }
        fn comm(&mut self, pid: u32) -> Option<String> {
            self.0.comm(pid)
        }
        fn connected(&mut self, _: u32, _: u32) -> bool {
            false
        }
    }

    /// An init (or a shell) in `wait4(-1)` for hours while its children run: a child's
    /// D state of a moment does not make the wait a stall; one that lasts does, timed
    /// from when the child was first seen stuck, not from the hours-old wait.
    #[test]
    fn a_long_wait_matters_only_once_a_child_stays_stuck_and_from_then() {
        const INIT: u32 = 1;
        const SH: u32 = 248;
        let fake = Fake {
            children: HashMap::from([(INIT, vec![SH, RUNC])]),
            states: HashMap::from([(SH, 'S'), (RUNC, 'D')]),
            ..Default::default()
        };
        let init = fact(INIT, INIT, None, WaitTarget::Any, 5 * S);
        let now = 3600 * S;
        let mut procs = SeenStuck(fake, HashMap::from([(RUNC, now - S / 10)]));
        assert_eq!(matters(&init, &GoFacts::default(), &[], &mut procs, now), None, "in D for 0.1 s: an I/O");
        procs.1.insert(RUNC, now - 2 * S);
        let why = matters(&init, &GoFacts::default(), &[], &mut procs, now);
        assert_eq!(why, Some(Matters::StuckChild { pid: RUNC, since_ns: now - 2 * S }));
        let node = init.clone().as_it_matters(why.unwrap_or(Matters::GoCall));
        assert_eq!((node.start_ns, node.start), (now - 2 * S, StartTiming::LowerBound), "timed from the child's being stuck");
        assert_eq!(node.key, init.key, "the same node");
        // The edge goes to the child that made it matter, even if another looks stuck by now.
        procs.0.states.insert(SH, 'T');
        let waits = vec![open_wait(&node, "init".into())];
        let e = child_wait_edges(std::slice::from_ref(&node), &waits, &mut procs.0);
        assert!(matches!(&e[0].to, HeldBy::Terminal(t) if t.pid == Some(RUNC)), "{:?}", e[0].to);
        // A wait that began after the child got stuck keeps its own start.
        let late = fact(INIT, INIT, None, WaitTarget::Any, now - S).as_it_matters(Matters::StuckChild { pid: RUNC, since_ns: now - 2 * S });
        assert_eq!((late.start_ns, late.start), (now - S, StartTiming::Exact));
    }

    #[test]
    fn a_go_call_reaches_its_wait4_on_the_same_goroutine() {
        let f = fact(CTRD, 111, Some(0xc0), WaitTarget::Pid(RUNC), 20);
        let c = GoCallFact { role: CallRole::CriHandler { list: false }, ..call(CTRD, 0xc0, 10, "abc") };
        let go = GoFacts { calls: vec![c.clone()], parked: HashMap::new(), ..Default::default() };
        let waits = vec![open_wait(&f, "containerd".into())];
        let mut procs = Fake::default();
        let edges = super::super::resolvers::go_edges(&go, &waits, &mut procs);
        let e = edges.iter().find(|e| e.from == c.key).expect("an edge from the call");
        assert_eq!((e.kind, e.exactness, &e.to), (EdgeKind::SameGoroutine, Exactness::Exact, &HeldBy::Wait(f.key)));
    }
    const CTRD: u32 = 90;

    /// The shim's Update, its children the pod's pause and a container (started long
    /// before) and its runc (started during the call): the pipe and the start time pick runc.
    #[test]
    fn the_shim_call_reaches_the_child_that_writes_its_pipe() {
        let c = call(SHIM, 0xc0, 10 * S, "abc123");
        let go = GoFacts { calls: vec![c.clone()], parked: HashMap::new(), ..Default::default() };
        let mut procs = Fake {
            children: HashMap::from([(SHIM, vec![PAUSE, SLEEPER, RUNC])]),
            states: HashMap::from([(RUNC, 'T'), (PAUSE, 'S'), (SLEEPER, 'S')]),
            started: HashMap::from([(PAUSE, S), (SLEEPER, 2 * S), (RUNC, 10 * S + 5_000_000)]),
            pipes: HashMap::from([(SHIM, vec![pipe(SLEEPER, 7, &["sleep", "3600"]), pipe(RUNC, 9, &["runc", "update", "abc123"])])]),
            pipe_asks: 0,
        };
        let e = shim_child_edges(&go, &[], &mut procs, 10 * S + S / 2);
        assert!(e.is_empty(), "too young to look into");
        assert_eq!(procs.pipe_asks, 0);
        let e = shim_child_edges(&go, &[], &mut procs, 13 * S);
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!((e[0].kind, e[0].exactness), (EdgeKind::Child, Exactness::Exact));
        assert!(matches!(&e[0].to, HeldBy::Terminal(t) if t.pid == Some(RUNC)), "{:?}", e[0].to);
        assert!(e[0].evidence.contains("pipe:[9]") && e[0].evidence.contains("netpoller"), "{}", e[0].evidence);
        // Two calls open in the shim before runc started, and runc's argv names neither: inferred.
        let other = call(SHIM, 0xc1, 9 * S, "zzz");
        procs.pipes.insert(SHIM, vec![pipe(RUNC, 9, &["runc", "update"])]);
        let go2 = GoFacts { calls: vec![c.clone(), other], parked: HashMap::new(), ..Default::default() };
        let e = shim_child_edges(&go2, &[], &mut procs, 13 * S);
        let mine = e.iter().find(|e| e.from == c.key).expect("an edge");
        assert_eq!(mine.exactness, Exactness::Inferred);
        // The argv names the call's container: exact again.
        procs.pipes.insert(SHIM, vec![pipe(RUNC, 9, &["runc", "update", "abc123"])]);
        let e = shim_child_edges(&go2, &[], &mut procs, 13 * S);
        assert_eq!(e.iter().find(|e| e.from == c.key).map(|e| e.exactness), Some(Exactness::Exact));
    }

    #[test]
    fn a_shim_call_in_a_kernel_wait_or_behind_another_is_left_alone() {
        let c = call(SHIM, 0xc0, 10 * S, "abc");
        let mut procs = Fake {
            children: HashMap::from([(SHIM, vec![RUNC])]),
            started: HashMap::from([(RUNC, 11 * S)]),
            pipes: HashMap::from([(SHIM, vec![pipe(RUNC, 9, &[])])]),
            ..Default::default()
        };
        let umount =
            OpenWait { who: Who { pid: SHIM, tid: 250, comm: "shim".into(), goroutine: Some(0xc0) }, ..kernel_wait(SHIM, 250, 11 * S) };
        let go = GoFacts { calls: vec![c.clone()], parked: HashMap::new(), ..Default::default() };
        assert!(shim_child_edges(&go, &[umount], &mut procs, 13 * S).is_empty());
        let first = call(SHIM, 0xc1, 9 * S, "abc");
        let go = GoFacts { calls: vec![c.clone(), first.clone()], parked: HashMap::new(), ..Default::default() };
        let e = shim_child_edges(&go, &[], &mut procs, 13 * S);
        assert!(e.iter().all(|e| e.from == first.key), "the later call waits on the first (shim_mutex): {e:?}");
        // A child older than the call is not its child.
        procs.started.insert(RUNC, 5 * S);
        assert!(shim_child_edges(&go, &[], &mut procs, 13 * S).is_empty());
    }
}
