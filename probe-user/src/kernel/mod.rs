//! The kernel side, seen from userspace: which probes exist and in which
//! variant this kernel takes them (`probes`), the loader that attaches them and
//! hands out their maps (`loader`), and the BTF reads behind the field offsets
//! the programs need (`btf`), and the exit that leaves the slow last closes of
//! the probes to a child (`handoff`). Everything above reads the kernel through here.

pub mod btf;
pub mod handoff;
pub mod loader;
pub mod probes;
