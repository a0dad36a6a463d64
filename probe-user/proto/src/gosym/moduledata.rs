//! `runtime.text` from the runtime's `moduledata`, for Go 1.26+ tables.
//!
//! From Go 1.26 the pclntab header's `textStart` is always 0 (the table
//! carries no relocation any more, go.dev/doc/go1.26), and function entries
//! are offsets from `moduledata.text`. For an internally linked binary that
//! is the start of `.text`; for an externally linked one (cgo: containerd
//! 2.3.4, runc 1.4.3) the C start-up code comes first, and taking `.text`
//! put every entry 256 bytes early, in the middle of the previous function.
//!
//! The moduledata is the `.go.module` section (Go 1.26+), else found as the
//! word that points at the pclntab in a writable segment (or, in a PIE whose
//! file copy is unrelocated, the `R_*_RELATIVE` relocation whose addend is
//! the pclntab). Its layout, unchanged from Go 1.16 to 1.26 for what is read
//! here (`runtime/symtab.go`), in pointer-size words:
//!
//! | word | field |
//! |---|---|
//! | 0 | `pcHeader *pcHeader` |
//! | 1–3 | `funcnametab []byte` |
//! | 4–18 | `cutab`, `filetab`, `pctab`, `pclntable`, `ftab` (slices) |
//! | 19 | `findfunctab uintptr` |
//! | 20, 21 | `minpc`, `maxpc` |
//! | 22, 23 | `text`, `etext` |
//!
//! A candidate is accepted only if it points at this table and its
//! `funcnametab`, and `minpc`/`maxpc` are `text` plus the table's first and
//! last entry offsets: a wrong base puts uprobes inside instructions.
//! Checked on containerd 2.3.4, its shim, runc 1.4.3 and
//! node-problem-detector (Go 1.26.6; external and internal linking, PIE).

use super::elf::{Elf, PF_W};

/// Candidates examined before giving up (a Go binary has one moduledata
/// per module; a crafted file may point at the table from many places).
const MAX_CANDIDATES: usize = 16;

/// What the table says, to check a candidate against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Expect {
    /// The pclntab's virtual address (`pcHeader`).
    pub table_va: u64,
    /// `funcnametab`'s offset in the table.
    pub funcname_off: u64,
    /// `functab[0].entryoff` and the end sentinel's.
    pub first_off: u64,
    pub end_off: u64,
    pub ptr_size: u8,
}

/// `moduledata.text` and where the moduledata was (`.go.module` or an address).
pub(crate) fn text_start(elf: &Elf, data: &[u8], want: Expect) -> Option<(u64, String)> {
    let ps = u64::from(want.ptr_size);
    let mut candidates: Vec<(u64, String)> = Vec::new();
    if let Some(sec) = elf.section(".go.module") {
        candidates.push((sec.addr, ".go.module".into()));
    }
    // A pointer to the table in a writable segment's file bytes.
    'segs: for seg in elf.load_segments().filter(|s| s.flags & PF_W != 0) {
        let bytes = elf.segment_data(data, seg);
        let mut pos = ((ps - seg.vaddr % ps) % ps) as usize;
        while pos + ps as usize <= bytes.len() {
            if super::elf::read_uint(bytes, pos, want.ptr_size, elf.is_big_endian()) == Some(want.table_va) {
                let va = seg.vaddr.wrapping_add(pos as u64);
                candidates.push((va, format!("moduledata at {va:#x}")));
                if candidates.len() >= MAX_CANDIDATES {
                    break 'segs;
                }
            }
            pos += ps as usize;
        }
    }
    if elf.is_pie() {
        for va in elf.relative_targets(data, want.table_va, MAX_CANDIDATES) {
            candidates.push((va, format!("moduledata at {va:#x} (relocated)")));
        }
    }
    candidates.dedup_by_key(|c| c.0);
    candidates.into_iter().take(MAX_CANDIDATES).find_map(|(md, from)| {
        let word = |i: u64| -> Option<u64> {
            let va = md.checked_add(i * ps)?;
            match elf.read_word(data, va, want.ptr_size)? {
                0 => elf.relative_addend(data, va),
                v => Some(v),
            }
        };
        let ok = word(0)? == want.table_va && word(1)? == want.table_va.checked_add(want.funcname_off)? && elf.is_executable(word(22)?);
        let text = word(22)?;
        let ok =
            ok && word(20)? == text.checked_add(want.first_off)? && word(21)? == text.checked_add(want.end_off)? && word(23)? >= word(21)?;
        ok.then_some((text, from))
    })
}
