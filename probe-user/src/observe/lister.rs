//! `/proc` listed off the event loop, once for every reader.
//!
//! The Go target poll, the off-CPU marking and the resolvers' "whose children"
//! each listed `/proc` on the scan loop, and the shim's child lookup read every
//! `/proc/PID/stat` of the node at each scan that asked. On a node of a few
//! thousand processes that is milliseconds of `getdents64` and stat reads per
//! scan, on the loop whose lateness is the product's clock.
//!
//! One thread now lists `/proc` every [`LIST_EVERY`] (a [`ProcList`]: each
//! process's stat read once, see its doc) and publishes each listing; readers
//! take the newest one, a shared clone, without waiting. An `execve` reported
//! by the kernel is passed on ([`Lister::on_exec`]) so that the process's comm
//! is read again at the next listing. A listing older than [`STALE`] means the
//! thread is stuck (a `/proc` read that does not return): it is said once in
//! the log, and readers go on with the last listing.
//!
//! The thread ends at its next round once every handle is dropped.

use super::proclist::ProcList;
use std::{
    sync::{Arc, Mutex, Weak},
    time::{Duration, Instant},
};

/// How often the thread lists `/proc`: a new process is seen within this.
pub const LIST_EVERY: Duration = Duration::from_millis(500);
/// A listing older than this says the thread is stuck.
pub const STALE: Duration = Duration::from_secs(10);

struct Shared {
    latest: Mutex<ProcList>,
    /// Processes that called `execve` since the last listing.
    execs: Mutex<Vec<u32>>,
    /// Whether a stale listing was said in the log already.
    warned: std::sync::atomic::AtomicBool,
}

/// A handle on the listing thread; clones share it.
#[derive(Clone)]
pub struct Lister {
    shared: Arc<Shared>,
}

impl Lister {
    /// Lists `/proc` once here (readers have a listing from the start), then
    /// starts the thread. Without a thread (it could not be spawned) the
    /// listing is made again here, on the caller's thread, at each
    /// [`Lister::latest`] older than [`LIST_EVERY`].
    pub fn start() -> Lister {
        let mut first = ProcList::default();
        first.refresh(Duration::ZERO);
        let shared = Arc::new(Shared { latest: Mutex::new(first), execs: Mutex::new(Vec::new()), warned: false.into() });
        let weak = Arc::downgrade(&shared);
        if let Err(e) = std::thread::Builder::new().name("proc-list".into()).spawn(move || run(weak)) {
            tracing::warn!("no thread to list /proc: it is listed on the scan loop instead: {e}");
            shared.warned.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        Lister { shared }
    }

    /// The newest listing (a shared clone: cheap).
    pub fn latest(&self) -> ProcList {
        let listing = match self.shared.latest.lock() {
            Ok(l) => l.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let age = listing.listed_at().map_or(Duration::MAX, |t| t.elapsed());
        if age >= STALE && !self.shared.warned.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(age_s = age.as_secs_f64(), "the /proc listing thread is stuck: new processes are not seen until it returns");
        }
        listing
    }

    /// `pid` called `execve`: its comm is read again at the next listing.
    pub fn on_exec(&self, pid: u32) {
        if let Ok(mut execs) = self.shared.execs.lock() {
            if execs.len() < 65_536 {
                execs.push(pid);
            }
        }
    }
}

/// The thread: a listing every [`LIST_EVERY`] while a handle lives.
fn run(weak: Weak<Shared>) {
    let mut list = match weak.upgrade() {
        Some(s) => s.latest.lock().map(|l| l.clone()).unwrap_or_default(),
        None => return,
    };
    loop {
        std::thread::sleep(LIST_EVERY);
        let Some(shared) = weak.upgrade() else { return };
        let execs = shared.execs.lock().map(|mut e| std::mem::take(&mut *e)).unwrap_or_default();
        for pid in execs {
            list.on_exec(pid);
        }
        let began = Instant::now();
        list.refresh(Duration::ZERO);
        tracing::trace!(took_ms = began.elapsed().as_secs_f64() * 1e3, "/proc listed");
        let published = shared.latest.lock().map(|mut latest| *latest = list.clone());
        drop(published);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits up to a minute (a loaded machine) for `f` to hold.
    fn eventually(mut f: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if f() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn sees_this_process_at_once_and_a_child_born_later() {
        let lister = Lister::start();
        let me = std::process::id();
        assert!(lister.latest().contains(me), "the first listing is made before start returns");
        let mut child = std::process::Command::new("sleep").arg("60").spawn().expect("spawn sleep");
        let pid = child.id();
        let seen = eventually(|| lister.latest().children(me).contains(&pid));
        let _ = child.kill();
        let _ = child.wait();
        assert!(seen, "child {pid} never listed under {me}");
        assert!(eventually(|| !lister.latest().contains(pid)), "child {pid} still listed after it was reaped");
    }

    #[test]
    fn an_exec_is_read_again() {
        let lister = Lister::start();
        // A child that execs into a program of another name once it is told to.
        let mut child = std::process::Command::new("sh")
            .args(["-c", "read x; exec sleep 60"])
            .stdin(std::process::Stdio::piped())
            .spawn()
            .expect("spawn sh");
        let pid = child.id();
        let comm = |l: &Lister| l.latest().iter().find(|(p, _)| *p == pid).and_then(|(_, c)| c.map(String::from));
        assert!(eventually(|| comm(&lister).as_deref() == Some("sh")), "sh {pid} never listed as sh");
        use std::io::Write as _;
        let _ = child.stdin.take().map(|mut i| i.write_all(b"go\n"));
        assert!(eventually(|| super::super::procfs::comm(pid).as_deref() == Some("sleep")), "{pid} never exec'd sleep");
        lister.on_exec(pid);
        let renamed = eventually(|| comm(&lister).as_deref() == Some("sleep"));
        let _ = child.kill();
        let _ = child.wait();
        assert!(renamed, "the exec of {pid} was not read again");
    }

    #[test]
    fn its_state_goes_with_its_last_handle() {
        let lister = Lister::start();
        let weak = Arc::downgrade(&lister.shared);
        drop(lister);
        // The thread holds the shared state only during a round.
        assert!(eventually(|| weak.upgrade().is_none()), "the listing thread kept its state after the last handle");
    }
}
