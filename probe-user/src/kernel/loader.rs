//! Getting the kernel ready: privileges, tracefs, and the eBPF object loaded
//! with its read-only globals set.

use crate::{kernel::btf::KernelOffsets, syscalls};
use aya::{Ebpf, EbpfLoader};
use plegwatch_abi::globals;
use std::{path::Path, time::Duration};
use thiserror::Error;

/// The eBPF object built from `probe-ebpf/` by build.rs.
static PROBES_OBJ: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/plegwatch-probes"));

#[derive(Debug, Error)]
pub enum LoadError {
    #[error(
        "plegwatch needs root (CAP_BPF, CAP_PERFMON and CAP_SYS_ADMIN to load eBPF and read /proc/*/stack): run it as root"
    )]
    NotRoot,
    #[error("tracefs is not mounted and mounting it on /sys/kernel/tracing failed: {0}")]
    Tracefs(std::io::Error),
    #[error("loading the eBPF object failed: {0}")]
    Load(#[from] aya::EbpfError),
}

/// Fails with [`LoadError::NotRoot`] unless the effective uid is 0.
pub fn require_root() -> Result<(), LoadError> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        Ok(())
    } else {
        Err(LoadError::NotRoot)
    }
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

/// Finds tracefs, mounting it on `/sys/kernel/tracing` if it is not mounted
/// (many VMs and minimal hosts boot without it). aya looks there too.
pub fn ensure_tracefs() -> Result<Tracefs, LoadError> {
    const MAIN: &str = "/sys/kernel/tracing";
    const DEBUG: &str = "/sys/kernel/debug/tracing";
    if has_events(MAIN) {
        return Ok(Tracefs {
            path: MAIN,
            mounted_now: false,
        });
    }
    if has_events(DEBUG) {
        return Ok(Tracefs {
            path: DEBUG,
            mounted_now: false,
        });
    }
    let src = c"nodev";
    let target = c"/sys/kernel/tracing";
    let fstype = c"tracefs";
    // SAFETY: valid NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            src.as_ptr(),
            target.as_ptr(),
            fstype.as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(LoadError::Tracefs(std::io::Error::last_os_error()));
    }
    tracing::warn!("tracefs was not mounted: mounted it on {MAIN}");
    Ok(Tracefs {
        path: MAIN,
        mounted_now: true,
    })
}

/// Tries to lift RLIMIT_MEMLOCK. Linux >= 5.11 charges BPF memory to the memcg
/// and ignores the limit, so failing here is only worth a debug line.
pub fn raise_memlock() {
    let rlim = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
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
    let ebpf = EbpfLoader::new()
        .override_global(globals::TRACER_TGID, &tgid, true)
        .override_global(globals::REPORT_MIN_NS, &report_min, true)
        .override_global(globals::WATCHED_NR, &watched, true)
        .override_global(globals::SOCK_NR, &sock_nr, true)
        .override_global(plegwatch_abi::offcpu_maps::TASK_PID_OFF, &task_pid_off, true)
        .override_global(plegwatch_abi::lock_maps::MUTEX_OWNER_OFF, &mutex_owner_off, true)
        .override_global(plegwatch_abi::go_maps::TASK_FSBASE_OFF, &task_fsbase_off, true)
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
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| WatchError::Map(name, "not in the object".into()))?;
    T::try_from(map).map_err(|e| WatchError::Map(name, e.to_string()))
}
