//! Following a held Go lock down to what its holder waits on.
//!
//! The links, each one exact where the probes allow it:
//! 1. the holder goroutine's own kernel wait: kernel waits carry the
//!    goroutine read from TLS at `sys_enter`, so "goroutine g holds the lock"
//!    joins "goroutine g is in fdatasync" without guessing (a goroutine stays
//!    on its thread for the whole syscall);
//! 2. otherwise the shim: containerd's CRI handler on the same goroutine
//!    names the container (its request's id), and the shim with an open task
//!    call (`(*service).Update`, `Delete`) for that container is the one
//!    containerd waits on;
//! 3. in that shim, a task call whose goroutine is in a kernel wait (the
//!    rootfs umount's task_work sync), or a child process it waits for that
//!    is stopped or in D state (runc);
//! 4. failing all that, the shim with the oldest open wait among those
//!    containerd is connected to, marked `exact: false`.

use super::{
    attach::ProbedFunc,
    targets::{short, Role},
    GoOpen,
};
use crate::observe::procfs;
use serde_json::{json, Value};
use std::collections::HashMap;

/// The kernel waits open at the last scan.
pub struct KernelWaits<'a> {
    /// By thread: a small JSON object (kind, syscall, phase, waited_s).
    pub by_tid: &'a HashMap<u32, Value>,
    /// By (process, goroutine) for processes of probed Go binaries: (tid, the same object).
    pub by_g: &'a HashMap<(u32, u64), (u32, Value)>,
    /// Each process's longest open wait: (kind, start ns).
    pub longest_by_pid: &'a HashMap<u32, (&'static str, u64)>,
}

/// What a lock's holder waits on.
#[derive(Debug, Default)]
pub struct Blame {
    pub holder: Option<Value>,
    pub cause: Option<Value>,
    pub chain: Vec<Value>,
    /// The container the holder works on, from its CRI handler's request.
    pub container: Option<String>,
}

/// Everything the chain is built from.
pub struct Calls<'a> {
    pub open: &'a [GoOpen],
    pub funcs: &'a HashMap<u32, ProbedFunc>,
    pub now_ns: u64,
    /// The watch's one socket-owner table (its /proc scan is rate-limited).
    pub owners: &'a std::cell::RefCell<crate::observe::holders::SocketOwners>,
    /// `/proc` as the listing thread last saw it.
    pub procs: &'a crate::observe::proclist::ProcList,
}

impl Calls<'_> {
    fn func(&self, o: &GoOpen) -> Option<&ProbedFunc> {
        self.funcs.get(&o.func)
    }

    fn link(&self, o: &GoOpen) -> Value {
        json!({
            "pid": o.tgid,
            "comm": o.comm,
            "goroutine": format!("{:#x}", o.g),
            "function": self.func(o).map(|f| short(f.symbol)),
            "container": o.arg,
            "open_s": self.now_ns.saturating_sub(o.start_ns) as f64 / 1e9,
        })
    }
}

/// The blame for a Status lock held by the call `o`.
pub fn lock_blame(o: &GoOpen, calls: &Calls<'_>, waits: &KernelWaits<'_>) -> Blame {
    // The CRI handler running on the same goroutine names the container.
    let container = calls
        .open
        .iter()
        .filter(|c| c.tgid == o.tgid && c.g == o.g && c.arg.is_some())
        .find(|c| calls.func(c).is_some_and(|f| f.role == Role::CriHandler))
        .and_then(|c| c.arg.clone());
    let mut b = Blame { container, ..Blame::default() };
    b.chain.push(calls.link(o));
    if let Some((tid, w)) = waits.by_g.get(&(o.tgid, o.g)) {
        b.cause = Some(wait_cause(o.tgid, *tid, w, calls.func(o).map(|f| short(f.symbol)), "the lock holder's own syscall"));
        b.chain.extend(b.cause.clone());
        return b;
    }
    // The socket-peer walk (every fd of containerd, then sock_diag) is only
    // needed without a container id, or for the fallback: done at most once.
    let shims = std::cell::OnceCell::new();
    let peers = || shims.get_or_init(|| connected_shims(o.tgid, &mut calls.owners.borrow_mut()));
    // With a container id the match is exact wherever the shim is; without
    // one, only shims containerd is connected to, called after the lock was taken.
    let shim_calls: Vec<&GoOpen> = calls
        .open
        .iter()
        .filter(|c| calls.func(c).is_some_and(|f| f.role == Role::ShimTask))
        .filter(|c| match &b.container {
            Some(id) => c.arg.as_ref() == Some(id),
            None => peers().contains(&c.tgid) && c.start_ns >= o.start_ns,
        })
        .collect();
    let Some(shim) = shim_calls.iter().min_by_key(|c| c.start_ns).map(|c| c.tgid) else {
        b.holder = inferred_shim(peers(), waits);
        let pid = b.holder.as_ref().and_then(|h| h.get("pid")).and_then(Value::as_u64);
        b.cause = pid.and_then(|p| longest_cause(p as u32, waits, calls.now_ns));
        b.chain.extend(b.cause.clone());
        return b;
    };
    let mine: Vec<&GoOpen> = shim_calls.iter().copied().filter(|c| c.tgid == shim).collect();
    b.chain.extend(mine.iter().map(|c| calls.link(c)));
    let described: Vec<Value> = mine
        .iter()
        .map(|c| {
            let mut l = calls.link(c);
            l["thread_wait"] = waits.by_g.get(&(c.tgid, c.g)).map(|(_, w)| w.clone()).unwrap_or(Value::Null);
            l
        })
        .collect();
    b.holder = Some(json!({
        "kind": "shim",
        "pid": shim,
        "comm": procfs::comm(shim),
        "state": procfs::state(shim).map(String::from),
        "exact": true,
        "calls": described,
        "why": "containerd waits on this shim's reply to its task call for the same container",
    }));
    // In the shim: a task call's goroutine in a kernel wait, the longest first.
    let in_kernel = mine
        .iter()
        .filter_map(|c| waits.by_g.get(&(c.tgid, c.g)).map(|(tid, w)| (c, *tid, w)))
        .max_by(|a, b| waited(a.2).total_cmp(&waited(b.2)));
    b.cause = match in_kernel {
        Some((c, tid, w)) => Some(wait_cause(shim, tid, w, calls.func(c).map(|f| short(f.symbol)), "a shim task call's syscall")),
        None => child_cause(shim, calls.procs).or_else(|| longest_cause(shim, waits, calls.now_ns)),
    };
    b.chain.extend(b.cause.clone());
    b
}

/// Process `pid`'s longest open kernel wait, as an inexact cause.
fn longest_cause(pid: u32, waits: &KernelWaits<'_>, now_ns: u64) -> Option<Value> {
    let (kind, start) = waits.longest_by_pid.get(&pid)?;
    Some(json!({
        "kind": kind,
        "pid": pid,
        "comm": procfs::comm(pid),
        "waited_s": now_ns.saturating_sub(*start) as f64 / 1e9,
        "exact": false,
        "why": "the process's longest open kernel wait",
    }))
}

fn waited(w: &Value) -> f64 {
    w.get("waited_s").and_then(Value::as_f64).unwrap_or(0.0)
}

/// A cause that is a kernel wait of thread `tid` in process `pid`.
fn wait_cause(pid: u32, tid: u32, w: &Value, via: Option<&str>, why: &str) -> Value {
    let mut c = w.clone();
    c["pid"] = json!(pid);
    c["tid"] = json!(tid);
    c["comm"] = json!(procfs::comm(tid));
    c["via"] = json!(via);
    c["exact"] = json!(true);
    c["why"] = json!(why);
    c
}

/// A child of `pid` that is stopped or blocked (a runc the shim waits for).
fn child_cause(pid: u32, procs: &crate::observe::proclist::ProcList) -> Option<Value> {
    let kids: Vec<(u32, char)> = procs.children(pid).into_iter().filter_map(|c| Some((c, procfs::state(c)?))).collect();
    let pick =
        kids.iter().find(|(_, s)| *s == 'T' || *s == 't').or_else(|| kids.iter().find(|(_, s)| *s == 'D')).or_else(|| kids.first())?;
    let (child, state) = *pick;
    let kind = match state {
        'T' | 't' => "process_stopped",
        'D' => "process_blocked",
        _ => "child_process",
    };
    Some(json!({
        "kind": kind,
        "pid": child,
        "comm": procfs::comm(child),
        "state": state.to_string(),
        "wchan": procfs::wchan(child),
        "parent": pid,
        "exact": true,
        "why": "the shim waits for this child process to finish",
    }))
}

/// The processes whose comm is `containerd-shim*` at the other end of
/// `containerd`'s unix sockets (containerd is the client of each shim's ttrpc socket).
fn connected_shims(containerd: u32, owners: &mut crate::observe::holders::SocketOwners) -> Vec<u32> {
    let mut peers = crate::observe::holders::UnixPeers::new();
    let mut shims: Vec<u32> = Vec::new();
    for (_, inode) in procfs::socket_fds(containerd) {
        let Some(peer) = peers.peer_of(inode) else { continue };
        for pid in owners.pids_of(peer.peer_inode) {
            if pid != containerd && procfs::comm(pid).is_some_and(|c| c.starts_with("containerd-shim")) && !shims.contains(&pid) {
                shims.push(pid);
            }
        }
    }
    shims
}

/// Of `shims`, the one with the oldest open wait, else the first: used when
/// no shim task call is seen (the shim binary is not probed).
fn inferred_shim(shims: &[u32], waits: &KernelWaits<'_>) -> Option<Value> {
    let pick = shims
        .iter()
        .filter_map(|p| waits.longest_by_pid.get(p).map(|(_, start)| (*p, *start)))
        .min_by_key(|(_, start)| *start)
        .map(|(p, _)| p)
        .or_else(|| shims.first().copied())?;
    Some(json!({
        "kind": "shim",
        "pid": pick,
        "comm": procfs::comm(pick),
        "state": procfs::state(pick).map(String::from),
        "wchan": procfs::wchan(pick),
        "shims": shims,
        "exact": false,
        "why": "containerd waits on a shim's ttrpc reply; no shim task call was seen, so of the shims it is connected to, this one has the oldest open wait",
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gowatch::{
        attach::ProbedFunc,
        targets::{Arg, Role},
    };
    use std::path::PathBuf;

    /// A pid no process has, so /proc lookups find nothing.
    const NO_PID: u32 = u32::MAX - 7;

    fn funcs() -> HashMap<u32, ProbedFunc> {
        let f = |symbol, role, arg| ProbedFunc { symbol, role, arg, target: "containerd", binary: PathBuf::from("/usr/bin/containerd") };
        let container = Some(Arg { name: "container", reg: 3, off: 0, getters: &[], gogo: &[] });
        HashMap::from([
            (1, f("github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).UpdateSync", Role::StatusUpdate, None)),
            (2, f("github.com/containerd/containerd/pkg/cri/server.(*criService).UpdateContainerResources", Role::CriHandler, container)),
            (3, f("github.com/containerd/containerd/runtime/v2/runc/task.(*service).Update", Role::ShimTask, container)),
            (4, f("github.com/containerd/containerd/runtime/v2/runc/task.(*service).Delete", Role::ShimTask, container)),
        ])
    }

    fn call(g: u64, func: u32, start_ns: u64, arg: Option<&str>) -> GoOpen {
        GoOpen {
            g,
            func,
            tgid: NO_PID,
            tid: NO_PID,
            comm: "containerd".into(),
            start_ns,
            receiver: 0xc000,
            arg: arg.map(String::from),
            start: Default::default(),
        }
    }

    #[test]
    fn the_holders_own_syscall_is_the_cause() {
        let funcs = funcs();
        let open = vec![call(0x10, 2, 1_000, Some("abc123")), call(0x10, 1, 2_000, None), call(0x20, 2, 3_000, Some("other"))];
        let by_tid = HashMap::new();
        let fdatasync = json!({"kind": "sync", "syscall": "fdatasync", "phase": "syscall", "waited_s": 3.5});
        let by_g = HashMap::from([((NO_PID, 0x10), (4242, fdatasync))]);
        let longest = HashMap::new();
        let waits = KernelWaits { by_tid: &by_tid, by_g: &by_g, longest_by_pid: &longest };
        let owners = Default::default();
        let procs = Default::default();
        let calls = Calls { open: &open, funcs: &funcs, now_ns: 5_000_000_000, owners: &owners, procs: &procs };
        let b = lock_blame(&open[1], &calls, &waits);
        assert_eq!(b.container.as_deref(), Some("abc123"), "the CRI call on the same goroutine names it");
        let cause = b.cause.expect("a cause");
        assert_eq!(cause["syscall"], "fdatasync");
        assert_eq!(cause["tid"], 4242);
        assert_eq!(cause["exact"], true);
        assert_eq!(cause["via"], "container.(*statusStorage).UpdateSync");
        assert_eq!(b.chain.len(), 2, "holder, then its syscall: {:?}", b.chain);
        assert_eq!(b.chain[0]["function"], "container.(*statusStorage).UpdateSync");
    }

    #[test]
    fn the_shim_is_found_by_container_and_its_goroutine_wait_is_the_cause() {
        const SHIM: u32 = NO_PID - 1;
        let funcs = funcs();
        let shim_call = |g, func, start_ns, arg: &str| GoOpen {
            tgid: SHIM,
            tid: SHIM,
            comm: "containerd-shim".into(),
            ..call(g, func, start_ns, Some(arg))
        };
        let open = vec![
            call(0x10, 2, 1_000, Some("abc123")),
            call(0x10, 1, 2_000, None),
            shim_call(0x30, 3, 2_500, "abc123"),
            shim_call(0x40, 4, 500, "abc123"),
            shim_call(0x50, 3, 2_600, "someone-else"),
        ];
        let by_tid = HashMap::new();
        let umount = json!({"kind": "umount", "syscall": "umount2", "phase": "task_work", "waited_s": 20.0});
        let by_g = HashMap::from([((SHIM, 0x40), (777, umount))]);
        let longest = HashMap::new();
        let waits = KernelWaits { by_tid: &by_tid, by_g: &by_g, longest_by_pid: &longest };
        let owners = Default::default();
        let procs = Default::default();
        let calls = Calls { open: &open, funcs: &funcs, now_ns: 30_000_000_000, owners: &owners, procs: &procs };
        let b = lock_blame(&open[1], &calls, &waits);
        let holder = b.holder.expect("the shim");
        assert_eq!(holder["pid"], SHIM);
        assert_eq!(holder["exact"], true);
        assert_eq!(holder["calls"].as_array().map(Vec::len), Some(2), "only the container's calls: {holder}");
        let cause = b.cause.expect("a cause");
        assert_eq!(cause["kind"], "umount");
        assert_eq!(cause["tid"], 777);
        assert_eq!(cause["via"], "task.(*service).Delete");
        assert_eq!(b.chain.len(), 4, "holder, two shim calls, cause: {:?}", b.chain);
    }

    #[test]
    fn another_goroutines_wait_is_not_blamed() {
        let funcs = funcs();
        let open = vec![call(0x10, 1, 2_000, None)];
        let by_tid = HashMap::new();
        // A wait by a different goroutine of the same process: no join.
        let by_g = HashMap::from([((NO_PID, 0x99), (1, json!({"kind": "sync", "waited_s": 9.0})))]);
        let longest = HashMap::new();
        let waits = KernelWaits { by_tid: &by_tid, by_g: &by_g, longest_by_pid: &longest };
        let owners = Default::default();
        let procs = Default::default();
        let calls = Calls { open: &open, funcs: &funcs, now_ns: 5_000, owners: &owners, procs: &procs };
        let b = lock_blame(&open[0], &calls, &waits);
        assert!(b.cause.is_none() && b.holder.is_none() && b.container.is_none(), "{b:?}");
    }

    #[test]
    fn a_process_wait_cause_is_marked_inexact() {
        let by_tid = HashMap::new();
        let by_g = HashMap::new();
        let longest = HashMap::from([(NO_PID, ("umount", 1_000_000_000))]);
        let waits = KernelWaits { by_tid: &by_tid, by_g: &by_g, longest_by_pid: &longest };
        let c = longest_cause(NO_PID, &waits, 3_500_000_000).expect("a cause");
        assert_eq!(c["kind"], "umount");
        assert_eq!(c["exact"], false);
        assert!((c["waited_s"].as_f64().unwrap_or(0.0) - 2.5).abs() < 1e-9);
        assert!(longest_cause(1, &waits, 0).is_none());
    }

    /// The shim's children come from the listing thread's `/proc` listing (no
    /// walk of every process's stat per scan): a stopped child is the cause.
    #[test]
    fn a_stopped_child_is_found_in_the_listing() {
        let me = std::process::id();
        let mut child = std::process::Command::new("sleep").arg("60").spawn().expect("spawn sleep");
        let pid = child.id();
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGSTOP) };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while procfs::state(pid) != Some('T') && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut procs = crate::observe::proclist::ProcList::default();
        procs.refresh(std::time::Duration::ZERO);
        let cause = child_cause(me, &procs);
        let empty = child_cause(me, &crate::observe::proclist::ProcList::default());
        let _ = child.kill();
        let _ = child.wait();
        let cause = cause.expect("a cause");
        assert_eq!((cause["kind"].as_str(), cause["pid"].as_u64()), (Some("process_stopped"), Some(u64::from(pid))));
        assert!(empty.is_none(), "a child not in the listing was found: {empty:?}");
    }

    /// Every lookup of containerd's shims asks the watch's one socket-owner table,
    /// which walks `/proc/*/fd` at most once per its period.
    #[test]
    fn one_socket_owner_table_serves_every_lookup() {
        let (_a, _b) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        let mut owners = crate::observe::holders::SocketOwners::with(std::path::Path::new("/proc"), std::time::Duration::from_secs(3600));
        for _ in 0..3 {
            assert!(connected_shims(std::process::id(), &mut owners).is_empty(), "this test process has no shim");
        }
        assert_eq!(owners.scans(), 1, "one walk of /proc for three lookups");
    }
}
