//! The Go build information: toolchain version and module list, from the
//! `.go.buildinfo` section (what `go version -m` prints).
//!
//! Layout (Go's `debug/buildinfo`): a 32-byte header that starts with the
//! magic `"\xff Go buildinf:"`, then a pointer size byte and a flags byte
//! (bit 0: big-endian pointers; bit 1: inline strings).
//!
//! * **Go 1.18+** (inline): at offset 32, two strings each prefixed by a
//!   uvarint length: the Go version, then the module info.
//! * **Go 1.13–1.17** (pointers): at offset 16, two pointers to Go string
//!   headers `(data pointer, length)`, for the version and the module info.
//!   In a PIE these pointers may be unrelocated in the file; then the version
//!   is simply not found.
//!
//! The module info is framed by two 16-byte sentinels and holds tab-separated
//! lines: `path`, `mod`, `dep`, `=>` (replacement of the line before), `build`.

use super::elf::{read_uint, Elf, PF_X};

/// `"\xff Go buildinf:"`.
pub const BUILDINFO_MAGIC: &[u8; 14] = b"\xff Go buildinf:";

/// A module from the build info (`mod` or `dep` line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Module {
    /// Module path, e.g. `github.com/containerd/containerd`.
    pub path: String,
    /// Module version, e.g. `v1.7.13`, or `(devel)` for a main module built
    /// from a work tree.
    pub version: String,
    /// The `h1:` checksum, if recorded.
    pub sum: Option<String>,
    /// The module that replaced this one (`=>` line), if any.
    pub replace: Option<Box<Module>>,
}

/// What `go version -m` shows for a binary.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BuildInfo {
    /// The Go toolchain version, e.g. `go1.19.8`.
    pub go_version: String,
    /// The main package path (`path` line), e.g.
    /// `github.com/containerd/containerd/cmd/containerd`.
    pub path: Option<String>,
    /// The main module (`mod` line). Absent in GOPATH-mode builds such as
    /// Debian's packages.
    pub main: Option<Module>,
    /// The dependencies (`dep` lines), in file order.
    pub deps: Vec<Module>,
    /// The `build` settings as `(key, value)`, e.g. `("CGO_ENABLED", "1")`.
    pub settings: Vec<(String, String)>,
}

impl BuildInfo {
    /// Reads the build info of `elf` (whose bytes are `data`): the
    /// `.go.buildinfo` section, else a 16-aligned magic in a writable
    /// PT_LOAD segment. `None` if absent or unreadable.
    pub fn from_elf(elf: &Elf, data: &[u8]) -> Option<BuildInfo> {
        if let Some(sec) = elf.section(".go.buildinfo") {
            if let Some(b) = elf.section_data(data, sec) {
                if b.starts_with(BUILDINFO_MAGIC) {
                    return parse_at(elf, data, b);
                }
            }
        }
        for seg in elf.load_segments() {
            if seg.flags & PF_X != 0 {
                continue;
            }
            let b = elf.segment_data(data, seg);
            let mut pos = ((16 - (seg.vaddr % 16)) % 16) as usize;
            while pos + BUILDINFO_MAGIC.len() <= b.len() {
                if b[pos..].starts_with(BUILDINFO_MAGIC) {
                    if let Some(info) = parse_at(elf, data, &b[pos..]) {
                        return Some(info);
                    }
                }
                pos += 16;
            }
        }
        None
    }

    /// The module `path`: the main module or a dependency.
    pub fn module(&self, path: &str) -> Option<&Module> {
        self.main.iter().chain(self.deps.iter()).find(|m| m.path == path)
    }

    /// The version of module `path` as built (the replacement's version if
    /// it was replaced), e.g. to tell containerd 1.6 from 1.7 or 2.x.
    pub fn module_version(&self, path: &str) -> Option<&str> {
        let m = self.module(path)?;
        Some(m.replace.as_deref().map_or(m.version.as_str(), |r| r.version.as_str()))
    }

    /// A `build` setting, e.g. `setting("CGO_ENABLED")`.
    pub fn setting(&self, key: &str) -> Option<&str> {
        self.settings.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Parses the module info text (with or without its sentinel framing)
    /// into `path`, `main`, `deps` and `settings`.
    pub fn parse_modinfo(&mut self, modinfo: &str) {
        let mut last_dep = false;
        for line in modinfo.lines() {
            let mut f = line.split('\t');
            match f.next() {
                Some("path") => {
                    self.path = f.next().map(str::to_string);
                    last_dep = false;
                }
                Some("mod") => {
                    self.main = module_fields(f);
                    last_dep = false;
                }
                Some("dep") => {
                    if let Some(m) = module_fields(f) {
                        self.deps.push(m);
                        last_dep = true;
                    }
                }
                Some("=>") => {
                    let r = module_fields(f).map(Box::new);
                    let target = if last_dep { self.deps.last_mut() } else { self.main.as_mut() };
                    if let Some(m) = target {
                        m.replace = r;
                    }
                }
                Some("build") => {
                    if let Some(kv) = f.next() {
                        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                        self.settings.push((k.to_string(), v.trim_matches('"').to_string()));
                    }
                }
                _ => {}
            }
        }
    }
}

fn module_fields<'a>(mut f: impl Iterator<Item = &'a str>) -> Option<Module> {
    let path = f.next().filter(|p| !p.is_empty())?.to_string();
    let version = f.next().unwrap_or("").to_string();
    let sum = f.next().filter(|s| !s.is_empty()).map(str::to_string);
    Some(Module { path, version, sum, replace: None })
}

/// Parses the header at the start of `b` (which starts with the magic).
fn parse_at(elf: &Elf, data: &[u8], b: &[u8]) -> Option<BuildInfo> {
    let ptr_size = *b.get(14)?;
    let flags = *b.get(15)?;
    let (version, modinfo) = if flags & 2 != 0 {
        let rest = b.get(32..)?;
        let (v, n) = varint_string(rest)?;
        let (m, _) = varint_string(rest.get(n..)?)?;
        (v.to_vec(), m.to_vec())
    } else {
        if !matches!(ptr_size, 4 | 8) {
            return None;
        }
        let big = flags & 1 != 0;
        let ps = usize::from(ptr_size);
        let vptr = read_uint(b, 16, ptr_size, big)?;
        let mptr = read_uint(b, 16 + ps, ptr_size, big)?;
        let v = read_go_string(elf, data, vptr, ptr_size, big)?;
        let m = read_go_string(elf, data, mptr, ptr_size, big).unwrap_or_default();
        (v, m)
    };
    let go_version = String::from_utf8(version).ok()?;
    if !(go_version.starts_with("go") || go_version.starts_with("devel")) {
        return None;
    }
    let mut info = BuildInfo { go_version, ..BuildInfo::default() };
    let modinfo = String::from_utf8_lossy(strip_framing(&modinfo));
    info.parse_modinfo(&modinfo);
    Some(info)
}

/// Strips the 16-byte sentinels around the module info, as `debug/buildinfo`
/// does: only if the text is long enough and a newline sits just before the
/// trailing sentinel; anything else is not module info.
fn strip_framing(b: &[u8]) -> &[u8] {
    if b.len() >= 33 && b[b.len() - 17] == b'\n' {
        &b[16..b.len() - 16]
    } else {
        &[]
    }
}

/// A uvarint-length-prefixed string; returns it and the bytes consumed.
fn varint_string(b: &[u8]) -> Option<(&[u8], usize)> {
    let mut len: u64 = 0;
    let mut shift = 0u32;
    let mut i = 0usize;
    loop {
        let byte = *b.get(i)?;
        i += 1;
        if shift >= 64 {
            return None;
        }
        len |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            break;
        }
        shift += 7;
    }
    let len = usize::try_from(len).ok()?;
    let end = i.checked_add(len)?;
    Some((b.get(i..end)?, end))
}

/// Reads a Go string header `(data, len)` at `va`, then its bytes.
fn read_go_string(elf: &Elf, data: &[u8], va: u64, ptr_size: u8, big: bool) -> Option<Vec<u8>> {
    let hdr = elf.read_va(data, va, 2 * u64::from(ptr_size))?;
    let p = read_uint(hdr, 0, ptr_size, big)?;
    let n = read_uint(hdr, usize::from(ptr_size), ptr_size, big)?;
    elf.read_va(data, p, n).map(<[u8]>::to_vec)
}
