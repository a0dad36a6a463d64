//! Who owns a D-Bus name, asked off the event loop.
//!
//! Asking the bus daemon takes a round trip, and up to the lookup timeout
//! when the daemon itself is stuck (the very case worth catching): done on
//! the scan loop, every scan would be late by that much. Here a worker thread
//! asks, and each scan takes whatever answers are in; a name asked for again
//! while its answer is pending is not asked twice. Answers are kept for a
//! while, in a bounded cache.

use super::bus_owner::Owner;
use std::{
    collections::{HashMap, HashSet},
    path::Path,
    sync::mpsc::{self, Receiver, Sender},
    time::{Duration, Instant},
};

/// How long an answer is reused.
pub const OWNER_TTL: Duration = Duration::from_secs(10);
/// Most answers kept.
pub const CACHE_MAX: usize = 1024;

/// (bus socket path, name).
type Key = (String, String);

/// The lookups in flight and the answers at hand.
pub struct OwnerLookups {
    requests: Sender<Key>,
    answers: Receiver<(Key, Owner)>,
    pending: HashSet<Key>,
    cache: HashMap<Key, (Instant, Owner)>,
}

impl OwnerLookups {
    /// Starts the worker thread; `ask` is the blocking lookup.
    pub fn start(ask: fn(&Path, &str) -> Owner) -> std::io::Result<Self> {
        let (requests, rx) = mpsc::channel::<Key>();
        let (tx, answers) = mpsc::channel();
        std::thread::Builder::new().name("bus-owner".into()).spawn(move || {
            // Ends when the lookups are dropped (the channel closes).
            while let Ok(key) = rx.recv() {
                let owner = ask(Path::new(&key.0), &key.1);
                if tx.send((key, owner)).is_err() {
                    break;
                }
            }
        })?;
        Ok(OwnerLookups { requests, answers, pending: HashSet::new(), cache: HashMap::new() })
    }

    /// The owner of `name` on the bus at `path`, if known; otherwise asks
    /// (once) and returns `None`: a later call will have it.
    pub fn get(&mut self, path: &str, name: &str) -> Option<Owner> {
        self.take_answers();
        let key = (path.to_string(), name.to_string());
        if let Some((at, o)) = self.cache.get(&key) {
            if at.elapsed() < OWNER_TTL {
                return Some(o.clone());
            }
        }
        if self.pending.insert(key.clone()) && self.requests.send(key.clone()).is_err() {
            self.pending.remove(&key);
            return Some(Owner::Unknown("the bus-owner lookup thread is gone".into()));
        }
        None
    }

    /// Waits up to `timeout` for the answer about `name` (for callers off the scan loop,
    /// such as the startup sweep).
    pub fn wait(&mut self, path: &str, name: &str, timeout: Duration) -> Option<Owner> {
        let until = Instant::now() + timeout;
        loop {
            if let Some(o) = self.get(path, name) {
                return Some(o);
            }
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            if let Ok((key, owner)) = self.answers.recv_timeout(left) {
                self.keep(key, owner);
            }
        }
    }

    fn take_answers(&mut self) {
        while let Ok((key, owner)) = self.answers.try_recv() {
            self.keep(key, owner);
        }
    }

    fn keep(&mut self, key: Key, owner: Owner) {
        self.pending.remove(&key);
        if self.cache.len() >= CACHE_MAX {
            self.cache.retain(|_, (at, _)| at.elapsed() < OWNER_TTL);
            if self.cache.len() >= CACHE_MAX {
                if let Some(oldest) = self.cache.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone()) {
                    self.cache.remove(&oldest);
                }
            }
        }
        self.cache.insert(key, (Instant::now(), owner));
    }

    /// Lookups asked for and not answered yet.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// The lookup answers only once the test releases it, and counts its calls.
    static RELEASED: AtomicBool = AtomicBool::new(false);
    static CALLS: AtomicUsize = AtomicUsize::new(0);

    fn gated(_: &Path, name: &str) -> Owner {
        CALLS.fetch_add(1, Ordering::SeqCst);
        while !RELEASED.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if name == "com.example.Gone" {
            Owner::Unknown("no such name".into())
        } else {
            Owner::Pid(42)
        }
    }

    /// No timing: the lookup cannot answer before the release, so `get` returning at all
    /// while it is held proves it does not wait for the bus (were it to, the calls would
    /// never return; they are made on a thread, so that this fails instead of hanging).
    #[test]
    fn a_slow_bus_never_blocks_the_caller() {
        let l = OwnerLookups::start(gated).unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut l = l;
            let first = l.get("/bus", "com.example.A");
            let second = l.get("/bus", "com.example.A");
            let _ = tx.send((l, first, second));
        });
        let (mut l, first, second) = rx.recv_timeout(Duration::from_secs(60)).expect("get() waited for the bus daemon");
        assert_eq!(first, None, "asked, not answered yet");
        assert_eq!(second, None, "still pending");
        assert_eq!(l.pending(), 1, "asked once");
        RELEASED.store(true, Ordering::SeqCst);
        assert_eq!(l.wait("/bus", "com.example.A", Duration::from_secs(30)), Some(Owner::Pid(42)));
        assert_eq!(l.pending(), 0);
        let calls = CALLS.load(Ordering::SeqCst);
        assert_eq!(l.get("/bus", "com.example.A"), Some(Owner::Pid(42)), "cached");
        assert_eq!(CALLS.load(Ordering::SeqCst), calls, "answered from the cache, not asked again");
        assert_eq!(l.wait("/bus", "com.example.Gone", Duration::from_secs(30)), Some(Owner::Unknown("no such name".into())));
    }
}
