//! A bench driver: a helper binary of the scenario crate (`relist_bench`, `soak_bench`) that
//! sets a node up, prints JSON lines on stdout and takes commands on stdin; closing its
//! stdin makes it tear the node down and exit.

use std::io::Write as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use super::tracer;
use crate::cmd;

/// A running driver. Dropping it closes its stdin and waits for its teardown.
pub struct LineDriver {
    name: &'static str,
    /// Its command line, for messages.
    pub line: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    stderr_log: PathBuf,
    /// How long its teardown may take before it is killed.
    quit_timeout: Duration,
    /// What a killed teardown may leave behind, for the message.
    leftovers: &'static str,
}

impl LineDriver {
    /// Spawns `command` in a process group of its own (a Ctrl-C on the terminal then stops
    /// the bench, whose exit closes the driver's stdin, and the driver still tears its node
    /// down), its stderr to `<log_dir>/<name>.stderr.log` and its stdout copied to
    /// `<log_dir>/<name>.stdout.log`.
    pub fn start(
        name: &'static str,
        mut command: Command,
        log_dir: &Path,
        quit_timeout: Duration,
        leftovers: &'static str,
    ) -> Result<Self> {
        let line = cmd::display(&command);
        let (stderr_log, stderr, stdout_file) = tracer::log_files(log_dir, name)?;
        eprintln!("+ {line}");
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .process_group(0)
            .spawn()
            .with_context(|| format!("cannot start `{line}`"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("`{line}`: no stdout pipe"))?;
        let stdin = child.stdin.take();
        let lines = tracer::tee_lines(stdout, stdout_file);
        Ok(LineDriver { name, line, child, stdin, lines, stderr_log, quit_timeout, leftovers })
    }

    /// Writes `command` and a newline to its stdin.
    pub fn send(&mut self, command: &str) -> Result<()> {
        let stdin = self.stdin.as_mut().context("the driver's stdin is closed")?;
        writeln!(stdin, "{command}").and_then(|()| stdin.flush()).with_context(|| format!("`{}`: write {command:?}", self.line))
    }

    /// Its next stdout line, or `None` when `timeout` passes first; an error once it has
    /// exited.
    pub fn next_line(&self, timeout: Duration) -> Result<Option<String>> {
        match self.lines.recv_timeout(timeout) {
            Ok(l) => Ok(Some(l)),
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                bail!("`{}` exited (stderr: {}; log: {})", self.line, self.stderr_tail(), self.stderr_log.display())
            }
        }
    }

    /// The next stdout line of `"type": kind`.
    pub fn wait_line(&self, timeout: Duration, kind: &str) -> Result<String> {
        let deadline = Instant::now() + timeout;
        let wanted = format!("\"type\":\"{kind}\"");
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(&wanted) => return Ok(l),
                Ok(_) => continue,
                Err(RecvTimeoutError::Timeout) => bail!(
                    "`{}` printed no {kind} line within {}s (stderr: {}; log: {})",
                    self.line,
                    timeout.as_secs(),
                    self.stderr_tail(),
                    self.stderr_log.display()
                ),
                Err(RecvTimeoutError::Disconnected) => bail!(
                    "`{}` exited before its {kind} line (stderr: {}; log: {})",
                    self.line,
                    self.stderr_tail(),
                    self.stderr_log.display()
                ),
            }
        }
    }

    /// Closes its stdin and waits for the teardown (SIGKILL after its quit timeout); an
    /// unclean exit is an error.
    pub fn quit(mut self) -> Result<()> {
        self.close_and_wait()
    }

    fn close_and_wait(&mut self) -> Result<()> {
        drop(self.stdin.take());
        let deadline = Instant::now() + self.quit_timeout;
        loop {
            if let Some(status) = self.child.try_wait().context("waitpid")? {
                if !status.success() {
                    bail!("`{}` exited with {status} (stderr: {}; log: {})", self.line, self.stderr_tail(), self.stderr_log.display());
                }
                return Ok(());
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                bail!(
                    "`{}` did not tear down within {}s; killed it (its {} may remain: see {})",
                    self.line,
                    self.quit_timeout.as_secs(),
                    self.leftovers,
                    self.stderr_log.display()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_log).unwrap_or_default();
        cmd::last_line(&text).to_owned()
    }
}

impl Drop for LineDriver {
    fn drop(&mut self) {
        if self.stdin.is_some() {
            if let Err(e) = self.close_and_wait() {
                eprintln!("bench: warning: {}: {e:#}", self.name);
            }
        }
    }
}
