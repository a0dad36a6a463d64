//! Where a stripped Go binary keeps its list of goroutines: the variables
//! `runtime.allgs` (a `[]*g`), `runtime.allglen` (a `uintptr`) and
//! `runtime.allgptr` (a `**g`), found from the code that writes them.
//!
//! Stripped binaries have no `.symtab`, and data symbols are not in the
//! pclntab, so the addresses are read from `runtime.allgadd` (proc.go), the
//! one function that appends a new `g`, which in every release since 1.16
//! does, under `allglock`:
//!
//! ```text
//! allgs = append(allgs, gp)                   // loads and stores allgs, allgs+8, allgs+16
//! if &allgs[0] != allgptr {
//!     atomicstorep(unsafe.Pointer(&allgptr), unsafe.Pointer(&allgs[0]))  // XCHG
//! }
//! atomic.Storeuintptr(&allglen, uintptr(len(allgs)))                     // XCHG
//! ```
//!
//! On x86-64 both atomic stores compile to `lea r1, [rip+var]; xchg r2, [r1]`
//! (or an `xchg` with a RIP-relative operand). So: `allgs` is the address
//! whose `+8` and `+16` are also accessed RIP-relative; `allglen` is the
//! target of the `xchg` whose value was loaded from `allgs+8` (the length);
//! `allgptr` the one whose value was loaded from `allgs` (the array).
//! Checked on Debian's Go 1.19.8 binaries (containerd, its shim, runc), Go
//! 1.25.5 and 1.26.6 release builds of containerd and runc, and builds with
//! Go 1.21–1.27 (against their symbol tables, in the unit tests).
//!
//! A reader that does not stop the process reads `allglen`, then `allgptr`,
//! then that many pointers, as `runtime.forEachGRace` does: `allgadd` stores
//! the array before the length, and arrays only grow, so the prefix is
//! consistent.

use iced_x86::{Decoder, DecoderOptions, Instruction, Mnemonic, OpKind, Register};
use object::elf::EM_X86_64;

use super::elf::PF_W;
use super::{GoSymError, GoSymbols};

/// The function whose code is read.
pub const ALLGADD: &str = "runtime.allgadd";

/// How many bytes of `runtime.allgadd` are decoded at most (it is ~400).
const MAX_CODE: u64 = 2048;

/// The link-time addresses (relative to the load base for a PIE) of the
/// goroutine list's variables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllGs {
    /// `runtime.allgs`: the slice header (array pointer, length, capacity).
    pub allgs: u64,
    /// `runtime.allglen`: the length, stored after the array.
    pub allglen: u64,
    /// `runtime.allgptr`: the array, stored before the length.
    pub allgptr: u64,
}

/// Errors from finding the variables.
#[derive(Debug, thiserror::Error)]
pub enum AllGsError {
    /// No `runtime.allgadd`, unreadable code, or an unsupported machine.
    #[error(transparent)]
    Symbols(#[from] GoSymError),
    /// The code did not show the expected accesses.
    #[error("{binary}: runtime.allgadd: {what} not recognised in its code")]
    NotRecognised { binary: String, what: &'static str },
    /// A found address is not in a writable segment of the file.
    #[error("{binary}: runtime.allgadd: {what} at {va:#x} is not in a writable PT_LOAD segment")]
    NotInData { binary: String, what: &'static str, va: u64 },
}

/// Finds `allgs`, `allglen` and `allgptr` in an x86-64 Go binary (`data`
/// are the bytes `syms` was parsed from).
pub fn find_allgs(syms: &GoSymbols, data: &[u8]) -> Result<AllGs, AllGsError> {
    let elf = syms.elf();
    let binary = elf.binary().to_string();
    if elf.machine() != EM_X86_64 {
        return Err(GoSymError::UnsupportedArch { binary, machine: elf.machine() }.into());
    }
    let f = syms.require(ALLGADD)?;
    let len = f.end.saturating_sub(f.entry).min(MAX_CODE);
    let bytes = elf.read_va(data, f.entry, len).ok_or_else(|| GoSymError::NotInFile {
        binary: binary.clone(),
        function: f.name.clone(),
        va: f.entry,
    })?;
    let found = from_code(bytes, f.entry).map_err(|what| AllGsError::NotRecognised { binary: binary.clone(), what })?;
    for (what, va, size) in [("allgs", found.allgs, 24), ("allglen", found.allglen, 8), ("allgptr", found.allgptr, 8)] {
        let writable = elf.load_segments().any(|s| s.flags & PF_W != 0 && va >= s.vaddr && va + size <= s.vaddr + s.memsz);
        if !writable {
            return Err(AllGsError::NotInData { binary, what, va });
        }
    }
    Ok(found)
}

/// What a register was last set to, as far as this matters.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Val {
    /// `lea r, [rip+X]`: the address X.
    Addr(u64),
    /// `mov r, [rip+X]`: the word at X.
    Word(u64),
}

/// Reads the addresses from `runtime.allgadd`'s code at `ip`. The error
/// says which variable was not recognised.
pub fn from_code(bytes: &[u8], ip: u64) -> Result<AllGs, &'static str> {
    let mut decoder = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let mut regs: Vec<(Register, Val)> = Vec::new();
    // Spill slots (`[rsp+d]`) and what they hold: values live across a
    // call are spilled and reloaded (Go's ABI saves no register).
    let mut slots: Vec<(u64, Val)> = Vec::new();
    let mut rip_rel: Vec<u64> = Vec::new();
    // (target, value stored)
    let mut xchgs: Vec<(u64, Option<Val>)> = Vec::new();
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            break;
        }
        if instr.is_ip_rel_memory_operand() {
            rip_rel.push(instr.ip_rel_memory_address());
        }
        if instr.mnemonic() == Mnemonic::Xchg && instr.op_count() == 2 {
            let reg = match (instr.op0_kind(), instr.op1_kind()) {
                (OpKind::Memory, OpKind::Register) => instr.op1_register(),
                (OpKind::Register, OpKind::Memory) => instr.op0_register(),
                _ => continue,
            };
            let target = if instr.is_ip_rel_memory_operand() {
                Some(instr.ip_rel_memory_address())
            } else if instr.memory_index() == Register::None && instr.memory_displacement64() == 0 {
                match lookup(&regs, instr.memory_base()) {
                    Some(Val::Addr(a)) => Some(a),
                    _ => None,
                }
            } else {
                None
            };
            if let Some(t) = target {
                xchgs.push((t, lookup(&regs, reg)));
            }
            set(&mut regs, reg, None);
            continue;
        }
        if let Some(slot) = stack_slot(&instr, 0) {
            // A spill: `mov [rsp+d], reg`.
            let v = (instr.mnemonic() == Mnemonic::Mov && instr.op1_kind() == OpKind::Register)
                .then(|| lookup(&regs, instr.op1_register()))
                .flatten();
            set_slot(&mut slots, slot, v);
            continue;
        }
        if let Some(slot) = stack_slot(&instr, 1) {
            // A reload: `mov reg, [rsp+d]`.
            if instr.mnemonic() == Mnemonic::Mov && instr.op0_kind() == OpKind::Register {
                let v = slots.iter().rev().find(|(d, _)| *d == slot).map(|(_, v)| *v);
                set(&mut regs, instr.op0_register(), v);
                continue;
            }
        }
        if instr.op_count() >= 1 && instr.op0_kind() == OpKind::Register {
            let r = instr.op0_register();
            let v = match instr.mnemonic() {
                Mnemonic::Lea if instr.is_ip_rel_memory_operand() => Some(Val::Addr(instr.ip_rel_memory_address())),
                Mnemonic::Mov
                    if instr.is_ip_rel_memory_operand()
                        && instr.op_count() == 2
                        && instr.op1_kind() == OpKind::Memory
                        && is_gpr64(instr.op0_register()) =>
                {
                    Some(Val::Word(instr.ip_rel_memory_address()))
                }
                // cmp/test read their first operand and write no register.
                Mnemonic::Cmp | Mnemonic::Test => continue,
                _ => None,
            };
            set(&mut regs, r, v);
        }
        if instr.mnemonic() == Mnemonic::Call {
            // Calls clobber every register (Go's ABI has no callee-saved ones).
            regs.clear();
        }
    }
    let allgs = rip_rel
        .iter()
        .copied()
        .filter(|a| rip_rel.contains(&(a + 8)) && rip_rel.contains(&(a + 16)))
        .min()
        .ok_or("the allgs slice (three words accessed together)")?;
    let allglen =
        xchgs.iter().find(|(_, v)| *v == Some(Val::Word(allgs + 8))).map(|(t, _)| *t).ok_or("allglen (an XCHG of allgs' length)")?;
    let allgptr = xchgs.iter().find(|(_, v)| *v == Some(Val::Word(allgs))).map(|(t, _)| *t).ok_or("allgptr (an XCHG of allgs' array)")?;
    Ok(AllGs { allgs, allglen, allgptr })
}

/// RAX..R15 (the crate's `instr_info` feature, which knows register
/// sizes, is not enabled; Go keeps pointers in 64-bit registers).
fn is_gpr64(r: Register) -> bool {
    (Register::RAX as u32..=Register::R15 as u32).contains(&(r as u32))
}

fn lookup(regs: &[(Register, Val)], r: Register) -> Option<Val> {
    regs.iter().rev().find(|(x, _)| *x == r).map(|(_, v)| *v)
}

/// The displacement of operand `op` if it is `[rsp+d]`.
fn stack_slot(instr: &Instruction, op: u32) -> Option<u64> {
    (op < instr.op_count()
        && instr.op_kind(op) == OpKind::Memory
        && instr.memory_base() == Register::RSP
        && instr.memory_index() == Register::None)
        .then(|| instr.memory_displacement64())
}

fn set_slot(slots: &mut Vec<(u64, Val)>, d: u64, v: Option<Val>) {
    slots.retain(|(x, _)| *x != d);
    if let Some(v) = v {
        slots.push((d, v));
    }
}

/// Records what `r` now holds. A write to a narrower register (`ecx`)
/// is not seen as a write to its 64-bit one; allgadd has none that matter.
fn set(regs: &mut Vec<(Register, Val)>, r: Register, v: Option<Val>) {
    regs.retain(|(x, _)| *x != r);
    if let Some(v) = v {
        regs.push((r, v));
    }
}

/// The first `lock cmpxchg r32, [reg+disp]` in `runtime.casgstatus`: the
/// offset of `g.atomicstatus` as this binary's compiler laid it out, to
/// check a row of the `gstruct` table against the binary itself.
pub fn atomicstatus_offset(syms: &GoSymbols, data: &[u8]) -> Option<u64> {
    let f = syms.lookup("runtime.casgstatus")?;
    let len = f.end.saturating_sub(f.entry).min(MAX_CODE);
    let bytes = syms.elf().read_va(data, f.entry, len)?;
    let mut decoder = Decoder::with_ip(64, bytes, f.entry, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.is_invalid() {
            return None;
        }
        if instr.mnemonic() == Mnemonic::Cmpxchg
            && instr.has_lock_prefix()
            && instr.op0_kind() == OpKind::Memory
            && instr.memory_size() == iced_x86::MemorySize::UInt32
            && instr.memory_index() == Register::None
            && !instr.is_ip_rel_memory_operand()
        {
            return Some(instr.memory_displacement64());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-encoded x86-64 (the `iced-x86` assembler is not a feature this
    /// crate enables): register numbers rax 0, rcx 1, rdx 2, rbx 3, rsi 6, rdi 7.
    struct Asm {
        ip: u64,
        code: Vec<u8>,
    }

    impl Asm {
        /// `REX.W op modrm(reg, [rip+disp32])`, aimed at `target`.
        fn rip(&mut self, op: u8, reg: u8, target: u64) -> &mut Self {
            let next = self.ip + self.code.len() as u64 + 7;
            let disp = (target.wrapping_sub(next) as i64) as i32;
            self.code.extend([0x48, op, (reg << 3) | 0b101]);
            self.code.extend(disp.to_le_bytes());
            self
        }
        fn load(&mut self, reg: u8, from: u64) -> &mut Self {
            self.rip(0x8b, reg, from)
        }
        fn store(&mut self, reg: u8, to: u64) -> &mut Self {
            self.rip(0x89, reg, to)
        }
        fn cmp(&mut self, reg: u8, with: u64) -> &mut Self {
            self.rip(0x39, reg, with)
        }
        fn lea(&mut self, reg: u8, of: u64) -> &mut Self {
            self.rip(0x8d, reg, of)
        }
        /// `xchg [base], reg`.
        fn xchg(&mut self, base: u8, reg: u8) -> &mut Self {
            self.code.extend([0x48, 0x87, (reg << 3) | base]);
            self
        }
    }

    const ALLGS: u64 = 0x9000;
    const ALLGLEN: u64 = 0xa000;
    const ALLGPTR: u64 = 0x8000;

    /// Go 1.19–1.27's `allgadd`, abridged to the accesses that matter.
    fn allgadd(with_len_store: bool) -> Vec<u8> {
        let mut a = Asm { ip: 0x1000, code: Vec::new() };
        a.load(6, ALLGS + 8).load(3, ALLGS).load(7, ALLGS + 16).store(1, ALLGS + 16);
        a.load(3, ALLGS).cmp(3, ALLGPTR).lea(1, ALLGPTR).xchg(1, 3);
        if with_len_store {
            a.load(1, ALLGS + 8).lea(2, ALLGLEN).xchg(2, 1);
        }
        a.code.push(0xc3);
        a.code
    }

    #[test]
    fn recognises_the_stores() {
        assert_eq!(from_code(&allgadd(true), 0x1000), Ok(AllGs { allgs: ALLGS, allglen: ALLGLEN, allgptr: ALLGPTR }));
    }

    #[test]
    fn missing_stores_are_named() {
        assert!(from_code(&allgadd(false), 0x1000).unwrap_err().contains("allglen"));
        assert!(from_code(&[0xc3], 0x1000).unwrap_err().contains("allgs"));
        assert!(from_code(&[], 0x1000).unwrap_err().contains("allgs"));
    }

    #[test]
    fn a_store_of_something_else_is_not_allglen() {
        // xchg of a value loaded from elsewhere: not the length.
        let mut a = Asm { ip: 0x1000, code: Vec::new() };
        a.load(6, ALLGS + 8).load(3, ALLGS).load(7, ALLGS + 16);
        a.lea(1, ALLGPTR).xchg(1, 3).load(1, 0x7000).lea(2, ALLGLEN).xchg(2, 1);
        assert!(from_code(&a.code, 0x1000).unwrap_err().contains("allglen"));
    }
}
