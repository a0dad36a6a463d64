//! Write throttling of one block device, by cgroup v1's blkio or cgroup v2's `io.max`.
//!
//! - **cgroup v1 (and hybrid) hosts:** writeback is charged to the root blkio cgroup, so one
//!   `blkio.throttle.write_bps_device` rule at the root slows every write to the device, the
//!   flusher's included.
//! - **cgroup v2 hosts** (`/sys/fs/cgroup` is `cgroup2`): the root cgroup has no `io.max`, and
//!   writeback is charged to the cgroup whose memory owns the dirty pages (cgroup writeback, which
//!   needs both `memory` and `io` on the unified hierarchy). So the rule goes on the cgroup the
//!   writers are in: a fresh one this process joins ([`WriteThrottle::new`]), or a pod's cgroup
//!   parent ([`WriteThrottle::for_cgroup`]), whose containers inherit the limit.
//!
//! This host runs v1 (hybrid): the v2 branch is checked here only as far as its unit tests go.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::sys::DevNum;

/// The root blkio cgroup's write limit file (cgroup v1).
pub const WRITE_BPS_FILE: &str = "/sys/fs/cgroup/blkio/blkio.throttle.write_bps_device";

/// Where the unified hierarchy is mounted on a cgroup v2 host.
const UNIFIED: &str = "/sys/fs/cgroup";

/// How this host throttles writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// A rule in [`WRITE_BPS_FILE`].
    V1Blkio,
    /// `io.max` on a cgroup under [`UNIFIED`].
    V2IoMax,
}

/// Chooses the mode from what the host has: whether [`WRITE_BPS_FILE`] exists, the file system
/// type mounted at `/sys/fs/cgroup`, and the unified root's `cgroup.controllers`.
pub fn choose(v1_file: bool, cgroup_fstype: Option<&str>, controllers: &str) -> Result<Mode, String> {
    if v1_file {
        return Ok(Mode::V1Blkio);
    }
    if cgroup_fstype != Some("cgroup2") {
        return Err(format!(
            "{WRITE_BPS_FILE} does not exist (no cgroup v1 blkio controller) and {UNIFIED} is not cgroup2 (it is {})",
            cgroup_fstype.unwrap_or("not mounted")
        ));
    }
    let have: Vec<&str> = controllers.split_whitespace().collect();
    let missing: Vec<&str> = ["io", "memory"].into_iter().filter(|c| !have.contains(c)).collect();
    if !missing.is_empty() {
        return Err(format!(
            "{UNIFIED}/cgroup.controllers lacks {} (cgroup writeback needs io and memory on the unified hierarchy)",
            missing.join(" and ")
        ));
    }
    Ok(Mode::V2IoMax)
}

/// This host's mode, or why it has none.
pub fn mode() -> Result<Mode, String> {
    let fstype = procfs::process::Process::myself()
        .and_then(|p| p.mountinfo())
        .ok()
        .and_then(|m| m.into_iter().rev().find(|m| m.mount_point == Path::new(UNIFIED)).map(|m| m.fs_type));
    let controllers = std::fs::read_to_string(Path::new(UNIFIED).join("cgroup.controllers")).unwrap_or_default();
    choose(Path::new(WRITE_BPS_FILE).exists(), fstype.as_deref(), &controllers)
}

/// A write limit on one device, removed (and the writes queued behind it released) on drop.
#[derive(Debug)]
pub struct WriteThrottle {
    dev: DevNum,
    v2: Option<V2Rule>,
}

/// A cgroup v2 rule: the cgroup carrying `io.max`, and, when this process joined it, the cgroup
/// to go back to and whether to remove it.
#[derive(Debug)]
struct V2Rule {
    cgroup: PathBuf,
    joined_from: Option<PathBuf>,
}

impl WriteThrottle {
    /// Why throttling cannot work here, if it cannot.
    pub fn unavailable() -> Option<String> {
        mode().err()
    }

    /// Slows writes to `dev` that this process (and what it spawns from now on) dirties.
    pub fn new(dev: DevNum, bytes_per_s: u64) -> Result<Self> {
        match mode().map_err(anyhow::Error::msg)? {
            Mode::V1Blkio => {
                write_v1_rule(dev, bytes_per_s)?;
                Ok(Self { dev, v2: None })
            }
            Mode::V2IoMax => {
                let cgroup = Path::new(UNIFIED).join(format!("plegwatch-throttle-{}", std::process::id()));
                let from = own_cgroup()?;
                enable_controllers(&cgroup)?;
                write_io_max(&cgroup, dev, Some(bytes_per_s))?;
                join(&cgroup, std::process::id())?;
                Ok(Self { dev, v2: Some(V2Rule { cgroup, joined_from: Some(from) }) })
            }
        }
    }

    /// Slows writes to `dev` dirtied under cgroup `parent` (a pod's cgroup parent, relative to
    /// the hierarchy's root, as runc's cgroupfs driver or a systemd slice name it). On v1 this
    /// is the root rule of [`WriteThrottle::new`].
    pub fn for_cgroup(dev: DevNum, bytes_per_s: u64, parent: &str) -> Result<Self> {
        match mode().map_err(anyhow::Error::msg)? {
            Mode::V1Blkio => Self::new(dev, bytes_per_s),
            Mode::V2IoMax => {
                let cgroup = Path::new(UNIFIED).join(parent.trim_start_matches('/'));
                enable_controllers(&cgroup)?;
                write_io_max(&cgroup, dev, Some(bytes_per_s))?;
                Ok(Self { dev, v2: Some(V2Rule { cgroup, joined_from: None }) })
            }
        }
    }
}

impl WriteThrottle {
    /// Whether this is a cgroup v2 `io.max` rule.
    pub fn is_v2(&self) -> bool {
        self.v2.is_some()
    }

    /// Changes the limit (`None` lifts it); writes already queued behind it follow the new
    /// rate at once (blk-throttle re-dispatches on a change of its configuration).
    pub fn set(&self, bytes_per_s: Option<u64>) -> Result<()> {
        match &self.v2 {
            None => write_v1_rule(self.dev, bytes_per_s.unwrap_or(0)),
            Some(rule) => write_io_max(&rule.cgroup, self.dev, bytes_per_s),
        }
    }
}

impl Drop for WriteThrottle {
    fn drop(&mut self) {
        let done = match &self.v2 {
            None => write_v1_rule(self.dev, 0),
            Some(rule) => (|| {
                write_io_max(&rule.cgroup, self.dev, None)?;
                if let Some(from) = &rule.joined_from {
                    join(from, std::process::id())?;
                    remove_cgroup(&rule.cgroup, from)?;
                }
                Ok(())
            })(),
        };
        if let Err(e) = done {
            eprintln!("cleanup: {e:#}");
        }
    }
}

/// Removes `cgroup`, first moving what the test started in it and left running (a helper
/// not reaped yet) back to `from`; a task that is exiting keeps it busy a moment, so the
/// rmdir is tried again for up to 5 s.
fn remove_cgroup(cgroup: &Path, from: &Path) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let left = std::fs::read_to_string(cgroup.join("cgroup.procs")).unwrap_or_default();
        for pid in left.lines().filter_map(|l| l.trim().parse::<u32>().ok()) {
            let _ = join(from, pid);
        }
        match std::fs::remove_dir(cgroup) {
            Ok(()) => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            Err(e) => return Err(e).with_context(|| format!("rmdir {} (still in it: {:?})", cgroup.display(), left.trim())),
        }
    }
}

fn write_v1_rule(dev: DevNum, bytes_per_s: u64) -> Result<()> {
    // One write(2): the kernel parses each write as one rule. 0 removes the rule.
    std::fs::write(WRITE_BPS_FILE, format!("{dev} {bytes_per_s}"))
        .with_context(|| format!("write \"{dev} {bytes_per_s}\" to {WRITE_BPS_FILE}"))
}

/// The `io.max` line limiting writes to `dev`, or lifting the limit.
pub fn io_max_line(dev: DevNum, bytes_per_s: Option<u64>) -> String {
    match bytes_per_s {
        Some(b) => format!("{dev} wbps={b}"),
        None => format!("{dev} wbps=max"),
    }
}

fn write_io_max(cgroup: &Path, dev: DevNum, bytes_per_s: Option<u64>) -> Result<()> {
    let file = cgroup.join("io.max");
    let line = io_max_line(dev, bytes_per_s);
    std::fs::write(&file, &line).with_context(|| format!("write \"{line}\" to {}", file.display()))
}

/// Creates `cgroup` and turns on `io` and `memory` for it in each ancestor's subtree_control.
fn enable_controllers(cgroup: &Path) -> Result<()> {
    let rel = cgroup.strip_prefix(UNIFIED).context("a cgroup outside the unified hierarchy")?;
    let mut at = PathBuf::from(UNIFIED);
    for part in rel.components() {
        let control = at.join("cgroup.subtree_control");
        std::fs::write(&control, "+io +memory").with_context(|| format!("write \"+io +memory\" to {}", control.display()))?;
        at.push(part);
        if !at.is_dir() {
            std::fs::create_dir(&at).with_context(|| format!("mkdir {}", at.display()))?;
        }
    }
    Ok(())
}

/// This process's cgroup on the unified hierarchy (the `0::` line of /proc/self/cgroup).
fn own_cgroup() -> Result<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/cgroup").context("read /proc/self/cgroup")?;
    match unified_path(&text) {
        Some(p) => Ok(Path::new(UNIFIED).join(p.trim_start_matches('/'))),
        None => bail!("/proc/self/cgroup has no 0:: line (not on cgroup v2)"),
    }
}

/// The path of the `0::PATH` line of a `/proc/PID/cgroup` text.
pub fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))
}

fn join(cgroup: &Path, pid: u32) -> Result<()> {
    let procs = cgroup.join("cgroup.procs");
    std::fs::write(&procs, pid.to_string()).with_context(|| format!("move pid {pid} into {}", procs.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_wins_where_blkio_is_mounted() {
        assert_eq!(choose(true, Some("tmpfs"), ""), Ok(Mode::V1Blkio));
    }

    #[test]
    fn v2_needs_io_and_memory_on_the_unified_root() {
        assert_eq!(choose(false, Some("cgroup2"), "cpuset cpu io memory hugetlb pids rdma misc\n"), Ok(Mode::V2IoMax));
        let why = choose(false, Some("cgroup2"), "cpu io pids").unwrap_err();
        assert!(why.contains("lacks memory"), "{why}");
        let why = choose(false, Some("tmpfs"), "").unwrap_err();
        assert!(why.contains("is not cgroup2 (it is tmpfs)"), "{why}");
        let why = choose(false, None, "").unwrap_err();
        assert!(why.contains("not mounted"), "{why}");
    }

    #[test]
    fn io_max_lines_set_and_lift() {
        let dev = DevNum { major: 7, minor: 3 };
        assert_eq!(io_max_line(dev, Some(1 << 20)), "7:3 wbps=1048576");
        assert_eq!(io_max_line(dev, None), "7:3 wbps=max");
    }

    #[test]
    fn the_unified_line_of_proc_cgroup() {
        let hybrid = "12:blkio:/\n1:name=systemd:/user.slice\n0::/user.slice/user-0.slice/session-1.scope\n";
        assert_eq!(unified_path(hybrid), Some("/user.slice/user-0.slice/session-1.scope"));
        assert_eq!(unified_path("0::/\n"), Some("/"));
        assert_eq!(unified_path("4:memory:/docker/abc\n"), None);
    }
}
