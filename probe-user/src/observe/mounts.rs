//! The mount table, with memory.
//!
//! umount2 detaches a mount from the namespace at once and syncs it later, in
//! task_work; by the time a stall is visible the mount is gone from
//! the mountinfo table. So the table keeps what it saw: a watcher thread
//! re-reads mountinfo each time the kernel flags it changed (`POLLPRI`), and
//! mounts that disappear stay findable for a while as "removed".

use std::{
    collections::VecDeque,
    fs,
    os::fd::AsRawFd as _,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

/// One line of mountinfo, the fields plegwatch uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mount {
    pub mount_id: u32,
    pub dev: (u32, u32),
    pub mount_point: String,
    pub fstype: String,
    pub source: String,
    /// The super block's options (overlay's `lowerdir=`, `upperdir=`, ...).
    pub options: String,
}

/// How long a removed mount stays findable.
const KEEP_REMOVED: Duration = Duration::from_secs(600);
/// At most this many removed mounts are kept.
const MAX_REMOVED: usize = 4096;

/// Parses `/proc/PID/mountinfo` (see proc(5)); bad lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let mut l = left.split(' ');
    let mount_id = l.next()?.parse().ok()?;
    let _parent = l.next()?;
    let (maj, min) = l.next()?.split_once(':')?;
    let _root = l.next()?;
    let mount_point = unescape(l.next()?);
    let mut r = right.split(' ');
    let fstype = r.next()?.to_string();
    let source = unescape(r.next()?);
    let options = r.next().map(unescape).unwrap_or_default();
    Some(Mount { mount_id, dev: (maj.parse().ok()?, min.parse().ok()?), mount_point, fstype, source, options })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 3 < b.len() && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c)) {
            let v = (b[i + 1] - b'0') as u32 * 64 + (b[i + 2] - b'0') as u32 * 8 + (b[i + 3] - b'0') as u32;
            if let Ok(byte) = u8::try_from(v) {
                out.push(byte);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The current mounts plus recently removed ones.
#[derive(Debug, Default)]
pub struct MountTable {
    current: Vec<Mount>,
    removed: VecDeque<(Instant, Mount)>,
}

impl MountTable {
    /// Replaces the current mounts, remembering those that went away.
    pub fn update(&mut self, mounts: Vec<Mount>, now: Instant) {
        for old in self.current.drain(..) {
            if !mounts.iter().any(|m| m.mount_id == old.mount_id) {
                self.removed.push_back((now, old));
            }
        }
        self.current = mounts;
        while let Some((t, _)) = self.removed.front() {
            if now.duration_since(*t) > KEEP_REMOVED || self.removed.len() > MAX_REMOVED {
                self.removed.pop_front();
            } else {
                break;
            }
        }
    }

    /// The mount at `mount_point`: a current one first, else the latest removed.
    pub fn by_mount_point(&self, mount_point: &str) -> Option<&Mount> {
        // An unknown target (empty) is on no mount, not on "/".
        if mount_point.is_empty() {
            return None;
        }
        let want = mount_point.trim_end_matches('/');
        let want = if want.is_empty() { "/" } else { want };
        self.current
            .iter()
            .rev()
            .find(|m| m.mount_point == want)
            .or_else(|| self.removed.iter().rev().map(|(_, m)| m).find(|m| m.mount_point == want))
    }

    /// A mount of device `dev`, current first.
    pub fn by_dev(&self, dev: (u32, u32)) -> Option<&Mount> {
        self.current.iter().find(|m| m.dev == dev).or_else(|| self.removed.iter().rev().map(|(_, m)| m).find(|m| m.dev == dev))
    }
}

/// A mount table kept fresh by a background thread.
impl MountTable {
    /// The one mount (current or removed) whose mount point starts with
    /// `prefix`: for a path the kernel cut short. None if several do.
    pub fn by_mount_point_prefix(&self, prefix: &str) -> Option<&Mount> {
        let mut found = self.current.iter().chain(self.removed.iter().map(|(_, m)| m)).filter(|m| m.mount_point.starts_with(prefix));
        let first = found.next()?;
        found.all(|m| m.mount_point == first.mount_point).then_some(first)
    }

    /// The mount a path lies on: the longest mount point that contains it.
    pub fn containing(&self, path: &str) -> Option<&Mount> {
        self.current
            .iter()
            .filter(|m| path == m.mount_point || m.mount_point == "/" || path.starts_with(&format!("{}/", m.mount_point)))
            .max_by_key(|m| m.mount_point.len())
    }

    /// The device a mount's writeback goes to: its own, or for an overlay the
    /// device of the file system holding its `upperdir`.
    pub fn backing_dev(&self, m: &Mount) -> (u32, u32) {
        if m.fstype != "overlay" {
            return m.dev;
        }
        let upper = m.options.split(',').find_map(|o| o.strip_prefix("upperdir="));
        upper.and_then(|u| self.containing(u)).map(|u| u.dev).unwrap_or(m.dev)
    }
}

pub type SharedMounts = Arc<Mutex<MountTable>>;

/// Reads `path` (`/proc/self/mountinfo`, or the host init's in a container:
/// see [`super::namespaces`]) into a shared table and starts a thread that
/// re-reads it whenever the kernel says it changed.
pub fn watch(path: &'static str) -> std::io::Result<SharedMounts> {
    let table: SharedMounts = Arc::default();
    let file = fs::File::open(path)?;
    refresh(&table, path);
    let t = Arc::clone(&table);
    std::thread::Builder::new().name("mount-watch".into()).spawn(move || {
        let mut pfd = libc::pollfd { fd: file.as_raw_fd(), events: libc::POLLPRI, revents: 0 };
        loop {
            // SAFETY: one valid pollfd, owned by `file`, which outlives the loop.
            let n = unsafe { libc::poll(&mut pfd, 1, 1000) };
            if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                tracing::warn!("mount watcher stopped: poll on {path} failed");
                return;
            }
            if n > 0 {
                // The kernel flags each change once per open file (mounts_poll).
                refresh(&t, path);
            }
        }
    })?;
    Ok(table)
}

fn refresh(table: &SharedMounts, path: &str) {
    if let Ok(text) = fs::read_to_string(path) {
        let mounts = parse_mountinfo(&text);
        if let Ok(mut t) = table.lock() {
            t.update(mounts, Instant::now());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
35 22 7:0 / /tmp/x\\040y rw,relatime shared:20 - ext4 /dev/loop0 rw
36 22 0:30 / /sys/kernel/tracing rw,relatime - tracefs nodev rw
garbage line
";

    #[test]
    fn parses_and_unescapes() {
        let m = parse_mountinfo(SAMPLE);
        assert_eq!(m.len(), 3);
        assert_eq!(
            m[1],
            Mount {
                mount_id: 35,
                dev: (7, 0),
                mount_point: "/tmp/x y".into(),
                fstype: "ext4".into(),
                source: "/dev/loop0".into(),
                options: "rw".into()
            }
        );
        assert_eq!(m[2].fstype, "tracefs");
    }

    #[test]
    fn an_overlay_writes_back_to_its_upper_dirs_device() {
        let text = "22 1 254:1 / / rw - ext4 /dev/vda1 rw\n\
                    35 22 7:3 / /var/lib/c rw - ext4 /dev/loop3 rw\n\
                    40 22 0:55 / /run/c/rootfs rw - overlay overlay rw,lowerdir=/var/lib/c/1/fs,upperdir=/var/lib/c/2/fs,workdir=/var/lib/c/2/work\n";
        let mut t = MountTable::default();
        t.update(parse_mountinfo(text), Instant::now());
        let ovl = t.by_mount_point("/run/c/rootfs").cloned().expect("the overlay");
        assert_eq!(t.backing_dev(&ovl), (7, 3));
        let root = t.by_mount_point("/").cloned().expect("root");
        assert_eq!(t.backing_dev(&root), (254, 1));
        assert_eq!(t.containing("/var/lib/cx").map(|m| m.mount_id), Some(22), "a prefix is not a parent");
        assert_eq!(t.by_mount_point_prefix("/run/c/roo").map(|m| m.mount_id), Some(40), "a cut path finds its one mount");
        assert!(t.by_mount_point_prefix("/").is_none(), "several mounts match: none");
        assert!(t.by_mount_point("").is_none(), "an unknown target is on no mount, not on /");
    }

    #[test]
    fn removed_mounts_stay_findable() {
        let mut t = MountTable::default();
        let now = Instant::now();
        let all = parse_mountinfo(SAMPLE);
        t.update(all.clone(), now);
        t.update(vec![all[0].clone()], now);
        let m = t.by_mount_point("/tmp/x y/").expect("kept after removal");
        assert_eq!(m.source, "/dev/loop0");
        assert_eq!(t.by_dev((7, 0)).map(|m| m.mount_id), Some(35));
        t.update(vec![all[0].clone()], now + KEEP_REMOVED + Duration::from_secs(1));
        assert!(t.by_mount_point("/tmp/x y").is_none());
        assert_eq!(t.by_mount_point("/").map(|m| m.mount_id), Some(22));
    }
}
