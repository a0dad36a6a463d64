//! The kernel side, seen from userspace: which probes exist and in which
//! variant this kernel takes them (`probes`), the loader that attaches them and
//! hands out their maps (`loader`), and the BTF reads behind the field offsets
//! the programs need (`btf`). Everything above reads the kernel through here.

pub mod btf;
pub mod loader;
pub mod probes;
