//! What to delete from the kernel's `OFFCPU` aggregate and `STACKS` map, which
//! the kernel only ever adds to.
//!
//! A pure selection over the maps' keys, so that it is tested without a
//! kernel; [`super::offcpu::OffCpu::prune`] reads the maps, calls [`plan`]
//! every [`EVERY`], and deletes.
//!
//! - `OFFCPU` entries whose process is gone go (their D time is folded into
//!   the summary's rows first, by the caller).
//! - A stack id goes when nothing references it: no `OFFCPU` entry that stays,
//!   no open D sleep (`OFFCPU_START`), no kernel-mutex wait (`LOCK_WAITS`), no
//!   open watched wait's user stack (`INFLIGHT`). The kernel takes a stack id
//!   a moment before it stores it in one of those maps, so an id is deleted
//!   only when it was unreferenced at the previous pass too ([`EVERY`] apart):
//!   an id caught between the two is kept.
//!
//! The work is bounded: at most [`MAX_DELETES`] deletes of each kind a pass
//! (the rest waits for the next), and reading the keys costs one syscall per
//! key of maps of at most 16,384 and 4,096 entries, every 30 s.

use plegwatch_abi::OffCpuKey;
use std::{
    collections::{HashMap, HashSet},
    time::Duration,
};

/// How often a pass runs.
pub const EVERY: Duration = Duration::from_secs(30);
/// Most deletes of each map in one pass.
pub const MAX_DELETES: usize = 1024;

/// What one pass deletes, and what it remembers for the next.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// `OFFCPU` keys of processes that are gone.
    pub offcpu: Vec<OffCpuKey>,
    /// Stack ids unreferenced now and at the previous pass.
    pub stacks: Vec<u32>,
    /// Stack ids unreferenced now (not deleted yet): the next pass's
    /// `last_unreferenced`.
    pub unreferenced: HashSet<u32>,
}

/// Chooses the deletes of one pass.
///
/// `agg` are the `OFFCPU` keys, `alive(tgid)` says whether a process still
/// exists (asked once per process), `referenced` are the stack ids held by
/// `OFFCPU_START`, `LOCK_WAITS` and `INFLIGHT` (negative ids, "no stack", are
/// ignored), `stack_ids` the ids in `STACKS`, and `last_unreferenced` the
/// previous pass's [`Plan::unreferenced`].
pub fn plan(
    agg: &[OffCpuKey],
    mut alive: impl FnMut(u32) -> bool,
    referenced: &HashSet<i32>,
    stack_ids: &[u32],
    last_unreferenced: &HashSet<u32>,
    max_deletes: usize,
) -> Plan {
    let mut live: HashMap<u32, bool> = HashMap::new();
    let mut out = Plan::default();
    let mut held: HashSet<u32> = referenced.iter().filter(|id| **id >= 0).map(|id| *id as u32).collect();
    for k in agg {
        let is_alive = *live.entry(k.tgid).or_insert_with(|| alive(k.tgid));
        if !is_alive && out.offcpu.len() < max_deletes {
            out.offcpu.push(*k);
        } else if k.stack_id >= 0 {
            held.insert(k.stack_id as u32);
        }
    }
    for id in stack_ids {
        if held.contains(id) {
            continue;
        }
        if last_unreferenced.contains(id) && out.stacks.len() < max_deletes {
            out.stacks.push(*id);
        } else {
            out.unreferenced.insert(*id);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(tgid: u32, tid: u32, stack_id: i32) -> OffCpuKey {
        OffCpuKey { tgid, tid, stack_id, _pad: 0 }
    }

    #[test]
    fn entries_of_gone_processes_go_and_live_ones_stay() {
        let agg = [key(10, 10, 1), key(10, 11, 2), key(20, 20, 3), key(30, 30, -1)];
        let mut asked = Vec::new();
        let p = plan(
            &agg,
            |t| {
                asked.push(t);
                t != 20 && t != 30
            },
            &HashSet::new(),
            &[],
            &HashSet::new(),
            100,
        );
        assert_eq!(p.offcpu, vec![key(20, 20, 3), key(30, 30, -1)]);
        asked.sort_unstable();
        assert_eq!(asked, vec![10, 20, 30], "each process asked once");
    }

    #[test]
    fn a_stack_goes_only_when_unreferenced_twice_in_a_row() {
        // 1: a live OFFCPU entry's; 2: an open D sleep's; 3: a gone process's
        // entry's; 4: referenced by nothing; 5: nothing, and not last time either.
        let agg = [key(10, 10, 1), key(20, 20, 3)];
        let referenced: HashSet<i32> = [2, -1].into();
        let ids = [1, 2, 3, 4, 5];
        let last: HashSet<u32> = [1, 2, 4].into();
        let p = plan(&agg, |t| t == 10, &referenced, &ids, &last, 100);
        assert_eq!(p.offcpu, vec![key(20, 20, 3)]);
        assert_eq!(p.stacks, vec![4]);
        let mut next: Vec<u32> = p.unreferenced.iter().copied().collect();
        next.sort_unstable();
        assert_eq!(next, vec![3, 5], "3 lost its entry now: deleted at the next pass, not this one");
        // The next pass: 3 and 5 still unreferenced, so they go.
        let p2 = plan(&[key(10, 10, 1)], |_| true, &referenced, &[1, 2, 3, 5], &p.unreferenced, 100);
        let mut gone = p2.stacks.clone();
        gone.sort_unstable();
        assert_eq!(gone, vec![3, 5]);
        assert!(p2.offcpu.is_empty() && p2.unreferenced.is_empty());
    }

    #[test]
    fn an_id_taken_between_two_passes_is_kept() {
        // Unreferenced last pass, stored in a map since: it stays.
        let last: HashSet<u32> = [7].into();
        let p = plan(&[], |_| true, &[7].into(), &[7], &last, 100);
        assert!(p.stacks.is_empty() && p.unreferenced.is_empty());
    }

    #[test]
    fn the_work_of_a_pass_is_bounded_and_kept_entries_keep_their_stacks() {
        let agg: Vec<OffCpuKey> = (0..10).map(|i| key(100 + i, 100 + i, i as i32)).collect();
        let ids: Vec<u32> = (0..10).chain(50..60).collect();
        let last: HashSet<u32> = ids.iter().copied().collect();
        let p = plan(&agg, |_| false, &HashSet::new(), &ids, &last, 4);
        assert_eq!(p.offcpu.len(), 4);
        assert_eq!(p.stacks.len(), 4);
        // The six entries past the bound still hold their stacks.
        for k in &agg[4..] {
            assert!(!p.stacks.contains(&(k.stack_id as u32)) && !p.unreferenced.contains(&(k.stack_id as u32)), "{k:?}");
        }
        // The unreferenced ids past the bound are remembered for next time.
        assert_eq!(p.stacks.len() + p.unreferenced.len(), 4 + 10);
    }
}
