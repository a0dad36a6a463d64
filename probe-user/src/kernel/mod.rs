//! The kernel side, seen from userspace: which probes exist and in which
//! variant this kernel takes them (`probes`), the loader that attaches them and
//! hands out their maps (`loader`), and the BTF reads behind the field offsets
//! the programs need (`btf`), the exit that leaves the slow last closes of
//! the probes to a child (`handoff`), and the questions asked over a netlink
//! socket of our own (`netlink`: generic netlink families, sock_diag).
//! Everything above reads the kernel through here.

pub mod btf;
pub mod handoff;
pub mod loader;
pub mod netlink;
pub mod pin_code;
pub mod probes;
