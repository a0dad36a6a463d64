//! `cargo xtask bench`: plegwatch's overhead on a tight syscall loop, against the same loop
//! untraced and under a bpftrace script doing equivalent enter/exit tracking, all measured
//! interleaved in one run. Ratios to the untraced loop are the figures; nothing here fails
//! on a number.

mod report;
mod tracer;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{cmd, setup};
use report::Sample;

/// Loop modes, with their default iteration counts.
const MODES: &[(&str, u64)] = &[("unix", 200_000), ("unixrw", 200_000), ("fsync", 20_000)];

/// Arguments of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Loop iterations per measurement, for every mode [default: 200000 for unix, 20000 for fsync].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// Rounds; each round measures every mode untraced, under plegwatch and under bpftrace.
    #[arg(long, value_name = "R", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
}

pub fn run(args: &Args) -> Result<()> {
    setup::ensure()?;
    if !cmd::is_root() {
        bail!("cargo xtask bench loads eBPF programs and needs root: run as root");
    }

    let bench_dir = cmd::target_dir().join("bench");
    std::fs::create_dir_all(&bench_dir)
        .with_context(|| format!("cannot create {}", bench_dir.display()))?;

    cmd::header("build");
    let loop_bin = compile_loop(&bench_dir)?;
    cmd::run(cmd::cargo().args(["build", "--release", "-p", "plegwatch"]))?;
    let plegwatch = cmd::target_dir().join("release").join("plegwatch");

    ensure_tracefs()?;
    let mut bpftrace_ok = match bpftrace_version() {
        Ok(version) => {
            eprintln!("bench: comparing against {version}");
            true
        }
        Err(e) => {
            eprintln!("bench: no bpftrace column: {e:#}");
            false
        }
    };

    cmd::header(&format!(
        "measure: {} round(s), logs in {}",
        args.rounds,
        bench_dir.display()
    ));
    let mut samples = Vec::new();
    for round in 1..=args.rounds {
        for &(mode, default_iterations) in MODES {
            let iterations = args.iterations.unwrap_or(default_iterations);
            let measure = || time_loop(&loop_bin, mode, iterations);

            let untraced = measure()?;

            let pw = tracer::plegwatch(&plegwatch, &bench_dir)?;
            let traced = measure();
            pw.stop();
            let under_plegwatch = traced?;

            let mut under_bpftrace = None;
            if bpftrace_ok {
                match tracer::bpftrace(&bench_dir) {
                    Ok(bt) => {
                        let traced = measure();
                        bt.stop();
                        under_bpftrace = Some(traced?);
                    }
                    Err(e) => {
                        eprintln!("bench: bpftrace failed to attach, continuing without it: {e:#}");
                        bpftrace_ok = false;
                    }
                }
            }

            let sample = Sample {
                mode,
                round,
                untraced,
                plegwatch: under_plegwatch,
                bpftrace: under_bpftrace,
            };
            eprintln!(
                "bench: round {round} {mode:<5} x{iterations}: untraced {untraced:.1} ns/op, plegwatch {under_plegwatch:.1}, bpftrace {}",
                under_bpftrace.map_or_else(|| "-".to_owned(), |b| format!("{b:.1}"))
            );
            samples.push(sample);
        }
    }

    let modes: Vec<&str> = MODES.iter().map(|&(m, _)| m).collect();
    println!();
    print!("{}", report::render(&samples, &modes));
    Ok(())
}

/// `cc -O2 xtask/bench/loop.c -o target/bench/loop`, every time (it takes a moment).
fn compile_loop(bench_dir: &Path) -> Result<PathBuf> {
    let source = cmd::workspace_root()
        .join("xtask")
        .join("bench")
        .join("loop.c");
    let binary = bench_dir.join("loop");
    cmd::run(
        Command::new("cc")
            .args(["-O2", "-Wall", "-o"])
            .arg(&binary)
            .arg(&source),
    )?;
    Ok(binary)
}

/// Run `loop MODE ITER` and parse the ns per iteration it prints.
fn time_loop(loop_bin: &Path, mode: &str, iterations: u64) -> Result<f64> {
    let mut command = Command::new(loop_bin);
    command.arg(mode).arg(iterations.to_string());
    let line = cmd::display(&command);
    let stdout = cmd::output(&mut command)?;
    let value: f64 = stdout
        .trim()
        .parse()
        .with_context(|| format!("`{line}` printed {:?}, not a number", stdout.trim()))?;
    Ok(value)
}

fn bpftrace_version() -> Result<String> {
    let out = cmd::output(Command::new("bpftrace").arg("--version"))
        .context("bpftrace is not available (Debian package bpftrace)")?;
    Ok(out.trim().to_owned())
}

/// bpftrace reads tracepoint formats from tracefs, which this machine kind does not mount at
/// boot. Mount it if needed and say so; it stays mounted, as plegwatch itself leaves it.
fn ensure_tracefs() -> Result<()> {
    const TRACEFS: &str = "/sys/kernel/tracing";
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    eprintln!("bench: tracefs is not mounted; mounting it at {TRACEFS}");
    cmd::run(Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))
}
