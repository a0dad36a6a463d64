//! Kernel struct layouts from the running kernel's BTF.
//!
//! Rust eBPF (aya) gets no CO-RE relocations, so the eBPF programs can't ask
//! the loader to fix up `task->tgid`: the byte offsets have to be read here, at
//! load time, from `/sys/kernel/btf/vmlinux` (world-readable, so no root) and
//! passed in as read-only globals.
//!
//! aya-obj's `Btf` keeps struct members private and the one BTF crate that
//! exposes them (btf-rs) is LGPL, so this is a small reader of our own. It
//! knows only what field lookups need (the format is
//! <https://docs.kernel.org/bpf/btf.html>):
//!
//! - [`Btf`] checks the whole blob once, bounds-checking every record, and then
//!   answers [`Btf::member_offset`], [`Btf::member_size`] and
//!   [`Btf::struct_size`] for dotted paths such as `"thread.fsbase"`, seeing
//!   through typedefs, `const`/`volatile` and anonymous structs and unions.
//! - [`KernelOffsets`] is every field plegwatch reads, from one parse; a field
//!   this kernel lacks is `None` with its reason, and the others still load.
//!
//! A malformed blob is an error, never a panic. Only little-endian BTF is read
//! (every kernel plegwatch runs on is x86_64 or arm64).

mod offsets;
mod parse;
#[cfg(test)]
mod tests;

pub use offsets::{Field, KernelOffsets};
pub use parse::{Btf, Member, VMLINUX_BTF};

use std::path::PathBuf;
use thiserror::Error;

/// Why BTF could not be read or a field could not be found in it.
#[derive(Debug, Error)]
pub enum BtfError {
    #[error("reading BTF from {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("BTF blob is big-endian (magic bytes eb 9f); only little-endian BTF is supported")]
    BigEndian,
    #[error("not a BTF blob: magic is {0:#06x}, expected 0xeb9f")]
    BadMagic(u16),
    #[error("unsupported BTF version {0} (only version 1 is known)")]
    Version(u8),
    #[error("malformed BTF: {0}")]
    Malformed(String),
    #[error("BTF has no struct or union named `{0}`")]
    NoStruct(String),
    #[error("BTF: `{struct_name}.{path}`: {container} has no member `{member}`")]
    NoMember {
        struct_name: String,
        path: String,
        member: String,
        /// The struct or union searched, e.g. "struct thread_struct".
        container: String,
    },
    #[error("BTF: `{struct_name}.{path}`: `{member}` is a {kind}, not a struct or union, so it has no member `{next}`")]
    NotComposite { struct_name: String, path: String, member: String, kind: &'static str, next: String },
    #[error("BTF: `{struct_name}.{path}`: `{member}` is a bitfield ({bits} bits at bit offset {bit_offset}), not byte-addressable")]
    Bitfield { struct_name: String, path: String, member: String, bit_offset: u64, bits: u32 },
    #[error("BTF: `{struct_name}.{path}`: {reason}")]
    Path { struct_name: String, path: String, reason: String },
}
