//! What every scenario checks first: root, and a `plegwatch` binary to run.
//!
//! A missing prerequisite fails the test with a message saying what to do; it never turns
//! into a silent pass. Only a missing optional kernel feature is a [`skip`], and under CI
//! even that fails.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};

/// The environment variable `cargo xtask test` sets to the absolute path of `plegwatch`.
pub const BIN_ENV: &str = "PLEGWATCH_BIN";

/// Panics unless the test runs as root with [`BIN_ENV`] naming an executable; returns its
/// path. The first call also marks every fd this test process inherited above stderr
/// close-on-exec (a CI runner hands tests a pipe it leaked), so that no helper a scenario
/// starts holds one: they shift the fd numbers a helper counts on, and a pipe end held by
/// a helper keeps its reader from seeing EOF.
pub fn require() -> PathBuf {
    static INHERITED: std::sync::Once = std::sync::Once::new();
    INHERITED.call_once(|| {
        // SAFETY: close_range(2) with CLOSE_RANGE_CLOEXEC only sets a flag on this
        // process's own fds; nothing is closed.
        let _ = unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    });
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert!(
        euid == 0,
        "plegwatch scenario tests need root (euid is {euid}): they load eBPF, attach loop \
         devices and mount filesystems. Run them with `cargo xtask test` as root."
    );
    plegwatch_bin().unwrap_or_else(|e| panic!("{e:#}"))
}

/// The `plegwatch` binary named by [`BIN_ENV`], checked to be an executable file.
pub fn plegwatch_bin() -> Result<PathBuf> {
    let Some(bin) = std::env::var_os(BIN_ENV) else {
        bail!(
            "{BIN_ENV} is not set: it must name the plegwatch binary to test. Run the \
             scenarios with `cargo xtask test`, or set it yourself, e.g. \
             {BIN_ENV}=$PWD/target/debug/plegwatch cargo test -p plegwatch-scenarios -- \
             --test-threads=1"
        );
    };
    let bin = PathBuf::from(bin);
    let meta = std::fs::metadata(&bin).with_context(|| format!("{BIN_ENV}={} cannot be read", bin.display()))?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        bail!("{BIN_ENV}={} is not an executable file", bin.display());
    }
    Ok(bin)
}

/// Prints why `scenario` does not run; the caller then returns early. Under CI (`CI` set)
/// a missing precondition fails the test instead, naming what is missing: CI must never
/// pass a scenario it did not run.
pub fn skip(scenario: &str, reason: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("{scenario} cannot run under CI: {reason}");
    }
    eprintln!("SKIPPED {scenario}: {reason}");
}
