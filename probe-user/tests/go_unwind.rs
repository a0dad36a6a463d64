//! Unit tests (no root) of the pcsp tables and the unwinder over every real Go
//! binary plegwatch is meant for (the list of `real_binaries.rs`): Debian's Go
//! 1.19 containerd, shim and runc, and the `/work/shared/bin` builds on Go
//! 1.25 and 1.26.
//!
//! - Every function's pcsp table decodes to its end marker, starts at the
//!   entry with 0, and ends inside the function.
//! - Each function's prologue, decoded with iced-x86, agrees with pcsp at every
//!   instruction: `push` adds 8, `sub rsp, N` adds N (so after Go 1.21's
//!   `push rbp; mov rbp, rsp; sub rsp, N` pcsp is N+8; after Go 1.19's
//!   `sub rsp, N; mov [rsp+N-8], rbp; lea rbp, [rsp+N-8]` it is N).
//! - A synthetic stack built from the binary's own frame sizes and CALL return
//!   addresses unwinds to the functions it was built from, at bias 0 and as a
//!   PIE, by pcsp and by frame pointers.
//!
//! Under `CI` a missing binary fails the test, naming it.

use std::collections::HashMap;

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use plegwatch::observe::go_binary;
use plegwatch::proto::gosym::{unwind, unwind_frame_pointers, GoBinary, GoFunc, GoSymbols, ReadMem, Regs, Stop};

fn binaries() -> Vec<String> {
    let shared = ["containerd-1.7.34", "containerd-2.3.4", "containerd-shim-runc-v2-1.7.34", "containerd-shim-runc-v2-2.3.4", "runc-1.4.3"];
    let mut v: Vec<String> = shared.iter().map(|f| format!("/work/shared/bin/{f}")).collect();
    v.extend(["/usr/bin/containerd", "/usr/bin/containerd-shim-runc-v2", "/usr/sbin/runc"].map(String::from));
    v
}

fn open(path: &str) -> Option<GoBinary> {
    match go_binary::read(path) {
        Ok(b) => Some(b),
        Err(e) if std::env::var_os("CI").is_some() => panic!("{path}: required under CI: {e}"),
        Err(e) => {
            println!("SKIP {path}: {e}; under CI this fails");
            None
        }
    }
}

/// How `i` moves SP down (bytes pushed or reserved), if it is an instruction
/// of a Go prologue; `None` ends the prologue.
fn prologue_step(i: &Instruction) -> Option<i64> {
    let r14_0x10 = || i.op1_kind() == OpKind::Memory && i.memory_base() == Register::R14 && i.memory_displacement64() == 0x10;
    match i.mnemonic() {
        // The stack check and its branch to morestack.
        Mnemonic::Cmp if r14_0x10() => Some(0),
        Mnemonic::Jbe | Mnemonic::Jb | Mnemonic::Jae | Mnemonic::Ja => Some(0),
        Mnemonic::Lea if i.op0_register() == Register::R12 && i.memory_base() == Register::RSP => Some(0),
        Mnemonic::Mov if i.op0_register() == Register::R12 && i.op1_register() == Register::RSP => Some(0),
        // The frame.
        Mnemonic::Push if i.op0_kind() == OpKind::Register => Some(8),
        Mnemonic::Mov if i.op0_register() == Register::RBP && i.op1_register() == Register::RSP => Some(0),
        Mnemonic::Mov if i.op0_kind() == OpKind::Memory && i.memory_base() == Register::RSP && i.op1_register() == Register::RBP => Some(0),
        Mnemonic::Lea if i.op0_register() == Register::RBP && i.memory_base() == Register::RSP => Some(0),
        Mnemonic::Sub if i.op0_register() == Register::RSP && is_imm(i) => Some(i.immediate(1) as i64),
        Mnemonic::Add if i.op0_register() == Register::RSP && is_imm(i) => Some(-(i.immediate(1) as i64)),
        _ => None,
    }
}

fn is_imm(i: &Instruction) -> bool {
    matches!(i.op1_kind(), OpKind::Immediate8to64 | OpKind::Immediate32to64 | OpKind::Immediate8 | OpKind::Immediate32)
}

/// The function's first instructions, decoded.
fn head(data: &[u8], syms: &GoSymbols, f: &GoFunc, n: usize) -> Vec<Instruction> {
    let len = (f.end - f.entry).min(256);
    let Some(bytes) = syms.elf().read_va(data, f.entry, len) else { return Vec::new() };
    let mut d = Decoder::with_ip(64, bytes, f.entry, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() && out.len() < n {
        out.push(d.decode());
    }
    out
}

#[test]
fn pcsp_tables_decode_and_match_the_prologues() {
    for path in binaries() {
        let Some(bin) = open(&path) else { continue };
        let syms = bin.symbols();
        let (mut tables, mut framed, mut checked_points) = (0usize, 0usize, 0usize);
        let mut bad: Vec<String> = Vec::new();
        let mut popped: Vec<String> = Vec::new();
        for f in syms.functions() {
            let runs = match syms.pcsp_runs(f.entry) {
                Ok(r) => r,
                Err(e) => {
                    bad.push(format!("{}: {e}", f.name));
                    continue;
                }
            };
            let Some(first) = runs.first() else { continue };
            tables += 1;
            let last = runs.last().map_or(first.end, |r| r.end);
            if first.start != f.entry || syms.frame_size_at(f.entry) != Some(0) {
                bad.push(format!("{}: pcsp at entry {:?}", f.name, syms.frame_size_at(f.entry)));
            }
            if last <= f.entry || last > f.end {
                bad.push(format!("{}: pcsp runs {:#x}..{last:#x} outside {:#x}..{:#x}", f.name, first.start, f.entry, f.end));
            }
            // Only hand-written assembly that pops its own return address
            // (syscall.rawVforkSyscall: POPQ before vfork) goes below 0, by 8.
            if runs.iter().any(|r| r.value < 0) {
                popped.push(f.name.clone());
                if runs.iter().any(|r| r.value < -8) {
                    bad.push(format!("{}: pcsp below -8", f.name));
                }
            }
            // The prologue, instruction by instruction.
            let mut delta = 0i64;
            for i in head(bin.data(), syms, &f, 12) {
                let Some(step) = prologue_step(&i) else { break };
                let at = syms.frame_size_at(i.ip());
                if at != Some(delta as u64) {
                    bad.push(format!("{}: at {:#x} ({:?}) pcsp {at:?}, prologue says {delta}", f.name, i.ip(), i.mnemonic()));
                    break;
                }
                checked_points += 1;
                delta += step;
                if i.next_ip() >= last {
                    break;
                }
            }
            if delta > 0 {
                // The first instruction of the body.
                let body = head(bin.data(), syms, &f, 12).into_iter().find(|i| prologue_step(i).is_none());
                if let Some(b) = body {
                    let at = syms.frame_size_at(b.ip());
                    if at != Some(delta as u64) {
                        bad.push(format!("{}: body at {:#x} pcsp {at:?}, prologue set up {delta}", f.name, b.ip()));
                    }
                    framed += 1;
                }
            }
        }
        println!(
            "{path}: {} functions, {tables} pcsp tables, {framed} framed bodies, {checked_points} prologue points checked, pctab {} KiB, {} mismatches",
            syms.len(),
            syms.pclntab().pctab_len() / 1024,
            bad.len()
        );
        println!("  pcsp below 0 (return address popped) in: {popped:?}");
        assert!(popped.iter().all(|n| n.ends_with("rawVforkSyscall")), "{path}: negative pcsp in {popped:?}");
        for b in bad.iter().take(10) {
            println!("  {b}");
        }
        assert!(bad.is_empty(), "{path}: {} pcsp mismatches (first: {:?})", bad.len(), bad.first());
        assert!(tables * 10 >= syms.len() * 9, "{path}: only {tables} of {} functions have a pcsp table", syms.len());
        assert!(framed * 2 >= tables, "{path}: only {framed} of {tables} functions set up a frame");
        // A known function: runtime.main sets up a frame, by either prologue.
        let main = syms.lookup("runtime.main").expect("runtime.main");
        let body = head(bin.data(), syms, &main, 12).into_iter().find(|i| prologue_step(i).is_none()).expect("a body");
        let size = syms.frame_size_at(body.ip()).expect("runtime.main's frame");
        assert!(size >= 16 && size % 8 == 0, "{path}: runtime.main's frame {size}");
    }
}

/// A synthetic stack: words at addresses.
#[derive(Default)]
struct Stack(HashMap<u64, u64>);

impl ReadMem for Stack {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        if buf.len() != 8 {
            return false;
        }
        match self.0.get(&addr) {
            Some(w) => {
                buf.copy_from_slice(&w.to_le_bytes());
                true
            }
            None => false,
        }
    }
}

/// The return address of the first CALL in `f` (the instruction after it).
fn first_call(data: &[u8], syms: &GoSymbols, f: &GoFunc) -> u64 {
    let bytes = syms.elf().read_va(data, f.entry, f.end - f.entry).expect("code");
    let mut d = Decoder::with_ip(64, bytes, f.entry, DecoderOptions::NONE);
    while d.can_decode() {
        let i = d.decode();
        if i.mnemonic() == Mnemonic::Call {
            return i.next_ip();
        }
    }
    panic!("{}: no CALL", f.name);
}

#[test]
fn synthetic_stacks_unwind_through_real_frames() {
    for path in binaries() {
        let Some(bin) = open(&path) else { continue };
        let syms = bin.symbols();
        let data = bin.data();
        let f = |n: &str| syms.lookup(n).unwrap_or_else(|| panic!("{path}: {n}"));
        // leaf (at its entry: frameless) <- gopark (body) <- runtime.main (a CALL) <- goexit.
        let leaf = f("runtime.nanotime1");
        let park = f("runtime.gopark");
        let main = f("runtime.main");
        let goexit = f("runtime.goexit");
        let park_ra = first_call(data, syms, &park);
        let main_ra = first_call(data, syms, &main);
        // goexit's return address, as the runtime plants it: goexit + 1 (PCQuantum).
        let goexit_ra = goexit.entry + 1;
        for bias in [0u64, 0x5555_0000_0000] {
            let mut mem = Stack::default();
            let sp0 = 0x00c0_0010_0000_u64;
            // Frame 0: the leaf at entry, [sp0] = return into gopark.
            assert_eq!(syms.frame_size_at(leaf.entry), Some(0));
            mem.0.insert(sp0, park_ra + bias);
            let sp1 = sp0 + 8;
            let d1 = syms.frame_size_at(park_ra - 1).expect("gopark's frame at its CALL");
            assert!(d1 > 0, "{path}: gopark frameless at its first CALL");
            mem.0.insert(sp1 + d1, main_ra + bias);
            let sp2 = sp1 + d1 + 8;
            let d2 = syms.frame_size_at(main_ra - 1).expect("runtime.main's frame at its CALL");
            mem.0.insert(sp2 + d2, goexit_ra + bias);
            // Frame pointers: gopark's BP slot is just below its return address,
            // runtime.main's likewise; runtime.main's saved BP is 0.
            let (bp1, bp2) = (sp1 + d1 - 8, sp2 + d2 - 8);
            mem.0.insert(bp1, bp2);
            mem.0.insert(bp2, 0);
            let regs = Regs { pc: leaf.entry + bias, sp: sp0, bp: bp1, return_address: false };
            let u = unwind(regs, &mem, syms, bias, 64);
            assert_eq!(
                u.names(),
                ["runtime.nanotime1", "runtime.gopark", "runtime.main", "runtime.goexit"],
                "{path} bias {bias:#x}: {:?}",
                u.stop
            );
            assert_eq!(u.stop, Stop::Outermost("runtime.goexit".into()));
            assert_eq!(u.frames[2].sp, sp2);
            // The frame-pointer walk skips the leaf's caller (the leaf kept gopark's BP).
            let fp = unwind_frame_pointers(regs, &mem, syms, bias, 64);
            assert_eq!(fp.names(), ["runtime.nanotime1", "runtime.main", "runtime.goexit"], "{path}: {:?}", fp.stop);
            // Bounds: max frames, an unknown return address, an unreadable slot.
            assert_eq!(unwind(regs, &mem, syms, bias, 2).stop, Stop::MaxFrames);
            // From a parked goroutine's saved PC (a return address into gopark)
            // and the SP its caller's CALL left.
            let parked = Regs { pc: park_ra + bias, sp: sp1, bp: 0, return_address: true };
            assert_eq!(unwind(parked, &mem, syms, bias, 64).names(), ["runtime.gopark", "runtime.main", "runtime.goexit"]);
            mem.0.insert(sp2 + d2, 0x10);
            assert_eq!(unwind(regs, &mem, syms, bias, 64).stop, Stop::UnknownPc(0x10));
            mem.0.insert(sp2 + d2, 0);
            assert_eq!(unwind(regs, &mem, syms, bias, 64).stop, Stop::Zero);
            mem.0.remove(&(sp2 + d2));
            assert_eq!(unwind(regs, &mem, syms, bias, 64).stop, Stop::Unreadable(sp2 + d2));
        }
        println!("{path}: synthetic stack unwound (bias 0 and PIE)");
    }
}
