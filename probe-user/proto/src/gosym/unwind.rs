//! Unwinds a Go stack on amd64 from a PC and SP, with the `pcsp` tables of
//! `.gopclntab` (see [`super::pcvalue`]), and names each frame. Works on a
//! stripped binary: no DWARF, no `.eh_frame` (Go writes none for Go code).
//!
//! As Go's own `runtime/traceback.go` does it: at each frame the return
//! address sits at `SP + pcsp(PC)`, and the caller's SP is 8 above it. For
//! every frame but the first, PC is a return address, so the function and its
//! SP delta are looked up at `PC - 1` (the CALL), which is also right when the
//! call is the function's last instruction. The walk stops at the outermost
//! functions (`runtime.goexit`, `runtime.mstart`, `runtime.rt0_go`), an
//! unknown PC, a zero return address, an unreadable word, or `max_frames`.
//!
//! Memory is read through [`ReadMem`]: `/proc/PID/mem` for a live process
//! (`observe::gostack`), a byte buffer in the tests. PCs in memory are
//! run-time addresses; `bias` (the load bias: 0 unless a PIE) turns them into
//! the link-time addresses of the pclntab.
//!
//! [`unwind_frame_pointers`] walks the `BP` chain instead, as a cross-check:
//! it skips the caller of a frameless leaf (whose BP is still the caller's).

use super::GoSymbols;

/// Functions at the bottom of a goroutine's or thread's stack.
const OUTERMOST: &[&str] = &["runtime.goexit", "runtime.mstart", "runtime.rt0_go", "runtime.mcall", "runtime.morestack"];

/// Reads another process's memory (or a test's bytes).
pub trait ReadMem {
    /// Fills `buf` from address `addr`; false if any byte is unreadable.
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool;

    /// The little-endian 64-bit word at `addr`.
    fn read_u64(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b).then(|| u64::from_le_bytes(b))
    }
}

/// Where a stack starts: the registers of its innermost frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regs {
    /// Instruction pointer (run-time address).
    pub pc: u64,
    /// Stack pointer.
    pub sp: u64,
    /// Frame pointer (only [`unwind_frame_pointers`] uses it).
    pub bp: u64,
    /// True when `pc` is itself a return address, as a parked goroutine's
    /// `g.sched.pc` is (saved by `mcall` after its CALL): the first frame is
    /// then looked up at `pc - 1` too. False for a thread stopped in a
    /// system call (`pc` is after the SYSCALL instruction, in the leaf).
    pub return_address: bool,
}

/// One frame of an unwound stack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame's PC (run-time): where it stopped, or the return address.
    pub pc: u64,
    /// The frame's SP (0 in a frame-pointer walk, which does not know it).
    pub sp: u64,
    /// The Go function's name.
    pub function: String,
}

/// Why a walk ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// It reached an outermost function (named): the whole stack was read.
    Outermost(String),
    /// A PC no function of the binary holds (run-time address).
    UnknownPc(u64),
    /// The function holding the PC has no SP delta there.
    NoFrameSize(u64),
    /// The word at this address could not be read.
    Unreadable(u64),
    /// A zero return address (or frame pointer).
    Zero,
    /// The frame pointer chain did not go up the stack.
    BadFramePointer(u64),
    /// `max_frames` frames were read.
    MaxFrames,
}

/// An unwound stack, innermost frame first, and why the walk ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unwound {
    pub frames: Vec<Frame>,
    pub stop: Stop,
}

impl Unwound {
    /// True when the walk reached an outermost function.
    pub fn complete(&self) -> bool {
        matches!(self.stop, Stop::Outermost(_))
    }

    /// The functions' names, innermost first.
    pub fn names(&self) -> Vec<&str> {
        self.frames.iter().map(|f| f.function.as_str()).collect()
    }
}

/// Unwinds from `regs` with the pcsp tables of `syms` (see the module doc).
pub fn unwind(regs: Regs, mem: &dyn ReadMem, syms: &GoSymbols, bias: u64, max_frames: usize) -> Unwound {
    let mut frames = Vec::new();
    let (mut pc, mut sp) = (regs.pc, regs.sp);
    let stop = loop {
        if frames.len() >= max_frames {
            break Stop::MaxFrames;
        }
        // A return address points after its CALL: look up the CALL.
        let at = if frames.is_empty() && !regs.return_address { pc } else { pc.wrapping_sub(1) };
        let link = at.wrapping_sub(bias);
        let Some(f) = syms.function_at(link) else { break Stop::UnknownPc(pc) };
        let outermost = OUTERMOST.contains(&f.name.as_str());
        frames.push(Frame { pc, sp, function: f.name });
        if outermost {
            break Stop::Outermost(frames.last().map(|f| f.function.clone()).unwrap_or_default());
        }
        let Some(delta) = syms.frame_size_at(link) else { break Stop::NoFrameSize(pc) };
        let Some(ra_at) = sp.checked_add(delta) else { break Stop::Unreadable(sp) };
        let Some(ra) = mem.read_u64(ra_at) else { break Stop::Unreadable(ra_at) };
        if ra == 0 {
            break Stop::Zero;
        }
        pc = ra;
        sp = ra_at.wrapping_add(8);
    };
    Unwound { frames, stop }
}

/// Walks the frame-pointer chain from `regs`: the first frame is `regs.pc`;
/// each next one is the return address at `[BP + 8]`, with the caller's BP
/// at `[BP]`. A cross-check of [`unwind`]: Go keeps frame pointers on amd64,
/// but a frameless leaf hides its caller from this walk.
pub fn unwind_frame_pointers(regs: Regs, mem: &dyn ReadMem, syms: &GoSymbols, bias: u64, max_frames: usize) -> Unwound {
    let mut frames = Vec::new();
    let (mut pc, mut bp) = (regs.pc, regs.bp);
    let stop = loop {
        if frames.len() >= max_frames {
            break Stop::MaxFrames;
        }
        let at = if frames.is_empty() && !regs.return_address { pc } else { pc.wrapping_sub(1) };
        let Some(f) = syms.function_at(at.wrapping_sub(bias)) else { break Stop::UnknownPc(pc) };
        let outermost = OUTERMOST.contains(&f.name.as_str());
        frames.push(Frame { pc, sp: 0, function: f.name });
        if outermost {
            break Stop::Outermost(frames.last().map(|f| f.function.clone()).unwrap_or_default());
        }
        if bp == 0 {
            break Stop::Zero;
        }
        let Some(ra) = mem.read_u64(bp.wrapping_add(8)) else { break Stop::Unreadable(bp.wrapping_add(8)) };
        let Some(next_bp) = mem.read_u64(bp) else { break Stop::Unreadable(bp) };
        if ra == 0 {
            break Stop::Zero;
        }
        // The chain must go up the stack (it ends with 0 at the bottom).
        if next_bp != 0 && next_bp <= bp {
            break Stop::BadFramePointer(next_bp);
        }
        pc = ra;
        bp = next_bp;
    };
    Unwound { frames, stop }
}
