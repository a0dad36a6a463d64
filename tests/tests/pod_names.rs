//! Pod, namespace and container names on incidents, from real pods run through containerd's
//! CRI: the runc-stopped bed (`UpdateContainerResources` while the shim's `runc update` is
//! frozen), a host-network pod `runcstopped` in namespace `plegwatch` with a container
//! `sleeper`, and `plegwatch watch` looking on.
//!
//! - `names_from_the_runtime` (`--runtime-endpoint` the bed's socket) and
//!   `names_from_bundles_only` (`--runtime-endpoint none`: the shim's bundle annotations,
//!   never the CRI): the incident's shim hop names the pod (no container: one shim serves the
//!   pod), the stopped runc names the pod and the container, by name and id, exactly as
//!   configured through CRI; containerd's hops (host processes) name none.
//! - `names_on_2_3`: the same on containerd 2.3.4 (its shim and bundle layout).

use anyhow::Result;
use plegwatch_scenarios::containerd::bed::{StallBed, Watched};
use plegwatch_scenarios::containerd::runc_stopped::{Bed, Options};
use plegwatch_scenarios::containerd::{self, Version};
use plegwatch_scenarios::{incidents, preflight};
use serde_json::Value;

fn prepare(version: Version) -> Result<Option<Bed>> {
    preflight::require();
    if !containerd::require_version(version, &format!("pod_names on {version}")) {
        return Ok(None);
    }
    Ok(Some(Bed::prepare(Options { version, ..Options::default() })?))
}

#[test]
fn names_from_the_runtime() -> Result<()> {
    let Some(bed) = prepare(Version::DEBIAN)? else { return Ok(()) };
    check(&Watched::run(bed)?)
}

#[test]
fn names_from_bundles_only() -> Result<()> {
    let Some(bed) = prepare(Version::DEBIAN)? else { return Ok(()) };
    check(&Watched::run_bundles_only(bed)?)
}

#[test]
fn names_on_2_3() -> Result<()> {
    let Some(bed) = prepare(Version::V2_3)? else { return Ok(()) };
    check(&Watched::run(bed)?)
}

fn field<'a>(h: &'a Value, k: &str) -> Option<&'a str> {
    h.get(k).and_then(Value::as_str)
}

fn check(w: &Watched<Bed>) -> Result<()> {
    let o = &w.outcome;
    let all = || w.all();
    let config = w.bed.stage().pod().config();
    let meta = config.metadata.as_ref().expect("the pod has metadata");
    let (pod, namespace) = (meta.name.as_str(), meta.namespace.as_str());
    assert_eq!((pod, namespace), ("runcstopped", "plegwatch"), "the bed's pod");
    let is_holder = |h: &Value| h["kind"] == "go_lock" && h["what"].as_str().is_some_and(|s| s.contains("UpdateSync"));
    // Among the incidents still open once runc was seen stopped: the staging's own
    // container start may raise one of its own on a slow machine (see the 9770 scenario).
    let i = incidents::the_one_since(&w.events, w.warn, Some(o.stop_seen), Some(o.continued), is_holder)
        .map_err(|e| anyhow::anyhow!("{e}\n{}", all()))?;
    let line = i
        // Ending at the stopped runc: an earlier line may end at a process seen before
        // its own wait was (a slow guest).
        .line_where(|c| c.last().is_some_and(|h| h["kind"] == "process" && h["what"].as_str().is_some_and(|w| w.contains("state T"))))
        .unwrap_or_else(|| panic!("incident #{} never reached the stopped runc:\n{}", i.id, all()));
    let chain = incidents::Incident::chain(line);
    let text = format!("{}\n{}", incidents::chain_text(&chain), serde_json::to_string_pretty(&chain).unwrap_or_default());

    // The shim's hop: the pod, no container.
    let shim = chain
        .iter()
        .find(|h| h["pid"].as_u64() == Some(u64::from(o.shim.pid)))
        .unwrap_or_else(|| panic!("no hop in the shim (pid {}):\n{text}", o.shim.pid));
    assert_eq!((field(shim, "pod"), field(shim, "namespace")), (Some(pod), Some(namespace)), "the shim's hop:\n{text}");
    assert_eq!(field(shim, "container"), None, "a shim serves the pod, not one container:\n{text}");

    // The stopped runc: the pod and the container it updates, by name and id.
    let runc = chain.last().expect("a chain");
    assert_eq!(runc["pid"].as_u64(), Some(u64::from(o.runc_pid)), "{text}");
    assert_eq!((field(runc, "pod"), field(runc, "namespace")), (Some(pod), Some(namespace)), "the runc's hop:\n{text}");
    assert_eq!(field(runc, "container"), Some("sleeper"), "the runc's hop names the container:\n{text}");
    assert_eq!(field(runc, "container_id"), Some(o.container_id.as_str()), "{text}");

    // containerd's hops are a host process's: no pod.
    let host: Vec<&Value> = chain.iter().filter(|h| h["pid"].as_u64() == Some(u64::from(w.containerd_pid))).collect();
    assert!(!host.is_empty(), "no containerd hop:\n{text}");
    for h in host {
        for k in ["pod", "namespace", "container", "container_id"] {
            assert!(h.get(k).is_none(), "containerd's hop has {k}:\n{text}");
        }
    }
    // The resolution's longest chain keeps the names, though the runc has exited by then.
    let resolved = i.resolved.as_ref().and_then(|r| r.get("/longest_chain")).and_then(Value::as_array).cloned().unwrap_or_default();
    let last = resolved.iter().find(|h| h["pid"].as_u64() == Some(u64::from(o.runc_pid)));
    assert_eq!(last.and_then(|h| field(h, "container")), Some("sleeper"), "the resolved chain's runc hop:\n{}", all());
    // Its stall lines too: the shim's carry the pod, containerd's none.
    let stalls: Vec<_> = w.events.iter().filter(|e| e.is("stall")).collect();
    assert!(
        stalls.iter().any(|s| s.u64("/pid") == Some(u64::from(o.shim.pid)) && s.str("/pod") == Some(pod)),
        "no shim stall naming the pod:\n{}",
        all()
    );
    assert!(stalls.iter().filter(|s| s.u64("/pid") == Some(u64::from(w.containerd_pid))).all(|s| s.str("/pod").is_none()), "{}", all());
    eprintln!("incident #{}:\n{}", i.id, incidents::chain_text(&chain));
    Ok(())
}
