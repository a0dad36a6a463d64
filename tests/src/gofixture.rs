//! `fake-kubelet`: a small Go program that is a **test fixture, not kubelet**.
//!
//! Real kubelet is not available to the tests, so `tests/fixtures/fake-kubelet/` holds a Go
//! module whose path (`k8s.io/kubernetes`, package `pkg/kubelet/pleg`) gives its relist method
//! exactly the symbol of kubelet ≥1.26, [`RELIST_SYMBOL`], next to [`UPDATE_CACHE_SYMBOL`] and
//! [`HEALTHY_SYMBOL`]. It holds no kubelet code. All three are `//go:noinline`; `Relist` has
//! three return paths, so several RET instructions. As in kubelet, it is called through the
//! method value `g.Relist`, so the binary also has a `…Relist-fm` wrapper: match names exactly.
//!
//! [`build_fake_kubelet`] builds it once per test process with the system's Go (Debian's
//! golang-go, Go 1.19), stripped (`-ldflags='-s -w'`) like a release kubelet, so the names
//! are only in `.gopclntab`, and checks that they are. [`FakeKubelet`] runs it: a relist every
//! second (`--period`), one of which a test can park ([`FakeKubelet::block_next`]) and let
//! go ([`FakeKubelet::release`]) deterministically. A parked relist waits on a Go channel,
//! like a kubelet goroutine waiting for a gRPC reply: no thread is in a blocking syscall.
//!
//! Timestamps in the fixture's output are `CLOCK_MONOTONIC` seconds, the clock of
//! `bpf_ktime_get_ns`. Nothing here needs root.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use object::{Object, ObjectSection};

/// kubelet ≥1.26's relist method (≤1.25: `….relist`), as the fixture carries it.
pub const RELIST_SYMBOL: &str = "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Relist";
/// The per-pod cache update called by each relist.
pub const UPDATE_CACHE_SYMBOL: &str =
    "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).updateCache";
/// The health check (called every period by the fixture, and by the `health` command).
pub const HEALTHY_SYMBOL: &str = "k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Healthy";

/// How long the fixture may take to print `ready`, or to acknowledge a command.
pub const READY_TIMEOUT: Duration = Duration::from_secs(10);
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);

/// The Go module's directory.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake-kubelet")
}

static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();

/// Builds the fixture (once per test process; later calls return the same path, or the same
/// error) and returns the path of the stripped binary.
///
/// The build runs offline with `$PLEGWATCH_GO` or else `go` from `PATH`:
///
/// ```text
/// CGO_ENABLED=0 GOFLAGS=-mod=mod GOPROXY=off GOWORK=off GOENV=off GOCACHE=DIR/gocache GOPATH=DIR/gopath \
///   go build -trimpath -ldflags='-s -w' -o DIR/fake-kubelet ./cmd/fake-kubelet
/// ```
///
/// DIR is `$CARGO_TARGET_DIR/fake-kubelet` (default `target/fake-kubelet`), or a directory
/// under the system temp dir if that is not writable. The Go cache there makes rebuilds take
/// well under a second. The build is reproducible (`-trimpath`), and the binary at the
/// returned path is replaced only when its bytes change, so a process already running it (or
/// a uprobe on it) is not disturbed by another test process building it again.
///
/// Fails, quoting go's stderr, if `go` is missing or the build fails; and fails if the result
/// has a `.symtab` or DWARF (not stripped), has no `.gopclntab`, or lacks any of the three
/// names, each followed by the NUL that ends it in the pclntab's name table.
pub fn build_fake_kubelet() -> Result<PathBuf> {
    BUILT
        .get_or_init(|| build().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(|e| anyhow!("building the fake-kubelet fixture: {e}"))
}

fn output_dir() -> Result<PathBuf> {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    // SAFETY: geteuid(2) takes no arguments and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let candidates = [
        target.join("fake-kubelet"),
        std::env::temp_dir().join(format!("plegwatch-fake-kubelet-{uid}")),
    ];
    let mut errors = Vec::new();
    for dir in candidates {
        let probe = dir.join(format!(".probe.{}", std::process::id()));
        let writable = std::fs::create_dir_all(&dir)
            .and_then(|()| std::fs::write(&probe, b""))
            .and_then(|()| std::fs::remove_file(&probe));
        match writable {
            Ok(()) => {
                return dir
                    .canonicalize()
                    .with_context(|| format!("canonicalize {}", dir.display()))
            }
            Err(e) => errors.push(format!("{}: {e}", dir.display())),
        }
    }
    bail!("no writable directory for the build: {}", errors.join("; "))
}

fn build() -> Result<PathBuf> {
    let go = std::env::var_os("PLEGWATCH_GO").unwrap_or_else(|| "go".into());
    let go_line = Path::new(&go).display().to_string();
    let version = match Command::new(&go).arg("version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        Ok(out) => bail!(
            "`{go_line} version` failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
            "`{go_line}` not found: install Debian's golang-go (Go 1.19; `apt-get install golang-go`) \
             or point PLEGWATCH_GO at a go binary"
        ),
        Err(e) => bail!("cannot run `{go_line} version`: {e}"),
    };

    let dir = output_dir()?;
    let tmp = dir.join(format!("fake-kubelet.tmp.{}", std::process::id()));
    let bin = dir.join("fake-kubelet");
    let src = fixture_dir();
    let started = Instant::now();
    let out = Command::new(&go)
        .current_dir(&src)
        .args(["build", "-trimpath", "-ldflags=-s -w", "-o"])
        .arg(&tmp)
        .arg("./cmd/fake-kubelet")
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", "-mod=mod")
        .env("GOPROXY", "off")
        .env("GOSUMDB", "off")
        .env("GOWORK", "off")
        .env("GOENV", "off")
        .env("GOTOOLCHAIN", "local")
        .env("GOCACHE", dir.join("gocache"))
        .env("GOPATH", dir.join("gopath"))
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("cannot run `{go_line} build` in {}", src.display()))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "`{go_line} build` of {} failed ({}; {version}):\n{}",
            src.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let took = started.elapsed();

    let bytes = std::fs::read(&tmp).with_context(|| format!("read {}", tmp.display()))?;
    if let Err(e) = check_binary(&bytes) {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("the fixture built by {version} is not as expected")));
    }
    if std::fs::read(&bin).ok().as_deref() == Some(&bytes[..]) {
        std::fs::remove_file(&tmp).with_context(|| format!("remove {}", tmp.display()))?;
    } else {
        std::fs::rename(&tmp, &bin)
            .with_context(|| format!("rename {} to {}", tmp.display(), bin.display()))?;
    }
    eprintln!(
        "built the fake-kubelet fixture with {version} in {took:.1?}: {} ({} bytes, stripped)",
        bin.display(),
        bytes.len()
    );
    Ok(bin)
}

/// Checks that `elf` is stripped (no `.symtab`, no DWARF) and still names the PLEG methods in
/// its `.gopclntab`.
pub fn check_binary(elf: &[u8]) -> Result<()> {
    let file = object::File::parse(elf).context("parse the ELF")?;
    for name in [".symtab", ".debug_info", ".zdebug_info"] {
        ensure!(
            file.section_by_name(name).is_none(),
            "it has a {name} section: not stripped"
        );
    }
    let pclntab = file
        .section_by_name(".gopclntab")
        .context("it has no .gopclntab section")?
        .data()
        .context("read .gopclntab")?;
    for symbol in [RELIST_SYMBOL, UPDATE_CACHE_SYMBOL, HEALTHY_SYMBOL] {
        let needle = [symbol.as_bytes(), b"\0"].concat();
        ensure!(
            contains(pclntab, &needle),
            "its .gopclntab does not hold the name {symbol}"
        );
    }
    Ok(())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

/// One line of the fixture's stdout, as read.
#[derive(Clone, Debug)]
pub struct Line {
    /// When the reader thread read it.
    pub at: Instant,
    pub text: String,
    pub kind: Kind,
}

/// What a line says. Times are the fixture's `CLOCK_MONOTONIC` seconds.
#[derive(Clone, Debug, PartialEq)]
pub enum Kind {
    Ready {
        pid: u32,
    },
    Ack {
        command: String,
    },
    /// Printed inside `Relist`, after its entry.
    RelistStart {
        n: u64,
        t: f64,
    },
    /// The relist is about to park (it took a `block`).
    RelistBlocking {
        n: u64,
        t: f64,
    },
    /// Printed inside `Relist`, just before it returns.
    RelistEnd {
        n: u64,
        t: f64,
    },
    /// The answer to a `health` command.
    Healthy {
        ok: bool,
        message: String,
    },
    Bye,
    Other,
}

fn parse_line(text: &str) -> Kind {
    let words: Vec<&str> = text.split_whitespace().collect();
    let num = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
    let time = |i: usize| words.get(i).and_then(|w| w.parse::<f64>().ok());
    match words.as_slice() {
        ["ready", pid] => pid
            .parse()
            .map(|pid| Kind::Ready { pid })
            .unwrap_or(Kind::Other),
        ["ack", command] => Kind::Ack {
            command: (*command).to_owned(),
        },
        ["relist", what, ..] => match (*what, num(2), time(3)) {
            ("start", Some(n), Some(t)) => Kind::RelistStart { n, t },
            ("blocking", Some(n), Some(t)) => Kind::RelistBlocking { n, t },
            ("end", Some(n), Some(t)) => Kind::RelistEnd { n, t },
            _ => Kind::Other,
        },
        ["healthy", ok, ..] => Kind::Healthy {
            ok: *ok == "true",
            message: words[2..].join(" "),
        },
        ["bye"] => Kind::Bye,
        _ => Kind::Other,
    }
}

/// The times of one relist, from the fixture's output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Relist {
    pub n: u64,
    pub start: f64,
    pub blocking: Option<f64>,
    pub end: Option<f64>,
}

#[derive(Default)]
struct State {
    lines: Vec<Line>,
    /// The fixture closed its stdout (it exited).
    eof: bool,
}

type Shared = Arc<(Mutex<State>, Condvar)>;

/// A running fake-kubelet (a test fixture, not kubelet), SIGKILLed by PID on drop if it still
/// runs. Its stdout is read by a thread, echoed to stderr as `[fake-kubelet PID] …`, and kept.
pub struct FakeKubelet {
    child: Child,
    stdin: Option<ChildStdin>,
    shared: Shared,
    /// Lines before this index are not considered by `wait_relist_start`.
    start_cursor: usize,
    /// Lines before this index are not considered when waiting for a command's answer.
    ack_cursor: usize,
    reader: Option<JoinHandle<()>>,
}

impl FakeKubelet {
    /// Starts `bin` with the defaults (a relist every 1 s, 3 fake pods) and waits for `ready`.
    pub fn start(bin: &Path) -> Result<Self> {
        Self::start_with_args(bin, &[])
    }

    /// Starts `bin` with extra arguments (`--period 200ms`, `--pods 0`, `--threshold 5s`),
    /// commands on its stdin, and waits for `ready`.
    pub fn start_with_args(bin: &Path, args: &[&str]) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("spawn {} {args:?}", bin.display()))?;
        let pid = child.id();
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("fake-kubelet stdout")?;
        let shared: Shared = Arc::default();
        let reader_shared = Arc::clone(&shared);
        let reader = thread::Builder::new()
            .name("fake-kubelet-out".into())
            .spawn(move || {
                let (state, cond) = &*reader_shared;
                for text in BufReader::new(stdout).lines() {
                    let Ok(text) = text else { break };
                    let at = Instant::now();
                    eprintln!("[fake-kubelet {pid}] {text}");
                    let kind = parse_line(&text);
                    state.lock().unwrap().lines.push(Line { at, text, kind });
                    cond.notify_all();
                }
                state.lock().unwrap().eof = true;
                cond.notify_all();
            });
        let reader = match reader {
            Ok(reader) => reader,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(e).context("spawn a reader thread");
            }
        };
        let mut kubelet = Self {
            child,
            stdin,
            shared,
            start_cursor: 0,
            ack_cursor: 0,
            reader: Some(reader),
        };
        eprintln!(
            "started the fake-kubelet fixture (pid {pid}): {} {args:?}",
            bin.display()
        );
        let ready = kubelet.wait_line(0, READY_TIMEOUT, |k| match k {
            Kind::Ready { pid } => Some(*pid),
            _ => None,
        });
        match ready {
            Some((i, said)) => {
                ensure!(
                    said == pid,
                    "fake-kubelet said `ready {said}` but its pid is {pid}"
                );
                kubelet.start_cursor = i + 1;
                kubelet.ack_cursor = i + 1;
                Ok(kubelet)
            }
            None => bail!(
                "fake-kubelet (pid {pid}) did not print `ready` within {READY_TIMEOUT:?}; it printed: {:?}",
                kubelet.transcript()
            ),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Every stdout line so far.
    pub fn transcript(&self) -> Vec<String> {
        let state = self.shared.0.lock().unwrap();
        state.lines.iter().map(|l| l.text.clone()).collect()
    }

    /// The times of relist `n`, if it has started.
    pub fn relist(&self, n: u64) -> Option<Relist> {
        let state = self.shared.0.lock().unwrap();
        let mut relist: Option<Relist> = None;
        for line in &state.lines {
            match line.kind {
                Kind::RelistStart { n: m, t } if m == n => {
                    relist = Some(Relist {
                        n,
                        start: t,
                        blocking: None,
                        end: None,
                    })
                }
                Kind::RelistBlocking { n: m, t } if m == n => {
                    if let Some(r) = relist.as_mut() {
                        r.blocking = Some(t);
                    }
                }
                Kind::RelistEnd { n: m, t } if m == n => {
                    if let Some(r) = relist.as_mut() {
                        r.end = Some(t);
                    }
                }
                _ => {}
            }
        }
        relist
    }

    /// Makes the next relist to start park until [`release`](Self::release), and returns
    /// once the fixture acknowledged it. The next [`wait_relist_start`](Self::wait_relist_start)
    /// returns that relist: every start printed after the acknowledgement is the parked one.
    pub fn block_next(&mut self) -> Result<()> {
        let i = self.command(
            "block",
            "ack block",
            |k| matches!(k, Kind::Ack { command } if command == "block"),
        )?;
        self.start_cursor = self.start_cursor.max(i + 1);
        Ok(())
    }

    /// Lets the parked relist go on (or cancels a `block` no relist took yet), and returns
    /// once the fixture acknowledged it.
    pub fn release(&mut self) -> Result<()> {
        self.command(
            "release",
            "ack release",
            |k| matches!(k, Kind::Ack { command } if command == "release"),
        )?;
        Ok(())
    }

    /// Calls the fixture's `Healthy()`: `(ok, message)`.
    pub fn healthy(&mut self) -> Result<(bool, String)> {
        let i = self.command("health", "healthy …", |k| {
            matches!(k, Kind::Healthy { .. })
        })?;
        match &self.shared.0.lock().unwrap().lines[i].kind {
            Kind::Healthy { ok, message } => Ok((*ok, message.clone())),
            _ => unreachable!(),
        }
    }

    /// The number of the next relist that starts (after the previous one this returned, and
    /// after the last [`block_next`](Self::block_next)), or `None` if none starts within
    /// `timeout` or the fixture exits.
    pub fn wait_relist_start(&mut self, timeout: Duration) -> Option<u64> {
        let (i, n) = self.wait_line(self.start_cursor, timeout, |k| match k {
            Kind::RelistStart { n, .. } => Some(*n),
            _ => None,
        })?;
        self.start_cursor = i + 1;
        Some(n)
    }

    /// When relist `n` ended (the fixture's `CLOCK_MONOTONIC` seconds), waiting up to
    /// `timeout` for it; `None` if it did not end in time or the fixture exited.
    pub fn wait_relist_end(&mut self, n: u64, timeout: Duration) -> Option<f64> {
        self.wait_line(0, timeout, |k| match k {
            Kind::RelistEnd { n: m, t } if *m == n => Some(*t),
            _ => None,
        })
        .map(|(_, t)| t)
    }

    /// Sends `quit` and waits for the process to exit (it exits at once, also with a relist
    /// parked); an error unless it printed `bye` and exited 0.
    pub fn quit(mut self) -> Result<ExitStatus> {
        let pid = self.pid();
        self.send("quit")?;
        let deadline = Instant::now() + ACK_TIMEOUT;
        let status = loop {
            if let Some(status) = self.child.try_wait()? {
                break status;
            }
            ensure!(
                Instant::now() < deadline,
                "fake-kubelet (pid {pid}) did not exit within {ACK_TIMEOUT:?} of `quit`"
            );
            thread::sleep(Duration::from_millis(10));
        };
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
        let said_bye = {
            let state = self.shared.0.lock().unwrap();
            state.lines.iter().any(|l| l.kind == Kind::Bye)
        };
        ensure!(
            said_bye && status.success(),
            "fake-kubelet (pid {pid}) exited ({status}) {} after `quit`",
            if said_bye {
                "having said bye"
            } else {
                "without saying bye"
            }
        );
        eprintln!("fake-kubelet (pid {pid}) quit: {status}");
        Ok(status)
    }

    fn send(&mut self, command: &str) -> Result<()> {
        let pid = self.pid();
        let stdin = self
            .stdin
            .as_mut()
            .context("fake-kubelet stdin is closed")?;
        stdin
            .write_all(format!("{command}\n").as_bytes())
            .and_then(|()| stdin.flush())
            .with_context(|| format!("send `{command}` to fake-kubelet (pid {pid})"))
    }

    /// Sends `command` and waits for the first line after the previous answer that `is_answer`
    /// accepts; returns its index.
    fn command(
        &mut self,
        command: &str,
        answer: &str,
        is_answer: impl Fn(&Kind) -> bool,
    ) -> Result<usize> {
        self.send(command)?;
        let from = self.ack_cursor;
        let Some((i, ())) = self.wait_line(from, ACK_TIMEOUT, |k| is_answer(k).then_some(()))
        else {
            bail!(
                "fake-kubelet (pid {}) did not answer `{command}` with `{answer}` within {ACK_TIMEOUT:?}; it printed: {:?}",
                self.pid(),
                self.transcript()
            );
        };
        self.ack_cursor = i + 1;
        Ok(i)
    }

    /// The first line at index `from` or later that `pick` accepts, with its index, waiting up
    /// to `timeout`; `None` on timeout or once the fixture's stdout closed with no such line.
    fn wait_line<T>(
        &self,
        from: usize,
        timeout: Duration,
        pick: impl Fn(&Kind) -> Option<T>,
    ) -> Option<(usize, T)> {
        let deadline = Instant::now() + timeout;
        let (state, cond) = &*self.shared;
        let mut state = state.lock().unwrap();
        let mut next = from;
        loop {
            while next < state.lines.len() {
                if let Some(found) = pick(&state.lines[next].kind) {
                    return Some((next, found));
                }
                next += 1;
            }
            let now = Instant::now();
            if state.eof || now >= deadline {
                return None;
            }
            state = cond.wait_timeout(state, deadline - now).unwrap().0;
        }
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        let pid = self.pid();
        if let Ok(None) = self.child.try_wait() {
            eprintln!("cleanup: killing the fake-kubelet fixture (pid {pid})");
            if let Err(e) = self.child.kill() {
                eprintln!("cleanup: kill fake-kubelet (pid {pid}): {e}");
            }
        }
        let _ = self.child.wait();
        self.stdin.take();
        if let Some(reader) = self.reader.take() {
            let _ = reader.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_fixture_lines() {
        assert_eq!(parse_line("ready 42"), Kind::Ready { pid: 42 });
        assert_eq!(
            parse_line("relist start 12 4250.998974578"),
            Kind::RelistStart {
                n: 12,
                t: 4250.998974578
            }
        );
        assert_eq!(
            parse_line("relist end 12 4251.5 pods=3 changed=0"),
            Kind::RelistEnd { n: 12, t: 4251.5 }
        );
        assert_eq!(
            parse_line("relist blocking 3 1.25"),
            Kind::RelistBlocking { n: 3, t: 1.25 }
        );
        assert_eq!(
            parse_line("ack block"),
            Kind::Ack {
                command: "block".into()
            }
        );
        assert_eq!(
            parse_line("healthy false pleg was last seen active 4s ago; threshold is 3s"),
            Kind::Healthy {
                ok: false,
                message: "pleg was last seen active 4s ago; threshold is 3s".into()
            }
        );
        assert_eq!(parse_line("health true 12.5"), Kind::Other);
        assert_eq!(parse_line("bye"), Kind::Bye);
    }
}
