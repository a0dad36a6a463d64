//! The capability set of deploy/daemonset.yaml, measured: plegwatch as uid 0 with exactly
//! the container's `capabilities.add` (everything else dropped: `setpriv --bounding-set`,
//! as the runtime's `drop: [ALL]` does) reaches `ready` with every probe attached and probes
//! a Go target (the fake-kubelet fixture, which holds every capability: reading its
//! /proc/PID/exe needs CAP_SYS_PTRACE); with any one of them removed it stops at start with
//! one line naming the missing capability.
//!
//! The list is read from the manifest's text (the lines under `add:`), so that the test and
//! the DaemonSet cannot drift apart; the tests crate has no YAML parser, and this one list
//! does not justify one.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use plegwatch_scenarios::canary::{repo_root, which};
use plegwatch_scenarios::gofixture::{build_fake_kubelet, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

/// `capabilities.add` of the plegwatch container, and whether `drop` is `["ALL"]`.
fn daemonset_caps() -> Result<(Vec<String>, bool)> {
    let text = std::fs::read_to_string(repo_root().join("deploy/daemonset.yaml"))?;
    // The init container's `capabilities:` only drops; the plegwatch container's adds.
    let mut drop_all = false;
    let mut add = Vec::new();
    let all: Vec<&str> = text.lines().collect();
    let Some(at) = all.iter().position(|l| l.trim() == "add:") else { bail!("no capabilities.add in deploy/daemonset.yaml") };
    if all[..at].iter().rev().take(3).any(|l| l.trim() == r#"drop: ["ALL"]"#) {
        drop_all = true;
    }
    let indent = all[at].len() - all[at].trim_start().len();
    for l in &all[at + 1..] {
        let t = l.trim();
        if t.is_empty() || t.starts_with('#') {
            continue;
        }
        if l.len() - l.trim_start().len() < indent {
            break;
        }
        match t.strip_prefix("- ") {
            Some(cap) => add.push(cap.trim().to_string()),
            None => break,
        }
    }
    Ok((add, drop_all))
}

/// `setpriv` keeping only `caps` (Kubernetes names, `SYS_ADMIN`) in the bounding set, so
/// that uid 0's exec gets exactly them.
fn only(caps: &[String]) -> Vec<String> {
    let list: String = caps.iter().map(|c| format!(",+{}", c.to_lowercase())).collect();
    vec!["setpriv".into(), format!("--bounding-set=-all{list}"), "--inh-caps=-all".into(), "--".into()]
}

#[test]
fn the_daemonsets_capabilities_are_enough_and_each_is_needed() -> Result<()> {
    preflight::require();
    if which("setpriv").is_none() {
        bail!("setpriv (Debian package util-linux) is not on PATH");
    }
    let (caps, drop_all) = daemonset_caps()?;
    eprintln!("deploy/daemonset.yaml: capabilities.add {caps:?}, drop ALL: {drop_all}");
    assert!(drop_all, "the plegwatch container should drop ALL capabilities first");
    assert!(!caps.is_empty(), "no capability added");
    let kubelet = FakeKubelet::start(&build_fake_kubelet()?)?;
    let target = kubelet.pid();

    let wrapper = only(&caps);
    let w: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let mut plegwatch = Plegwatch::start_under(&w, &["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let status = std::fs::read_to_string(format!("/proc/{}/status", plegwatch.pid()))?;
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).context("CapEff")?.trim().to_string();
    eprintln!("plegwatch runs with CapEff {eff}");
    assert_eq!(u64::from_str_radix(&eff, 16)?.count_ones() as usize, caps.len(), "exactly the DaemonSet's capabilities");
    plegwatch.wait_probed(target, Duration::from_secs(20))?;
    plegwatch.stop()?;

    for missing in &caps {
        let fewer: Vec<String> = caps.iter().filter(|c| *c != missing).cloned().collect();
        if fewer.is_empty() {
            continue;
        }
        let wrapper = only(&fewer);
        let w: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let mut plegwatch = Plegwatch::start_under(&w, &["--warn", "2s"])?;
        let err = match plegwatch.wait_ready(READY_TIMEOUT) {
            Ok(_) => bail!("plegwatch started without CAP_{missing}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(&format!("runs without CAP_{missing} (")), "without CAP_{missing}: {err}");
        eprintln!("without CAP_{missing}: refused, naming it");
    }
    Ok(())
}
