//! Getting the kernel ready: privileges, tracefs, and the eBPF object loaded
//! with its read-only globals set.

use crate::{kernel::btf::KernelOffsets, syscalls};
use aya::{Ebpf, EbpfLoader};
use plegwatch_abi::globals;
use std::{path::Path, time::Duration};
use thiserror::Error;

/// The eBPF object built from `probe-ebpf/` by build.rs.
static PROBES_OBJ: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/plegwatch-probes"));

/// The embedded eBPF object's bytes (what `--version` fingerprints).
pub fn probes_object() -> &'static [u8] {
    PROBES_OBJ
}

#[derive(Debug, Error)]
pub enum LoadError {
    #[error("plegwatch needs root (CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN to load eBPF and read /proc/*/stack): run it as root")]
    NotRoot,
    #[error("plegwatch runs without {0}: add it to the container's capabilities (deploy/daemonset.yaml lists what each is for)")]
    MissingCaps(String),
    #[error("tracefs is not mounted and mounting it on /sys/kernel/tracing failed: {0}")]
    Tracefs(std::io::Error),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] aya::EbpfError),
}

/// Fails with [`LoadError::NotRoot`] unless the effective uid is 0, and with
/// [`LoadError::MissingCaps`] when uid 0 runs without a capability plegwatch
/// needs (a container's capability list: see [`NEEDED_CAPS`]).
pub fn require_root() -> Result<(), LoadError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(LoadError::NotRoot);
    }
    let eff = std::fs::read_to_string("/proc/self/status").ok().and_then(|s| cap_eff(&s));
    match eff.map(missing_caps).filter(|m| !m.is_empty()) {
        Some(missing) => Err(LoadError::MissingCaps(missing.join("; "))),
        None => Ok(()),
    }
}

/// The capabilities plegwatch needs as uid 0, by number, with what fails
/// without each (measured with `setpriv --bounding-set` on Linux 6.18:
/// tests/tests/deploy_caps.rs). CAP_SYS_ADMIN also grants what CAP_BPF
/// (loading) and CAP_PERFMON (tracepoints, kernel reads) would.
pub const NEEDED_CAPS: &[(u32, &str, &str)] = &[
    (21, "CAP_SYS_ADMIN", "uprobes on Go binaries (perf_event_open) and kernel stacks (/proc/PID/stack) fail"),
    (19, "CAP_SYS_PTRACE", "other processes' /proc/PID/exe, fd and root are closed: containerd and kubelet are never found"),
];

/// `CapEff` of a `/proc/PID/status` text.
pub fn cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The [`NEEDED_CAPS`] missing from an effective set, each with its consequence.
pub fn missing_caps(eff: u64) -> Vec<String> {
    NEEDED_CAPS.iter().filter(|(bit, _, _)| eff & (1u64 << bit) == 0).map(|(_, name, why)| format!("{name} ({why})")).collect()
}

/// Where tracefs is, and whether plegwatch had to mount it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tracefs {
    pub path: &'static str,
    pub mounted_now: bool,
}

fn has_events(p: &str) -> bool {
    Path::new(p).join("events").is_dir()
}

/// Where tracefs may be mounted, in the order it is looked for.
pub const TRACEFS_ROOTS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Finds tracefs, mounting it on `/sys/kernel/tracing` if it is not mounted
/// (many VMs and minimal hosts boot without it). aya looks there too.
pub fn ensure_tracefs() -> Result<Tracefs, LoadError> {
    const MAIN: &str = TRACEFS_ROOTS[0];
    const DEBUG: &str = TRACEFS_ROOTS[1];
    if has_events(MAIN) {
        return Ok(Tracefs { path: MAIN, mounted_now: false });
    }
    if has_events(DEBUG) {
        return Ok(Tracefs { path: DEBUG, mounted_now: false });
    }
    let src = c"nodev";
    let target = c"/sys/kernel/tracing";
    let fstype = c"tracefs";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(LoadError::Tracefs(std::io::Error::last_os_error()));
    }
    tracing::warn!("tracefs was not mounted: mounted it on {MAIN}");
    Ok(Tracefs { path: MAIN, mounted_now: true })
}

/// Tries to lift RLIMIT_MEMLOCK. Linux >= 5.11 charges BPF memory to the memcg
/// and ignores the limit, so failing here is only worth a debug line.
pub fn raise_memlock() {
    let rlim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: a valid rlimit struct.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &rlim) } != 0 {
        tracing::debug!("could not raise RLIMIT_MEMLOCK (not needed on Linux >= 5.11)");
    }
}

/// Load-time settings.
#[derive(Clone, Copy, Debug)]
pub struct LoadOptions {
    /// Waits at least this long get an end record on the ring buffer.
    pub report_min: Duration,
    /// plegwatch's own pid as the kernel reports it (the host pid namespace's,
    /// not `getpid()` in a container): the programs skip its threads.
    pub tracer_tgid: u32,
}

/// Loads the eBPF object with its globals set: the tracer's own TGID (always
/// filtered out), the end-record threshold and the watched syscall numbers.
pub fn load(opts: LoadOptions) -> Result<(Ebpf, KernelOffsets), LoadError> {
    raise_memlock();
    crate::kernel::pin_code::pin_own_code();
    let tgid = opts.tracer_tgid;
    let report_min = opts.report_min.as_nanos().min(u64::MAX as u128) as u64;
    let watched = syscalls::watched_nr_table();
    let sock_nr = syscalls::sock_nr_table();
    let btf = crate::kernel::btf::Btf::from_sys_fs();
    let offsets = match &btf {
        Ok(b) => KernelOffsets::from_btf(b),
        Err(e) => KernelOffsets::all_missing(&e.to_string()),
    };
    let mutex_owner_off = btf.as_ref().ok().and_then(|b| b.member_offset("mutex", "owner").ok()).unwrap_or(u32::MAX);
    for f in offsets.missing() {
        tracing::debug!(field = %f, "kernel struct offset not found in BTF");
    }
    let task_pid_off = offsets.task_pid.offset().unwrap_or(0);
    let task_fsbase_off = offsets.task_fsbase.offset().unwrap_or(u32::MAX);
    let task_mm_off = offsets.task_mm.offset().unwrap_or(u32::MAX);
    let mm_start_code_off = offsets.mm_start_code.offset().unwrap_or(u32::MAX);
    let mm_end_code_off = offsets.mm_end_code.offset().unwrap_or(u32::MAX);
    let task_works_off = offsets.task_works.offset().unwrap_or(u32::MAX);
    let rwbs_off = crate::kernel::probes::rwbs_offset().unwrap_or(u32::MAX);
    if rwbs_off == u32::MAX {
        tracing::debug!("block:block_rq_issue has no rwbs in its tracefs format: block writes are not told from reads");
    }
    let ebpf = EbpfLoader::new()
        .override_global(globals::TRACER_TGID, &tgid, true)
        .override_global(globals::REPORT_MIN_NS, &report_min, true)
        .override_global(globals::WATCHED_NR, &watched, true)
        .override_global(globals::SOCK_NR, &sock_nr, true)
        .override_global(plegwatch_abi::offcpu_maps::TASK_PID_OFF, &task_pid_off, true)
        .override_global(plegwatch_abi::lock_maps::MUTEX_OWNER_OFF, &mutex_owner_off, true)
        .override_global(plegwatch_abi::go_maps::TASK_FSBASE_OFF, &task_fsbase_off, true)
        .override_global(plegwatch_abi::go_maps::TASK_MM_OFF, &task_mm_off, true)
        .override_global(plegwatch_abi::go_maps::MM_START_CODE_OFF, &mm_start_code_off, true)
        .override_global(plegwatch_abi::go_maps::MM_END_CODE_OFF, &mm_end_code_off, true)
        .override_global(plegwatch_abi::block_tp::RWBS_OFF, &rwbs_off, true)
        .override_global(plegwatch_abi::globals::TASK_WORKS_OFF, &task_works_off, true)
        .load(PROBES_OBJ)?;
    Ok((ebpf, offsets))
}

/// What can stop `plegwatch watch`: loading, attaching, a map, or a Go target.
#[derive(Debug, Error)]
pub enum WatchError {
    #[error(transparent)]
    Load(#[from] LoadError),
    #[error(transparent)]
    Probe(#[from] crate::kernel::probes::ProbeError),
    #[error("eBPF map {0} is missing or has the wrong type: {1}")]
    Map(&'static str, String),
    #[error("{0}: {1}")]
    Io(&'static str, std::io::Error),
    #[error("Go target: {0}")]
    Target(String),
    #[error("{0}")]
    Namespace(String),
}

/// A map taken out of the loaded object, as the type it must have.
pub fn take_map<T>(ebpf: &mut aya::Ebpf, name: &'static str) -> Result<T, WatchError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or_else(|| WatchError::Map(name, "not in the object".into()))?;
    T::try_from(map).map_err(|e| WatchError::Map(name, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capabilities_are_read_and_named() {
        let status = "Name:\tx\nCapPrm:\t000001ffffffffff\nCapEff:\t0000000000280000\n";
        let eff = cap_eff(status).expect("CapEff");
        assert_eq!(eff, (1 << 21) | (1 << 19));
        assert!(missing_caps(eff).is_empty());
        let m = missing_caps(1 << 21);
        assert_eq!(m.len(), 1);
        assert!(m[0].starts_with("CAP_SYS_PTRACE ("), "{m:?}");
        assert_eq!(missing_caps(0).len(), 2);
        assert_eq!(cap_eff("CapEff:\tzz\n"), None);
        assert_eq!(cap_eff(""), None);
    }
}
