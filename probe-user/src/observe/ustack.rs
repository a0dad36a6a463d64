//! User stacks in words: the addresses the kernel walked (by frame pointers, at
//! a wait's `sys_enter`) named by function; and, for a wait the kernel did not
//! see begin (the startup sweep's), a Go thread's stack unwound from outside
//! ([`UserSymbolizer::blocked_go_thread`]).
//!
//! - **Go code** is named through plegwatch's own gopclntab reader
//!   ([`crate::proto::gosym`]): release Go binaries are stripped of ELF symbols,
//!   but keep `.gopclntab`, which general symbolizers do not read.
//! - **Everything else** (C programs, libc) through blazesym, from the ELF
//!   symbols of the objects mapped in the process (`.dynsym` at least).
//!
//! An address neither names stays as `0x…` with its object's file name, so a
//! frame is never dropped. Each binary's Go symbols are parsed once, keyed by
//! device and inode, and kept. The binaries plegwatch probes (containerd, its shims,
//! kubelet, runc) come parsed already: the Go inspector reads them off the scan loop
//! to place their uprobes and hands their tables over ([`UserSymbolizer::prime`]).
//! Any other Go process pays the parse on the scan loop at its first stall line (5
//! to 13 ms here for containerd 2.3.4 from memory, more with its file's pages cold,
//! and about a second in an emulated guest reading the file through 9p, where one
//! scan then missed a wait's whole life), the following ones a lookup. Stall lines
//! are rare (one per wait per level).
//!
//! Memory is bounded by bytes: the binary is mapped (memmap2), not read whole (a
//! node's Go binaries are 50 to 150 MB; only the headers and the pclntab pages are
//! touched), and the parsed tables kept take at most [`MAX_CACHED_BYTES`] together,
//! the least recently used going first. Mapping a file is safe from a truncation
//! under it here: the file is the running executable of the process it was found
//! in, which the kernel refuses to open for writing (ETXTBSY).

use crate::proto::gosym::GoSymbols;
use blazesym::symbolize::{
    source::{Process, Source},
    Input, Symbolized, Symbolizer,
};
use std::collections::HashMap;
use std::sync::Arc;

/// The most the parsed Go tables kept take together (containerd's are about 10 MB).
pub const MAX_CACHED_BYTES: usize = 128 << 20;

/// Swept threads whose stacks are kept, at most.
const MAX_PINNED: usize = 256;

/// Names user addresses (see the module doc). Keeps its caches for the run.
pub struct UserSymbolizer {
    blaze: Symbolizer,
    /// (dev, inode) → the binary's Go symbols (None when it has none), the tick it
    /// was last used at, and its size in bytes.
    go: HashMap<(u64, u64), Cached>,
    /// The bytes the cached tables take.
    cached_bytes: usize,
    tick: u64,
    /// Stacks unwound while their thread was still blocked, by thread: a wait swept
    /// at startup may cross `--warn` only as it ends, when its thread has left it.
    pinned: HashMap<u32, Vec<String>>,
}

impl Default for UserSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

/// A binary's Go symbols (None when it has none), the tick it was last used at, and
/// its size in bytes.
type Cached = (Option<Arc<GoSymbols>>, u64, usize);

/// The mapping of one address: its file, where the file's bytes start in it.
struct Mapped {
    start: u64,
    offset: u64,
    dev: u64,
    inode: u64,
    path: String,
}

impl UserSymbolizer {
    pub fn new() -> Self {
        UserSymbolizer { blaze: Symbolizer::new(), go: HashMap::new(), cached_bytes: 0, tick: 0, pinned: HashMap::new() }
    }

    /// Names each of `ips` (innermost first, as the kernel gives them) in process `pid`.
    pub fn frames(&mut self, pid: u32, ips: &[u64]) -> Vec<String> {
        if ips.is_empty() {
            return Vec::new();
        }
        let maps = mappings(pid);
        let mut out: Vec<Option<String>> = vec![None; ips.len()];
        for (slot, ip) in out.iter_mut().zip(ips) {
            let Some(m) = maps.iter().find(|m| m.contains(*ip)) else { continue };
            let Some(go) = self.go_symbols(pid, &m.map) else { continue };
            let va = go.va_of_file_offset(ip - m.map.start + m.map.offset);
            *slot = va.and_then(|va| go.function_at(va)).map(|f| f.name);
        }
        let rest: Vec<u64> = ips.iter().zip(&out).filter(|(_, n)| n.is_none()).map(|(ip, _)| *ip).collect();
        if !rest.is_empty() {
            let src = Source::Process(Process::new(pid.into()));
            if let Ok(named) = self.blaze.symbolize(&src, Input::AbsAddr(&rest)) {
                let mut named = named.into_iter();
                for slot in out.iter_mut().filter(|n| n.is_none()) {
                    if let Some(Symbolized::Sym(sym)) = named.next() {
                        *slot = Some(sym.name.to_string());
                    }
                }
            }
        }
        ips.iter()
            .zip(out)
            .map(|(ip, name)| {
                name.unwrap_or_else(|| {
                    let file = maps.iter().find(|m| m.contains(*ip)).map(|m| m.map.path.rsplit('/').next().unwrap_or("").to_string());
                    match file {
                        Some(f) if !f.is_empty() => format!("{ip:#x} ({f})"),
                        _ => format!("{ip:#x}"),
                    }
                })
            })
            .collect()
    }

    /// The user stack of a Go thread blocked in a syscall now, unwound from outside
    /// (`/proc/TID/syscall`'s sp and pc, the pcsp tables, `/proc/PID/mem`), innermost
    /// first: for waits the kernel did not see begin (the startup sweep's). Empty for a
    /// thread not in a syscall, or a process whose executable is not Go.
    /// Frames pinned by [`UserSymbolizer::pin_blocked`] come first: they were read while
    /// the thread was still in its wait.
    pub fn blocked_go_thread(&mut self, pid: u32, tid: u32) -> Vec<String> {
        if let Some(pinned) = self.pinned.get(&tid) {
            return pinned.clone();
        }
        self.unwind_blocked(pid, tid)
    }

    /// Unwinds a swept thread's Go stack now, while it is blocked, and keeps it until
    /// [`UserSymbolizer::unpin`]. Returns how many frames it kept.
    pub fn pin_blocked(&mut self, pid: u32, tid: u32) -> usize {
        let frames = self.unwind_blocked(pid, tid);
        let n = frames.len();
        if n > 0 && self.pinned.len() < MAX_PINNED {
            self.pinned.insert(tid, frames);
        }
        n
    }

    /// Forgets a pinned stack (its wait was resolved).
    pub fn unpin(&mut self, tid: u32) {
        self.pinned.remove(&tid);
    }

    fn unwind_blocked(&mut self, pid: u32, tid: u32) -> Vec<String> {
        let Ok(exe) = std::fs::read_link(format!("/proc/{pid}/exe")) else { return Vec::new() };
        let exe = exe.to_string_lossy().into_owned();
        let maps = mappings(pid);
        let Some(m) = maps.iter().find(|m| m.map.path == exe) else { return Vec::new() };
        let Some(go) = self.go_symbols(pid, &m.map) else { return Vec::new() };
        match crate::observe::gostack::unwind_blocked_thread(pid, tid, &go) {
            Some(u) => u.names().into_iter().map(str::to_string).collect(),
            None => Vec::new(),
        }
    }

    /// Keeps the symbols of the binary `st_dev`/`inode` (as `stat` gives them), parsed
    /// elsewhere, for the stall lines of the processes running it.
    pub fn prime(&mut self, st_dev: u64, inode: u64, symbols: Arc<GoSymbols>) {
        let key = (dev_key(libc::major(st_dev), libc::minor(st_dev)), inode);
        if self.go.contains_key(&key) {
            return;
        }
        self.tick += 1;
        let size = symbols.heap_bytes();
        self.keep(key, Some(symbols), size);
    }

    fn go_symbols(&mut self, pid: u32, m: &Mapped) -> Option<Arc<GoSymbols>> {
        let key = (m.dev, m.inode);
        self.tick += 1;
        if let Some((cached, used, _)) = self.go.get_mut(&key) {
            *used = self.tick;
            return cached.clone();
        }
        // Through the process's root: its mount namespace's view of the path.
        let path = format!("/proc/{pid}/root{}", m.path);
        let began = std::time::Instant::now();
        let parsed = map_file(&path).ok().and_then(|data| GoSymbols::from_elf_named(&data, &m.path).ok()).map(Arc::new);
        // Said once per binary: a probed target's parse here means its priming missed.
        tracing::info!(
            binary = %m.path,
            dev = m.dev,
            inode = m.inode,
            go = parsed.is_some(),
            took_ms = began.elapsed().as_secs_f64() * 1e3,
            "a binary's Go symbols read on the scan loop for a user stack (not primed)"
        );
        let size = parsed.as_ref().map_or(64, |g| g.heap_bytes());
        self.keep(key, parsed.clone(), size);
        parsed
    }

    /// Caches `parsed` (`size` bytes) under `key`, making room by bytes (least recently
    /// used first); a table larger than the whole budget is not kept.
    fn keep(&mut self, key: (u64, u64), parsed: Option<Arc<GoSymbols>>, size: usize) {
        if size > MAX_CACHED_BYTES {
            return;
        }
        while self.cached_bytes + size > MAX_CACHED_BYTES {
            let Some((&oldest, _)) = self.go.iter().min_by_key(|(_, (_, used, _))| *used) else { break };
            if let Some((_, _, gone)) = self.go.remove(&oldest) {
                self.cached_bytes -= gone;
            }
        }
        self.cached_bytes += size;
        self.go.insert(key, (parsed, self.tick, size));
    }

    /// The bytes its cached tables take.
    pub fn cached_bytes(&self) -> usize {
        self.cached_bytes
    }
}

/// A device's major and minor numbers as one key (as `/proc/PID/maps` shows them).
fn dev_key(major: u32, minor: u32) -> u64 {
    (u64::from(major) << 32) | u64::from(minor)
}

/// `path` mapped read-only (see the module doc on why this is safe here).
/// The executable at `path`, mapped read-only (also the goroutine reader's way in).
pub(crate) fn map_file(path: &str) -> std::io::Result<memmap2::Mmap> {
    let file = std::fs::File::open(path)?;
    // SAFETY: a read-only private mapping of a running executable, which cannot be
    // opened for writing while it runs (ETXTBSY); the map is dropped after the parse.
    unsafe { memmap2::Mmap::map(&file) }
}

/// A file-backed executable mapping.
struct ExecMap {
    end: u64,
    map: Mapped,
}

impl ExecMap {
    fn contains(&self, ip: u64) -> bool {
        ip >= self.map.start && ip < self.end
    }
}

/// The process's file-backed executable mappings, from `/proc/PID/maps` (parsed by
/// the procfs crate; read within a deadline, as it takes the process's `mmap_lock`).
fn mappings(pid: u32) -> Vec<ExecMap> {
    use ::procfs::process::MMapPath;
    let Ok(maps) = super::bounded_read::maps(pid) else { return Vec::new() };
    maps.into_iter()
        .filter(|m| m.perms.contains(::procfs::process::MMPermissions::EXECUTE))
        .filter_map(|m| match &m.pathname {
            MMapPath::Path(path) => Some(ExecMap {
                end: m.address.1,
                map: Mapped {
                    start: m.address.0,
                    offset: m.offset,
                    dev: dev_key(m.dev.0 as u32, m.dev.1 as u32),
                    inode: m.inode,
                    path: path.to_string_lossy().into_owned(),
                },
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary primed by its `stat` is the one its processes' maps name: the two
    /// spell the device differently, and a mismatch would parse it again on the loop.
    #[test]
    fn primed_keys_are_the_maps_keys() {
        use std::os::unix::fs::MetadataExt as _;
        // The running file itself (the magic link follows it even if it was replaced on
        // disk), and the mapping of this very function's code.
        let meta = std::fs::metadata("/proc/self/exe").expect("stat our exe");
        let here = primed_keys_are_the_maps_keys as *const () as u64;
        let maps = mappings(std::process::id());
        let ours = maps.iter().find(|m| m.contains(here)).expect("our code in our maps");
        assert_eq!((dev_key(libc::major(meta.dev()), libc::minor(meta.dev())), meta.ino()), (ours.map.dev, ours.map.inode));
    }

    /// Our own stack: this test's Rust frames are named by blazesym from the test
    /// binary's symbols; an unmapped address stays hex.
    #[test]
    fn names_our_own_frames_and_keeps_unknown_ones() {
        let here = names_our_own_frames_and_keeps_unknown_ones as *const () as u64;
        let mut s = UserSymbolizer::new();
        let frames = s.frames(std::process::id(), &[here, 0x10]);
        assert_eq!(frames.len(), 2);
        assert!(frames[0].contains("names_our_own_frames_and_keeps_unknown_ones"), "{frames:?}");
        assert_eq!(frames[1], "0x10");
    }

    /// The cache holds at most MAX_CACHED_BYTES, the least recently used going first,
    /// and never a table larger than all of it.
    #[test]
    fn the_cache_is_bounded_by_bytes() {
        let mut s = UserSymbolizer::new();
        let third = MAX_CACHED_BYTES / 3;
        for k in 0..3 {
            s.tick += 1;
            s.keep((k, k), None, third);
        }
        s.tick += 1;
        s.go.get_mut(&(0, 0)).unwrap().1 = s.tick; // 0 used again: 1 is now the oldest
        s.tick += 1;
        s.keep((9, 9), None, third);
        assert!(s.cached_bytes() <= MAX_CACHED_BYTES);
        assert!(s.go.contains_key(&(0, 0)) && !s.go.contains_key(&(1, 1)) && s.go.contains_key(&(9, 9)));
        s.keep((10, 10), None, MAX_CACHED_BYTES + 1);
        assert!(!s.go.contains_key(&(10, 10)) && s.cached_bytes() <= MAX_CACHED_BYTES);
    }
}
