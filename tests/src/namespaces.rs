//! plegwatch in namespaces of its own, as a container runs it: wrappers for
//! [`crate::Plegwatch::start_under`] (util-linux `unshare`).
//!
//! - [`HOST_PID`]: the DaemonSet's shape (`hostPID: true`): the host's pid namespace and
//!   `/proc`, a private mount namespace. Mounts the host makes afterwards do not show in it
//!   (propagation private, as a container's rootfs without `mountPropagation`).
//! - [`OWN_PID`]: a pid namespace of its own as well (plegwatch is pid 1 there, `getpid()`
//!   says 1), with the host's procfs still at `/proc`: its self-filter must use its host pid.
//! - [`OWN_PROC`]: its own pid namespace with a fresh `/proc` for it (a container without
//!   `hostPID`): plegwatch must refuse to start, naming `hostPID`.

/// Own mount namespace, host pid namespace (`unshare` execs plegwatch: same pid).
pub const HOST_PID: &[&str] = &["unshare", "--mount", "--propagation", "private", "--"];
/// Own pid and mount namespaces, the host's `/proc` (`--kill-child`: plegwatch dies with it).
pub const OWN_PID: &[&str] = &["unshare", "--pid", "--mount", "--propagation", "private", "--fork", "--kill-child", "--"];
/// Own pid and mount namespaces and a `/proc` of that pid namespace.
pub const OWN_PROC: &[&str] = &["unshare", "--pid", "--mount", "--propagation", "private", "--fork", "--kill-child", "--mount-proc", "--"];

/// The mount namespace link of process `pid` (`mnt:[...]`).
pub fn mount_ns(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt")).ok().map(|l| l.to_string_lossy().into_owned())
}

/// The pid namespace link of process `pid` (`pid:[...]`).
pub fn pid_ns(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok().map(|l| l.to_string_lossy().into_owned())
}

/// Process `pid`'s pid in its own pid namespace: the last `NSpid` of its status.
pub fn ns_pid(pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|v| v.split_whitespace().last()?.parse().ok())
}

/// The JSON lines among `events` that name process `pid` under a `pid` or `tgid` key, at
/// any depth (the ready line, which names plegwatch itself, left out).
pub fn lines_naming(events: &[crate::Event], pid: u32) -> Vec<String> {
    fn names(v: &serde_json::Value, pid: u64) -> bool {
        match v {
            serde_json::Value::Object(m) => {
                m.iter().any(|(k, v)| ((k == "pid" || k == "tgid") && v.as_u64() == Some(pid)) || names(v, pid))
            }
            serde_json::Value::Array(a) => a.iter().any(|v| names(v, pid)),
            _ => false,
        }
    }
    events.iter().filter(|e| !e.is("ready") && names(&e.json, u64::from(pid))).map(|e| e.json.to_string()).collect()
}
