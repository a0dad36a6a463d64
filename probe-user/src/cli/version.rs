//! `--version`: the crate's version, the embedded eBPF object's fingerprint
//! (the first 12 hex digits of its SHA-256) and the git commit it was built
//! from, when build.rs could read one.

use sha2::{Digest, Sha256};
use std::sync::LazyLock;

/// `0.1.0 (ebpf 1a2b3c4d5e6f, commit e4cfc1d)`.
static SHORT: LazyLock<String> = LazyLock::new(|| format!("{} (ebpf {}, commit {})", env!("CARGO_PKG_VERSION"), ebpf_sha(), commit()));

/// The short line, and the object's size and full digest (`--version` vs `-V`).
static LONG: LazyLock<String> = LazyLock::new(|| {
    let obj = crate::kernel::loader::probes_object();
    format!("{}\neBPF object: {} bytes, sha256 {}", SHORT.as_str(), obj.len(), hex(&Sha256::digest(obj)))
});

/// What `-V` prints after the name.
pub fn short() -> &'static str {
    SHORT.as_str()
}

/// What `--version` prints after the name.
pub fn long() -> &'static str {
    LONG.as_str()
}

/// The first 12 hex digits of the embedded eBPF object's SHA-256.
pub fn ebpf_sha() -> String {
    hex(&Sha256::digest(crate::kernel::loader::probes_object()))[..12].to_string()
}

/// The git short hash build.rs found (with `-dirty` for uncommitted changes), or `unknown`.
pub fn commit() -> &'static str {
    option_env!("PLEGWATCH_GIT_COMMIT").filter(|c| !c.is_empty()).unwrap_or("unknown")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_version_names_the_ebpf_object_and_the_commit() {
        let v = super::short();
        assert!(v.starts_with(env!("CARGO_PKG_VERSION")), "{v}");
        let sha = super::ebpf_sha();
        assert_eq!(sha.len(), 12);
        assert!(sha.chars().all(|c| c.is_ascii_hexdigit()), "{sha}");
        assert!(v.contains(&format!("ebpf {sha}")) && v.contains("commit "), "{v}");
        assert!(super::long().contains(&format!("{} bytes", crate::kernel::loader::probes_object().len())));
    }
}
