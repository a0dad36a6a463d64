//! `cargo xtask`: what cargo can't do on its own for plegwatch — install the toolchain,
//! run the tracer as root, run the privileged scenarios, and measure overhead.

mod bench;
mod cmd;
mod run;
mod setup;
mod test;
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Developer tasks for plegwatch.
///
/// Examples:
///   cargo xtask setup                  # install what is missing (quick when all is there)
///   cargo xtask run -- --json          # build and run `plegwatch watch --json` (root)
///   cargo xtask test                   # unit tests, then privileged scenarios (root)
///   cargo xtask test --soak            # the same, with the negative soak run for 10 minutes
///   cargo xtask test --kernel 6.1      # the seed scenarios in a guest on Debian 12's kernel
///   cargo xtask test --kernels all     # every kernel of the matrix (5.10, 6.1, 6.12)
///   cargo xtask vm 5.10 -- plegwatch doctor   # a command in a guest (root)
///   cargo xtask bench --rounds 1       # overhead vs. untraced and bpftrace (root)
///   cargo xtask bench --only relist    # ListContainers latency with and without plegwatch
#[derive(Parser)]
#[command(name = "cargo xtask", bin_name = "cargo xtask", verbatim_doc_comment)]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install missing Debian packages, nightly rust-src and bpf-linker (idempotent).
    Setup,
    /// Build plegwatch (debug) and exec `plegwatch watch ARGS` (needs root)
    ///
    /// Example: cargo xtask run -- --json
    #[command(verbatim_doc_comment)]
    Run(run::Args),
    /// Unit tests, then (as root) the privileged scenario tests
    ///
    /// Examples:
    ///   cargo xtask test
    ///   cargo xtask test --soak     # negative_soak runs 10 minutes instead of 60 s
    #[command(verbatim_doc_comment)]
    Test(test::Args),
    /// Overhead benchmark: syscall loops untraced, under plegwatch and under bpftrace; containerd's
    /// ListContainers latency under the relist driver, untraced and under plegwatch (needs root)
    ///
    /// Examples:
    ///   cargo xtask bench --rounds 1 --iterations 50000
    ///   cargo xtask bench --only relist --rounds 1 --relist-seconds 5
    #[command(verbatim_doc_comment)]
    Bench(bench::Args),
    /// Fuzz the parsers of untrusted bytes (cargo-fuzz, nightly): netlink, D-Bus, gopclntab,
    /// ttrpc headers, goroutine descriptors; `cargo xtask test` runs each for 10 s
    ///
    /// Examples:
    ///   cargo xtask fuzz                       # every target, 5 minutes each
    ///   cargo xtask fuzz --minutes 30 --target gopclntab
    #[command(verbatim_doc_comment)]
    Fuzz(test::FuzzArgs),
    /// Boot a Debian kernel in a guest (virtme-ng, QEMU TCG) and run a command in it as root,
    /// with this host's files (read-only, copy-on-write) and the target directory (read-write)
    ///
    /// Examples:
    ///   cargo xtask vm 6.1 -- uname -r
    ///   cargo xtask vm 5.10 -- target/debug/plegwatch doctor
    #[command(verbatim_doc_comment)]
    Vm(vm::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup::run(),
        Task::Run(args) => run::run(&args),
        Task::Test(args) => test::run(&args),
        Task::Bench(args) => bench::run(&args),
        Task::Fuzz(args) => test::fuzz_campaign(&args),
        Task::Vm(args) => vm::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` keeps the whole context chain on one line.
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
