//! `floor-rawtp`: one empty program on the `sys_enter` raw tracepoint, the floor the
//! issue holds plegwatch's fentry variants to. Debian 12's bpftrace (0.17) has no raw
//! tracepoints (its `raw_syscalls:sys_enter`, the `floor-raw` column, is a classic
//! tracepoint, on the perf path), so the program is built here with clang and loaded
//! with aya.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use aya::programs::RawTracePoint;

use crate::cmd;

/// The program's name in `xtask/bench/floor.bpf.c`.
const PROGRAM: &str = "floor_rawtp";

/// `clang-22 -O2 -target bpf -c xtask/bench/floor.bpf.c -o target/bench/floor.bpf.o`.
pub fn build(bench_dir: &Path) -> Result<PathBuf> {
    let source = cmd::workspace_root().join("xtask").join("bench").join("floor.bpf.c");
    let object = bench_dir.join("floor.bpf.o");
    cmd::run(Command::new("clang-22").args(["-O2", "-target", "bpf", "-c"]).arg(&source).arg("-o").arg(&object))?;
    Ok(object)
}

/// The empty program, attached while this lives (aya detaches it on drop).
pub struct RawTpFloor {
    _ebpf: aya::Ebpf,
}

impl RawTpFloor {
    /// Loads `object` (from [`build`]) and attaches its program to `sys_enter` (the loops'
    /// `measure` settles before it runs, as after every attach).
    pub fn attach(object: &Path) -> Result<Self> {
        raise_memlock();
        let mut ebpf = aya::Ebpf::load_file(object).with_context(|| format!("load {}", object.display()))?;
        let program: &mut RawTracePoint = ebpf
            .program_mut(PROGRAM)
            .with_context(|| format!("no program {PROGRAM} in {}", object.display()))?
            .try_into()
            .context("not a raw tracepoint program")?;
        program.load().context("load the raw_tp floor")?;
        program.attach("sys_enter").context("attach the raw_tp floor to sys_enter")?;
        Ok(RawTpFloor { _ebpf: ebpf })
    }
}

/// Kernels before 5.11 charge BPF maps and programs to RLIMIT_MEMLOCK (the 5.10 guest);
/// later ones to the memory cgroup.
fn raise_memlock() {
    let unlimited = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: a plain syscall on a valid struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        eprintln!("bench: cannot raise RLIMIT_MEMLOCK: {}", std::io::Error::last_os_error());
    }
}
