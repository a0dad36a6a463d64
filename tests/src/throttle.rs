//! blkio (cgroup v1) write throttling of one block device.

use std::path::Path;

use anyhow::{Context, Result};

use crate::sys::DevNum;

/// The root blkio cgroup's write limit file. Writeback on cgroup v1 is charged to the root
/// cgroup, so a rule here slows every write to the device, the flusher's included.
pub const WRITE_BPS_FILE: &str = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device";

/// A `MAJ:MIN BYTES_PER_S` rule in [`WRITE_BPS_FILE`]; dropping it writes `MAJ:MIN 0`, which
/// removes the rule (and releases the writes queued behind it).
#[derive(Debug)]
pub struct WriteThrottle {
    dev: DevNum,
}

impl WriteThrottle {
    /// Why throttling cannot work here, if it cannot (no cgroup v1 blkio hierarchy).
    pub fn unavailable() -> Option<String> {
        (!Path::new(WRITE_BPS_FILE).exists())
            .then(|| format!("{WRITE_BPS_FILE} does not exist (no cgroup v1 blkio controller)"))
    }

    pub fn new(dev: DevNum, bytes_per_s: u64) -> Result<Self> {
        write_rule(dev, bytes_per_s)?;
        Ok(Self { dev })
    }
}

impl Drop for WriteThrottle {
    fn drop(&mut self) {
        if let Err(e) = write_rule(self.dev, 0) {
            eprintln!("cleanup: {e:#}");
        }
    }
}

fn write_rule(dev: DevNum, bytes_per_s: u64) -> Result<()> {
    // One write(2): the kernel parses each write as one rule.
    std::fs::write(WRITE_BPS_FILE, format!("{dev} {bytes_per_s}"))
        .with_context(|| format!("write \"{dev} {bytes_per_s}\" to {WRITE_BPS_FILE}"))
}
