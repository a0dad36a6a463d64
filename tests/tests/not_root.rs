//! Not root, for real: plegwatch run as `nobody` with every capability dropped
//! (`setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all
//! --bounding-set=-all`), and as uid 0 with an empty bounding set, stops at
//! start with one line saying what is missing (root, or the capabilities), a
//! non-zero exit, and no panic; `doctor` says the same under `privileges`.
//! (deploy_caps.rs covers uid 0 missing one capability at a time.)

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use plegwatch_scenarios::canary::which;
use plegwatch_scenarios::preflight;

/// Runs `setpriv DROP... plegwatch ARGS` from `/` (readable by nobody), killed after 30 s.
fn run_dropped(drop: &[&str], args: &[&str]) -> Result<Output> {
    let bin = preflight::require();
    let mut child = Command::new("setpriv")
        .args(drop)
        .arg("--")
        .arg(&bin)
        .args(args)
        .current_dir("/")
        .env("RUST_BACKTRACE", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("spawn setpriv")?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!("{args:?} still ran after 30 s without privileges; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child.wait_with_output()?)
}

const NOBODY: &[&str] = &["--reuid=65534", "--regid=65534", "--clear-groups", "--inh-caps=-all", "--bounding-set=-all"];
const ROOT_NO_CAPS: &[&str] = &["--inh-caps=-all", "--bounding-set=-all"];

/// Whether setpriv is there; when not, says so (under CI `skip` fails, naming it).
fn have_setpriv() -> bool {
    let found = which("setpriv").is_some();
    if !found {
        preflight::skip("not_root", "setpriv (Debian package util-linux) is not on PATH");
    }
    found
}

/// The run's stderr is exactly one line, `plegwatch: error: ...` containing each of `wanted`.
fn assert_one_line(what: &str, out: &Output, wanted: &[&str]) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{what}: exited 0 without privileges; stderr {stderr:?}");
    assert_ne!(out.status.code(), Some(101), "{what}: a panic's exit code; stderr {stderr:?}");
    assert!(!stderr.contains("panicked") && !stderr.contains("stack backtrace"), "{what}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{what}: want one line on stderr, got {stderr:?}");
    assert!(lines[0].starts_with("plegwatch: error: "), "{what}: {stderr:?}");
    for w in wanted {
        assert!(lines[0].contains(w), "{what}: {w:?} not in {stderr:?}");
    }
    eprintln!("{what}: exit {:?}: {}", out.status.code(), lines[0]);
}

/// The daemon's address in these runs: it stops before it listens (no root), so the port is
/// never bound (port 0 is refused: `plegwatch check` could not find it).
const NEVER_BOUND: &str = "127.0.0.1:19792";

#[test]
fn as_nobody_every_command_that_traces_says_it_needs_root() -> Result<()> {
    preflight::require();
    if !have_setpriv() {
        return Ok(());
    }
    for args in [
        &["watch", "--no-live", "--duration", "5s"][..],
        &["watch", "--json", "--duration", "5s"],
        &["daemon", "--duration", "5s", "--listen", NEVER_BOUND],
    ] {
        let out = run_dropped(NOBODY, args)?;
        assert_one_line(&format!("nobody: {args:?}"), &out, &["needs root", "CAP_BPF", "CAP_PERFMON", "run it as root"]);
        assert_eq!(out.status.code(), Some(1), "{args:?}: not a usage error");
        assert!(out.stdout.is_empty(), "{args:?}: stdout {:?}", String::from_utf8_lossy(&out.stdout));
    }
    // doctor prints its report, with the same reason under `privileges`, then the one line.
    let out = run_dropped(NOBODY, &["doctor"])?;
    assert_one_line("nobody: doctor", &out, &["not ready", "privileges", "needs root"]);
    let report = String::from_utf8_lossy(&out.stdout);
    let privileges = report.lines().find(|l| l.trim_start().starts_with("privileges")).context("doctor has a privileges line")?;
    assert!(privileges.contains("FAIL") && privileges.contains("needs root"), "{report}");
    Ok(())
}

#[test]
fn as_root_without_capabilities_it_names_them() -> Result<()> {
    preflight::require();
    if !have_setpriv() {
        return Ok(());
    }
    let out = run_dropped(ROOT_NO_CAPS, &["watch", "--no-live", "--duration", "5s"])?;
    assert_one_line("uid 0, no capabilities: watch", &out, &["CAP_SYS_ADMIN", "CAP_SYS_PTRACE", "capabilities"]);
    let out = run_dropped(ROOT_NO_CAPS, &["daemon", "--duration", "5s", "--listen", NEVER_BOUND])?;
    assert_one_line("uid 0, no capabilities: daemon", &out, &["CAP_SYS_ADMIN", "CAP_SYS_PTRACE"]);
    Ok(())
}
