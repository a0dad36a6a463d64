//! A syscall storm that overflows plegwatch's socket ring buffer (`SOCK_EVENTS`), and an RSS
//! sampler to watch plegwatch's memory through it.
//!
//! Every send or receive on a tracked socket (netlink since its `socket()`) puts one
//! `SockIo` record in the ring buffer: its header (the netlink message summaries) and up to
//! 2 KiB of the buffer, about 2.8 KiB a record in a 1 MiB ring. [`storm`] runs `threads`
//! threads, each sending, as fast as it can, a 2 KiB `NLMSG_NOOP` message with no flags to
//! the kernel on a `NETLINK_ROUTE` socket of its own: the kernel skips it (no
//! `NLM_F_REQUEST`: nothing is asked, nothing answered, no lock taken), so each send costs
//! a few microseconds and the ring buffer fills far faster than a reader can drain it. No
//! network state is read or changed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

/// The size of each message sent (`nlmsg_len`): [`storm`] records carry this much data.
pub const MESSAGE_BYTES: usize = 2048;
const NLMSG_NOOP: u16 = 1;

/// What a storm did.
#[derive(Clone, Copy, Debug)]
pub struct Storm {
    /// Sends that succeeded, over all threads.
    pub sends: u64,
    pub took: Duration,
}

/// `threads` threads send [`MESSAGE_BYTES`]-byte `NLMSG_NOOP`s to the kernel for `length`;
/// returns once all are done. Fails if a socket cannot be opened or a send fails.
pub fn storm(threads: usize, length: Duration) -> Result<Storm> {
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for i in 0..threads {
        let stop = stop.clone();
        let h = thread::Builder::new().name(format!("nl-storm-{i}")).spawn(move || sender(&stop)).context("spawn a storm thread")?;
        handles.push(h);
    }
    thread::sleep(length);
    stop.store(true, Ordering::Relaxed);
    let mut sends = 0;
    for h in handles {
        sends += h.join().map_err(|_| anyhow::anyhow!("a storm thread panicked"))??;
    }
    Ok(Storm { sends, took: started.elapsed() })
}

/// One storm thread: its own socket, sends until `stop`.
fn sender(stop: &AtomicBool) -> Result<u64> {
    // SAFETY: socket(2) with constant arguments; the fd is closed below.
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, libc::NETLINK_ROUTE) };
    if fd < 0 {
        bail!("socket(AF_NETLINK, NETLINK_ROUTE): {}", std::io::Error::last_os_error());
    }
    let mut msg = vec![0u8; MESSAGE_BYTES];
    msg[0..4].copy_from_slice(&(MESSAGE_BYTES as u32).to_ne_bytes());
    msg[4..6].copy_from_slice(&NLMSG_NOOP.to_ne_bytes());
    // SAFETY: an all-zero sockaddr_nl is valid; nl_pid 0 is the kernel.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    let mut sends = 0u64;
    let mut result = Ok(());
    while !stop.load(Ordering::Relaxed) {
        msg[8..12].copy_from_slice(&(sends as u32).to_ne_bytes());
        // SAFETY: sendto(2) from a live buffer of its length to a valid sockaddr_nl.
        let n = unsafe {
            libc::sendto(
                fd,
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if n < 0 {
            result = Err(anyhow::anyhow!("sendto on a netlink socket: {}", std::io::Error::last_os_error()));
            break;
        }
        sends += 1;
    }
    // SAFETY: our own fd, closed once.
    unsafe { libc::close(fd) };
    result.map(|()| sends)
}

/// `VmRSS` of `pid` in bytes, from `/proc/PID/status`; `None` once it is gone.
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = text.lines().find_map(|l| l.strip_prefix("VmRSS:"))?.trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// Samples [`rss_bytes`] of `pid` every `every` on a thread of its own until the returned
/// guard is stopped; [`RssSampler::stop`] gives the largest sample and how many were taken.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<(u64, usize)>,
}

impl RssSampler {
    pub fn start(pid: u32, every: Duration) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = thread::Builder::new()
            .name("rss-sampler".into())
            .spawn(move || {
                let (mut max, mut n) = (0, 0);
                while !flag.load(Ordering::Relaxed) {
                    if let Some(rss) = rss_bytes(pid) {
                        max = max.max(rss);
                        n += 1;
                    }
                    thread::sleep(every);
                }
                (max, n)
            })
            .context("spawn the RSS sampler")?;
        Ok(Self { stop, handle })
    }

    /// (largest RSS seen in bytes, samples taken).
    pub fn stop(self) -> (u64, usize) {
        self.stop.store(true, Ordering::Relaxed);
        self.handle.join().unwrap_or((0, 0))
    }
}
