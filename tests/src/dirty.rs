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
