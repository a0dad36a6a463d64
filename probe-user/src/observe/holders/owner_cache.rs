//! Who owns a D-Bus name, remembered for a while.
//!
//! Asking the bus daemon takes a connection and a round trip, and up to the lookup's
//! timeout when the daemon is stuck. Many calls go to the same few names (systemd's
//! `org.freedesktop.systemd1` above all): the answer about a (bus, name) is kept
//! [`OWNER_TTL`], in a cache of at most [`CACHE_MAX`] answers. "The daemon did not
//! answer" is kept only [`NOT_ANSWERING_TTL`]: enough that calls to one name asked
//! about together cost one deadline, short enough that asking again asks the daemon. Blocking: used on the
//! request holders' worker thread (`sources::request_holders`) and at startup.

use super::bus_owner::Owner;
use std::{collections::HashMap, path::Path, time::Instant};

/// How long an answer is reused.
pub const OWNER_TTL: std::time::Duration = std::time::Duration::from_secs(10);
/// How long "the bus daemon did not answer" is reused.
pub const NOT_ANSWERING_TTL: std::time::Duration = std::time::Duration::from_secs(1);
/// Most answers kept.
pub const CACHE_MAX: usize = 1024;

/// Answers by (bus socket path, name).
#[derive(Default)]
pub struct OwnerCache {
    cache: HashMap<(String, String), (Instant, Owner)>,
}

impl OwnerCache {
    /// The owner of `name` on the bus at `path`: remembered, or asked with `ask`.
    pub fn get(&mut self, path: &str, name: &str, ask: impl FnOnce(&Path, &str) -> Owner) -> Owner {
        let key = (path.to_string(), name.to_string());
        if let Some((at, o)) = self.cache.get(&key) {
            let ttl = if *o == Owner::BusNotAnswering { NOT_ANSWERING_TTL } else { OWNER_TTL };
            if at.elapsed() < ttl {
                return o.clone();
            }
        }
        let owner = ask(Path::new(path), name);
        self.keep(key, owner.clone());
        owner
    }

    fn keep(&mut self, key: (String, String), owner: Owner) {
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

    /// Answers kept.
    pub fn len(&self) -> usize {
        self.cache.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cache.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_reused_and_the_cache_stays_bounded() {
        let mut c = OwnerCache::default();
        let mut asked = 0;
        for _ in 0..3 {
            let o = c.get("/bus", "com.example.A", |_, _| {
                asked += 1;
                Owner::Pid(42)
            });
            assert_eq!(o, Owner::Pid(42));
        }
        assert_eq!(asked, 1, "asked once, then remembered");
        assert_eq!(c.get("/bus", "com.example.Gone", |_, _| Owner::Unknown("no such name".into())), Owner::Unknown("no such name".into()));
        for i in 0..CACHE_MAX + 10 {
            c.get("/bus", &format!("com.example.N{i}"), |_, _| Owner::Pid(1));
        }
        assert!(c.len() <= CACHE_MAX, "{} answers kept", c.len());
    }

    #[test]
    fn a_daemon_that_did_not_answer_is_asked_again_soon() {
        let mut c = OwnerCache::default();
        assert_eq!(c.get("/bus", "com.example.Slow", |_, _| Owner::BusNotAnswering), Owner::BusNotAnswering);
        assert_eq!(c.get("/bus", "com.example.Slow", |_, _| Owner::Pid(7)), Owner::BusNotAnswering, "kept a while");
        // Aged past the short TTL (and within the long one): asked again.
        let key = ("/bus".to_string(), "com.example.Slow".to_string());
        if let Some((at, _)) = c.cache.get_mut(&key) {
            *at = at.checked_sub(NOT_ANSWERING_TTL).expect("a monotonic clock over a second old");
        }
        assert_eq!(c.get("/bus", "com.example.Slow", |_, _| Owner::Pid(7)), Owner::Pid(7));
        assert_eq!(c.get("/bus", "com.example.Slow", |_, _| Owner::Pid(8)), Owner::Pid(7), "an owner is kept longer");
    }
}
