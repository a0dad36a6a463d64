//! Per-CPU counters and the wait-latency histogram.

use crate::WATCHED_SLOTS;

/// Buckets per slot in [`maps::HIST`](crate::maps::HIST): bucket `b` counts waits in `[2^b, 2^(b+1))` µs;
/// bucket 0 also counts waits under 1 µs, and the last bucket everything above.
pub const HIST_BUCKETS: u32 = 32;
/// Total entries in [`maps::HIST`](crate::maps::HIST).
pub const HIST_ENTRIES: u32 = WATCHED_SLOTS as u32 * HIST_BUCKETS;

/// Slots of [`maps::STATS`](crate::maps::STATS). Counters only grow.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// Waits recorded at `sys_enter`.
    WaitsStarted = 0,
    /// Waits that could not be recorded: [`maps::INFLIGHT`](crate::maps::INFLIGHT) was full.
    InflightFull = 1,
    /// End records lost: the ring buffer was full.
    RingbufFull = 2,
    /// umount2 target paths that could not be read.
    PathReadFailed = 3,
    /// Waits that entered the task_work tail.
    TailsStarted = 4,
    /// Waits ended by a thread exit.
    EndedByExit = 5,
    /// Socket records lost: `SOCK_EVENTS` was full.
    SockEventsFull = 6,
    /// Sockets that could not be tracked: `SOCKS` (or `SOCK_GEN`) was full.
    SocksFull = 7,
    /// Socket calls that could not be tracked: `SOCK_CALLS` was full.
    SockCallsFull = 8,
    /// User buffers that could not be read.
    SockReadFailed = 9,
    /// ttrpc sockets forgotten because a header made no sense (the stream was
    /// joined out of step, or more frames came at once than a record holds).
    TtrpcDesync = 10,
    /// D sleeps not recorded: `OFFCPU_START` was full.
    OffcpuStartFull = 11,
    /// Ended D sleeps not added up: `OFFCPU` was full.
    OffcpuFull = 12,
    /// D sleeps recorded without their kernel stack (`bpf_get_stackid` failed:
    /// `STACKS` full, or a hash collision with another stack).
    OffcpuStackFailed = 13,
    /// Kernel mutex waits not recorded: `LOCK_WAITS` was full.
    LockWaitsFull = 14,
    /// Kernel mutex waits recorded without the waiter's stack (so without the
    /// lock's name).
    LockStackFailed = 15,
    /// Watched waits recorded without their user stack.
    UserStackFailed = 16,
    /// Cookie-less Go probe hits whose point is not in `GO_ADDRS` (a binary
    /// being attached or retired, or a code size the loader computed
    /// differently from userspace).
    GoAddrUnknown = 17,
    /// Go calls not recorded: `GO_CALLS` was full.
    GoCallsFull = 18,
    /// Go call ends, goroutine exits or execs lost: the `GO_EVENTS` ring was full.
    GoEventsFull = 19,
    /// Child waits (wait4/waitid) not recorded: `CHILD_WAITS` was full.
    ChildWaitsFull = 20,
    /// netlink `socket()` calls not followed: `SOCKET_CALLS` was full.
    SocketCallsFull = 21,
    /// dup2/dup3 calls on a tracked fd not followed: `DUP_CALLS` was full (the
    /// target fd is forgotten at once, rather than left with its old class).
    DupCallsFull = 22,
    /// Block devices not counted: `DEV_IO` was full.
    DevIoFull = 23,
    /// Processes not marked for D-sleep recording: `INTERESTING` was full.
    InterestingFull = 24,
    /// ttrpc sockets not followed: `TTRPC_POS` was full.
    TtrpcPosFull = 25,
    /// ttrpc requests whose caller goroutine was not noted: `TTRPC_CALLERS` was full.
    TtrpcCallersFull = 26,
    /// D-Bus sockets not followed: `DBUS_POS` was full.
    DbusPosFull = 27,
}
/// Number of [`Stat`] slots (one more than the last [`Stat`]).
pub const STAT_COUNT: u32 = Stat::DbusPosFull as u32 + 1;

/// The histogram bucket of a duration: floor(log2(µs)), clamped to the table.
/// Written without loops or `leading_zeros` so the eBPF verifier takes it as is.
#[inline(always)]
pub fn hist_bucket(duration_ns: u64) -> u32 {
    let mut v = duration_ns >> 10; // ~µs, cheap
    let mut b: u32 = 0;
    if v >= 1 << 32 {
        v >>= 32;
        b += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        b += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        b += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        b += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        b += 2;
    }
    if v >= 1 << 1 {
        b += 1;
    }
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

/// Lower bound, in nanoseconds, of a histogram bucket (the inverse of [`hist_bucket`]).
pub const fn bucket_floor_ns(bucket: u32) -> u64 {
    if bucket == 0 {
        0
    } else {
        (1u64 << bucket) << 10
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log2_of_microseconds() {
        assert_eq!(hist_bucket(0), 0);
        assert_eq!(hist_bucket(1023), 0);
        assert_eq!(hist_bucket(2 * 1024), 1);
        assert_eq!(hist_bucket(3 * 1024), 1);
        assert_eq!(hist_bucket(4 * 1024), 2);
        assert_eq!(hist_bucket(1 << 30), 20);
        assert_eq!(hist_bucket(u64::MAX), HIST_BUCKETS - 1);
        for b in 1..HIST_BUCKETS - 1 {
            assert_eq!(hist_bucket(bucket_floor_ns(b)), b);
            assert_eq!(hist_bucket(bucket_floor_ns(b + 1) - 1), b);
        }
    }
}
