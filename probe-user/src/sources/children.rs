//! The child-wait source: threads blocked in `wait4`/`waitid` (the kernel's
//! `CHILD_WAITS` map, see probe-ebpf/src/children.rs), as graph facts. The
//! `/proc` lookups of pipes between a process and its children are in
//! `observe::pipes`.
//!
//! Each scan reads the map (a few entries: only threads blocked right now)
//! and resolves each wait's selector: a pid, a pidfd (to its pid, once per
//! wait), any child, a process group. Which of them become graph nodes is the
//! graph's call (`graph::children::matters`).

use crate::graph::children::{ChildWaitFact, WaitTarget};
use crate::graph::model::WaitKey;
use crate::observe::pipes;
use aya::maps::{HashMap as BpfHashMap, MapData};
use plegwatch_abi::{ChildWait, CHILD_WAIT_WAIT4, P_ALL, P_PGID, P_PID, P_PIDFD};
use std::collections::HashMap;

/// What a kernel record's selector means.
pub fn target_of(w: &ChildWait) -> Option<WaitTarget> {
    match w.which {
        CHILD_WAIT_WAIT4 => Some(match w.id {
            -1 => WaitTarget::Any,
            0 => WaitTarget::Group(0),
            p if p > 0 => WaitTarget::Pid(p as u32),
            g => WaitTarget::Group(g.unsigned_abs()),
        }),
        P_PID if w.id > 0 => Some(WaitTarget::Pid(w.id as u32)),
        P_ALL => Some(WaitTarget::Any),
        P_PGID => Some(WaitTarget::Group(w.id.max(0) as u32)),
        P_PIDFD if w.id >= 0 => Some(WaitTarget::Pidfd { fd: w.id as u32, pid: None }),
        _ => None,
    }
}

/// The kernel's child waits, read each scan.
pub struct ChildWaits {
    map: BpfHashMap<MapData, u32, ChildWait>,
    /// Pidfds resolved, by wait: a pidfd names one process for the wait's life.
    pidfds: HashMap<WaitKey, Option<u32>>,
}

impl ChildWaits {
    pub fn new(map: BpfHashMap<MapData, u32, ChildWait>) -> Self {
        ChildWaits { map, pidfds: HashMap::new() }
    }

    /// Every thread blocked in `wait4`/`waitid` now.
    pub fn scan(&mut self) -> Vec<ChildWaitFact> {
        let mut out = Vec::new();
        for (_, w) in self.map.iter().filter_map(Result::ok) {
            let Some(mut target) = target_of(&w) else { continue };
            let key = WaitKey::Kernel { tid: w.tid, start_ns: w.start_ns };
            if let WaitTarget::Pidfd { fd, .. } = target {
                let pid = *self.pidfds.entry(key).or_insert_with(|| pipes::pidfd_pid(w.tgid, fd));
                target = WaitTarget::Pidfd { fd, pid };
            }
            out.push(ChildWaitFact {
                key,
                tgid: w.tgid,
                tid: w.tid,
                g: (w.g != 0).then_some(w.g),
                target,
                syscall: if w.which == CHILD_WAIT_WAIT4 { "wait4" } else { "waitid" },
                start_ns: w.start_ns,
            });
        }
        self.pidfds.retain(|k, _| out.iter().any(|f| f.key == *k));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(which: u32, id: i32) -> ChildWait {
        ChildWait { which, id, ..Default::default() }
    }

    #[test]
    fn selectors() {
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, 42)), Some(WaitTarget::Pid(42)));
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, -1)), Some(WaitTarget::Any));
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, 0)), Some(WaitTarget::Group(0)));
        assert_eq!(target_of(&rec(CHILD_WAIT_WAIT4, -77)), Some(WaitTarget::Group(77)));
        assert_eq!(target_of(&rec(P_PID, 42)), Some(WaitTarget::Pid(42)));
        assert_eq!(target_of(&rec(P_ALL, 0)), Some(WaitTarget::Any));
        assert_eq!(target_of(&rec(P_PIDFD, 5)), Some(WaitTarget::Pidfd { fd: 5, pid: None }));
        assert_eq!(target_of(&rec(9, 1)), None);
    }
}
