//! Where plegwatch stands among the pid and mount namespaces: its own pid as
//! the kernel reports it, and the mount table to read.
//!
//! The eBPF programs see tasks by their pid in the initial pid namespace
//! (`bpf_get_current_pid_tgid`), and `/proc` names them by their pid in the
//! pid namespace of that procfs mount. In a container `getpid()` answers in
//! the container's pid namespace, so plegwatch's self-filter takes its pid
//! from `readlink /proc/self` instead: under `hostPID: true` (the DaemonSet),
//! or in a pid namespace of its own with the host's procfs at `/proc`, that
//! is its host pid.
//!
//! A `/proc` of another pid namespace (a container without `hostPID`) shows
//! none of the host's processes (nor kernel threads, which is how it is
//! told): plegwatch refuses to start there, naming
//! the fix, rather than trace pids it cannot look up. Supporting a fresh
//! `/proc` plus the host's at another path would mean rooting every `/proc`
//! read (about forty) at that path, for a deployment the DaemonSet does not
//! use; mounting the host's procfs at `/proc` gives the same result.
//!
//! The mount table: a container has a mount namespace of its own, whose
//! table says nothing of the host's mounts (the ones containerd and kubelet
//! unmount). Pid 1 of the host's `/proc` is the host's init: its table,
//! `/proc/1/mountinfo`, is read unless its mount namespace is known to be
//! ours (then the two are the same) or it is closed to us.

use std::{path::Path, sync::OnceLock};
use thiserror::Error;

/// How plegwatch sees the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostView {
    /// plegwatch's pid as the kernel programs see it (host pid namespace).
    pub tgid: u32,
    /// plegwatch's pid in its own pid namespace (`getpid()`).
    pub ns_pid: u32,
    /// The mountinfo file that lists the host's mounts.
    pub mountinfo: &'static str,
}

/// Why plegwatch cannot see the host's processes.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum NsError {
    #[error(
        "/proc is the procfs of pid namespace {0}, not the host's: the kernel reports host pids, which this /proc cannot look up \
         (run the container with hostPID: true, or mount the host's /proc at /proc)"
    )]
    NotHostPidNs(String),
}

/// Reads the namespaces once and decides. `Err` when `/proc` is not the
/// host pid namespace's.
pub fn resolve() -> Result<HostView, NsError> {
    let link = |p: &str| std::fs::read_link(p).ok().map(|l| l.to_string_lossy().into_owned());
    let ns_pid = std::process::id();
    let kthreadd = std::fs::read_to_string("/proc/2/stat").ok();
    check_host_pid_ns(kthreadd.as_deref(), link("/proc/self/ns/pid").as_deref())?;
    let init_readable = std::fs::File::open(INIT_MOUNTINFO).is_ok();
    let view = HostView {
        tgid: tgid_from(link("/proc/self").as_deref(), ns_pid),
        ns_pid,
        mountinfo: mountinfo_path(link("/proc/self/ns/mnt").as_deref(), link("/proc/1/ns/mnt").as_deref(), init_readable),
    };
    if view.tgid != ns_pid {
        tracing::info!(host_pid = view.tgid, ns_pid, "plegwatch runs in a pid namespace of its own: it filters itself by its host pid");
    }
    tracing::debug!(mountinfo = view.mountinfo, "the mount table read");
    Ok(view)
}

/// plegwatch's pid in the host pid namespace, read once (`readlink
/// /proc/self`, else `getpid()`).
pub fn self_tgid() -> u32 {
    static TGID: OnceLock<u32> = OnceLock::new();
    *TGID.get_or_init(|| {
        let link = std::fs::read_link("/proc/self").ok();
        tgid_from(link.as_deref().and_then(Path::to_str), std::process::id())
    })
}

const SELF_MOUNTINFO: &str = "/proc/self/mountinfo";
const INIT_MOUNTINFO: &str = "/proc/1/mountinfo";

/// Our pid from the target of `/proc/self` (our pid in the procfs's pid
/// namespace); `getpid()` when the link is missing or odd.
pub fn tgid_from(proc_self: Option<&str>, getpid: u32) -> u32 {
    proc_self.and_then(|s| s.trim().parse().ok()).filter(|&p| p != 0).unwrap_or(getpid)
}

/// `PF_KTHREAD` in `/proc/PID/stat`'s flags (include/linux/sched.h).
const PF_KTHREAD: u64 = 0x0020_0000;

/// Whether a `/proc/PID/stat` line is a kernel thread's. Kernel threads live
/// in the initial pid namespace only: a `/proc` that shows one (kthreadd is
/// pid 2) is the host's. This needs no ptrace access to pid 1, whose
/// `ns/pid` link a sandboxed init may hide.
pub fn is_kernel_thread(stat: &str) -> bool {
    let Some((_, rest)) = stat.rsplit_once(") ") else { return false };
    // After the comm: state ppid pgrp session tty_nr tpgid flags.
    rest.split_whitespace().nth(6).and_then(|f| f.parse::<u64>().ok()).is_some_and(|f| f & PF_KTHREAD != 0)
}

/// Ok when `/proc/2/stat` (`pid2_stat`) is kthreadd's: this `/proc` is the
/// initial pid namespace's. `own_ns` (our `ns/pid` link) names the namespace
/// in the error.
pub fn check_host_pid_ns(pid2_stat: Option<&str>, own_ns: Option<&str>) -> Result<(), NsError> {
    match pid2_stat.is_some_and(is_kernel_thread) {
        true => Ok(()),
        false => Err(NsError::NotHostPidNs(own_ns.unwrap_or("?").to_string())),
    }
}

/// The host's mount table: `/proc/1/mountinfo` (pid 1 is the host's init,
/// once [`check_host_pid_ns`] passed) when its mount namespace is not ours,
/// or can't be compared but its table is readable; our own when the two are
/// the same namespace or pid 1's table is closed to us.
pub fn mountinfo_path(self_mnt: Option<&str>, init_mnt: Option<&str>, init_readable: bool) -> &'static str {
    match (self_mnt, init_mnt) {
        (Some(a), Some(b)) if a == b => SELF_MOUNTINFO,
        _ if init_readable => INIT_MOUNTINFO,
        _ => SELF_MOUNTINFO,
    }
}

/// The mount at `target` in process `pid`'s own mount table: a umount's
/// target is a path in the caller's mount namespace, which may not be the
/// host's.
pub fn mount_in_ns_of(pid: u32, target: &str) -> Option<crate::observe::mounts::Mount> {
    use crate::observe::mounts::{parse_mountinfo, MountTable};
    let text = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).ok()?;
    let mut table = MountTable::default();
    table.update(parse_mountinfo(&text), std::time::Instant::now());
    table.by_mount_point(target).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pid_comes_from_proc_self_when_it_names_one() {
        assert_eq!(tgid_from(Some("48211"), 1), 48211, "own pid ns, host /proc: the host pid");
        assert_eq!(tgid_from(Some("48211"), 48211), 48211, "hostPID: both agree");
        assert_eq!(tgid_from(None, 7), 7, "no link: getpid");
        assert_eq!(tgid_from(Some("self"), 7), 7, "odd link: getpid");
        assert_eq!(tgid_from(Some("0"), 7), 7);
        assert_eq!(self_tgid(), std::process::id(), "on the host, as this test runs");
    }

    #[test]
    fn only_a_proc_showing_kernel_threads_is_the_hosts() {
        let kthreadd = "2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 0 0 0";
        let shell = "2 (sh) S 1 2 1 34816 2 4194304 200 0 0 0 0 0 0 0 20 0 1 0 120 0 0";
        let odd = "2 (a) b) S 0 0 0 0 -1 2129984 0";
        assert!(is_kernel_thread(kthreadd));
        assert!(!is_kernel_thread(shell), "pid 2 of a container's /proc is a process");
        assert!(is_kernel_thread(odd), "a comm with ') ' in it");
        assert!(!is_kernel_thread("garbage"));
        assert_eq!(check_host_pid_ns(Some(kthreadd), None), Ok(()));
        let err = check_host_pid_ns(Some(shell), Some("pid:[4026532300]")).unwrap_err();
        assert!(err.to_string().contains("hostPID: true"), "{err}");
        assert!(err.to_string().contains("pid:[4026532300]"), "{err}");
        assert!(check_host_pid_ns(None, None).is_err(), "no pid 2 at all: a container");
        let real = std::fs::read_to_string("/proc/2/stat").unwrap();
        assert!(is_kernel_thread(&real), "this test runs on the host: {real}");
    }

    #[test]
    fn a_container_reads_the_host_inits_mount_table() {
        assert_eq!(mountinfo_path(Some("mnt:[1]"), Some("mnt:[1]"), true), SELF_MOUNTINFO, "same namespace");
        assert_eq!(mountinfo_path(Some("mnt:[2]"), Some("mnt:[1]"), true), INIT_MOUNTINFO, "a container of its own");
        assert_eq!(mountinfo_path(Some("mnt:[2]"), None, true), INIT_MOUNTINFO, "pid 1's link hidden, its table open");
        assert_eq!(mountinfo_path(Some("mnt:[2]"), None, false), SELF_MOUNTINFO, "pid 1 closed to us");
        assert_eq!(mountinfo_path(None, None, false), SELF_MOUNTINFO);
    }

    #[test]
    fn a_mount_is_found_in_a_process_own_table() {
        let me = std::process::id();
        assert_eq!(mount_in_ns_of(me, "/").map(|m| m.mount_point), Some("/".into()));
        assert!(mount_in_ns_of(me, "/no/such/mount/point").is_none());
    }
}
