//! Pod and container names from a container's OCI bundle, without asking
//! containerd: CRI writes them into the bundle's `config.json` as
//! annotations (`io.kubernetes.cri.sandbox-name`, `-namespace`, `-uid`,
//! `container-name`, `container-type`), and the file stays as it was
//! written for the container's life.
//!
//! The bundle is found from the shim: containerd's runc shim v2
//! (`containerd-shim-runc-v2 -namespace NS -id ID -address SOCK`) runs with
//! its first task's bundle, `<state>/io.containerd.runtime.v2.task/NS/ID`,
//! as its working directory, and every task it serves has its bundle beside
//! that one. So the state dir is read from the shim, never assumed (test
//! beds and distributions move it); only when no shim is found is
//! containerd's default state dir tried.

use crate::observe::procfs;
use serde::Deserialize;
use std::{
    collections::HashMap,
    path::{Path, PathBuf},
};

/// The names CRI gave a pod sandbox or one of its containers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Names {
    pub pod: Option<String>,
    pub namespace: Option<String>,
    pub pod_uid: Option<String>,
    /// The container's name; none for the sandbox (pause) container.
    pub container: Option<String>,
}

/// containerd's default state dir for v2 shims' bundles.
const DEFAULT_TASKS: &str = "/run/containerd/io.containerd.runtime.v2.task";

/// Biggest `config.json` read (a real one is a few tens of KiB).
const CONFIG_MAX: u64 = 1 << 20;

/// How far up the parent chain a process's shim is looked for.
const SHIM_DEPTH: usize = 16;

#[derive(Deserialize)]
struct Config {
    #[serde(default)]
    annotations: HashMap<String, String>,
}

/// The names in the text of a bundle's `config.json`; none without CRI's annotations.
pub fn parse_config(text: &str) -> Option<Names> {
    let c: Config = serde_json::from_str(text).ok()?;
    let get = |k: &str| c.annotations.get(&format!("io.kubernetes.cri.{k}")).filter(|v| !v.is_empty()).cloned();
    let names = Names {
        pod: get("sandbox-name"),
        namespace: get("sandbox-namespace"),
        pod_uid: get("sandbox-uid"),
        container: match get("container-type").as_deref() {
            Some("sandbox") => None,
            _ => get("container-name"),
        },
    };
    (names.pod.is_some() || names.container.is_some()).then_some(names)
}

/// The names in `bundle/config.json`.
pub fn read(bundle: &Path) -> Option<Names> {
    use std::io::Read as _;
    let f = std::fs::File::open(bundle.join("config.json")).ok()?;
    let mut text = String::new();
    f.take(CONFIG_MAX).read_to_string(&mut text).ok()?;
    parse_config(&text)
}

/// A containerd shim: its pid, the task id it was started for (the pod
/// sandbox's id under CRI) and its working directory (that task's bundle).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shim {
    pub pid: u32,
    pub id: Option<String>,
    pub bundle: Option<PathBuf>,
}

impl Shim {
    /// Where the bundle of task `id` of this shim sits: beside the shim's own.
    pub fn bundle_of(&self, id: &str) -> Option<PathBuf> {
        Some(self.bundle.as_ref()?.parent()?.join(id))
    }
}

/// Whether `comm` is a containerd shim's (`containerd-shim`, `containerd-shim-runc-v2`
/// cut to 15 characters).
pub fn is_shim_comm(comm: &str) -> bool {
    comm.starts_with("containerd-shim")
}

/// The `-id` argument of a shim's command line.
pub fn shim_id(argv: &[String]) -> Option<String> {
    let i = argv.iter().position(|a| a == "-id" || a == "--id")?;
    argv.get(i + 1).cloned()
}

/// The shim of process `pid`: itself, or its nearest ancestor that is one.
pub fn shim_of(pid: u32) -> Option<Shim> {
    let mut p = pid;
    for _ in 0..SHIM_DEPTH {
        if p <= 1 {
            return None;
        }
        if procfs::comm(p).is_some_and(|c| is_shim_comm(&c)) {
            return Some(Shim { pid: p, id: shim_id(&cmdline(p)), bundle: std::fs::read_link(format!("/proc/{p}/cwd")).ok() });
        }
        p = procfs::ppid(p)?;
    }
    None
}

/// A process's arguments (read within a deadline: it takes the process's `mmap_lock`).
pub fn cmdline(pid: u32) -> Vec<String> {
    crate::observe::bounded_read::cmdline(pid)
}

/// The bundle of container `id`: beside its shim's, or in containerd's
/// default state dir (under any namespace) when there is no shim to ask.
pub fn find(id: &str, shim: Option<&Shim>) -> Option<PathBuf> {
    if let Some(b) = shim.and_then(|s| s.bundle_of(id)).filter(|b| b.join("config.json").is_file()) {
        return Some(b);
    }
    std::fs::read_dir(DEFAULT_TASKS).ok()?.flatten().map(|ns| ns.path().join(id)).find(|b| b.join("config.json").is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The annotations part of a containerd 1.6 CRI container's config.json.
    const CONTAINER: &str = r#"{"ociVersion":"1.0.2-dev","process":{"args":["sleep","3600"]},
        "annotations":{"io.kubernetes.cri.container-name":"app","io.kubernetes.cri.container-type":"container",
        "io.kubernetes.cri.image-name":"docker.io/library/busybox:1",
        "io.kubernetes.cri.sandbox-id":"9f0e","io.kubernetes.cri.sandbox-name":"web-0",
        "io.kubernetes.cri.sandbox-namespace":"shop","io.kubernetes.cri.sandbox-uid":"0b6f9a1e-4c2d-4e8b-9f3a-7d5c1e2b3a4f"}}"#;

    const SANDBOX: &str = r#"{"annotations":{"io.kubernetes.cri.container-type":"sandbox",
        "io.kubernetes.cri.sandbox-id":"9f0e","io.kubernetes.cri.sandbox-name":"web-0",
        "io.kubernetes.cri.sandbox-namespace":"shop","io.kubernetes.cri.sandbox-log-directory":"/var/log/pods/x"}}"#;

    #[test]
    fn container_annotations() {
        let n = parse_config(CONTAINER).unwrap();
        assert_eq!(n.pod.as_deref(), Some("web-0"));
        assert_eq!(n.namespace.as_deref(), Some("shop"));
        assert_eq!(n.pod_uid.as_deref(), Some("0b6f9a1e-4c2d-4e8b-9f3a-7d5c1e2b3a4f"));
        assert_eq!(n.container.as_deref(), Some("app"));
    }

    #[test]
    fn a_sandbox_names_the_pod_only() {
        let n = parse_config(SANDBOX).unwrap();
        assert_eq!((n.pod.as_deref(), n.namespace.as_deref(), n.container), (Some("web-0"), Some("shop"), None));
    }

    #[test]
    fn no_cri_annotations_no_names() {
        assert_eq!(parse_config(r#"{"annotations":{"org.opencontainers.image.title":"x"}}"#), None);
        assert_eq!(parse_config(r#"{"ociVersion":"1.0.2"}"#), None);
        assert_eq!(parse_config("not json"), None);
    }

    #[test]
    fn shim_arguments_and_bundles() {
        let argv: Vec<String> =
            ["/usr/bin/containerd-shim-runc-v2", "-namespace", "k8s.io", "-id", "abc", "-address", "/run/containerd/containerd.sock"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        assert_eq!(shim_id(&argv).as_deref(), Some("abc"));
        assert!(is_shim_comm("containerd-shim"));
        assert!(!is_shim_comm("containerd"));
        let shim = Shim { pid: 7, id: Some("abc".into()), bundle: Some("/tmp/x/state/io.containerd.runtime.v2.task/k8s.io/abc".into()) };
        assert_eq!(shim.bundle_of("def"), Some(PathBuf::from("/tmp/x/state/io.containerd.runtime.v2.task/k8s.io/def")));
    }

    #[test]
    fn a_bundle_beside_the_shims_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let ns = dir.path().join("k8s.io");
        for (id, text) in [("sandbox1", SANDBOX), ("ctr1", CONTAINER)] {
            std::fs::create_dir_all(ns.join(id)).unwrap();
            std::fs::write(ns.join(id).join("config.json"), text).unwrap();
        }
        let shim = Shim { pid: 7, id: Some("sandbox1".into()), bundle: Some(ns.join("sandbox1")) };
        let b = find("ctr1", Some(&shim)).unwrap();
        assert_eq!(read(&b).unwrap().container.as_deref(), Some("app"));
        assert_eq!(find("gone", Some(&shim)), None);
    }

    #[test]
    fn this_process_has_no_shim() {
        assert_eq!(shim_of(std::process::id()), None);
    }
}
