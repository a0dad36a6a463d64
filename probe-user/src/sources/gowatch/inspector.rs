//! Reading a new Go binary off the scan loop.
//!
//! Parsing a binary's ELF and `.gopclntab` and decoding every RET of the
//! expected functions takes 50–500 ms for containerd (more in a debug build).
//! Done on the loop at an `execve`, that made a scan late by as much. Here a
//! worker thread reads the binary; the loop gets the result through a tokio
//! channel (a `select!` branch) and only attaches the uprobes, which is quick.
//!
//! The job holds the binary open, and the worker and the attach read it
//! through `/proc/self/fd/N`: a short-lived process (runc exits within
//! milliseconds) or a binary replaced on disk meanwhile does not matter, the
//! inode is the one that ran.

use super::attach::{inspect, Inspection};
use super::targets::Target;
use crate::proto::gosym::GoSymError;
use std::{
    fs::File,
    os::fd::AsRawFd as _,
    path::PathBuf,
    sync::mpsc,
    time::{Duration, Instant},
};

/// A binary to read.
#[derive(Debug)]
pub struct Job {
    /// (dev, inode) of the binary.
    pub key: (u64, u64),
    pub target: &'static Target,
    /// The binary, held open until it is attached.
    pub file: File,
    /// The path it was found at (for the target line).
    pub path: PathBuf,
}

impl Job {
    /// Where the worker and the attach open the binary: the held file itself.
    pub fn open_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.file.as_raw_fd()))
    }
}

/// A binary read.
#[derive(Debug)]
pub struct Done {
    pub job: Job,
    pub inspected: Result<Inspection, GoSymError>,
    pub took: Duration,
}

/// The worker thread and its two channels.
#[derive(Debug)]
pub struct Inspector {
    jobs: mpsc::Sender<Job>,
    done: tokio::sync::mpsc::UnboundedReceiver<Done>,
}

impl Inspector {
    /// Starts the worker; it ends when the inspector is dropped.
    pub fn start() -> std::io::Result<Self> {
        let (jobs, rx) = mpsc::channel::<Job>();
        let (tx, done) = tokio::sync::mpsc::unbounded_channel();
        // A binary's tables are tens of MB while parsed: `heap::jobs` gives them back
        // once the worker is idle.
        std::thread::Builder::new().name("go-inspect".into()).spawn(move || {
            crate::heap::jobs(&rx, |job| {
                let started = Instant::now();
                let inspected = inspect(&job.open_path(), job.target);
                tx.send(Done { job, inspected, took: started.elapsed() }).is_ok()
            })
        })?;
        Ok(Inspector { jobs, done })
    }

    /// Queues a binary; gives the job back if the worker is gone.
    pub fn submit(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|e| e.0)
    }

    /// The next binary read (for a `select!` branch). Pending for ever if the worker
    /// is gone, so that the branch never fires again.
    pub async fn next(&mut self) -> Done {
        match self.done.recv().await {
            Some(d) => d,
            None => std::future::pending().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gowatch::targets::target_named;

    /// The worker reads through the held file, even once its path is gone.
    #[tokio::test(flavor = "current_thread")]
    async fn a_binary_is_read_off_the_caller_through_the_held_file() {
        let dir = std::env::temp_dir().join(format!("plegwatch-inspector-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("containerd");
        std::fs::copy("/bin/sleep", &path).unwrap();
        let file = File::open(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut inspector = Inspector::start().unwrap();
        let target = target_named("containerd").unwrap();
        inspector.submit(Job { key: (0, 0), target, file, path: path.clone() }).unwrap();
        let done = tokio::time::timeout(Duration::from_secs(10), inspector.next()).await.expect("answered");
        assert_eq!(done.job.path, path);
        // /bin/sleep is no Go binary: read (not "no such file"), and refused for what it is.
        let e = done.inspected.expect_err("not Go").to_string();
        assert!(!e.contains("No such file"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
