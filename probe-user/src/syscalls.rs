//! The syscalls plegwatch watches, by slot in the kernel's `WATCHED_NR` table.

use plegwatch_abi::WATCHED_SLOTS;
use serde::Serialize;

/// What kind of wait a syscall is, as printed in `kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WaitKind {
    /// umount2, including its task_work tail.
    Umount,
    /// The sync family: sync, syncfs, fsync, fdatasync, sync_file_range.
    Sync,
    /// A netlink request with no reply yet.
    NetlinkRequest,
    /// A D-Bus method call with no reply yet.
    DbusCall,
    /// kubelet's PLEG relist still running.
    PlegRelist,
    /// A Go lock (containerd's CRI Status lock) held too long.
    GoLock,
    /// A CRI handler call in containerd still running.
    CriCall,
    /// Another probed Go call still running (a shim task call, runc's systemd calls).
    GoCall,
    /// A thread blocked in `wait4`/`waitid` for a child.
    ChildWait,
    /// A thread blocked in a receive on a unix socket, waiting on its peer.
    UnixRecv,
    /// A thread parked on a contended lock's futex beside a sibling thread's long wait.
    Futex,
}

impl WaitKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitKind::Umount => "umount",
            WaitKind::Sync => "sync",
            WaitKind::NetlinkRequest => "netlink_request",
            WaitKind::DbusCall => "dbus_call",
            WaitKind::PlegRelist => "pleg_relist",
            WaitKind::GoLock => "go_lock",
            WaitKind::CriCall => "cri_call",
            WaitKind::GoCall => "go_call",
            WaitKind::ChildWait => "child_wait",
            WaitKind::UnixRecv => "unix_recv",
            WaitKind::Futex => "futex",
        }
    }
}

/// What the first argument of a watched syscall is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg0 {
    /// A user pointer to a path (umount2's target).
    Path,
    /// A file descriptor.
    Fd,
    /// No argument (sync).
    None,
}

/// A watched syscall.
#[derive(Clone, Copy, Debug)]
pub struct Watched {
    /// The syscall's name, as printed in `detail.syscall`.
    pub name: &'static str,
    /// Its tracepoints' suffix: `syscalls:sys_enter_<tp>` / `sys_exit_<tp>`.
    pub tracepoint: &'static str,
    /// Its number on this architecture.
    pub nr: i64,
    pub kind: WaitKind,
    pub arg0: Arg0,
}

/// The watched syscalls, in slot order. Slot 0 is umount2
/// (`plegwatch_abi::SLOT_UMOUNT2`).
pub const WATCHED: [Watched; 6] = [
    Watched { name: "umount2", tracepoint: "umount", nr: libc::SYS_umount2, kind: WaitKind::Umount, arg0: Arg0::Path },
    Watched { name: "sync", tracepoint: "sync", nr: libc::SYS_sync, kind: WaitKind::Sync, arg0: Arg0::None },
    Watched { name: "syncfs", tracepoint: "syncfs", nr: libc::SYS_syncfs, kind: WaitKind::Sync, arg0: Arg0::Fd },
    Watched { name: "fsync", tracepoint: "fsync", nr: libc::SYS_fsync, kind: WaitKind::Sync, arg0: Arg0::Fd },
    Watched { name: "fdatasync", tracepoint: "fdatasync", nr: libc::SYS_fdatasync, kind: WaitKind::Sync, arg0: Arg0::Fd },
    Watched { name: "sync_file_range", tracepoint: "sync_file_range", nr: libc::SYS_sync_file_range, kind: WaitKind::Sync, arg0: Arg0::Fd },
];

const _: () = assert!(WATCHED.len() <= WATCHED_SLOTS);

/// The kernel's `WATCHED_NR` global: syscall numbers by slot, `u32::MAX` unused.
pub fn watched_nr_table() -> [u32; WATCHED_SLOTS] {
    let mut t = [u32::MAX; WATCHED_SLOTS];
    for (slot, w) in WATCHED.iter().enumerate() {
        t[slot] = w.nr as u32;
    }
    t
}

/// The kernel's `SOCK_NR` global: write, writev, sendto, sendmsg, read, readv,
/// recvfrom, recvmsg (`plegwatch_abi::SockSlot` order).
pub fn sock_nr_table() -> [u32; plegwatch_abi::SOCK_SLOTS] {
    [
        libc::SYS_write,
        libc::SYS_writev,
        libc::SYS_sendto,
        libc::SYS_sendmsg,
        libc::SYS_read,
        libc::SYS_readv,
        libc::SYS_recvfrom,
        libc::SYS_recvmsg,
    ]
    .map(|n| n as u32)
}

/// The watched syscall in `slot`, if any.
pub fn by_slot(slot: u32) -> Option<&'static Watched> {
    WATCHED.get(slot as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn umount2_is_slot_zero_and_numbers_are_distinct() {
        assert_eq!(by_slot(plegwatch_abi::SLOT_UMOUNT2).map(|w| w.name), Some("umount2"));
        let t = watched_nr_table();
        for (i, a) in t.iter().enumerate().take(WATCHED.len()) {
            assert_ne!(*a, u32::MAX);
            assert!(!t[i + 1..WATCHED.len()].contains(a));
        }
        assert!(t[WATCHED.len()..].iter().all(|&n| n == u32::MAX));
    }
}
