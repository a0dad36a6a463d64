//! Thin wrappers over the OS: thread ids, device numbers, and running the system's tools.

use std::fmt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The calling thread's kernel thread id (what plegwatch reports as `tid`).
pub fn gettid() -> u32 {
    // SAFETY: gettid(2) takes no arguments and cannot fail.
    let tid = unsafe { libc::gettid() };
    tid as u32
}

/// A block device number, printed as the kernel does: `MAJ:MIN`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DevNum {
    pub major: u32,
    pub minor: u32,
}

impl DevNum {
    /// The device number of the block device node at `path` (its `st_rdev`).
    pub fn of_block_device(path: &Path) -> Result<Self> {
        let meta = std::fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
        if !meta.file_type().is_block_device() {
            bail!("{} is not a block device", path.display());
        }
        let rdev = meta.rdev();
        Ok(Self { major: libc::major(rdev), minor: libc::minor(rdev) })
    }
}

impl fmt::Display for DevNum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.major, self.minor)
    }
}

/// Runs `cmd` to completion and returns its stdout; a failure to start or a non-zero exit is
/// an error that quotes the command line and its stderr.
pub fn run(cmd: &mut Command) -> Result<String> {
    run_recorded(cmd, &mut Vec::new())
}

/// [`run`], noting the child's pid in `pids` (so that a test can tell its own processes
/// from others' in what plegwatch reports).
pub fn run_recorded(cmd: &mut Command, pids: &mut Vec<u32>) -> Result<String> {
    let line = format!("{cmd:?}");
    let child =
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().with_context(|| format!("cannot run {line}"))?;
    pids.push(child.id());
    let out = child.wait_with_output().with_context(|| format!("waiting for {line}"))?;
    if !out.status.success() {
        bail!("{line} failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
