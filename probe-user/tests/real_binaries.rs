//! Unit tests (no root) over every real Go binary plegwatch is meant for:
//! the release-style builds in `/work/shared/bin` (containerd 1.7.34 and
//! 2.3.4, their shims, runc 1.4.3, CRI-O 1.35.6, node-problem-detector) and Debian's
//! containerd 1.6.20, its shim and runc 1.1.5. For each: the pclntab parses,
//! the Go version is read, every expected function of its target resolves
//! (none left out), each entry is the function's first byte, every RET is a
//! `C3` at an instruction boundary (cross-checked with GNU `objdump -d`), and
//! `g`'s TLS offset is found.
//!
//! Under `CI` a missing binary or a missing `objdump` fails the test, naming
//! it; elsewhere the test prints why and moves on to the next binary.

use std::collections::BTreeSet;
use std::process::Command;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use plegwatch::observe::go_binary;
use plegwatch::proto::gosym::{g_tls_offset, ret_addresses_in, GoFunc, GoSymError, GoSymbols, ProbePoints};
use plegwatch::sources::gowatch::{attach, targets};

const SHARED: &str = "/work/shared/bin";

/// One binary and what it must hold.
struct Case {
    path: String,
    /// Its plegwatch target, if any.
    target: Option<&'static str>,
    go: &'static str,
    /// More functions that must resolve, with their probe points checked.
    extra: &'static [&'static str],
}

fn cases() -> Vec<Case> {
    let shared = |f: &str| format!("{SHARED}/{f}");
    let c = |path: String, target, go, extra| Case { path, target, go, extra };
    vec![
        c(shared("containerd-1.7.34"), Some("containerd"), "go1.25.", &["runtime.main", "main.main"]),
        c(shared("containerd-2.3.4"), Some("containerd"), "go1.26.", &["runtime.main", "main.main"]),
        c(shared("containerd-shim-runc-v2-1.7.34"), Some("containerd-shim"), "go1.25.", &["runtime.main"]),
        c(shared("containerd-shim-runc-v2-2.3.4"), Some("containerd-shim"), "go1.26.", &["runtime.main"]),
        c(shared("runc-1.4.3"), Some("runc"), "go1.26.", &["runtime.main", "main.main"]),
        c(shared("crio-1.35.6"), Some("crio"), "go1.25.", &["runtime.main", "main.main"]),
        c(
            shared("node-problem-detector"),
            None,
            "go1.26.",
            &["runtime.main", "main.main", "k8s.io/node-problem-detector/pkg/problemdetector.(*problemDetector).Run"],
        ),
        c("/usr/bin/containerd".into(), Some("containerd"), "go1.19.", &["runtime.main"]),
        c("/usr/bin/containerd-shim-runc-v2".into(), Some("containerd-shim"), "go1.19.", &["runtime.main"]),
        c("/usr/sbin/runc".into(), Some("runc"), "go1.19.", &["runtime.main", "main.main"]),
    ]
}

/// Is `i` a Go amd64 prologue: the stack check `cmp rsp, [r14+0x10]`
/// (`lea r12, [rsp-N]` or `mov r12, rsp` first for big frames), or a frame
/// setup for NOSPLIT functions?
fn is_go_prologue(i: &Instruction) -> bool {
    let r14_0x10 = |k: u32| i.op_kind(k) == OpKind::Memory && i.memory_base() == Register::R14 && i.memory_displacement64() == 0x10;
    match i.mnemonic() {
        Mnemonic::Cmp => i.op0_kind() == OpKind::Register && r14_0x10(1),
        Mnemonic::Lea => i.op0_register() == Register::R12 && i.memory_base() == Register::RSP,
        Mnemonic::Mov => i.op0_register() == Register::R12 && i.op1_register() == Register::RSP,
        Mnemonic::Sub | Mnemonic::Add => i.op0_register() == Register::RSP,
        Mnemonic::Push => i.op0_register() == Register::RBP,
        _ => false,
    }
}

/// The linear decode of `f` ends exactly at `f.end`.
fn decodes_to_end(data: &[u8], syms: &GoSymbols, f: &GoFunc) -> bool {
    let Some(bytes) = syms.elf().read_va(data, f.entry, f.end - f.entry) else { return false };
    let mut d = Decoder::with_ip(64, bytes, f.entry, DecoderOptions::NONE);
    let mut last = f.entry;
    while d.can_decode() {
        let i = d.decode();
        if i.is_invalid() {
            return false;
        }
        last = i.next_ip();
    }
    last == f.end
}

/// The entry is the function's first byte: INT3 padding or the previous
/// function's last instruction before it, a Go prologue first, and a clean
/// decode to the end; the probe points agree.
fn check_function(data: &[u8], syms: &GoSymbols, name: &str) -> ProbePoints {
    let f = syms.lookup(name).unwrap_or_else(|| panic!("{name} not found"));
    assert!(f.entry < f.end && syms.elf().is_executable(f.entry), "{name}: {f:?}");
    let off = syms.elf().file_offset(f.entry).unwrap() as usize;
    let mut d = Decoder::with_ip(64, &data[off..(off + 16).min(data.len())], f.entry, DecoderOptions::NONE);
    let first = d.decode();
    assert!(is_go_prologue(&first), "{name}: first instruction {:?} at {:#x} is no Go prologue", first.mnemonic(), f.entry);
    let prev = syms.function_at(f.entry - 1).unwrap();
    assert_eq!(prev.end, f.entry);
    assert!(data[off - 1] == 0xcc || decodes_to_end(data, syms, &prev), "{name}: byte before entry {:#x}", data[off - 1]);
    assert!(decodes_to_end(data, syms, &f), "{name}");
    let pts = syms.probe_points(data, name).unwrap();
    assert_eq!(pts.entry_offset, off as u64);
    assert!(!pts.ret_offsets.is_empty(), "{name} has no RET");
    assert!(pts.ret_offsets.windows(2).all(|w| w[0] < w[1]));
    pts
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// The binary's bytes; `None` (printed) when it is missing outside CI.
fn read_required(path: &str) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(d) => Some(d),
        Err(e) if in_ci() => panic!("{path}: required under CI, not readable: {e}"),
        Err(e) => {
            println!("SKIP {path}: not readable ({e}); under CI this fails");
            None
        }
    }
}

/// Whether GNU objdump is here; under CI it must be.
fn have_objdump() -> bool {
    let ok = Command::new("objdump").arg("--version").output().is_ok_and(|o| o.status.success());
    assert!(ok || !in_ci(), "objdump (binutils) is required under CI to cross-check RET offsets");
    if !ok {
        println!("SKIP objdump cross-checks: objdump not installed; under CI this fails");
    }
    ok
}

/// Instruction starts in `[start, end)` per `objdump -d`, and which are RETs.
fn objdump_insns(path: &str, start: u64, end: u64) -> (BTreeSet<u64>, BTreeSet<u64>) {
    let out = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "--wide"])
        .arg(format!("--start-address={start:#x}"))
        .arg(format!("--stop-address={end:#x}"))
        .arg(path)
        .output()
        .expect("run objdump");
    assert!(out.status.success(), "objdump {path}: {}", String::from_utf8_lossy(&out.stderr));
    let mut starts = BTreeSet::new();
    let mut rets = BTreeSet::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        // "  12ae2be:\tlea    0x170(%rsp),%rcx"
        let Some((addr, rest)) = line.trim_start().split_once(":\t") else { continue };
        let Ok(a) = u64::from_str_radix(addr, 16) else { continue };
        starts.insert(a);
        if rest.split_whitespace().next() == Some("ret") {
            rets.insert(a);
        }
    }
    (starts, rets)
}

/// Checks one function: resolves, entry is its first byte (INT3 padding or
/// the previous function's last instruction before it, and a Go prologue
/// or frame setup first), RETs are `C3`s; with objdump, the RETs are
/// exactly objdump's, all at instruction starts. Returns the RET count.
fn check(path: &str, data: &[u8], syms: &GoSymbols, name: &str, objdump: bool) -> usize {
    let pts = check_function(data, syms, name);
    let f = syms.require(name).unwrap();
    for &r in &pts.ret_offsets {
        assert_eq!(data[r as usize], 0xc3, "{path}: {name}: RET at file offset {r:#x}");
    }
    if objdump {
        let (starts, rets) = objdump_insns(path, f.entry, f.end);
        assert_eq!(starts.first(), Some(&f.entry), "{path}: {name}: objdump starts elsewhere");
        let ours: BTreeSet<u64> = ret_addresses_in(syms.elf(), data, &f).unwrap().into_iter().collect();
        assert!(ours.is_subset(&starts), "{path}: {name}: a RET not at an objdump instruction start");
        assert_eq!(ours, rets, "{path}: {name}: RETs differ from objdump's");
    }
    pts.ret_offsets.len()
}

#[test]
fn real_binaries_parse_resolve_and_decode() {
    let objdump = have_objdump();
    let mut checked = 0;
    for case in cases() {
        let Some(data) = read_required(&case.path) else { continue };
        let path = case.path.as_str();
        let parse = std::time::Instant::now();
        let syms = GoSymbols::from_elf_named(&data, path).unwrap_or_else(|e| panic!("{e}"));
        let parse_ms = parse.elapsed().as_secs_f64() * 1e3;
        let v = syms.version().unwrap_or_else(|| panic!("{path}: no Go version"));
        assert!(v.starts_with(case.go), "{path}: {v}, expected {}*", case.go);
        // runtime.text is a function start (Go 1.26 writes textStart 0: the
        // moduledata gives it; a wrong base shifts every entry).
        let text = syms.pclntab().text_start();
        assert_eq!(syms.function_at(text).map(|f| f.entry), Some(text), "{path}: textStart {text:#x}");
        let mut funcs = 0;
        let mut rets = 0;
        if let Some(name) = case.target {
            let target = targets::target_named(name).unwrap();
            let i = attach::inspect(std::path::Path::new(path), target).unwrap();
            assert!(i.missing.is_empty(), "{path}: left out: {:?}", i.missing);
            assert!(i.found.len() >= target.groups.iter().filter(|g| !g.optional).count(), "{path}");
            for (spec, p) in &i.found {
                rets += check(path, &data, &syms, spec.symbol, objdump);
                funcs += 1;
                let f = syms.require(spec.symbol).unwrap();
                assert_eq!(p.entry_offset, syms.elf().file_offset(f.entry).unwrap(), "{path}: {}", spec.symbol);
                // And back, as the user-stack symbolizer maps a sampled address.
                assert_eq!(syms.va_of_file_offset(p.entry_offset), Some(f.entry), "{path}: {}", spec.symbol);
                // An argument declared for this function is captured, at the
                // offset its getter shows.
                let declared = target.groups.iter().flat_map(|g| g.funcs).find(|s| s.symbol == spec.symbol).and_then(|s| s.arg);
                if let Some(a) = declared {
                    let got = spec.arg.unwrap_or_else(|| panic!("{path}: {}: argument not resolved", spec.symbol));
                    assert_eq!(got.reg, a.reg);
                    assert!(matches!(got.off, 0 | 8 | 40), "{path}: {}: field at {}", spec.symbol, got.off);
                }
            }
            assert!(i.goexit.is_some(), "{path}: runtime.goexit0");
        }
        for name in case.extra {
            rets += check(path, &data, &syms, name, objdump);
            funcs += 1;
        }
        let tls = g_tls_offset(&syms, &data).unwrap_or_else(|e| panic!("{e}"));
        assert!(tls.offset < 0 && tls.offset % 8 == 0, "{path}: {tls:?}");
        println!(
            "{path}: {v}, {} functions (parsed in {parse_ms:.1} ms), textStart {text:#x}; {funcs} checked, {rets} RETs; g at fsbase{:+}",
            syms.len(),
            tls.offset
        );
        checked += 1;
    }
    assert!(checked > 0 || !in_ci());
}

/// Across each whole binary, every function decodes; only the
/// BoringCrypto/StandardCrypto marker (assembly that jumps over a byte
/// signature) may be refused. Before runtime.text came from the moduledata,
/// half of containerd 2.3.4's and runc 1.4.3's functions were refused.
#[test]
fn real_binaries_every_function_decodes() {
    for case in cases() {
        let Some(data) = read_required(&case.path) else { continue };
        let syms = GoSymbols::from_elf_named(&data, &case.path).unwrap();
        let mut rets = 0usize;
        let mut refused = Vec::new();
        for f in syms.functions() {
            match ret_addresses_in(syms.elf(), &data, &f) {
                Ok(r) => rets += r.len(),
                Err(e) => refused.push(e.to_string()),
            }
        }
        println!("{}: {} functions, {rets} RETs, {} refused", case.path, syms.len(), refused.len());
        assert!(refused.len() <= 1 && refused.iter().all(|e| e.contains("crypto/internal/boring/sig.")), "{}: {refused:#?}", case.path);
        assert!(rets > syms.len() / 2, "{}", case.path);
    }
}

/// Field offsets read from getters: cri-api gogo (1.7.34: 0), protoc-gen-go
/// < 1.36 (containerd's own API from 1.7: 40), >= 1.36 (cri-api v0.36 in
/// 2.3.4: 8).
#[test]
fn getter_offsets() {
    let cri = "k8s.io/cri-api/pkg/apis/runtime/v1.(*UpdateContainerResourcesRequest).GetContainerId";
    let exit = "github.com/containerd/containerd/api/events.(*TaskExit).GetContainerID";
    for (bin, getter, want) in [
        ("containerd-1.7.34", cri, 0),
        ("containerd-2.3.4", cri, 8),
        ("containerd-1.7.34", exit, 40),
        ("containerd-2.3.4", exit, 40),
        ("containerd-shim-runc-v2-1.7.34", "github.com/containerd/containerd/api/runtime/task/v2.(*UpdateTaskRequest).GetID", 40),
        ("containerd-shim-runc-v2-2.3.4", "github.com/containerd/containerd/api/runtime/task/v3.(*UpdateTaskRequest).GetID", 40),
    ] {
        let path = format!("{SHARED}/{bin}");
        if read_required(&path).is_none() {
            continue;
        }
        let b = go_binary::read(&path).unwrap();
        assert_eq!(b.string_getter_offset(getter).unwrap(), want, "{bin}: {getter}");
        assert!(matches!(b.string_getter_offset("runtime.main"), Err(GoSymError::NotAGetter { .. })));
    }
}

/// A lock's place in its struct, read from a method that read-locks it: CRI-O
/// 1.35.6's `opLock` at 0xd0 in `oci.Container` (as its disassembly shows: `State`
/// does `lock xadd [rax+0xe0]`, the reader count 16 bytes into the lock), and the
/// sandbox's `stateMutex` at 0x1a0 (`Ready`). A function with no RLock says so.
#[test]
fn rlock_field_offsets() {
    let path = format!("{SHARED}/crio-1.35.6");
    if read_required(&path).is_none() {
        return;
    }
    let b = go_binary::read(&path).unwrap();
    assert_eq!(b.rlock_field_offset("github.com/cri-o/cri-o/internal/oci.(*Container).State").unwrap(), 0xd0);
    assert_eq!(b.rlock_field_offset("github.com/cri-o/cri-o/internal/lib/sandbox.(*Sandbox).Ready").unwrap(), 0x1a0);
    assert!(matches!(b.rlock_field_offset("runtime.main"), Err(GoSymError::NoRLock { .. })));
    // The lock holders' receivers point there.
    let t = targets::target_named("crio").unwrap();
    let i = attach::inspect(std::path::Path::new(&path), t).unwrap();
    let holders: Vec<_> = i.found.iter().filter(|(s, _)| s.role == targets::Role::LockHold).collect();
    let (nri, op): (Vec<_>, Vec<_>) = holders.into_iter().partition(|(s, _)| s.symbol.contains("/internal/nri.(*local)."));
    assert_eq!(op.len(), 5, "{:?}", i.found.iter().map(|(s, _)| s.symbol).collect::<Vec<_>>());
    assert!(op.iter().all(|(s, _)| s.recv.is_some_and(|r| (r.reg, r.off) == (3, 0xd0))), "{op:?}");
    // The NRI lock: `internal/nri.local` embeds its sync.Mutex first; RAX = l.
    assert_eq!(nri.len(), 14, "{nri:?}");
    assert!(nri.iter().all(|(s, _)| s.recv.is_some_and(|r| (r.reg, r.off) == (0, 0) && r.is_mutex())), "{nri:?}");
}

/// A `sync.Mutex`'s place in its struct, read from a method that locks it: CRI-O
/// 1.35.6's NRI lock at 0 in `nri.local` (`syncPlugin` copies l to RDX, zeroes EAX and
/// does `lock cmpxchg [rdx], r10d`). A function that locks nothing, or calls out before
/// it locks, says so.
#[test]
fn lock_field_offsets() {
    let path = format!("{SHARED}/crio-1.35.6");
    if read_required(&path).is_none() {
        return;
    }
    let b = go_binary::read(&path).unwrap();
    assert_eq!(b.lock_field_offset("github.com/cri-o/cri-o/internal/nri.(*local).syncPlugin").unwrap(), 0);
    // The event methods call `IsEnabled` before they lock: the search stops at a call.
    assert!(matches!(b.lock_field_offset("github.com/cri-o/cri-o/internal/nri.(*local).StartContainer"), Err(GoSymError::NoLock { .. })));
    assert!(matches!(b.lock_field_offset("runtime.main"), Err(GoSymError::NoLock { .. })));
}
