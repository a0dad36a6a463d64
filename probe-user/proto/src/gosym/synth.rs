//! Test-only builder of small synthetic Go-like ELF files: x86-64 code for a
//! few functions, a pclntab in any of the four layouts, a `.go.buildinfo`,
//! placed where real linkers put them. Real binaries cover Go 1.19 only; these
//! cover the other layouts and the odd placements, and seed the fuzzer.

use super::pclntab::{MAGIC_GO116, MAGIC_GO118, MAGIC_GO12, MAGIC_GO120};
use super::version::BUILDINFO_MAGIC;

pub const TEXT_VA: u64 = 0x40_1000;
pub const DATA_VA: u64 = 0x48_0000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    Go12,
    Go116,
    Go118,
    Go120,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// A `.gopclntab` section.
    Section,
    /// Inside `.data.rel.ro`, after some pointers (externally linked PIE).
    DataRelRo,
    /// No section headers at all: only the PT_LOAD scan can find it.
    NoSections,
}

pub struct Spec {
    pub layout: Layout,
    pub placement: Placement,
    /// ET_DYN with `textStart` 0 in the file and an R_X86_64_RELATIVE for it.
    pub pie_unrelocated: bool,
    pub funcs: Vec<(&'static str, Vec<u8>)>,
    pub buildinfo: Option<(&'static str, String)>,
    /// Write the Go 1.13–1.17 pointer format instead of inline strings.
    pub buildinfo_pointers: bool,
}

/// Function bodies with known RETs (offsets within the body).
pub fn sample_funcs() -> Vec<(&'static str, Vec<u8>, Vec<u64>)> {
    vec![
        (
            // push rbp; mov rbp,rsp; pop rbp; ret
            "main.main",
            vec![0x55, 0x48, 0x89, 0xe5, 0x5d, 0xc3],
            vec![5],
        ),
        (
            // cmp rax,3; jle +1; ret; ret 8
            "main.pick",
            vec![0x48, 0x83, 0xf8, 0x03, 0x7e, 0x01, 0xc3, 0xc2, 0x08, 0x00],
            vec![6, 7],
        ),
        (
            // mov eax,0xc3 (a C3 byte that is no RET); int3 (inside); retf; retf 4
            "github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).UpdateSync",
            vec![0xb8, 0xc3, 0x00, 0x00, 0x00, 0xcc, 0xcb, 0xca, 0x04, 0x00],
            vec![6, 7],
        ),
        (
            // jmp rel32 (tail call, no RET)
            "main.tail",
            vec![0xe9, 0x00, 0x00, 0x00, 0x00],
            vec![],
        ),
        (
            // jmp +0; nop; jz -3 (back to the nop); ret: branches on boundaries
            "main.loop",
            vec![0xeb, 0x00, 0x90, 0x74, 0xfd, 0xc3],
            vec![5],
        ),
    ]
}

/// Where each function landed: `(name, entry, end)`.
pub struct Built {
    pub bytes: Vec<u8>,
    pub funcs: Vec<(String, u64, u64)>,
}

fn put_u16(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put_u32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn put_u64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn align(v: &mut Vec<u8>, a: usize, fill: u8) {
    while !v.len().is_multiple_of(a) {
        v.push(fill);
    }
}

/// The text bytes (16-aligned functions, INT3 padding) and function ranges.
fn text(funcs: &[(&'static str, Vec<u8>)]) -> (Vec<u8>, Vec<(String, u64, u64)>) {
    let mut t = Vec::new();
    let mut out = Vec::new();
    for (name, code) in funcs {
        let start = t.len() as u64;
        t.extend_from_slice(code);
        align(&mut t, 16, 0xcc);
        out.push((name.to_string(), TEXT_VA + start, 0));
    }
    let n = out.len();
    for i in 0..n {
        out[i].2 = if i + 1 < n { out[i + 1].1 } else { TEXT_VA + t.len() as u64 };
    }
    (t, out)
}

/// Frame size the synthetic pcsp table of function `i` gives after its
/// first byte (0 at its entry).
pub fn synth_frame(i: usize) -> u64 {
    8 * (i as u64 + 1)
}

/// The pcsp tables of `funcs`, after one zero byte (offset 0 means "no
/// table"): 0 for the entry byte, [`synth_frame`] for the rest.
fn pcsp_tables(funcs: &[(String, u64, u64)]) -> (Vec<u8>, Vec<u32>) {
    fn put(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    let mut b = vec![0u8];
    let mut offs = Vec::new();
    for (i, (_, entry, end)) in funcs.iter().enumerate() {
        offs.push(b.len() as u32);
        // Value deltas zig-zag coded: -1 -> 0 is +1 (2), 0 -> N is +N (2N).
        put(&mut b, 2);
        put(&mut b, 1);
        put(&mut b, 2 * synth_frame(i));
        put(&mut b, end - entry - 1);
        b.push(0);
    }
    (b, offs)
}

/// A pclntab for `funcs` (ranges from [`text`]). Returns the table and the
/// offset of the `textStart` word (1.18+).
pub fn pclntab(layout: Layout, funcs: &[(String, u64, u64)], text_start_word: u64) -> (Vec<u8>, usize) {
    let n = funcs.len();
    let end = funcs.last().map_or(TEXT_VA, |f| f.2);
    let mut names = Vec::new();
    let mut name_offs = Vec::new();
    for (name, _, _) in funcs {
        name_offs.push(names.len() as u32);
        names.extend_from_slice(name.as_bytes());
        names.push(0);
    }
    let (pcsp, pcsp_offs) = pcsp_tables(funcs);
    let mut t = Vec::new();
    match layout {
        Layout::Go12 => {
            put_u32(&mut t, MAGIC_GO12);
            t.extend_from_slice(&[0, 0, 1, 8]);
            put_u64(&mut t, n as u64);
            let functab = t.len();
            let funcs_at = functab + (2 * n + 1) * 8;
            let func_size = 40;
            let names_at = funcs_at + n * func_size;
            let pcsp_at = names_at + names.len();
            for (i, (_, entry, _)) in funcs.iter().enumerate() {
                put_u64(&mut t, *entry);
                put_u64(&mut t, (funcs_at + i * func_size) as u64);
            }
            put_u64(&mut t, end);
            for (i, (_, entry, _)) in funcs.iter().enumerate() {
                let s = t.len();
                put_u64(&mut t, *entry);
                put_u32(&mut t, names_at as u32 + name_offs[i]);
                // args, deferreturn (or frame), then pcsp: from the table's start.
                t.resize(s + 8 + 12, 0);
                put_u32(&mut t, pcsp_at as u32 + pcsp_offs[i]);
                t.resize(s + func_size, 0);
            }
            t.extend_from_slice(&names);
            t.extend_from_slice(&pcsp);
            (t, 0)
        }
        Layout::Go116 | Layout::Go118 | Layout::Go120 => {
            let new = layout != Layout::Go116;
            put_u32(
                &mut t,
                match layout {
                    Layout::Go116 => MAGIC_GO116,
                    Layout::Go118 => MAGIC_GO118,
                    _ => MAGIC_GO120,
                },
            );
            t.extend_from_slice(&[0, 0, 1, 8]);
            let nwords = if new { 8 } else { 7 };
            let hdr = 8 + nwords * 8;
            let funcname = hdr;
            let cu = funcname + names.len();
            // Empty cutab, filetab: 4 bytes each keep them distinct; pctab
            // holds the pcsp tables.
            let filetab = cu + 4;
            let pctab = filetab + 4;
            let pcln = pctab + pcsp.len();
            let fw = if new { 4 } else { 8 };
            let funcs_rel = (2 * n + 1) * fw;
            let func_size = 44;
            put_u64(&mut t, n as u64);
            put_u64(&mut t, 0);
            let ts_word = t.len();
            if new {
                put_u64(&mut t, text_start_word);
            }
            for x in [funcname, cu, filetab, pctab, pcln] {
                put_u64(&mut t, x as u64);
            }
            t.extend_from_slice(&names);
            t.extend_from_slice(&[0; 8]);
            t.extend_from_slice(&pcsp);
            for (i, (_, entry, _)) in funcs.iter().enumerate() {
                let fo = (funcs_rel + i * func_size) as u64;
                if new {
                    put_u32(&mut t, (entry - TEXT_VA) as u32);
                    put_u32(&mut t, fo as u32);
                } else {
                    put_u64(&mut t, *entry);
                    put_u64(&mut t, fo);
                }
            }
            if new {
                put_u32(&mut t, (end - TEXT_VA) as u32);
            } else {
                put_u64(&mut t, end);
            }
            for (i, (_, entry, _)) in funcs.iter().enumerate() {
                let s = t.len();
                if new {
                    put_u32(&mut t, (entry - TEXT_VA) as u32);
                } else {
                    put_u64(&mut t, *entry);
                }
                put_u32(&mut t, name_offs[i]);
                // args, deferreturn, then pcsp: from pctab's start.
                t.resize(t.len() + 8, 0);
                put_u32(&mut t, pcsp_offs[i]);
                t.resize(s + func_size, 0);
            }
            (t, if new { ts_word } else { 0 })
        }
    }
}

/// A Go 1.18+ inline `.go.buildinfo`.
pub fn buildinfo(go_version: &str, modinfo: &str) -> Vec<u8> {
    let mut b = BUILDINFO_MAGIC.to_vec();
    b.push(8);
    b.push(2);
    b.resize(32, 0);
    let framed = framed(modinfo);
    for s in [go_version.as_bytes(), &framed[..]] {
        let mut len = s.len();
        loop {
            let byte = (len & 0x7f) as u8;
            len >>= 7;
            if len == 0 {
                b.push(byte);
                break;
            }
            b.push(byte | 0x80);
        }
        b.extend_from_slice(s);
    }
    align(&mut b, 16, 0);
    b
}

fn framed(modinfo: &str) -> Vec<u8> {
    let mut m = b"0w\xaf\x0c\x92t\x08\x02A\xe1\xc1\x07\xe6\xd6\x18\xe6".to_vec();
    m.extend_from_slice(modinfo.as_bytes());
    m.extend_from_slice(b"\xf92C1\x86\x18 r\x00\x82B\x10A\x16\xd8\xf2");
    m
}

/// A Go 1.13–1.17 `.go.buildinfo` at `va`: two pointers to string headers.
pub fn buildinfo_pointers(va: u64, go_version: &str, modinfo: &str) -> Vec<u8> {
    let m = framed(modinfo);
    let mut b = BUILDINFO_MAGIC.to_vec();
    b.push(8);
    b.push(0);
    put_u64(&mut b, va + 32);
    put_u64(&mut b, va + 48);
    put_u64(&mut b, va + 64);
    put_u64(&mut b, go_version.len() as u64);
    put_u64(&mut b, va + 64 + go_version.len() as u64);
    put_u64(&mut b, m.len() as u64);
    b.extend_from_slice(go_version.as_bytes());
    b.extend_from_slice(&m);
    align(&mut b, 16, 0);
    b
}

struct Sec {
    name: &'static str,
    sh_type: u32,
    flags: u64,
    addr: u64,
    off: u64,
    size: u64,
    entsize: u64,
}

/// Builds the ELF file.
pub fn build(spec: &Spec) -> Built {
    let (code, funcs) = text(&spec.funcs);
    let pie = spec.pie_unrelocated;
    let (table, ts_word) = pclntab(spec.layout, &funcs, if pie { 0 } else { TEXT_VA });

    // File layout: ELF header, 2 program headers, text, data, section headers.
    let phnum = 2u16;
    let text_off = 0x100u64;
    let mut f = vec![0u8; text_off as usize];
    f.extend_from_slice(&code);
    align(&mut f, 16, 0);
    let data_off = f.len() as u64;
    let mut secs: Vec<Sec> = Vec::new();
    secs.push(Sec { name: ".text", sh_type: 1, flags: 6, addr: TEXT_VA, off: text_off, size: code.len() as u64, entsize: 0 });
    // Data: [prefix][pclntab][buildinfo][rela]
    let prefix = match spec.placement {
        Placement::DataRelRo => 0x40,
        _ => 0,
    };
    let data_start = f.len();
    // Some pointer-looking junk before the table, as in .data.rel.ro.
    for i in 0..prefix / 8 {
        put_u64(&mut f, TEXT_VA + i as u64 * 8);
    }
    let table_off = f.len() as u64;
    f.extend_from_slice(&table);
    align(&mut f, 16, 0);
    let table_sec_size = f.len() as u64 - data_off;
    let table_va = DATA_VA + (table_off - data_off);
    let bi_off = f.len() as u64;
    let bi_va = DATA_VA + (bi_off - data_off);
    let bi = match &spec.buildinfo {
        Some((v, m)) if spec.buildinfo_pointers => buildinfo_pointers(bi_va, v, m),
        Some((v, m)) => buildinfo(v, m),
        None => Vec::new(),
    };
    f.extend_from_slice(&bi);
    let rela_off = f.len() as u64;
    if pie {
        put_u64(&mut f, table_va + ts_word as u64);
        put_u64(&mut f, 8); // R_X86_64_RELATIVE
        put_u64(&mut f, TEXT_VA);
    }
    let rela_size = f.len() as u64 - rela_off;
    let data_size = (f.len() - data_start) as u64;
    match spec.placement {
        Placement::Section => secs.push(Sec {
            name: ".gopclntab",
            sh_type: 1,
            flags: 2,
            addr: table_va,
            off: table_off,
            size: table.len() as u64,
            entsize: 0,
        }),
        Placement::DataRelRo => {
            secs.push(Sec { name: ".data.rel.ro", sh_type: 1, flags: 3, addr: DATA_VA, off: data_off, size: table_sec_size, entsize: 0 })
        }
        Placement::NoSections => {}
    }
    if !bi.is_empty() {
        secs.push(Sec {
            name: ".go.buildinfo",
            sh_type: 1,
            flags: 3,
            addr: DATA_VA + (bi_off - data_off),
            off: bi_off,
            size: bi.len() as u64,
            entsize: 0,
        });
    }
    if pie {
        secs.push(Sec {
            name: ".rela.dyn",
            sh_type: 4,
            flags: 2,
            addr: DATA_VA + (rela_off - data_off),
            off: rela_off,
            size: rela_size,
            entsize: 24,
        });
    }
    // .shstrtab
    let mut shstr = vec![0u8];
    let mut name_idx = Vec::new();
    for s in &secs {
        name_idx.push(shstr.len() as u32);
        shstr.extend_from_slice(s.name.as_bytes());
        shstr.push(0);
    }
    let shstr_name = shstr.len() as u32;
    shstr.extend_from_slice(b".shstrtab\0");
    let with_sections = spec.placement != Placement::NoSections;
    let shstr_off = f.len() as u64;
    let mut shoff = 0u64;
    let mut shnum = 0u16;
    if with_sections {
        f.extend_from_slice(&shstr);
        align(&mut f, 8, 0);
        shoff = f.len() as u64;
        f.extend_from_slice(&[0u8; 64]); // SHN_UNDEF
        for (s, &ni) in secs.iter().zip(&name_idx) {
            put_u32(&mut f, ni);
            put_u32(&mut f, s.sh_type);
            put_u64(&mut f, s.flags);
            put_u64(&mut f, s.addr);
            put_u64(&mut f, s.off);
            put_u64(&mut f, s.size);
            put_u32(&mut f, 0);
            put_u32(&mut f, 0);
            put_u64(&mut f, 8);
            put_u64(&mut f, s.entsize);
        }
        put_u32(&mut f, shstr_name);
        put_u32(&mut f, 3);
        put_u64(&mut f, 0);
        put_u64(&mut f, 0);
        put_u64(&mut f, shstr_off);
        put_u64(&mut f, shstr.len() as u64);
        put_u32(&mut f, 0);
        put_u32(&mut f, 0);
        put_u64(&mut f, 1);
        put_u64(&mut f, 0);
        shnum = secs.len() as u16 + 2;
    }

    // ELF header.
    let mut h = Vec::new();
    h.extend_from_slice(b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0");
    put_u16(&mut h, if pie { 3 } else { 2 });
    put_u16(&mut h, 62);
    put_u32(&mut h, 1);
    put_u64(&mut h, TEXT_VA);
    put_u64(&mut h, 64);
    put_u64(&mut h, shoff);
    put_u32(&mut h, 0);
    put_u16(&mut h, 64);
    put_u16(&mut h, 56);
    put_u16(&mut h, phnum);
    put_u16(&mut h, 64);
    put_u16(&mut h, shnum);
    put_u16(&mut h, if with_sections { shnum - 1 } else { 0 });
    // Program headers: text (R X), data (R W).
    for (flags, off, va, size) in [(5u32, text_off, TEXT_VA, code.len() as u64), (6u32, data_off, DATA_VA, data_size)] {
        put_u32(&mut h, 1);
        put_u32(&mut h, flags);
        put_u64(&mut h, off);
        put_u64(&mut h, va);
        put_u64(&mut h, va);
        put_u64(&mut h, size);
        put_u64(&mut h, size);
        put_u64(&mut h, 0x1000);
    }
    f[..h.len()].copy_from_slice(&h);
    Built { bytes: f, funcs }
}

/// The default spec: the sample functions, a buildinfo.
pub fn spec(layout: Layout, placement: Placement) -> Spec {
    Spec {
        layout,
        placement,
        pie_unrelocated: false,
        funcs: sample_funcs().into_iter().map(|(n, c, _)| (n, c)).collect(),
        buildinfo: Some((
            "go1.21.4",
            "path\texample.com/tiny\nmod\texample.com/tiny\t(devel)\t\n\
             dep\tgithub.com/containerd/containerd\tv1.7.13\th1:abc=\n\
             dep\tgithub.com/x/y\tv0.1.0\th1:def=\n=>\t../y\t\t\n\
             build\tCGO_ENABLED=0\nbuild\t-ldflags=\"-s -w\"\n"
                .to_string(),
        )),
        buildinfo_pointers: false,
    }
}
