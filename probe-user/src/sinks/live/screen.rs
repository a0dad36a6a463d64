//! The terminal the live view draws on, and everything it changes there,
//! put back by [`Screen::leave`] or on drop (also while unwinding a panic):
//!
//! - the alternate screen, with the cursor hidden;
//! - the tty's echo, turned off so typed keys do not scribble on the view.
//!   Raw mode is not used: it would turn Ctrl-C into a byte, and the engine
//!   ends cleanly on the SIGINT the tty sends;
//! - stderr, when it is the terminal too: plegwatch's logs would scribble on
//!   the view, so fd 2 goes to a pipe while the view is up. The view shows
//!   the last lines, and they are written to the real stderr when it goes.
//!   The pipe never blocks a writer: a full pipe drops log bytes instead.

use super::state::LiveState;
use ratatui::{
    backend::CrosstermBackend,
    crossterm::{
        cursor, execute,
        terminal::{EnterAlternateScreen, LeaveAlternateScreen},
    },
    Terminal,
};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, IsTerminal, Read, Stdout};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Instant;

/// How many log lines are kept to be written out when the view goes.
const LOGS_KEPT: usize = 200;

/// The live view's terminal, taken over until dropped.
pub struct Screen {
    terminal: Option<Terminal<CrosstermBackend<Stdout>>>,
    /// The tty settings before echo was turned off.
    termios: Option<libc::termios>,
    capture: Option<StderrCapture>,
    alternate: bool,
}

/// What was logged while the view was up: the last [`LOGS_KEPT`] lines, and
/// how many came before them.
#[derive(Debug, Default)]
pub struct Logs {
    pub lines: Vec<String>,
    pub dropped: u64,
}

impl Screen {
    /// Takes over stdout's terminal.
    pub fn enter() -> io::Result<Screen> {
        let mut s = Screen { terminal: None, termios: None, capture: None, alternate: false };
        if io::stderr().is_terminal() {
            match StderrCapture::start() {
                Ok(c) => s.capture = Some(c),
                Err(e) => tracing::warn!("live view: logs stay on the terminal ({e})"),
            }
        }
        s.termios = no_echo(libc::STDOUT_FILENO);
        // From here on, dropping `s` undoes what was done.
        s.alternate = true;
        execute!(io::stdout(), EnterAlternateScreen, cursor::Hide)?;
        s.terminal = Some(Terminal::new(CrosstermBackend::new(io::stdout()))?);
        Ok(s)
    }

    /// The lines logged since the last call (their ANSI colours stripped).
    pub fn new_logs(&mut self) -> Vec<String> {
        match self.capture.as_mut() {
            Some(c) => c.pump().into_iter().map(|l| strip_ansi(&l)).collect(),
            None => Vec::new(),
        }
    }

    pub fn draw(&mut self, state: &LiveState, now: Instant) -> io::Result<()> {
        if let Some(t) = self.terminal.as_mut() {
            t.draw(|f| state.render(f, now))?;
        }
        Ok(())
    }

    /// Gives the terminal back (main screen, cursor, echo, stderr) and
    /// returns what was logged meanwhile. A second call does nothing.
    pub fn leave(&mut self) -> Logs {
        self.terminal = None;
        if std::mem::take(&mut self.alternate) {
            let _ = execute!(io::stdout(), cursor::Show, LeaveAlternateScreen);
        }
        if let Some(t) = self.termios.take() {
            // SAFETY: tcsetattr(3) on stdout's fd with settings read from it by `no_echo`.
            unsafe { libc::tcsetattr(libc::STDOUT_FILENO, libc::TCSANOW, &t) };
        }
        self.capture.take().map(StderrCapture::finish).unwrap_or_default()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        let logs = self.leave();
        // Not left by the view's own exit (a panic, most likely): the logs still go out.
        write_logs(&logs);
    }
}

/// Writes what was logged while the view was up to stderr, as it was logged.
pub fn write_logs(logs: &Logs) {
    use std::io::Write as _;
    let mut err = io::stderr().lock();
    if logs.dropped > 0 {
        let _ = writeln!(err, "({} earlier log lines not kept)", logs.dropped);
    }
    for l in &logs.lines {
        let _ = writeln!(err, "{l}");
    }
}

/// Turns the tty's echo off; returns the settings to restore (none if `fd`
/// is not a tty).
fn no_echo(fd: i32) -> Option<libc::termios> {
    // SAFETY: termios is plain old data; tcgetattr(3) fills it or fails.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `t` is a valid termios to fill.
    if unsafe { libc::tcgetattr(fd, &mut t) } != 0 {
        return None;
    }
    let mut quiet = t;
    quiet.c_lflag &= !(libc::ECHO | libc::ECHONL);
    // SAFETY: settings read from this fd, with echo bits cleared; ISIG stays,
    // so Ctrl-C still sends SIGINT.
    if unsafe { libc::tcsetattr(fd, libc::TCSANOW, &quiet) } != 0 {
        return None;
    }
    Some(t)
}

/// fd 2 pointed at a non-blocking pipe, until [`StderrCapture::finish`] (or drop).
struct StderrCapture {
    /// The real stderr, to put back.
    saved: Option<OwnedFd>,
    read: File,
    lines: LogLines,
}

impl StderrCapture {
    fn start() -> io::Result<StderrCapture> {
        let mut fds = [0; 2];
        // SAFETY: pipe2(2) fills two fds; both are owned below.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC | libc::O_NONBLOCK) } != 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fresh fds from pipe2, owned by nothing else.
        let (read, write) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        // SAFETY: fcntl(2) duplicating fd 2 to a new close-on-exec fd.
        let saved = unsafe { libc::fcntl(libc::STDERR_FILENO, libc::F_DUPFD_CLOEXEC, 3) };
        if saved < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a fresh fd from fcntl, owned by nothing else.
        let saved = unsafe { OwnedFd::from_raw_fd(saved) };
        // SAFETY: dup2(2) of our pipe's write end onto fd 2; `write` closes its
        // own fd on drop, fd 2 keeps the pipe open.
        if unsafe { libc::dup2(write.as_raw_fd(), libc::STDERR_FILENO) } < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(StderrCapture { saved: Some(saved), read: File::from(read), lines: LogLines::default() })
    }

    /// The whole lines written since the last call.
    fn pump(&mut self) -> Vec<String> {
        let mut buf = [0u8; 8192];
        let mut new = Vec::new();
        loop {
            match self.read.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => new.extend(self.lines.push(&buf[..n])),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
        new
    }

    fn restore(&mut self) {
        if let Some(saved) = self.saved.take() {
            // SAFETY: dup2(2) of the saved stderr back onto fd 2.
            unsafe { libc::dup2(saved.as_raw_fd(), libc::STDERR_FILENO) };
        }
    }

    fn finish(mut self) -> Logs {
        self.restore();
        self.pump();
        self.lines.flush();
        Logs { lines: std::mem::take(&mut self.lines.kept).into(), dropped: self.lines.dropped }
    }
}

impl Drop for StderrCapture {
    fn drop(&mut self) {
        self.restore();
    }
}

/// Bytes in, whole lines out, the last [`LOGS_KEPT`] kept.
#[derive(Debug, Default)]
struct LogLines {
    partial: Vec<u8>,
    kept: VecDeque<String>,
    dropped: u64,
}

impl LogLines {
    fn push(&mut self, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        for &b in bytes {
            if b == b'\n' {
                out.push(self.take_line());
            } else {
                self.partial.push(b);
            }
        }
        out
    }

    /// Keeps a last line that had no newline.
    fn flush(&mut self) {
        if !self.partial.is_empty() {
            self.take_line();
        }
    }

    fn take_line(&mut self) -> String {
        let line = String::from_utf8_lossy(&std::mem::take(&mut self.partial)).into_owned();
        self.kept.push_back(line.clone());
        if self.kept.len() > LOGS_KEPT {
            self.kept.pop_front();
            self.dropped += 1;
        }
        line
    }
}

/// `s` without ANSI escape sequences (CSI `ESC [ … final`, and lone `ESC x`).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\x1b' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_bytes_become_lines_and_only_the_last_are_kept() {
        let mut l = LogLines::default();
        assert!(l.push(b"par").is_empty());
        assert_eq!(l.push(b"tial\nnext\nrest"), ["partial", "next"]);
        l.flush();
        assert_eq!(l.kept, ["partial", "next", "rest"]);
        for n in 0..LOGS_KEPT {
            l.push(format!("{n}\n").as_bytes());
        }
        assert_eq!(l.kept.len(), LOGS_KEPT);
        assert_eq!(l.dropped, 3);
        assert_eq!(l.kept.front().map(String::as_str), Some("0"));
    }

    #[test]
    fn ansi_colours_are_stripped() {
        assert_eq!(
            strip_ansi("\x1b[2m2026-11-22T02:45:01Z\x1b[0m \x1b[32m INFO\x1b[0m SIGINT: detaching"),
            "2026-11-22T02:45:01Z  INFO SIGINT: detaching"
        );
        assert_eq!(strip_ansi("plain"), "plain");
        assert_eq!(strip_ansi("cut\x1b"), "cut");
    }
}
