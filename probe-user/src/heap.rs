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
//!   kernel. It walks the free lists, a millisecond or so for a heap of tens of MB,
//!   so it runs only after such work, not on every scan.
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
