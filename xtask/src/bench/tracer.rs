//! The two tracers the benchmark runs the loop under: plegwatch and a bpftrace script
//! doing the same enter/exit tracking. Each is a child process guard that waits until the
//! tracer is attached, and that is stopped with SIGINT (or killed on drop).

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};

use crate::cmd;

/// How long plegwatch may take to load and attach its programs.
const PLEGWATCH_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long bpftrace may take to compile and attach its script.
const BPFTRACE_ATTACH_TIMEOUT: Duration = Duration::from_secs(60);
/// bpftrace prints "Attaching N probes..." before it attaches; give it this long after.
const BPFTRACE_SETTLE: Duration = Duration::from_secs(1);
/// How long a tracer may take to exit after SIGINT before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(15);
/// How long plegwatch's exit hand-off may take to close its probes after plegwatch exited.
const HANDOFF_TIMEOUT: Duration = Duration::from_secs(60);

/// Per-tid enter/exit latency tracking over the loops' syscalls (`send` is `sendto` at the
/// syscall level), aggregated into one histogram: the work a naive tracer of these syscalls
/// does. plegwatch hooks the same syscalls but does work only for sockets it classified.
pub const BPFTRACE_SCRIPT: &str = r#"
tracepoint:syscalls:sys_enter_sendto,
tracepoint:syscalls:sys_enter_recvfrom,
tracepoint:syscalls:sys_enter_write,
tracepoint:syscalls:sys_enter_read,
tracepoint:syscalls:sys_enter_fsync
{
    @s[tid] = nsecs;
}

tracepoint:syscalls:sys_exit_sendto,
tracepoint:syscalls:sys_exit_recvfrom,
tracepoint:syscalls:sys_exit_write,
tracepoint:syscalls:sys_exit_read,
tracepoint:syscalls:sys_exit_fsync
/@s[tid]/
{
    @lat = hist(nsecs - @s[tid]);
    delete(@s[tid]);
}
"#;

/// The reference tracers after bpftrace's enter/exit tracking, each a bpftrace script of
/// empty programs (name, script): what any hook there costs, whatever it does.
/// - `floor-raw`: one program on `raw_syscalls:sys_enter`, on every syscall;
/// - `floor-unused`: one program on a syscall tracepoint the loops never call: attaching
///   any syscall tracepoint turns on the kernel's syscall tracing slow path for every task;
/// - `hook-free`: only `sched:sched_switch` and the `sock:sock_send_length` and
///   `sock:sock_recv_length` tracepoints, where a design without syscall hooks would see
///   sleeps and socket traffic.
pub const REFERENCES: &[(&str, &str)] = &[
    ("floor-raw", "tracepoint:raw_syscalls:sys_enter { }\n"),
    ("floor-unused", "tracepoint:syscalls:sys_enter_getpgid { }\n"),
    ("hook-free", "tracepoint:sched:sched_switch { }\ntracepoint:sock:sock_send_length { }\ntracepoint:sock:sock_recv_length { }\n"),
];

/// A bpftrace script of [`REFERENCES`] (`name`), attached and settled.
pub fn reference(log_dir: &Path, name: &'static str) -> Result<Tracer> {
    let script = REFERENCES.iter().find(|(n, _)| *n == name).map(|(_, s)| *s).ok_or_else(|| anyhow!("no reference tracer {name}"))?;
    let path = log_dir.join(format!("{name}.bt"));
    std::fs::write(&path, script).with_context(|| format!("cannot write {}", path.display()))?;
    let mut command = Command::new("bpftrace");
    command.arg(&path);
    let mut tracer = Tracer::spawn(name, command, log_dir)?;
    tracer.wait_for(BPFTRACE_ATTACH_TIMEOUT, "its \"Attaching\" line", |l| l.starts_with("Attaching"))?;
    thread::sleep(BPFTRACE_SETTLE);
    Ok(tracer)
}

/// A running tracer. Dropping it without [`Tracer::stop`] kills it.
pub struct Tracer {
    name: &'static str,
    line: String,
    child: Child,
    stderr_log: PathBuf,
    /// Its stdout, line by line.
    lines: Receiver<String>,
    /// The stdout lines received so far.
    seen: Vec<String>,
}

/// Start `plegwatch watch --json` and wait for its `{"type":"ready"}` line.
pub fn plegwatch(bin: &Path, log_dir: &Path) -> Result<Tracer> {
    let mut command = Command::new(bin);
    command.args(["watch", "--json"]);
    let mut tracer = Tracer::spawn("plegwatch", command, log_dir)?;
    tracer.wait_for(PLEGWATCH_READY_TIMEOUT, "a {\"type\":\"ready\"} line", is_ready_line)?;
    Ok(tracer)
}

/// Start `plegwatch watch --json` with every kernel-function variant passed over
/// (`PLEGWATCH_FALLBACK=all`: the tracepoint programs a kernel without fentry runs), and
/// wait for its ready line.
pub fn plegwatch_fallback(bin: &Path, log_dir: &Path) -> Result<Tracer> {
    let mut command = Command::new(bin);
    command.args(["watch", "--json"]).env("PLEGWATCH_FALLBACK", "all");
    let mut tracer = Tracer::spawn("plegwatch-fallback", command, log_dir)?;
    tracer.wait_for(PLEGWATCH_READY_TIMEOUT, "a {\"type\":\"ready\"} line", is_ready_line)?;
    Ok(tracer)
}

/// Start `plegwatch watch --json ARGS`, logging as `<log_dir>/<name>.*.log`, and wait for
/// its ready line.
pub fn plegwatch_with(bin: &Path, log_dir: &Path, name: &'static str, args: &[&str]) -> Result<Tracer> {
    let mut command = Command::new(bin);
    command.args(["watch", "--json"]).args(args);
    let mut tracer = Tracer::spawn(name, command, log_dir)?;
    tracer.wait_for(PLEGWATCH_READY_TIMEOUT, "a {\"type\":\"ready\"} line", is_ready_line)?;
    Ok(tracer)
}

/// Write the bpftrace script to `<log_dir>/overhead.bt` (so the command line fits on one
/// line and can be rerun by hand), start it and wait until it has attached.
pub fn bpftrace(log_dir: &Path) -> Result<Tracer> {
    let script = log_dir.join("overhead.bt");
    std::fs::write(&script, BPFTRACE_SCRIPT).with_context(|| format!("cannot write {}", script.display()))?;
    let mut command = Command::new("bpftrace");
    command.arg(&script);
    let mut tracer = Tracer::spawn("bpftrace", command, log_dir)?;
    tracer.wait_for(BPFTRACE_ATTACH_TIMEOUT, "its \"Attaching\" line", |l| l.starts_with("Attaching"))?;
    thread::sleep(BPFTRACE_SETTLE);
    Ok(tracer)
}

/// Whether a JSON line is plegwatch's ready event. Whitespace-insensitive, so both
/// `"type":"ready"` and `"type": "ready"` match.
pub fn is_ready_line(line: &str) -> bool {
    let compact: String = line.chars().filter(|c| !c.is_whitespace()).collect();
    compact.starts_with('{') && compact.contains(r#""type":"ready""#)
}

impl Tracer {
    /// Spawn with stderr to `<log_dir>/<name>.stderr.log`, and stdout copied line by line to
    /// `<log_dir>/<name>.stdout.log` and to the guard ([`tee_lines`]).
    fn spawn(name: &'static str, mut command: Command, log_dir: &Path) -> Result<Self> {
        let line = cmd::display(&command);
        let (stderr_log, stderr, stdout_file) = log_files(log_dir, name)?;
        let mut child =
            command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(stderr).spawn().with_context(|| format!("cannot start `{line}`"))?;
        let stdout = child.stdout.take().ok_or_else(|| anyhow!("`{line}`: no stdout pipe"))?;
        let lines = tee_lines(stdout, stdout_file);
        Ok(Tracer { name, line, child, stderr_log, lines, seen: Vec::new() })
    }

    /// The variants plegwatch's ready line names for the probes on the loops' hot path
    /// (`socket_io`, `umount_tail_end`), e.g. `socket_io: fentry+fexit __x64_sys_{…}`.
    pub fn hot_path(&mut self) -> String {
        let Ok(ready) = self.wait_for(Duration::ZERO, "ready", is_ready_line) else { return "no ready line".into() };
        let Ok(v) = serde_json::from_str::<serde_json::Value>(&ready) else { return "an unreadable ready line".into() };
        let probes = v["probes"].as_array().cloned().unwrap_or_default();
        ["socket_io", "umount_tail_end"]
            .iter()
            .map(|name| {
                let variant = probes.iter().find(|p| p["probe"] == *name).and_then(|p| p["variant"].as_str()).unwrap_or("?");
                format!("{name}: {variant}")
            })
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// Wait for a stdout line matching `wanted`, also among those already received (a line
    /// printed before the one waited for first), and return it. On timeout or early exit the
    /// error names the command line and the last line of its stderr; the guard then kills
    /// the child.
    pub fn wait_for(&mut self, timeout: Duration, what: &str, wanted: impl Fn(&str) -> bool) -> Result<String> {
        if let Some(l) = self.seen.iter().find(|l| wanted(l)) {
            return Ok(l.clone());
        }
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    let hit = wanted(&l);
                    self.seen.push(l);
                    if hit {
                        return Ok(self.seen[self.seen.len() - 1].clone());
                    }
                }
                Err(RecvTimeoutError::Timeout) => bail!(
                    "`{}` printed no {what} within {}s (stderr: {}; log: {})",
                    self.line,
                    timeout.as_secs(),
                    self.stderr_tail(),
                    self.stderr_log.display()
                ),
                Err(RecvTimeoutError::Disconnected) => bail!(
                    "`{}` closed stdout before {what} (stderr: {}; log: {})",
                    self.line,
                    self.stderr_tail(),
                    self.stderr_log.display()
                ),
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGINT, then wait for the exit (SIGKILL after [`STOP_TIMEOUT`]) and for plegwatch's
    /// exit hand-off to have closed its probes ([`wait_exit_handoff`]). An unclean exit is
    /// reported as a warning: the loop has already been measured.
    pub fn stop(mut self) {
        if let Err(e) = self.interrupt_and_wait() {
            eprintln!("bench: warning: {}: {e:#}", self.name);
        }
    }

    fn interrupt_and_wait(&mut self) -> Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).with_context(|| format!("pid {} out of range", self.child.id()))?;
        // SAFETY: kill(2) with a pid we spawned and still own (not yet reaped).
        if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
            bail!("kill -INT {pid}: {}", std::io::Error::last_os_error());
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().context("waitpid")? {
                wait_exit_handoff(Instant::now() + HANDOFF_TIMEOUT);
                return check_exit(status, &self.line, &self.stderr_tail());
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!("`{}` did not exit within {}s of SIGINT; killed it", self.line, STOP_TIMEOUT.as_secs());
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr_log).unwrap_or_default();
        cmd::last_line(&text).to_owned()
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            self.kill();
        }
    }
}

/// Copy a child's stdout line by line to `file` and to the returned channel, on a thread
/// that drains it until the child closes it, so the child never blocks on a full pipe (also
/// once nobody reads the channel any more).
/// `<log_dir>/<name>.stderr.log` (its path and file) and `<log_dir>/<name>.stdout.log`.
pub fn log_files(log_dir: &Path, name: &str) -> Result<(PathBuf, File, File)> {
    let stderr_log = log_dir.join(format!("{name}.stderr.log"));
    let stdout_log = log_dir.join(format!("{name}.stdout.log"));
    let stderr = File::create(&stderr_log).with_context(|| format!("cannot create {}", stderr_log.display()))?;
    let stdout = File::create(&stdout_log).with_context(|| format!("cannot create {}", stdout_log.display()))?;
    Ok((stderr_log, stderr, stdout))
}

pub fn tee_lines(stdout: impl Read + Send + 'static, mut file: File) -> Receiver<String> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            let _ = writeln!(file, "{l}");
            let _ = tx.send(l);
        }
    });
    rx
}

/// Exit code 0, or death by the SIGINT we sent, is a clean stop.
fn check_exit(status: ExitStatus, line: &str, stderr_tail: &str) -> Result<()> {
    use std::os::unix::process::ExitStatusExt;
    if status.success() || status.signal() == Some(libc::SIGINT) {
        return Ok(());
    }
    bail!("`{line}` exited with {status} after SIGINT (stderr: {stderr_tail})")
}

/// The comm of plegwatch's exit hand-off child (`probe-user/src/kernel/handoff.rs`).
const HANDOFF_COMM: &str = "plegwatch-exit";

/// plegwatch exits at once and leaves the last close of its probes to a child, which
/// unregisters them over the next seconds while they keep running: the next measurement
/// would run under them. Wait until no such child is left (or `deadline`, with a warning).
fn wait_exit_handoff(deadline: Instant) {
    let lingering = || -> Vec<u32> { cmd::processes().into_iter().filter(|(_, comm)| comm == HANDOFF_COMM).map(|(pid, _)| pid).collect() };
    let mut left = lingering();
    while !left.is_empty() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(50));
        left = lingering();
    }
    if !left.is_empty() {
        eprintln!("bench: warning: plegwatch's exit hand-off (pid {left:?}) is still closing its probes; measuring anyway");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_line_detection() {
        assert!(is_ready_line(r#"{"type":"ready","pid":12}"#));
        assert!(is_ready_line(r#"{ "ts": 1, "type" : "ready" }"#));
        assert!(!is_ready_line(r#"{"type":"stall"}"#));
        assert!(!is_ready_line("ready"));
    }
}
