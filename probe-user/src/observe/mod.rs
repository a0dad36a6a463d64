//! Cached lookups of processes and sockets (`/proc`, sock_diag) for the
//! resolvers: children, states, names, and who is connected to whom.
//!
//! Each answer is kept for a short while, so that a scan every 250 ms does
//! not walk `/proc` again for every edge.

//!
//! Below them: `procfs` (reads of `/proc`), `mounts` (mountinfo) and
//! `namespaces` (our host pid, which mount table), `holders` (who owns a
//! socket, a D-Bus name, a unix peer), `k8s` (the pod and container a process
//! belongs to), `ustack` (user stacks named), `goroutines` (a Go process's
//! goroutines, read from `/proc/PID/mem` without stopping it), `gostack`
//! (Go stacks unwound from outside, through `/proc/PID/mem`) and `go_binary`
//! (a Go executable read from disk for the symbol parser).

pub mod bounded_read;
pub mod go_binary;
pub mod goroutines;
pub mod gostack;
pub mod holders;
pub mod k8s;
pub mod lister;
pub mod mounts;
pub mod namespaces;
pub mod pipes;
pub mod procfs;
pub mod proclist;
pub mod ustack;

use crate::{
    clock::monotonic_ns,
    graph::children::{ChildProcs, PipeLink},
    graph::resolvers::Procs,
};
use holders::UnixPeers;
use std::{
    collections::{HashMap, HashSet},
    time::{Duration, Instant},
};

/// How long a "connected" answer is reused.
const CONNECTED_TTL: Duration = Duration::from_secs(5);
/// Most (client, server) answers kept.
const CONNECTED_MAX: usize = 4096;

pub struct Observe {
    peers: UnixPeers,
    connected: HashMap<(u32, u32), (Instant, bool)>,
    pipes: HashMap<u32, (Instant, Vec<PipeLink>)>,
    /// `/proc` as the listing thread last saw it, for children.
    lister: lister::Lister,
    /// Processes seen stopped or in D: (first seen so, last looked at), by pid.
    stuck: HashMap<u32, (u64, u64)>,
}

/// A stuck process not looked at for this long is forgotten: what it did in between
/// is unknown, so its stuck clock starts again.
const STUCK_FORGET_NS: u64 = 5_000_000_000;
/// Most stuck processes remembered (those looked at longest ago go first).
const STUCK_MAX: usize = 4096;

impl Observe {
    pub fn new(lister: lister::Lister) -> Self {
        Observe { peers: UnixPeers::default(), connected: HashMap::new(), pipes: HashMap::new(), lister, stuck: HashMap::new() }
    }

    /// `pid`'s children, from the newest listing of `/proc` (at most
    /// [`lister::LIST_EVERY`] old).
    fn children_of(&mut self, pid: u32) -> Vec<u32> {
        self.lister.latest().children(pid)
    }
}

/// [`Procs::stuck_since`] on `state`, as read now: the first time `pid` was seen stopped
/// or in D without a break (a look that finds it otherwise ends the run), remembered
/// in `stuck`.
fn remember_stuck(stuck: &mut HashMap<u32, (u64, u64)>, pid: u32, state: Option<char>, now_ns: u64) -> Option<u64> {
    if !matches!(state, Some('T' | 't' | 'D')) {
        stuck.remove(&pid);
        return None;
    }
    if stuck.len() >= STUCK_MAX && !stuck.contains_key(&pid) {
        stuck.retain(|_, (_, seen)| now_ns.saturating_sub(*seen) < STUCK_FORGET_NS);
        if stuck.len() >= STUCK_MAX {
            return Some(now_ns);
        }
    }
    let e = stuck.entry(pid).or_insert((now_ns, now_ns));
    if now_ns.saturating_sub(e.1) > STUCK_FORGET_NS {
        e.0 = now_ns;
    }
    e.1 = now_ns;
    Some(e.0)
}

/// How long a process's pipes to its children are reused.
const PIPES_TTL: Duration = Duration::from_secs(2);
/// Most processes whose pipes are kept.
const PIPES_MAX: usize = 256;

impl ChildProcs for Observe {
    fn child_pipes(&mut self, pid: u32) -> Vec<PipeLink> {
        if let Some((at, links)) = self.pipes.get(&pid) {
            if at.elapsed() < PIPES_TTL {
                return links.clone();
            }
        }
        if self.pipes.len() >= PIPES_MAX {
            self.pipes.retain(|_, (at, _)| at.elapsed() < PIPES_TTL);
        }
        let kids = self.children_of(pid);
        let links = pipes::child_pipes(pid, &kids);
        self.pipes.insert(pid, (Instant::now(), links.clone()));
        links
    }

    fn started_ns(&mut self, pid: u32) -> Option<u64> {
        pipes::started_ns(pid, monotonic_ns())
    }
}

impl Procs for Observe {
    fn children(&mut self, pid: u32) -> Vec<u32> {
        self.children_of(pid)
    }

    fn state(&mut self, pid: u32) -> Option<char> {
        procfs::state(pid)
    }

    fn stuck_since(&mut self, pid: u32, now_ns: u64) -> Option<u64> {
        let state = procfs::state(pid);
        remember_stuck(&mut self.stuck, pid, state, now_ns)
    }

    fn comm(&mut self, pid: u32) -> Option<String> {
        procfs::comm(pid)
    }

    fn connected(&mut self, client: u32, server: u32) -> bool {
        if let Some((at, yes)) = self.connected.get(&(client, server)) {
            if at.elapsed() < CONNECTED_TTL {
                return *yes;
            }
        }
        if self.connected.len() >= CONNECTED_MAX {
            self.connected.retain(|_, (at, _)| at.elapsed() < CONNECTED_TTL);
        }
        // The peers of the client's unix sockets, then whether the server holds one:
        // two processes' fd tables, not every process's (a walk of all of /proc on
        // the scan loop took most of a second in an emulated guest).
        let peers: HashSet<u64> =
            procfs::socket_fds(client).into_iter().filter_map(|(_, inode)| self.peers.peer_of(inode)).map(|p| p.peer_inode).collect();
        let yes = !peers.is_empty() && procfs::socket_fds(server).iter().any(|(_, inode)| peers.contains(inode));
        self.connected.insert((client, server), (Instant::now(), yes));
        yes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two ends of a socket pair: this process is connected to itself, and not to
    /// a process that holds neither end.
    #[test]
    fn connected_by_the_peer_of_a_unix_socket() {
        let (_a, _b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let mut o = Observe::new(lister::Lister::start());
        let me = std::process::id();
        assert!(o.connected(me, me));
        let mut child = std::process::Command::new("sleep").arg("30").spawn().expect("sleep");
        assert!(!o.connected(me, child.id()));
        let _ = child.kill();
        let _ = child.wait();
    }
}

#[cfg(test)]
mod stuck_tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_stuck_run_starts_at_its_first_look_and_ends_at_any_other_state() {
        let mut m = HashMap::new();
        assert_eq!(remember_stuck(&mut m, 7, Some('D'), 10 * S), Some(10 * S));
        assert_eq!(remember_stuck(&mut m, 7, Some('D'), 11 * S), Some(10 * S), "still in the same run");
        assert_eq!(remember_stuck(&mut m, 7, Some('T'), 12 * S), Some(10 * S), "stopped counts as stuck too");
        assert_eq!(remember_stuck(&mut m, 7, Some('S'), 13 * S), None, "the run ends");
        assert_eq!(remember_stuck(&mut m, 7, Some('D'), 14 * S), Some(14 * S), "a new run");
        // Not looked at for longer than STUCK_FORGET_NS: what happened between is unknown.
        assert_eq!(remember_stuck(&mut m, 7, Some('D'), 14 * S + STUCK_FORGET_NS + 1), Some(14 * S + STUCK_FORGET_NS + 1));
        assert_eq!(remember_stuck(&mut m, 8, None, S), None, "gone");
        assert!(!m.contains_key(&8));
    }
}
