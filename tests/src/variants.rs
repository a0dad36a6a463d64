//! Which variant each probe runs, as the `ready` line says, checked against what the
//! run asks for: the kernel-function variants (fentry/fexit) where the kernel takes them
//! (the guests' Debian kernels: `PLEGWATCH_TEST_FEXIT`), the fallbacks where
//! `PLEGWATCH_FALLBACK` passes them over (and on this host, whose kernel refuses them).

use crate::events::Event;

/// The variant the ready line names for `probe` (empty if it names none).
pub fn variant_of(ready: &Event, probe: &str) -> String {
    ready
        .get("/probes")
        .and_then(serde_json::Value::as_array)
        .and_then(|p| p.iter().find(|p| p["probe"] == probe))
        .and_then(|p| p["variant"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Whether `PLEGWATCH_FALLBACK` passes over `probe`'s kernel-function variants.
pub fn fallback_forced(probe: &str) -> bool {
    std::env::var("PLEGWATCH_FALLBACK").is_ok_and(|v| v.split(',').any(|p| p.trim() == "all" || p.trim() == probe))
}

/// The running kernel's (major, minor).
pub fn kernel_version() -> (u32, u32) {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut parts = release.trim().split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok());
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Asserts that `probe` runs a variant starting with `kernel_function` where the run asks
/// for kernel-function variants and the kernel is at least `since`, one starting with
/// `fallback` where they are passed over, and some variant otherwise. Returns the variant.
pub fn assert_variant(ready: &Event, probe: &str, kernel_function: &str, since: (u32, u32), fallback: &str) -> String {
    let v = variant_of(ready, probe);
    if fallback_forced(probe) {
        assert!(v.starts_with(fallback), "{probe}: PLEGWATCH_FALLBACK is set, want {fallback}…; the ready line: {}", ready.json);
    } else if std::env::var_os("PLEGWATCH_TEST_FEXIT").is_some() && kernel_version() >= since {
        assert!(v.starts_with(kernel_function), "{probe}: want {kernel_function}…; the ready line: {}", ready.json);
    } else {
        assert!(!v.is_empty() && v != "off", "{probe} is not attached: {}", ready.json);
    }
    eprintln!("{probe}: {v}");
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn this_kernels_version_reads() {
        assert!(super::kernel_version() >= (3, 0));
    }
}
