//! The live view on a real terminal: `plegwatch watch --warn 2s` (no `--json`) in a detached
//! 160x50 tmux session, a real umount stall (6 MiB dirty on an ext4 whose loop device is
//! throttled to 1 MiB/s), and the screen read with `tmux capture-pane`:
//!
//! - before any incident, the quiet first screen says what is watched;
//! - while the umount's sync runs, the incident is on screen with its root: the umount, with
//!   its mount path;
//! - once it ends, the incident leaves the open ones for the "recently resolved" footer;
//! - Ctrl-C (typed into the terminal: the tty's SIGINT) ends plegwatch with status 0, and the
//!   terminal, back from the alternate screen, shows the summary.
//!
//! The umount2 is called from a thread of the test named [`COMM`], and plegwatch is started
//! with `--comm` on that name, so stalls of scenarios run at the same time on this machine do
//! not crowd this screen.
//!
//! With `PLEGWATCH_LIVE_CAPTURE=FILE` set, the screen showing the incident is saved to FILE.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::plegwatch::{READY_TIMEOUT, STOP_TIMEOUT};
use plegwatch_scenarios::tmux::{self, Exit, Tmux};
use plegwatch_scenarios::{preflight, LoopFs, WriteThrottle};

const DIRTY: usize = 6 * MIB;
const THROTTLE_BPS: u64 = 1 << 20;
const WARN: Duration = Duration::from_secs(2);
/// Below this the umount did not really stall.
const REAL_STALL: Duration = Duration::from_secs(3);
/// The umount2 thread's name (its comm), and plegwatch's `--comm` filter.
const COMM: &str = "live-umount";
/// How soon after crossing `--warn` the incident must be on screen: a scan (250 ms) and a
/// frame (250 ms), with room for a loaded machine.
const SHOWN_WITHIN: Duration = Duration::from_secs(2);
/// How soon after the umount returns the incident must have left the open ones.
const GONE_WITHIN: Duration = Duration::from_secs(3);
const CAPTURE_ENV: &str = "PLEGWATCH_LIVE_CAPTURE";
/// How long plegwatch may take to exit after its summary: detaching its programs waits on
/// RCU grace periods, one or more per uprobe (Go targets other scenarios run have dozens),
/// which took from 3 to 14 s on this 2-core machine under other scenarios' load.
const EXIT_TIMEOUT: Duration = Duration::from_secs(60);

/// The row of the live view marked ROOT that names the umount of `target`.
fn root_row<'s>(screen: &'s str, target: &Path) -> Option<(usize, &'s str)> {
    let target = target.to_string_lossy();
    screen
        .lines()
        .enumerate()
        .find(|(_, l)| l.trim_start().starts_with("ROOT") && l.contains(" umount ") && l.contains(&format!("umount2 {target}")))
}

/// The id of the incident whose block holds row `row`: its `#N LEVEL` line is the nearest above.
fn incident_above(screen: &str, row: usize) -> Option<u64> {
    screen.lines().take(row).collect::<Vec<_>>().into_iter().rev().find_map(|l| {
        let rest = l.trim_start().strip_prefix('#')?;
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        digits.parse().ok()
    })
}

/// umount2(2) with no flags, from the calling thread.
fn umount2(target: &Path) -> std::io::Result<()> {
    let path = CString::new(target.as_os_str().as_bytes())?;
    // SAFETY: umount2(2) with a NUL-terminated path that outlives the call.
    if unsafe { libc::umount2(path.as_ptr(), 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[test]
fn live_view_shows_the_umount_incident_while_open_then_resolved_and_the_summary_on_ctrl_c() -> Result<()> {
    let bin = preflight::require();
    if let Some(why) = tmux::unavailable() {
        preflight::skip("live_view", &why);
        return Ok(());
    }
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("live_view", &why);
        return Ok(());
    }
    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let _throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    let bin = bin.to_string_lossy().into_owned();
    let term = Tmux::start(160, 50, &[bin.as_str(), "watch", "--warn", "2s", "--comm", COMM])?;

    // The quiet first screen, once the probes are attached.
    let first = term.wait_screen(READY_TIMEOUT, "the quiet first screen", |s| s.contains("no incidents: watching"))?;
    eprintln!("first screen:\n{first}");
    let header = first.lines().next().unwrap_or_default();
    assert!(
        header.contains("probes ready") && header.contains("incidents: 0 open, 0 resolved") && header.contains("warn 2s"),
        "the header line: {header:?}"
    );

    // The stall: dirty pages, then an umount that must write them through the throttle.
    let target = fs.mount_point().to_path_buf();
    dirty::write_file(&target.join("dirty.bin"), DIRTY)?;
    let started = Instant::now();
    let umount = thread::Builder::new().name(COMM.into()).spawn({
        let target = target.clone();
        move || umount2(&target).map(|()| started.elapsed())
    })?;

    let shown = term.wait_screen(WARN + SHOWN_WITHIN, "the umount incident with its root", |s| root_row(s, &target).is_some())?;
    let seen_after = started.elapsed();
    let still_open = !umount.is_finished();
    eprintln!("live view {:.2}s after the umount started:\n{shown}", seen_after.as_secs_f64());
    if let Some(path) = std::env::var_os(CAPTURE_ENV) {
        std::fs::write(&path, &shown).with_context(|| format!("{CAPTURE_ENV}={}", path.to_string_lossy()))?;
    }
    assert!(still_open, "the umount had ended before its incident was on screen: the view must show it while open");
    let (row, root) = root_row(&shown, &target).context("root row")?;
    let id = incident_above(&shown, row).with_context(|| format!("no `#N` incident line above the root row {root:?}:\n{shown}"))?;
    assert!(shown.lines().next().unwrap_or_default().contains("incidents: 1 open, 0 resolved"), "{shown}");
    assert!(!shown.contains("no incidents: watching"), "{shown}");
    let line = shown.lines().find(|l| l.trim_start().starts_with(&format!("#{id} "))).unwrap_or_default();
    assert!(line.contains("WARN") && line.contains("PLEG budget"), "the incident's line: {line:?}");

    let measured = umount.join().map_err(|_| anyhow::anyhow!("the umount thread panicked"))??;
    eprintln!("umount {} took {:.3}s", target.display(), measured.as_secs_f64());
    assert!(!fs.is_mounted()?, "{} is still mounted after umount", target.display());
    if measured <= REAL_STALL {
        bail!(
            "umount of {DIRTY} dirty bytes took only {measured:?}: the {THROTTLE_BPS} B/s write throttle on {} ({}) did not take",
            fs.device().display(),
            fs.dev()
        );
    }

    let resolved = format!("#{id} resolved");
    let after = term.wait_screen(GONE_WITHIN, &format!("incident #{id} moved to the resolved ones"), |s| {
        root_row(s, &target).is_none() && s.contains(&resolved) && s.contains("no incidents: watching")
    })?;
    eprintln!("live view after the umount:\n{after}");
    assert!(after.lines().next().unwrap_or_default().contains("incidents: 0 open, 1 resolved"), "{after}");
    let footer = after.lines().find(|l| l.contains(&resolved)).unwrap_or_default();
    assert!(footer.contains(&format!("root was umount2 {}", target.display())), "the footer line: {footer:?}");

    // Ctrl-C, typed: the tty sends SIGINT, plegwatch stops and gives the terminal back.
    // The summary shows at once, before plegwatch has detached its programs and exited.
    term.send_keys("C-c")?;
    let sent = Instant::now();
    let summary = term.wait_screen(STOP_TIMEOUT, "the summary, after Ctrl-C", |s| s.contains("summary: ran"))?;
    eprintln!("summary on the terminal {:.2}s after Ctrl-C", sent.elapsed().as_secs_f64());
    assert!(!summary.contains("Ctrl-C to stop"), "the live view is still on screen with the summary:\n{summary}");
    assert!(summary.contains("incidents: 1 raised, 1 resolved"), "the summary's incident counts:\n{summary}");
    let exit = term.wait_exit(EXIT_TIMEOUT)?;
    eprintln!("plegwatch exited {:.2}s after Ctrl-C ({exit:?}); the terminal:\n{}", sent.elapsed().as_secs_f64(), term.history()?);
    assert_eq!(exit, Exit::Code(0), "plegwatch's exit after Ctrl-C");
    // The live view is gone from the screen, and the summary follows its last frame (the
    // summary may be taller than the screen: its head is then in the scrollback).
    let visible = term.screen()?;
    assert!(!visible.contains("Ctrl-C to stop"), "the terminal after exit:\n{visible}");
    let history = term.history()?;
    let last_frame = history.rfind("Ctrl-C to stop").unwrap_or(0);
    assert!(history[last_frame..].contains("summary: ran"), "no summary after the live view's last frame:\n{history}");
    Ok(())
}

#[test]
fn screen_rows_are_read_as_the_view_draws_them() {
    let screen = " plegwatch (pid 1) · 9 probes ready · incidents: 1 open, 0 resolved\n\n #12 WARN     waited 2.3s\n   ROOT  1. umount              2.3s                               umount2 /tmp/x/mnt (task_work after the syscall returned)  [live-umount pid=5 tid=6]\n";
    let (row, _) = root_row(screen, Path::new("/tmp/x/mnt")).expect("the root row");
    assert_eq!(row, 3);
    assert_eq!(incident_above(screen, row), Some(12));
    assert!(root_row(screen, Path::new("/tmp/y")).is_none());
}
