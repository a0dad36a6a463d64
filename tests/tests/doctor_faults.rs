//! Issue 12: no tracefs, no BTF, and a program type refused are each handled as `plegwatch
//! doctor` describes, for real (not root is `not_root.rs`).
//!
//! Each case runs `doctor --json` and `watch --json --duration 3` in a private mount
//! namespace (`unshare -m --propagation private`) where the fault is staged, and checks that
//! doctor's words and watch's behaviour agree: the attach variant doctor says each probe
//! will use is the one watch's `ready` line reports, or, when something required is
//! missing, doctor's verdict names it and watch stops with one line saying the same.
//!
//! - `tracefs_not_mounted_is_mounted`: tmpfs over `/sys/kernel/tracing` and
//!   `/sys/kernel/debug`: tracefs is not mounted; both mount it and say so.
//! - `tracefs_unmountable_is_one_line`: tmpfs over `/sys/kernel` (the kernel's BTF copied
//!   back in): no tracefs and nowhere to mount it; doctor is NOT READY naming tracefs, watch
//!   exits 1 with one line naming it.
//! - `no_btf_falls_back`: an empty file bound over `/sys/kernel/btf/vmlinux`: tp_btf off,
//!   the off-CPU probe on the `sched:sched_switch` tracepoint instead, watch runs.
//! - `refused_program_types_are_named`: this kernel refuses fentry (EPERM at load) and has
//!   no kprobe PMU, for real; doctor names both as refused or absent, no probe uses them,
//!   and watch runs. Then uprobes, which plegwatch does use (for Go targets), are refused
//!   the same way kprobes are here: tmpfs over `/sys/bus/event_source/devices/uprobe`, so
//!   the PMU's `type` file is gone; doctor names it, and watch still runs its kernel probes.
//!   Not covered: a refusal by the verifier or an LSM of a type plegwatch needs (no honest
//!   way to stage one for root on this kernel).

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use plegwatch_scenarios::preflight;

/// Runs `plegwatch ARGS` in a private mount namespace after the shell commands `setup`.
fn run_in_ns(setup: &str, args: &[&str]) -> Result<Output> {
    let bin = preflight::require();
    let script = format!("set -e; {setup}; exec \"$0\" \"$@\"");
    let mut child = Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .arg(&bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("spawn unshare")?;
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait()?.is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output()?;
            bail!("{args:?} still ran after 60 s; stderr: {}", String::from_utf8_lossy(&out.stderr));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output()?;
    eprintln!("{args:?} after {setup:?}: {}\nstderr: {}", out.status, String::from_utf8_lossy(&out.stderr));
    Ok(out)
}

/// `doctor --json` after `setup`: its report and its exit.
fn doctor(setup: &str) -> Result<(Value, Output)> {
    let out = run_in_ns(setup, &["doctor", "--json"])?;
    let report: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("doctor's stdout is not JSON: {}", String::from_utf8_lossy(&out.stdout)))?;
    Ok((report, out))
}

/// `watch --json --duration 3` after `setup`: its JSON lines and its exit.
fn watch(setup: &str) -> Result<(Vec<Value>, Output)> {
    let out = run_in_ns(setup, &["watch", "--json", "--duration", "3"])?;
    let lines = String::from_utf8_lossy(&out.stdout).lines().filter_map(|l| serde_json::from_str(l).ok()).collect();
    Ok((lines, out))
}

fn check<'a>(report: &'a Value, list: &str, name: &str) -> &'a Value {
    report[list]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["name"] == name))
        .unwrap_or_else(|| panic!("doctor has no {list} {name}: {report}"))
}

/// doctor's probe → variant, as `describe()` prints it (`None`: no variant).
fn doctor_probes(report: &Value) -> Vec<(String, Option<String>)> {
    report["probes"]
        .as_array()
        .map(|a| a.iter().map(|p| (p["probe"].as_str().unwrap_or("").to_string(), p["variant"].as_str().map(str::to_string))).collect())
        .unwrap_or_default()
}

/// Watch ran, got ready with the very variants doctor announced, and ended cleanly.
fn assert_watch_as_doctor_says(report: &Value, lines: &[Value], out: &Output) {
    assert!(out.status.success(), "watch exited {}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    let ready = lines.iter().find(|l| l["type"] == "ready").unwrap_or_else(|| panic!("watch printed no ready line: {lines:?}"));
    let got: Vec<(String, Option<String>)> = ready["probes"]
        .as_array()
        .map(|a| a.iter().map(|p| (p["probe"].as_str().unwrap_or("").to_string(), p["variant"].as_str().map(str::to_string))).collect())
        .unwrap_or_default();
    let want = doctor_probes(report);
    assert!(!want.is_empty(), "doctor lists no probes: {report}");
    assert_eq!(got, want, "watch's probes differ from doctor's");
    assert!(lines.iter().any(|l| l["type"] == "summary"), "no summary line: {lines:?}");
}

const HIDE_TRACEFS: &str = "mount -t tmpfs none /sys/kernel/tracing; mount -t tmpfs none /sys/kernel/debug";

#[test]
fn tracefs_not_mounted_is_mounted() -> Result<()> {
    let (report, out) = doctor(HIDE_TRACEFS)?;
    assert!(out.status.success(), "doctor: {}", String::from_utf8_lossy(&out.stderr));
    let t = check(&report, "checks", "tracefs");
    assert_eq!(t["ok"], true, "{t}");
    assert_eq!(t["detail"], "/sys/kernel/tracing (was not mounted: mounted it now)", "{t}");
    assert!(report["problem"].is_null(), "{report}");
    let (lines, out) = watch(HIDE_TRACEFS)?;
    assert_watch_as_doctor_says(&report, &lines, &out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tracefs was not mounted: mounted it on /sys/kernel/tracing"), "{stderr}");
    Ok(())
}

/// No /sys/kernel/tracing to mount on; the kernel's BTF kept, so only tracefs is missing.
const NO_TRACEFS: &str = "T=$(mktemp -d); cp /sys/kernel/btf/vmlinux $T/; mount -t tmpfs none /sys/kernel; \
                          mkdir /sys/kernel/btf; cp $T/vmlinux /sys/kernel/btf/; rm -r $T";

#[test]
fn tracefs_unmountable_is_one_line() -> Result<()> {
    let (report, out) = doctor(NO_TRACEFS)?;
    assert!(!out.status.success(), "doctor passed without tracefs: {report}");
    let t = check(&report, "checks", "tracefs");
    assert_eq!((t["ok"].as_bool(), t["required"].as_bool()), (Some(false), Some(true)), "{t}");
    let detail = t["detail"].as_str().unwrap_or_default();
    assert!(detail.starts_with("tracefs is not mounted and mounting it on /sys/kernel/tracing failed"), "{t}");
    assert_eq!(report["problem"].as_str(), Some(format!("tracefs: {detail}").as_str()), "{report}");
    assert_eq!(check(&report, "checks", "btf")["ok"], true, "BTF was meant to stay: {report}");
    let doctor_err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(doctor_err.trim(), format!("plegwatch: error: this node is not ready for plegwatch: tracefs: {detail}"));

    let (lines, out) = watch(NO_TRACEFS)?;
    assert_eq!(out.status.code(), Some(1), "watch without tracefs: {lines:?}");
    assert!(lines.is_empty(), "watch printed {lines:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("plegwatch: error:")).collect();
    assert_eq!(errors, [format!("plegwatch: error: {detail}")], "watch's stderr: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    Ok(())
}

const NO_BTF: &str = "T=$(mktemp); mount --bind $T /sys/kernel/btf/vmlinux; rm $T";

#[test]
fn no_btf_falls_back() -> Result<()> {
    let (report, out) = doctor(NO_BTF)?;
    assert!(out.status.success(), "doctor: {}", String::from_utf8_lossy(&out.stderr));
    let btf = check(&report, "checks", "btf");
    assert_eq!(btf["ok"], false, "{btf}");
    assert!(btf["detail"].as_str().unwrap_or_default().contains("tp_btf and fentry probes are off"), "{btf}");
    let tp_btf = check(&report, "program_types", "tp_btf");
    assert_eq!((tp_btf["ok"].as_bool(), tp_btf["detail"].as_str()), (Some(false), Some("needs kernel BTF")), "{tp_btf}");
    let offcpu = doctor_probes(&report).into_iter().find(|(p, _)| p == "offcpu");
    assert_eq!(offcpu, Some(("offcpu".into(), Some("tracepoint sched:sched_switch".into()))), "{report}");
    let (lines, out) = watch(NO_BTF)?;
    assert_watch_as_doctor_says(&report, &lines, &out);
    Ok(())
}

const HIDE_UPROBE_PMU: &str = "mount -t tmpfs none /sys/bus/event_source/devices/uprobe";

#[test]
fn refused_program_types_are_named() -> Result<()> {
    let (report, out) = doctor("true")?;
    assert!(out.status.success(), "doctor: {}", String::from_utf8_lossy(&out.stderr));
    let fentry = check(&report, "program_types", "fentry");
    assert_eq!(fentry["ok"], false, "fentry loads on this kernel: the case is not staged: {fentry}");
    assert!(fentry["detail"].as_str().unwrap_or_default().starts_with("refused: "), "{fentry}");
    let kprobe = check(&report, "program_types", "kprobe");
    assert_eq!(kprobe["ok"], false, "kprobes attach on this kernel: the case is not staged: {kprobe}");
    assert!(kprobe["detail"].as_str().unwrap_or_default().starts_with("absent or refused: "), "{kprobe}");
    for (probe, variant) in doctor_probes(&report) {
        let v = variant.unwrap_or_default();
        assert!(!v.starts_with("fentry") && !v.starts_with("kprobe"), "{probe} uses {v}");
    }
    let (lines, out) = watch("true")?;
    assert_watch_as_doctor_says(&report, &lines, &out);

    let (report, out) = doctor(HIDE_UPROBE_PMU)?;
    assert!(out.status.success(), "doctor: {}", String::from_utf8_lossy(&out.stderr));
    let uprobe = check(&report, "program_types", "uprobe");
    assert_eq!(uprobe["ok"], false, "{uprobe}");
    assert!(uprobe["detail"].as_str().unwrap_or_default().contains("/sys/bus/event_source/devices/uprobe/type"), "{uprobe}");
    let (lines, out) = watch(HIDE_UPROBE_PMU)?;
    assert_watch_as_doctor_says(&report, &lines, &out);
    Ok(())
}
