//! Dirty page cache on demand: data written and deliberately not synced, so that the next
//! umount, sync or fsync has to push it through the (throttled) device.

use std::fs::File;
use std::io::{self, Write};
use std::path::Path;

pub const MIB: usize = 1 << 20;

/// Writes `bytes` bytes of a non-zero pattern to `out` in 1 MiB chunks, without syncing.
pub fn fill(out: &mut impl Write, bytes: usize) -> io::Result<()> {
    let chunk: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8 + 1).collect();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(chunk.len());
        out.write_all(&chunk[..n])?;
        left -= n;
    }
    Ok(())
}

/// Creates (or truncates) `path` and writes `bytes` bytes to it, without syncing. Returns the
/// open file, so a caller can fsync it later; dropping it leaves the data dirty.
pub fn write_file(path: &Path, bytes: usize) -> io::Result<File> {
    let mut file = File::create(path)?;
    fill(&mut file, bytes)?;
    Ok(file)
}

/// `sync_file_range(fd, 0, 0, WAIT_BEFORE | WRITE | WAIT_AFTER)`: the whole file, waited for.
pub fn sync_file_range_all(file: &File) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let flags = libc::SYNC_FILE_RANGE_WAIT_BEFORE | libc::SYNC_FILE_RANGE_WRITE | libc::SYNC_FILE_RANGE_WAIT_AFTER;
    // SAFETY: a valid open fd; offset 0 and length 0 mean the whole file.
    let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Writes `bytes` into a few small files in `dir` and syncs each a different way, once
/// each: fsync, fdatasync, sync_file_range, syncfs.
pub fn synced_writes(dir: &Path, bytes: usize) -> io::Result<()> {
    use std::os::fd::AsRawFd as _;
    let data = vec![0x5a_u8; bytes];
    let write = |name: &str| -> io::Result<File> {
        let mut file = File::create(dir.join(name))?;
        file.write_all(&data)?;
        Ok(file)
    };
    write("fsync.bin")?.sync_all()?;
    write("fdatasync.bin")?.sync_data()?;
    let file = write("sync_file_range.bin")?;
    sync_file_range_all(&file)?;
    // SAFETY: a valid open fd.
    if unsafe { libc::syncfs(file.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `vm.dirty_expire_centisecs` raised for as long as the guard lives, then set back.
///
/// The kernel's flusher writes back dirty pages older than this (30 s by default) on its
/// own. A staging whose sync must find all its data still dirty loses part of it when the
/// data waits that long first (a slow guest: the container's exit and the shim's umount
/// came 36 s after the writes, and the umount synced the last 14 of 24 MiB). A global
/// knob: the scenarios run one at a time.
pub struct KeepDirty {
    before: Option<String>,
}

const DIRTY_EXPIRE: &str = "/proc/sys/vm/dirty_expire_centisecs";

impl KeepDirty {
    /// Dirty pages left alone for at least `secs` (a lower setting is raised; a higher one
    /// is kept).
    pub fn for_secs(secs: u64) -> io::Result<Self> {
        let before = std::fs::read_to_string(DIRTY_EXPIRE)?.trim().to_string();
        let want = secs * 100;
        if before.parse::<u64>().is_ok_and(|b| b >= want) {
            return Ok(KeepDirty { before: None });
        }
        std::fs::write(DIRTY_EXPIRE, want.to_string())?;
        Ok(KeepDirty { before: Some(before) })
    }
}

impl Drop for KeepDirty {
    fn drop(&mut self) {
        if let Some(b) = &self.before {
            if let Err(e) = std::fs::write(DIRTY_EXPIRE, b) {
                eprintln!("cleanup: setting {DIRTY_EXPIRE} back to {b}: {e}");
            }
        }
    }
}

/// The page cache's `Dirty` and `Writeback` in KiB (/proc/meminfo), if it reads.
pub fn dirty_and_writeback_kib() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(':')?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
    };
    Some((field("Dirty")?, field("Writeback")?))
}
