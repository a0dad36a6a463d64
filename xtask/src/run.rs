//! `cargo xtask run [-- ARGS]`: build plegwatch and replace this process with
//! `plegwatch watch ARGS`, so Ctrl-C goes straight to plegwatch.

use std::os::unix::process::CommandExt;
use std::process::Command;

use anyhow::{bail, Result};

use crate::{cmd, setup};

/// Arguments of `cargo xtask run`.
#[derive(clap::Args)]
pub struct Args {
    /// Arguments passed to `plegwatch watch` (after `--`).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "ARGS")]
    pub args: Vec<String>,
}

pub fn run(args: &Args) -> Result<()> {
    setup::ensure()?;
    build_debug()?;
    if !cmd::is_root() {
        bail!("plegwatch watch needs root (CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN): run as root");
    }
    let mut watch = Command::new(debug_binary());
    watch.arg("watch").args(&args.args);
    let line = cmd::display(&watch);
    eprintln!("+ exec {line}");
    // exec only returns on failure.
    let err = watch.exec();
    bail!("cannot exec `{line}`: {err}")
}

/// `cargo build -p plegwatch` (debug profile).
pub fn build_debug() -> Result<()> {
    cmd::run(cmd::cargo().args(["build", "-p", "plegwatch"]))
}

/// `cargo build --release -p plegwatch`: what nodes run, and what the guests run (under
/// emulation the debug build's scans ran up to 2 s late; the release build's, 36 ms).
pub fn build_release() -> Result<()> {
    cmd::run(cmd::cargo().args(["build", "--release", "-p", "plegwatch"]))
}

/// The absolute path of the release `plegwatch` binary.
pub fn release_binary() -> std::path::PathBuf {
    cmd::target_dir().join("release").join("plegwatch")
}

/// The absolute path of the debug `plegwatch` binary.
pub fn debug_binary() -> std::path::PathBuf {
    cmd::target_dir().join("debug").join("plegwatch")
}
