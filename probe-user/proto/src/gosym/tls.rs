//! Where a Go binary keeps the current goroutine (`g`) in thread-local
//! storage, as an offset from the thread pointer (x86-64: `fsbase`).
//!
//! At a Go function's entry or RET, R14 holds `g` (register ABI). A kernel
//! probe (a syscall tracepoint, `sched_switch`) fires with user registers
//! that may hold anything, so there `g` is read from TLS: `*(fsbase + off)`.
//!
//! - Internally linked binaries use `-8` (the Go linker puts `runtime.tlsg`
//!   in the last slot below the thread pointer).
//! - cgo or externally linked ones (Debian's containerd, its shim, runc)
//!   place `runtime.tlsg` in the binary's PT_TLS block. The system linker
//!   either relaxes the access to a constant (`mov r, fs:[-8]`: local-exec)
//!   or leaves a GOT slot holding the offset (initial-exec:
//!   `mov r, [rip+got]; mov r, fs:[r]`), filled from an `R_X86_64_TPOFF64`
//!   relocation at load time.
//!
//! Rather than trusting a constant or a data symbol stripped binaries lack
//! (`runtime.tlsg` is not in `.gopclntab`), this reads the offset from the
//! code that loads `g`: `runtime.stackcheck` (asm_amd64.s) begins with that
//! load in every Go release with the register ABI. Checked on Debian's
//! containerd 1.6.20, containerd-shim-runc-v2 and runc 1.1.5 (Go 1.19.8,
//! externally linked, local-exec: −8) and on Go 1.19 test builds (static,
//! internally linked PIE, externally linked PIE).

use iced_x86::{Decoder, DecoderOptions, Instruction, OpKind, Register};
use object::elf::{EM_X86_64, R_X86_64_TPOFF64};

use super::elf::Elf;
use super::{GoSymError, GoSymbols};

/// How the offset was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TlsSource {
    /// A constant displacement off FS in the code (local-exec).
    LocalExec,
    /// A GOT slot the code loads first (initial-exec), read from the file or
    /// its `R_X86_64_TPOFF64` relocation.
    InitialExec,
}

/// `g`'s slot: `fsbase + offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GTls {
    pub offset: i64,
    pub source: TlsSource,
}

/// The functions whose first instructions load `g` from TLS, in the order tried.
const LOADS_G: &[&str] = &["runtime.stackcheck", "runtime.load_g"];

/// How many instructions from a function's entry are searched.
const SEARCH: usize = 8;

/// Finds `g`'s TLS offset in an x86-64 Go binary.
pub fn g_tls_offset(syms: &GoSymbols, data: &[u8]) -> Result<GTls, GoSymError> {
    let elf = syms.elf();
    let unsupported = || GoSymError::NoGTls { binary: elf.binary().to_string() };
    if elf.machine() != EM_X86_64 {
        return Err(GoSymError::UnsupportedArch { binary: elf.binary().to_string(), machine: elf.machine() });
    }
    for name in LOADS_G {
        let Some(f) = syms.lookup(name) else { continue };
        let len = f.end.saturating_sub(f.entry).min(64);
        let Some(bytes) = elf.read_va(data, f.entry, len) else { continue };
        if let Some(found) = from_code(elf, data, bytes, f.entry) {
            return Ok(found);
        }
    }
    Err(unsupported())
}

/// Reads the offset from the first [`SEARCH`] instructions at `ip`.
fn from_code(elf: &Elf, data: &[u8], bytes: &[u8], ip: u64) -> Option<GTls> {
    let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    // What registers were loaded with so far.
    let mut loads: Vec<(Register, Loaded)> = Vec::new();
    let mut instr = Instruction::default();
    for _ in 0..SEARCH {
        if !decoder.can_decode() {
            break;
        }
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return None;
        }
        if instr.op_count() == 2 && instr.op0_kind() == OpKind::Register {
            if let Some(v) = immediate(&instr) {
                loads.push((instr.op0_register(), Loaded::Imm(v)));
                continue;
            }
        }
        if !(0..instr.op_count()).any(|i| instr.op_kind(i) == OpKind::Memory) {
            continue;
        }
        if instr.segment_prefix() == Register::FS {
            let base = instr.memory_base();
            if base == Register::None && instr.memory_index() == Register::None {
                return Some(GTls { offset: instr.memory_displacement64() as i64, source: TlsSource::LocalExec });
            }
            let disp = instr.memory_displacement64() as i64;
            return match loads.iter().rev().find(|(r, _)| *r == base).map(|(_, l)| *l)? {
                Loaded::Imm(v) => Some(GTls { offset: v.wrapping_add(disp), source: TlsSource::LocalExec }),
                Loaded::Slot(slot) => {
                    got_slot_value(elf, data, slot).map(|v| GTls { offset: v.wrapping_add(disp), source: TlsSource::InitialExec })
                }
            };
        }
        if instr.is_ip_rel_memory_operand() && instr.op0_kind() == OpKind::Register {
            loads.push((instr.op0_register(), Loaded::Slot(instr.ip_rel_memory_address())));
        }
    }
    None
}

/// A register's known content.
#[derive(Clone, Copy)]
enum Loaded {
    /// A constant (`mov rcx, -8`: local-exec after linker relaxation).
    Imm(i64),
    /// The word at a RIP-relative address (a GOT slot: initial-exec).
    Slot(u64),
}

/// The signed immediate of `mov reg, imm`.
fn immediate(instr: &Instruction) -> Option<i64> {
    if instr.mnemonic() != iced_x86::Mnemonic::Mov {
        return None;
    }
    match instr.op1_kind() {
        OpKind::Immediate32to64 | OpKind::Immediate64 | OpKind::Immediate32 => Some(instr.immediate(1) as i64),
        _ => None,
    }
}

/// The TP offset an initial-exec GOT slot holds at run time: its
/// `R_X86_64_TPOFF64` relocation's addend against the executable's TLS block
/// (variant II: the block ends at the thread pointer, so an offset `o` into
/// it is `o - round_up(p_memsz, p_align)`), or, with no relocation, the word
/// the static linker wrote.
fn got_slot_value(elf: &Elf, data: &[u8], slot: u64) -> Option<i64> {
    if let Some(addend) = elf.reloc_addend(data, slot, R_X86_64_TPOFF64) {
        let (_, memsz, align) = elf.tls_segment()?;
        let align = align.max(1);
        let block = memsz.div_ceil(align).checked_mul(align)?;
        return Some(addend as i64 - block as i64);
    }
    let word = elf.read_word(data, slot, 8)? as i64;
    (word < 0).then_some(word)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `mov rcx, fs:[-8]; cmp rsp, [rcx+16]`.
    const LOCAL_EXEC: &[u8] = &[0x64, 0x48, 0x8b, 0x0c, 0x25, 0xf8, 0xff, 0xff, 0xff, 0x48, 0x3b, 0x61, 0x10];

    fn empty_elf() -> (Elf, Vec<u8>) {
        let data = crate::gosym::synth::build(&crate::gosym::synth::spec(
            crate::gosym::synth::Layout::Go118,
            crate::gosym::synth::Placement::Section,
        ))
        .bytes;
        (Elf::parse(&data, "synthetic").expect("synthetic ELF parses"), data)
    }

    #[test]
    fn local_exec_constant() {
        let (elf, data) = empty_elf();
        assert_eq!(from_code(&elf, &data, LOCAL_EXEC, 0x1000), Some(GTls { offset: -8, source: TlsSource::LocalExec }));
    }

    #[test]
    fn relaxed_constant_in_a_register() {
        let (elf, data) = empty_elf();
        // mov rcx, -8; mov rax, fs:[rcx]  (Go 1.19 PIE, internal or external linking)
        let code = [0x48, 0xc7, 0xc1, 0xf8, 0xff, 0xff, 0xff, 0x64, 0x48, 0x8b, 0x01];
        assert_eq!(from_code(&elf, &data, &code, 0x1000), Some(GTls { offset: -8, source: TlsSource::LocalExec }));
    }

    #[test]
    fn no_fs_load_is_none() {
        let (elf, data) = empty_elf();
        // cmp rsp, [rcx+16]; ret
        assert_eq!(from_code(&elf, &data, &[0x48, 0x3b, 0x61, 0x10, 0xc3], 0x1000), None);
        assert_eq!(from_code(&elf, &data, &[], 0x1000), None);
        // An FS access through a register loaded from nowhere we know.
        assert_eq!(from_code(&elf, &data, &[0x64, 0x48, 0x8b, 0x09], 0x1000), None);
    }
}
