//! The attach table: every probe with its variants, best first, and the one
//! function that picks among them at startup by trying them for real.
//!
//! A variant that fails to load or attach is logged with the kernel's reason
//! and the next one is tried; the choice is logged at `info` and printed by
//! `plegwatch doctor` and in the `ready` line.

use crate::{output::ProbeChoice, syscalls::WATCHED};
use aya::{
    Ebpf,
    programs::{RawTracePoint, TracePoint},
};
use thiserror::Error;

/// Where a variant attaches.
#[derive(Clone, Copy, Debug)]
pub enum Variant {
    /// A classic tracepoint program attached to each of `names` in `category`.
    Tracepoint {
        program: &'static str,
        category: &'static str,
        names: Names,
    },
    /// A raw tracepoint program.
    RawTracepoint {
        program: &'static str,
        tracepoint: &'static str,
    },
    /// No kernel program: the collector polls `/proc` for this job at each scan
    /// (coarser timing, same result).
    ProcPoll,
}

/// The tracepoint names of a [`Variant::Tracepoint`].
#[derive(Clone, Copy, Debug)]
pub enum Names {
    /// `sys_enter_<tp>` for every watched syscall.
    SyscallEnter,
    /// `sys_exit_<tp>` for every watched syscall.
    SyscallExit,
    One(&'static str),
}

impl Names {
    fn list(self) -> Vec<String> {
        match self {
            Names::SyscallEnter => WATCHED
                .iter()
                .map(|w| format!("sys_enter_{}", w.tracepoint))
                .collect(),
            Names::SyscallExit => WATCHED
                .iter()
                .map(|w| format!("sys_exit_{}", w.tracepoint))
                .collect(),
            Names::One(n) => vec![n.to_string()],
        }
    }
}

impl Variant {
    /// A short description, e.g. `tracepoint syscalls:sys_enter_{umount,sync,...}`.
    pub fn describe(&self) -> String {
        match self {
            Variant::Tracepoint {
                category, names, ..
            } => {
                let list = names.list();
                if list.len() == 1 {
                    format!("tracepoint {category}:{}", list[0])
                } else {
                    let prefix = match names {
                        Names::SyscallEnter => "sys_enter_",
                        _ => "sys_exit_",
                    };
                    let tps: Vec<_> = WATCHED.iter().map(|w| w.tracepoint).collect();
                    format!("tracepoint {category}:{prefix}{{{}}}", tps.join(","))
                }
            }
            Variant::RawTracepoint { tracepoint, .. } => format!("raw_tp {tracepoint}"),
            Variant::ProcPoll => "/proc poll".to_string(),
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
}

/// Every probe `plegwatch watch` attaches.
pub const PROBES: &[Probe] = &[
    Probe {
        name: "wait_enter",
        about: "opens a wait at sys_enter of umount2 and the sync family",
        required: true,
        variants: &[Variant::Tracepoint {
            program: "wait_enter",
            category: "syscalls",
            names: Names::SyscallEnter,
        }],
    },
    Probe {
        name: "wait_exit",
        about: "closes it at sys_exit (umount2 goes on in task_work)",
        required: true,
        variants: &[Variant::Tracepoint {
            program: "wait_exit",
            category: "syscalls",
            names: Names::SyscallExit,
        }],
    },
    Probe {
        name: "umount_tail_end",
        about: "closes a umount2 wait when its thread is back in user space",
        required: false,
        variants: &[
            Variant::RawTracepoint {
                program: "tail_end_raw",
                tracepoint: "sys_enter",
            },
            Variant::Tracepoint {
                program: "tail_end_tp",
                category: "raw_syscalls",
                names: Names::One("sys_enter"),
            },
            Variant::ProcPoll,
        ],
    },
    Probe {
        name: "thread_exit",
        about: "closes the waits of threads that exit",
        required: false,
        variants: &[
            Variant::Tracepoint {
                program: "thread_exit",
                category: "sched",
                names: Names::One("sched_process_exit"),
            },
            Variant::ProcPoll,
        ],
    },
];

#[derive(Debug, Error)]
pub enum ProbeError {
    #[error("required probe {probe} could not attach: {reasons}")]
    Required {
        probe: &'static str,
        reasons: String,
    },
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

    pub fn to_output(&self) -> ProbeChoice {
        ProbeChoice {
            probe: self.probe.to_string(),
            variant: self.variant.describe(),
        }
    }
}

/// Attaches every probe of [`PROBES`], each with the best variant that works.
pub fn attach_all(ebpf: &mut Ebpf) -> Result<Vec<Choice>, ProbeError> {
    PROBES.iter().map(|p| attach(ebpf, p)).collect()
}

/// Attaches one probe with the best variant that works.
pub fn attach(ebpf: &mut Ebpf, probe: &Probe) -> Result<Choice, ProbeError> {
    let mut passed_over = Vec::new();
    for v in probe.variants {
        match try_variant(ebpf, v) {
            Ok(()) => {
                if passed_over.is_empty() {
                    tracing::info!(probe = probe.name, variant = %v.describe(), "probe attached");
                } else {
                    tracing::warn!(probe = probe.name, variant = %v.describe(), passed_over = ?passed_over, "probe attached with a fallback");
                }
                return Ok(Choice {
                    probe: probe.name,
                    variant: *v,
                    passed_over,
                });
            }
            Err(e) => passed_over.push(format!("{}: {e}", v.describe())),
        }
    }
    // Optional probes end with a ProcPoll variant, which always works.
    Err(ProbeError::Required {
        probe: probe.name,
        reasons: passed_over.join("; "),
    })
}

fn try_variant(ebpf: &mut Ebpf, v: &Variant) -> Result<(), String> {
    match *v {
        Variant::Tracepoint {
            program,
            category,
            names,
        } => {
            let prog: &mut TracePoint = program_mut(ebpf, program)?;
            prog.load()
                .or_else(already_loaded)
                .map_err(|e| format!("load {program}: {e}"))?;
            let mut links = Vec::new();
            for name in names.list() {
                match prog.attach(category, &name) {
                    Ok(l) => links.push(l),
                    Err(e) => {
                        for l in links {
                            let _ = prog.detach(l);
                        }
                        return Err(format!("attach {program} to {category}:{name}: {e}"));
                    }
                }
            }
            Ok(())
        }
        Variant::RawTracepoint {
            program,
            tracepoint,
        } => {
            let prog: &mut RawTracePoint = program_mut(ebpf, program)?;
            prog.load()
                .or_else(already_loaded)
                .map_err(|e| format!("load {program}: {e}"))?;
            prog.attach(tracepoint)
                .map(|_| ())
                .map_err(|e| format!("attach {program} to {tracepoint}: {e}"))
        }
        Variant::ProcPoll => Ok(()),
    }
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
    use super::*;

    #[test]
    fn table_is_sound() {
        for p in PROBES {
            assert!(!p.variants.is_empty(), "{}", p.name);
            if !p.required {
                assert!(
                    matches!(p.variants.last(), Some(Variant::ProcPoll)),
                    "{} needs a last-resort variant",
                    p.name
                );
            }
        }
        assert_eq!(
            PROBES[0].variants[0].describe(),
            "tracepoint syscalls:sys_enter_{umount,sync,syncfs,fsync,fdatasync,sync_file_range}"
        );
        assert_eq!(PROBES[2].variants[0].describe(), "raw_tp sys_enter");
    }
}
