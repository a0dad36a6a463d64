//! Standard output written by a thread of its own.
//!
//! A line to stdout blocks when its reader is slow: a pipe into a log shipper that
//! stalls, a terminal over a slow link, a serial console. Written from the scan loop,
//! that stopped the scans: in an emulated guest whose test harness echoed every line to
//! a serial console, scans ran up to 1.9 s late and a 1.2 s relist stall was never seen
//! open. Here the sink's `flush` hands the bytes written since the last one to a writer
//! thread, which writes and flushes them in order.
//!
//! Up to [`QUEUED`] flushes wait in memory; past that a flush blocks until the writer
//! takes one (lines are never dropped; a reader stuck for good stops plegwatch's output,
//! as it would have anyway). Dropping the writer writes what is queued, then returns.

use std::{
    io::{self, Write},
    sync::mpsc::{self, SyncSender},
    thread::JoinHandle,
};

/// Flushes (lines, for the JSON sink) queued at most before a flush blocks.
pub const QUEUED: usize = 4096;

/// A `Write` whose flushes are written to `out` by a thread of its own.
pub struct StdoutWriter {
    pending: Vec<u8>,
    tx: Option<SyncSender<Vec<u8>>>,
    thread: Option<JoinHandle<()>>,
}

impl StdoutWriter {
    /// The writer thread for `out`.
    pub fn start<W: Write + Send + 'static>(mut out: W) -> io::Result<Self> {
        let (tx, rx) = mpsc::sync_channel::<Vec<u8>>(QUEUED);
        let thread = std::thread::Builder::new().name("stdout".into()).spawn(move || {
            for chunk in rx {
                // A closed stdout (the reader went away) ends nothing else: the lines are lost
                // to it either way.
                let _ = out.write_all(&chunk).and_then(|()| out.flush());
            }
        })?;
        Ok(StdoutWriter { pending: Vec::new(), tx: Some(tx), thread: Some(thread) })
    }
}

impl Write for StdoutWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::take(&mut self.pending);
        match &self.tx {
            Some(tx) => tx.send(chunk).map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the stdout writer thread is gone")),
            None => Err(io::Error::new(io::ErrorKind::BrokenPipe, "the stdout writer is closed")),
        }
    }
}

impl Drop for StdoutWriter {
    fn drop(&mut self) {
        let _ = self.flush();
        // Closing the channel ends the thread once it has written everything queued.
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Condvar, Mutex};

    /// A `Write` into a shared buffer that blocks until its gate opens, as a stuck reader.
    #[derive(Clone, Default)]
    struct Gated {
        out: Arc<Mutex<Vec<u8>>>,
        gate: Arc<(Mutex<bool>, Condvar)>,
    }

    impl Gated {
        fn open(&self) {
            let (open, cv) = &*self.gate;
            *open.lock().expect("gate") = true;
            cv.notify_all();
        }
    }

    impl Write for Gated {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            let (open, cv) = &*self.gate;
            let mut g = open.lock().map_err(|_| io::Error::other("poisoned"))?;
            while !*g {
                g = cv.wait(g).map_err(|_| io::Error::other("poisoned"))?;
            }
            self.out.lock().map_err(|_| io::Error::other("poisoned"))?.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// Flushes return while the reader is stuck; once it reads, every line arrives, in
    /// order.
    #[test]
    fn flushes_do_not_wait_for_a_stuck_reader_and_lines_arrive_in_order() {
        let out = Gated::default();
        let mut w = StdoutWriter::start(out.clone()).expect("thread");
        for i in 0..200 {
            writeln!(w, "line {i}").expect("write");
            w.flush().expect("flush");
        }
        // All 200 were handed over while the reader wrote nothing.
        assert!(out.out.lock().expect("lock").is_empty());
        out.open();
        drop(w);
        let text = String::from_utf8(out.out.lock().expect("lock").clone()).expect("utf-8");
        let want: String = (0..200).map(|i| format!("line {i}\n")).collect();
        assert_eq!(text, want);
    }

    /// What is written without a flush is written when the writer is dropped.
    #[test]
    fn the_unflushed_tail_is_written_at_drop() {
        let out = Gated::default();
        out.open();
        let mut w = StdoutWriter::start(out.clone()).expect("thread");
        write!(w, "no newline").expect("write");
        drop(w);
        assert_eq!(out.out.lock().expect("lock").as_slice(), b"no newline");
    }
}
