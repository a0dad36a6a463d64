//! `cargo xtask test`: every test tier that cargo alone can't sequence.
//!
//! Stages, in order; the first failure stops the run with a non-zero exit:
//! 1. unit tests of the whole workspace except the scenario crate (no root);
//! 2. the privileged scenarios against the real kernel (root; one thread, since they
//!    share mounts, throttles and daemons);
//! 3. a short fuzz run of each parser target (cargo-fuzz, nightly).

use anyhow::{bail, Result};

use crate::{cmd, run, setup};

/// The privileged scenario crate in `tests/`.
const SCENARIOS: &str = "plegwatch-scenarios";

pub fn run() -> Result<()> {
    cmd::header("setup");
    setup::ensure()?;
    unit_tests()?;
    scenarios()?;
    fuzz()?;
    eprintln!("\nxtask test: all stages passed");
    Ok(())
}

fn unit_tests() -> Result<()> {
    cmd::header("unit tests (unprivileged)");
    cmd::run(cmd::cargo().args(["test", "--workspace", "--exclude", SCENARIOS]))
}

/// The cargo-fuzz targets in `fuzz/`: parsers of untrusted bytes.
const FUZZ_TARGETS: &[&str] = &["netlink_parse", "dbus_stream", "gopclntab"];
/// Seconds each target runs: a smoke run that catches regressions on the
/// seeds and a little beyond, not a campaign.
const FUZZ_SECONDS: u32 = 20;

fn fuzz() -> Result<()> {
    cmd::header("fuzz (short runs)");
    let root = cmd::workspace_root();
    for target in FUZZ_TARGETS {
        let corpus = std::env::temp_dir().join(format!("plegwatch-fuzz-{target}"));
        std::fs::create_dir_all(&corpus)?;
        let seeds = root.join("fuzz/seeds").join(target);
        cmd::run(
            std::process::Command::new("cargo")
                .current_dir(root.join("fuzz"))
                .args(["+nightly", "fuzz", "run", target])
                .arg(&corpus)
                .arg(&seeds)
                .args(["--", &format!("-max_total_time={FUZZ_SECONDS}"), "-print_final_stats=1"]),
        )?;
    }
    Ok(())
}

fn scenarios() -> Result<()> {
    cmd::header("privileged scenarios");
    if !cmd::is_root() {
        bail!("the privileged scenarios (cargo test -p {SCENARIOS}) need root: run `cargo xtask test` as root");
    }
    run::build_debug()?;
    cmd::run(
        cmd::cargo()
            .env("PLEGWATCH_BIN", run::debug_binary())
            .args(["test", "-p", SCENARIOS, "--", "--test-threads=1"]),
    )
}
