//! The processes of this node as `/proc` lists them, each with its comm and
//! parent, read once per process rather than at every look.
//!
//! Two pollers walk `/proc` every 2 s by comm (the Go target search and the
//! off-CPU marking); on a node of 200 containers that was 1,200 reads of
//! `/proc/PID/comm` every 2 s, most of plegwatch's idle CPU. And every
//! lookup of a process's children read every `/proc/PID/stat` (this kernel
//! has no `/proc/PID/task/TID/children`), per waiter and per scan. A listing
//! of `/proc` is one `getdents64` per few hundred entries and gives each
//! entry's inode number: a process keeps its `/proc/PID` inode for its life,
//! and a new process given a recycled pid gets a new one (its dentry is
//! flushed at exit and the new one is made with a fresh inode number), so
//! (pid, inode) names one process and its `/proc/PID/stat` is read once.
//! What changes a process's comm without a new pid is `execve` (told by the
//! kernel's exec record, [`ProcList::on_exec`]) and `prctl(PR_SET_NAME)`
//! (rare for a process's main thread); what changes its parent is its
//! parent's exit (it is reparented to a subreaper or init), seen as a parent
//! no longer listed. Each entry is read again after [`COMM_TTL`] anyway.
//!
//! Hand-written: the `procfs` crate lists `/proc` but does not give the
//! entries' inode numbers.

use std::{
    collections::HashMap,
    os::unix::fs::DirEntryExt as _,
    sync::Arc,
    time::{Duration, Instant},
};

/// An entry is read again after this long even without an exec record.
pub const COMM_TTL: Duration = Duration::from_secs(30);

/// One process as listed.
#[derive(Clone)]
struct Entry {
    /// Its `/proc/PID` inode number when its comm was read.
    ino: u64,
    /// `None` when it could not be read (gone as we looked).
    comm: Option<String>,
    /// Its parent (0 when unknown).
    ppid: u32,
    read_at: Instant,
}

/// The processes of the last listing of `/proc`, with their comms. A clone is
/// cheap (the entries are shared) and is what [`super::lister::Lister`] hands out.
#[derive(Clone, Default)]
pub struct ProcList {
    entries: Arc<HashMap<u32, Entry>>,
    listed_at: Option<Instant>,
    /// `/proc/PID/stat` reads made (for tests and the curious).
    reads: u64,
}

impl ProcList {
    /// Lists `/proc` again unless the last listing is younger than `max_age`
    /// (two pollers in one scan share one listing). Reads the stat of the
    /// processes not seen before, of those reparented, and of those read
    /// longer than [`COMM_TTL`] ago or forgotten at an exec.
    pub fn refresh(&mut self, max_age: Duration) {
        if self.listed_at.is_some_and(|t| t.elapsed() < max_age) {
            return;
        }
        let Ok(dir) = std::fs::read_dir("/proc") else { return };
        let now = Instant::now();
        let listed: Vec<(u32, u64)> = dir.flatten().filter_map(|e| Some((e.file_name().to_str()?.parse::<u32>().ok()?, e.ino()))).collect();
        self.update(listed, now, |pid| {
            let s = super::procfs::stat(pid)?;
            Some((s.comm, u32::try_from(s.ppid).unwrap_or(0)))
        });
    }

    /// Takes a listing of (pid, inode), reading (comm, ppid) with `read` where needed.
    fn update(&mut self, listed: Vec<(u32, u64)>, now: Instant, mut read: impl FnMut(u32) -> Option<(String, u32)>) {
        let alive: std::collections::HashSet<u32> = listed.iter().map(|(pid, _)| *pid).collect();
        // Moved out, unless a clone handed out still shares them.
        let mut old = Arc::unwrap_or_clone(std::mem::take(&mut self.entries));
        let mut next = HashMap::with_capacity(listed.len());
        for (pid, ino) in listed {
            let entry = match old.remove(&pid) {
                Some(e)
                    if e.ino == ino && now.saturating_duration_since(e.read_at) < COMM_TTL && (e.ppid == 0 || alive.contains(&e.ppid)) =>
                {
                    e
                }
                _ => {
                    self.reads += 1;
                    let (comm, ppid) = read(pid).map_or((None, 0), |(c, p)| (Some(c), p));
                    Entry { ino, comm, ppid, read_at: now }
                }
            };
            next.insert(pid, entry);
        }
        self.entries = Arc::new(next);
        self.listed_at = Some(now);
    }

    /// Each process of the last listing with its comm (none if unreadable).
    pub fn iter(&self) -> impl Iterator<Item = (u32, Option<&str>)> {
        self.entries.iter().map(|(pid, e)| (*pid, e.comm.as_deref()))
    }

    /// Each process of the last listing with its `/proc/PID` inode number
    /// (with the pid, it names one process) and its comm.
    pub fn identified(&self) -> impl Iterator<Item = (u32, u64, Option<&str>)> {
        self.entries.iter().map(|(pid, e)| (*pid, e.ino, e.comm.as_deref()))
    }

    /// Each process of the last listing with its parent.
    pub fn parents(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.entries.iter().map(|(pid, e)| (*pid, e.ppid))
    }

    /// The processes of the last listing whose parent is `pid`.
    pub fn children(&self, pid: u32) -> Vec<u32> {
        self.entries.iter().filter(|(_, e)| e.ppid == pid).map(|(c, _)| *c).collect()
    }

    /// Whether `pid` was in the last listing.
    pub fn contains(&self, pid: u32) -> bool {
        self.entries.contains_key(&pid)
    }

    /// `pid` called `execve`: its entry is read again at the next listing.
    pub fn on_exec(&mut self, pid: u32) {
        if let Some(e) = Arc::make_mut(&mut self.entries).get_mut(&pid) {
            e.ino = u64::MAX;
        }
    }

    /// How many stats were read since the start.
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// When this listing was made (`None`: never listed).
    pub fn listed_at(&self) -> Option<Instant> {
        self.listed_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn comms(l: &ProcList) -> Vec<(u32, Option<String>)> {
        let mut v: Vec<_> = l.iter().map(|(p, c)| (p, c.map(String::from))).collect();
        v.sort();
        v
    }

    #[test]
    fn reads_each_process_once() {
        let mut l = ProcList::default();
        let t0 = Instant::now();
        let mut asked = Vec::new();
        l.update(vec![(1, 10), (2, 20)], t0, |p| {
            asked.push(p);
            Some((format!("p{p}"), 1))
        });
        l.update(vec![(1, 10), (2, 20), (3, 30)], t0 + Duration::from_secs(1), |p| {
            asked.push(p);
            Some((format!("q{p}"), 2))
        });
        asked.sort();
        assert_eq!(asked, vec![1, 2, 3]);
        assert_eq!(comms(&l), vec![(1, Some("p1".into())), (2, Some("p2".into())), (3, Some("q3".into()))]);
        assert_eq!(l.reads(), 3);
        let mut kids = l.children(1);
        kids.sort();
        assert_eq!(kids, vec![1, 2]);
        assert_eq!(l.children(2), vec![3]);
    }

    #[test]
    fn reparented_read_again() {
        let mut l = ProcList::default();
        let t0 = Instant::now();
        l.update(vec![(1, 10), (5, 50), (6, 60)], t0, |p| Some((format!("a{p}"), if p == 6 { 5 } else { 1 })));
        // 5 exited: 6 was reparented to 1, which the next listing reads.
        let mut asked = Vec::new();
        l.update(vec![(1, 10), (6, 60)], t0 + Duration::from_secs(1), |p| {
            asked.push(p);
            Some((format!("b{p}"), 1))
        });
        assert_eq!(asked, vec![6]);
        let mut kids = l.children(1);
        kids.sort();
        assert_eq!(kids, vec![1, 6]);
        let parents: HashMap<u32, u32> = l.parents().collect();
        assert_eq!(parents.get(&6), Some(&1));
    }

    #[test]
    fn recycled_pid_exec_and_age_read_again() {
        let mut l = ProcList::default();
        let t0 = Instant::now();
        l.update(vec![(1, 10), (2, 20), (3, 30)], t0, |p| Some((format!("a{p}"), 0)));
        // pid 2 exited and its pid went to a new process (new inode); pid 3 exec'd.
        l.on_exec(3);
        l.update(vec![(1, 10), (2, 21), (3, 30)], t0 + Duration::from_secs(1), |p| Some((format!("b{p}"), 0)));
        assert_eq!(comms(&l), vec![(1, Some("a1".into())), (2, Some("b2".into())), (3, Some("b3".into()))]);
        // Past the TTL every comm is read again.
        l.update(vec![(1, 10)], t0 + COMM_TTL + Duration::from_secs(1), |p| Some((format!("c{p}"), 0)));
        assert_eq!(comms(&l), vec![(1, Some("c1".into()))]);
        assert!(!l.contains(2));
    }

    #[test]
    fn lists_this_process() {
        let mut l = ProcList::default();
        l.refresh(Duration::ZERO);
        let me = std::process::id();
        assert!(l.contains(me));
        let mine = l.iter().find(|(p, _)| *p == me).and_then(|(_, c)| c.map(String::from));
        assert_eq!(mine, super::super::procfs::comm(me));
        let parent = l.parents().find(|(p, _)| *p == me).map(|(_, pp)| pp);
        assert_eq!(parent, super::super::procfs::ppid(me));
        let reads = l.reads();
        l.refresh(Duration::from_secs(60));
        assert_eq!(l.reads(), reads, "a fresh listing is reused");
    }
}
