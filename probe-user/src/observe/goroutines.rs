//! The goroutines of a running Go process, read from outside through
//! `/proc/PID/mem`: no signal, no ptrace stop, nothing the process notices.
//!
//! Where the list is ([`find_allgs`]) and how a `g` is laid out
//! ([`layout_for`]) come from `proto::gosym`; this module does the reads:
//!
//! 1. `allglen`, then `allgptr` (8 bytes each), as `runtime.forEachGRace`
//!    reads them: the runtime stores the array before the length, so the
//!    first `allglen` entries of that array are valid;
//! 2. the whole array of `*g` in one read;
//! 3. each `g` with one small read (the first [`GLayout::span`] bytes).
//!
//! The process keeps running, so a read may be torn (a goroutine changing
//! state between two words). Every value is checked: a status that is no
//! status, a pointer that is not aligned or not readable, a saved `sp`
//! outside the goroutine's stack. Such a `g` is read once more; if it is
//! still inconsistent it is left out and counted ([`Scan::inconsistent`]).
//!
//! A goroutine's stack ([`GoroutineReader::stack`]) is unwound with the
//! binary's pcsp tables ([`crate::proto::gosym::unwind`]): a parked one
//! from its saved `sched` registers, one in a system call from the
//! registers `/proc/TID/syscall` gives for the thread whose stack pointer
//! lies in the goroutine's stack (each goroutine has its own stack, so the
//! match is exact). The stack from `sp` up is read in one positioned read
//! ([`STACK_WINDOW`] bytes at most), the rest word by word.
//!
//! Reading `/proc/PID/mem` needs the ptrace access mode (root, or the same
//! user with `ptrace_scope` 0); it does not stop or signal the process.
//! Positioned reads are done with `FileExt::read_exact_at`. The scan is
//! blocking work: call it from a worker thread, never the event loop.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::time::{Duration, Instant};

use crate::clock::monotonic_ns;
pub use crate::proto::gosym::gdecode::{decode_g, Goroutine, Inconsistent};
use crate::proto::gosym::{
    find_allgs, layout_for, unwind, AllGs, AllGsError, GLayout, GStatus, GStructError, GoSymbols, ReadMem, Regs, Unwound,
};

/// The most of a goroutine's stack read at once, from its `sp` up.
pub const STACK_WINDOW: u64 = 64 * 1024;

/// Frames read at most per goroutine.
pub const MAX_STACK_FRAMES: usize = 100;

/// More goroutines than a node's kubelet, containerd or CRI-O holds (thousands) by far:
/// an `allglen` above this is a torn or wrong read, refused before its array (8 bytes a
/// goroutine) is allocated and read.
pub const MAX_GOROUTINES: u64 = 1_000_000;

/// Errors from reading a process's goroutines. Each names the pid.
#[derive(Debug, thiserror::Error)]
pub enum GoroutineError {
    /// The binary's Go version is unknown to the layout table (named).
    #[error("pid {pid}: {source}")]
    Layout {
        pid: u32,
        #[source]
        source: GStructError,
    },
    /// `allgs`/`allglen` not found in the binary.
    #[error("pid {pid}: {source}")]
    AllGs {
        pid: u32,
        #[source]
        source: AllGsError,
    },
    /// A read of `/proc` failed (the process exited, or no permission).
    #[error("pid {pid}: {what}: {source}")]
    Io {
        pid: u32,
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The binary is not mapped in the process (another executable?).
    #[error("pid {pid}: its executable is not mapped as {binary} expects (no mapping of its first PT_LOAD)")]
    NotMapped { pid: u32, binary: String },
    /// The pid now runs another executable than the one inspected (the process exited
    /// and its pid was reused, or it exec'd).
    #[error("pid {pid}: it no longer runs the executable inspected (pid reused, or exec'd)")]
    NotTheBinary { pid: u32 },
    /// The goroutine list itself reads as nonsense.
    #[error("pid {pid}: the goroutine list is unreadable: {reason}")]
    BadList { pid: u32, reason: String },
}

/// Why [`GoroutineReader::locate`] failed: the Go version, or the goroutine list.
#[derive(Debug, thiserror::Error)]
pub enum GStructOrAllGs {
    #[error(transparent)]
    Layout(GStructError),
    #[error(transparent)]
    AllGs(AllGsError),
}

impl GStructOrAllGs {
    /// As the error of a reader of `pid`.
    pub fn for_pid(self, pid: u32) -> GoroutineError {
        match self {
            GStructOrAllGs::Layout(source) => GoroutineError::Layout { pid, source },
            GStructOrAllGs::AllGs(source) => GoroutineError::AllGs { pid, source },
        }
    }
}

/// The executable `pid` runs: (device, inode).
fn exe_of(pid: u32) -> Result<(u64, u64), GoroutineError> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(format!("/proc/{pid}/exe")).map_err(|source| GoroutineError::Io {
        pid,
        what: "stat /proc/PID/exe".into(),
        source,
    })?;
    Ok((m.dev(), m.ino()))
}

/// Whether `pid` runs the executable `exe` (device, inode) now.
fn still_runs(pid: u32, exe: (u64, u64)) -> Result<(), GoroutineError> {
    if exe_of(pid)? != exe {
        return Err(GoroutineError::NotTheBinary { pid });
    }
    Ok(())
}

/// The result of one scan.
#[derive(Clone, Debug)]
pub struct Scan {
    /// Live goroutines (dead descriptors left out), in `allgs` order.
    pub goroutines: Vec<Goroutine>,
    /// `allglen` as read.
    pub allglen: u64,
    /// Dead descriptors (free `g`s kept for reuse).
    pub dead: usize,
    /// `g`s left out because they read inconsistently twice.
    pub inconsistent: usize,
    /// Why, per [`Inconsistent`] reason (the second read's).
    pub why: BTreeMap<&'static str, usize>,
    /// `g`s that read inconsistently once and well the second time.
    pub reread: usize,
    /// How long the scan took.
    pub took: Duration,
}

/// A reader of one process's goroutines: the addresses and layout are
/// worked out once ([`GoroutineReader::new`]); each [`GoroutineReader::scan`]
/// reads the list again.
#[derive(Debug)]
pub struct GoroutineReader {
    pid: u32,
    mem: File,
    bias: u64,
    vars: AllGs,
    layout: &'static GLayout,
    version: String,
}

impl GoroutineReader {
    /// Prepares to read the goroutines of `pid`, whose executable's bytes
    /// are `data` and symbols `syms`. Fails, naming it, on a Go version the
    /// layout table does not know.
    pub fn new(pid: u32, syms: &GoSymbols, data: &[u8]) -> Result<GoroutineReader, GoroutineError> {
        let binary = syms.elf().binary().to_string();
        let version =
            syms.version().ok_or_else(|| GoroutineError::Layout { pid, source: GStructError::NoVersion { binary: binary.clone() } })?;
        let layout = layout_for(&version).map_err(|source| GoroutineError::Layout { pid, source })?;
        let vars = find_allgs(syms, data).map_err(|source| GoroutineError::AllGs { pid, source })?;
        let exe = exe_of(pid)?;
        Self::with_vars(pid, syms, vars, version, layout, exe)
    }

    /// Where the goroutine list is and how a `g` is laid out in `syms`' binary, worked
    /// out once for every process that runs it: `(allgs, version, layout)`.
    pub fn locate(syms: &GoSymbols, data: &[u8]) -> Result<(AllGs, String, &'static GLayout), GStructOrAllGs> {
        let binary = syms.elf().binary().to_string();
        let version = syms.version().ok_or(GStructOrAllGs::Layout(GStructError::NoVersion { binary }))?;
        let layout = layout_for(&version).map_err(GStructOrAllGs::Layout)?;
        let vars = find_allgs(syms, data).map_err(GStructOrAllGs::AllGs)?;
        Ok((vars, version, layout))
    }

    /// [`GoroutineReader::new`] with what [`GoroutineReader::locate`] found in the
    /// executable `exe` (its device and inode), which `pid` must still run once its memory
    /// is open: the open `mem` then reads that process, not one that took its pid since.
    pub fn with_vars(
        pid: u32,
        syms: &GoSymbols,
        vars: AllGs,
        version: String,
        layout: &'static GLayout,
        exe: (u64, u64),
    ) -> Result<GoroutineReader, GoroutineError> {
        let bias = if syms.elf().is_pie() { load_bias(pid, syms)? } else { 0 };
        let mem = File::open(format!("/proc/{pid}/mem")).map_err(|source| GoroutineError::Io {
            pid,
            what: "open /proc/PID/mem".into(),
            source,
        })?;
        still_runs(pid, exe)?;
        Ok(GoroutineReader { pid, mem, bias, vars, layout, version })
    }

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The Go version the layout was chosen for.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The load bias: run-time address minus link-time address (0 unless PIE).
    pub fn bias(&self) -> u64 {
        self.bias
    }

    /// The layout used.
    pub fn layout(&self) -> &'static GLayout {
        self.layout
    }

    /// The run-time addresses of `allgs`, `allglen` and `allgptr`.
    pub fn addresses(&self) -> AllGs {
        AllGs { allgs: self.vars.allgs + self.bias, allglen: self.vars.allglen + self.bias, allgptr: self.vars.allgptr + self.bias }
    }

    /// Reads every goroutine once (blocking; see the module doc).
    pub fn scan(&self) -> Result<Scan, GoroutineError> {
        let started = Instant::now();
        let at = self.addresses();
        let allglen = self.word(at.allglen, "allglen")?;
        let array = self.word(at.allgptr, "allgptr")?;
        if allglen > MAX_GOROUTINES {
            return Err(self.bad(format!("allglen {allglen} is implausible (more than {MAX_GOROUTINES})")));
        }
        // `allgs` is the slice `allglen` counts: a length beyond its capacity is garbage.
        let cap = self.word(at.allgs + 16, "allgs' capacity")?;
        if allglen > cap {
            return Err(self.bad(format!("allglen {allglen} is beyond allgs' capacity {cap}")));
        }
        if allglen > 0 && (array == 0 || array % 8 != 0) {
            return Err(self.bad(format!("allgptr {array:#x} is not a pointer")));
        }
        let mut ptrs = vec![0u8; (allglen * 8) as usize];
        self.read(array, &mut ptrs, "the allgs array")?;
        let now = monotonic_ns();
        let mut scan =
            Scan { goroutines: Vec::new(), allglen, dead: 0, inconsistent: 0, why: BTreeMap::new(), reread: 0, took: Duration::ZERO };
        let mut buf = vec![0u8; self.layout.span() as usize];
        for chunk in ptrs.chunks_exact(8) {
            let g = u64::from_le_bytes(chunk.try_into().unwrap_or_default());
            if g == 0 || g % 8 != 0 {
                scan.inconsistent += 1;
                *scan.why.entry("a nil or unaligned pointer in allgs").or_default() += 1;
                continue;
            }
            let mut result = self.read_g(g, &mut buf, now);
            if result.is_err() {
                result = self.read_g(g, &mut buf, now);
                if result.is_ok() {
                    scan.reread += 1;
                }
            }
            match result {
                Ok(Some(gr)) => scan.goroutines.push(gr),
                Ok(None) => scan.dead += 1,
                Err(Inconsistent(why)) => {
                    scan.inconsistent += 1;
                    *scan.why.entry(why).or_default() += 1;
                }
            }
        }
        scan.took = started.elapsed();
        Ok(scan)
    }

    /// Reads and checks one `g`: `Ok(None)` for a dead one, `Err` for an
    /// unreadable or inconsistent one.
    fn read_g(&self, g: u64, buf: &mut [u8], now: u64) -> Result<Option<Goroutine>, Inconsistent> {
        self.mem.read_exact_at(buf, g).map_err(|_| Inconsistent("unreadable"))?;
        decode_g(self.layout, g, buf, now)
    }

    /// The 8-byte word at `addr` in the process (a spilled argument, a lock's state).
    pub fn read_word(&self, addr: u64) -> Option<u64> {
        let mut b = [0u8; 8];
        self.mem.read_exact_at(&mut b, addr).ok().map(|_| u64::from_le_bytes(b))
    }

    /// `len` bytes at `addr` in the process (a string argument).
    pub fn read_bytes(&self, addr: u64, len: usize) -> Option<Vec<u8>> {
        let mut b = vec![0u8; len];
        self.mem.read_exact_at(&mut b, addr).ok().map(|_| b)
    }

    /// Reads `g` once more: whether it is still the same goroutine parked at the same
    /// place (same goid, status and saved `sp`). A goroutine that ran in between may
    /// have returned from calls it was seen in.
    pub fn still_parked(&self, g: &Goroutine) -> bool {
        let mut buf = vec![0u8; self.layout.span() as usize];
        matches!(self.read_g(g.g, &mut buf, monotonic_ns()), Ok(Some(now)) if now.goid == g.goid && now.status == g.status && now.sp == g.sp)
    }

    /// The threads of the process in a system call now, with the user registers
    /// `/proc/TID/syscall` gives for each.
    pub fn threads_in_syscall(&self) -> Vec<(u32, Regs)> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{}/task", self.pid)) else { return Vec::new() };
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|tid| {
                let (nr, regs) = crate::observe::gostack::syscall_regs(self.pid, tid)?;
                (nr >= 0).then_some((tid, regs))
            })
            .collect()
    }

    /// Unwinds goroutine `g` (see the module doc): a parked or runnable one from its
    /// saved registers; one in a system call from the thread among `threads` (see
    /// [`GoroutineReader::threads_in_syscall`]) whose stack pointer lies in its stack,
    /// with that thread. `None` for a running goroutine, or one in a call whose thread
    /// is not among `threads`.
    pub fn stack(&self, g: &Goroutine, syms: &GoSymbols, threads: &[(u32, Regs)]) -> Option<(Unwound, Option<u32>)> {
        let (regs, tid) = match g.status {
            GStatus::Waiting | GStatus::Runnable | GStatus::Preempted => {
                (Regs { pc: g.pc, sp: g.sp, bp: g.bp, return_address: true }, None)
            }
            GStatus::Syscall => {
                let (tid, regs) = threads.iter().find(|(_, r)| r.sp >= g.stack.0 && r.sp < g.stack.1)?;
                (*regs, Some(*tid))
            }
            _ => return None,
        };
        let len = g.stack.1.saturating_sub(regs.sp).min(STACK_WINDOW);
        let mut bytes = vec![0u8; len as usize];
        let window = match self.mem.read_exact_at(&mut bytes, regs.sp) {
            Ok(()) => StackWindow { base: regs.sp, bytes, mem: &self.mem },
            Err(_) => StackWindow { base: 0, bytes: Vec::new(), mem: &self.mem },
        };
        Some((unwind(regs, &window, syms, self.bias, MAX_STACK_FRAMES), tid))
    }

    fn word(&self, addr: u64, what: &str) -> Result<u64, GoroutineError> {
        let mut b = [0u8; 8];
        self.read(addr, &mut b, what)?;
        Ok(u64::from_le_bytes(b))
    }

    fn read(&self, addr: u64, buf: &mut [u8], what: &str) -> Result<(), GoroutineError> {
        self.mem.read_exact_at(buf, addr).map_err(|source| GoroutineError::Io {
            pid: self.pid,
            what: format!("read {what} ({} bytes at {addr:#x}) from /proc/PID/mem", buf.len()),
            source,
        })
    }

    fn bad(&self, reason: String) -> GoroutineError {
        GoroutineError::BadList { pid: self.pid, reason }
    }
}

/// A goroutine's stack read once from its `sp` up; words outside it are read one by one.
struct StackWindow<'a> {
    base: u64,
    bytes: Vec<u8>,
    mem: &'a File,
}

impl ReadMem for StackWindow<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let off = addr.wrapping_sub(self.base);
        if addr >= self.base && off.saturating_add(buf.len() as u64) <= self.bytes.len() as u64 {
            buf.copy_from_slice(&self.bytes[off as usize..off as usize + buf.len()]);
            return true;
        }
        self.mem.read_exact_at(buf, addr).is_ok()
    }
}

/// The load bias of a PIE: where the mapping of the executable's first
/// PT_LOAD starts, minus that segment's page-aligned link-time address.
/// The executable is found in `/proc/PID/maps` by the inode and device of
/// `/proc/PID/exe`, so paths in other mount namespaces do not matter.
fn load_bias(pid: u32, syms: &GoSymbols) -> Result<u64, GoroutineError> {
    let binary = syms.elf().binary().to_string();
    let io = |what: &str, source: std::io::Error| GoroutineError::Io { pid, what: what.to_string(), source };
    let exe = std::fs::metadata(format!("/proc/{pid}/exe")).map_err(|e| io("stat /proc/PID/exe", e))?;
    let first =
        syms.elf().load_segments().min_by_key(|s| s.vaddr).ok_or_else(|| GoroutineError::NotMapped { pid, binary: binary.clone() })?;
    const PAGE: u64 = 4096;
    let proc = ::procfs::process::Process::new(pid as i32).map_err(|e| io("open /proc/PID", std::io::Error::other(e)))?;
    let maps = proc.maps().map_err(|e| io("read /proc/PID/maps", std::io::Error::other(e)))?;
    maps.iter()
        .find(|m| {
            m.inode == exe.ino()
                && (::libc::makedev(m.dev.0 as u32, m.dev.1 as u32) as u64 == exe.dev())
                && m.offset == first.offset & !(PAGE - 1)
        })
        .map(|m| m.address.0.wrapping_sub(first.vaddr & !(PAGE - 1)))
        .ok_or(GoroutineError::NotMapped { pid, binary })
}

#[cfg(test)]
mod tests {
    /// A pid whose executable changed since it was inspected (reused, or exec'd) is refused.
    #[test]
    fn a_pid_running_another_executable_is_refused() {
        let me = std::process::id();
        let exe = super::exe_of(me).expect("this test's own executable");
        assert!(super::still_runs(me, exe).is_ok());
        let other = (exe.0, exe.1.wrapping_add(1));
        assert!(matches!(super::still_runs(me, other), Err(super::GoroutineError::NotTheBinary { pid }) if pid == me));
    }

    use super::*;
    use crate::proto::gosym::gstruct::LAYOUTS;

    /// A `g` for `layout` with the given fields.
    fn g_bytes(l: &GLayout, status: u32, goid: u64, reason: u8, since: i64, sp: u64) -> Vec<u8> {
        let mut b = vec![0u8; l.size as usize];
        let mut put = |off: u64, v: u64| b[off as usize..off as usize + 8].copy_from_slice(&v.to_le_bytes());
        put(l.stack_lo, 0xc000_1000);
        put(l.stack_lo + 8, 0xc000_3000);
        put(l.sched_sp, sp);
        put(l.sched_pc, 0x46_1234);
        put(l.sched_bp, sp + 0x40);
        put(l.goid, goid);
        put(l.waitsince, since as u64);
        b[l.atomicstatus as usize..l.atomicstatus as usize + 4].copy_from_slice(&status.to_le_bytes());
        b[l.waitreason as usize] = reason;
        b
    }

    #[test]
    fn decodes_a_parked_goroutine_on_every_layout() {
        for l in LAYOUTS {
            let recv = l.wait_reasons.iter().position(|n| *n == "chan receive").unwrap() as u8;
            let b = g_bytes(l, 4, 42, recv, 5_000, 0xc000_2f00);
            let g = decode_g(l, 0xc000_0000, &b, 10_000).unwrap().unwrap();
            assert_eq!((g.goid, g.status, g.wait_reason), (42, GStatus::Waiting, Some("chan receive")), "1.{}", l.minors.0);
            assert_eq!((g.waitsince_ns, g.pc, g.sp, g.bp), (Some(5_000), 0x46_1234, 0xc000_2f00, 0xc000_2f40));
            assert!(!g.scanning);
            // The _Gscan bit is kept apart.
            let b = g_bytes(l, 0x1004, 42, recv, 0, 0xc000_2f00);
            let g = decode_g(l, 0, &b, 10_000).unwrap().unwrap();
            assert!(g.scanning && g.status == GStatus::Waiting && g.waitsince_ns.is_none());
        }
    }

    #[test]
    fn dead_and_torn_reads() {
        let l = &LAYOUTS[0];
        assert_eq!(decode_g(l, 0, &g_bytes(l, 6, 7, 0, 0, 0), 1), Ok(None));
        // Not a status.
        assert_eq!(decode_g(l, 0, &g_bytes(l, 5, 7, 0, 0, 0xc000_2f00), 1), Err(Inconsistent("atomicstatus is no status")));
        // A parked goroutine whose sp is off its stack.
        assert_eq!(decode_g(l, 0, &g_bytes(l, 4, 7, 14, 0, 0x1234), 1), Err(Inconsistent("saved sp off its stack, or no saved pc")));
        // A wait reason this version does not have.
        assert_eq!(decode_g(l, 0, &g_bytes(l, 4, 7, 200, 0, 0xc000_2f00), 1), Err(Inconsistent("waitreason unknown to this version")));
        // goid 0.
        assert_eq!(decode_g(l, 0, &g_bytes(l, 2, 0, 0, 0, 0), 1), Err(Inconsistent("goid out of range")));
        // waitsince in the future is not believed.
        let g = decode_g(l, 0, &g_bytes(l, 4, 7, 14, 50, 0xc000_2f00), 10).unwrap().unwrap();
        assert_eq!(g.waitsince_ns, None);
        // Too short a buffer.
        assert_eq!(decode_g(l, 0, &[0u8; 16], 1), Err(Inconsistent("the read is shorter than the layout")));
        // A running goroutine's stale sched is not checked.
        assert!(decode_g(l, 0, &g_bytes(l, 2, 9, 0, 0, 0), 1).unwrap().is_some());
    }
}
