//! Retention of incident bundles: a daemon left on a canary node for weeks
//! must not fill its report directory.
//!
//! After each bundle is written, the writer thread lists this host's bundles in the
//! report directory (directories named as this host's plegwatch names them, owned by
//! it, not symlinks: see [`super::safe_dir`]; nothing else is ever touched) and removes
//! the oldest, by modification time, until at most `max_bundles` remain and they take
//! at most `max_bytes` together. The bundle just written is never removed, even when it
//! alone is over the size.

use super::safe_dir::{OnDisk, ReportRoot};

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

/// Which of `bundles` to remove, oldest first, to keep within `keep`; never `current`.
pub fn to_remove(mut bundles: Vec<OnDisk>, keep: Retention, current: &str) -> Vec<String> {
    bundles.sort_by(|a, b| a.modified.cmp(&b.modified).then_with(|| a.name.cmp(&b.name)));
    let mut count = bundles.len();
    let mut bytes: u64 = bundles.iter().map(|b| b.bytes).sum();
    let mut out = Vec::new();
    for b in bundles {
        if count <= keep.max_bundles && bytes <= keep.max_bytes {
            break;
        }
        if b.name == current {
            continue;
        }
        count -= 1;
        bytes = bytes.saturating_sub(b.bytes);
        out.push(b.name);
    }
    out
}

/// Applies `keep` to this host's bundles under `root` after `current` was written;
/// logs each removal.
pub fn prune(root: &ReportRoot, keep: Retention, current: &str) {
    for name in to_remove(root.bundles(), keep, current) {
        match root.remove(&name) {
            Ok(()) => {
                tracing::info!(bundle = %name, "report bundle removed (retention: {} bundles, {} bytes)", keep.max_bundles, keep.max_bytes)
            }
            Err(e) => tracing::warn!("report bundle {name}: cannot remove it for retention: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    fn at(name: &str, secs: u64, bytes: u64) -> OnDisk {
        OnDisk { name: name.into(), modified: SystemTime::UNIX_EPOCH + Duration::from_secs(secs), bytes }
    }

    #[test]
    fn the_oldest_go_first_until_count_and_size_fit() {
        let b = vec![at("c", 3, 10), at("a", 1, 10), at("b", 2, 10), at("d", 4, 10)];
        let keep = Retention { max_bundles: 2, max_bytes: 1000 };
        assert_eq!(to_remove(b.clone(), keep, "d"), vec!["a", "b"]);
        let keep = Retention { max_bundles: 10, max_bytes: 25 };
        assert_eq!(to_remove(b.clone(), keep, "d"), vec!["a", "b"]);
        let keep = Retention { max_bundles: 10, max_bytes: 1000 };
        assert!(to_remove(b, keep, "d").is_empty());
    }

    #[test]
    fn the_bundle_just_written_stays_even_alone_over_the_size() {
        let b = vec![at("old", 1, 10), at("new", 2, 500)];
        let keep = Retention { max_bundles: 10, max_bytes: 100 };
        assert_eq!(to_remove(b, keep, "new"), vec!["old"]);
    }

    /// Only this host's bundles are counted and removed: not a person's notes, not
    /// another host's bundle, not a symlink named like a bundle (nor its target).
    #[test]
    fn prune_touches_nothing_but_this_hosts_bundles() {
        let t = tempfile::tempdir().unwrap();
        let root = ReportRoot::open(&t.path().join("r")).unwrap();
        let run = root.run_name("20261126T100000Z").unwrap();
        let mk = |name: &str| {
            let d = root.bundle_dir(name).unwrap();
            d.write("incident.json", b"{}").unwrap();
            std::thread::sleep(Duration::from_millis(20));
            name.to_string()
        };
        let notes = root.path().join("my-notes");
        std::fs::create_dir(&notes).unwrap();
        let host = run.split('-').nth(1).unwrap().to_string();
        let other = run.replacen(&host, if host == "00000000" { "11111111" } else { "00000000" }, 1);
        let foreign = root.path().join(format!("{other}-incident-9"));
        std::fs::create_dir(&foreign).unwrap();
        let target = t.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::os::unix::fs::symlink(&target, root.path().join(format!("{run}-incident-8"))).unwrap();
        let old = mk(&format!("{run}-incident-1"));
        let new = mk(&format!("{run}-run"));
        prune(&root, Retention { max_bundles: 1, max_bytes: u64::MAX }, &new);
        assert!(notes.exists() && foreign.exists() && target.exists() && root.path().join(&new).exists());
        assert!(!root.path().join(&old).exists());
    }
}
