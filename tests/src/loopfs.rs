//! An ext4 filesystem on a loop device backed by a sparse image in a temp dir.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use tempfile::TempDir;

use crate::mount::{is_mount_point, Mount};
use crate::sys::{run, DevNum};

/// A loop-mounted ext4. Dropping it unmounts it if still mounted (lazily if need be),
/// detaches the loop device and deletes the image: the fields below drop in that order.
///
/// Put a [`crate::WriteThrottle`] on [`LoopFs::dev`] to make its writeback slow; declare the
/// throttle after the `LoopFs` so that it is removed before the cleanup unmount.
#[derive(Debug)]
pub struct LoopFs {
    mount: Option<Mount>,
    device: LoopDevice,
    mount_point: PathBuf,
    _dir: TempDir,
}

impl LoopFs {
    /// Image size for the scenarios: room for a few dirty MiB and then some.
    pub const DEFAULT_SIZE: u64 = 128 << 20;

    /// Creates a sparse image of `size` bytes, attaches it, makes an ext4 on it and mounts it.
    ///
    /// The inode tables and journal are initialised by mkfs (not lazily by the kernel later),
    /// so no background write goes through a throttle put on the device afterwards.
    pub fn new(size: u64) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("plegwatch-loopfs-").tempdir().context("create a temp dir for the loop image")?;
        let root = dir.path().canonicalize()?;
        let image = root.join("disk.img");
        let mount_point = root.join("mnt");
        std::fs::create_dir(&mount_point)?;
        File::create(&image).and_then(|f| f.set_len(size)).with_context(|| format!("create the sparse image {}", image.display()))?;
        let device = LoopDevice::attach(&image)?;
        run(Command::new("mkfs.ext4").args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]).arg(&device.path))?;
        let mut fs = Self { mount: None, device, mount_point, _dir: dir };
        fs.mount()?;
        Ok(fs)
    }

    /// Where the filesystem is (or was) mounted; a canonical path.
    pub fn mount_point(&self) -> &Path {
        &self.mount_point
    }

    /// Unmounts it with umount(8), a process of its own (single-threaded: its pid is the
    /// waiting thread's tid), timed from the spawn: its pid and how long it took. Fails when
    /// umount(8) does.
    pub fn umount_timed(&self) -> Result<(u32, std::time::Duration)> {
        let started = std::time::Instant::now();
        let mut umount = Command::new("umount").arg(&self.mount_point).spawn().context("spawn umount")?;
        let pid = umount.id();
        let status = umount.wait()?;
        let took = started.elapsed();
        eprintln!("umount {} took {:.3}s ({status})", self.mount_point.display(), took.as_secs_f64());
        anyhow::ensure!(status.success(), "umount {} failed: {status}", self.mount_point.display());
        Ok((pid, took))
    }

    /// The `detail` of a stall line for a umount of this file system that went on in its
    /// task_work tail (the syscall returned long before the --warn mark).
    pub fn umount_tail_detail(&self) -> Vec<(&'static str, serde_json::Value)> {
        use serde_json::json;
        vec![
            ("syscall", json!("umount2")),
            ("target", json!(self.mount_point)),
            ("fstype", json!("ext4")),
            ("device", json!(self.device())),
            ("dev", json!(self.dev().to_string())),
            ("phase", json!("task_work")),
        ]
    }

    /// The loop device, e.g. `/dev/loop0`.
    pub fn device(&self) -> &Path {
        &self.device.path
    }

    /// The loop device's `MAJ:MIN`.
    pub fn dev(&self) -> DevNum {
        self.device.dev
    }

    pub fn is_mounted(&self) -> Result<bool> {
        is_mount_point(&self.mount_point)
    }

    /// Mounts the filesystem again after [`LoopFs::unmount`] (or an umount from elsewhere).
    pub fn mount(&mut self) -> Result<()> {
        self.mount = Some(Mount::new(&self.device.path, &self.mount_point, "ext4", None)?);
        Ok(())
    }

    /// Unmounts the filesystem now, keeping the device and image for a later [`LoopFs::mount`].
    pub fn unmount(&mut self) -> Result<()> {
        match self.mount.take() {
            Some(mount) => mount.unmount(),
            None => Ok(()),
        }
    }
}

/// A loop device attached to an image file; dropping it detaches it (`losetup -d`, which a
/// busy device turns into autoclear).
#[derive(Debug)]
struct LoopDevice {
    path: PathBuf,
    dev: DevNum,
}

impl LoopDevice {
    fn attach(image: &Path) -> Result<Self> {
        let out = run(Command::new("losetup").args(["--find", "--show"]).arg(image))?;
        let path = PathBuf::from(out.trim());
        match DevNum::of_block_device(&path) {
            Ok(dev) => Ok(Self { path, dev }),
            Err(e) => {
                detach(&path);
                Err(e)
            }
        }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        detach(&self.path);
    }
}

fn detach(device: &Path) {
    if let Err(e) = run(Command::new("losetup").arg("-d").arg(device)) {
        eprintln!("cleanup: {e:#}");
    }
}
