//! glibc's allocator, held to what a node agent may keep.
//!
//! plegwatch runs a dozen short-lived or mostly idle threads (the Go inspector, the
//! goroutine reader, the `/proc` lister, the CRI name worker, the report writer...).
//! glibc gives each thread that allocates an arena of its own, up to eight per core,
//! and keeps what a thread freed in that arena for the next allocation there. The
//! one-hour daemon soak (issue 19) found two such arenas holding 13 and 10 MB after
//! the first goroutine scan, beside a 27 MB main heap: RSS settled at 68 MiB for a
//! 64 MiB goal. Hence:
//! - [`tune`], once at start, before any thread exists:
//!   - at most [`ARENAS`] arenas. Contention does not matter here: the threads
//!     allocate rarely, and the hot path is the scan loop on one thread;
//!   - fixed mmap and trim thresholds ([`MMAP_THRESHOLD`], [`TRIM_THRESHOLD`]). By
//!     default glibc raises both each time a large mmapped block is freed (up to 32 and
//!     64 MB), so after a Go binary's tables were parsed and freed, the next large
//!     buffers come from the heap and stay there. Fixed, a large block is always its
//!     own mapping, returned whole when freed.
//! - [`give_back`] after the big transient work (a Go binary inspected, a process's
//!   goroutines read): `malloc_trim(0)` returns the free pages of every arena to the
//!   kernel. It walks the free lists: 16–57 ms for a 36 MB heap cut into 200,000 free
//!   chunks, measured in C on this machine kind. So it never runs on the event loop:
//!   the workers that do such work call it through [`jobs`] once they have been idle
//!   for [`SETTLE`] (by then the loop has taken in and dropped what they sent), and
//!   setup calls it once before the loop starts.
//!
//! Other C libraries (musl) keep no per-thread arenas: both are no-ops there. Nothing
//! here can fail in a way that matters: a refused setting leaves glibc's default.

/// Arenas allowed: the main one and one for every other thread to share.
pub const ARENAS: i32 = 2;
/// Blocks this large or larger are mappings of their own (glibc's initial default).
pub const MMAP_THRESHOLD: i32 = 128 * 1024;
/// Free memory at a heap's top beyond this goes back to the kernel at once.
pub const TRIM_THRESHOLD: i32 = 1024 * 1024;

/// Caps glibc's arenas and fixes its thresholds. Call it first thing in `main`;
/// returns whether glibc took every setting (always false on other C libraries).
pub fn tune() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: mallopt only sets tunables of the allocator, each to a value in its range.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, ARENAS) == 1
                && libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
        }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

/// How long a worker waits, idle after a job, before it gives the heap back.
pub const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// A worker thread's job loop: `each` job as it comes, until the channel closes or
/// `each` says stop (false); after a job, once no other came for [`SETTLE`], the
/// heap is given back ([`give_back`]), off the event loop.
pub fn jobs<J>(rx: &std::sync::mpsc::Receiver<J>, mut each: impl FnMut(J) -> bool) {
    use std::sync::mpsc::RecvTimeoutError;
    let mut worked = false;
    loop {
        // Idle and given back: sleep until the next job, with no wakeups meanwhile.
        let next = match worked {
            true => rx.recv_timeout(SETTLE),
            false => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match next {
            Ok(job) => {
                if !each(job) {
                    return;
                }
                worked = true;
            }
            Err(RecvTimeoutError::Timeout) => {
                worked = false;
                give_back();
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Returns the free pages of every arena to the kernel; whether any were.
pub fn give_back() -> bool {
    #[cfg(target_env = "gnu")]
    {
        // SAFETY: malloc_trim only releases memory the allocator holds free.
        unsafe { libc::malloc_trim(0) == 1 }
    }
    #[cfg(not(target_env = "gnu"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every job is done in order; the loop ends when the sender is gone, or at once
    /// when a job says stop.
    #[test]
    fn a_workers_loop_runs_each_job_and_ends_with_its_channel() {
        let (tx, rx) = std::sync::mpsc::channel();
        for j in 0..5 {
            tx.send(j).expect("open");
        }
        drop(tx);
        let mut seen = Vec::new();
        jobs(&rx, |j| {
            seen.push(j);
            true
        });
        assert_eq!(seen, [0, 1, 2, 3, 4]);

        let (tx, rx) = std::sync::mpsc::channel();
        for j in 0..5 {
            tx.send(j).expect("open");
        }
        let mut seen = Vec::new();
        jobs(&rx, |j| {
            seen.push(j);
            j < 2
        });
        assert_eq!(seen, [0, 1, 2], "the loop ends at the job that said stop");
    }

    /// A freed block in another thread's arena is given back: the trim reports that
    /// it released pages. (Whether glibc keeps freed memory at all depends on its
    /// thresholds; a 64 MB run of 16 KiB blocks, freed but for a last one that pins the
    /// arena's top, always leaves whole free pages inside.)
    #[cfg(target_env = "gnu")]
    #[test]
    fn freed_memory_in_a_threads_arena_is_given_back() {
        assert!(tune(), "glibc refused a setting");
        std::thread::spawn(|| {
            let mut blocks: Vec<Vec<u8>> = (0..4096).map(|i| vec![i as u8; 16 * 1024]).collect();
            let pin = blocks.pop();
            drop(blocks);
            assert!(give_back(), "nothing was given back after freeing 64 MB");
            drop(pin);
        })
        .join()
        .expect("the allocating thread");
    }
}
