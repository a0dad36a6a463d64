//! Waits the kernel-wait source judged over while the kernel still holds them.
//!
//! Some ends the kernel does not see: a thread that vanished without a
//! `sched_process_exit` record (that probe fell back to polling), a umount2
//! task_work tail whose thread went back to user space without a syscall, a
//! wait the startup sweep put in `INFLIGHT` just as it ended. The source
//! finds those through `/proc` and resolves them, but never deletes the
//! kernel's entry: `INFLIGHT` is keyed by tid alone, so a delete after the look
//! could remove that thread's *next* wait, begun in between. Instead the wait,
//! named by (tid, start), is marked here and hidden from every scan until the
//! kernel replaces or removes that entry; an end record the kernel sends for it
//! later is dropped.

use crate::sources::inflight::{TidStart, END_GRACE};
use std::collections::HashMap;

/// The waits judged over whose entries may still be in the kernel's map.
#[derive(Debug, Default)]
pub struct EndedWaits {
    /// Each marked wait, with the scan time at which its entry was first
    /// found gone from the map (`None` while it is still there).
    marks: HashMap<TidStart, Option<u64>>,
}

impl EndedWaits {
    /// Marks `key` over: its entry is hidden from now on.
    pub fn mark(&mut self, key: TidStart) {
        self.marks.entry(key).or_insert(None);
    }

    pub fn contains(&self, key: &TidStart) -> bool {
        self.marks.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.marks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.marks.is_empty()
    }

    /// Takes a snapshot of the kernel's map at `now_ns` and returns what is
    /// still open: every entry but the marked ones. A mark is dropped once its
    /// entry has been gone for [`END_GRACE`] (replaced by the thread's next
    /// wait, or removed): long enough for an end record the kernel sent as it
    /// removed the entry to be drained and dropped first.
    pub fn open<T>(&mut self, snapshot: Vec<T>, key: impl Fn(&T) -> TidStart, now_ns: u64) -> Vec<T> {
        let mut present = std::collections::HashSet::new();
        let open = snapshot
            .into_iter()
            .filter(|w| {
                let k = key(w);
                if self.marks.contains_key(&k) {
                    present.insert(k);
                    return false;
                }
                true
            })
            .collect();
        self.marks.retain(|k, gone_since| {
            if present.contains(k) {
                *gone_since = None;
                return true;
            }
            let since = *gone_since.get_or_insert(now_ns);
            now_ns.saturating_sub(since) < END_GRACE.as_nanos() as u64
        });
        open
    }

    /// Whether the kernel's end record of `key` is to be dropped: the wait was
    /// already resolved as over. The kernel removed its entry, so the mark goes.
    pub fn take_end(&mut self, key: &TidStart) -> bool {
        self.marks.remove(key).is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn keys(v: &[TidStart]) -> Vec<TidStart> {
        let mut v = v.to_vec();
        v.sort_unstable();
        v
    }

    #[test]
    fn a_wait_judged_over_is_hidden_but_the_threads_next_wait_is_not() {
        let mut ended = EndedWaits::default();
        // Thread 7's umount2 tail is over by /proc; thread 8 is still in fsync.
        ended.mark((7, 100));
        let open = ended.open(vec![(7, 100), (8, 50)], |k| *k, 10 * S);
        assert_eq!(keys(&open), [(8, 50)], "the marked wait is hidden while the kernel holds it");
        assert!(ended.contains(&(7, 100)));

        // Thread 7 entered its next watched syscall: the kernel replaced the
        // entry. That wait is open, and nothing deleted it.
        let open = ended.open(vec![(7, 500), (8, 50)], |k| *k, 10 * S + S / 4);
        assert_eq!(keys(&open), [(7, 500), (8, 50)]);
        assert!(ended.contains(&(7, 100)), "kept a while, for an end record on its way");
        // A mark is never matched against the new wait, however long it stays.
        let open = ended.open(vec![(7, 500), (8, 50)], |k| *k, 10 * S + S);
        assert_eq!(keys(&open), [(7, 500), (8, 50)]);

        // Gone for END_GRACE: forgotten.
        let open = ended.open(vec![(7, 500)], |k| *k, 10 * S + S / 4 + END_GRACE.as_nanos() as u64);
        assert_eq!(keys(&open), [(7, 500)]);
        assert!(ended.is_empty());
    }

    #[test]
    fn a_mark_stays_while_the_entry_does_and_its_end_record_is_dropped() {
        let mut ended = EndedWaits::default();
        ended.mark((9, 1));
        // The entry of a vanished thread may stay for good (no exit probe):
        // hidden at every scan, however long.
        for i in 0..10 {
            assert!(ended.open(vec![(9, 1)], |k| *k, i * 10 * S).is_empty());
        }
        // The kernel closes it at last (the thread's next syscall): its end
        // record is dropped, once.
        assert!(ended.take_end(&(9, 1)));
        assert!(!ended.take_end(&(9, 1)));
        assert!(!ended.take_end(&(9, 2)), "another wait of that thread is not dropped");
        assert_eq!(ended.len(), 0);
    }

    #[test]
    fn a_mark_whose_entry_one_snapshot_missed_is_kept() {
        let mut ended = EndedWaits::default();
        ended.mark((3, 30));
        // A walk of a hash map that changes under it may miss an entry.
        assert!(ended.open(Vec::<TidStart>::new(), |k| *k, S).is_empty());
        // Seen again: still hidden, and the grace restarts.
        assert!(ended.open(vec![(3, 30)], |k| *k, S + END_GRACE.as_nanos() as u64).is_empty());
        assert!(ended.open(Vec::<TidStart>::new(), |k| *k, 2 * S + END_GRACE.as_nanos() as u64).is_empty());
        assert!(ended.contains(&(3, 30)));
    }
}
