//! The attach table: every probe with its variants, best first, and the one
//! function that picks among them at startup by trying them for real.
//!
//! A variant that fails to load or attach is logged with the kernel's reason
//! and the next one is tried; the choice is logged at `info` and printed by
//! `plegwatch doctor` and in the `ready` line.

use crate::{events::ProbeChoice, syscalls::WATCHED};
use aya::{
    programs::{BtfTracePoint, FEntry, FExit, RawTracePoint, TracePoint},
    Ebpf,
};
use thiserror::Error;

/// Where a variant attaches.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    /// Classic tracepoint programs, each attached to its tracepoints.
    Tracepoints(&'static [Tp]),
    /// A raw tracepoint program.
    RawTracepoint { program: &'static str, tracepoint: &'static str },
    /// A BTF tracepoint (tp_btf) program; needs kernel BTF, and the kernel
    /// struct offsets it reads.
    BtfTracepoint { program: &'static str, tracepoint: &'static str },
    /// An fexit program on a kernel function; needs kernel BTF (and a kernel that
    /// allows it: this host's refuses fentry and fexit).
    Fexit { program: &'static str, function: &'static str },
    /// An fentry and an fexit program on the kernel function of each syscall
    /// (`__x64_sys_NAME`); needs kernel BTF, as [`Variant::Fexit`]. With an [`ExitBody`],
    /// the fexit programs tail-call into one program that does their work. The
    /// tracepoints (never syscall ones: those would put every syscall back on the
    /// kernel's tracing path) attach first, beside them.
    SyscallFunctions(&'static [SyscallHooks], Option<ExitBody>, &'static [Tp]),
    /// No kernel program: the kernel-wait source polls `/proc` for this job at each scan
    /// (coarser timing, same result).
    ProcPoll,
    /// Nothing: the probe is off, and what it would catch is not caught.
    Off,
}

/// The fentry and fexit programs (either may be absent) of one syscall's kernel function.
#[derive(Clone, Copy, Debug)]
pub struct SyscallHooks {
    pub syscall: &'static str,
    pub enter: Option<&'static str>,
    pub exit: Option<&'static str>,
}

/// An fexit program that each hook's fexit program tail-calls into, through slot 0 of
/// its own `ProgramArray` (`TABLE_<hook index>`): loaded once per prototype the hooks'
/// functions have, where the work would otherwise be verified once per syscall.
#[derive(Clone, Copy, Debug)]
pub struct ExitBody {
    pub program: &'static str,
    /// The maps' name before `_<hook index>`.
    pub table: &'static str,
}

/// The kernel function of `syscall` (the arch's `pt_regs` wrapper, Linux >= 4.17).
pub fn syscall_function(syscall: &str) -> String {
    #[cfg(target_arch = "aarch64")]
    const PREFIX: &str = "__arm64_sys_";
    #[cfg(not(target_arch = "aarch64"))]
    const PREFIX: &str = "__x64_sys_";
    format!("{PREFIX}{syscall}")
}

/// The function of `syscall` that the kernel's BTF has: the arch wrapper, or for a
/// syscall without arguments (`sync`) `__do_sys_NAME`, whose alias the wrapper is (an
/// alias has no BTF entry; checked on 6.1). Both take `const struct pt_regs *`.
fn syscall_function_in(btf: &aya::Btf, syscall: &str) -> Result<String, String> {
    use aya_obj::btf::BtfKind;
    let wrapper = syscall_function(syscall);
    let inner = format!("__do_sys_{syscall}");
    if btf.id_by_type_name_kind(&wrapper, BtfKind::Func).is_ok() {
        return Ok(wrapper);
    }
    if btf.id_by_type_name_kind(&inner, BtfKind::Func).is_ok() {
        return Ok(inner);
    }
    Err(format!("neither {wrapper} nor {inner} is in the kernel's BTF"))
}

const fn both(syscall: &'static str, enter: &'static str, exit: &'static str) -> SyscallHooks {
    SyscallHooks { syscall, enter: Some(enter), exit: Some(exit) }
}

const fn enter(syscall: &'static str, program: &'static str) -> SyscallHooks {
    SyscallHooks { syscall, enter: Some(program), exit: None }
}

const fn exit(syscall: &'static str, program: &'static str) -> SyscallHooks {
    SyscallHooks { syscall, enter: None, exit: Some(program) }
}

/// The socket probe's fentry and fexit programs, in `SOCK_NR` slot order.
const SOCK_FUNCTIONS: [SyscallHooks; plegwatch_abi::SOCK_SLOTS] = [
    both("write", "sock_fentry_write", "sock_fexit_write"),
    both("writev", "sock_fentry_writev", "sock_fexit_writev"),
    both("sendto", "sock_fentry_sendto", "sock_fexit_sendto"),
    both("sendmsg", "sock_fentry_sendmsg", "sock_fexit_sendmsg"),
    both("read", "sock_fentry_read", "sock_fexit_read"),
    both("readv", "sock_fentry_readv", "sock_fexit_readv"),
    both("recvfrom", "sock_fentry_recvfrom", "sock_fexit_recvfrom"),
    both("recvmsg", "sock_fentry_recvmsg", "sock_fexit_recvmsg"),
];

/// The socket probe's exit work, which its fexit programs tail-call into.
const SOCK_EXIT_BODY: ExitBody = ExitBody { program: "sock_fexit_body", table: plegwatch_abi::sock_maps::SOCK_EXIT_BODY };

/// The socket classifier's programs: fexit on socket (arguments and new fd at once),
/// fentry on connect and close.
const CLASSIFY_FUNCTIONS: [SyscallHooks; 3] =
    [exit("socket", "socket_fexit"), enter("connect", "connect_fentry"), enter("close", "close_fentry")];

/// The fd-reuse probe's programs: fexit on dup2 and dup3 (arguments and result at once,
/// where the tracepoints need an entry program and a map between), fentry on close_range.
const REUSE_FUNCTIONS: [SyscallHooks; 3] =
    [exit("dup2", "dup2_fexit"), exit("dup3", "dup3_fexit"), enter("close_range", "close_range_fentry")];

/// The child waits' programs.
const CHILD_WAIT_FUNCTIONS: [SyscallHooks; 2] =
    [both("wait4", "wait4_fentry", "wait4_fexit"), both("waitid", "waitid_fentry", "waitid_fexit")];

/// The waits' fentry programs, in `WATCHED_NR` slot order (`syscalls::WATCHED`).
const WAIT_ENTER_FUNCTIONS: [SyscallHooks; 6] = [
    enter("umount", "wait_fentry_umount"),
    enter("sync", "wait_fentry_sync"),
    enter("syncfs", "wait_fentry_syncfs"),
    enter("fsync", "wait_fentry_fsync"),
    enter("fdatasync", "wait_fentry_fdatasync"),
    enter("sync_file_range", "wait_fentry_sync_file_range"),
];

/// The waits' fexit programs, likewise.
const WAIT_EXIT_FUNCTIONS: [SyscallHooks; 6] = [
    exit("umount", "wait_fexit_umount"),
    exit("sync", "wait_fexit_sync"),
    exit("syncfs", "wait_fexit_syncfs"),
    exit("fsync", "wait_fexit_fsync"),
    exit("fdatasync", "wait_fexit_fdatasync"),
    exit("sync_file_range", "wait_fexit_sync_file_range"),
];

/// One tracepoint program and where it attaches.
#[derive(Clone, Copy, Debug)]
pub struct Tp {
    pub program: &'static str,
    pub category: &'static str,
    pub names: Names,
    /// Record fields the program reads at fixed offsets: (name, offset,
    /// size), checked against the running kernel's tracefs `format` before
    /// it attaches. Syscall records need none (their layout is ABI).
    pub fields: &'static [(&'static str, usize, usize)],
    /// Told after the tracepoints where two variants attach different
    /// programs to the same ones, e.g. `no bpf_loop`.
    pub note: Option<&'static str>,
}

/// The tracepoint names of a [`Tp`].
#[derive(Clone, Copy, Debug)]
pub enum Names {
    /// `sys_enter_<tp>` for every watched syscall.
    SyscallEnter,
    /// `sys_exit_<tp>` for every watched syscall.
    SyscallExit,
    /// `sys_enter_*` of the socket send/recv syscalls.
    SockEnter,
    /// `sys_exit_*` of the socket send/recv syscalls.
    SockExit,
    One(&'static str),
}

/// The socket send and receive syscalls, in `SOCK_NR` slot order.
pub const SOCK_SYSCALLS: [&str; plegwatch_abi::SOCK_SLOTS] =
    ["write", "writev", "sendto", "sendmsg", "read", "readv", "recvfrom", "recvmsg"];

impl Names {
    fn prefix_and_names(self) -> (&'static str, Vec<&'static str>) {
        match self {
            Names::SyscallEnter => ("sys_enter_", WATCHED.iter().map(|w| w.tracepoint).collect()),
            Names::SyscallExit => ("sys_exit_", WATCHED.iter().map(|w| w.tracepoint).collect()),
            Names::SockEnter => ("sys_enter_", SOCK_SYSCALLS.to_vec()),
            Names::SockExit => ("sys_exit_", SOCK_SYSCALLS.to_vec()),
            Names::One(n) => ("", vec![n]),
        }
    }

    fn list(self) -> Vec<String> {
        let (prefix, names) = self.prefix_and_names();
        names.iter().map(|n| format!("{prefix}{n}")).collect()
    }

    fn describe(self) -> String {
        match self.prefix_and_names() {
            (prefix, names) if names.len() > 1 => format!("{prefix}{{{}}}", names.join(",")),
            (prefix, names) => format!("{prefix}{}", names.join(",")),
        }
    }
}

impl Variant {
    /// A short description, e.g. `tracepoint syscalls:sys_enter_{umount,sync,...}`.
    pub fn describe(&self) -> String {
        match self {
            Variant::Tracepoints(tps) => {
                let parts: Vec<String> = tps
                    .iter()
                    .map(|t| match t.note {
                        Some(note) => format!("{}:{} ({note})", t.category, t.names.describe()),
                        None => format!("{}:{}", t.category, t.names.describe()),
                    })
                    .collect();
                format!("tracepoint {}", parts.join(" + "))
            }
            Variant::RawTracepoint { tracepoint, .. } => format!("raw_tp {tracepoint}"),
            Variant::BtfTracepoint { tracepoint, .. } => format!("tp_btf {tracepoint}"),
            Variant::Fexit { function, .. } => format!("fexit {function}"),
            Variant::SyscallFunctions(hooks, _, with) => {
                let names: Vec<&str> = hooks.iter().map(|h| h.syscall).collect();
                let kind = match (hooks.iter().any(|h| h.enter.is_some()), hooks.iter().any(|h| h.exit.is_some())) {
                    (true, true) => "fentry+fexit",
                    (true, false) => "fentry",
                    _ => "fexit",
                };
                let functions = format!("{kind} {}{{{}}}", syscall_function(""), names.join(","));
                if with.is_empty() {
                    functions
                } else {
                    format!("{functions} + {}", Variant::Tracepoints(with).describe())
                }
            }
            Variant::ProcPoll => "/proc poll".to_string(),
            Variant::Off => "off".to_string(),
        }
    }
}

/// A probe and its variants, best first.
#[derive(Clone, Copy, Debug)]
pub struct Probe {
    pub name: &'static str,
    pub about: &'static str,
    /// plegwatch can't run without it.
    pub required: bool,
    pub variants: &'static [Variant],
    /// What goes unseen while the probe is off, if anything does (a probe whose last
    /// resort is a `/proc` poll loses nothing but timing).
    pub loses: Option<Loss>,
}

/// What an optional probe's absence costs.
#[derive(Clone, Copy, Debug)]
pub struct Loss {
    /// What is not seen, in a few words an SRE reads in the start line.
    pub what: &'static str,
    /// A seed chain needs it (the Terway netlink chain, containerd#9770 down to the
    /// device, runc -> systemd over D-Bus, containerd -> runc): plegwatch runs
    /// *degraded* without it, and says so.
    pub seed_chain: bool,
}

/// What the socket probes' absence costs: two of the three seed chains.
const SOCKETS_LOST: Loss = Loss {
    what: "netlink requests (the Terway chain), D-Bus calls (runc -> systemd) and ttrpc frames (containerd -> shim, exact)",
    seed_chain: true,
};

const fn tp(program: &'static str, category: &'static str, names: Names) -> Tp {
    Tp { program, category, names, fields: &[], note: None }
}

const fn tp_noted(program: &'static str, category: &'static str, names: Names, note: &'static str) -> Tp {
    Tp { program, category, names, fields: &[], note: Some(note) }
}

const fn tp_checked(
    program: &'static str,
    category: &'static str,
    name: &'static str,
    fields: &'static [(&'static str, usize, usize)],
) -> Tp {
    Tp { program, category, names: Names::One(name), fields, note: None }
}

use plegwatch_abi::block_tp;

/// The fields `block_issue` and `block_complete` read at fixed offsets
/// (probe-ebpf/src/block.rs); `rwbs`, which moved, is found by [`rwbs_offset`].
const BLOCK_ISSUE_FIELDS: &[(&str, usize, usize)] = &[("dev", block_tp::DEV_OFF, 4), ("bytes", block_tp::ISSUE_BYTES_OFF, 4)];
const BLOCK_COMPLETE_FIELDS: &[(&str, usize, usize)] = &[("dev", block_tp::DEV_OFF, 4)];

/// Where block_rq_issue's `rwbs` is in this kernel's record (its tracefs format), for
/// the loader to pass in as a global; `None` when the format can't be read or has no
/// `rwbs` of at least 2 bytes (writes are then not told from reads: no bytes written).
pub fn rwbs_offset() -> Option<u32> {
    let text = read_format("block", "block_rq_issue").ok()?;
    parse_format(&text).get("rwbs").filter(|(_, size)| *size >= 2).and_then(|(off, _)| u32::try_from(*off).ok())
}

/// The tracefs `format` text of `category:name`.
fn read_format(category: &str, name: &str) -> Result<String, String> {
    // Where `loader::ensure_tracefs` found (or mounted) tracefs.
    let paths = crate::kernel::loader::TRACEFS_ROOTS.map(|t| format!("{t}/events/{category}/{name}/format"));
    paths.iter().find_map(|p| std::fs::read_to_string(p).ok()).ok_or_else(|| format!("no tracefs format for {category}:{name}"))
}

/// The fields of a tracefs `format` file: name → (offset, size). Arrays are
/// named without their brackets (`rwbs[10]` → `rwbs`).
pub fn parse_format(text: &str) -> std::collections::HashMap<String, (usize, usize)> {
    let mut out = std::collections::HashMap::new();
    for line in text.lines() {
        let mut name = None;
        let mut off = None;
        let mut size = None;
        for part in line.trim().split(';') {
            let part = part.trim();
            if let Some(f) = part.strip_prefix("field:") {
                name = f.split_whitespace().last().map(|n| n.split('[').next().unwrap_or(n).to_string());
            } else if let Some(o) = part.strip_prefix("offset:") {
                off = o.parse().ok();
            } else if let Some(z) = part.strip_prefix("size:") {
                size = z.parse().ok();
            }
        }
        if let (Some(n), Some(o), Some(z)) = (name, off, size) {
            out.insert(n, (o, z));
        }
    }
    out
}

/// Fails, saying so, when this kernel has no tracepoint `category:name` (for example
/// `lock:contention_begin` before Linux 5.19), rather than with the attach's error.
/// Passes when tracefs itself is not found: the attach then says what is wrong.
fn check_exists(category: &str, name: &str) -> Result<(), String> {
    let roots = crate::kernel::loader::TRACEFS_ROOTS.map(std::path::Path::new);
    let Some(root) = roots.iter().find(|r| r.join("events").is_dir()) else { return Ok(()) };
    if root.join("events").join(category).join(name).is_dir() {
        Ok(())
    } else {
        Err(format!("no such tracepoint in tracefs (events/{category}/{name}; this kernel does not have it)"))
    }
}

/// Checks that the tracepoint's record has each field at the offset the
/// program reads, and at least as wide.
fn check_fields(category: &str, name: &str, fields: &[(&str, usize, usize)]) -> Result<(), String> {
    if fields.is_empty() {
        return Ok(());
    }
    let have = parse_format(&read_format(category, name)?);
    for (f, off, size) in fields {
        match have.get(*f) {
            Some((o, z)) if o == off && z >= size => {}
            Some((o, z)) => {
                return Err(format!("{category}:{name} has {f} at offset {o} size {z}; the program reads offset {off} size {size}"))
            }
            None => return Err(format!("{category}:{name} has no field {f}")),
        }
    }
    Ok(())
}

/// Every probe `plegwatch watch` attaches.
pub const PROBES: &[Probe] = &[
    Probe {
        name: "wait_enter",
        about: "opens a wait at sys_enter of umount2 and the sync family",
        required: true,
        variants: &[
            Variant::SyscallFunctions(&WAIT_ENTER_FUNCTIONS, None, &[]),
            Variant::Tracepoints(&[tp("wait_enter", "syscalls", Names::SyscallEnter)]),
        ],
        loses: None,
    },
    Probe {
        name: "wait_exit",
        about: "closes it at sys_exit (umount2 goes on in task_work)",
        required: true,
        variants: &[
            Variant::SyscallFunctions(&WAIT_EXIT_FUNCTIONS, None, &[]),
            Variant::Tracepoints(&[tp("wait_exit", "syscalls", Names::SyscallExit)]),
        ],
        loses: None,
    },
    Probe {
        name: "umount_tail_end",
        about: "closes a umount2 wait when its task_work tail has run (or, as a fallback, at its thread's next syscall)",
        required: false,
        variants: &[
            Variant::Fexit { program: "tail_end_fexit", function: "task_work_run" },
            Variant::RawTracepoint { program: "tail_end_raw", tracepoint: "sys_enter" },
            Variant::Tracepoints(&[tp("tail_end_tp", "raw_syscalls", Names::One("sys_enter"))]),
            Variant::ProcPoll,
        ],
        loses: None,
    },
    Probe {
        name: "thread_exit",
        about: "closes the waits of threads that exit",
        required: false,
        variants: &[
            Variant::Tracepoints(&[tp("thread_exit", "sched", Names::One("sched_process_exit"))]),
            Variant::ProcPoll,
        ],
        loses: None,
    },
    Probe {
        name: "socket_classify",
        about: "marks netlink sockets at socket(), unix sockets at connect() (ttrpc when they name a containerd shim socket), forgets them at close()",
        required: false,
        variants: &[
            Variant::SyscallFunctions(&CLASSIFY_FUNCTIONS, None, &[]),
            Variant::Tracepoints(&[
                tp("socket_enter", "syscalls", Names::One("sys_enter_socket")),
                tp("socket_exit", "syscalls", Names::One("sys_exit_socket")),
                tp("connect_enter", "syscalls", Names::One("sys_enter_connect")),
                tp("close_enter", "syscalls", Names::One("sys_enter_close")),
            ]),
            Variant::Off,
        ],
        loses: Some(SOCKETS_LOST),
    },
    Probe {
        name: "socket_io",
        about: "records sends and receives on netlink and D-Bus sockets, and ttrpc frame headers to containerd shims",
        required: false,
        // The exits first: a call whose sys_enter is seen always has its
        // sys_exit seen, so no SOCK_CALLS entry (and its gate count) is left behind.
        // sock_exit_nl: the same without bpf_loop (Linux < 5.17), its D-Bus
        // walk in bounded loops that cost the verifier more.
        // fentry+fexit first: a trampoline on each syscall's function costs a few ns
        // where the syscall tracepoints cost tens each way; needs bpf_loop (>= 5.17).
        // No kprobe variant: a kretprobe holds one of its few instances per thread
        // parked in a receive, and past them misses the returns that close the calls.
        variants: &[
            Variant::SyscallFunctions(&SOCK_FUNCTIONS, Some(SOCK_EXIT_BODY), &[]),
            Variant::Tracepoints(&[tp("sock_exit", "syscalls", Names::SockExit), tp("sock_enter", "syscalls", Names::SockEnter)]),
            Variant::Tracepoints(&[
                tp_noted("sock_exit_nl", "syscalls", Names::SockExit, "no bpf_loop"),
                tp("sock_enter", "syscalls", Names::SockEnter),
            ]),
            Variant::Off,
        ],
        loses: Some(SOCKETS_LOST),
    },
    Probe {
        name: "socket_reuse",
        about: "forgets a socket's class when its fd names another file: dup2/dup3 onto it, close_range over it, exec",
        required: false,
        // The exits first, so that no dup call is remembered without its end.
        // close_range's tracepoint is Linux >= 5.9: without it, dup and exec still.
        variants: &[
            Variant::SyscallFunctions(&REUSE_FUNCTIONS, None, &[tp("sock_exec", "sched", Names::One("sched_process_exec"))]),
            Variant::Tracepoints(&[
                tp("dup_exit", "syscalls", Names::One("sys_exit_dup2")),
                tp("dup_exit", "syscalls", Names::One("sys_exit_dup3")),
                tp("dup_enter", "syscalls", Names::One("sys_enter_dup2")),
                tp("dup_enter", "syscalls", Names::One("sys_enter_dup3")),
                tp("close_range_enter", "syscalls", Names::One("sys_enter_close_range")),
                tp("sock_exec", "sched", Names::One("sched_process_exec")),
            ]),
            Variant::Tracepoints(&[
                tp("dup_exit", "syscalls", Names::One("sys_exit_dup2")),
                tp("dup_exit", "syscalls", Names::One("sys_exit_dup3")),
                tp("dup_enter", "syscalls", Names::One("sys_enter_dup2")),
                tp("dup_enter", "syscalls", Names::One("sys_enter_dup3")),
                tp("sock_exec", "sched", Names::One("sched_process_exec")),
            ]),
            Variant::Off,
        ],
        loses: Some(Loss { what: "fd reuse by dup2/dup3/close_range/exec (a socket's class may stick to the file that replaced it)", seed_chain: false }),
    },
    Probe {
        name: "child_wait",
        about: "threads blocked in wait4/waitid for a child (a parent waiting on the process it started)",
        required: false,
        // The exits first, so that no entry (and its gate count) is left behind.
        variants: &[
            Variant::SyscallFunctions(&CHILD_WAIT_FUNCTIONS, None, &[tp("child_wait_gone", "sched", Names::One("sched_process_exit"))]),
            Variant::Tracepoints(&[
                tp("child_wait_exit", "syscalls", Names::One("sys_exit_wait4")),
                tp("child_wait_exit", "syscalls", Names::One("sys_exit_waitid")),
                tp("child_wait_gone", "sched", Names::One("sched_process_exit")),
                tp("child_wait_enter", "syscalls", Names::One("sys_enter_wait4")),
                tp("child_wait_enter", "syscalls", Names::One("sys_enter_waitid")),
            ]),
            Variant::Off,
        ],
        loses: Some(Loss { what: "parents waiting on their children (containerd or a shim -> runc)", seed_chain: true }),
    },
    Probe {
        name: "lock_contention",
        about: "who holds the kernel mutex a thread waits on (rtnl_mutex behind a netlink request)",
        required: false,
        variants: &[
            Variant::Tracepoints(&[
                tp("lock_begin", "lock", Names::One("contention_begin")),
                tp("lock_end", "lock", Names::One("contention_end")),
            ]),
            Variant::Off,
        ],
        loses: Some(Loss { what: "kernel mutex holders (rtnl_mutex behind a netlink request)", seed_chain: false }),
    },
    Probe {
        name: "proc_exec",
        about: "looks at each new binary at exec, so a restarted containerd or kubelet is probed again at once",
        required: false,
        variants: &[
            Variant::Tracepoints(&[tp("proc_exec", "sched", Names::One("sched_process_exec"))]),
            Variant::ProcPoll,
        ],
        loses: None,
    },
    Probe {
        name: "block_io",
        about: "block requests in flight and bytes written per device, for waits on writeback",
        required: false,
        variants: &[
            Variant::Tracepoints(&[
                tp_checked("block_issue", "block", "block_rq_issue", BLOCK_ISSUE_FIELDS),
                tp_checked("block_complete", "block", "block_rq_complete", BLOCK_COMPLETE_FIELDS),
            ]),
            Variant::Off,
        ],
        loses: Some(Loss { what: "the device hop under writeback waits (umount, fsync)", seed_chain: true }),
    },
    Probe {
        name: "offcpu",
        about: "D-state sleeps by kernel stack for the processes that matter (sched_switch)",
        required: false,
        variants: &[
            Variant::BtfTracepoint { program: "offcpu_switch_btf", tracepoint: "sched_switch" },
            Variant::Tracepoints(&[tp("offcpu_switch_tp", "sched", Names::One("sched_switch"))]),
            Variant::Off,
        ],
        loses: Some(Loss { what: "kernel stacks of D-state sleeps", seed_chain: false }),
    },
    Probe {
        name: "parked_threads",
        about: "threads blocked reading a unix socket (to its peer, by sock_diag) or parked on a contended lock's futex beside a sibling's long wait: /proc/TID/syscall, sampled off the event loop for processes with a wait over 1 s (see `parked`)",
        required: false,
        variants: &[Variant::ProcPoll],
        loses: None,
    },
];

/// The environment variable naming probes (comma-separated, or `all`) whose
/// kernel-function variants (fexit) are passed over, so that their fallbacks run on a
/// kernel that has the better ones: for the scenarios' fallback runs, not for nodes.
pub const FALLBACK_ENV: &str = "PLEGWATCH_FALLBACK";

/// What some variants need besides the eBPF object.
#[derive(Default)]
pub struct AttachEnv {
    /// The kernel's BTF, for tp_btf.
    pub btf: Option<aya::Btf>,
    /// Whether the struct offsets the tp_btf programs read were found.
    pub offsets_known: bool,
    /// [`FALLBACK_ENV`] as set, if it is.
    pub fallback: Option<String>,
}

impl AttachEnv {
    /// Reads the kernel's BTF (`offsets_known` as the loader found them) and [`FALLBACK_ENV`].
    pub fn probe(offsets_known: bool) -> Self {
        AttachEnv { btf: aya::Btf::from_sys_fs().ok(), offsets_known, fallback: std::env::var(FALLBACK_ENV).ok() }
    }

    /// Whether `probe`'s kernel-function variants are to be passed over.
    fn forced_fallback(&self, probe: &str) -> bool {
        self.fallback.as_deref().is_some_and(|list| list.split(',').map(str::trim).any(|p| p == "all" || p == probe))
    }
}

impl Variant {
    /// A program on a kernel function (fexit), rather than a tracepoint.
    fn on_kernel_function(&self) -> bool {
        matches!(self, Variant::Fexit { .. } | Variant::SyscallFunctions(..))
    }
}

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("required probe {probe} could not attach: {reasons}")]
    Required { probe: &'static str, reasons: String },
}

/// The variant a probe got, and why better ones were passed over.
#[derive(Clone, Debug)]
pub struct Choice {
    pub probe: &'static str,
    pub variant: Variant,
    pub passed_over: Vec<String>,
}

impl Choice {
    pub fn is_proc_poll(&self) -> bool {
        matches!(self.variant, Variant::ProcPoll)
    }

    pub fn is_off(&self) -> bool {
        matches!(self.variant, Variant::Off)
    }

    pub fn to_output(&self) -> ProbeChoice {
        let loss = if self.is_off() { loss_of(self.probe) } else { None };
        ProbeChoice {
            probe: self.probe.to_string(),
            variant: self.variant.describe(),
            why: self.passed_over.first().map(|w| few_words(w)),
            loses: loss.map(|l| l.what.to_string()),
            seed_chain: loss.is_some_and(|l| l.seed_chain),
        }
    }
}

/// What probe `name` of [`PROBES`] costs when it is off.
pub fn loss_of(name: &str) -> Option<Loss> {
    PROBES.iter().find(|p| p.name == name).and_then(|p| p.loses)
}

/// A reason cut to its first clause and 60 characters, for the one-line start.
fn few_words(reason: &str) -> String {
    // `variant: reason`: the reason after the variant's name.
    let r = reason.split_once(": ").map_or(reason, |(_, r)| r);
    let r = r.split(['(', ';']).next().unwrap_or(r).trim();
    match r.char_indices().nth(60) {
        Some((i, _)) => format!("{}…", &r[..i]),
        None => r.to_string(),
    }
}

/// Attaches every probe of [`PROBES`], each with the best variant that works.
pub fn attach_all(ebpf: &mut Ebpf, env: &AttachEnv) -> Result<Vec<Choice>, ProbeError> {
    preload(ebpf, env, PROBES);
    PROBES.iter().map(|p| attach(ebpf, env, p)).collect()
}

/// Loads the programs of every probe's first kernel-function variant at once, on a few
/// threads, before [`attach`] tries the variants in order (it then finds them loaded).
///
/// An fentry or fexit program is verified once per kernel function it is loaded for: some
/// 30 programs here, the socket probe's exit body among them (loaded here for the first
/// syscall; [`set_exit_bodies`] loads it again for another prototype). The kernel verifies
/// privileged loads in parallel, so a many-core node starts sooner; a one-CPU guest
/// gains nothing. A load that fails here is not an error: [`attach`] loads it again and
/// reports why, or falls back.
fn preload(ebpf: &mut Ebpf, env: &AttachEnv, probes: &[Probe]) {
    let Some(btf) = env.btf.as_ref() else { return };
    let mut wanted: Vec<(&'static str, String)> = Vec::new();
    for p in probes.iter().filter(|p| !env.forced_fallback(p.name)) {
        match p.variants.first() {
            Some(Variant::SyscallFunctions(hooks, body, _)) => {
                if let (Some(b), Some(first)) = (body, hooks.first()) {
                    if let Ok(function) = syscall_function_in(btf, first.syscall) {
                        wanted.push((b.program, function));
                    }
                }
                for h in hooks.iter() {
                    let Ok(function) = syscall_function_in(btf, h.syscall) else { continue };
                    wanted.extend(h.exit.into_iter().chain(h.enter).map(|program| (program, function.clone())));
                }
            }
            Some(Variant::Fexit { program, function }) => wanted.push((program, function.to_string())),
            _ => {}
        }
    }
    let jobs: Vec<(&mut aya::programs::Program, String)> =
        ebpf.programs_mut().filter_map(|(name, prog)| wanted.iter().find(|(p, _)| *p == name).map(|(_, f)| (prog, f.clone()))).collect();
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(jobs.len());
    let began = std::time::Instant::now();
    let n = jobs.len();
    let queue = std::sync::Mutex::new(jobs.into_iter());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let job = queue.lock().map(|mut q| q.next()).unwrap_or(None);
                let Some((prog, function)) = job else { break };
                let loaded = match prog {
                    aya::programs::Program::FEntry(p) => p.load(&function, btf),
                    aya::programs::Program::FExit(p) => p.load(&function, btf),
                    _ => continue,
                };
                if let Err(e) = loaded {
                    tracing::debug!(function, error = %e, "preload refused; the attach retries it");
                }
            });
        }
    });
    tracing::debug!(programs = n, threads, took_ms = began.elapsed().as_millis() as u64, "kernel-function programs preloaded");
}

/// Attaches one probe with the best variant that works.
pub fn attach(ebpf: &mut Ebpf, env: &AttachEnv, probe: &Probe) -> Result<Choice, ProbeError> {
    let mut passed_over = Vec::new();
    for v in probe.variants {
        if v.on_kernel_function() && env.forced_fallback(probe.name) {
            passed_over.push(format!("{}: passed over ({FALLBACK_ENV})", v.describe()));
            continue;
        }
        match try_variant(ebpf, env, v) {
            Ok(()) => {
                if matches!(v, Variant::Off) {
                    tracing::warn!(probe = probe.name, passed_over = ?passed_over, "probe is off: {}", probe.about);
                } else if passed_over.is_empty() {
                    tracing::debug!(probe = probe.name, variant = %v.describe(), "probe attached");
                } else {
                    tracing::warn!(probe = probe.name, variant = %v.describe(), passed_over = ?passed_over, "probe attached with a fallback");
                }
                return Ok(Choice { probe: probe.name, variant: *v, passed_over });
            }
            Err(e) => passed_over.push(format!("{}: {}", v.describe(), one_line(&e))),
        }
    }
    // Optional probes end with ProcPoll or Off, which always "attach".
    Err(ProbeError::Required { probe: probe.name, reasons: passed_over.join("; ") })
}

fn try_variant(ebpf: &mut Ebpf, env: &AttachEnv, v: &Variant) -> Result<(), String> {
    match *v {
        Variant::Tracepoints(tps) => attach_tracepoints(ebpf, tps).map(|_| ()),
        Variant::RawTracepoint { program, tracepoint } => {
            let prog: &mut RawTracePoint = program_mut(ebpf, program)?;
            prog.load().or_else(already_loaded).map_err(|e| format!("load {program}: {e}"))?;
            prog.attach(tracepoint).map(|_| ()).map_err(|e| format!("attach {program} to {tracepoint}: {e}"))
        }
        Variant::BtfTracepoint { program, tracepoint } => {
            let btf = env.btf.as_ref().ok_or("no kernel BTF")?;
            if !env.offsets_known {
                return Err("kernel struct offsets not found in BTF".into());
            }
            let prog: &mut BtfTracePoint = program_mut(ebpf, program)?;
            prog.load(tracepoint, btf).or_else(already_loaded).map_err(|e| format!("load {program}: {e}"))?;
            prog.attach().map(|_| ()).map_err(|e| format!("attach {program}: {e}"))
        }
        Variant::Fexit { program, function } => {
            let btf = env.btf.as_ref().ok_or("no kernel BTF")?;
            let prog: &mut FExit = program_mut(ebpf, program)?;
            prog.load(function, btf).or_else(already_loaded).map_err(|e| format!("load {program}: {e}"))?;
            prog.attach().map(|_| ()).map_err(|e| format!("attach {program}: {e}"))
        }
        Variant::SyscallFunctions(hooks, body, with) => {
            let side = attach_tracepoints(ebpf, with)?;
            let result = attach_syscall_functions(ebpf, env, hooks, body);
            if result.is_err() {
                detach_tracepoints(ebpf, side);
            }
            result
        }
        Variant::ProcPoll | Variant::Off => Ok(()),
    }
}

/// Tracepoint links, for [`detach_tracepoints`].
type TpLinks = Vec<(&'static str, aya::programs::trace_point::TracePointLinkId)>;

/// Checks, loads and attaches each of `tps`; on any failure, detaches what it attached.
fn attach_tracepoints(ebpf: &mut Ebpf, tps: &[Tp]) -> Result<TpLinks, String> {
    for t in tps {
        for name in t.names.list() {
            check_exists(t.category, &name)?;
            check_fields(t.category, &name, t.fields)?;
        }
    }
    let mut attached: TpLinks = Vec::new();
    let result = tps.iter().try_for_each(|t| {
        let prog: &mut TracePoint = program_mut(ebpf, t.program)?;
        prog.load().or_else(already_loaded).map_err(|e| format!("load {}: {e}", t.program))?;
        for name in t.names.list() {
            let link = prog.attach(t.category, &name).map_err(|e| format!("attach {} to {}:{name}: {e}", t.program, t.category))?;
            attached.push((t.program, link));
        }
        Ok(())
    });
    match result {
        Ok(()) => Ok(attached),
        Err(e) => {
            detach_tracepoints(ebpf, attached);
            Err(e)
        }
    }
}

fn detach_tracepoints(ebpf: &mut Ebpf, links: TpLinks) {
    for (program, link) in links {
        if let Ok(prog) = program_mut::<TracePoint>(ebpf, program) {
            let _ = prog.detach(link);
        }
    }
}

/// Loads and attaches each syscall's fexit, then its fentry (so that no call is
/// opened whose end goes unseen); on any failure, detaches what it attached. With an
/// exit body, the fexit programs are loaded first (each of the body's maps takes the
/// prototype of the first program that uses it), then the body goes into their maps,
/// then they attach.
fn attach_syscall_functions(ebpf: &mut Ebpf, env: &AttachEnv, hooks: &[SyscallHooks], body: Option<ExitBody>) -> Result<(), String> {
    let btf = env.btf.as_ref().ok_or("no kernel BTF")?;
    let mut exits = Vec::new();
    let mut enters = Vec::new();
    let result = (|| {
        for h in hooks {
            let Some(program) = h.exit else { continue };
            let function = syscall_function_in(btf, h.syscall)?;
            let prog: &mut FExit = program_mut(ebpf, program)?;
            prog.load(&function, btf).or_else(already_loaded).map_err(|e| format!("load {program}: {e}"))?;
        }
        if let Some(b) = body {
            set_exit_bodies(ebpf, btf, hooks, b)?;
        }
        for h in hooks {
            let Some(program) = h.exit else { continue };
            let prog: &mut FExit = program_mut(ebpf, program)?;
            exits.push((program, prog.attach().map_err(|e| format!("attach {program} to {}: {e}", h.syscall))?));
        }
        for h in hooks {
            let Some(program) = h.enter else { continue };
            let function = syscall_function_in(btf, h.syscall)?;
            let prog: &mut FEntry = program_mut(ebpf, program)?;
            prog.load(&function, btf).or_else(already_loaded).map_err(|e| format!("load {program}: {e}"))?;
            enters.push((program, prog.attach().map_err(|e| format!("attach {program} to {function}: {e}"))?));
        }
        Ok(())
    })();
    if result.is_err() {
        for (program, link) in enters {
            if let Ok(prog) = program_mut::<FEntry>(ebpf, program) {
                let _ = prog.detach(link);
            }
        }
        for (program, link) in exits {
            if let Ok(prog) = program_mut::<FExit>(ebpf, program) {
                let _ = prog.detach(link);
            }
        }
    }
    result
}

/// Puts `body` in slot 0 of each hook's map (`TABLE_<index>`), loading it again for a
/// hook whose function's prototype no copy loaded so far fits: the kernel lets a tail
/// call go only between programs loaded for the same prototype object of its BTF, and
/// 6.1's has two for the eight socket syscalls (loaded twice there, instead of eight
/// times without tail calls). Each copy stays alive in the maps that hold it.
fn set_exit_bodies(ebpf: &mut Ebpf, btf: &aya::Btf, hooks: &[SyscallHooks], body: ExitBody) -> Result<(), String> {
    fn put(ebpf: &mut Ebpf, table: &str, fd: &aya::programs::ProgramFd) -> Result<(), String> {
        let map = ebpf.map_mut(table).ok_or_else(|| format!("map {table} is not in the eBPF object"))?;
        let mut array = aya::maps::ProgramArray::try_from(map).map_err(|e| format!("map {table}: {e}"))?;
        array.set(0, fd, 0).map_err(|e| format!("put the exit body in {table}: {e}"))
    }
    let mut copies: Vec<aya::programs::ProgramFd> = Vec::new();
    for (i, h) in hooks.iter().enumerate() {
        let table = format!("{}_{i}", body.table);
        if copies.iter().any(|fd| put(ebpf, &table, fd).is_ok()) {
            continue;
        }
        let function = syscall_function_in(btf, h.syscall)?;
        let prog: &mut FExit = program_mut(ebpf, body.program)?;
        if !copies.is_empty() {
            prog.unload().map_err(|e| format!("unload {}: {e}", body.program))?;
        }
        prog.load(&function, btf).or_else(already_loaded).map_err(|e| format!("load {} for {function}: {e}", body.program))?;
        let fd = prog.fd().map_err(|e| format!("{}: {e}", body.program))?;
        let fd = fd.try_clone().map_err(|e| format!("{}: {e}", body.program))?;
        put(ebpf, &table, &fd)?;
        copies.push(fd);
    }
    tracing::debug!(program = body.program, copies = copies.len(), "exit body loaded for the syscalls' prototypes");
    Ok(())
}

/// A kernel refusal as one short line: the verifier's log can run to
/// megabytes; its first and last lines say what failed.
fn one_line(e: &str) -> String {
    const KEEP: usize = 240;
    let e = e.replace('\n', " | ");
    if e.len() <= 2 * KEEP {
        return e;
    }
    let head: String = e.chars().take(KEEP).collect();
    let tail: String = e.chars().rev().take(KEEP).collect::<Vec<_>>().into_iter().rev().collect();
    format!("{head} … {tail}")
}

fn already_loaded(e: aya::programs::ProgramError) -> Result<(), aya::programs::ProgramError> {
    match e {
        aya::programs::ProgramError::AlreadyLoaded => Ok(()),
        e => Err(e),
    }
}

/// The program `name` of `ebpf`, as type `T`.
pub fn program_mut<'a, T>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(name)
        .ok_or_else(|| format!("program {name} is not in the eBPF object"))?
        .try_into()
        .map_err(|e| format!("program {name}: {e}"))
}

#[cfg(test)]
mod tests {
    /// The start line's reason for a probe that is off: the reason, not the variant, cut short.
    #[test]
    fn an_off_probes_reason_is_a_few_words() {
        assert_eq!(
            super::few_words("tracepoint lock:contention_begin: no such tracepoint in tracefs (events/lock/contention_begin/format)"),
            "no such tracepoint in tracefs"
        );
        let long = super::few_words(&format!("fentry x: {}", "word ".repeat(40)));
        assert!(long.ends_with('…') && long.chars().count() == 61, "{long}");
    }

    #[test]
    fn tracefs_formats_parse() {
        let text = "name: block_rq_issue\nformat:\n\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\n\tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:char rwbs[10];\toffset:34;\tsize:10;\tsigned:0;\n\tfield:__data_loc char[] cmd;\toffset:60;\tsize:4;\tsigned:0;\n";
        let f = super::parse_format(text);
        assert_eq!(f.get("dev"), Some(&(8, 4)));
        assert_eq!(f.get("rwbs"), Some(&(34, 10)));
        assert_eq!(f.get("cmd"), Some(&(60, 4)));
        assert_eq!(f.get("common_type"), Some(&(0, 2)));
        // Linux 6.1.0-56 (Debian 12), as its tracefs printed it in a guest.
        let text = "\tfield:dev_t dev;\toffset:8;\tsize:4;\tsigned:0;\n\tfield:sector_t sector;\toffset:16;\tsize:8;\tsigned:0;\n\tfield:unsigned int nr_sector;\toffset:24;\tsize:4;\tsigned:0;\n\tfield:unsigned int bytes;\toffset:28;\tsize:4;\tsigned:0;\n\tfield:char rwbs[8];\toffset:32;\tsize:8;\tsigned:1;\n\tfield:char comm[16];\toffset:40;\tsize:16;\tsigned:1;\n\tfield:__data_loc char[] cmd;\toffset:56;\tsize:4;\tsigned:1;\n";
        let f = super::parse_format(text);
        assert_eq!(f.get("rwbs"), Some(&(32, 8)));
        assert_eq!(f.get("bytes"), Some(&(28, 4)));
    }

    use super::*;

    #[test]
    fn refusals_are_cut_to_one_line() {
        let log = format!("load sock_exit: too long. Verifier output: {}BPF program is too large.\n", "0: (bf) r7 = r1\n".repeat(10_000));
        let l = one_line(&log);
        assert!(l.len() < 600 && !l.contains('\n'), "{l}");
        assert!(l.starts_with("load sock_exit") && l.ends_with("too large. | "), "{l}");
    }

    #[test]
    fn forced_fallbacks_name_probes_or_all() {
        let env = |v: Option<&str>| AttachEnv { fallback: v.map(String::from), ..AttachEnv::default() };
        assert!(!env(None).forced_fallback("umount_tail_end"));
        assert!(env(Some("all")).forced_fallback("umount_tail_end"));
        assert!(env(Some("socket_io, umount_tail_end")).forced_fallback("umount_tail_end"));
        assert!(!env(Some("socket_io")).forced_fallback("umount_tail_end"));
        assert!(!env(Some("umount_tail")).forced_fallback("umount_tail_end"));
        assert!(Variant::Fexit { program: "p", function: "f" }.on_kernel_function());
        assert!(!PROBES[2].variants[1].on_kernel_function());
    }

    #[test]
    fn table_is_sound() {
        // The socket probe's functions are its tracepoints' syscalls, slot for slot.
        for (h, name) in SOCK_FUNCTIONS.iter().zip(SOCK_SYSCALLS) {
            assert_eq!(h.syscall, name);
            assert_eq!(h.enter, Some(format!("sock_fentry_{name}").as_str()));
            assert_eq!(h.exit, Some(format!("sock_fexit_{name}").as_str()));
        }
        // The waits' functions are the watched syscalls' (by their tracepoint names), slot for slot.
        for ((e, x), w) in WAIT_ENTER_FUNCTIONS.iter().zip(&WAIT_EXIT_FUNCTIONS).zip(WATCHED) {
            assert_eq!((e.syscall, x.syscall), (w.tracepoint, w.tracepoint));
            assert_eq!(e.enter, Some(format!("wait_fentry_{}", w.tracepoint).as_str()));
            assert_eq!(x.exit, Some(format!("wait_fexit_{}", w.tracepoint).as_str()));
        }
        for p in PROBES {
            assert!(!p.variants.is_empty(), "{}", p.name);
            if !p.required {
                assert!(matches!(p.variants.last(), Some(Variant::ProcPoll | Variant::Off)), "{} needs a last-resort variant", p.name);
            }
            // A probe that can be off says what goes unseen then; one that falls back
            // to a /proc poll or can't be off loses nothing but timing.
            let can_be_off = matches!(p.variants.last(), Some(Variant::Off));
            assert_eq!(can_be_off, p.loses.is_some(), "{}: loses must be said exactly when the probe can be off", p.name);
        }
        assert_eq!(PROBES[0].variants[0].describe(), "fentry __x64_sys_{umount,sync,syncfs,fsync,fdatasync,sync_file_range}");
        assert_eq!(PROBES[1].variants[0].describe(), "fexit __x64_sys_{umount,sync,syncfs,fsync,fdatasync,sync_file_range}");
        assert_eq!(PROBES[0].variants[1].describe(), "tracepoint syscalls:sys_enter_{umount,sync,syncfs,fsync,fdatasync,sync_file_range}");
        assert_eq!(PROBES[2].variants[0].describe(), "fexit task_work_run");
        assert_eq!(PROBES[2].variants[1].describe(), "raw_tp sys_enter");
        assert_eq!(PROBES[4].variants[0].describe(), "fentry+fexit __x64_sys_{socket,connect,close}");
        assert_eq!(PROBES[5].variants[0].describe(), "fentry+fexit __x64_sys_{write,writev,sendto,sendmsg,read,readv,recvfrom,recvmsg}");
        assert!(PROBES[5].variants[0].on_kernel_function());
        assert_eq!(
            PROBES[5].variants[1].describe(),
            "tracepoint syscalls:sys_exit_{write,writev,sendto,sendmsg,read,readv,recvfrom,recvmsg} + \
             syscalls:sys_enter_{write,writev,sendto,sendmsg,read,readv,recvfrom,recvmsg}"
        );
        assert_eq!(
            PROBES[5].variants[2].describe(),
            "tracepoint syscalls:sys_exit_{write,writev,sendto,sendmsg,read,readv,recvfrom,recvmsg} (no bpf_loop) + \
             syscalls:sys_enter_{write,writev,sendto,sendmsg,read,readv,recvfrom,recvmsg}"
        );
        assert_eq!(
            PROBES[6].variants[0].describe(),
            "fentry+fexit __x64_sys_{dup2,dup3,close_range} + tracepoint sched:sched_process_exec"
        );
        assert_eq!(PROBES[7].variants[0].describe(), "fentry+fexit __x64_sys_{wait4,waitid} + tracepoint sched:sched_process_exit");
    }

    #[test]
    fn best_variants_leave_syscalls_off_the_tracing_path() {
        // Any one syscall tracepoint (or a program on raw_syscalls) puts every thread's
        // syscalls on the kernel's tracing slow path: with each probe's first variant,
        // none is attached.
        for p in PROBES {
            let tps: &[Tp] = match p.variants[0] {
                Variant::Tracepoints(tps) | Variant::SyscallFunctions(_, _, tps) => tps,
                Variant::RawTracepoint { tracepoint, .. } => {
                    assert!(!tracepoint.starts_with("sys_"), "{}", p.name);
                    &[]
                }
                _ => &[],
            };
            for t in tps {
                assert!(!matches!(t.category, "syscalls" | "raw_syscalls"), "{}: {}", p.name, p.variants[0].describe());
            }
        }
    }
}
