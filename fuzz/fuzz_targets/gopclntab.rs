//! Untrusted ELF files: finding and parsing the Go pclntab and build info,
//! name lookups, RET decoding, pcsp tables and unwinding must never panic, loop or allocate beyond
//! what the input holds.
//!
//! Input: the bytes of an ELF file (seeds: small synthetic Go-like ELFs in
//! each pclntab layout and placement, from `gosym::tests::fuzz_seeds`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use plegwatch_proto::gosym::{probe_points_in, ret_addresses_in, unwind, GoSymbols, ReadMem, Regs};

/// The input's own bytes as a process's memory, from address 0.
struct Bytes<'a>(&'a [u8]);

impl ReadMem for Bytes<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> bool {
        let Ok(a) = usize::try_from(addr) else { return false };
        match self.0.get(a..a.saturating_add(buf.len())) {
            Some(b) if b.len() == buf.len() => {
                buf.copy_from_slice(b);
                true
            }
            _ => false,
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(syms) = GoSymbols::from_elf(data) else {
        return;
    };
    let _ = syms.version();
    let _ = syms.build_info().map(|b| b.module_version("github.com/containerd/containerd"));
    let _ = syms.elf().tls_segment();
    // The code that loads g from TLS, decoded from whatever runtime.stackcheck holds.
    if let Ok(t) = plegwatch_proto::gosym::g_tls_offset(&syms, data) {
        let _ = t.offset;
    }
    let mut last_entry = 0u64;
    for (i, f) in syms.functions().enumerate() {
        // Address order and well-formed ranges, as parsing checked.
        assert!(f.entry >= last_entry && f.end >= f.entry);
        last_entry = f.entry;
        // Names that are not UTF-8 are shown lossily (U+FFFD) and cannot be
        // looked up by that form; every other listed name is found.
        if i < 256 && !f.name.contains('\u{fffd}') {
            // Its first holder is at or before it.
            let first = syms.lookup(&f.name);
            assert!(first.is_some_and(|g| g.name == f.name && g.entry <= f.entry));
            assert!(syms.lookup_all(&f.name).contains(&f));
        }
        if i < 256 {
            if f.end > f.entry {
                // Zero-size functions share their entry with the next one.
                assert!(syms.function_at(f.entry).is_some_and(|g| g.entry == f.entry));
            }
            if let Ok(rets) = ret_addresses_in(syms.elf(), data, &f) {
                assert!(rets.iter().all(|&r| r >= f.entry && r < f.end));
            }
            let _ = probe_points_in(syms.elf(), data, &f);
            // pc-value tables: decode to the end or fail cleanly; the walk is bounded.
            let _ = syms.pcsp_runs(f.entry);
            let _ = syms.frame_size_at(f.entry.wrapping_add(1));
            if i < 16 {
                let u = unwind(Regs { pc: f.entry, sp: 0, bp: 0, return_address: i % 2 == 1 }, &Bytes(data), &syms, 0, 32);
                assert!(u.frames.len() <= 32);
            }
        }
    }
    assert!(syms.lookup("\u{0}no such function").is_none());
});
