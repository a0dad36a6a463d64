//! `plegwatch watch --report-dir`: a real stall (umount2 of an ext4 holding 6 MiB of dirty
//! data on a loop device throttled to 1 MiB/s) leaves an incident bundle and the run's
//! bundle, with every file, private modes, and blocked time that matches the measured wait;
//! `go tool pprof` reads the profile back with the folded file's total, and `plegwatch
//! report` re-renders the bundle.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde_json::Value;

use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::preflight::plegwatch_bin;
use plegwatch_scenarios::{incidents, preflight, LoopFs, Plegwatch, WriteThrottle};

const DIRTY: usize = 6 * MIB;
const THROTTLE_BPS: u64 = 1 << 20;
const WARN: Duration = Duration::from_secs(1);
/// Below this the umount did not really stall.
const REAL_STALL: Duration = Duration::from_secs(3);
const FILES: [&str; 5] = ["blocked.folded", "blocked.svg", "profile.pb.gz", "incident.json", "latency.json"];

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).map(|m| m.permissions().mode() & 0o777).unwrap_or(0)
}

fn folded_total(folded: &str) -> u64 {
    folded.lines().filter_map(|l| l.rsplit_once(' ')).filter_map(|(_, v)| v.parse::<u64>().ok()).sum()
}

/// `go tool pprof ARGS profile`, stdout; under CI a missing `go` fails naming it.
fn go_pprof(args: &[&str], profile: &Path) -> anyhow::Result<Option<String>> {
    let out = match Command::new("go").args(["tool", "pprof"]).args(args).arg(profile).env("HOME", std::env::temp_dir()).output() {
        Ok(o) => o,
        Err(e) => {
            preflight::skip(
                "report_bundle",
                &format!("`go` (Debian's golang-go) is missing, so `go tool pprof` cannot read the profile: {e}"),
            );
            return Ok(None);
        }
    };
    if !out.status.success() {
        bail!("go tool pprof {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(Some(String::from_utf8_lossy(&out.stdout).into_owned()))
}

fn raw_total(raw: &str) -> u64 {
    let section = raw.split("Samples:").nth(1).unwrap_or("");
    let section = section.split("Locations").next().unwrap_or(section);
    section.lines().filter_map(|l| l.trim_start().split_once(':')).filter_map(|(v, _)| v.trim().parse::<u64>().ok()).sum()
}

#[test]
fn a_real_umount_stall_leaves_a_complete_private_bundle() -> anyhow::Result<()> {
    preflight::require();
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("report_bundle", &why);
        return Ok(());
    }
    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let _throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    let tmp = tempfile::tempdir()?;
    let reports = tmp.path().join("reports");
    let reports_arg = reports.to_string_lossy().into_owned();
    let mut plegwatch = Plegwatch::start(&["--warn", "1s", "--critical", "2s", "--imminent", "3s", "--report-dir", &reports_arg])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    let target = fs.mount_point();
    dirty::write_file(&target.join("dirty.bin"), DIRTY)?;
    let started = Instant::now();
    let (pid, measured) = fs.umount_timed()?;
    assert!(measured > REAL_STALL, "umount took only {measured:?}: the throttle on {} did not take", fs.dev());

    plegwatch.wait_for(Duration::from_secs(10), |e| e.is_about("resolved", pid));
    // The incident resolves within a scan of its last wait.
    std::thread::sleep(Duration::from_millis(800));
    let events = plegwatch.stop()?;
    let is_umount = |h: &Value| h["kind"] == "umount" && h["pid"].as_u64() == Some(u64::from(pid));
    let incident = incidents::the_one(&events, WARN, Some(started + measured), is_umount)?;

    // The report dir and one bundle per incident, plus the run's.
    assert_eq!(mode(&reports), 0o700, "{}", reports.display());
    let bundles: Vec<PathBuf> = std::fs::read_dir(&reports)?.filter_map(|e| e.ok().map(|e| e.path())).collect();
    eprintln!("bundles: {bundles:?}");
    let find = |suffix: &str| bundles.iter().find(|b| b.to_string_lossy().ends_with(suffix)).cloned();
    let mine =
        find(&format!("-incident-{}", incident.id)).with_context(|| format!("no bundle for incident #{} in {bundles:?}", incident.id))?;
    let run = find("-run").with_context(|| format!("no run bundle in {bundles:?}"))?;
    for b in [&mine, &run] {
        assert_eq!(mode(b), 0o700, "{}", b.display());
        for f in FILES {
            let p = b.join(f);
            assert!(p.is_file(), "{} is missing", p.display());
            assert_eq!(mode(&p), 0o600, "{}", p.display());
            assert!(std::fs::metadata(&p)?.len() > 0, "{} is empty", p.display());
        }
    }

    // The umount's own sample: its kernel-timed blocked time, about the measured wait,
    // on a stack that ends in its kernel stack.
    let json: Value = serde_json::from_slice(&std::fs::read(mine.join("incident.json"))?)?;
    assert_eq!(json["format"], "plegwatch-bundle/1");
    assert_eq!(json["reason"], "resolved", "the bundle was rewritten when the incident resolved");
    assert_eq!(json["incidents"][0]["level"], "imminent", "the incident reached imminent (3 s)");
    let umount_wait = json["waits"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|w| w["kind"] == "umount" && w["pid"].as_u64() == Some(u64::from(pid)))
        .context("the umount's wait record")?;
    let wait_id = umount_wait["id"].as_u64().context("wait id")?.to_string();
    let sample = json["samples"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["labels"]["wait"] == wait_id.as_str())
        .context("the umount's sample")?;
    let blocked = Duration::from_nanos(sample["blocked_ns"].as_u64().unwrap_or(0));
    eprintln!(
        "umount: measured {:.3}s, blocked in the bundle {:.3}s, stack {}",
        measured.as_secs_f64(),
        blocked.as_secs_f64(),
        sample["stack"]
    );
    assert!(
        blocked + Duration::from_millis(300) >= measured && blocked <= measured + Duration::from_millis(300),
        "blocked {blocked:?} vs measured {measured:?}"
    );
    let stack: Vec<&str> = sample["stack"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    assert!(stack.iter().any(|f| f.starts_with("umount umount: umount2")), "{stack:?}");
    assert!(stack.last().is_some_and(|f| f.ends_with("_[k]")), "the stack ends in the kernel: {stack:?}");

    let folded = std::fs::read_to_string(mine.join("blocked.folded"))?;
    let total = folded_total(&folded);
    assert!(total >= blocked.as_nanos() as u64, "folded total {total} < the umount's {blocked:?}");
    let svg = std::fs::read_to_string(mine.join("blocked.svg"))?;
    assert!(svg.starts_with("<?xml") && svg.contains("umount2") && svg.trim_end().ends_with("</svg>"), "blocked.svg");
    let latency: Value = serde_json::from_slice(&std::fs::read(mine.join("latency.json"))?)?;
    let syscalls = latency["families"][0]["rows"].as_array().cloned().unwrap_or_default();
    assert!(syscalls.iter().any(|r| r["name"] == "umount2" && r["count"].as_u64() >= Some(1)), "latency.json: {latency}");

    // go tool pprof reads the same total; -top as docs/reports.md shows it.
    if let Some(raw) = go_pprof(&["-raw"], &mine.join("profile.pb.gz"))? {
        assert_eq!(raw_total(&raw), total, "pprof -raw vs blocked.folded:\n{raw}");
        if let Some(top) = go_pprof(&["-top"], &mine.join("profile.pb.gz"))? {
            eprintln!("go tool pprof -top:\n{top}");
        }
    }

    // plegwatch report re-renders it; bad input is one line.
    let out = Command::new(plegwatch_bin()?).args(["report"]).arg(&mine).args(["--format", "folded"]).output()?;
    assert!(out.status.success(), "plegwatch report: {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), folded);
    let out = Command::new(plegwatch_bin()?).args(["report"]).arg(&mine).args(["--format", "text"]).output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("plegwatch report --format text:\n{text}");
    assert!(text.contains("ROOT") && text.contains("umount2"), "{text}");
    let out = Command::new(plegwatch_bin()?).args(["report"]).arg(tmp.path()).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.trim().lines().count() == 1 && err.contains("incident.json"), "{err}");
    Ok(())
}
