//! Loads tracepoint programs of plegwatch's eBPF object one by one, with the
//! globals the loader sets, and prints for each whether the running kernel's
//! verifier took it: the instructions it processed (Linux >= 5.16 reports
//! them), or its whole log. Nothing is attached.
//!
//! ```text
//! sudo target/debug/examples/verifier sock_exit sock_exit_nl > log.txt
//! ```
//! With no name, every tracepoint program in the object is loaded.

use std::time::Duration;

use aya::programs::{ProgramError, TracePoint};
use plegwatch::kernel::loader::{self, LoadOptions};

fn main() -> anyhow::Result<()> {
    let (mut ebpf, _) = loader::load(LoadOptions { report_min: Duration::from_secs(1), tracer_tgid: std::process::id() })?;
    let mut names: Vec<String> = std::env::args().skip(1).collect();
    if names.is_empty() {
        names = ebpf.programs().filter(|(_, p)| matches!(p, aya::programs::Program::TracePoint(_))).map(|(n, _)| n.to_string()).collect();
        names.sort();
    }
    for name in names {
        let Some(prog) = ebpf.program_mut(&name) else {
            println!("{name}: not in the object");
            continue;
        };
        let prog: &mut TracePoint = match prog.try_into() {
            Ok(p) => p,
            Err(e) => {
                println!("{name}: {e}");
                continue;
            }
        };
        match prog.load() {
            Ok(()) => {
                let insns = prog.info().ok().and_then(|i| i.verified_instruction_count());
                match insns {
                    Some(n) => println!("{name}: loaded, {n} insns processed"),
                    None => println!("{name}: loaded"),
                }
            }
            Err(ProgramError::LoadError { io_error, verifier_log }) => {
                println!("{name}: refused: {io_error}\n{verifier_log}\n--- end of {name}");
            }
            Err(e) => println!("{name}: {e}"),
        }
    }
    Ok(())
}
