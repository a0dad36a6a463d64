//! `cargo xtask test`: every test tier that cargo alone can't sequence.
//!
//! Stages, in order; the first failure stops the run with a non-zero exit:
//! 1. unit tests of the whole workspace except the scenario crate (no root);
//! 2. the privileged scenarios against the real kernel (root; one thread, since they
//!    share mounts, throttles and daemons);
//! 3. a short fuzz run of each parser target (cargo-fuzz, nightly).
//!
//! `--soak` runs the scenarios' negative soak (`negative_soak`: ordinary container,
//! D-Bus, netlink, sync and mount traffic that must raise no incident) for
//! [`SOAK_SECS`] instead of its default 60 s, through the scenario crate's
//! `PLEGWATCH_SOAK_SECS`.

use anyhow::{bail, Result};

use crate::{cmd, run, setup};

/// The privileged scenario crate in `tests/`.
const SCENARIOS: &str = "plegwatch-scenarios";
/// How the scenario crate is told how long its negative soak runs, in seconds.
const SOAK_ENV: &str = "PLEGWATCH_SOAK_SECS";
/// The soak's length under `--soak`: 10 minutes.
const SOAK_SECS: u32 = 600;

/// Arguments of `cargo xtask test`.
#[derive(clap::Args)]
pub struct Args {
    /// Run the negative soak scenario (negative_soak) for 10 minutes instead of 60 s
    /// (sets PLEGWATCH_SOAK_SECS=600 for the scenario crate).
    #[arg(long)]
    pub soak: bool,
}

pub fn run(args: &Args) -> Result<()> {
    cmd::header("setup");
    setup::ensure()?;
    unit_tests()?;
    scenarios(args.soak.then_some(SOAK_SECS))?;
    fuzz()?;
    eprintln!("\nxtask test: all stages passed");
    Ok(())
}

fn unit_tests() -> Result<()> {
    cmd::header("unit tests (unprivileged)");
    cmd::run(cmd::cargo().args(["test", "--workspace", "--exclude", SCENARIOS]))
}

/// The cargo-fuzz targets in `fuzz/`: parsers of untrusted bytes (netlink and D-Bus
/// captures, ELF files, ttrpc frame headers, another process's `runtime.g`).
pub const FUZZ_TARGETS: &[&str] = &["netlink_parse", "dbus_stream", "gopclntab", "ttrpc_header", "goroutine_decode"];
/// Seconds each target runs in `cargo xtask test`: a smoke run that catches
/// regressions on the seeds and a little beyond, not a campaign (that is
/// `cargo xtask fuzz`).
const FUZZ_SECONDS: u32 = 10;

fn fuzz() -> Result<()> {
    cmd::header("fuzz (short runs)");
    run_fuzz(FUZZ_TARGETS, FUZZ_SECONDS)
}

/// Arguments of `cargo xtask fuzz`.
#[derive(clap::Args)]
pub struct FuzzArgs {
    /// Minutes each target runs.
    #[arg(long, value_name = "M", default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=1440))]
    pub minutes: u32,
    /// Only these targets (repeatable) [default: all].
    #[arg(long, value_name = "TARGET")]
    pub target: Vec<String>,
}

/// `cargo xtask fuzz`: every parser target (or those named) for `--minutes` each, its
/// corpus kept under the temporary directory between runs; a crash stops it with the
/// reproducing input in `fuzz/artifacts/`.
pub fn fuzz_campaign(args: &FuzzArgs) -> Result<()> {
    let targets: Vec<&str> = if args.target.is_empty() {
        FUZZ_TARGETS.to_vec()
    } else {
        for t in &args.target {
            if !FUZZ_TARGETS.contains(&t.as_str()) {
                bail!("unknown fuzz target {t} (known: {})", FUZZ_TARGETS.join(", "));
            }
        }
        args.target.iter().map(String::as_str).collect()
    };
    cmd::header(&format!("fuzz: {} target(s), {} min each", targets.len(), args.minutes));
    run_fuzz(&targets, args.minutes * 60)
}

fn run_fuzz(targets: &[&str], seconds: u32) -> Result<()> {
    let root = cmd::workspace_root();
    for target in targets {
        let seconds = seconds.to_string();
        let target = *target;
        let corpus = std::env::temp_dir().join(format!("plegwatch-fuzz-{target}"));
        std::fs::create_dir_all(&corpus)?;
        let seeds = root.join("fuzz/seeds").join(target);
        cmd::run(
            std::process::Command::new("cargo")
                .current_dir(root.join("fuzz"))
                .args(["+nightly", "fuzz", "run", target])
                .arg(&corpus)
                .arg(&seeds)
                .args(["--", &format!("-max_total_time={seconds}"), "-print_final_stats=1"]),
        )?;
    }
    Ok(())
}

/// The scenarios, with the negative soak run for `soak_secs` when given.
fn scenarios(soak_secs: Option<u32>) -> Result<()> {
    cmd::header("privileged scenarios");
    if !cmd::is_root() {
        bail!("the privileged scenarios (cargo test -p {SCENARIOS}) need root: run `cargo xtask test` as root");
    }
    run::build_debug()?;
    let mut cargo = cmd::cargo();
    cargo.env("PLEGWATCH_BIN", run::debug_binary());
    if let Some(secs) = soak_secs {
        eprintln!("negative soak: {secs} s ({SOAK_ENV}={secs})");
        cargo.env(SOAK_ENV, secs.to_string());
    }
    cmd::run(cargo.args(["test", "-p", SCENARIOS, "--", "--test-threads=1"]))
}
