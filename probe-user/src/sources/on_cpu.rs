//! Whether a wait whose thread `/proc` finds on CPU is over, when the kernel can't say.
//!
//! `/proc/TID/syscall` says `running` for a thread on CPU *or waiting for one*, and so
//! says nothing about where it is. A thread inside a wait says it often: a umount's sync
//! wakes it at every written page (in the syscall or in its task_work tail), a parent in
//! `wait4` wakes at every child's change of state, and on a busy CPU each then waits its
//! turn, for seconds when starved (a CI run judged a umount tail over after two scans,
//! far apart, caught its thread so).
//!
//! The kernel closes these waits itself: a tail at the thread's next syscall, a swept
//! syscall at its exit. `/proc` is only for a wait that ended unseen, whose thread went
//! back to user space and makes no syscall. Such a thread runs user code and never
//! sleeps of its own accord, while a thread in a wait runs kernel code only, and sleeps
//! whenever it waits. So a wait is judged over when, over scans that all found its
//! thread on CPU for at least [`ON_CPU_MIN`], it made no voluntary switch and its user
//! time grew. (User time is the kernel's split of the thread's run time by ticks; a
//! thread with earlier user time that stays on CPU in the kernel for that long, never
//! sleeping, could be misjudged. A starved one can't: it runs nothing.)

pub use crate::observe::procfs::CpuUse;
use crate::sources::inflight::TidStart;
use std::{collections::HashMap, time::Duration};

/// How long a wait's thread must stay on CPU, never sleeping, to be judged back in user
/// space.
pub const ON_CPU_MIN: Duration = Duration::from_secs(2);

/// A streak of scans that found a wait's thread on CPU.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Streak {
    since_ns: u64,
    /// The thread's CPU use when the streak began.
    began: CpuUse,
}

/// The streaks, by wait.
#[derive(Debug, Default)]
pub struct OnCpu {
    streaks: HashMap<TidStart, Streak>,
}

impl OnCpu {
    /// The scan at `now_ns` found `key`'s thread on CPU, having used `cpu` so far (`None`
    /// when `/proc` can't say). Returns when it went back to user space (the streak's
    /// start, a bound), once that is proven; `one_look` (a umount tail without the tail
    /// probe, which `/proc` alone ends) takes one sample.
    pub fn on_cpu(&mut self, key: TidStart, now_ns: u64, cpu: Option<CpuUse>, one_look: bool) -> Option<u64> {
        if one_look {
            return Some(now_ns);
        }
        let Some(cpu) = cpu else {
            self.streaks.remove(&key);
            return None;
        };
        let s = self.streaks.entry(key).or_insert(Streak { since_ns: now_ns, began: cpu });
        if cpu.voluntary != s.began.voluntary {
            // It slept since the streak began: still in the kernel then.
            *s = Streak { since_ns: now_ns, began: cpu };
            return None;
        }
        let long = now_ns.saturating_sub(s.since_ns) >= ON_CPU_MIN.as_nanos() as u64;
        (long && cpu.user_ticks > s.began.user_ticks).then_some(s.since_ns)
    }

    /// The scan found `key`'s thread asleep (or its wait over): any streak ends.
    pub fn off_cpu(&mut self, key: &TidStart) {
        self.streaks.remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const K: TidStart = (7, 100);

    fn cpu(voluntary: u64, user_ticks: u64) -> Option<CpuUse> {
        Some(CpuUse { voluntary, user_ticks })
    }

    #[test]
    fn two_samples_apart_are_not_a_streak() {
        let mut t = OnCpu::default();
        assert_eq!(t.on_cpu(K, 10 * S, cpu(5, 1), false), None);
        t.off_cpu(&K);
        assert_eq!(t.on_cpu(K, 13 * S, cpu(5, 9), false), None, "a sleep between ends the streak");
    }

    #[test]
    fn a_voluntary_switch_restarts_the_streak() {
        let mut t = OnCpu::default();
        assert_eq!(t.on_cpu(K, 10 * S, cpu(5, 1), false), None);
        assert_eq!(t.on_cpu(K, 11 * S, cpu(6, 1), false), None);
        assert_eq!(t.on_cpu(K, 12 * S, cpu(6, 50), false), None, "1 s since the switch");
        assert_eq!(t.on_cpu(K, 13 * S, cpu(6, 90), false), Some(11 * S), "2 s on CPU in user code, never sleeping");
    }

    #[test]
    fn a_starved_thread_stays_in_its_tail() {
        // Waiting for a CPU it doesn't get: no switch, and no user time either.
        let mut t = OnCpu::default();
        for s in 10..40 {
            assert_eq!(t.on_cpu(K, s * S, cpu(5, 3), false), None);
        }
    }

    #[test]
    fn without_cpu_figures_it_is_never_judged() {
        let mut t = OnCpu::default();
        for s in 10..20 {
            assert_eq!(t.on_cpu(K, s * S, None, false), None);
        }
    }

    #[test]
    fn without_the_tail_probe_one_sample_ends_it() {
        let mut t = OnCpu::default();
        assert_eq!(t.on_cpu(K, 10 * S, cpu(5, 1), true), Some(10 * S));
    }
}
