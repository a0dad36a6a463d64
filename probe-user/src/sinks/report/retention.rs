//! Retention of incident bundles: a daemon left on a canary node for weeks
//! must not fill its report directory.
//!
//! After each bundle is written, the writer thread lists the bundles in the
//! report directory (the directories named as plegwatch names them, holding an
//! `incident.json`; nothing else is ever touched) and removes the oldest, by
//! modification time, until at most `max_bundles` remain and they take at most
//! `max_bytes` together. The bundle just written is never removed, even when
//! it alone is over the size.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// How many bundles, and how many bytes of them, the report directory keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub max_bundles: usize,
    pub max_bytes: u64,
}

impl Retention {
    /// The daemon's default: 100 bundles, 256 MiB.
    pub const DAEMON: Retention = Retention { max_bundles: 100, max_bytes: 256 << 20 };
}

/// One bundle on disk.
#[derive(Clone, Debug, PartialEq)]
pub struct OnDisk {
    pub path: PathBuf,
    pub modified: SystemTime,
    pub bytes: u64,
}

/// Whether `name` is a bundle directory's name as the report sink makes them:
/// `<stamp>-pid<N>-incident-<id>` or `<stamp>-pid<N>-run`.
pub fn is_bundle_name(name: &str) -> bool {
    let Some((head, tail)) = name.split_once("-pid") else { return false };
    if head.is_empty() || !head.chars().all(|c| c.is_ascii_alphanumeric()) {
        return false;
    }
    let (pid, rest) = tail.split_at(tail.find(|c: char| !c.is_ascii_digit()).unwrap_or(tail.len()));
    if pid.is_empty() {
        return false;
    }
    rest == "-run" || rest.strip_prefix("-incident-").is_some_and(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()))
}

/// The bundles in `dir`: directories with a bundle's name and an `incident.json`.
pub fn list(dir: &Path) -> Vec<OnDisk> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    entries
        .flatten()
        .filter(|e| e.file_name().to_str().is_some_and(is_bundle_name))
        .filter(|e| e.path().join("incident.json").is_file())
        .filter_map(|e| {
            let modified = e.metadata().ok()?.modified().ok()?;
            let bytes = std::fs::read_dir(e.path())
                .map(|files| files.flatten().filter_map(|f| f.metadata().ok()).filter(|m| m.is_file()).map(|m| m.len()).sum())
                .unwrap_or(0);
            Some(OnDisk { path: e.path(), modified, bytes })
        })
        .collect()
}

/// Which of `bundles` to remove, oldest first, to keep within `keep`; never `current`.
pub fn to_remove(mut bundles: Vec<OnDisk>, keep: Retention, current: &Path) -> Vec<PathBuf> {
    bundles.sort_by(|a, b| a.modified.cmp(&b.modified).then_with(|| a.path.cmp(&b.path)));
    let mut count = bundles.len();
    let mut bytes: u64 = bundles.iter().map(|b| b.bytes).sum();
    let mut out = Vec::new();
    for b in bundles {
        if count <= keep.max_bundles && bytes <= keep.max_bytes {
            break;
        }
        if b.path == current {
            continue;
        }
        count -= 1;
        bytes = bytes.saturating_sub(b.bytes);
        out.push(b.path);
    }
    out
}

/// Applies `keep` to `dir` after `current` was written; logs each removal.
pub fn prune(dir: &Path, keep: Retention, current: &Path) {
    for path in to_remove(list(dir), keep, current) {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => tracing::info!(bundle = %path.display(), "report bundle removed (retention: {} bundles, {} bytes)", keep.max_bundles, keep.max_bytes),
            Err(e) => tracing::warn!("report bundle {}: cannot remove it for retention: {e}", path.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(name: &str, secs: u64, bytes: u64) -> OnDisk {
        OnDisk { path: PathBuf::from(format!("/r/{name}")), modified: SystemTime::UNIX_EPOCH + Duration::from_secs(secs), bytes }
    }

    #[test]
    fn only_plegwatch_bundle_names() {
        assert!(is_bundle_name("20261124T031500Z-pid4242-incident-7"));
        assert!(is_bundle_name("20261124T031500Z-pid4242-run"));
        for bad in ["notes", "20261124T031500Z-pid-run", "x-pid12-incident-", "x-pid12-incident-7a", "../x-pid1-run", "a b-pid1-run", "-pid1-run"] {
            assert!(!is_bundle_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_oldest_go_first_until_count_and_size_fit() {
        let b = vec![at("c", 3, 10), at("a", 1, 10), at("b", 2, 10), at("d", 4, 10)];
        let keep = Retention { max_bundles: 2, max_bytes: 1000 };
        assert_eq!(to_remove(b.clone(), keep, Path::new("/r/d")), vec![PathBuf::from("/r/a"), PathBuf::from("/r/b")]);
        let keep = Retention { max_bundles: 10, max_bytes: 25 };
        assert_eq!(to_remove(b.clone(), keep, Path::new("/r/d")), vec![PathBuf::from("/r/a"), PathBuf::from("/r/b")]);
        let keep = Retention { max_bundles: 10, max_bytes: 1000 };
        assert!(to_remove(b, keep, Path::new("/r/d")).is_empty());
    }

    #[test]
    fn the_bundle_just_written_stays_even_alone_over_the_size() {
        let b = vec![at("old", 1, 10), at("new", 2, 500)];
        let keep = Retention { max_bundles: 10, max_bytes: 100 };
        assert_eq!(to_remove(b, keep, Path::new("/r/new")), vec![PathBuf::from("/r/old")]);
    }

    #[test]
    fn prune_touches_nothing_but_bundles() {
        let dir = tempfile::tempdir().unwrap();
        let mk = |name: &str, with_json: bool| {
            let d = dir.path().join(name);
            std::fs::create_dir(&d).unwrap();
            if with_json {
                std::fs::write(d.join("incident.json"), "{}").unwrap();
            }
            std::thread::sleep(Duration::from_millis(20));
            d
        };
        let other = mk("my-notes", true);
        let no_json = mk("20261124T031500Z-pid1-incident-1", false);
        let old = mk("20261124T031500Z-pid1-incident-2", true);
        let new = mk("20261124T031500Z-pid1-run", true);
        prune(dir.path(), Retention { max_bundles: 1, max_bytes: u64::MAX }, &new);
        assert!(other.exists() && no_json.exists() && new.exists());
        assert!(!old.exists());
    }
}
