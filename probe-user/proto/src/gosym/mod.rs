//! Go symbols and Go-safe return probe points for **stripped** Go binaries.
//!
//! Release builds of kubelet, containerd and runc are linked with `-s -w`:
//! no `.symtab`, no DWARF. The Go runtime's own function table (`pclntab`)
//! is still there, because tracebacks need it; this module reads it to name
//! functions and find their entry addresses, converts addresses to the file
//! offsets uprobes take, and finds every RET so that plegwatch never needs a
//! uretprobe on Go code (those crash Go when a goroutine stack moves).
//! For reading a live process's goroutines from outside, [`allgs`] finds the
//! goroutine list's variables from the code and [`gstruct`] gives the layout
//! of `runtime.g` and the wait reasons' names per Go version.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use plegwatch_proto::gosym::GoBinary;
//! // The caller reads the file (plegwatch: `observe::go_binary::read`).
//! let path = "/usr/bin/containerd";
//! let bin = GoBinary::parse_named(std::fs::read(path)?, path)?;
//! let pts = bin.probe_points(
//!     "github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).UpdateSync",
//! )?;
//! println!("entry at {:#x}, {} RETs", pts.entry_offset, pts.ret_offsets.len());
//! # Ok(()) }
//! ```
//!
//! Checked on Debian's containerd 1.6.20, containerd-shim-runc-v2 and runc
//! 1.1 (all Go 1.19.8), and on Go 1.19 binaries built in the tests (static,
//! internally linked PIE, externally linked PIE). Layouts for Go 1.2–1.17
//! and 1.20+ follow Go's `debug/gosym` and are covered by synthetic tables.

pub mod allgs;
pub mod elf;
pub mod gdecode;
pub mod gstruct;
mod moduledata;
pub mod pclntab;
pub mod pcvalue;
pub mod rets;
pub mod tls;
pub mod unwind;
pub mod version;

#[cfg(test)]
mod synth;
#[cfg(test)]
mod tests;

pub use allgs::{find_allgs, AllGs, AllGsError};
pub use elf::{file_offset, Elf};
pub use gstruct::{layout_for, GLayout, GStatus, GStructError};
pub use pclntab::{PclnVersion, Pclntab, TableSource};
pub use pcvalue::{PcRun, PcValueError};
pub use rets::{probe_points, probe_points_in, ret_addresses, ret_addresses_in, ProbePoints};
pub use tls::{g_tls_offset, GTls, TlsSource};
pub use unwind::{unwind, unwind_frame_pointers, Frame, ReadMem, Regs, Stop, Unwound};
pub use version::{BuildInfo, Module};

/// How a binary given only as bytes is named in errors.
pub(crate) const IN_MEMORY: &str = "<in-memory ELF>";

/// Errors from reading Go symbols. Each names the binary (its path, or
/// `<in-memory ELF>` when only bytes were given).
#[derive(Debug, thiserror::Error)]
pub enum GoSymError {
    /// The file could not be read (by the caller, who read the bytes:
    /// plegwatch's `observe::go_binary::read`).
    #[error("{binary}: cannot read: {source}")]
    Io {
        binary: String,
        #[source]
        source: std::io::Error,
    },
    /// No ELF magic or an unsupported ELF class/encoding.
    #[error("{binary}: not an ELF file")]
    NotElf { binary: String },
    /// The ELF headers do not fit the file.
    #[error("{binary}: malformed ELF: {reason}")]
    MalformedElf { binary: String, reason: String },
    /// Neither a `.gopclntab` section nor a valid pclntab header anywhere.
    #[error("{binary}: a stripped or non-Go binary: no .gopclntab and no pclntab magic in .data.rel.ro")]
    NoPclntab { binary: String },
    /// A `.gopclntab` section with a magic this parser does not know.
    #[error(
        "{binary}: {section}: unsupported pclntab version (magic {magic:#010x}; \
         known: Go 1.2-1.15, 1.16-1.17, 1.18-1.19, 1.20+)"
    )]
    UnsupportedVersion { binary: String, section: String, magic: u32 },
    /// An offset or count in the table points outside it.
    #[error("{binary}: {section}: {what} at {offset:#x} is out of bounds ({len:#x} bytes available)")]
    OutOfBounds { binary: String, section: String, what: String, offset: u64, len: u64 },
    /// The table is inconsistent.
    #[error("{binary}: {section}: corrupt pclntab: {reason}")]
    CorruptPclntab { binary: String, section: String, reason: String },
    /// No function has that exact name.
    #[error("{binary}: function {function} not found in the pclntab")]
    FunctionNotFound { binary: String, function: String },
    /// No code that loads `g` from thread-local storage was recognised.
    #[error("{binary}: cannot tell where g sits in thread-local storage (runtime.stackcheck not recognised)")]
    NoGTls { binary: String },
    /// An address of the function is not backed by the file (or not in an
    /// executable segment).
    #[error("{binary}: {function}: address {va:#x} is not in an executable PT_LOAD segment of the file")]
    NotInFile { binary: String, function: String, va: u64 },
    /// The function's bytes do not decode as instructions.
    #[error("{binary}: {function}: undecodable instruction at {va:#x}; refusing to place probes")]
    Decode { binary: String, function: String, va: u64 },
    /// A branch inside the function lands between decoded instructions:
    /// data in the code (hand-written assembly), so the RETs are unknown.
    #[error(
        "{binary}: {function}: branch target {va:#x} is not an instruction start \
         (data in code?); refusing to place probes"
    )]
    DataInCode { binary: String, function: String, va: u64 },
    /// The function is not a plain string getter (`return x.Field`).
    #[error("{binary}: {function} is not a string field getter (no `mov r, [rax+off]` pair)")]
    NotAGetter { binary: String, function: String },
    /// The function takes no read lock on its receiver (no inlined `RLock`).
    #[error("{binary}: {function} takes no RLock on its receiver (no `lock xadd [rax+off]`)")]
    NoRLock { binary: String, function: String },
    /// The function takes no lock on a `sync.Mutex` in its receiver (no inlined `Lock`).
    #[error("{binary}: {function} locks no sync.Mutex in its receiver (no `lock cmpxchg [rax+off]`)")]
    NoLock { binary: String, function: String },
    /// RET finding is implemented for x86 only.
    #[error("{binary}: RET probes are not supported for ELF machine {machine}")]
    UnsupportedArch { binary: String, machine: u16 },
}

/// One Go function from the pclntab.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct GoFunc {
    /// The full symbol name, e.g.
    /// `github.com/containerd/containerd/pkg/cri/server.(*criService).ListContainers`.
    pub name: String,
    /// The entry PC: a link-time virtual address (relative to the load base
    /// for a PIE). Use [`Elf::file_offset`] for a uprobe.
    pub entry: u64,
    /// The next function's entry (or the table's end PC for the last one):
    /// the range `[entry, end)` includes the INT3 padding after the code.
    pub end: u64,
}

/// The Go symbols of one binary: its pclntab, ELF headers and build info.
/// Owns everything it needs (no borrow of the file's bytes).
#[derive(Debug)]
pub struct GoSymbols {
    elf: Elf,
    table: Pclntab,
    build_info: Option<BuildInfo>,
}

impl GoSymbols {
    /// Parses the ELF headers, pclntab and build info from `data`.
    pub fn from_elf(data: &[u8]) -> Result<GoSymbols, GoSymError> {
        Self::from_elf_named(data, IN_MEMORY)
    }

    /// As [`GoSymbols::from_elf`], naming the binary `binary` in errors.
    pub fn from_elf_named(data: &[u8], binary: &str) -> Result<GoSymbols, GoSymError> {
        let elf = Elf::parse(data, binary)?;
        let table = Pclntab::from_elf(&elf, data)?;
        let build_info = BuildInfo::from_elf(&elf, data);
        Ok(GoSymbols { elf, table, build_info })
    }

    /// Every function, in address order.
    pub fn functions(&self) -> impl Iterator<Item = GoFunc> + '_ {
        self.table.functions()
    }

    /// The function called exactly `name`. The first call builds a name
    /// index (a few ms for ~50k functions).
    pub fn lookup(&self, name: &str) -> Option<GoFunc> {
        self.table.lookup(name)
    }

    /// Every function called exactly `name`, in address order: the
    /// instantiations of a generic function share one name (`pkg.F[...]`).
    pub fn lookup_all(&self, name: &str) -> Vec<GoFunc> {
        self.table.lookup_all(name)
    }

    /// As [`GoSymbols::lookup`], with an error naming the binary and function.
    pub fn require(&self, name: &str) -> Result<GoFunc, GoSymError> {
        self.lookup(name).ok_or_else(|| GoSymError::FunctionNotFound { binary: self.elf.binary().to_string(), function: name.to_string() })
    }

    /// The function whose `[entry, end)` holds the link-time address `va`.
    pub fn function_at(&self, va: u64) -> Option<GoFunc> {
        self.table.function_at(va)
    }

    /// True when the function holding the link-time address `va` is
    /// compiler-generated glue a Go traceback does not print (`funcID` is
    /// `wrapper`): method wrappers, `go`/`defer` closures (`main.main.gowrap1`),
    /// hash and equality functions. The `funcID` numbering changes between
    /// releases, but in every one since 1.16 `wrapper` directly follows
    /// `systemstack_switch`, so it is read off `runtime.systemstack_switch`.
    /// False when that function is missing or the layout has no `funcID`
    /// (Go 1.2–1.15).
    pub fn is_wrapper(&self, va: u64) -> bool {
        let Some(switch) = self.table.lookup("runtime.systemstack_switch") else { return false };
        match (self.table.func_id_at(switch.entry), self.table.func_id_at(va)) {
            (Some(s), Some(id)) => s != 0 && id == s.wrapping_add(1),
            _ => false,
        }
    }

    /// The SP delta at the link-time address `pc`, from the function's
    /// `pcsp` table: the bytes between SP and the return address (0 at a
    /// function's entry; see [`pcvalue`]). `None` if no function holds `pc`,
    /// it has no table, the table does not reach `pc`, or the value is
    /// negative (never for a real frame).
    pub fn frame_size_at(&self, pc: u64) -> Option<u64> {
        let (entry, bytes) = self.table.pcsp_table(pc)?;
        let v = pcvalue::value_at(bytes, entry, self.table.min_lc(), pc)?;
        u64::try_from(v).ok()
    }

    /// Every run of the `pcsp` table of the function holding `pc`, decoded
    /// to its end marker (`Ok(empty)` if the function has no table).
    pub fn pcsp_runs(&self, pc: u64) -> Result<Vec<PcRun>, PcValueError> {
        let Some((entry, bytes)) = self.table.pcsp_table(pc) else {
            return Ok(Vec::new());
        };
        pcvalue::runs(bytes, entry, self.table.min_lc()).collect()
    }

    /// The link-time address of the byte at file offset `offset` (a load segment's bytes).
    pub fn va_of_file_offset(&self, offset: u64) -> Option<u64> {
        self.elf.load_segments().find(|s| offset >= s.offset && offset - s.offset < s.filesz).map(|s| offset - s.offset + s.vaddr)
    }

    /// Number of functions in the table.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// True if the table lists no function.
    pub fn is_empty(&self) -> bool {
        self.table.is_empty()
    }

    /// The Go toolchain version, e.g. `go1.19.8`, from `.go.buildinfo`.
    pub fn version(&self) -> Option<String> {
        self.build_info.as_ref().map(|b| b.go_version.clone())
    }

    /// The whole build info (module path, dependencies, build settings).
    pub fn build_info(&self) -> Option<&BuildInfo> {
        self.build_info.as_ref()
    }

    /// The main module as `(path, version)`, if the binary records one
    /// (module-mode builds; not Debian's GOPATH-mode packages).
    pub fn main_module(&self) -> Option<(&str, &str)> {
        let m = self.build_info.as_ref()?.main.as_ref()?;
        Some((m.path.as_str(), m.version.as_str()))
    }

    /// About how many bytes it holds on the heap (its tables; the ELF headers are small).
    pub fn heap_bytes(&self) -> usize {
        self.table.heap_bytes() + 4096
    }

    /// The parsed pclntab (layout version, `textStart`, where it was found).
    pub fn pclntab(&self) -> &Pclntab {
        &self.table
    }

    /// The ELF headers (file offsets, PIE, PT_TLS).
    pub fn elf(&self) -> &Elf {
        &self.elf
    }

    /// Uprobe points (entry and every RET, as file offsets) of the function
    /// `name`; `data` must be the bytes this was parsed from.
    pub fn probe_points(&self, data: &[u8], name: &str) -> Result<ProbePoints, GoSymError> {
        let f = self.require(name)?;
        probe_points_in(&self.elf, data, &f)
    }
}

/// A Go binary's bytes with its symbols: the convenient form when the
/// probes need file offsets for several functions.
#[derive(Debug)]
pub struct GoBinary {
    path: String,
    data: Vec<u8>,
    symbols: GoSymbols,
}

impl GoBinary {
    /// Parses a binary given only as bytes (named `<in-memory ELF>` in errors).
    pub fn parse(data: Vec<u8>) -> Result<GoBinary, GoSymError> {
        Self::parse_named(data, IN_MEMORY)
    }

    /// Parses `data`, the bytes of the binary `path` (the name its errors give).
    pub fn parse_named(data: Vec<u8>, path: &str) -> Result<GoBinary, GoSymError> {
        let symbols = GoSymbols::from_elf_named(&data, path)?;
        Ok(GoBinary { path: path.to_string(), data, symbols })
    }

    /// The path it was read from (as given to [`GoBinary::parse_named`]).
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The file's bytes.
    pub fn data(&self) -> &[u8] {
        &self.data
    }

    /// The parsed symbols.
    pub fn symbols(&self) -> &GoSymbols {
        &self.symbols
    }

    /// The parsed symbols, the file's bytes dropped.
    pub fn into_symbols(self) -> GoSymbols {
        self.symbols
    }

    /// Uprobe points of the function `name`.
    pub fn probe_points(&self, name: &str) -> Result<ProbePoints, GoSymError> {
        self.symbols.probe_points(&self.data, name)
    }

    /// The file offset of the entry of `name`, for an entry-only probe (no
    /// RETs decoded: a function like `runtime.goexit0` never returns).
    pub fn entry_offset(&self, name: &str) -> Result<u64, GoSymError> {
        let f = self.symbols.require(name)?;
        self.symbols.elf.file_offset(f.entry).ok_or_else(|| GoSymError::NotInFile {
            binary: self.path.clone(),
            function: f.name.clone(),
            va: f.entry,
        })
    }

    /// Where `g` sits in thread-local storage (see [`tls`]).
    pub fn g_tls(&self) -> Result<GTls, GoSymError> {
        g_tls_offset(&self.symbols, &self.data)
    }
}

impl GoBinary {
    /// The offset of the `string` field that the getter `name` returns
    /// (`func (x *T) GetID() string { if x != nil { return x.ID }; return "" }`,
    /// as protoc-gen-go and gogo write it): its first load off the receiver
    /// (RAX), `mov r, [rax+off]`, followed by the length at `off+8`. This
    /// reads the layout from the binary itself, whichever generator made it.
    pub fn string_getter_offset(&self, name: &str) -> Result<u64, GoSymError> {
        let f = self.symbols.require(name)?;
        let len = f.end.saturating_sub(f.entry).min(64);
        let not_found = || GoSymError::NotAGetter { binary: self.path.clone(), function: name.to_string() };
        let bytes = self.symbols.elf.read_va(&self.data, f.entry, len).ok_or_else(not_found)?;
        let mut d = iced_x86::Decoder::with_ip(64, bytes, f.entry, iced_x86::DecoderOptions::NONE);
        let mut loads = Vec::new();
        for _ in 0..6 {
            if !d.can_decode() {
                break;
            }
            let i = d.decode();
            if i.mnemonic() == iced_x86::Mnemonic::Ret {
                break;
            }
            if i.mnemonic() == iced_x86::Mnemonic::Mov
                && i.op_count() == 2
                && i.op0_kind() == iced_x86::OpKind::Register
                && i.op1_kind() == iced_x86::OpKind::Memory
                && i.memory_base() == iced_x86::Register::RAX
                && i.memory_index() == iced_x86::Register::None
            {
                loads.push(i.memory_displacement64());
            }
        }
        match loads.as_slice() {
            [off, len, ..] if *len == off.wrapping_add(8) => Ok(*off),
            _ => Err(not_found()),
        }
    }

    /// The offset, in its receiver, of the `sync.RWMutex` that method `name` read-locks
    /// (`func (c *Container) State() *ContainerState { c.opLock.RLock(); defer ... }`):
    /// `RLock` is inlined as `lock xadd [rax+off+16], r32` (`atomic.AddInt32(&rw.readerCount, 1)`,
    /// `readerCount` 16 bytes into the lock from Go 1.9 to 1.26), the first locked
    /// add off the receiver in the function. So a lock inside a struct is found in the
    /// binary itself, however the struct's fields move between releases.
    pub fn rlock_field_offset(&self, name: &str) -> Result<u64, GoSymError> {
        const READER_COUNT_OFF: u64 = 16;
        let f = self.symbols.require(name)?;
        let len = f.end.saturating_sub(f.entry).min(256);
        let not_found = || GoSymError::NoRLock { binary: self.path.clone(), function: name.to_string() };
        let bytes = self.symbols.elf.read_va(&self.data, f.entry, len).ok_or_else(not_found)?;
        let mut d = iced_x86::Decoder::with_ip(64, bytes, f.entry, iced_x86::DecoderOptions::NONE);
        while d.can_decode() {
            let i = d.decode();
            if i.mnemonic() == iced_x86::Mnemonic::Ret {
                break;
            }
            if i.mnemonic() == iced_x86::Mnemonic::Xadd
                && i.has_lock_prefix()
                && i.op0_kind() == iced_x86::OpKind::Memory
                && i.memory_base() == iced_x86::Register::RAX
                && i.memory_index() == iced_x86::Register::None
            {
                return i.memory_displacement64().checked_sub(READER_COUNT_OFF).ok_or_else(not_found);
            }
        }
        Err(not_found())
    }

    /// The offset, in its receiver, of the `sync.Mutex` that method `name` locks
    /// (`func (l *local) syncPlugin(...) error { l.Lock(); defer l.Unlock(); ... }`).
    /// `Lock`'s fast path is inlined as `lock cmpxchg [r+off], r32`
    /// (`atomic.CompareAndSwapInt32(&m.state, 0, mutexLocked)`, `state` first in the lock),
    /// where `r` is RAX or a register the receiver was copied to (RAX itself must be
    /// zeroed for the CAS): see [`mutex_cas_offset`].
    pub fn lock_field_offset(&self, name: &str) -> Result<u64, GoSymError> {
        let f = self.symbols.require(name)?;
        let len = f.end.saturating_sub(f.entry).min(256);
        let not_found = || GoSymError::NoLock { binary: self.path.clone(), function: name.to_string() };
        let bytes = self.symbols.elf.read_va(&self.data, f.entry, len).ok_or_else(not_found)?;
        mutex_cas_offset(bytes, f.entry).ok_or_else(not_found)
    }
}

/// The displacement of the first `lock cmpxchg [r+disp], r32` in `code` (at `ip`) whose
/// base `r` holds the function's receiver: RAX on entry, and any register a
/// `mov r64, r64` copies it to, until something else is written there; a call ends the
/// search (every register is the callee's then). Reads up to the first RET.
pub fn mutex_cas_offset(code: &[u8], ip: u64) -> Option<u64> {
    use iced_x86::{Mnemonic, OpKind, Register};
    /// The 64-bit register a 32- or 64-bit general register is part of.
    fn gpr64(r: Register) -> Register {
        const PAIRS: [(Register, Register); 16] = [
            (Register::EAX, Register::RAX),
            (Register::ECX, Register::RCX),
            (Register::EDX, Register::RDX),
            (Register::EBX, Register::RBX),
            (Register::ESP, Register::RSP),
            (Register::EBP, Register::RBP),
            (Register::ESI, Register::RSI),
            (Register::EDI, Register::RDI),
            (Register::R8D, Register::R8),
            (Register::R9D, Register::R9),
            (Register::R10D, Register::R10),
            (Register::R11D, Register::R11),
            (Register::R12D, Register::R12),
            (Register::R13D, Register::R13),
            (Register::R14D, Register::R14),
            (Register::R15D, Register::R15),
        ];
        PAIRS.iter().find(|(r32, _)| *r32 == r).map_or(r, |(_, r64)| *r64)
    }
    let mut receiver = vec![Register::RAX];
    let mut d = iced_x86::Decoder::with_ip(64, code, ip, iced_x86::DecoderOptions::NONE);
    while d.can_decode() {
        let i = d.decode();
        match i.mnemonic() {
            Mnemonic::Ret | Mnemonic::Call => return None,
            Mnemonic::Cmpxchg
                if i.has_lock_prefix()
                    && i.op0_kind() == OpKind::Memory
                    && i.memory_index() == Register::None
                    && receiver.contains(&i.memory_base()) =>
            {
                return Some(i.memory_displacement64());
            }
            _ => {}
        }
        if i.op_count() == 0 || i.op0_kind() != OpKind::Register {
            continue;
        }
        let dst = gpr64(i.op0_register());
        let copies_receiver =
            i.mnemonic() == Mnemonic::Mov && i.op_count() == 2 && i.op1_kind() == OpKind::Register && receiver.contains(&i.op1_register());
        receiver.retain(|r| *r != dst);
        if copies_receiver {
            receiver.push(dst);
        }
    }
    None
}
