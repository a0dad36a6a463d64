//! A process's pod UID and container id from its cgroup path
//! (`/proc/PID/cgroup`, read with the `procfs` crate; the path's shape is
//! parsed here, since no maintained crate knows kubelet's and the runtimes'
//! naming).
//!
//! The shapes, cgroup v1 (`N:controller:/path`) and v2 (`0::/path`) alike:
//! - kubelet, cgroupfs driver: `/kubepods[/burstable|/besteffort]/pod<uid>/<id>`
//!   (containerd), `…/pod<uid>/crio-<id>` (CRI-O's container) or
//!   `…/pod<uid>/crio-conmon-<id>` (its conmon, with `conmon_cgroup = "pod"`);
//! - kubelet, systemd driver: `/kubepods.slice/kubepods-burstable.slice/
//!   kubepods-burstable-pod<uid with _ for ->.slice/cri-containerd-<id>.scope`
//!   (`docker-<id>.scope`, `crio-<id>.scope`);
//! - any other parent a runtime was given (containerd's CRI with a
//!   `cgroup_parent` of `/<name>`, or `<name>.slice` with the systemd driver,
//!   as the test beds use): the container id is still the last element (or the
//!   scope), and the pod UID then comes from the runtime, not the path.
//!
//! A container id is 64 hex digits: anything else (a host service's slice, a
//! sandbox manager's 32-digit cgroup) is no container. On a hybrid host
//! (v1 controllers plus a v2 `0::` line) the v1 `memory`, then `pids`, then
//! `name=systemd` hierarchy is asked first (where runc's cgroupfs driver puts
//! the container), then v2, then any other.

use ::procfs::{FromBufRead, ProcessCGroups};

/// What a cgroup path says of its process.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupIds {
    /// The pod's UID, with dashes (only under kubelet's `kubepods` tree).
    pub pod_uid: Option<String>,
    /// The container's full id (64 hex digits).
    pub container_id: Option<String>,
}

/// The ids in process `pid`'s cgroups; none for a host process, or one gone.
pub fn of_pid(pid: u32) -> Option<CgroupIds> {
    let p = ::procfs::process::Process::new(i32::try_from(pid).ok()?).ok()?;
    pick(&p.cgroups().ok()?)
}

/// The ids in the text of a `/proc/PID/cgroup` file.
pub fn parse_file(text: &str) -> Option<CgroupIds> {
    pick(&ProcessCGroups::from_buf_read(text.as_bytes()).ok()?)
}

/// The first hierarchy, in order of preference, whose path names a container.
fn pick(groups: &ProcessCGroups) -> Option<CgroupIds> {
    let rank = |controllers: &[String], hierarchy: u32| -> u8 {
        let has = |c: &str| controllers.iter().any(|x| x == c);
        if has("memory") {
            0
        } else if has("pids") {
            1
        } else if has("name=systemd") {
            2
        } else if hierarchy == 0 && controllers.is_empty() {
            3
        } else {
            4
        }
    };
    let mut lines: Vec<_> = groups.0.iter().collect();
    lines.sort_by_key(|g| rank(&g.controllers, g.hierarchy));
    lines.into_iter().find_map(|g| parse_path(&g.pathname))
}

/// The ids in one cgroup path; none when its last element is no container.
pub fn parse_path(path: &str) -> Option<CgroupIds> {
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let last = parts.next_back()?;
    let container_id = container_of(last)?;
    let pod_uid = path.split('/').filter(|p| !p.is_empty()).find_map(pod_of);
    Some(CgroupIds { pod_uid, container_id: Some(container_id) })
}

pub(crate) fn is_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `<id>` or `crio[-conmon]-<id>` (cgroupfs), or `<runtime>-<id>.scope` (systemd). A
/// conmon monitors one container: its cgroup names that container.
fn container_of(element: &str) -> Option<String> {
    if is_id(element) {
        return Some(element.to_string());
    }
    let named = element.strip_suffix(".scope").or_else(|| element.strip_prefix("crio-"))?;
    let id = named.rsplit('-').next()?;
    is_id(id).then(|| id.to_string())
}

/// `pod<uid>` (cgroupfs) or `kubepods[-class]-pod<uid_with_underscores>.slice` (systemd).
fn pod_of(element: &str) -> Option<String> {
    let uid = match element.strip_suffix(".slice") {
        Some(slice) => slice.rsplit_once("-pod").map(|(_, u)| u.replace('_', "-"))?,
        None => element.strip_prefix("pod")?.to_string(),
    };
    let ok = uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-');
    ok.then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "5c2b0e1f3a7d4b9e8c6f1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d";
    const UID: &str = "0b6f9a1e-4c2d-4e8b-9f3a-7d5c1e2b3a4f";

    fn want(uid: Option<&str>) -> Option<CgroupIds> {
        Some(CgroupIds { pod_uid: uid.map(String::from), container_id: Some(ID.into()) })
    }

    #[test]
    fn crio_cgroupfs_paths() {
        assert_eq!(parse_path(&format!("/kubepods/burstable/pod{UID}/crio-{ID}")), want(Some(UID)));
        assert_eq!(parse_path(&format!("/kubepods/burstable/pod{UID}/crio-conmon-{ID}")), want(Some(UID)));
        // Another parent (the test bed's): the id, no pod UID.
        assert_eq!(parse_path(&format!("/plegwatch-crio/crio-{ID}")), want(None));
        // A short id, or another prefix without a scope, is no container.
        assert_eq!(parse_path(&format!("/kubepods/pod{UID}/crio-{}", &ID[..12])), None);
        assert_eq!(parse_path(&format!("/kubepods/pod{UID}/docker-{ID}")), None);
    }

    #[test]
    fn cgroupfs_driver_paths() {
        assert_eq!(parse_path(&format!("/kubepods/burstable/pod{UID}/{ID}")), want(Some(UID)));
        assert_eq!(parse_path(&format!("/kubepods/besteffort/pod{UID}/{ID}")), want(Some(UID)));
        // Guaranteed QoS: straight under kubepods.
        assert_eq!(parse_path(&format!("/kubepods/pod{UID}/{ID}")), want(Some(UID)));
        // The pod's own cgroup is no container.
        assert_eq!(parse_path(&format!("/kubepods/burstable/pod{UID}")), None);
    }

    #[test]
    fn systemd_driver_paths() {
        let uid_ = UID.replace('-', "_");
        for runtime in ["cri-containerd", "docker", "crio"] {
            let path = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/{runtime}-{ID}.scope");
            assert_eq!(parse_path(&path), want(Some(UID)), "{path}");
        }
        let guaranteed = format!("/kubepods.slice/kubepods-pod{uid_}.slice/cri-containerd-{ID}.scope");
        assert_eq!(parse_path(&guaranteed), want(Some(UID)));
        // crio's conmon scope is no container.
        assert_eq!(parse_path(&format!("/kubepods.slice/kubepods-pod{uid_}.slice/crio-conmon-{}.scope", &ID[..12])), None);
    }

    #[test]
    fn other_parents_give_the_container_only() {
        // containerd's CRI with a cgroup parent of /<name> (cgroupfs) or <name>.slice (systemd).
        assert_eq!(parse_path(&format!("/plegwatch-9770-1234/{ID}")), want(None));
        assert_eq!(parse_path(&format!("/plegwatch1a2b.slice/cri-containerd-{ID}.scope")), want(None));
        assert_eq!(parse_path(&format!("/system.slice/plegwatch1a2b.slice/cri-containerd-{ID}.scope")), want(None));
    }

    #[test]
    fn host_processes_are_in_no_container() {
        assert_eq!(parse_path("/"), None);
        assert_eq!(parse_path("/system.slice/containerd.service"), None);
        assert_eq!(parse_path("/user.slice/user-0.slice/session-3.scope"), None);
        // A sandbox manager's own 32-digit cgroup.
        assert_eq!(parse_path("/process_api/35ab7e192f99fb254b5ff0db385a49e6"), None);
        let host = "12:pids:/system.slice/ssh.service\n4:memory:/system.slice/ssh.service\n1:name=systemd:/system.slice/ssh.service\n0::/system.slice/ssh.service\n";
        assert_eq!(parse_file(host), None);
    }

    #[test]
    fn v1_file_picks_the_memory_hierarchy() {
        // cgroupfs driver on a hybrid host: the controllers carry the container, v2 does not.
        let text = format!(
            "12:cpuset:/kubepods/burstable/pod{UID}/{ID}\n8:memory:/kubepods/burstable/pod{UID}/{ID}\n\
             7:pids:/kubepods/burstable/pod{UID}/{ID}\n1:name=systemd:/kubepods/burstable/pod{UID}/{ID}\n0::/\n"
        );
        assert_eq!(parse_file(&text), want(Some(UID)));
        // Only name=systemd names it (a runtime that left the controllers alone).
        let text = format!("8:memory:/\n7:pids:/\n1:name=systemd:/plegwatch/{ID}\n0::/\n");
        assert_eq!(parse_file(&text), want(None));
    }

    #[test]
    fn v2_file() {
        let uid_ = UID.replace('-', "_");
        let text = format!("0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{uid_}.slice/cri-containerd-{ID}.scope\n");
        assert_eq!(parse_file(&text), want(Some(UID)));
        let text = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
        assert_eq!(parse_file(&text), want(Some(UID)));
        assert_eq!(parse_file("0::/init.scope\n"), None);
    }

    #[test]
    fn hybrid_systemd_driver_file() {
        // systemd driver on a hybrid host: every v1 controller and the v2 line name the scope.
        let uid_ = UID.replace('-', "_");
        let path = format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid_}.slice/cri-containerd-{ID}.scope");
        let text = format!("11:memory:{path}\n3:pids:{path}\n1:name=systemd:{path}\n0::{path}\n");
        assert_eq!(parse_file(&text), want(Some(UID)));
    }

    #[test]
    fn a_process_gone_has_none() {
        assert_eq!(of_pid(u32::MAX - 1), None);
    }
}
