//! Which pod and container a process belongs to, for the waits, incidents,
//! reports and metrics that name it.
//!
//! - `cgroup`: the container id (and, under kubelet's tree, the pod UID) from
//!   `/proc/PID/cgroup`, v1 and v2, cgroupfs and systemd drivers.
//! - `cri`: names from the runtime over CRI, asked off the scan loop with
//!   short deadlines and a backoff, kept in a table.
//! - `bundle`: names from the container's OCI bundle (`config.json`, CRI's
//!   annotations), found from its shim: never talks to containerd.
//!
//! **Which source wins.** The CRI table first, when it holds the id: it is
//! the runtime's own answer, for any CRI runtime. The bundle when the table
//! misses: a container newer than the last refresh, or a runtime that does
//! not answer, which is exactly when plegwatch is needed (containerd#9770).
//! Both carry the same names (CRI writes the bundle's annotations from the
//! same sandbox and container configs), so they never disagree on a
//! container that both know.
//!
//! **Which id.** A process in a container's cgroup is that container. A
//! process outside any (a shim, or the `runc` a shim runs, which stays in the
//! shim's cgroup) is found by its shim: a `runc` naming a container id on its
//! command line is that container; the shim itself, and anything else under
//! it, is the shim's pod (its `-id` is the pod sandbox's), with no container:
//! one shim serves the whole pod. CRI-O runs the OCI runtime itself for
//! `update`, `state`, `kill` and `delete` (a child of crio, in crio's cgroup): a
//! child of crio naming a container id on its command line is that container
//! (its names from CRI only: crio's bundles are not read). A host process has
//! none.

pub mod bundle;
pub mod cgroup;
pub mod cri;

use crate::graph::model::PodRef;
use crate::observe::procfs;
use bundle::Names;
use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

/// How long a process's answer is reused.
const PID_TTL: Duration = Duration::from_secs(5);
/// How long a bundle's names are reused (they never change; a removed one goes).
const BUNDLE_TTL: Duration = Duration::from_secs(60);
/// Most answers kept of each kind.
const CACHE_MAX: usize = 2048;

/// The lookups, with their caches.
#[derive(Default)]
pub struct Pods {
    cri: Option<cri::CriNames>,
    pids: HashMap<u32, (Instant, PodRef)>,
    bundles: HashMap<String, (Instant, Option<Names>)>,
}

impl Pods {
    /// Lookups that ask the runtime on `socket` (off the loop), or bundles only with none.
    pub fn new(socket: Option<std::path::PathBuf>) -> Self {
        let cri = socket.and_then(|s| {
            cri::CriNames::start(s)
                .map_err(|e| tracing::warn!(error = %e, "CRI names: worker not started; pod names come from bundles only"))
                .ok()
        });
        Pods { cri, ..Default::default() }
    }

    /// The pod and container of process `pid` (empty for a host process).
    pub fn of_pid(&mut self, pid: u32) -> PodRef {
        if pid == 0 {
            return PodRef::default();
        }
        if let Some((at, r)) = self.pids.get(&pid) {
            if at.elapsed() < PID_TTL {
                return r.clone();
            }
        }
        if self.pids.len() >= CACHE_MAX {
            self.pids.retain(|_, (at, _)| at.elapsed() < PID_TTL);
        }
        let mut r = self.look_up(pid);
        if r.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            // Gone (a runc that went on and exited before its incident resolved): it keeps
            // the names it had, for the resolution's chain.
            if let Some((_, old)) = self.pids.get(&pid) {
                r = old.clone();
            }
        }
        self.pids.insert(pid, (Instant::now(), r.clone()));
        r
    }

    fn look_up(&mut self, pid: u32) -> PodRef {
        if let Some(id) = cgroup::of_pid(pid).and_then(|c| c.container_id) {
            let names = self.container_names(&id, || bundle::shim_of(pid));
            return pod_ref(names, Some(id));
        }
        let Some(shim) = bundle::shim_of(pid) else { return self.crio_runtime(pid) };
        if shim.pid != pid {
            // A runc (or other helper) the shim runs: the container it names, if any.
            let argv = bundle::cmdline(pid);
            if let Some(id) = argv.iter().rev().find(|a| cgroup::is_id(a)) {
                let names = self.container_names(id, || Some(shim.clone()));
                if names.is_some() {
                    return pod_ref(names, Some(id.clone()));
                }
            }
        }
        let names = shim
            .id
            .as_deref()
            .and_then(|id| self.cri.as_ref().and_then(|c| c.sandbox(id)).or_else(|| self.bundle_names(id, || Some(shim.clone()))));
        let mut r = pod_ref(names, None);
        r.container = None;
        r
    }

    /// A runtime CRI-O runs for a container (see the module doc), else nothing.
    fn crio_runtime(&mut self, pid: u32) -> PodRef {
        let parent = procfs::ppid(pid).and_then(procfs::comm);
        if !parent.as_deref().is_some_and(is_crio_comm) {
            return PodRef::default();
        }
        let argv = bundle::cmdline(pid);
        let Some(id) = argv.iter().rev().find(|a| cgroup::is_id(a)) else {
            return PodRef::default();
        };
        let names = self.cri.as_ref().and_then(|c| c.container(id));
        pod_ref(names, Some(id.clone()))
    }

    fn container_names(&mut self, id: &str, shim: impl FnOnce() -> Option<bundle::Shim>) -> Option<Names> {
        self.cri.as_ref().and_then(|c| c.container(id)).or_else(|| self.bundle_names(id, shim))
    }

    fn bundle_names(&mut self, id: &str, shim: impl FnOnce() -> Option<bundle::Shim>) -> Option<Names> {
        if let Some((at, n)) = self.bundles.get(id) {
            if at.elapsed() < BUNDLE_TTL {
                return n.clone();
            }
        }
        if self.bundles.len() >= CACHE_MAX {
            self.bundles.retain(|_, (at, _)| at.elapsed() < BUNDLE_TTL);
        }
        let n = bundle::find(id, shim().as_ref()).and_then(|b| bundle::read(&b));
        self.bundles.insert(id.to_string(), (Instant::now(), n.clone()));
        n
    }
}

/// CRI-O's process name (`crio`; a renamed build keeps the prefix).
fn is_crio_comm(comm: &str) -> bool {
    comm == "crio" || comm.starts_with("crio-")
}

fn pod_ref(names: Option<Names>, container_id: Option<String>) -> PodRef {
    let n = names.unwrap_or_default();
    PodRef { pod: n.pod, namespace: n.namespace, container: n.container, container_id }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_processes_have_no_pod() {
        let mut pods = Pods::new(None);
        assert!(pods.of_pid(std::process::id()).is_empty());
        assert!(pods.of_pid(0).is_empty());
        assert!(pods.of_pid(u32::MAX - 1).is_empty());
    }

    #[test]
    fn names_become_a_pod_ref() {
        let n = Names { pod: Some("p".into()), namespace: Some("ns".into()), pod_uid: None, container: Some("c".into()) };
        let r = pod_ref(Some(n), Some("id".into()));
        assert_eq!(r.label().as_deref(), Some("ns/p/c"));
        assert_eq!(pod_ref(None, None), PodRef::default());
    }
}
