//! Go's `pclntab`: the runtime's own function table, which survives `-s -w`.
//!
//! Layouts (from Go's `debug/gosym` and `runtime/symtab.go`):
//!
//! * **Go 1.2–1.15** (magic `0xfffffffb`): `magic u32, 0, 0, minLC u8,
//!   ptrSize u8, nfunc uintptr`, then `functab` right after the header:
//!   `nfunc` pairs `(entry pc, funcoff)` of pointer size and one end PC. Every
//!   offset (`funcoff`, a `_func`'s `nameoff`) is from the start of the table.
//! * **Go 1.16–1.17** (`0xfffffffa`): `magic, 0, 0, minLC, ptrSize, nfunc,
//!   nfiles, funcnameOffset, cuOffset, filetabOffset, pctabOffset,
//!   pclnOffset` (words of pointer size). `functab` (at `pclnOffset`) holds
//!   pointer-size `(entry pc, funcoff)` pairs and an end PC; `funcoff` is from
//!   `pclnOffset`; a `_func` is `entry uintptr, nameoff int32, ...` and
//!   `nameoff` is an offset into `funcnametab`.
//! * **Go 1.18–1.19** (`0xfffffff0`) and **1.20+** (`0xfffffff1`): as 1.16,
//!   with `textStart` inserted after `nfiles`; `functab` entries are two
//!   `uint32`: `(entryoff, funcoff)`, with `entryoff` from `textStart`; a
//!   `_func` starts `entryoff uint32, nameoff int32`.
//!
//! The table is found as the `.gopclntab` section (`.data.rel.ro.gopclntab`
//! in internally linked PIEs), else by scanning `.data.rel.ro` (externally
//! linked PIEs), else every PT_LOAD segment, for a header that validates.
//!
//! Everything read from the file is bounds-checked. Allocations are bounded by
//! the input: `nfunc` is checked against the room its `functab` needs before
//! anything is reserved.

use std::sync::OnceLock;

use super::elf::{read_uint, Elf, PF_X};
use super::{GoFunc, GoSymError};

/// Go 1.2–1.15.
pub const MAGIC_GO12: u32 = 0xffff_fffb;
/// Go 1.16–1.17.
pub const MAGIC_GO116: u32 = 0xffff_fffa;
/// Go 1.18–1.19.
pub const MAGIC_GO118: u32 = 0xffff_fff0;
/// Go 1.20 and later (checked up to 1.26).
pub const MAGIC_GO120: u32 = 0xffff_fff1;

/// Candidate headers fully parsed while scanning before giving up.
const MAX_SCAN_ATTEMPTS: usize = 16;

/// Which pclntab layout a binary uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PclnVersion {
    /// Go 1.2–1.15 (`0xfffffffb`).
    Go12,
    /// Go 1.16–1.17 (`0xfffffffa`).
    Go116,
    /// Go 1.18–1.19 (`0xfffffff0`).
    Go118,
    /// Go 1.20+ (`0xfffffff1`).
    Go120,
}

impl PclnVersion {
    /// The layout for a header magic, if known.
    pub fn from_magic(magic: u32) -> Option<PclnVersion> {
        match magic {
            MAGIC_GO12 => Some(PclnVersion::Go12),
            MAGIC_GO116 => Some(PclnVersion::Go116),
            MAGIC_GO118 => Some(PclnVersion::Go118),
            MAGIC_GO120 => Some(PclnVersion::Go120),
            _ => None,
        }
    }

    /// The Go releases that write this layout, for messages.
    pub fn go_releases(self) -> &'static str {
        match self {
            PclnVersion::Go12 => "Go 1.2-1.15",
            PclnVersion::Go116 => "Go 1.16-1.17",
            PclnVersion::Go118 => "Go 1.18-1.19",
            PclnVersion::Go120 => "Go 1.20+",
        }
    }
}

/// Where the table was found, for messages and `plegwatch doctor`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSource {
    /// The section name (`.gopclntab`, `.data.rel.ro`, ...) or
    /// `PT_LOAD@0x...` when found by scanning a segment.
    pub region: String,
    /// The table's virtual address.
    pub va: u64,
    /// The table's file offset.
    pub file_offset: u64,
    /// True if found by scanning for the magic rather than by section name.
    pub scanned: bool,
}

/// One function: its entry PC and where its name is in `names`.
#[derive(Debug, Clone, Copy)]
struct FuncRec {
    entry: u64,
    name_off: u32,
    name_len: u32,
    /// Offset of the function's pcsp table in `pctab` (0: none).
    pcsp: u32,
    /// `_func.funcID` (0, "normal", for the Go 1.2–1.15 layout, not read).
    func_id: u8,
}

/// A parsed pclntab: function entries and names, owned (no borrow of the file).
#[derive(Debug)]
pub struct Pclntab {
    version: PclnVersion,
    ptr_size: u8,
    min_lc: u8,
    text_start: u64,
    source: TableSource,
    /// The bytes the name offsets point into (`funcnametab`, or the whole
    /// table for Go 1.2–1.15).
    names: Box<[u8]>,
    /// The bytes the pc-value offsets point into (`pctab`, or the whole table
    /// for Go 1.2–1.15).
    pctab: Box<[u8]>,
    /// Sorted by entry (checked while parsing).
    funcs: Vec<FuncRec>,
    /// The end sentinel: the PC just past the last function.
    end: u64,
    /// Indices into `funcs`, sorted by name; built on the first lookup.
    by_name: OnceLock<Vec<u32>>,
}

/// The fields of a header, before the function table is read.
#[derive(Debug, Clone, Copy)]
struct Header {
    version: PclnVersion,
    min_lc: u8,
    ptr_size: u8,
    nfunc: u64,
    /// Go 1.18+: the raw `textStart` word and its offset in the table.
    text_start: Option<(u64, usize)>,
    /// `funcnametab` range (Go 1.16+); the whole table for Go 1.2.
    names: (usize, usize),
    /// `pctab` range (Go 1.16+); the whole table for Go 1.2.
    pctab: (usize, usize),
    /// Offset of `functab` in the table.
    functab: usize,
    /// Offset that `funcoff` values are relative to.
    funcdata: usize,
}

struct Ctx<'a> {
    binary: &'a str,
    region: &'a str,
    big: bool,
}

impl Ctx<'_> {
    fn oob(&self, what: &str, offset: u64, len: usize) -> GoSymError {
        GoSymError::OutOfBounds {
            binary: self.binary.to_string(),
            section: self.region.to_string(),
            what: what.to_string(),
            offset,
            len: len as u64,
        }
    }

    fn corrupt(&self, reason: String) -> GoSymError {
        GoSymError::CorruptPclntab { binary: self.binary.to_string(), section: self.region.to_string(), reason }
    }

    fn uint(&self, b: &[u8], off: usize, size: u8, what: &str) -> Result<u64, GoSymError> {
        read_uint(b, off, size, self.big).ok_or_else(|| self.oob(what, off as u64, b.len()))
    }
}

/// Offset of `x` as a `usize` inside a table of `len` bytes.
fn in_table(ctx: &Ctx<'_>, x: u64, len: usize, what: &str) -> Result<usize, GoSymError> {
    match usize::try_from(x) {
        Ok(v) if v <= len => Ok(v),
        _ => Err(ctx.oob(what, x, len)),
    }
}

/// Reads and checks a header at the start of `t`. `Ok(None)` if the magic is
/// not a pclntab magic at all.
fn parse_header(ctx: &Ctx<'_>, t: &[u8]) -> Result<Option<Header>, GoSymError> {
    let magic = ctx.uint(t, 0, 4, "header magic")? as u32;
    let Some(version) = PclnVersion::from_magic(magic) else {
        return Ok(None);
    };
    let (pad1, pad2, min_lc, ptr_size) = match t.get(4..8) {
        Some(&[a, b, c, d]) => (a, b, c, d),
        _ => return Err(ctx.oob("header", 4, t.len())),
    };
    if pad1 != 0 || pad2 != 0 || !matches!(min_lc, 1 | 2 | 4) || !matches!(ptr_size, 4 | 8) {
        return Err(ctx.corrupt(format!("bad header after magic {magic:#x}: pad {pad1},{pad2} minLC {min_lc} ptrSize {ptr_size}")));
    }
    let ps = usize::from(ptr_size);
    let word = |i: usize, what: &str| ctx.uint(t, 8 + i * ps, ptr_size, what);
    let nfunc = word(0, "nfunc")?;
    let fw = match version {
        PclnVersion::Go12 | PclnVersion::Go116 => ps,
        PclnVersion::Go118 | PclnVersion::Go120 => 4,
    };
    let header = match version {
        PclnVersion::Go12 => {
            let functab = 8 + ps;
            Header { version, min_lc, ptr_size, nfunc, text_start: None, names: (0, t.len()), pctab: (0, t.len()), functab, funcdata: 0 }
        }
        PclnVersion::Go116 | PclnVersion::Go118 | PclnVersion::Go120 => {
            let (text_start, first) =
                if version == PclnVersion::Go116 { (None, 2) } else { (Some((word(2, "textStart")?, 8 + 2 * ps)), 3) };
            let mut offs = [0usize; 5];
            let names = ["funcnameOffset", "cuOffset", "filetabOffset", "pctabOffset", "pclnOffset"];
            let header_len = 8 + (first + 5) * ps;
            for (i, slot) in offs.iter_mut().enumerate() {
                let v = word(first + i, names[i])?;
                *slot = in_table(ctx, v, t.len(), names[i])?;
            }
            // The linker writes the tables in this order, right after the header.
            if offs[0] < header_len || offs.windows(2).any(|w| w[0] > w[1]) {
                return Err(ctx.corrupt(format!("header offsets out of order: {offs:x?} (header is {header_len} bytes)")));
            }
            Header {
                version,
                min_lc,
                ptr_size,
                nfunc,
                text_start,
                names: (offs[0], offs[1]),
                pctab: (offs[3], offs[4]),
                functab: offs[4],
                funcdata: offs[4],
            }
        }
    };
    // functab: nfunc pairs plus the end sentinel. Checked before anything is
    // reserved, so nfunc is bounded by the input size.
    let need = header.nfunc.checked_mul(2).and_then(|n| n.checked_add(1)).and_then(|n| n.checked_mul(fw as u64));
    let room = (t.len() - header.functab.min(t.len())) as u64;
    match need {
        Some(n) if n <= room => {}
        _ => return Err(ctx.corrupt(format!("nfunc {} needs a functab larger than the {room} bytes left", header.nfunc))),
    }
    Ok(Some(header))
}

impl Pclntab {
    /// The bytes it holds on the heap: its names, its pc-value tables and its index.
    pub fn heap_bytes(&self) -> usize {
        self.names.len()
            + self.pctab.len()
            + self.funcs.capacity() * std::mem::size_of::<FuncRec>()
            + self.by_name.get().map_or(0, |v| v.capacity() * std::mem::size_of::<u32>())
    }

    /// Finds and parses the pclntab of `elf` (whose bytes are `data`).
    pub fn from_elf(elf: &Elf, data: &[u8]) -> Result<Pclntab, GoSymError> {
        let binary = elf.binary();
        // 1. By section name.
        for name in [".gopclntab", ".data.rel.ro.gopclntab"] {
            let Some(sec) = elf.section(name) else {
                continue;
            };
            let Some(bytes) = elf.section_data(data, sec) else {
                return Err(GoSymError::OutOfBounds {
                    binary: binary.to_string(),
                    section: name.to_string(),
                    what: "section data".to_string(),
                    offset: sec.offset,
                    len: data.len() as u64,
                });
            };
            let ctx = Ctx { binary, region: name, big: elf.is_big_endian() };
            let source = TableSource { region: name.to_string(), va: sec.addr, file_offset: sec.offset, scanned: false };
            return match parse_header(&ctx, bytes)? {
                Some(h) => parse_table(&ctx, elf, data, bytes, h, source),
                None => Err(GoSymError::UnsupportedVersion {
                    binary: binary.to_string(),
                    section: name.to_string(),
                    magic: read_uint(bytes, 0, 4, elf.is_big_endian()).unwrap_or(0) as u32,
                }),
            };
        }
        // 2. Scan .data.rel.ro (externally linked PIEs), then 3. every PT_LOAD.
        let mut regions: Vec<(String, u64, u64, &[u8])> = Vec::new();
        for sec in elf.sections() {
            if sec.name.starts_with(".data.rel.ro") {
                if let Some(b) = elf.section_data(data, sec) {
                    regions.push((sec.name.clone(), sec.addr, sec.offset, b));
                }
            }
        }
        let mut segs: Vec<_> = elf.load_segments().collect();
        // Data segments first: that is where a pclntab lives in modern layouts.
        segs.sort_by_key(|s| s.flags & PF_X != 0);
        for seg in segs {
            let b = elf.segment_data(data, seg);
            regions.push((format!("PT_LOAD@{:#x}", seg.vaddr), seg.vaddr, seg.offset, b));
        }
        let mut first_err = None;
        let mut attempts = 0usize;
        'regions: for (region, va, off, bytes) in &regions {
            let ctx = Ctx { binary, region, big: elf.is_big_endian() };
            // The header is at least 4-aligned in every layout.
            let mut pos = ((4 - (va % 4)) % 4) as usize;
            while pos + 8 <= bytes.len() {
                if is_candidate(&bytes[pos..pos + 8], ctx.big) {
                    let t = &bytes[pos..];
                    let source = TableSource {
                        region: region.clone(),
                        va: va.wrapping_add(pos as u64),
                        file_offset: off.wrapping_add(pos as u64),
                        scanned: true,
                    };
                    let parsed = parse_header(&ctx, t).and_then(|h| match h {
                        Some(h) => parse_table(&ctx, elf, data, t, h, source),
                        None => Err(ctx.corrupt("no magic".to_string())),
                    });
                    match parsed {
                        Ok(p) => return Ok(p),
                        Err(e) => {
                            first_err.get_or_insert(e);
                            // A Go binary holds one table. Bound the work a
                            // crafted file full of near-miss headers can cause.
                            attempts += 1;
                            if attempts >= MAX_SCAN_ATTEMPTS {
                                break 'regions;
                            }
                        }
                    }
                }
                pos += 4;
            }
        }
        // A candidate that looked right but did not parse says more than
        // "not Go", but only if no section table exists to tell us otherwise.
        match first_err {
            Some(e) if elf.sections().is_empty() => Err(e),
            _ => Err(GoSymError::NoPclntab { binary: binary.to_string() }),
        }
    }

    /// The layout version.
    pub fn version(&self) -> PclnVersion {
        self.version
    }

    /// Pointer size recorded in the header (4 or 8).
    pub fn ptr_size(&self) -> u8 {
        self.ptr_size
    }

    /// The PC quantum (`minLC`): 1 on x86, 4 on arm64.
    pub fn min_lc(&self) -> u8 {
        self.min_lc
    }

    /// `runtime.text`, the base of Go 1.18+ entry offsets (0 for older tables).
    pub fn text_start(&self) -> u64 {
        self.text_start
    }

    /// Where the table was found.
    pub fn source(&self) -> &TableSource {
        &self.source
    }

    /// Number of functions.
    pub fn len(&self) -> usize {
        self.funcs.len()
    }

    /// True if the table lists no function.
    pub fn is_empty(&self) -> bool {
        self.funcs.is_empty()
    }

    fn name_bytes(&self, i: usize) -> &[u8] {
        let Some(f) = self.funcs.get(i) else {
            return &[];
        };
        let start = f.name_off as usize;
        self.names.get(start..start + f.name_len as usize).unwrap_or(&[])
    }

    fn func(&self, i: usize) -> Option<GoFunc> {
        let f = self.funcs.get(i)?;
        let end = self.funcs.get(i + 1).map_or(self.end, |n| n.entry);
        Some(GoFunc { name: String::from_utf8_lossy(self.name_bytes(i)).into_owned(), entry: f.entry, end })
    }

    /// Every function, in address order.
    pub fn functions(&self) -> impl Iterator<Item = GoFunc> + '_ {
        (0..self.funcs.len()).filter_map(move |i| self.func(i))
    }

    /// Indices sorted by (name, index), built on first use.
    fn name_index(&self) -> &[u32] {
        self.by_name.get_or_init(|| {
            let mut idx: Vec<u32> = (0..self.funcs.len() as u32).collect();
            idx.sort_unstable_by(|&a, &b| self.name_bytes(a as usize).cmp(self.name_bytes(b as usize)).then(a.cmp(&b)));
            idx
        })
    }

    /// The function called exactly `name` (the first one if the table lists
    /// the name twice). Names compare as bytes: a name that is not UTF-8 is
    /// shown lossily by [`Pclntab::functions`] and cannot be looked up in
    /// that form (Go writes only UTF-8 names).
    pub fn lookup(&self, name: &str) -> Option<GoFunc> {
        let index = self.name_index();
        let target = name.as_bytes();
        let pos = index.partition_point(|&i| self.name_bytes(i as usize) < target);
        let &i = index.get(pos)?;
        (self.name_bytes(i as usize) == target).then(|| self.func(i as usize))?
    }

    /// Every function called exactly `name`, in address order. Go lists each
    /// instantiation of a generic function under the same name (`pkg.F[...]`).
    pub fn lookup_all(&self, name: &str) -> Vec<GoFunc> {
        let index = self.name_index();
        let target = name.as_bytes();
        let pos = index.partition_point(|&i| self.name_bytes(i as usize) < target);
        index[pos..].iter().take_while(|&&i| self.name_bytes(i as usize) == target).filter_map(|&i| self.func(i as usize)).collect()
    }

    /// The index of the function whose `[entry, end)` holds `va`.
    fn index_at(&self, va: u64) -> Option<usize> {
        let n = self.funcs.partition_point(|f| f.entry <= va).checked_sub(1)?;
        let end = self.funcs.get(n + 1).map_or(self.end, |f| f.entry);
        (va < end).then_some(n)
    }

    /// The pcsp table of the function holding `va`: its entry and the
    /// table's bytes from its start (`None` if no function holds `va`, or
    /// the function has no table, as for some assembly stubs).
    pub(crate) fn pcsp_table(&self, va: u64) -> Option<(u64, &[u8])> {
        let f = self.funcs.get(self.index_at(va)?)?;
        if f.pcsp == 0 {
            return None;
        }
        Some((f.entry, self.pctab.get(f.pcsp as usize..)?))
    }

    /// The `_func.funcID` of the function holding `va` (`None` if none
    /// does). The numbering differs between Go releases: see
    /// [`super::GoSymbols::is_wrapper`].
    pub fn func_id_at(&self, va: u64) -> Option<u8> {
        self.funcs.get(self.index_at(va)?).map(|f| f.func_id)
    }

    /// Bytes of `pctab` (for messages and the memory budget).
    pub fn pctab_len(&self) -> usize {
        self.pctab.len()
    }

    /// The function whose `[entry, end)` holds `va`.
    pub fn function_at(&self, va: u64) -> Option<GoFunc> {
        let n = self.funcs.partition_point(|f| f.entry <= va);
        let f = self.func(n.checked_sub(1)?)?;
        (va < f.end).then_some(f)
    }
}

/// Quick filter before a full header parse: a known magic, two zero bytes,
/// a valid minLC and pointer size.
fn is_candidate(b: &[u8], big: bool) -> bool {
    let Some(m) = read_uint(b, 0, 4, big) else {
        return false;
    };
    PclnVersion::from_magic(m as u32).is_some()
        && b.get(4) == Some(&0)
        && b.get(5) == Some(&0)
        && matches!(b.get(6), Some(1 | 2 | 4))
        && matches!(b.get(7), Some(4 | 8))
}

/// Picks `runtime.text` for a Go 1.18+ table: the header word if it points
/// into executable code, else the `R_*_RELATIVE` addend that patches it (a
/// PIE's file copy may be unrelocated), else `moduledata.text` (Go 1.26+
/// writes 0 there: see [`super::moduledata`]), else the `.text` section.
fn resolve_text_start(
    ctx: &Ctx<'_>,
    elf: &Elf,
    data: &[u8],
    raw: u64,
    field_va: u64,
    module: super::moduledata::Expect,
) -> Result<u64, GoSymError> {
    if raw != 0 && elf.is_executable(raw) {
        return Ok(raw);
    }
    if let Some(a) = elf.relative_addend(data, field_va) {
        if elf.is_executable(a) {
            return Ok(a);
        }
    }
    if let Some((text, from)) = super::moduledata::text_start(elf, data, module) {
        tracing::debug!(binary = ctx.binary, text, from, "runtime.text from the moduledata");
        return Ok(text);
    }
    if let Some(text) = elf.section(".text") {
        tracing::debug!(
            binary = ctx.binary,
            raw,
            text = text.addr,
            "pclntab textStart not usable and no moduledata found; falling back to the .text section address"
        );
        return Ok(text.addr);
    }
    if raw != 0 {
        return Ok(raw);
    }
    Err(ctx.corrupt("textStart is 0, with no relocation, no moduledata and no .text section".to_string()))
}

/// The table `t` whose header is `h`: `runtime.text`, the regions the
/// offsets point into, every function record, and the names' lengths.
fn parse_table(ctx: &Ctx<'_>, elf: &Elf, data: &[u8], t: &[u8], h: Header, source: TableSource) -> Result<Pclntab, GoSymError> {
    let text_start = table_text_start(ctx, elf, data, t, &h, source.va)?;
    let (nfunc, names, pctab) = table_regions(ctx, t, &h)?;
    let functab = Functab { ctx, t, fd: t.get(h.funcdata..).unwrap_or(&[]), h: &h, text_start };
    let (mut funcs, end) = functab.read_all(nfunc, names.len(), pctab.len())?;
    set_name_lengths(ctx, names, &mut funcs)?;
    Ok(Pclntab {
        version: h.version,
        ptr_size: h.ptr_size,
        min_lc: h.min_lc,
        text_start,
        source,
        names: names.into(),
        pctab: pctab.into(),
        funcs,
        end,
        by_name: OnceLock::new(),
    })
}

/// `runtime.text` for a Go 1.18+ table (its header's word, resolved by
/// [`resolve_text_start`]); 0 for older layouts, whose entries are absolute.
fn table_text_start(ctx: &Ctx<'_>, elf: &Elf, data: &[u8], t: &[u8], h: &Header, table_va: u64) -> Result<u64, GoSymError> {
    let Some((raw, field_off)) = h.text_start else { return Ok(0) };
    let module = super::moduledata::Expect {
        table_va,
        funcname_off: h.names.0 as u64,
        first_off: ctx.uint(t, h.functab, 4, "functab entryoff")?,
        end_off: ctx.uint(t, h.functab + h.nfunc as usize * 8, 4, "functab end")?,
        ptr_size: h.ptr_size,
    };
    resolve_text_start(ctx, elf, data, raw, table_va.wrapping_add(field_off as u64), module)
}

/// The function count as a `usize`, and the `funcnametab` and `pctab`
/// regions of `t` (each checked to fit, and under 4 GiB: offsets into them
/// are `u32`).
fn table_regions<'t>(ctx: &Ctx<'_>, t: &'t [u8], h: &Header) -> Result<(usize, &'t [u8], &'t [u8]), GoSymError> {
    // Header validation guaranteed the functab fits, so nfunc ≤ t.len().
    let nfunc = usize::try_from(h.nfunc).map_err(|_| ctx.oob("nfunc", h.nfunc, t.len()))?;
    let names = t.get(h.names.0..h.names.1).ok_or_else(|| ctx.oob("funcnametab", h.names.0 as u64, t.len()))?;
    if u32::try_from(names.len()).is_err() {
        return Err(ctx.corrupt("funcnametab larger than 4 GiB".to_string()));
    }
    let pctab = t.get(h.pctab.0..h.pctab.1).ok_or_else(|| ctx.oob("pctab", h.pctab.0 as u64, t.len()))?;
    if u32::try_from(pctab.len()).is_err() {
        return Err(ctx.corrupt("pctab larger than 4 GiB".to_string()));
    }
    Ok((nfunc, names, pctab))
}

/// `functab` (pairs of entry PC and `funcoff`, then the end PC) and the
/// `_func` records its offsets point at, in `fd`.
struct Functab<'a> {
    ctx: &'a Ctx<'a>,
    /// The whole table.
    t: &'a [u8],
    /// Where `funcoff` values point (from `h.funcdata` on).
    fd: &'a [u8],
    h: &'a Header,
    text_start: u64,
}

impl Functab<'_> {
    /// Go 1.18+: `(entryoff, funcoff)` as two `uint32`, entries from `textStart`.
    fn new_layout(&self) -> bool {
        matches!(self.h.version, PclnVersion::Go118 | PclnVersion::Go120)
    }

    /// The entry PC of pair `i` (`nfunc`: the end PC).
    fn entry(&self, i: usize) -> Result<u64, GoSymError> {
        let ctx = self.ctx;
        if self.new_layout() {
            let off = ctx.uint(self.t, self.h.functab + i * 8, 4, "functab entryoff")?;
            self.text_start.checked_add(off).ok_or_else(|| ctx.corrupt(format!("entryoff {off:#x} overflows")))
        } else {
            ctx.uint(self.t, self.h.functab + i * 2 * usize::from(self.h.ptr_size), self.h.ptr_size, "functab entry")
        }
    }

    /// Every function record, in entry order, and the end PC.
    fn read_all(&self, nfunc: usize, names_len: usize, pctab_len: usize) -> Result<(Vec<FuncRec>, u64), GoSymError> {
        let mut funcs: Vec<FuncRec> = Vec::with_capacity(nfunc);
        let mut prev = 0u64;
        for i in 0..nfunc {
            let f = self.func(i, prev, names_len, pctab_len)?;
            prev = f.entry;
            funcs.push(f);
        }
        let end = self.entry(nfunc)?;
        if end < prev {
            return Err(self.ctx.corrupt(format!("end PC {end:#x} below the last entry {prev:#x}")));
        }
        Ok((funcs, end))
    }

    /// Function `i`, whose entry may not be below `prev`: its pair, and its
    /// `_func` (same entry; a name offset inside the `names_len` bytes of
    /// `funcnametab`; a pcsp offset inside `pctab_len`, else none). Its name
    /// length is set later, by [`set_name_lengths`].
    fn func(&self, i: usize, prev: u64, names_len: usize, pctab_len: usize) -> Result<FuncRec, GoSymError> {
        let (ctx, t, fd, ft) = (self.ctx, self.t, self.fd, self.h.functab);
        let (ps, psz) = (self.h.ptr_size, usize::from(self.h.ptr_size));
        let entry = self.entry(i)?;
        let funcoff = if self.new_layout() {
            ctx.uint(t, ft + i * 8 + 4, 4, "functab funcoff")?
        } else {
            ctx.uint(t, ft + (2 * i + 1) * psz, ps, "functab funcoff")?
        };
        let fo = usize::try_from(funcoff).map_err(|_| ctx.oob("_func", funcoff, fd.len()))?;
        // _func: entry (uint32 entryoff in 1.18+, uintptr before), then nameoff int32.
        let (fentry, name_at) = if self.new_layout() {
            let e = ctx.uint(fd, fo, 4, "_func.entryoff")?;
            (self.text_start.wrapping_add(e), fo.checked_add(4))
        } else {
            (ctx.uint(fd, fo, ps, "_func.entry")?, fo.checked_add(psz))
        };
        let name_at = name_at.ok_or_else(|| ctx.oob("_func.nameoff", funcoff, fd.len()))?;
        let nameoff = ctx.uint(fd, name_at, 4, "_func.nameoff")? as u32 as i32;
        // Then args int32, deferreturn uint32, pcsp uint32 (every layout).
        // A pcsp offset that does not fit is kept as "no table": names stay
        // usable, and the unwinder stops at that function.
        let pcsp = name_at
            .checked_add(12)
            .and_then(|at| read_uint(fd, at, 4, ctx.big))
            .map(|v| v as u32)
            .filter(|&v| (v as usize) < pctab_len)
            .unwrap_or(0);
        // funcID follows nameoff, args, deferreturn, pcsp, pcfile, pcln,
        // npcdata, cuOffset, and startLine from 1.20 (1.16–1.19: no startLine).
        let func_id_at = match self.h.version {
            PclnVersion::Go12 => None,
            PclnVersion::Go116 | PclnVersion::Go118 => name_at.checked_add(32),
            PclnVersion::Go120 => name_at.checked_add(36),
        };
        let func_id = func_id_at.and_then(|at| read_uint(fd, at, 1, ctx.big)).map_or(0, |v| v as u8);
        if fentry != entry {
            return Err(ctx.corrupt(format!("function {i}: functab entry {entry:#x} but _func entry {fentry:#x}")));
        }
        if entry < prev {
            return Err(ctx.corrupt(format!("function {i}: entry {entry:#x} below the previous {prev:#x}")));
        }
        let name_off = u32::try_from(nameoff)
            .ok()
            .filter(|&o| (o as usize) < names_len)
            .ok_or_else(|| ctx.oob("_func.nameoff", nameoff as u64, names_len))?;
        Ok(FuncRec { entry, name_off, name_len: 0, pcsp, func_id })
    }
}

/// Each function's name length: one backwards sweep over the distinct name
/// offsets, so each byte of `names` (`funcnametab`) is scanned at most once
/// however the offsets overlap. Every offset is inside `names` (checked by
/// [`Functab::func`]).
fn set_name_lengths(ctx: &Ctx<'_>, names: &[u8], funcs: &mut [FuncRec]) -> Result<(), GoSymError> {
    let mut offs: Vec<u32> = funcs.iter().map(|f| f.name_off).collect();
    offs.sort_unstable();
    offs.dedup();
    let mut lens: Vec<u32> = vec![0; offs.len()];
    let mut bound = names.len();
    let mut nul_at_or_after_bound: Option<usize> = None;
    for (k, &o) in offs.iter().enumerate().rev() {
        let s = o as usize;
        let nul = match names[s..bound].iter().position(|&b| b == 0) {
            Some(p) => Some(s + p),
            None => nul_at_or_after_bound,
        };
        let Some(nul) = nul else {
            return Err(ctx.corrupt(format!("function name at {s:#x} is not NUL-terminated")));
        };
        lens[k] = (nul - s) as u32;
        bound = s;
        nul_at_or_after_bound = Some(nul);
    }
    for f in funcs {
        if let Ok(k) = offs.binary_search(&f.name_off) {
            f.name_len = lens[k];
        }
    }
    Ok(())
}
