//! plegwatch's own code kept in memory: the file mappings of its executable are
//! locked (`mlock`) once at the start.
//!
//! plegwatch runs on the nodes whose disks stall. A code path it first takes in
//! the middle of a stall (raising the first incident, naming its pods) faults its
//! pages in from the executable's file; when that file is on the stalled disk, or
//! on a slow one (a guest's 9p root under emulation: one such scan took 0.7 s in
//! a phase that takes under 1 ms on the host), the scan waits with the very
//! processes it reports. Locked, every page is read once, before the probes are
//! attached, and never evicted.
//!
//! Only the executable's own mappings (about 13 MB for the release build): the
//! heap and the threads' stacks are not locked (`mlockall` would commit every
//! thread's whole stack). Failing (no `CAP_IPC_LOCK` and a low
//! `RLIMIT_MEMLOCK`) is a warning: plegwatch runs as before.

use std::time::Instant;

/// What was locked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pinned {
    pub bytes: u64,
    pub ranges: usize,
}

/// Locks the mappings of `/proc/self/exe`; logs what it did.
pub fn pin_own_code() {
    let began = Instant::now();
    match pin() {
        Ok(p) => tracing::info!(
            mib = format!("{:.1}", p.bytes as f64 / f64::from(1u32 << 20)),
            ranges = p.ranges,
            took_ms = began.elapsed().as_millis() as u64,
            "locked plegwatch's own code in memory"
        ),
        Err(e) => tracing::warn!(error = %e, "could not lock plegwatch's own code in memory: a stalled disk may slow its scans"),
    }
}

fn pin() -> Result<Pinned, String> {
    use std::os::unix::fs::MetadataExt as _;
    let exe = std::fs::metadata("/proc/self/exe").map_err(|e| format!("/proc/self/exe: {e}"))?;
    let dev = (libc::major(exe.dev()), libc::minor(exe.dev()));
    let maps = procfs::process::Process::myself().and_then(|p| p.maps()).map_err(|e| format!("/proc/self/maps: {e}"))?;
    let mut pinned = Pinned { bytes: 0, ranges: 0 };
    for m in maps {
        if m.inode != exe.ino() || (m.dev.0 as u32, m.dev.1 as u32) != dev {
            continue;
        }
        let (start, end) = m.address;
        let len = end.saturating_sub(start) as usize;
        // SAFETY: a range of our own address space, as the kernel listed it; mlock
        // changes no contents, only whether the pages may be evicted.
        if unsafe { libc::mlock(start as *const libc::c_void, len) } != 0 {
            return Err(format!("mlock of {len} bytes at {start:#x}: {}", std::io::Error::last_os_error()));
        }
        pinned.bytes += len as u64;
        pinned.ranges += 1;
    }
    if pinned.ranges == 0 {
        return Err("no mapping of /proc/self/exe found in /proc/self/maps".into());
    }
    Ok(pinned)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The test binary's own mappings are found and locked (the unit tests run without
    /// root: locking may be refused by RLIMIT_MEMLOCK, which must then say so).
    #[test]
    fn the_executables_mappings_are_found() {
        match pin() {
            Ok(p) => {
                assert!(p.ranges >= 2, "{p:?}");
                assert!(p.bytes >= 1 << 20, "{p:?}");
            }
            Err(e) => assert!(e.contains("mlock of"), "{e}"),
        }
    }
}
