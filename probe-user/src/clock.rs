//! The clocks: CLOCK_MONOTONIC (the kernel's `bpf_ktime_get_ns`), and the
//! wall-clock time of an instant on it.

use std::time::{Duration, SystemTime};

/// CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall-clock time of a CLOCK_MONOTONIC instant.
pub fn wall_of(mono_ns: u64) -> SystemTime {
    let back = Duration::from_nanos(monotonic_ns().saturating_sub(mono_ns));
    SystemTime::now().checked_sub(back).unwrap_or(SystemTime::UNIX_EPOCH)
}
