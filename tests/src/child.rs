//! A child process a scenario starts (a client, a daemon, a monitor), as a guard that kills it
//! by PID when dropped, also when the test panics.

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};

const POLL: Duration = Duration::from_millis(50);

/// What a [`Proc`] does with the child's stderr.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stderr {
    /// The test's own stderr, as it comes.
    Inherit,
    /// Read by a thread and echoed line by line as `[NAME PID stderr] LINE`, so that the
    /// output of several children stays apart.
    Echo,
}

/// How a [`Proc`] treats its child, besides reading its stdout.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub stderr: Stderr,
    /// Send SIGCONT before the SIGKILL of the cleanup: the child may have been stopped, and a
    /// stopped process must be continued to die at once (and let go of its bus name and
    /// sockets).
    pub continue_before_kill: bool,
}

impl Default for Options {
    /// Stderr inherited, a plain SIGKILL on drop.
    fn default() -> Self {
        Self { stderr: Stderr::Inherit, continue_before_kill: false }
    }
}

/// A child process whose stdout lines are read (and stamped with the moment they were read)
/// by a thread, and echoed with its name and PID. Dropping it sends SIGKILL to its PID if it
/// still runs (SIGCONT first if [`Options::continue_before_kill`]), reaps it, and joins the
/// reader threads.
pub struct Proc {
    name: String,
    child: Child,
    options: Options,
    lines: Receiver<(Instant, String)>,
    seen: Vec<(Instant, String)>,
    readers: Vec<JoinHandle<()>>,
}

impl Proc {
    /// Spawns `cmd` with stdin closed, stdout read by the guard and stderr inherited.
    pub fn spawn(name: &str, cmd: &mut Command) -> Result<Self> {
        Self::spawn_with(name, cmd, Options::default())
    }

    /// Spawns `cmd` with stdin closed and stdout read by the guard; stderr and the cleanup as
    /// `options` say.
    pub fn spawn_with(name: &str, cmd: &mut Command, options: Options) -> Result<Self> {
        Self::spawn_fed(name, cmd, options, None)
    }

    /// As [`Proc::spawn_with`], with `input` written to the child's stdin, which is then
    /// closed: a way to hand a child a secret that is in no argument (`/proc/PID/cmdline`).
    pub fn spawn_with_input(name: &str, cmd: &mut Command, options: Options, input: &[u8]) -> Result<Self> {
        Self::spawn_fed(name, cmd, options, Some(input))
    }

    fn spawn_fed(name: &str, cmd: &mut Command, options: Options, input: Option<&[u8]>) -> Result<Self> {
        let stderr = match options.stderr {
            Stderr::Inherit => Stdio::inherit(),
            Stderr::Echo => Stdio::piped(),
        };
        let mut child = cmd
            .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("spawn {name}: {cmd:?}"))?;
        if let (Some(input), Some(mut stdin)) = (input, child.stdin.take()) {
            use std::io::Write as _;
            let written = stdin.write_all(input);
            drop(stdin);
            if let Err(e) = written {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).with_context(|| format!("write {name}'s stdin"));
            }
        }
        eprintln!("started {name} (pid {}): {cmd:?}", child.id());
        let (tx, lines) = mpsc::channel();
        // From here on the guard exists, so that an error below still kills the child.
        let mut proc = Self { name: name.into(), options, lines, seen: Vec::new(), readers: Vec::new(), child };
        let tag = format!("{name} {}", proc.pid());
        let stdout = proc.child.stdout.take().context("child stdout")?;
        let out_tag = tag.clone();
        proc.readers.push(
            thread::Builder::new()
                .name(format!("{name}-out"))
                .spawn(move || {
                    for line in BufReader::new(stdout).lines() {
                        let Ok(line) = line else { break };
                        let at = Instant::now();
                        eprintln!("[{out_tag}] {line}");
                        if tx.send((at, line)).is_err() {
                            break;
                        }
                    }
                })
                .context("spawn a stdout reader")?,
        );
        if let Some(stderr) = proc.child.stderr.take() {
            proc.readers.push(
                thread::Builder::new()
                    .name(format!("{name}-err"))
                    .spawn(move || echo_stderr(stderr, &tag))
                    .context("spawn a stderr reader")?,
            );
        }
        Ok(proc)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the process still runs (not exited, or exited but not yet reaped: no).
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Every stdout line read so far, with the moment it was read.
    pub fn lines(&mut self) -> &[(Instant, String)] {
        self.seen.extend(self.lines.try_iter());
        &self.seen
    }

    /// The next stdout line not yet taken in (by this method, [`Proc::lines`] or
    /// [`Proc::wait_line`]); an error if the process closes its stdout (exits) or `timeout`
    /// passes first.
    pub fn next_line(&mut self, timeout: Duration) -> Result<(Instant, String)> {
        let timeout = crate::timing::scaled(timeout);
        match self.lines.recv_timeout(timeout) {
            Ok(line) => {
                self.seen.push(line.clone());
                Ok(line)
            }
            Err(RecvTimeoutError::Timeout) => {
                bail!("{} (pid {}) printed nothing within {timeout:?}", self.name, self.pid())
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.wait().map(|s| s.to_string()).unwrap_or_default();
                bail!("{} (pid {}) exited ({status}) before printing a line", self.name, self.pid())
            }
        }
    }

    /// The first stdout line, already read or arriving within `timeout`, that `pred` accepts.
    pub fn wait_line(&mut self, timeout: Duration, pred: impl Fn(&str) -> bool) -> Option<(Instant, String)> {
        let deadline = Instant::now() + crate::timing::scaled(timeout);
        let mut checked = 0;
        loop {
            self.seen.extend(self.lines.try_iter());
            if let Some(l) = self.seen[checked..].iter().find(|(_, l)| pred(l)) {
                return Some(l.clone());
            }
            checked = self.seen.len();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.lines.recv_timeout(left.min(POLL)) {
                Ok(l) => self.seen.push(l),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    // Exited: nothing more will come; one last look at what did.
                    self.seen.extend(self.lines.try_iter());
                    return self.seen[checked..].iter().find(|(_, l)| pred(l)).cloned();
                }
            }
        }
    }

    /// Waits for the process to exit; an error if it still runs after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() >= deadline {
                bail!("{} (pid {}) still runs {timeout:?} later", self.name, self.pid());
            }
            thread::sleep(POLL);
        }
    }

    /// Sends `sig` to the process by PID.
    pub fn signal(&mut self, sig: libc::c_int) -> Result<()> {
        ensure!(self.running(), "{} (pid {}) is not running", self.name, self.pid());
        // SAFETY: kill(2) on the PID of our own child, which has not been reaped yet.
        if unsafe { libc::kill(self.pid() as libc::pid_t, sig) } != 0 {
            bail!("signal {sig} to {} (pid {}): {}", self.name, self.pid(), std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// SIGKILLs the process by PID and reaps it; returns the moment just before the kill. An
    /// error if it had already exited.
    pub fn kill(&mut self) -> Result<Instant> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} (pid {}) had already exited: {status}", self.name, self.pid());
        }
        let at = Instant::now();
        self.child.kill().with_context(|| format!("kill {} (pid {})", self.name, self.pid()))?;
        self.child.wait()?;
        eprintln!("killed {} (pid {})", self.name, self.pid());
        Ok(at)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            eprintln!("cleanup: killing {} (pid {})", self.name, self.pid());
            if self.options.continue_before_kill {
                // SAFETY: as in `signal`: our own unreaped child.
                unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGCONT) };
            }
            if let Err(e) = self.child.kill() {
                eprintln!("cleanup: kill {} (pid {}): {e}", self.name, self.pid());
            }
            let _ = self.child.wait();
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

fn echo_stderr(stderr: impl Read, tag: &str) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        eprintln!("[{tag} stderr] {line}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_lines_and_kills_on_drop() {
        let mut proc = Proc::spawn_with(
            "sh",
            Command::new("sh").args(["-c", "echo one; echo oops >&2; echo two; exec sleep 30"]),
            Options { stderr: Stderr::Echo, continue_before_kill: true },
        )
        .unwrap();
        assert_eq!(proc.next_line(Duration::from_secs(5)).unwrap().1, "one");
        let (_, two) = proc.wait_line(Duration::from_secs(5), |l| l == "two").unwrap();
        assert_eq!(two, "two");
        assert_eq!(proc.lines().len(), 2);
        // Stopped, as a frozen service is: the drop must still end it.
        proc.signal(libc::SIGSTOP).unwrap();
        let pid = proc.pid();
        drop(proc);
        assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists(), "pid {pid} is still there after the drop");
    }

    #[test]
    fn kill_reports_the_moment_and_an_exit_is_an_error() {
        let mut proc = Proc::spawn("sleep", Command::new("sleep").arg("30")).unwrap();
        assert!(proc.running());
        let before = Instant::now();
        assert!(proc.kill().unwrap() >= before);
        assert!(!proc.running());
        assert!(proc.kill().is_err(), "a second kill");
        let mut quiet = Proc::spawn("true", &mut Command::new("true")).unwrap();
        assert!(quiet.next_line(Duration::from_secs(5)).is_err());
        assert!(quiet.wait_exit(Duration::from_secs(5)).unwrap().success());
    }
}
