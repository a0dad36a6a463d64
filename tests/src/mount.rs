//! A mount that is undone when its guard drops, and a `/proc/self/mountinfo` lookup.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use crate::sys::run;

/// A filesystem mounted with `mount(8)`; dropping it unmounts it if it is still mounted
/// (lazily if a plain umount fails), logging to stderr what could not be undone.
///
/// "Still mounted" is read from `/proc/self/mountinfo` at drop, so a test may unmount the
/// target behind the guard's back (the umount scenario does, from a child process).
#[derive(Debug)]
pub struct Mount {
    target: PathBuf,
}

impl Mount {
    /// `mount -t FSTYPE [-o OPTIONS] SOURCE TARGET`.
    pub fn new(source: impl AsRef<OsStr>, target: &Path, fstype: &str, options: Option<&str>) -> Result<Self> {
        let mut cmd = Command::new("mount");
        cmd.args(["-t", fstype]);
        if let Some(options) = options {
            cmd.args(["-o", options]);
        }
        run(cmd.arg(source).arg(target))?;
        Ok(Self { target: target.to_path_buf() })
    }

    pub fn target(&self) -> &Path {
        &self.target
    }

    pub fn is_mounted(&self) -> Result<bool> {
        is_mount_point(&self.target)
    }

    /// Unmounts now and reports a failure (which dropping the guard only logs).
    pub fn unmount(self) -> Result<()> {
        run(Command::new("umount").arg(&self.target)).map(drop)
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Ok(false) = self.is_mounted() {
            return;
        }
        if let Err(e) = run(Command::new("umount").arg(&self.target)) {
            eprintln!("cleanup: {e:#}; trying a lazy unmount");
            if let Err(e) = run(Command::new("umount").arg("-l").arg(&self.target)) {
                eprintln!("cleanup: {e:#}; {} stays mounted", self.target.display());
            }
        }
    }
}

/// Whether `path` (compared as given, so pass a canonical path) is a mount point in this
/// process's mount namespace.
pub fn is_mount_point(path: &Path) -> Result<bool> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").context("read /proc/self/mountinfo")?;
    let wanted = path.as_os_str().to_string_lossy();
    Ok(info.lines().filter_map(|line| line.split(' ').nth(4)).any(|mount_point| unescape_mountinfo(mount_point) == wanted))
}

/// Undoes the octal escapes (`\040` for a space, ...) the kernel writes into mountinfo paths.
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::unescape_mountinfo;

    #[test]
    fn mountinfo_escapes() {
        assert_eq!(unescape_mountinfo(r"/tmp/a\040b\134c"), r"/tmp/a b\c");
        assert_eq!(unescape_mountinfo(r"/plain\"), r"/plain\");
    }
}
