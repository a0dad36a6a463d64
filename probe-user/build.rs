//! Builds the eBPF programs in `probe-ebpf/` (nightly, `-Z build-std=core`,
//! bpf-linker) and leaves the object in `OUT_DIR/plegwatch-probes`.
use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    git_commit();
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../probe-ebpf");
    println!("cargo:rerun-if-changed={root}/abi/src");
    aya_build::build_ebpf(
        [aya_build::Package { name: "plegwatch-ebpf", root_dir: root, ..Default::default() }],
        aya_build::Toolchain::default(),
    )
    .context("building the eBPF programs (needs `cargo xtask setup`: nightly with rust-src, and bpf-linker)")
}

/// `PLEGWATCH_GIT_COMMIT` for `--version`: the short hash of HEAD; left
/// unset outside a git checkout. Rerun when HEAD or its branch moves.
fn git_commit() {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
            .filter(|s| !s.is_empty())
    };
    if let Some(hash) = git(&["rev-parse", "--short=12", "HEAD"]) {
        println!("cargo:rustc-env=PLEGWATCH_GIT_COMMIT={hash}");
    }
    let branch = git(&["symbolic-ref", "-q", "HEAD"]);
    for r in ["HEAD"].into_iter().chain(branch.as_deref()) {
        // A missing file (a packed ref) would make cargo rerun this every build.
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", r]).filter(|p| std::path::Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
