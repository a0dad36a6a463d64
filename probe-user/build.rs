//! Builds the eBPF programs in `probe-ebpf/` (nightly, `-Z build-std=core`,
//! bpf-linker) and leaves the object in `OUT_DIR/plegwatch-probes`.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../probe-ebpf");
    println!("cargo:rerun-if-changed={root}/abi/src");
    aya_build::build_ebpf(
        [aya_build::Package { name: "plegwatch-ebpf", root_dir: root, ..Default::default() }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs (needs `cargo xtask setup`: nightly with rust-src, and bpf-linker)")
}
