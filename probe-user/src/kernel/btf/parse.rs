//! The BTF blob: header, string section and type records, checked once at
//! parse time; then member lookups by dotted path.

use super::BtfError;
use std::path::Path;

/// Where the running kernel exposes its own BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

/// `BTF_MAGIC`, read little-endian.
const MAGIC: u16 = 0xeb9f;
/// `sizeof(struct btf_header)` for version 1; `hdr_len` may be larger.
const HEADER_LEN: usize = 24;
/// `sizeof(struct btf_type)`.
const TYPE_LEN: usize = 12;
/// `sizeof(struct btf_member)`.
const MEMBER_LEN: usize = 12;
/// Longest typedef/modifier chain, anonymous nesting or array nesting followed
/// before a blob is called malformed (guards against cycles).
const MAX_DEPTH: usize = 64;
/// Most struct members looked at while searching for one name (task_struct,
/// anonymous members included, has a few hundred).
const MEMBER_BUDGET: u32 = 1 << 20;

/// `BTF_KIND_*`: what a type record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Int,
    Ptr,
    Array,
    Struct,
    Union,
    Enum,
    Fwd,
    Typedef,
    Volatile,
    Const,
    Restrict,
    Func,
    FuncProto,
    Var,
    Datasec,
    Float,
    DeclTag,
    TypeTag,
    Enum64,
}

impl Kind {
    fn from_raw(k: u32) -> Option<Kind> {
        Some(match k {
            1 => Kind::Int,
            2 => Kind::Ptr,
            3 => Kind::Array,
            4 => Kind::Struct,
            5 => Kind::Union,
            6 => Kind::Enum,
            7 => Kind::Fwd,
            8 => Kind::Typedef,
            9 => Kind::Volatile,
            10 => Kind::Const,
            11 => Kind::Restrict,
            12 => Kind::Func,
            13 => Kind::FuncProto,
            14 => Kind::Var,
            15 => Kind::Datasec,
            16 => Kind::Float,
            17 => Kind::DeclTag,
            18 => Kind::TypeTag,
            19 => Kind::Enum64,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Int => "int",
            Kind::Ptr => "pointer",
            Kind::Array => "array",
            Kind::Struct => "struct",
            Kind::Union => "union",
            Kind::Enum => "enum",
            Kind::Fwd => "forward declaration",
            Kind::Typedef => "typedef",
            Kind::Volatile => "volatile",
            Kind::Const => "const",
            Kind::Restrict => "restrict",
            Kind::Func => "function",
            Kind::FuncProto => "function prototype",
            Kind::Var => "variable",
            Kind::Datasec => "data section",
            Kind::Float => "float",
            Kind::DeclTag => "decl tag",
            Kind::TypeTag => "type tag",
            Kind::Enum64 => "enum64",
        }
    }

    fn is_composite(self) -> bool {
        matches!(self, Kind::Struct | Kind::Union)
    }

    /// Bytes of kind-specific data after the `btf_type` record.
    fn trailing_len(self, vlen: usize) -> usize {
        match self {
            Kind::Int | Kind::Var | Kind::DeclTag => 4,
            Kind::Array => 12,
            Kind::Struct | Kind::Union | Kind::Datasec | Kind::Enum64 => vlen * 12,
            Kind::Enum | Kind::FuncProto => vlen * 8,
            Kind::Ptr
            | Kind::Fwd
            | Kind::Typedef
            | Kind::Volatile
            | Kind::Const
            | Kind::Restrict
            | Kind::Func
            | Kind::Float
            | Kind::TypeTag => 0,
        }
    }
}

/// One `struct btf_type`, with where its trailing data starts.
#[derive(Clone, Copy, Debug)]
struct Type {
    kind: Kind,
    kind_flag: bool,
    vlen: u16,
    name_off: u32,
    /// `size` for ints, structs, unions, enums, floats; `type` for the rest.
    size_or_type: u32,
    /// Byte offset in [`Btf::data`] of the data after the record; all of it
    /// (see [`Kind::trailing_len`]) was checked to lie in the type section.
    extra: usize,
}

/// One `struct btf_member`, decoded.
#[derive(Clone, Copy, Debug)]
struct RawMember {
    name_off: u32,
    type_id: u32,
    bit_offset: u32,
    /// Nonzero only for bitfields in a struct with `kind_flag` set.
    bitfield_size: u32,
}

/// Where a member is, relative to the start of the outermost struct, and its type.
#[derive(Clone, Copy, Debug)]
struct Found {
    bit_offset: u64,
    bitfield_size: u32,
    type_id: u32,
}

/// Where a member lies in a struct, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    /// From the start of the outermost struct.
    pub offset: u32,
    /// Of the member's type, after typedefs and modifiers (pointers are 8).
    pub size: u32,
}

/// A parsed, bounds-checked BTF blob (the kernel's, or any other base BTF).
pub struct Btf {
    data: Vec<u8>,
    /// Start and end of the string section in `data`.
    strs: (usize, usize),
    /// Type id `n` is `types[n - 1]`; id 0 is `void`.
    types: Vec<Type>,
    /// Ids of the named structs and unions, in id order.
    composites: Vec<u32>,
}

impl std::fmt::Debug for Btf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Btf")
            .field("bytes", &self.data.len())
            .field("types", &self.types.len())
            .field("structs_and_unions", &self.composites.len())
            .finish()
    }
}

fn u32_at(data: &[u8], pos: usize) -> Option<u32> {
    let bytes = data.get(pos..pos.checked_add(4)?)?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

fn malformed(msg: impl Into<String>) -> BtfError {
    BtfError::Malformed(msg.into())
}

/// The byte range of a section, `off..off + len` after the header.
fn section(name: &str, hdr_len: usize, off: u32, len: u32, total: usize) -> Result<(usize, usize), BtfError> {
    let start = hdr_len.checked_add(off as usize);
    let end = start.and_then(|s| s.checked_add(len as usize));
    match (start, end) {
        (Some(start), Some(end)) if end <= total => Ok((start, end)),
        _ => Err(malformed(format!(
            "truncated: {name} section (offset {off}, {len} bytes after a {hdr_len}-byte header) \
             runs past the end of the {total}-byte blob"
        ))),
    }
}

impl Btf {
    /// Reads and parses the running kernel's BTF, [`VMLINUX_BTF`].
    pub fn from_sys_fs() -> Result<Btf, BtfError> {
        Btf::from_file(VMLINUX_BTF)
    }

    /// Reads and parses a raw BTF file (not an ELF's `.BTF` section).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Btf, BtfError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| BtfError::Read { path: path.to_path_buf(), source })?;
        Btf::parse(bytes)
    }

    /// Parses a raw BTF blob, checking the header and that every type record
    /// and its trailing data lie inside the type section.
    pub fn parse(data: Vec<u8>) -> Result<Btf, BtfError> {
        let Some(&[m0, m1, version, _flags]) = data.first_chunk::<4>() else {
            return Err(malformed(format!("truncated: {} bytes, shorter than the BTF magic and version", data.len())));
        };
        let magic = u16::from_le_bytes([m0, m1]);
        if magic != MAGIC {
            if u16::from_be_bytes([m0, m1]) == MAGIC {
                return Err(BtfError::BigEndian);
            }
            return Err(BtfError::BadMagic(magic));
        }
        if version != 1 {
            return Err(BtfError::Version(version));
        }
        let field = |i: usize| {
            u32_at(&data, 4 + 4 * i)
                .ok_or_else(|| malformed(format!("truncated: {} bytes, shorter than the {HEADER_LEN}-byte header", data.len())))
        };
        let hdr_len = field(0)? as usize;
        let (type_off, type_len, str_off, str_len) = (field(1)?, field(2)?, field(3)?, field(4)?);
        if hdr_len < HEADER_LEN {
            return Err(malformed(format!("header length {hdr_len} is shorter than {HEADER_LEN}")));
        }
        if hdr_len > data.len() {
            return Err(malformed(format!("truncated: header length {hdr_len} is longer than the {}-byte blob", data.len())));
        }
        let (types_start, types_end) = section("type", hdr_len, type_off, type_len, data.len())?;
        let strs = section("string", hdr_len, str_off, str_len, data.len())?;

        let mut types = Vec::with_capacity(type_len as usize / 24);
        let mut composites = Vec::new();
        let mut pos = types_start;
        while pos < types_end {
            let id = types.len() + 1;
            let extra = pos + TYPE_LEN;
            let record =
                (extra <= types_end).then(|| Some((u32_at(&data, pos)?, u32_at(&data, pos + 4)?, u32_at(&data, pos + 8)?))).flatten();
            let Some((name_off, info, size_or_type)) = record else {
                return Err(malformed(format!(
                    "truncated: type id {id} at byte {pos} runs past the end of the type section (byte {types_end})"
                )));
            };
            let raw_kind = (info >> 24) & 0x1f;
            let kind = Kind::from_raw(raw_kind).ok_or_else(|| malformed(format!("type id {id} has unknown kind {raw_kind}")))?;
            let vlen = (info & 0xffff) as u16;
            let next = extra + kind.trailing_len(vlen as usize);
            if next > types_end {
                return Err(malformed(format!(
                    "truncated: type id {id} ({}, {vlen} entries) runs past the end of the type section (byte {types_end})",
                    kind.name()
                )));
            }
            if kind.is_composite() && name_off != 0 {
                composites.push(id as u32);
            }
            types.push(Type { kind, kind_flag: info >> 31 != 0, vlen, name_off, size_or_type, extra });
            pos = next;
        }
        Ok(Btf { data, strs, types, composites })
    }

    /// How many types there are (the highest type id).
    pub fn type_count(&self) -> usize {
        self.types.len()
    }

    /// Byte offset of `path` (dotted: `"pid"`, `"thread.fsbase"`) in struct
    /// `struct_name`, searching anonymous structs and unions on the way.
    pub fn member_offset(&self, struct_name: &str, path: &str) -> Result<u32, BtfError> {
        Ok(self.resolve(struct_name, path)?.0)
    }

    /// Size in bytes of the type of `path` in struct `struct_name`, after
    /// typedefs and modifiers: ints, enums, pointers (8), structs, unions, arrays.
    pub fn member_size(&self, struct_name: &str, path: &str) -> Result<u32, BtfError> {
        self.member(struct_name, path).map(|m| m.size)
    }

    /// Both the offset and the size of `path` in struct `struct_name`.
    pub fn member(&self, struct_name: &str, path: &str) -> Result<Member, BtfError> {
        let (offset, type_id) = self.resolve(struct_name, path)?;
        let size = self.type_size(type_id).map_err(|e| BtfError::Path {
            struct_name: struct_name.to_string(),
            path: path.to_string(),
            reason: format!("no size: {e}"),
        })?;
        Ok(Member { offset, size })
    }

    /// `sizeof(struct name)` (or of the union, if there is no such struct).
    pub fn struct_size(&self, name: &str) -> Result<u32, BtfError> {
        Ok(self.ty(self.struct_id(name)?)?.size_or_type)
    }

    /// The id of the first struct named `name`, else of the first such union.
    fn struct_id(&self, name: &str) -> Result<u32, BtfError> {
        let named = |want: Kind| {
            self.composites
                .iter()
                .copied()
                .find(|&id| self.ty(id).is_ok_and(|t| t.kind == want && self.str_bytes(t.name_off).is_ok_and(|n| n == name.as_bytes())))
        };
        named(Kind::Struct).or_else(|| named(Kind::Union)).ok_or_else(|| BtfError::NoStruct(name.to_string()))
    }

    fn ty(&self, id: u32) -> Result<&Type, BtfError> {
        let found = (id as usize).checked_sub(1).and_then(|i| self.types.get(i));
        found.ok_or_else(|| match id {
            0 => malformed("type id 0 (void) where a real type was needed"),
            _ => malformed(format!("type id {id} out of range (there are {} types)", self.types.len())),
        })
    }

    /// The NUL-terminated string at `off` in the string section.
    fn str_bytes(&self, off: u32) -> Result<&[u8], BtfError> {
        let bad = || malformed(format!("string offset {off} is not a NUL-terminated string in the string section"));
        let tail = self.data.get(self.strs.0..self.strs.1).and_then(|s| s.get(off as usize..)).ok_or_else(bad)?;
        let end = tail.iter().position(|&b| b == 0).ok_or_else(bad)?;
        tail.get(..end).ok_or_else(bad)
    }

    /// "struct foo", "union (anonymous)", "typedef bar": for error messages.
    fn describe(&self, id: u32) -> String {
        match self.ty(id) {
            Ok(t) => match self.str_bytes(t.name_off) {
                Ok(n) if !n.is_empty() => format!("{} {}", t.kind.name(), String::from_utf8_lossy(n)),
                _ => format!("{} (anonymous, type id {id})", t.kind.name()),
            },
            Err(_) => format!("type id {id}"),
        }
    }

    /// Follows typedefs, `const`, `volatile`, `restrict` and type tags.
    fn skip_modifiers(&self, mut id: u32) -> Result<u32, BtfError> {
        for _ in 0..MAX_DEPTH {
            if id == 0 {
                return Ok(0);
            }
            let t = self.ty(id)?;
            match t.kind {
                Kind::Typedef | Kind::Const | Kind::Volatile | Kind::Restrict | Kind::TypeTag => id = t.size_or_type,
                _ => return Ok(id),
            }
        }
        Err(malformed(format!("typedef/modifier chain longer than {MAX_DEPTH} at type id {id} (a cycle?)")))
    }

    fn raw_member(&self, t: &Type, i: usize) -> Result<RawMember, BtfError> {
        let pos = t.extra + i * MEMBER_LEN;
        let read = |at: usize| u32_at(&self.data, pos + at).ok_or_else(|| malformed(format!("member {i} out of bounds")));
        let (name_off, type_id, offset) = (read(0)?, read(4)?, read(8)?);
        let (bit_offset, bitfield_size) = if t.kind_flag { (offset & 0xff_ffff, offset >> 24) } else { (offset, 0) };
        Ok(RawMember { name_off, type_id, bit_offset, bitfield_size })
    }

    /// Finds member `name` in struct/union `id`, looking inside anonymous
    /// struct and union members too (as C does).
    /// `budget` caps the members looked at, so a hostile blob of anonymous
    /// members nested many times over can't make the search take forever.
    fn find_member(&self, id: u32, name: &[u8], depth: usize, budget: &mut u32) -> Result<Option<Found>, BtfError> {
        if depth > MAX_DEPTH {
            return Err(malformed(format!("anonymous members nested deeper than {MAX_DEPTH} (a cycle?)")));
        }
        let t = self.ty(id)?;
        for i in 0..t.vlen as usize {
            *budget = budget.checked_sub(1).ok_or_else(|| malformed(format!("more than {MEMBER_BUDGET} members searched for one name")))?;
            let m = self.raw_member(t, i)?;
            let member_name = if m.name_off == 0 { &[][..] } else { self.str_bytes(m.name_off)? };
            if !member_name.is_empty() {
                if member_name == name {
                    let found = Found { bit_offset: m.bit_offset.into(), bitfield_size: m.bitfield_size, type_id: m.type_id };
                    return Ok(Some(found));
                }
                continue;
            }
            let inner = self.skip_modifiers(m.type_id)?;
            if inner == 0 || !self.ty(inner)?.kind.is_composite() {
                continue;
            }
            if let Some(f) = self.find_member(inner, name, depth + 1, budget)? {
                return Ok(Some(Found { bit_offset: f.bit_offset + u64::from(m.bit_offset), ..f }));
            }
        }
        Ok(None)
    }

    /// Walks `path` from struct `struct_name`: the byte offset and the member's type id.
    fn resolve(&self, struct_name: &str, path: &str) -> Result<(u32, u32), BtfError> {
        let path_err = |reason: String| BtfError::Path { struct_name: struct_name.to_string(), path: path.to_string(), reason };
        if path.is_empty() || path.split('.').any(str::is_empty) {
            return Err(path_err("empty member name in path".to_string()));
        }
        let mut type_id = self.struct_id(struct_name)?;
        let mut bits = 0u64;
        let mut prev = struct_name;
        for member in path.split('.') {
            let container = self.skip_modifiers(type_id)?;
            let kind = if container == 0 { None } else { Some(self.ty(container)?.kind) };
            if !kind.is_some_and(Kind::is_composite) {
                return Err(BtfError::NotComposite {
                    struct_name: struct_name.to_string(),
                    path: path.to_string(),
                    member: prev.to_string(),
                    kind: kind.map_or("void", Kind::name),
                    next: member.to_string(),
                });
            }
            let mut budget = MEMBER_BUDGET;
            let found = self.find_member(container, member.as_bytes(), 0, &mut budget)?.ok_or_else(|| BtfError::NoMember {
                struct_name: struct_name.to_string(),
                path: path.to_string(),
                member: member.to_string(),
                container: self.describe(container),
            })?;
            let int_bits = self.int_bitfield(found.type_id)?;
            if found.bitfield_size != 0 || found.bit_offset % 8 != 0 || int_bits.is_some() {
                let width = match (found.bitfield_size, int_bits) {
                    (0, Some(b)) => b,
                    (0, None) => self.type_size(found.type_id).map_or(0, |s| s.saturating_mul(8)),
                    (b, _) => b,
                };
                return Err(BtfError::Bitfield {
                    struct_name: struct_name.to_string(),
                    path: path.to_string(),
                    member: member.to_string(),
                    bit_offset: bits.saturating_add(found.bit_offset),
                    bits: width,
                });
            }
            bits = bits.checked_add(found.bit_offset).ok_or_else(|| path_err("offset overflows".to_string()))?;
            type_id = found.type_id;
            prev = member;
        }
        let offset = u32::try_from(bits / 8).map_err(|_| path_err(format!("offset of {bits} bits is too large")))?;
        Ok((offset, type_id))
    }

    /// For an old-style bitfield (struct without `kind_flag`), the member's
    /// type is an int whose encoding gives fewer bits than its size or a bit
    /// offset: returns the bit count then.
    fn int_bitfield(&self, id: u32) -> Result<Option<u32>, BtfError> {
        if id == 0 {
            return Ok(None);
        }
        let t = self.ty(id)?;
        if t.kind != Kind::Int {
            return Ok(None);
        }
        let enc = u32_at(&self.data, t.extra).ok_or_else(|| malformed(format!("int type id {id} out of bounds")))?;
        let (nr_bits, bit_off) = (enc & 0xff, (enc >> 16) & 0xff);
        let full = u64::from(t.size_or_type) * 8;
        Ok((u64::from(nr_bits) != full || bit_off != 0).then_some(nr_bits))
    }

    /// Size in bytes of type `id` after typedefs and modifiers.
    fn type_size(&self, id: u32) -> Result<u32, BtfError> {
        let mut id = id;
        let mut count = 1u32;
        for _ in 0..MAX_DEPTH {
            id = self.skip_modifiers(id)?;
            if id == 0 {
                return Err(malformed("void has no size"));
            }
            let t = self.ty(id)?;
            let size = match t.kind {
                Kind::Int | Kind::Struct | Kind::Union | Kind::Enum | Kind::Enum64 | Kind::Float | Kind::Datasec => t.size_or_type,
                Kind::Ptr => 8,
                Kind::Array => {
                    let nelems = u32_at(&self.data, t.extra + 8).ok_or_else(|| malformed(format!("array type id {id} out of bounds")))?;
                    count = count.checked_mul(nelems).ok_or_else(|| malformed(format!("array type id {id} is too large")))?;
                    id = u32_at(&self.data, t.extra).ok_or_else(|| malformed(format!("array type id {id} out of bounds")))?;
                    continue;
                }
                other => return Err(malformed(format!("{} (type id {id}) has no size", other.name()))),
            };
            return count.checked_mul(size).ok_or_else(|| malformed(format!("type id {id}: size overflows")));
        }
        Err(malformed(format!("arrays nested deeper than {MAX_DEPTH} (a cycle?)")))
    }
}
