//! The socket probe on the syscalls' own kernel functions: an fentry and an fexit
//! program on each of `__x64_sys_{write,writev,sendto,sendmsg,read,readv,recvfrom,
//! recvmsg}(const struct pt_regs *regs)` (arch/x86/entry/syscall_64.c wrappers;
//! Linux >= 4.17; checked on Debian's 6.1.0-56 in a guest; this host's 6.18 refuses
//! fentry and fexit, and keeps the tracepoints of [`crate::sockets`]).
//!
//! The same work as the `sys_enter`/`sys_exit` tracepoint programs, reached
//! through a BPF trampoline (a few ns a call) instead of the syscall tracepoints'
//! perf path (tens of ns each way). The syscall is known by the program, not
//! looked up by number, and its arguments are read from `regs`.
//!
//! Per-CPU scratch: fentry and fexit programs run with migration disabled, not
//! preemption; on a fully preemptible kernel two of them could share a CPU's
//! scratch at once (Debian's kernels run preemption `voluntary` by default, where
//! a BPF program is never preempted). The D-Bus walk needs `bpf_loop` (Linux >=
//! 5.17): older kernels keep the tracepoint variants.

use aya_ebpf::{
    macros::{fentry, fexit},
    programs::{FEntryContext, FExitContext},
};

use crate::sockets::{open_call, tracked_call, try_sock_exit, SOCK_CALLS_OPEN};

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
/// syscall's place in `SOCK_NR` (the userspace attach table's `SOCK_SYSCALLS`).
macro_rules! on_syscall_function {
    ($enter:ident, $exit:ident, $slot:expr) => {
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
            let ret: i64 = ctx.arg(1);
            let _ = try_sock_exit::<true>(ret);
            0
        }
    };
}

on_syscall_function!(sock_fentry_write, sock_fexit_write, 0);
on_syscall_function!(sock_fentry_writev, sock_fexit_writev, 1);
on_syscall_function!(sock_fentry_sendto, sock_fexit_sendto, 2);
on_syscall_function!(sock_fentry_sendmsg, sock_fexit_sendmsg, 3);
on_syscall_function!(sock_fentry_read, sock_fexit_read, 4);
on_syscall_function!(sock_fentry_readv, sock_fexit_readv, 5);
on_syscall_function!(sock_fentry_recvfrom, sock_fexit_recvfrom, 6);
on_syscall_function!(sock_fentry_recvmsg, sock_fexit_recvmsg, 7);
