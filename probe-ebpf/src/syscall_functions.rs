//! Programs on the syscalls' own kernel functions, `__x64_sys_NAME(const struct
//! pt_regs *regs)` (the arch/x86/entry wrappers, Linux >= 4.17): an fentry and an
//! fexit program on each syscall of the socket probe (`write`, `writev`, `sendto`,
//! `sendmsg`, `read`, `readv`, `recvfrom`, `recvmsg`), the socket classifier's
//! (`socket`: fexit, which sees the arguments and the new fd at once; `connect`,
//! `close`: fentry), the fd-reuse probe's (`dup2`, `dup3`: fexit; `close_range`:
//! fentry), the child waits' (`wait4`, `waitid`) and the waits' (`umount`,
//! `sync`, `syncfs`, `fsync`, `fdatasync`, `sync_file_range`). Checked on Debian's
//! 6.1.0-56 in a guest; this host's 6.18 refuses fentry and fexit, and keeps the
//! syscall tracepoints of [`crate::sockets`], [`crate::children`] and [`crate::waits`].
//!
//! With all of them on, plegwatch enables no syscall tracepoint: enabling any one sets
//! every thread on the kernel's syscall-tracing slow path (`SYSCALL_WORK_SYSCALL_TRACEPOINT`),
//! which the bench's `floor-unused` column measures.
//!
//! The same work as those tracepoint programs, reached through a BPF trampoline (a
//! few ns a call) instead of the syscall tracepoints' perf path (tens of ns each
//! way). The syscall is known by the program, not looked up by number, and its
//! arguments are read from `regs`.
//!
//! The socket probe's exit work (its D-Bus walk, the heaviest program here) is one
//! program, `sock_fexit_body`, loaded once and reached by tail call from the eight
//! syscalls' fexit programs, which only check that the call is tracked. An fexit
//! program is verified once for each function it is loaded for: eight copies of the
//! body cost eight verifications (30 s of a 38 s start in a 6.1 TCG guest). A tail
//! call between tracing programs needs their attach points to share a prototype object
//! in the kernel's BTF (Linux 6.11, and the stable kernels it went back to, 6.1.192
//! among them): every `__x64_sys_NAME` is `long (const struct pt_regs *)`, but 6.1's
//! BTF keeps two copies of that prototype, so the body is loaded once per copy.
//!
//! Per-CPU scratch (the socket probe's record): fentry and fexit programs run with
//! migration disabled, not preemption; on a fully preemptible kernel two of them
//! could share a CPU's scratch at once (Debian's kernels run preemption `voluntary`
//! by default, where a BPF program is never preempted). The socket probe's D-Bus
//! walk needs `bpf_loop` (Linux >= 5.17): older kernels keep its tracepoints.

use aya_ebpf::{
    macros::{fentry, fexit, map},
    maps::ProgramArray,
    programs::{FEntryContext, FExitContext},
};

use aya_ebpf::helpers::bpf_get_current_pid_tgid;

use crate::sockets::{
    close_range, drop_call, dup_done, forget, on_connect, on_netlink_socket, open_call, tracked_call, try_sock_exit, AF_NETLINK,
    SOCK_CALLS, SOCK_CALLS_OPEN,
};

/// `sock_maps::SOCK_EXIT_BODY`, one map per syscall (`SOCK_EXIT_BODY_<slot>`): slot 0
/// of each holds [`sock_fexit_body`] as loaded for a function of the same prototype
/// object in the kernel's BTF (a tail call's maps are owned by one such prototype, and
/// 6.1's BTF has two for the eight functions: `fs/read_write.c`'s and `net/socket.c`'s).
macro_rules! exit_body_maps {
    ($($name:ident),*) => {
        $(
            #[map]
            static $name: ProgramArray = ProgramArray::with_max_entries(1, 0);
        )*
    };
}
exit_body_maps!(
    SOCK_EXIT_BODY_0,
    SOCK_EXIT_BODY_1,
    SOCK_EXIT_BODY_2,
    SOCK_EXIT_BODY_3,
    SOCK_EXIT_BODY_4,
    SOCK_EXIT_BODY_5,
    SOCK_EXIT_BODY_6,
    SOCK_EXIT_BODY_7
);
use crate::waits::{close_at_exit, open_wait, watched_nr};

/// Offsets in `struct pt_regs` (arch/x86/include/asm/ptrace.h, x86_64) of a
/// syscall's first five arguments: di, si, dx, r10, r8.
const REG_ARG: [usize; 5] = [112, 104, 96, 56, 72];

/// The syscall's argument `i`, read from `regs` (a BTF pointer the verifier lets
/// a tracing program load from at the offsets of `struct pt_regs`' fields).
#[inline(always)]
fn arg(regs: *const u8, i: usize) -> u64 {
    // SAFETY: `regs` is the traced function's `struct pt_regs *`; the offsets are its fields'.
    unsafe { core::ptr::read_volatile(regs.add(REG_ARG[i]).cast::<u64>()) }
}

/// An fentry and an fexit program on one syscall's function; `$slot` is the
/// syscall's place in `SOCK_NR` (the userspace attach table's `SOCK_SYSCALLS`), and
/// `$body` its map of the exit body.
macro_rules! on_syscall_function {
    ($enter:ident, $exit:ident, $body:ident, $slot:expr) => {
        #[fentry]
        pub fn $enter(ctx: FEntryContext) -> i32 {
            let regs: *const u8 = ctx.arg(0);
            let fd = arg(regs, 0);
            // The hot path ends here for untracked fds.
            let Some((tgid, class)) = tracked_call(fd) else { return 0 };
            open_call(tgid, class, fd, $slot, arg(regs, 1), arg(regs, 2), || arg(regs, 4));
            0
        }

        #[fexit]
        pub fn $exit(ctx: FExitContext) -> i32 {
            if !crate::gate::open(&SOCK_CALLS_OPEN, 0) {
                return 0;
            }
            let tid = bpf_get_current_pid_tgid() as u32;
            // SAFETY: a presence check; the value is not read.
            if unsafe { SOCK_CALLS.get(&tid) }.is_none() {
                return 0;
            }
            // SAFETY: the body takes the same context (the same prototype's arguments
            // and return value); on success this never returns.
            unsafe { $body.tail_call(&ctx, 0) };
            // Only an empty slot gets here (userspace fills it before attaching this):
            // the call is closed unseen rather than left open.
            drop_call(tid);
            0
        }
    };
}

/// The socket probe's exit, tail-called from each syscall's fexit program above with a
/// tracked call open: loaded (never attached) once for each prototype object the eight
/// functions have in the kernel's BTF, all `long __x64_sys_NAME(const struct pt_regs *regs)`.
#[fexit]
pub fn sock_fexit_body(ctx: FExitContext) -> i32 {
    let ret: i64 = ctx.arg(1);
    let _ = try_sock_exit::<true>(ret);
    0
}

on_syscall_function!(sock_fentry_write, sock_fexit_write, SOCK_EXIT_BODY_0, 0);
on_syscall_function!(sock_fentry_writev, sock_fexit_writev, SOCK_EXIT_BODY_1, 1);
on_syscall_function!(sock_fentry_sendto, sock_fexit_sendto, SOCK_EXIT_BODY_2, 2);
on_syscall_function!(sock_fentry_sendmsg, sock_fexit_sendmsg, SOCK_EXIT_BODY_3, 3);
on_syscall_function!(sock_fentry_read, sock_fexit_read, SOCK_EXIT_BODY_4, 4);
on_syscall_function!(sock_fentry_readv, sock_fexit_readv, SOCK_EXIT_BODY_5, 5);
on_syscall_function!(sock_fentry_recvfrom, sock_fexit_recvfrom, SOCK_EXIT_BODY_6, 6);
on_syscall_function!(sock_fentry_recvmsg, sock_fexit_recvmsg, SOCK_EXIT_BODY_7, 7);

/// An fentry and an fexit program on one watched syscall's function; `$slot` is its
/// place in `WATCHED_NR` (the userspace table `syscalls::WATCHED`).
macro_rules! on_wait_function {
    ($enter:ident, $exit:ident, $slot:expr) => {
        #[fentry]
        pub fn $enter(ctx: FEntryContext) -> i32 {
            let regs: *const u8 = ctx.arg(0);
            let _ = open_wait(watched_nr($slot), $slot, || (arg(regs, 0), arg(regs, 1)));
            0
        }

        #[fexit]
        pub fn $exit(ctx: FExitContext) -> i32 {
            let ret: i64 = ctx.arg(1);
            let _ = close_at_exit(ret);
            0
        }
    };
}

on_wait_function!(wait_fentry_umount, wait_fexit_umount, 0);
on_wait_function!(wait_fentry_sync, wait_fexit_sync, 1);
on_wait_function!(wait_fentry_syncfs, wait_fexit_syncfs, 2);
on_wait_function!(wait_fentry_fsync, wait_fexit_fsync, 3);
on_wait_function!(wait_fentry_fdatasync, wait_fexit_fdatasync, 4);
on_wait_function!(wait_fentry_sync_file_range, wait_fexit_sync_file_range, 5);

/// fexit on `socket(int family, int type, int protocol)`: a netlink socket's new fd is
/// tracked with its protocol (the tracepoint variant needs an entry program too).
#[fexit]
pub fn socket_fexit(ctx: FExitContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    if arg(regs, 0) != AF_NETLINK {
        return 0;
    }
    let ret: i64 = ctx.arg(1);
    on_netlink_socket(bpf_get_current_pid_tgid(), arg(regs, 2) as u32, ret);
    0
}

/// fentry on `connect(int fd, struct sockaddr *uservaddr, int addrlen)`.
#[fentry]
pub fn connect_fentry(ctx: FEntryContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == crate::waits::tracer_tgid() {
        return 0;
    }
    let regs: *const u8 = ctx.arg(0);
    on_connect(tgid, arg(regs, 0), arg(regs, 1), arg(regs, 2));
    0
}

/// fentry on `close(unsigned int fd)`: forgets the fd.
#[fentry]
pub fn close_fentry(ctx: FEntryContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let regs: *const u8 = ctx.arg(0);
    forget(tgid, arg(regs, 0) as u32);
    0
}

/// fexit on `dup2(unsigned int oldfd, unsigned int newfd)` and `dup3(unsigned int
/// oldfd, unsigned int newfd, int flags)`: newfd's old file is forgotten and newfd takes
/// oldfd's class, as [`crate::sockets::dup_exit`] does with the arguments its entry
/// program kept (an fexit program sees them with the result: no map between the two).
#[inline(always)]
fn on_dup(ctx: &FExitContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if tgid == crate::waits::tracer_tgid() {
        return 0;
    }
    let regs: *const u8 = ctx.arg(0);
    let (old, new) = (arg(regs, 0) as u32, arg(regs, 1) as u32);
    // dup2(fd, fd) changes nothing (dup3 refuses it).
    if old == new {
        return 0;
    }
    let ret: i64 = ctx.arg(1);
    dup_done(tgid, old, new, ret);
    0
}

/// fexit on `dup2` (see [`on_dup`]).
#[fexit]
pub fn dup2_fexit(ctx: FExitContext) -> i32 {
    on_dup(&ctx)
}

/// fexit on `dup3` (see [`on_dup`]).
#[fexit]
pub fn dup3_fexit(ctx: FExitContext) -> i32 {
    on_dup(&ctx)
}

/// fentry on `close_range(unsigned int fd, unsigned int max_fd, unsigned int flags)`:
/// as [`crate::sockets::close_range_enter`].
#[fentry]
pub fn close_range_fentry(ctx: FEntryContext) -> i32 {
    let tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let regs: *const u8 = ctx.arg(0);
    close_range(tgid, arg(regs, 0) as u32, arg(regs, 1) as u32, arg(regs, 2));
    0
}

/// fentry on `wait4(pid_t upid, int *stat_addr, int options, struct rusage *ru)`.
#[fentry]
pub fn wait4_fentry(ctx: FEntryContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    crate::children::begin(plegwatch_abi::CHILD_WAIT_WAIT4, arg(regs, 0) as i32, arg(regs, 2) as u32);
    0
}

/// fentry on `waitid(int which, pid_t upid, struct siginfo *infop, int options, struct
/// rusage *ru)`.
#[fentry]
pub fn waitid_fentry(ctx: FEntryContext) -> i32 {
    let regs: *const u8 = ctx.arg(0);
    crate::children::begin(arg(regs, 0) as u32, arg(regs, 1) as i32, arg(regs, 3) as u32);
    0
}

/// fexit on `wait4`: the wait is over, whatever it returned.
#[fexit]
pub fn wait4_fexit(_ctx: FExitContext) -> i32 {
    crate::children::end();
    0
}

/// fexit on `waitid`, likewise.
#[fexit]
pub fn waitid_fexit(_ctx: FExitContext) -> i32 {
    crate::children::end();
    0
}
