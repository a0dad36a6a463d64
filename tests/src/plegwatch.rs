//! The `plegwatch watch --json` process under test.

use std::fmt::Display;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

use crate::events::{dump, Event};
use crate::preflight::plegwatch_bin;

/// How long loading and attaching the eBPF programs may take before `ready`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long plegwatch may take to print its summary and exit after SIGINT.
pub const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// Names how Go probe points find their function in every plegwatch started here
/// (`cookie` or `address`; unset: plegwatch's own choice).
pub const GO_UPROBES_ENV: &str = "PLEGWATCH_TEST_GO_UPROBES";
/// Poll period while waiting for lines or for the process.
const POLL: Duration = Duration::from_millis(50);

/// A running `plegwatch watch --json ARGS...`.
///
/// A thread reads its stdout, parses each line as JSON and stamps it with the moment it was
/// read; another keeps its stderr (both are echoed to the test's stderr, which the test
/// harness shows for failing tests or with `--nocapture`). Dropping it kills the process by
/// PID if it still runs; a test ends it with [`Plegwatch::stop`], which also checks it exited
/// cleanly.
pub struct Plegwatch {
    child: Child,
    /// The command plegwatch runs under (`unshare ...`), empty for none.
    wrapper: Vec<String>,
    /// plegwatch's own pid when it runs under a wrapper (from its ready line).
    inner: Option<u32>,
    started: Instant,
    lines: Receiver<Event>,
    events: Vec<Event>,
    stderr: Arc<Mutex<String>>,
    not_json: Arc<Mutex<Vec<String>>>,
    readers: Vec<JoinHandle<()>>,
}

impl Plegwatch {
    /// Spawns `$PLEGWATCH_BIN watch --json ARGS...`.
    pub fn start(args: &[&str]) -> Result<Self> {
        Self::start_under(&[], args)
    }

    /// Spawns `WRAPPER... $PLEGWATCH_BIN watch --json ARGS...`: plegwatch under a command
    /// that execs it (or forks it, as `unshare --fork` does), e.g. in namespaces of its own
    /// ([`crate::namespaces`]). [`Plegwatch::pid`] is then plegwatch's own (host) pid, known
    /// from its ready line, and SIGINT goes to it, not to the wrapper.
    pub fn start_under(wrapper: &[&str], args: &[&str]) -> Result<Self> {
        let bin = plegwatch_bin()?;
        let mut cmd = match wrapper.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(&bin);
                c
            }
            None => Command::new(&bin),
        };
        // `PLEGWATCH_TEST_GO_UPROBES=address` reruns any scenario with Go probe points
        // found by address, as on kernels without attach cookies (before 5.15).
        let forced: Vec<String> = match std::env::var(GO_UPROBES_ENV) {
            Ok(how) if !how.is_empty() && !args.contains(&"--go-uprobes") => vec!["--go-uprobes".into(), how],
            _ => Vec::new(),
        };
        let mut child = cmd
            .args(["watch", "--json"])
            .args(args)
            .args(&forced)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawn {}", bin.display()))?;
        eprintln!(
            "started plegwatch (pid {}): {}{} watch --json {}",
            child.id(),
            wrapper.iter().map(|w| format!("{w} ")).collect::<String>(),
            bin.display(),
            args.iter().map(|a| a.to_string()).chain(forced.iter().cloned()).collect::<Vec<_>>().join(" ")
        );
        let stdout = child.stdout.take().context("plegwatch stdout")?;
        let stderr_pipe = child.stderr.take().context("plegwatch stderr")?;
        let (tx, lines) = mpsc::channel();
        let stderr = Arc::new(Mutex::new(String::new()));
        let not_json = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            spawn_reader("plegwatch-out", {
                let not_json = Arc::clone(&not_json);
                move || read_stdout(stdout, tx, not_json)
            })?,
            spawn_reader("plegwatch-err", {
                let stderr = Arc::clone(&stderr);
                move || read_stderr(stderr_pipe, stderr)
            })?,
        ];
        Ok(Self {
            child,
            wrapper: wrapper.iter().map(|w| w.to_string()).collect(),
            inner: None,
            started: Instant::now(),
            lines,
            events: Vec::new(),
            stderr,
            not_json,
            readers,
        })
    }

    /// plegwatch's pid: the child's, or under a wrapper the one its ready line names.
    pub fn pid(&self) -> u32 {
        self.inner.unwrap_or(self.child.id())
    }

    /// What plegwatch wrote to stderr so far.
    pub fn stderr(&self) -> String {
        self.stderr.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Whether plegwatch writes `text` to stderr within `timeout` (stderr is read by its own
    /// thread: a log line written just before a stdout line may be read after it).
    pub fn wait_stderr(&self, text: &str, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.stderr().contains(text) {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits for the `{"type":"ready"}` line, failing early, with plegwatch's stderr, if it
    /// exits first or `timeout` passes.
    pub fn wait_ready(&mut self, timeout: Duration) -> Result<Event> {
        let Some(ready) = self.wait_for(timeout, |e| e.is("ready")) else {
            // Its stdout closes as plegwatch exits, a moment before its process (or the
            // wrapper it runs under, which waits for it) is gone: give that moment.
            let gone_by = Instant::now() + crate::timing::scaled(Duration::from_secs(5));
            let status = loop {
                match self.child.try_wait() {
                    Ok(Some(status)) => break Some(status),
                    Ok(None) if Instant::now() < gone_by => std::thread::sleep(Duration::from_millis(20)),
                    _ => break None,
                }
            };
            let what = match status {
                Some(status) => format!("plegwatch exited ({status}) before it was ready"),
                None => format!("plegwatch printed no ready line within {timeout:?}"),
            };
            return Err(self.failure(what));
        };
        let pid = u64::from(self.pid());
        let named = ready.u64("/pid").and_then(|p| u32::try_from(p).ok());
        match named {
            // Under a wrapper: plegwatch is the child or one of its descendants.
            Some(p) if !self.wrapper.is_empty() && descends_from(p, self.child.id()) => self.inner = Some(p),
            Some(p) if u64::from(p) == pid => {}
            _ => bail!(
                "the ready line names pid {:?}, not plegwatch's {pid}{}: {}",
                ready.get("/pid"),
                if self.wrapper.is_empty() { "" } else { " or a process under it" },
                ready.json
            ),
        }
        eprintln!(
            "plegwatch ready after {:.2}s: probes {}",
            ready.at.duration_since(self.started).as_secs_f64(),
            ready.get("/probes").unwrap_or(&Value::Null)
        );
        // Ready means a stop now gets a summary: SIGINT and SIGTERM are caught by then.
        // (A fresh-clone CI run stopped plegwatch right after its ready line, before it
        // caught SIGINT, and it died of the signal.)
        let caught = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|st| st.lines().find_map(|l| l.strip_prefix("SigCgt:")).and_then(|v| u64::from_str_radix(v.trim(), 16).ok()));
        let wanted = (1u64 << (libc::SIGINT - 1)) | (1u64 << (libc::SIGTERM - 1));
        if let Some(mask) = caught {
            if mask & wanted != wanted {
                return Err(
                    self.failure(format!("plegwatch printed its ready line before catching SIGINT and SIGTERM (SigCgt {mask:016x})"))
                );
            }
        }
        // Everything in ../shared/machine-notes.md works on this machine kind and on the
        // guests' kernels: a probe that fell back to "off" means a verifier refusal, which
        // would make every scenario below test less than it claims. The one exception is a
        // probe whose hook this kernel does not have ([`off_by_design`]), and the ready line
        // must say so.
        let off: Vec<String> = ready
            .get("/probes")
            .and_then(Value::as_array)
            .map(|ps| {
                ps.iter()
                    .filter(|p| p.get("variant").and_then(Value::as_str) == Some("off"))
                    .filter(|p| {
                        let probe = p.get("probe").and_then(Value::as_str).unwrap_or("?");
                        !off_by_design(probe, p.get("why").and_then(Value::as_str).unwrap_or(""))
                    })
                    .map(|p| p.get("probe").and_then(Value::as_str).unwrap_or("?").to_string())
                    .collect()
            })
            .unwrap_or_default();
        if !off.is_empty() {
            return Err(self.failure(format!("plegwatch attached with probes off: {}", off.join(", "))));
        }
        Ok(ready)
    }

    /// Every line read so far.
    pub fn events(&mut self) -> &[Event] {
        self.events.extend(self.lines.try_iter());
        &self.events
    }

    /// The first line, already read or arriving within `timeout`, that `pred` accepts. `None`
    /// if none does in time or plegwatch closes its stdout first.
    pub fn wait_for(&mut self, timeout: Duration, pred: impl Fn(&Event) -> bool) -> Option<Event> {
        let deadline = Instant::now() + crate::timing::scaled(timeout);
        let mut checked = 0;
        loop {
            self.events.extend(self.lines.try_iter());
            if let Some(e) = self.events[checked..].iter().find(|e| pred(e)) {
                return Some(e.clone());
            }
            checked = self.events.len();
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.lines.recv_timeout(left.min(POLL)) {
                Ok(e) => self.events.push(e),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return None,
            }
        }
    }

    /// Waits for the `target` line saying process `pid`'s Go functions are probed (`probed`,
    /// `partial` when some expected ones were left out, or `traced` when its binary already was): the line comes after the uprobes are
    /// attached, so a call begun after it is seen.
    pub fn wait_probed(&mut self, pid: u32, timeout: Duration) -> Result<Event> {
        let line = self.wait_for(timeout, |e| {
            e.is("target") && e.u64("/pid") == Some(u64::from(pid)) && matches!(e.str("/status"), Some("probed" | "partial" | "traced"))
        });
        line.ok_or_else(|| self.failure(format!("no `target` line (probed or traced) for pid {pid} within {timeout:?}")))
    }

    /// Sends SIGINT, waits for the exit (SIGKILL after [`STOP_TIMEOUT`]) and returns every
    /// line read. An error unless plegwatch was still running, exited with status 0, printed
    /// only JSON lines and ended with a `summary` line.
    pub fn stop(self) -> Result<Vec<Event>> {
        self.stop_with(libc::SIGINT)
    }

    /// As [`Plegwatch::stop`], with `signal` (SIGTERM, as a DaemonSet's pod is stopped).
    pub fn stop_with(mut self, signal: libc::c_int) -> Result<Vec<Event>> {
        if let Some(status) = self.child.try_wait()? {
            return Err(self.failure(format!("plegwatch exited ({status}) before it was stopped")));
        }
        let status = self.interrupt(signal)?;
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        wait_exit_handoffs();
        self.events.extend(self.lines.try_iter());
        if !status.success() {
            return Err(self.failure(format!("plegwatch exited with {status} after signal {signal}, not 0")));
        }
        let not_json = self.not_json.lock().map(|v| v.clone()).unwrap_or_default();
        if !not_json.is_empty() {
            return Err(self.failure(format!("plegwatch printed lines that are not JSON objects: {not_json:#?}")));
        }
        let Some(summary) = self.events.iter().find(|e| e.is("summary")) else {
            return Err(self.failure("plegwatch exited without a summary line"));
        };
        // The scan loop's lateness, for the measurements a run's log keeps (--nocapture).
        eprintln!("plegwatch's scans: {}", summary.get("/scans").map(|v| v.to_string()).unwrap_or_default());
        Ok(std::mem::take(&mut self.events))
    }

    /// Sends SIGKILL and reaps it: no summary, no exit hand-off, nothing of its own
    /// clean-up runs. Returns every line read before it died and its exit status.
    pub fn kill9(mut self) -> Result<(Vec<Event>, ExitStatus)> {
        if let Some(status) = self.child.try_wait()? {
            return Err(self.failure(format!("plegwatch exited ({status}) before SIGKILL")));
        }
        self.child.kill().context("SIGKILL plegwatch")?;
        let status = self.child.wait().context("reap plegwatch")?;
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
        self.events.extend(self.lines.try_iter());
        Ok((std::mem::take(&mut self.events), status))
    }

    fn interrupt(&mut self, signal: libc::c_int) -> Result<ExitStatus> {
        // Under a wrapper, plegwatch itself (the wrapper, e.g. unshare, waits for it and
        // exits with its status); it has not been reaped while the wrapper runs.
        let pid = self.pid() as libc::pid_t;
        // SAFETY: kill(2) on the PID of our own child, or of plegwatch under it, not reaped yet.
        if unsafe { libc::kill(pid, signal) } != 0 {
            bail!("signal {signal} to plegwatch (pid {pid}): {}", std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            thread::sleep(POLL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        Err(self.failure(format!("plegwatch did not exit within {STOP_TIMEOUT:?} of signal {signal}; killed it")))
    }

    /// An error saying `what`, followed by every line and all of stderr so far.
    fn failure(&mut self, what: impl Display) -> anyhow::Error {
        if let Ok(Some(_)) = self.child.try_wait() {
            // It exited: let the readers reach EOF, so that its last words are included.
            for reader in self.readers.drain(..) {
                let _ = reader.join();
            }
        }
        self.events.extend(self.lines.try_iter());
        anyhow!(
            "{what}\nplegwatch (pid {}) stdout:\n{}plegwatch stderr:\n{}",
            self.child.id(),
            dump(&self.events, self.started),
            self.stderr()
        )
    }
}

impl Drop for Plegwatch {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            eprintln!("cleanup: killing plegwatch (pid {})", self.child.id());
            if let Err(e) = self.child.kill() {
                eprintln!("cleanup: kill plegwatch (pid {}): {e}", self.child.id());
            }
            let _ = self.child.wait();
        }
    }
}

/// plegwatch leaves the last closes of its probes to a child (`plegwatch-exit`, see
/// `kernel/handoff.rs`), which outlives it by a few seconds. In a guest (a slow clock:
/// `PLEGWATCH_TEST_TIME_SCALE`), the next test does not start while one is still
/// unregistering probes: the kernel rewrites its static-key jumps then, which locked
/// multi-threaded TCG guests up (see xtask's `vm.rs`), and the guests' log reads better
/// with one plegwatch at a time. On the host it is not waited for (2 to 5 s a test).
/// Waits up to a minute (scaled), saying so when it waited at all.
pub fn wait_exit_handoffs() {
    if crate::timing::scale() <= 1.0 {
        return;
    }
    let began = Instant::now();
    let limit = crate::timing::scaled(Duration::from_secs(60));
    let lingering = || -> Vec<u32> {
        std::fs::read_dir("/proc")
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
                    .filter(|pid| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim_end() == HANDOFF_COMM))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut left = lingering();
    while !left.is_empty() && began.elapsed() < limit {
        thread::sleep(Duration::from_millis(50));
        left = lingering();
    }
    if began.elapsed() >= Duration::from_millis(500) || !left.is_empty() {
        eprintln!(
            "plegwatch's exit hand-off: waited {:.2}s for it to close the probes; still there: {left:?}",
            began.elapsed().as_secs_f64()
        );
    }
}

/// The comm of plegwatch's exit hand-off child.
const HANDOFF_COMM: &str = "plegwatch-exit";

/// Whether process `pid` is `ancestor` or runs under it (its parent chain in `/proc`).
fn descends_from(mut pid: u32, ancestor: u32) -> bool {
    for _ in 0..16 {
        if pid == ancestor {
            return true;
        }
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let parent = status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok());
        match parent {
            Some(p) if p != 0 => pid = p,
            _ => return false,
        }
    }
    false
}

fn spawn_reader(name: &str, body: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    thread::Builder::new().name(name.into()).spawn(body).with_context(|| format!("spawn the {name} thread"))
}

fn read_stdout(stdout: ChildStdout, tx: Sender<Event>, not_json: Arc<Mutex<Vec<String>>>) {
    // Echoed from a thread of its own: a slow stderr (a TCG guest's serial console takes
    // seconds for a burst of long lines) must not stop this reader, nor, through a full
    // pipe, plegwatch.
    let (echo, lines) = std::sync::mpsc::channel::<String>();
    let _ = std::thread::Builder::new().name("echo".into()).spawn(move || {
        for line in lines {
            eprintln!("[plegwatch stdout] {line}");
        }
    });
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        let at = Instant::now();
        let _ = echo.send(line.clone());
        match serde_json::from_str::<Value>(&line) {
            Ok(json) if json.is_object() => {
                let _ = tx.send(Event { at, json });
            }
            _ => {
                if let Ok(mut v) = not_json.lock() {
                    v.push(line);
                }
            }
        }
    }
}

fn read_stderr(stderr: impl Read, keep: Arc<Mutex<String>>) {
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        eprintln!("[plegwatch stderr] {line}");
        if let Ok(mut s) = keep.lock() {
            s.push_str(&line);
            s.push('\n');
        }
    }
}

/// Whether `probe` may be off on this kernel, with `why` as the ready line's reason: only
/// `lock_contention` on kernels without the `lock:contention_begin` tracepoint (Linux <
/// 5.19, e.g. Debian 11's 5.10), and only when the reason says that tracepoint is missing.
pub fn off_by_design(probe: &str, why: &str) -> bool {
    let tracepoint_missing = |category: &str, name: &str| {
        !["/sys/kernel/tracing", "/sys/kernel/debug/tracing"]
            .iter()
            .any(|t| std::path::Path::new(t).join("events").join(category).join(name).is_dir())
    };
    probe == "lock_contention" && why.contains("no such tracepoint") && tracepoint_missing("lock", "contention_begin")
}
