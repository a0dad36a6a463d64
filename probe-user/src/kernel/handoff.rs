//! A fast exit: the last close of every probe is left to a child process.
//!
//! Closing a uprobe's link waits for several RCU grace periods in the kernel
//! (`uprobe_unregister_sync`, `perf_event_detach_bpf_prog`: Linux 6.18),
//! 95–250 ms per link under load, and plegwatch holds one link per entry and
//! per RET of every probed Go function: 70 links (Debian's containerd, its
//! shim and a kubelet) kept it from exiting for 7–15 s after Ctrl-C, even
//! with the closes spread over threads.
//!
//! The kernel does that work only on the *last* close of a file. So, once the
//! summary is out, plegwatch forks: the child shares every open file, waits
//! until the parent has closed its own copies (cheap, none is the last), and
//! then exits, which closes the last references and pays for the
//! unregistering after plegwatch is gone. The probes keep running for those
//! few seconds, writing to maps nobody reads.
//!
//! The child names itself [`CHILD_COMM`] (`ps` shows what it is; a test waits
//! for it to be gone before starting another plegwatch).
//!
//! The child of a multi-threaded process may only call async-signal-safe
//! functions: it calls `prctl`, `close`, `read` and `_exit`, and nothing else.

use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

/// The hand-off child's comm.
pub const CHILD_COMM: &str = "plegwatch-exit";

/// The parent's end of the hand-off: dropping it lets the child exit.
#[derive(Debug)]
pub struct Handoff {
    _release: OwnedFd,
    child: libc::pid_t,
}

impl Handoff {
    /// The child's pid.
    pub fn child(&self) -> u32 {
        self.child as u32
    }
}

/// Forks the child that will close the last references. Call it when nothing
/// but closing is left; drop the result after dropping every link and the eBPF
/// object. `None` (and the closes stay here) when `pipe2` or `fork` fails.
pub fn fork_last_closer() -> Option<Handoff> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        tracing::debug!("pipe2 for the exit hand-off: {}", std::io::Error::last_os_error());
        return None;
    }
    // SAFETY: both descriptors were just made and are owned here alone.
    let (wait_end, release_end) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: fork has no preconditions; the child below only calls
    // async-signal-safe functions (close, read, _exit) and never returns.
    match unsafe { libc::fork() } {
        -1 => {
            tracing::debug!("fork for the exit hand-off: {}", std::io::Error::last_os_error());
            None
        }
        0 => {
            let wait = wait_end.as_raw_fd();
            let release = release_end.as_raw_fd();
            // SAFETY: async-signal-safe calls on descriptors this process holds; the
            // name is a NUL-terminated literal.
            unsafe {
                libc::prctl(libc::PR_SET_NAME, c"plegwatch-exit".as_ptr());
                libc::close(release);
                // Not the parent's stdout: a reader waiting for its EOF must not wait for us.
                libc::close(0);
                libc::close(1);
                libc::close(2);
                let mut byte = 0u8;
                // EOF once the parent dropped its `Handoff` (or exited).
                while libc::read(wait, (&mut byte as *mut u8).cast(), 1) < 0 && *libc::__errno_location() == libc::EINTR {}
                libc::_exit(0)
            }
        }
        child => {
            drop(wait_end);
            tracing::debug!(child, "the last closes of the probes are left to a child process");
            Some(Handoff { _release: release_end, child })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// The child holds a file until the hand-off is dropped, then exits.
    #[test]
    fn the_child_outlives_the_parents_copies_then_exits() {
        let (mut ours, theirs) = std::os::unix::net::UnixStream::pair().unwrap();
        let handoff = fork_last_closer().expect("fork");
        drop(theirs);
        let comm = format!("/proc/{}/comm", handoff.child());
        let named = (0..6000).any(|_| {
            let yes = std::fs::read_to_string(&comm).is_ok_and(|c| c.trim_end() == CHILD_COMM);
            if !yes {
                std::thread::sleep(Duration::from_millis(10));
            }
            yes
        });
        assert!(named, "the hand-off child is not named {CHILD_COMM}");
        ours.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        let mut buf = [0u8; 1];
        use std::io::Read as _;
        // The child still holds the other end: no EOF yet, a timeout.
        let e = ours.read(&mut buf).expect_err("EOF while the child still holds the peer");
        assert!(matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut), "{e}");
        drop(handoff);
        // EOF, not the read timeout (an error), once the child exited.
        ours.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
        assert_eq!(ours.read(&mut buf).unwrap(), 0, "EOF once the child exited");
    }
}
