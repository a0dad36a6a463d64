//! Go stacks of a live process, read from outside: `/proc/PID/mem` with
//! positioned reads, no signal and no ptrace stop (the kernel allows it to a
//! reader that may ptrace-attach: root, or the same user without YAMA).
//!
//! The unwinding itself is [`crate::proto::gosym::unwind`]; this module gives
//! it the memory ([`ProcMem`]), the load bias of the executable ([`load_bias`])
//! and, for a thread blocked in a system call, its user PC and SP from
//! `/proc/TID/syscall` ([`syscall_regs`]).

use crate::proto::gosym::{unwind, GoSymbols, ReadMem, Regs, Unwound};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// Frames read at most by [`unwind_blocked_thread`].
pub const MAX_FRAMES: usize = 128;

/// A process's memory, through `/proc/PID/mem`.
pub struct ProcMem {
    file: File,
}

impl ProcMem {
    /// Opens `/proc/PID/mem` for reading.
    pub fn open(pid: u32) -> std::io::Result<ProcMem> {
        Ok(ProcMem { file: File::open(format!("/proc/{pid}/mem"))? })
    }
}

impl ReadMem for ProcMem {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        self.file.read_exact_at(buf, addr).is_ok()
    }
}

/// The registers `/proc/TID/syscall` gives for a thread in a system call:
/// `NR args×6 SP PC` (proc(5)). `None` when the thread is running (`running`),
/// not in a call (`-1 SP PC` still has them: kept), or the file is unreadable.
pub fn syscall_regs(pid: u32, tid: u32) -> Option<(i64, Regs)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/syscall")).ok()?;
    parse_syscall(&text)
}

/// Parses the text of `/proc/TID/syscall` (see [`syscall_regs`]). The frame
/// pointer is not in it: `bp` is 0.
pub fn parse_syscall(text: &str) -> Option<(i64, Regs)> {
    let f: Vec<&str> = text.split_whitespace().collect();
    let nr: i64 = f.first()?.parse().ok()?;
    let hex = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
    let (sp, pc) = match f.len() {
        9 => (hex(f[7])?, hex(f[8])?),
        3 => (hex(f[1])?, hex(f[2])?),
        _ => return None,
    };
    Some((nr, Regs { pc, sp, bp: 0, return_address: false }))
}

/// The load bias of `pid`'s executable: run-time minus link-time addresses
/// (0 for a non-PIE), from the mapping that holds `pc` in `/proc/PID/maps`.
pub fn load_bias(pid: u32, syms: &GoSymbols, pc: u64) -> Option<u64> {
    let p = ::procfs::process::Process::new(pid as i32).ok()?;
    let m = p.maps().ok()?.into_iter().find(|m| pc >= m.address.0 && pc < m.address.1)?;
    let link = syms.va_of_file_offset(pc - m.address.0 + m.offset)?;
    Some(pc.wrapping_sub(link))
}

/// Unwinds the Go stack of thread `tid` of `pid` blocked in a system call:
/// its user PC and SP from `/proc/TID/syscall`, memory from `/proc/PID/mem`.
/// `syms` must be the Go symbols of the process's executable. `None` when
/// the thread is not in a call or its registers or memory are unreadable.
pub fn unwind_blocked_thread(pid: u32, tid: u32, syms: &GoSymbols) -> Option<Unwound> {
    let (_, regs) = syscall_regs(pid, tid)?;
    let bias = load_bias(pid, syms, regs.pc)?;
    let mem = ProcMem::open(pid).ok()?;
    Some(unwind(regs, &mem, syms, bias, MAX_FRAMES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_proc_syscall() {
        let (nr, r) = parse_syscall("0 0x3 0xc00001a0f8 0x1 0x0 0x0 0x0 0xc00005ee38 0x402b2e\n").unwrap();
        assert_eq!(nr, 0);
        assert_eq!(r, Regs { pc: 0x402b2e, sp: 0xc00005ee38, bp: 0, return_address: false });
        let (nr, r) = parse_syscall("-1 0x7ffd1000 0x401000\n").unwrap();
        assert_eq!((nr, r.sp, r.pc), (-1, 0x7ffd1000, 0x401000));
        assert_eq!(parse_syscall("running\n"), None);
        assert_eq!(parse_syscall(""), None);
        assert_eq!(parse_syscall("0 0x1 zz\n"), None);
    }
}
