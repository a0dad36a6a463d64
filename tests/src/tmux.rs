//! A program on a real terminal: a detached tmux session running it, whose screen the test
//! reads with `capture-pane` and types into with `send-keys`.

use std::ffi::OsStr;
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};

use crate::sys::run;

/// How often the screen is read while waiting for it to show something.
const POLL: Duration = Duration::from_millis(100);

/// Why tmux cannot be used here, if it cannot.
pub fn unavailable() -> Option<String> {
    match Command::new("tmux").arg("-V").output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!("`tmux -V` failed ({}); `cargo xtask setup` installs tmux", out.status)),
        Err(e) => Some(format!("tmux cannot be run ({e}); `cargo xtask setup` installs tmux")),
    }
}

/// How the program in the pane ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
}

/// A detached tmux session, on a server of its own (`tmux -L NAME`, no config file), running
/// one program in one pane of a fixed size. The pane stays after the program exits
/// (`remain-on-exit`), so its last screen and exit status can be read. Dropping it kills the
/// session (and with it the program, by SIGHUP, if still running); the server, left with no
/// session, exits by itself.
#[derive(Debug)]
pub struct Tmux {
    name: String,
}

impl Tmux {
    /// Starts `argv` (run directly, not through a shell) on a `width`x`height` terminal.
    pub fn start<S: AsRef<OsStr>>(width: u16, height: u16, argv: &[S]) -> Result<Self> {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
        let name = format!("plegwatch-live-{}-{nanos}", std::process::id());
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &name, "-f", "/dev/null", "new-session", "-d", "-s", &name])
            .args(["-x", &width.to_string(), "-y", &height.to_string()])
            .args(argv)
            // Same server command: set before the program can exit.
            .args([";", "set-option", "-w", "-t", &name, "remain-on-exit", "on"]);
        run(&mut cmd)?;
        let session = Self { name };
        eprintln!("started tmux session {} (pane pid {})", session.name, session.format("#{pane_pid}")?.trim());
        Ok(session)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    fn tmux(&self) -> Command {
        let mut cmd = Command::new("tmux");
        cmd.args(["-L", &self.name]);
        cmd
    }

    /// A tmux format (`#{pane_pid}`, ...) expanded for the pane.
    fn format(&self, format: &str) -> Result<String> {
        run(self.tmux().args(["display-message", "-p", "-t", &self.name, format]))
    }

    /// The visible screen, one line a row.
    pub fn screen(&self) -> Result<String> {
        run(self.tmux().args(["capture-pane", "-p", "-t", &self.name]))
    }

    /// The scrollback and the visible screen.
    pub fn history(&self) -> Result<String> {
        run(self.tmux().args(["capture-pane", "-p", "-S", "-", "-t", &self.name]))
    }

    /// Types `keys` as `tmux send-keys` names them (`C-c`, `Enter`, ...).
    pub fn send_keys(&self, keys: &str) -> Result<()> {
        run(self.tmux().args(["send-keys", "-t", &self.name, keys])).map(drop)
    }

    /// How the program ended, once it has exited; `None` while it runs.
    ///
    /// tmux reports the status once it has reaped the program. On this machine it sometimes
    /// did not (with plain `--no-live` lines too): the pane was dead and the program stayed a
    /// zombie for minutes. The status is then read from the zombie's `/proc/PID/stat`.
    pub fn exit(&self) -> Result<Option<Exit>> {
        let out = self.format("#{pane_dead}:#{pane_dead_status}:#{pane_dead_signal}:#{pane_pid}")?;
        let f: Vec<&str> = out.trim().split(':').collect();
        let num = |s: &str| s.parse::<i32>().with_context(|| format!("tmux pane status {out:?}"));
        match f.as_slice() {
            ["1", status, _, _] if !status.is_empty() => Ok(Some(Exit::Code(num(status)?))),
            ["1", _, signal, _] if !signal.is_empty() => Ok(Some(Exit::Signal(num(signal)?))),
            ["1", _, _, pid] => zombie_exit(num(pid)?),
            _ => Ok(None),
        }
    }

    /// The first screen within `timeout` that `pred` accepts; an error quoting the last screen
    /// otherwise, or as soon as the program exits.
    pub fn wait_screen(&self, timeout: Duration, what: &str, pred: impl Fn(&str) -> bool) -> Result<String> {
        let deadline = Instant::now() + timeout;
        loop {
            let screen = self.screen()?;
            if pred(&screen) {
                return Ok(screen);
            }
            if self.format("#{pane_dead}")?.trim() == "1" {
                // It may have drawn the awaited screen and exited between the read above
                // and this check: look once more, at the screen and at what scrolled off.
                let history = self.history()?;
                if pred(&self.screen()?) || pred(&history) {
                    return Ok(history);
                }
                bail!("the program exited before the screen showed {what}; its last screen:\n{history}");
            }
            if Instant::now() >= deadline {
                bail!("the screen did not show {what} within {timeout:?}; it shows:\n{screen}");
            }
            thread::sleep(POLL);
        }
    }

    /// Waits up to `timeout` for the program to exit.
    pub fn wait_exit(&self, timeout: Duration) -> Result<Exit> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(exit) = self.exit()? {
                return Ok(exit);
            }
            if Instant::now() >= deadline {
                bail!("the program did not exit within {timeout:?}; its screen:\n{}", self.screen()?);
            }
            thread::sleep(POLL);
        }
    }
}

/// The exit status of `pid` if it is a zombie, from field 52 (`exit_code`, as `waitpid(2)`
/// reports it) of `/proc/PID/stat`.
fn zombie_exit(pid: i32) -> Result<Option<Exit>> {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        // Reaped just now: tmux has the status, read next time.
        return Ok(None);
    };
    // After the `(comm)` field, which may hold spaces: field 3 (state) onwards.
    let rest: Vec<&str> = stat.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
    if rest.first() != Some(&"Z") {
        return Ok(None);
    }
    let code: i32 = rest.get(52 - 3).and_then(|c| c.parse().ok()).with_context(|| format!("no exit_code in /proc/{pid}/stat: {stat}"))?;
    eprintln!("tmux has not reaped pid {pid} (a zombie); its exit status is from /proc/{pid}/stat");
    Ok(Some(match code & 0x7f {
        0 => Exit::Code((code >> 8) & 0xff),
        signal => Exit::Signal(signal),
    }))
}

impl Drop for Tmux {
    fn drop(&mut self) {
        if let Err(e) = run(self.tmux().args(["kill-session", "-t", &self.name])) {
            eprintln!("cleanup: {e:#}");
        }
    }
}
