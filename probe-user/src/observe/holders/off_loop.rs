//! Questions answered on a worker thread, so that the scan loop never waits for them.
//!
//! Finding who holds a request means reading `/proc` (every `/proc/PID/fd`, to learn
//! which process holds a socket, as `ss -p` does), asking sock_diag, and for a D-Bus
//! call asking the bus daemon, which may itself be the one stuck. Each can take far
//! longer than a scan may: one `/proc` walk took 875 ms of a scan in a loaded guest.
//! Here the loop hands a question over, once per key, and takes in whatever answers
//! are ready at its next scans. A plain `std` channel and one thread: the answering
//! code is blocking code, and the loop only ever polls.

use std::{
    collections::HashSet,
    hash::Hash,
    sync::mpsc::{self, Receiver, Sender},
};

/// The questions in flight on one worker, and the answers it sent back.
pub struct OffLoop<K, Q, A> {
    questions: Sender<(K, Q)>,
    answers: Receiver<(K, A)>,
    pending: HashSet<K>,
}

impl<K, Q, A> OffLoop<K, Q, A>
where
    K: Eq + Hash + Clone + Send + 'static,
    Q: Send + 'static,
    A: Send + 'static,
{
    /// Starts the worker thread `name`; `answer` is the blocking work, called in the
    /// order the questions were asked. The thread ends when this is dropped.
    pub fn start(name: &str, mut answer: impl FnMut(Q) -> A + Send + 'static) -> std::io::Result<Self> {
        let (questions, asked) = mpsc::channel::<(K, Q)>();
        let (tx, answers) = mpsc::channel();
        std::thread::Builder::new().name(name.into()).spawn(move || {
            while let Ok((key, q)) = asked.recv() {
                if tx.send((key, answer(q))).is_err() {
                    break;
                }
            }
        })?;
        Ok(OffLoop { questions, answers, pending: HashSet::new() })
    }

    /// Hands `q` over unless a question about `key` is pending already. Returns whether
    /// it was handed over; never waits. `Err` when the worker is gone.
    pub fn ask(&mut self, key: K, q: Q) -> Result<bool, WorkerGone> {
        if self.pending.contains(&key) {
            return Ok(false);
        }
        self.questions.send((key.clone(), q)).map_err(|_| WorkerGone)?;
        self.pending.insert(key);
        Ok(true)
    }

    /// The answers that came back since the last call; never waits.
    pub fn answers(&mut self) -> Vec<(K, A)> {
        let mut out = Vec::new();
        while let Ok((key, a)) = self.answers.try_recv() {
            self.pending.remove(&key);
            out.push((key, a));
        }
        out
    }

    /// Questions handed over and not answered yet.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// The worker thread ended (it panicked): nothing asked of it will be answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the lookup thread is gone")]
pub struct WorkerGone;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc,
    };
    use std::time::{Duration, Instant};

    /// No timing: the worker cannot answer before the test releases it, so `ask` and
    /// `answers` returning while it is held prove they never wait for it (were they to,
    /// the thread below would never send, and the test fails on its timeout instead of
    /// hanging). Each key is asked once while pending; every answer comes back.
    #[test]
    fn a_slow_worker_never_blocks_the_caller() {
        let released = Arc::new(AtomicBool::new(false));
        let calls = Arc::new(AtomicUsize::new(0));
        let (r, c) = (released.clone(), calls.clone());
        let l = OffLoop::start("test-off-loop", move |q: u32| {
            c.fetch_add(1, Ordering::SeqCst);
            while !r.load(Ordering::SeqCst) {
                std::thread::sleep(Duration::from_millis(1));
            }
            q * 2
        })
        .unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut l = l;
            let first = l.ask("a", 1);
            let again = l.ask("a", 1);
            let other = l.ask("b", 5);
            let none = l.answers();
            let _ = tx.send((l, first, again, other, none));
        });
        let (mut l, first, again, other, none) = rx.recv_timeout(Duration::from_secs(60)).expect("ask() waited for the worker");
        assert_eq!((first, again, other), (Ok(true), Ok(false), Ok(true)));
        assert!(none.is_empty(), "answered before the release: {none:?}");
        assert_eq!(l.pending(), 2);
        released.store(true, Ordering::SeqCst);
        let mut got = Vec::new();
        let until = Instant::now() + Duration::from_secs(60);
        while got.len() < 2 && Instant::now() < until {
            got.extend(l.answers());
            std::thread::sleep(Duration::from_millis(1));
        }
        got.sort();
        assert_eq!(got, vec![("a", 2), ("b", 10)]);
        assert_eq!(l.pending(), 0);
        assert_eq!(calls.load(Ordering::SeqCst), 2, "\"a\" was asked twice while pending: answered once");
        // Answered, a key may be asked again.
        assert_eq!(l.ask("a", 3), Ok(true));
    }

    #[test]
    fn a_dead_worker_is_an_error_not_a_hang() {
        let mut l = OffLoop::start("test-off-loop", |q: u32| -> u32 { panic!("dies on {q}") }).unwrap();
        assert_eq!(l.ask(1u32, 1), Ok(true));
        // The panic closes the thread's receiver; the next send fails.
        let until = Instant::now() + Duration::from_secs(60);
        let mut k = 2u32;
        let gone = loop {
            match l.ask(k, k) {
                Err(e) => break Some(e),
                Ok(_) if Instant::now() > until => break None,
                Ok(_) => k += 1,
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(gone, Some(WorkerGone));
    }
}
