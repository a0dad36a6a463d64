//! `cargo xtask test`: every test tier that cargo alone can't sequence.
//!
//! Stages, in order; the first failure stops the run with a non-zero exit:
//! 1. unit tests of the whole workspace except the scenario crate (no root);
//! 2. the privileged scenarios against the real kernel (root; one thread, since they
//!    share mounts, throttles and daemons);
//! 3. (to come) fuzzing.

use anyhow::{bail, Result};

use crate::{cmd, run, setup};

/// The privileged scenario crate in `tests/`.
const SCENARIOS: &str = "plegwatch-scenarios";

pub fn run() -> Result<()> {
    cmd::header("setup");
    setup::ensure()?;
    unit_tests()?;
    scenarios()?;
    // Fuzz stage: add `fuzz()?;` here (e.g. a short time-boxed `cargo fuzz run` per target).
    eprintln!("\nxtask test: all stages passed");
    Ok(())
}

fn unit_tests() -> Result<()> {
    cmd::header("unit tests (unprivileged)");
    cmd::run(cmd::cargo().args(["test", "--workspace", "--exclude", SCENARIOS]))
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
