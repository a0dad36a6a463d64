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
