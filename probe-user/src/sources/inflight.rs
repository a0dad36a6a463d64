//! The registry of reported waits: which open waits crossed which level, and
//! when they ended.
//!
//! The kernel keeps every open wait in its `INFLIGHT` map; plegwatch shows
//! this registry a snapshot of that map at each scan, and the kernel's end
//! records as they arrive. The registry decides what to print. It is pure
//! logic, with time passed in, so it is tested without a kernel.

use crate::graph::model::{OpenWait, StartTiming, WaitKey as WaitGraphKey, Who};
use crate::levels::{Level, Thresholds};
use plegwatch_abi::{Wait, WaitEnd, WAIT_BEFORE_ATTACH};
use std::{collections::HashMap, time::Duration};

/// A wait is named by its thread and its start time (a thread has one open wait).
pub type TidStart = (u32, u64);

/// What the registry knows of a wait, from the kernel's map or its end record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitInfo {
    pub tgid: u32,
    pub tid: u32,
    pub comm: String,
    pub nr: u32,
    pub slot: u32,
    pub start_ns: u64,
    /// Non-zero once the syscall returned and the wait went on in task_work.
    pub sys_exit_ns: u64,
    pub arg0: u64,
    /// umount2's target path.
    pub path: String,
    /// Found by the startup sweep: `start_ns` is a lower bound of its age.
    pub before_attach: bool,
    /// The goroutine that made it (Go targets only; 0 when unknown).
    pub g: u64,
    /// Its user stack's id in the off-CPU probe's stack map, or -1.
    pub user_stack: i32,
}

/// A NUL-terminated byte field as text.
pub(crate) fn cstr(b: &[u8]) -> String {
    let end = b.iter().position(|&c| c == 0).unwrap_or(b.len());
    String::from_utf8_lossy(&b[..end]).into_owned()
}

impl From<&Wait> for WaitInfo {
    fn from(w: &Wait) -> Self {
        WaitInfo {
            tgid: w.tgid,
            tid: w.tid,
            // Empty until the wait first sleeps (the kernel takes it then).
            comm: if w.comm[0] == 0 { crate::observe::procfs::comm(w.tid).unwrap_or_default() } else { cstr(&w.comm) },
            nr: w.nr,
            slot: w.slot,
            start_ns: w.start_ns,
            sys_exit_ns: w.sys_exit_ns,
            arg0: w.arg0,
            path: cstr(&w.path),
            before_attach: w.flags & WAIT_BEFORE_ATTACH != 0,
            g: w.g,
            user_stack: w.user_stack,
        }
    }
}

impl From<&WaitEnd> for WaitInfo {
    fn from(e: &WaitEnd) -> Self {
        WaitInfo {
            tgid: e.tgid,
            tid: e.tid,
            comm: cstr(&e.comm),
            nr: e.nr,
            slot: e.slot,
            start_ns: e.start_ns,
            sys_exit_ns: e.sys_exit_ns,
            arg0: 0,
            path: String::new(),
            before_attach: e.flags & WAIT_BEFORE_ATTACH != 0,
            g: 0,
            user_stack: -1,
        }
    }
}

impl WaitInfo {
    pub fn key(&self) -> TidStart {
        (self.tid, self.start_ns)
    }

    /// This wait as a node of the wait-for graph.
    pub fn open_wait(&self) -> OpenWait {
        let watched = crate::syscalls::by_slot(self.slot);
        let name = watched.map(|w| w.name).unwrap_or("sync");
        // The kernel keeps PATH_LEN - 1 bytes of a path: mark one it cut.
        let path = if self.path.len() + 1 >= plegwatch_abi::PATH_LEN { format!("{}…", self.path) } else { self.path.clone() };
        let what = match (watched.map(|w| w.arg0), self.sys_exit_ns != 0) {
            (Some(crate::syscalls::Arg0::Path), true) if path.is_empty() => {
                format!("{name} (task_work after the syscall returned; found there, its target already unmounted)")
            }
            (Some(crate::syscalls::Arg0::Path), true) => format!("{name} {path} (task_work after the syscall returned)"),
            (Some(crate::syscalls::Arg0::Path), false) => format!("{name} {path}"),
            (Some(crate::syscalls::Arg0::Fd), _) => format!("{name} fd {}", self.arg0),
            _ => name.to_string(),
        };
        OpenWait {
            key: Item::wait_key(self),
            who: Who { pid: self.tgid, tid: self.tid, comm: self.comm.clone(), goroutine: (self.g != 0).then_some(self.g) },
            kind: watched.map(|w| w.kind).unwrap_or(crate::syscalls::WaitKind::Sync),
            what,
            start_ns: self.start_ns,
            start: if self.before_attach { StartTiming::LowerBound } else { StartTiming::Exact },
            pleg_path: false,
        }
    }
}

/// Something that can be open for too long: a syscall wait, a netlink request,
/// a D-Bus call. The [`Registry`] needs only this of it.
pub trait Item: Clone {
    type Key: Copy + Eq + std::hash::Hash + std::fmt::Debug;
    fn key(&self) -> Self::Key;
    fn tgid(&self) -> u32;
    fn tid(&self) -> u32;
    fn comm(&self) -> &str;
    /// CLOCK_MONOTONIC ns when it started (a lower bound when found late).
    fn start_ns(&self) -> u64;
    /// Takes what changed since it was first seen.
    fn refresh(&mut self, newer: &Self);
    /// Its name in the wait-for graph (and so its id).
    fn wait_key(&self) -> WaitGraphKey;
}

impl Item for WaitInfo {
    type Key = TidStart;
    fn key(&self) -> TidStart {
        WaitInfo::key(self)
    }
    fn tgid(&self) -> u32 {
        self.tgid
    }
    fn tid(&self) -> u32 {
        self.tid
    }
    fn comm(&self) -> &str {
        &self.comm
    }
    fn start_ns(&self) -> u64 {
        self.start_ns
    }
    fn refresh(&mut self, newer: &Self) {
        self.sys_exit_ns = newer.sys_exit_ns;
    }
    fn wait_key(&self) -> WaitGraphKey {
        WaitGraphKey::Kernel { tid: self.tid, start_ns: self.start_ns }
    }
}

/// Which waits to report: `--pid` and `--comm`. Empty lists match everything.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Matches a wait's process id or thread id.
    pub pids: Vec<u32>,
    /// Exact comm, or a prefix when it ends in `*` (`containerd-shim*`).
    pub comms: Vec<String>,
}

impl Filter {
    pub fn matches<T: Item>(&self, w: &T) -> bool {
        self.matches_who(w.tgid(), w.tid(), w.comm())
    }

    /// The same test on a graph node's waiter.
    pub fn matches_wait(&self, w: &OpenWait) -> bool {
        self.matches_who(w.who.pid, w.who.tid, &w.who.comm)
    }

    fn matches_who(&self, pid: u32, tid: u32, comm: &str) -> bool {
        let pid_ok = self.pids.is_empty() || self.pids.contains(&pid) || self.pids.contains(&tid);
        let comm_ok = self.comms.is_empty()
            || self.comms.iter().any(|c| match c.strip_suffix('*') {
                Some(prefix) => comm.starts_with(prefix),
                None => comm == c,
            });
        pid_ok && comm_ok
    }
}

/// A wait that crossed `--warn`.
#[derive(Clone, Debug)]
pub struct Tracked<T: Item = WaitInfo> {
    pub id: u64,
    pub info: T,
    pub reported: Level,
    missing_since_ns: Option<u64>,
}

/// What the source must report.
#[derive(Clone, Debug, PartialEq)]
pub enum Action<K = TidStart> {
    /// The wait reached `level` after `waited`.
    Report { key: K, level: Level, waited: Duration },
    /// The wait ended after `waited`; `exact` when timed by the kernel.
    Resolve { key: K, waited: Duration, exact: bool },
}

/// How long a reported wait may be missing from the kernel map before it is
/// resolved without an end record (whose loss the kernel counts).
pub const END_GRACE: Duration = Duration::from_secs(2);

/// How many resolved waits [`Registry`] remembers.
const DONE_MEMORY: usize = 1024;

/// The reported waits.
#[derive(Debug)]
pub struct Registry<T: Item = WaitInfo> {
    thresholds: Thresholds,
    filter: Filter,
    tracked: HashMap<T::Key, Tracked<T>>,
    /// Waits resolved lately, so that a late end record can't report one twice.
    done: std::collections::VecDeque<T::Key>,
    stalls: u64,
    resolved: u64,
}

impl<T: Item> Registry<T> {
    pub fn new(thresholds: Thresholds, filter: Filter) -> Self {
        Registry { thresholds, filter, tracked: HashMap::new(), done: Default::default(), stalls: 0, resolved: 0 }
    }

    pub fn get(&self, key: &T::Key) -> Option<&Tracked<T>> {
        self.tracked.get(key)
    }

    /// Removes a wait after its resolution was printed.
    pub fn forget(&mut self, key: &T::Key) -> Option<Tracked<T>> {
        let t = self.tracked.remove(key)?;
        if self.done.len() >= DONE_MEMORY {
            self.done.pop_front();
        }
        self.done.push_back(*key);
        Some(t)
    }

    pub fn open(&self) -> impl Iterator<Item = &Tracked<T>> {
        self.tracked.values()
    }

    /// Forgets a wait; returns its `resolved` event, as `kind`, for the caller to emit.
    pub fn resolve(
        &mut self,
        key: &T::Key,
        waited: Duration,
        exact: bool,
        kind: crate::syscalls::WaitKind,
    ) -> Option<crate::events::Resolved> {
        let t = self.forget(key)?;
        Some(crate::events::Resolved {
            id: t.id,
            kind,
            pid: t.info.tgid(),
            tid: t.info.tid(),
            waited_s: waited.as_secs_f64(),
            comm: t.info.comm().to_string(),
            timing: if exact { "exact" } else { "approximate" },
        })
    }

    /// (stall lines decided, resolutions decided).
    pub fn counts(&self) -> (u64, u64) {
        (self.stalls, self.resolved)
    }

    fn track(&mut self, info: T, level: Level) -> &mut Tracked<T> {
        // The same id as the wait has in the incidents that list it.
        let id = crate::graph::ids::id_of(info.wait_key());
        self.tracked.entry(info.key()).or_insert(Tracked { id, info, reported: level, missing_since_ns: None })
    }

    /// Looks at a snapshot of the kernel's open waits taken at `now_ns`
    /// (CLOCK_MONOTONIC, as `bpf_ktime_get_ns`).
    pub fn scan<'a>(&mut self, open: impl IntoIterator<Item = &'a T>, now_ns: u64) -> Vec<Action<T::Key>>
    where
        T: 'a,
    {
        let mut actions = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for w in open {
            if !self.filter.matches(w) {
                continue;
            }
            let key = w.key();
            seen.insert(key);
            let waited = Duration::from_nanos(now_ns.saturating_sub(w.start_ns()));
            let Some(level) = self.thresholds.level(waited) else {
                continue;
            };
            match self.tracked.get_mut(&key) {
                Some(t) => {
                    t.info.refresh(w);
                    t.missing_since_ns = None;
                    if level > t.reported {
                        t.reported = level;
                        actions.push(Action::Report { key, level, waited });
                    }
                }
                None => {
                    self.track(w.clone(), level);
                    actions.push(Action::Report { key, level, waited });
                }
            }
        }
        for (key, t) in self.tracked.iter_mut() {
            if seen.contains(key) {
                continue;
            }
            match t.missing_since_ns {
                None => t.missing_since_ns = Some(now_ns),
                Some(since) if now_ns.saturating_sub(since) >= END_GRACE.as_nanos() as u64 => {
                    let waited = Duration::from_nanos(since.saturating_sub(t.info.start_ns()));
                    actions.push(Action::Resolve { key: *key, waited, exact: false });
                }
                Some(_) => {}
            }
        }
        self.count(&actions);
        actions
    }

    /// Takes an exact record of a wait that ended at `end_ns`.
    /// Whether [`Registry::end`] could do anything with an end of `key` after
    /// `waited`: it is tracked, or long enough to be reported late. Lets a
    /// caller skip building the item for the many short calls.
    pub fn wants_end(&self, key: &T::Key, waited: Duration) -> bool {
        self.tracked.contains_key(key) || self.done.contains(key) || self.thresholds.level(waited).is_some()
    }

    pub fn end(&mut self, info: T, end_ns: u64) -> Vec<Action<T::Key>> {
        let key = info.key();
        let waited = Duration::from_nanos(end_ns.saturating_sub(info.start_ns()));
        let mut actions = Vec::new();
        if self.done.contains(&key) {
            // Already resolved by other means (see `vanished`).
        } else if self.tracked.contains_key(&key) {
            actions.push(Action::Resolve { key, waited, exact: true });
        } else if self.filter.matches(&info) {
            // It crossed a level between two scans: report it late, then resolve.
            if let Some(level) = self.thresholds.level(waited) {
                self.track(info, level);
                actions.push(Action::Report { key, level, waited });
                actions.push(Action::Resolve { key, waited, exact: true });
            }
        }
        self.count(&actions);
        actions
    }

    /// A wait the source saw end by other means (its thread is gone, or the
    /// task_work tail is over by `/proc`) at `end_ns`.
    pub fn vanished(&mut self, key: T::Key, end_ns: u64) -> Option<Action<T::Key>> {
        let start = self.tracked.get(&key)?.info.start_ns();
        let a = Action::Resolve { key, waited: Duration::from_nanos(end_ns.saturating_sub(start)), exact: false };
        self.count(std::slice::from_ref(&a));
        Some(a)
    }

    fn count(&mut self, actions: &[Action<T::Key>]) {
        for a in actions {
            match a {
                Action::Report { .. } => self.stalls += 1,
                Action::Resolve { .. } => self.resolved += 1,
            }
        }
    }
}

/// A line about `item` with who, when and what only: no holder, cause,
/// chain or stacks (callers add those with struct update syntax).
pub fn stall_line<T: Item>(
    item: &T,
    level: Level,
    id: u64,
    kind: crate::syscalls::WaitKind,
    waited: std::time::Duration,
    detail: serde_json::Value,
) -> crate::events::Stall {
    crate::events::Stall {
        pod: Default::default(),
        level,
        id,
        kind,
        pid: item.tgid(),
        tid: item.tid(),
        comm: item.comm().to_string(),
        waited_s: waited.as_secs_f64(),
        started_at: humantime::format_rfc3339_millis(crate::clock::wall_of(item.start_ns())).to_string(),
        budget_used: crate::levels::budget_used(waited),
        started_before_attach: false,
        detail,
        holder: None,
        cause: None,
        chain: Vec::new(),
        wait: Some(item.wait_key()),
        kernel_stack: Vec::new(),
        user_stack: Vec::new(),
        user_stack_id: -1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn wait(tid: u32, start_ns: u64, comm: &str) -> WaitInfo {
        WaitInfo {
            tgid: tid,
            tid,
            comm: comm.into(),
            nr: 166,
            slot: 0,
            start_ns,
            sys_exit_ns: 0,
            arg0: 0,
            path: "/mnt".into(),
            before_attach: false,
            g: 0,
            user_stack: -1,
        }
    }

    fn end(w: &WaitInfo, end_ns: u64) -> WaitEnd {
        let mut comm = [0u8; 16];
        comm[..w.comm.len()].copy_from_slice(w.comm.as_bytes());
        WaitEnd {
            header: plegwatch_abi::EventHeader { kind: 1, _pad: 0 },
            start_ns: w.start_ns,
            sys_exit_ns: 0,
            end_ns,
            ret: 0,
            tgid: w.tgid,
            tid: w.tid,
            nr: w.nr,
            slot: w.slot,
            reason: 0,
            flags: 0,
            comm,
        }
    }

    fn reg() -> Registry<WaitInfo> {
        Registry::new(
            Thresholds::new(Duration::from_secs(2), Duration::from_secs(10), Duration::from_secs(150)).unwrap(),
            Filter::default(),
        )
    }

    #[test]
    fn only_tracked_or_long_ends_are_wanted() {
        let mut r = reg();
        let w = wait(5, 100 * S, "umount");
        let key = w.key();
        assert!(!r.wants_end(&key, Duration::from_millis(5)), "a short untracked call");
        assert!(r.wants_end(&key, Duration::from_secs(3)), "long enough to report late");
        let _ = r.scan([&w], 103 * S);
        assert!(r.wants_end(&key, Duration::from_millis(5)), "tracked: its end resolves it");
    }

    #[test]
    fn reports_each_level_once_then_resolves_exactly() {
        let mut r = reg();
        let w = wait(5, 100 * S, "umount");
        assert!(r.scan([&w], 101 * S).is_empty());
        let a = r.scan([&w], 102 * S + 1);
        assert!(matches!(a[..], [Action::Report { level: Level::Warn, .. }]));
        assert!(r.scan([&w], 103 * S).is_empty(), "no repeat at the same level");
        let a = r.scan([&w], 110 * S);
        assert!(matches!(a[..], [Action::Report { level: Level::Critical, .. }]));
        let a = r.end(WaitInfo::from(&end(&w, 111 * S + S / 2)), 111 * S + S / 2);
        assert_eq!(a, vec![Action::Resolve { key: w.key(), waited: Duration::from_millis(11_500), exact: true }]);
        assert_eq!(r.counts(), (2, 1));
    }

    #[test]
    fn short_waits_are_ignored_and_late_ones_reported() {
        let mut r = reg();
        let w = wait(6, 0, "dd");
        assert!(r.end(WaitInfo::from(&end(&w, S)), S).is_empty());
        let w2 = wait(7, 10 * S, "dd");
        let a = r.end(WaitInfo::from(&end(&w2, 13 * S)), 13 * S);
        assert!(matches!(a[..], [Action::Report { level: Level::Warn, .. }, Action::Resolve { exact: true, .. }]));
    }

    #[test]
    fn missing_end_record_resolves_after_grace() {
        let mut r = reg();
        let w = wait(8, 0, "umount");
        r.scan([&w], 3 * S);
        assert!(r.scan(std::iter::empty(), 4 * S).is_empty());
        assert!(r.scan(std::iter::empty(), 5 * S).is_empty());
        let a = r.scan(std::iter::empty(), 6 * S);
        assert_eq!(a, vec![Action::Resolve { key: w.key(), waited: Duration::from_secs(4), exact: false }]);
    }

    #[test]
    fn a_wait_is_resolved_once() {
        let mut r = reg();
        let w = wait(9, 0, "umount");
        r.scan([&w], 3 * S);
        let a = r.vanished(w.key(), 4 * S).unwrap();
        assert_eq!(a, Action::Resolve { key: w.key(), waited: Duration::from_secs(4), exact: false });
        r.forget(&w.key());
        assert!(r.end(WaitInfo::from(&end(&w, 4 * S)), 4 * S).is_empty(), "the late exact record must not report it again");
    }

    #[test]
    fn filters_by_pid_and_comm_glob() {
        let f = Filter { pids: vec![], comms: vec!["containerd-shim*".into()] };
        assert!(f.matches(&wait(1, 0, "containerd-shim")));
        assert!(!f.matches(&wait(1, 0, "containerd")));
        let f = Filter { pids: vec![42], comms: vec![] };
        assert!(f.matches(&wait(42, 0, "x")));
        assert!(!f.matches(&wait(43, 0, "x")));
        let mut r = Registry::new(Thresholds::default(), Filter { pids: vec![1], comms: vec![] });
        assert!(r.scan([&wait(2, 0, "x")], 500 * S).is_empty());
    }

    #[test]
    fn parses_kernel_values() {
        let mut w = Wait {
            start_ns: 1,
            sys_exit_ns: 2,
            arg0: 3,
            arg1: 4,
            ret: 0,
            tgid: 5,
            tid: 6,
            nr: 166,
            slot: 0,
            flags: WAIT_BEFORE_ATTACH,
            user_stack: -1,
            // No fsbase from /proc: swept waits carry no goroutine.
            g: 0,
            comm: [0; 16],
            path: [0; plegwatch_abi::PATH_LEN],
        };
        w.comm[..6].copy_from_slice(b"umount");
        w.path[..4].copy_from_slice(b"/mnt");
        let i = WaitInfo::from(&w);
        assert_eq!((i.comm.as_str(), i.path.as_str(), i.key()), ("umount", "/mnt", (6, 1)));
        assert!(i.before_attach);
    }
}
