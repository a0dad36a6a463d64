//! The `detail` object of a stall: what the wait is on (umount2's target, file
//! system and device; a sync's file and device) and where the thread stands.

use crate::{
    observe::mounts::{Mount, MountTable},
    observe::namespaces,
    observe::procfs,
    sources::inflight::WaitInfo,
    syscalls::{by_slot, Arg0, WaitKind},
};
use serde_json::{json, Map, Value};

/// The part of a wait's detail that does not change while it lasts. Computed
/// once, at its first report, while the fd is still open and the mount
/// remembered.
pub fn fixed(info: &WaitInfo, mounts: &MountTable) -> Map<String, Value> {
    let mut d = Map::new();
    let Some(w) = by_slot(info.slot) else {
        d.insert("syscall".into(), json!(format!("nr {}", info.nr)));
        return d;
    };
    d.insert("syscall".into(), json!(w.name));
    match (w.kind, w.arg0) {
        (WaitKind::Umount, _) => {
            let target = absolute(info.tgid, &info.path);
            let theirs = the_callers_mount(info.tgid, &target, mounts);
            put_mount(&mut d, mounts.by_mount_point(&target).or(theirs.as_ref()));
            d.insert("target".into(), json!(target));
        }
        (_, Arg0::Fd) => {
            let fd = info.arg0 as i64 as i32;
            d.insert("fd".into(), json!(fd));
            match procfs::open_file(info.tid, info.arg0 & 0xffff_ffff) {
                Some(f) => {
                    d.insert("path".into(), json!(f.path));
                    d.insert("dev".into(), json!(format!("{}:{}", f.dev.0, f.dev.1)));
                    put_mount(&mut d, mounts.by_dev(f.dev));
                }
                None => {
                    d.insert("path".into(), Value::Null);
                }
            }
        }
        (_, _) => {
            d.insert("scope".into(), json!("all file systems"));
        }
    }
    d
}

fn put_mount(d: &mut Map<String, Value>, m: Option<&Mount>) {
    match m {
        Some(m) => {
            d.insert("fstype".into(), json!(m.fstype));
            d.insert("device".into(), json!(m.source));
            d.insert("dev".into(), json!(format!("{}:{}", m.dev.0, m.dev.1)));
            d.insert("mount_point".into(), json!(m.mount_point));
        }
        None => {
            d.entry("fstype").or_insert(Value::Null);
            d.entry("device").or_insert(Value::Null);
        }
    }
}

/// The block device a wait's writeback goes to, and how that is known: a
/// umount's mount (an overlay's through its upper dir), an fsync's file.
/// None for `sync()` (every device) and for files on no block device.
pub fn device_of(info: &WaitInfo, mounts: &MountTable) -> Option<((u32, u32), String)> {
    let w = by_slot(info.slot)?;
    let (m, what) = match (w.kind, w.arg0) {
        (WaitKind::Umount, _) => {
            let target = absolute(info.tgid, &info.path);
            // The kernel keeps PATH_LEN - 1 bytes of the path: a longer one is cut.
            let cut = info.path.len() + 1 >= plegwatch_abi::PATH_LEN;
            let m = mounts.by_mount_point(&target).or_else(|| cut.then(|| mounts.by_mount_point_prefix(&target)).flatten()).cloned();
            (m.or_else(|| the_callers_mount(info.tgid, &target, mounts))?, "the unmounted file system")
        }
        (_, Arg0::Fd) => {
            (mounts.by_dev(procfs::open_file(info.tid, info.arg0 & 0xffff_ffff)?.dev)?.clone(), "the synced file's file system")
        }
        _ => return None,
    };
    let dev = mounts.backing_dev(&m);
    let via = if dev != m.dev { format!(", an overlay whose upper dir is on {}:{}", dev.0, dev.1) } else { String::new() };
    (dev.0 != 0).then(|| (dev, format!("{what} is {} at {}{via} (mountinfo)", m.fstype, m.mount_point)))
}

/// A umount's target is a path in the caller's mount namespace: when
/// plegwatch's table (the host's) has no such mount, the caller's own table
/// may (a container unmounting in its own namespace, before the detach).
fn the_callers_mount(tgid: u32, target: &str, mounts: &MountTable) -> Option<Mount> {
    if target.is_empty() || mounts.by_mount_point(target).is_some() {
        return None;
    }
    namespaces::mount_in_ns_of(tgid, target)
}

/// umount2 resolves a relative target against the caller's cwd.
fn absolute(pid: u32, path: &str) -> String {
    if path.starts_with('/') || path.is_empty() {
        return path.to_string();
    }
    match std::fs::read_link(format!("/proc/{pid}/cwd")) {
        Ok(cwd) => cwd.join(path).to_string_lossy().into_owned(),
        Err(_) => path.to_string(),
    }
}

/// The full detail at report time: the fixed part plus the thread's phase,
/// state and wait channel now.
pub fn now(fixed: &Map<String, Value>, info: &WaitInfo) -> Value {
    let mut d = fixed.clone();
    let phase = if info.sys_exit_ns != 0 { "task_work" } else { "syscall" };
    d.insert("phase".into(), json!(phase));
    d.insert("state".into(), json!(procfs::state(info.tid).map(String::from)));
    d.insert("wchan".into(), json!(procfs::wchan(info.tid)));
    if info.before_attach {
        // Found by the startup sweep: say what its age rests on, and its bound above.
        d.insert("age_basis".into(), json!("lower bound: since its thread last ran (found already open)"));
        d.insert("at_most_s".into(), json!(procfs::thread_age_s(info.tid)));
    }
    Value::Object(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observe::mounts::parse_mountinfo;
    use std::time::Instant;

    fn info(slot: u32, path: &str, arg0: u64) -> WaitInfo {
        WaitInfo {
            tgid: 1,
            tid: 1,
            comm: "x".into(),
            nr: 0,
            slot,
            start_ns: 0,
            sys_exit_ns: 5,
            arg0,
            path: path.into(),
            before_attach: false,
            g: 0,
            user_stack: -1,
        }
    }

    #[test]
    fn umount_detail_from_a_removed_mount() {
        let mut t = MountTable::default();
        let m = parse_mountinfo("35 22 7:3 / /tmp/m rw - ext4 /dev/loop3 rw\n");
        t.update(m, Instant::now());
        t.update(vec![], Instant::now());
        let d = fixed(&info(0, "/tmp/m", 0), &t);
        assert_eq!(d["syscall"], "umount2");
        assert_eq!(d["target"], "/tmp/m");
        assert_eq!(d["fstype"], "ext4");
        assert_eq!(d["device"], "/dev/loop3");
        assert_eq!(d["dev"], "7:3");
        let full = now(&d, &info(0, "/tmp/m", 0));
        assert_eq!(full["phase"], "task_work");
    }

    #[test]
    fn sync_has_no_file() {
        let d = fixed(&info(1, "", 0), &MountTable::default());
        assert_eq!(d["syscall"], "sync");
        assert_eq!(d["scope"], "all file systems");
    }
}
