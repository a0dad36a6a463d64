//! The few ELF facts gosym needs: sections by name, PT_LOAD segments for
//! virtual address → file offset, PT_TLS, and the `R_*_RELATIVE` addend of a
//! pointer in a PIE (whose file copy may be unrelocated).
//!
//! Headers are parsed with `object` (read-only, bounds-checked); everything is
//! copied into small owned tables so that [`Elf`] has no lifetime.

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::{Endianness, FileKind};

use super::GoSymError;

/// `PF_X`: the segment is executable.
pub const PF_X: u32 = elf::PF_X;
/// `PF_W`: the segment is writable.
pub const PF_W: u32 = elf::PF_W;

/// One program header (only PT_LOAD and PT_TLS are kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    /// `p_type` (`PT_LOAD` or `PT_TLS`).
    pub p_type: u32,
    /// `p_flags` (`PF_R`, `PF_W`, `PF_X`).
    pub flags: u32,
    /// `p_offset`: where the segment's bytes start in the file.
    pub offset: u64,
    /// `p_vaddr`: the link-time virtual address (relative to the load base for PIE).
    pub vaddr: u64,
    /// `p_filesz`: bytes present in the file.
    pub filesz: u64,
    /// `p_memsz`: bytes in memory (≥ `filesz`; the rest is zero-filled).
    pub memsz: u64,
    /// `p_align`.
    pub align: u64,
}

/// One section header, with its name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The section's name from `.shstrtab` (lossy UTF-8).
    pub name: String,
    /// `sh_type` (`SHT_PROGBITS`, `SHT_NOBITS`, `SHT_RELA`, ...).
    pub sh_type: u32,
    /// `sh_addr`.
    pub addr: u64,
    /// `sh_offset`.
    pub offset: u64,
    /// `sh_size`.
    pub size: u64,
}

/// The parsed headers of one ELF file. Cheap to build (headers only).
#[derive(Debug, Clone)]
pub struct Elf {
    binary: String,
    e_type: u16,
    machine: u16,
    big_endian: bool,
    is_64: bool,
    segments: Vec<Segment>,
    sections: Vec<Section>,
}

impl Elf {
    /// Parses the ELF headers of `data`; `binary` names it in errors.
    ///
    /// A file whose section header table is damaged or cut off still parses
    /// (with no sections), since the program headers are enough to scan for a
    /// pclntab; an unreadable ELF header or program header table is an error.
    pub fn parse(data: &[u8], binary: &str) -> Result<Elf, GoSymError> {
        match FileKind::parse(data) {
            Ok(FileKind::Elf64) => parse_generic::<elf::FileHeader64<Endianness>>(data, binary),
            Ok(FileKind::Elf32) => parse_generic::<elf::FileHeader32<Endianness>>(data, binary),
            _ => Err(GoSymError::NotElf { binary: binary.to_string() }),
        }
    }

    /// The name used for this binary in error messages.
    pub fn binary(&self) -> &str {
        &self.binary
    }

    /// `e_machine` (`EM_X86_64` = 62, `EM_AARCH64` = 183, ...).
    pub fn machine(&self) -> u16 {
        self.machine
    }

    /// True for big-endian files.
    pub fn is_big_endian(&self) -> bool {
        self.big_endian
    }

    /// True for ELFCLASS64.
    pub fn is_64(&self) -> bool {
        self.is_64
    }

    /// True for `ET_DYN`: addresses are relative to a load base chosen at run
    /// time (a PIE, or a shared object). Uprobes take file offsets, so this
    /// does not change where probes go; it matters when runtime addresses
    /// (stacks, `/proc/PID/maps`) are mapped back to link-time addresses.
    pub fn is_pie(&self) -> bool {
        self.e_type == elf::ET_DYN
    }

    /// True for `ET_EXEC` (fixed addresses).
    pub fn is_exec(&self) -> bool {
        self.e_type == elf::ET_EXEC
    }

    /// The PT_LOAD segments, in file order.
    pub fn load_segments(&self) -> impl Iterator<Item = &Segment> + '_ {
        self.segments.iter().filter(|s| s.p_type == elf::PT_LOAD)
    }

    /// All section headers (empty if the section table was unreadable).
    pub fn sections(&self) -> &[Section] {
        &self.sections
    }

    /// The first section called `name`.
    pub fn section(&self, name: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.name == name)
    }

    /// The file bytes of `section`, or `None` for `SHT_NOBITS` or a section
    /// that lies (partly) outside `data`.
    pub fn section_data<'d>(&self, data: &'d [u8], section: &Section) -> Option<&'d [u8]> {
        if section.sh_type == elf::SHT_NOBITS {
            return None;
        }
        slice(data, section.offset, section.size)
    }

    /// The PT_TLS segment as `(p_vaddr, p_memsz, p_align)`, if any. Go's TLS
    /// slot for `g` sits at a negative offset from the thread pointer computed
    /// from these (for `runtime.tlsg` in cgo or externally linked binaries).
    pub fn tls_segment(&self) -> Option<(u64, u64, u64)> {
        self.segments.iter().find(|s| s.p_type == elf::PT_TLS).map(|s| (s.vaddr, s.memsz, s.align))
    }

    /// Maps a virtual address to a file offset through the PT_LOAD segments:
    /// `p_vaddr <= va < p_vaddr + p_filesz` gives `va - p_vaddr + p_offset`.
    /// Addresses in the zero-filled tail (`.bss`) or outside every segment give
    /// `None`.
    pub fn file_offset(&self, va: u64) -> Option<u64> {
        let seg = self.load_segment_at(va)?;
        seg.offset.checked_add(va - seg.vaddr)
    }

    /// The PT_LOAD segment whose file-backed part holds `va`.
    pub fn load_segment_at(&self, va: u64) -> Option<&Segment> {
        self.load_segments().find(|s| va >= s.vaddr && va - s.vaddr < s.filesz)
    }

    /// The bytes at `[va, va + len)`, if they are all file-backed in one
    /// segment and present in `data`.
    pub fn read_va<'d>(&self, data: &'d [u8], va: u64, len: u64) -> Option<&'d [u8]> {
        let seg = self.load_segment_at(va)?;
        let within = va - seg.vaddr;
        if len > seg.filesz - within {
            return None;
        }
        slice(data, seg.offset.checked_add(within)?, len)
    }

    /// The file bytes of a segment, cut to what `data` holds.
    pub fn segment_data<'d>(&self, data: &'d [u8], seg: &Segment) -> &'d [u8] {
        let start = usize::try_from(seg.offset).unwrap_or(usize::MAX);
        if start >= data.len() {
            return &[];
        }
        let avail = data.len() - start;
        let len = usize::try_from(seg.filesz).map_or(avail, |n| n.min(avail));
        &data[start..start + len]
    }

    /// The executable's code as the kernel's ELF loader records it in
    /// `mm->start_code` and `mm->end_code` (less the load bias): from the
    /// lowest `p_vaddr` to the highest `p_vaddr + p_filesz` of the executable
    /// PT_LOAD segments (`load_elf_binary` in fs/binfmt_elf.c, the same from
    /// Linux 5.10 to 6.18).
    pub fn code_span(&self) -> Option<(u64, u64)> {
        let x = || self.load_segments().filter(|s| s.flags & PF_X != 0);
        let start = x().map(|s| s.vaddr).min()?;
        let end = x().map(|s| s.vaddr.saturating_add(s.filesz)).max()?;
        Some((start, end))
    }

    /// Where the code at file offset `offset` sits, as a uprobe without a
    /// cookie finds it: (the code's length, the distance from its start), both
    /// as `u32` (see [`Elf::code_span`]). `None` outside the executable code or
    /// beyond 4 GiB.
    pub fn code_place(&self, offset: u64) -> Option<(u32, u32)> {
        let (start, end) = self.code_span()?;
        let seg = self.load_segments().find(|s| s.flags & PF_X != 0 && offset >= s.offset && offset - s.offset < s.filesz)?;
        let va = offset - seg.offset + seg.vaddr;
        Some((u32::try_from(end - start).ok()?, u32::try_from(va - start).ok()?))
    }

    /// True if `va` is inside an executable PT_LOAD segment's file-backed part.
    pub fn is_executable(&self, va: u64) -> bool {
        self.load_segment_at(va).is_some_and(|s| s.flags & PF_X != 0)
    }

    /// Reads a pointer-sized word at `va` in the file's byte order.
    pub fn read_word(&self, data: &[u8], va: u64, ptr_size: u8) -> Option<u64> {
        let b = self.read_va(data, va, u64::from(ptr_size))?;
        read_uint(b, 0, ptr_size, self.big_endian)
    }

    /// The addend of the `R_*_RELATIVE` dynamic relocation that patches the
    /// pointer at `va`, if any: in a PIE the file copy of a pointer may be 0
    /// and only the relocation knows the link-time value.
    pub fn relative_addend(&self, data: &[u8], va: u64) -> Option<u64> {
        let relative = match self.machine {
            elf::EM_X86_64 => elf::R_X86_64_RELATIVE,
            elf::EM_AARCH64 => elf::R_AARCH64_RELATIVE,
            elf::EM_386 => elf::R_386_RELATIVE,
            elf::EM_ARM => elf::R_ARM_RELATIVE,
            _ => return None,
        };
        self.reloc_addend(data, va, relative)
    }

    /// The addend of the first `SHT_RELA` relocation of type `r_type` that
    /// patches `va`.
    pub fn reloc_addend(&self, data: &[u8], va: u64, r_type: u32) -> Option<u64> {
        // Elf64_Rela is three 8-byte words, Elf32_Rela three 4-byte words.
        let w: u8 = if self.is_64 { 8 } else { 4 };
        let entsize = 3 * u64::from(w);
        for sec in &self.sections {
            if sec.sh_type != elf::SHT_RELA {
                continue;
            }
            let Some(bytes) = self.section_data(data, sec) else {
                continue;
            };
            let n = bytes.len() as u64 / entsize;
            for i in 0..n {
                let base = usize::try_from(i * entsize).ok()?;
                let r_offset = read_uint(bytes, base, w, self.big_endian)?;
                if r_offset != va {
                    continue;
                }
                let r_info = read_uint(bytes, base + usize::from(w), w, self.big_endian)?;
                let ty = if self.is_64 { (r_info & 0xffff_ffff) as u32 } else { (r_info & 0xff) as u32 };
                if ty == r_type {
                    return read_uint(bytes, base + 2 * usize::from(w), w, self.big_endian);
                }
            }
        }
        None
    }
}

impl Elf {
    /// The addresses patched by an `R_*_RELATIVE` relocation whose addend is
    /// `addend`, at most `limit` of them: in a PIE whose file copies of
    /// pointers are unrelocated, where a pointer to `addend` is stored.
    pub fn relative_targets(&self, data: &[u8], addend: u64, limit: usize) -> Vec<u64> {
        let relative = match self.machine {
            elf::EM_X86_64 => elf::R_X86_64_RELATIVE,
            elf::EM_AARCH64 => elf::R_AARCH64_RELATIVE,
            elf::EM_386 => elf::R_386_RELATIVE,
            elf::EM_ARM => elf::R_ARM_RELATIVE,
            _ => return Vec::new(),
        };
        let w: u8 = if self.is_64 { 8 } else { 4 };
        let entsize = 3 * usize::from(w);
        let mut out = Vec::new();
        for sec in self.sections.iter().filter(|s| s.sh_type == elf::SHT_RELA) {
            let Some(bytes) = self.section_data(data, sec) else {
                continue;
            };
            for base in (0..bytes.len() / entsize).map(|i| i * entsize) {
                let (Some(r_offset), Some(r_info), Some(a)) = (
                    read_uint(bytes, base, w, self.big_endian),
                    read_uint(bytes, base + usize::from(w), w, self.big_endian),
                    read_uint(bytes, base + 2 * usize::from(w), w, self.big_endian),
                ) else {
                    break;
                };
                let ty = if self.is_64 { (r_info & 0xffff_ffff) as u32 } else { (r_info & 0xff) as u32 };
                if ty == relative && a == addend {
                    out.push(r_offset);
                    if out.len() >= limit {
                        return out;
                    }
                }
            }
        }
        out
    }
}

/// Maps a virtual address to a file offset; see [`Elf::file_offset`].
pub fn file_offset(elf: &Elf, va: u64) -> Option<u64> {
    elf.file_offset(va)
}

fn parse_generic<H: FileHeader<Endian = Endianness>>(data: &[u8], binary: &str) -> Result<Elf, GoSymError> {
    let malformed = |reason: &str| GoSymError::MalformedElf { binary: binary.to_string(), reason: reason.to_string() };
    let header = H::parse(data).map_err(|_| GoSymError::NotElf { binary: binary.to_string() })?;
    let endian = header.endian().map_err(|_| malformed("unsupported byte order"))?;
    let phdrs = header.program_headers(endian, data).map_err(|e| malformed(&format!("program headers: {e}")))?;
    let segments = phdrs
        .iter()
        .filter(|p| matches!(p.p_type(endian), elf::PT_LOAD | elf::PT_TLS))
        .map(|p| Segment {
            p_type: p.p_type(endian),
            flags: p.p_flags(endian),
            offset: p.p_offset(endian).into(),
            vaddr: p.p_vaddr(endian).into(),
            filesz: p.p_filesz(endian).into(),
            memsz: p.p_memsz(endian).into(),
            align: p.p_align(endian).into(),
        })
        .collect();
    let mut sections = Vec::new();
    if let Ok(table) = header.sections(endian, data) {
        for sh in table.iter() {
            let name = table.section_name(endian, sh).map(|n| String::from_utf8_lossy(n).into_owned()).unwrap_or_default();
            sections.push(Section {
                name,
                sh_type: sh.sh_type(endian),
                addr: sh.sh_addr(endian).into(),
                offset: sh.sh_offset(endian).into(),
                size: sh.sh_size(endian).into(),
            });
        }
    }
    Ok(Elf {
        binary: binary.to_string(),
        e_type: header.e_type(endian),
        machine: header.e_machine(endian),
        big_endian: endian == Endianness::Big,
        is_64: header.is_type_64(),
        segments,
        sections,
    })
}

/// `data[off .. off + len]`, or `None` if any of it is outside `data`.
pub(crate) fn slice(data: &[u8], off: u64, len: u64) -> Option<&[u8]> {
    let start = usize::try_from(off).ok()?;
    let len = usize::try_from(len).ok()?;
    let end = start.checked_add(len)?;
    data.get(start..end)
}

/// Reads an unsigned integer of `size` bytes (1, 2, 4 or 8) at `off`.
pub(crate) fn read_uint(data: &[u8], off: usize, size: u8, big: bool) -> Option<u64> {
    let end = off.checked_add(usize::from(size))?;
    let b = data.get(off..end)?;
    let mut v: u64 = 0;
    match (size, big) {
        (1 | 2 | 4 | 8, false) => {
            for &x in b.iter().rev() {
                v = (v << 8) | u64::from(x);
            }
        }
        (1 | 2 | 4 | 8, true) => {
            for &x in b {
                v = (v << 8) | u64::from(x);
            }
        }
        _ => return None,
    }
    Some(v)
}
