//! `plegwatch check --self-watch`: with no daemon on the node, the check traces by itself.
//!
//! A umount2 of an ext4 holding 10 MiB of dirty data on a loop device throttled to 1 MiB/s
//! runs for about 10 s. Started 2 s into it, `check --self-watch 3s --level warn --warn 1s`
//! must find it through the startup sweep and exit 1 with a line naming umount2 and its
//! target. Once the umount is over, the same check exits 0. With no daemon and no
//! `--self-watch`, it exits 2 and says how to trace instead.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::Context;

use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::preflight::plegwatch_bin;
use plegwatch_scenarios::{preflight, LoopFs, WriteThrottle};

const DIRTY: usize = 10 * MIB;
const THROTTLE_BPS: u64 = 1 << 20;
const HEAD_START: Duration = Duration::from_secs(2);

/// Runs `plegwatch check ARGS`: (exit code, stdout, stderr).
fn check(args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let out = Command::new(plegwatch_bin()?).arg("check").args(args).output().context("run plegwatch check")?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn check_traces_by_itself_when_no_daemon_runs() -> anyhow::Result<()> {
    preflight::require();
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("check_self_watch", &why);
        return Ok(());
    }
    // A private directory with no daemon's socket in it.
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("plegwatch.sock").display().to_string();

    let (code, line, _) = check(&["--socket", &socket, "--timeout", "2s"])?;
    assert_eq!(code, 2, "no daemon, no --self-watch: NPD's Unknown; said {line:?}");
    assert!(line.contains("--self-watch"), "the line says how to trace instead: {line:?}");

    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    let target = fs.mount_point().to_path_buf();
    dirty::write_file(&target.join("dirty.bin"), DIRTY)?;
    let started = Instant::now();
    let mut umount = Command::new("umount").arg(&target).spawn()?;
    std::thread::sleep(HEAD_START);
    assert!(umount.try_wait()?.is_none(), "the umount ended within the {HEAD_START:?} head start: no stall to find");

    let args = ["--socket", &socket, "--self-watch", "3s", "--level", "warn", "--warn", "1s", "--critical", "2m", "--imminent", "3m"];
    let (code, line, stderr) = check(&args)?;
    let still_running = umount.try_wait()?.is_none();
    let status = umount.wait()?;
    let took = started.elapsed();
    eprintln!("check during the umount: exit {code}: {line}umount took {:.3}s", took.as_secs_f64());
    assert!(status.success(), "umount failed: {status}");
    assert!(still_running, "the umount ended before the check did ({took:?}): the check proves nothing; stderr:\n{stderr}");
    assert_eq!(code, 1, "a umount stalled for seconds is a problem at warn; said {line:?}; stderr:\n{stderr}");
    assert!(line.contains("umount2"), "the line names the root's syscall: {line:?}");
    assert!(line.contains(target.to_str().unwrap_or("?")), "the line names the umount's target: {line:?}");
    assert_eq!(line.lines().count(), 1, "one line on stdout: {line:?}");
    // The age is refreshed to within a second of the watch's end: at least the head start
    // plus the 3 s traced (the sweep's start is a lower bound, so not more than the umount's).
    let waited: f64 = line.split("used, ").nth(1).and_then(|r| r.split('s').next()).and_then(|n| n.parse().ok()).unwrap_or(f64::NAN);
    assert!(waited >= 2.0 && waited <= took.as_secs_f64() + 1.0, "the line's age {waited}s is not the umount's (ran {took:?}): {line:?}");
    drop(throttle);

    let (code, line, stderr) = check(&args)?;
    assert_eq!(code, 0, "nothing stalls now; said {line:?}; stderr:\n{stderr}");
    Ok(())
}
