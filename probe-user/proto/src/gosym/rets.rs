//! Return probe points that are safe on Go: a uprobe on every RET.
//!
//! A uretprobe rewrites the return address on the stack; when a goroutine's
//! stack is moved (grown or shrunk) the runtime copies that rewritten address
//! and the process crashes (bcc#1320, #3034). So plegwatch puts plain uprobes
//! at the entry and at each `RET` inside the function instead.
//!
//! The function's bytes `[entry, end)` are decoded linearly with iced-x86
//! from the entry. Go on x86 puts no data in text, so a linear sweep from a
//! correct entry meets every instruction boundary; the INT3 (0xCC) padding
//! after the last instruction decodes as one-byte `INT3`s and is skipped. An
//! undecodable byte, or a branch whose target inside the function is not an
//! instruction start (hand-written assembly that jumps over data), is an
//! error rather than a guess: a uprobe that is not on an instruction
//! boundary corrupts the traced process. On Debian's containerd this refuses
//! exactly one of 51,283 functions, the `crypto/internal/boring/sig` marker.
//!
//! An instruction that runs past `end` also decodes as invalid: the function
//! bounds, not the code, are wrong, and probing would be a guess. That is how
//! Go 1.26's externally linked binaries showed up (containerd 2.3.4: "5 of 9
//! functions undecodable", an ordinary `lea` cut at the next "entry"): from
//! Go 1.26 the pclntab's `textStart` is 0 and every entry came out 256 bytes
//! early until `runtime.text` was taken from the moduledata (see
//! `moduledata.rs`). iced-x86 (anchors.md's pick) stays the decoder; on
//! containerd 1.7.34 and 2.3.4, their shims, runc 1.4.3 and
//! node-problem-detector it also refuses only the `sig` marker, and its RETs
//! match GNU objdump's (`probe-user/tests/real_binaries.rs`).
//!
//! A function that leaves only by a tail jump or a panic has no RET and so
//! no return probe; callers see an empty `ret_offsets`.

use iced_x86::{Code, Decoder, DecoderOptions, Instruction, Mnemonic, OpKind};
use object::elf::{EM_386, EM_X86_64};

use super::elf::Elf;
use super::{GoFunc, GoSymError};

/// Where to attach uprobes for one function, as file offsets (what
/// `UProbe::attach` takes with a path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbePoints {
    /// File offset of the function's first instruction.
    pub entry_offset: u64,
    /// File offsets of every RET instruction, ascending.
    pub ret_offsets: Vec<u64>,
}

/// The virtual addresses of every `RET`/`RETF` (C3, C2 iw, CB, CA iw) in
/// `[func.entry, func.end)`; parses the ELF headers of `data` itself.
pub fn ret_addresses(data: &[u8], func: &GoFunc) -> Result<Vec<u64>, GoSymError> {
    let elf = Elf::parse(data, super::IN_MEMORY)?;
    ret_addresses_in(&elf, data, func)
}

/// [`ret_addresses`] with already parsed headers.
pub fn ret_addresses_in(elf: &Elf, data: &[u8], func: &GoFunc) -> Result<Vec<u64>, GoSymError> {
    let bitness = match elf.machine() {
        EM_X86_64 => 64,
        EM_386 => 32,
        m => return Err(GoSymError::UnsupportedArch { binary: elf.binary().to_string(), machine: m }),
    };
    let bytes = function_bytes(elf, data, func)?;
    let mut decoder = Decoder::with_ip(bitness, bytes, func.entry, DecoderOptions::NONE);
    let mut instr = Instruction::default();
    let mut rets = Vec::new();
    // Instruction starts (ascending) and in-function branch targets, to
    // check the sweep stayed on instruction boundaries.
    let mut starts = Vec::new();
    let mut targets = Vec::new();
    while decoder.can_decode() {
        decoder.decode_out(&mut instr);
        if instr.code() == Code::INVALID {
            return Err(GoSymError::Decode { binary: elf.binary().to_string(), function: func.name.clone(), va: instr.ip() });
        }
        starts.push(instr.ip());
        if matches!(instr.op0_kind(), OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64) {
            let t = instr.near_branch_target();
            if t >= func.entry && t < func.end {
                targets.push(t);
            }
        }
        if matches!(instr.mnemonic(), Mnemonic::Ret | Mnemonic::Retf) {
            rets.push(instr.ip());
        }
    }
    // Hand-written assembly may jump over data (crypto/internal/boring/sig
    // markers do); a branch into the middle of a decoded instruction means
    // the sweep read data as code, and its RETs cannot be trusted.
    if let Some(&t) = targets.iter().find(|t| starts.binary_search(t).is_err()) {
        return Err(GoSymError::DataInCode { binary: elf.binary().to_string(), function: func.name.clone(), va: t });
    }
    Ok(rets)
}

/// The uprobe attach points of `func`: entry and every RET, as file offsets.
pub fn probe_points(data: &[u8], func: &GoFunc) -> Result<ProbePoints, GoSymError> {
    let elf = Elf::parse(data, super::IN_MEMORY)?;
    probe_points_in(&elf, data, func)
}

/// [`probe_points`] with already parsed headers.
pub fn probe_points_in(elf: &Elf, data: &[u8], func: &GoFunc) -> Result<ProbePoints, GoSymError> {
    let entry_offset = offset_of(elf, func, func.entry)?;
    let ret_offsets = ret_addresses_in(elf, data, func)?.into_iter().map(|va| offset_of(elf, func, va)).collect::<Result<Vec<_>, _>>()?;
    Ok(ProbePoints { entry_offset, ret_offsets })
}

fn offset_of(elf: &Elf, func: &GoFunc, va: u64) -> Result<u64, GoSymError> {
    elf.file_offset(va).ok_or_else(|| GoSymError::NotInFile { binary: elf.binary().to_string(), function: func.name.clone(), va })
}

/// The file bytes of `[entry, end)`, which must lie in one executable
/// segment's file-backed part.
fn function_bytes<'d>(elf: &Elf, data: &'d [u8], func: &GoFunc) -> Result<&'d [u8], GoSymError> {
    let not_in_file = |va| GoSymError::NotInFile { binary: elf.binary().to_string(), function: func.name.clone(), va };
    if func.end < func.entry {
        return Err(not_in_file(func.end));
    }
    let seg = elf.load_segment_at(func.entry).filter(|s| s.flags & super::elf::PF_X != 0).ok_or_else(|| not_in_file(func.entry))?;
    if func.end - seg.vaddr > seg.filesz {
        return Err(not_in_file(func.end));
    }
    elf.read_va(data, func.entry, func.end - func.entry).ok_or_else(|| not_in_file(func.entry))
}
