//! What `/proc` says about a thread, for free: its kernel stack, its current
//! syscall, its state and wait channel, its open files.
//!
//! Every reader returns `None` when the thread is gone or the file can't be read;
//! a thread that exits while we look is normal, not an error.

use std::{fs, os::unix::fs::MetadataExt as _, path::PathBuf};

/// The kernel stack of a thread, innermost first, as bare function names
/// (`folio_wait_bit`, not `[<0>] folio_wait_bit+0x13c/0x270`). Needs root.
pub fn kernel_stack(tid: u32) -> Option<Vec<String>> {
    let text = fs::read_to_string(format!("/proc/{tid}/stack")).ok()?;
    Some(parse_kernel_stack(&text))
}

/// Parses the text of `/proc/TID/stack`.
pub fn parse_kernel_stack(text: &str) -> Vec<String> {
    text.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = match line.find("] ") {
                Some(i) if line.starts_with('[') => &line[i + 2..],
                _ => line,
            };
            let name = rest.split(['+', ' ']).next().unwrap_or("").trim();
            (!name.is_empty()).then(|| name.to_string())
        })
        .collect()
}

/// What `/proc/TID/syscall` says a thread is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SyscallState {
    /// Running (in user space, or in the kernel but not blocked in a syscall).
    Running,
    /// Blocked in syscall `nr` with these arguments.
    In { nr: i64, args: [u64; 6] },
    /// Blocked, but not in a syscall (`-1`: e.g. a page fault or task_work).
    Blocked,
}

/// Reads `/proc/TID/syscall`.
pub fn syscall(tid: u32) -> Option<SyscallState> {
    parse_syscall(&fs::read_to_string(format!("/proc/{tid}/syscall")).ok()?)
}

/// Parses the text of `/proc/TID/syscall`.
pub fn parse_syscall(text: &str) -> Option<SyscallState> {
    let first = text.split_whitespace().next()?;
    if first == "running" {
        return Some(SyscallState::Running);
    }
    match first.parse::<i64>().ok()? {
        -1 => Some(SyscallState::Blocked),
        nr => {
            let mut args = [0u64; 6];
            for (a, w) in args.iter_mut().zip(text.split_whitespace().skip(1)) {
                *a = u64::from_str_radix(w.trim_start_matches("0x"), 16).unwrap_or(0);
            }
            Some(SyscallState::In { nr, args })
        }
    }
}

/// When a thread last started running, in ms of the scheduler's task clock
/// (`se.exec_start` in `/proc/TID/sched`, present with CONFIG_SCHED_DEBUG).
pub fn exec_start_ms(tid: u32) -> Option<f64> {
    parse_exec_start(&fs::read_to_string(format!("/proc/{tid}/sched")).ok()?)
}

/// Parses `se.exec_start` out of `/proc/TID/sched`.
pub fn parse_exec_start(text: &str) -> Option<f64> {
    let line = text.lines().find(|l| l.trim_start().starts_with("se.exec_start"))?;
    line.split(':').nth(1)?.trim().parse().ok()
}

/// Reads a NUL-terminated string of at most `max` bytes at `addr` in the
/// address space of process `pid` (root only).
pub fn read_user_string(pid: u32, addr: u64, max: usize) -> Option<String> {
    use std::os::unix::fs::FileExt as _;
    let mem = fs::File::open(format!("/proc/{pid}/mem")).ok()?;
    let mut buf = vec![0u8; max];
    let n = mem.read_at(&mut buf, addr).ok()?;
    let end = buf[..n].iter().position(|&c| c == 0)?;
    Some(String::from_utf8_lossy(&buf[..end]).into_owned())
}

/// A thread's `/proc/TID/stat` (threads are reachable as `/proc/TID` too), parsed by
/// the procfs crate (one open and read: no `/proc/TID` directory handle first).
pub(crate) fn stat(tid: u32) -> Option<::procfs::process::Stat> {
    use ::procfs::FromRead as _;
    ::procfs::process::Stat::from_file(format!("/proc/{tid}/stat")).ok()
}

/// A thread's scheduler state letter (`R`, `S`, `D`, `T`, `Z`, ...) from `/proc/TID/stat`.
pub fn state(tid: u32) -> Option<char> {
    Some(stat(tid)?.state)
}

/// What `/proc` says of a thread's CPU use so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuUse {
    /// `voluntary_ctxt_switches` (`/proc/TID/status`): how often it slept.
    pub voluntary: u64,
    /// `utime` (`/proc/TID/stat`, clock ticks): its time in user space.
    pub user_ticks: u64,
}

/// A thread's CPU use so far: how often it slept (`voluntary_ctxt_switches` in
/// `/proc/TID/status`) and its user time (`utime` in `/proc/TID/stat`).
pub fn cpu_use(tid: u32) -> Option<CpuUse> {
    use ::procfs::FromRead as _;
    let voluntary = ::procfs::process::Status::from_file(format!("/proc/{tid}/status")).ok()?.voluntary_ctxt_switches?;
    Some(CpuUse { voluntary, user_ticks: stat(tid)?.utime })
}

/// The CPU a thread last ran on (`processor` in `/proc/TID/stat`).
pub fn last_cpu(tid: u32) -> Option<u32> {
    u32::try_from(stat(tid)?.processor?).ok()
}

/// plegwatch's own CPU time (user + system, seconds) and resident set (bytes).
pub fn self_usage() -> Option<(f64, u64)> {
    let stat = ::procfs::process::Process::myself().ok()?.stat().ok()?;
    let tps = ::procfs::ticks_per_second() as f64;
    let cpu = (stat.utime + stat.stime) as f64 / tps.max(1.0);
    Some((cpu, stat.rss.saturating_mul(::procfs::page_size())))
}

/// A process's parent pid.
pub fn ppid(pid: u32) -> Option<u32> {
    u32::try_from(stat(pid)?.ppid).ok()
}

/// When a process started: `starttime`, in clock ticks since boot.
pub fn start_ticks(pid: u32) -> Option<u64> {
    Some(stat(pid)?.starttime)
}

/// How long ago thread `tid` was created (seconds): an upper bound of the age of
/// any wait it is in. From `starttime` (clock ticks since boot) and `/proc/uptime`.
pub fn thread_age_s(tid: u32) -> Option<f64> {
    let start = start_ticks(tid)? as f64 / (::procfs::ticks_per_second() as f64).max(1.0);
    let uptime = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse::<f64>().ok()?;
    Some((uptime - start).max(0.0))
}

/// The kernel function a thread sleeps in, from `/proc/TID/wchan` ("0" means none).
pub fn wchan(tid: u32) -> Option<String> {
    let w = ::procfs::process::Process::new(i32::try_from(tid).ok()?).ok()?.wchan().ok()?;
    let w = w.trim();
    (!w.is_empty() && w != "0").then(|| w.to_string())
}

/// A process's or thread's comm.
pub fn comm(tid: u32) -> Option<String> {
    Some(fs::read_to_string(format!("/proc/{tid}/comm")).ok()?.trim_end().to_string())
}

/// Whether a thread still exists (threads are reachable as `/proc/TID` even
/// though only thread-group leaders are listed).
pub fn thread_exists(tid: u32) -> bool {
    fs::metadata(format!("/proc/{tid}/stat")).is_ok()
}

/// An open file of a process: its path and the device (major, minor) it is on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpenFile {
    pub path: String,
    pub dev: (u32, u32),
}

/// Resolves `fd` of process `pid` (read through the thread's own table, so
/// that it works for any thread).
pub fn open_file(tid: u32, fd: u64) -> Option<OpenFile> {
    let link = PathBuf::from(format!("/proc/{tid}/fd/{fd}"));
    let path = fs::read_link(&link).ok()?.to_string_lossy().into_owned();
    let meta = fs::metadata(&link).ok()?;
    let dev = meta.dev();
    Some(OpenFile { path, dev: (libc::major(dev), libc::minor(dev)) })
}

/// One line of `/proc/PID/net/netlink` (see net/netlink/af_netlink.c).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetlinkSock {
    pub protocol: u32,
    pub portid: u32,
    /// The first 32 multicast groups it joined; non-zero for a listener.
    pub groups: u32,
    pub inode: u64,
}

/// The netlink sockets of the network namespace `pid` is in.
pub fn netlink_sockets(pid: u32) -> Vec<NetlinkSock> {
    fs::read_to_string(format!("/proc/{pid}/net/netlink")).map(|t| parse_net_netlink(&t)).unwrap_or_default()
}

/// Parses `/proc/net/netlink`: `sk Eth Pid Groups Rmem Wmem Dump Locks Drops Inode`.
pub fn parse_net_netlink(text: &str) -> Vec<NetlinkSock> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some(NetlinkSock {
                protocol: f.get(1)?.parse().ok()?,
                portid: f.get(2)?.parse().ok()?,
                groups: u32::from_str_radix(f.get(3)?, 16).ok()?,
                inode: f.get(9)?.parse().ok()?,
            })
        })
        .collect()
}

/// The socket inodes among the fds of `pid`: (fd, inode).
pub fn socket_fds(pid: u32) -> Vec<(u32, u64)> {
    use ::procfs::process::{FDTarget, Process};
    let Some(fds) = i32::try_from(pid).ok().and_then(|p| Process::new(p).ok()).and_then(|p| p.fd().ok()) else { return Vec::new() };
    fds.flatten()
        .filter_map(|f| match f.target {
            FDTarget::Socket(inode) => Some((u32::try_from(f.fd).ok()?, inode)),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_stack_names_only() {
        let text = "[<0>] folio_wait_bit+0x13c/0x270\n[<0>] folio_wait_writeback+0x2b/0x80\n[<0>] do_syscall_64+0x7d/0x1a0\n[<0>] entry_SYSCALL_64_after_hwframe+0x76/0x7e\n";
        assert_eq!(parse_kernel_stack(text), ["folio_wait_bit", "folio_wait_writeback", "do_syscall_64", "entry_SYSCALL_64_after_hwframe"]);
        assert!(parse_kernel_stack("").is_empty());
    }

    #[test]
    fn syscall_states() {
        assert_eq!(
            parse_syscall("166 0x55f2431ac2e0 0x2 0x0 0x0 0x0 0x0 0x7ffd 0x7f\n"),
            Some(SyscallState::In { nr: 166, args: [0x55f2431ac2e0, 2, 0, 0, 0, 0] })
        );
        assert_eq!(parse_syscall("running\n"), Some(SyscallState::Running));
        assert_eq!(parse_syscall("-1 0x7ffd 0x7f\n"), Some(SyscallState::Blocked));
        assert_eq!(parse_syscall(""), None);
        assert_eq!(parse_syscall("garbage"), None);
    }

    #[test]
    fn net_netlink_lines() {
        let text = "sk               Eth Pid        Groups   Rmem     Wmem     Dump  Locks    Drops    Inode\n\
ffff8881012f0000 0   1234       00000551 0        0        0     2        0        40123\n\
ffff8881012f1000 16  0          00000000 0        0        0     2        0        7\n";
        let s = parse_net_netlink(text);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0], NetlinkSock { protocol: 0, portid: 1234, groups: 0x551, inode: 40123 });
        assert_eq!(s[1].protocol, 16);
    }

    #[test]
    fn own_socket_fds() {
        let sock = std::os::unix::net::UnixDatagram::unbound().unwrap();
        use std::os::fd::AsRawFd as _;
        let fds = socket_fds(std::process::id());
        assert!(fds.iter().any(|(fd, _)| *fd == sock.as_raw_fd() as u32), "{fds:?}");
    }

    #[test]
    fn exec_start_from_sched() {
        let text = "bash (1, #threads: 1)\n---\nse.exec_start                                :       1335593.631817\nse.vruntime  :  1.0\n";
        assert_eq!(parse_exec_start(text), Some(1335593.631817));
        assert_eq!(parse_exec_start("nothing"), None);
    }

    #[test]
    fn own_stat_through_the_crate() {
        let me = std::process::id();
        assert!(last_cpu(me).is_some());
        assert_eq!(ppid(me), Some(std::os::unix::process::parent_id()));
        assert!(start_ticks(me).is_some_and(|t| t > 0));
    }

    #[test]
    fn reads_own_thread() {
        let me = std::process::id();
        assert!(thread_exists(me));
        assert!(comm(me).is_some());
        assert!(matches!(state(me), Some('R' | 'S')));
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        use std::os::fd::AsRawFd as _;
        let of = open_file(me, f.as_raw_fd() as u64).unwrap();
        assert!(of.path.ends_with("/stat"), "{of:?}");
    }
}
