//! What the netlink scenarios set up: a throwaway network namespace, the `nl_client` processes
//! (each a [`Proc`], killed by PID when dropped) that send a request and then block for a reply
//! that never comes, and a loop of ordinary `ip` requests.
//!
//! Everything that changes network state happens in a namespace made for the test
//! ([`NetNs`]), so nothing on the host is touched. Declare the namespace before the processes
//! that live in it: locals drop in reverse, so the processes are killed before it is deleted.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{anyhow, ensure, Context, Result};
use serde_json::Value;

use crate::child::Proc;
use crate::events::{dump, Event};
use crate::sys::run;

/// How long a client may take to send its request and say so.
pub const CLIENT_START_TIMEOUT: Duration = Duration::from_secs(5);

/// A network namespace made with `ip netns add`, deleted with `ip netns del` on drop.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Makes `plegwatch-test-TAG-PID` (PID: this test process, so concurrent or leftover runs
    /// do not collide). A leftover of the same name is deleted first.
    pub fn new(tag: &str) -> Result<Self> {
        let name = format!("plegwatch-test-{tag}-{}", std::process::id());
        if Path::new("/run/netns").join(&name).exists() {
            eprintln!("deleting a leftover netns {name}");
            run(Command::new("ip").args(["netns", "del", &name]))?;
        }
        run(Command::new("ip").args(["netns", "add", &name]))?;
        eprintln!("created netns {name}");
        Ok(Self { name })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// `ip -n NAME ARGS...`: iproute2 enters the namespace itself, in the same process.
    pub fn ip(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["-n", &self.name]).args(args);
        cmd
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        match run(Command::new("ip").args(["netns", "del", &self.name])) {
            Ok(_) => eprintln!("cleanup: deleted netns {}", self.name),
            Err(e) => eprintln!("cleanup: {e:#}"),
        }
    }
}

/// An `nl_client` process that sent its request (or bound its socket) and said so.
pub struct Client {
    pub proc: Proc,
    pub pid: u32,
    /// When the test read the client's `sent` line: just after the request went out.
    pub sent: Instant,
    pub sent_wall: SystemTime,
    /// The client's netlink socket.
    pub fd: u32,
}

impl Client {
    /// Runs `BIN ARGS...` (the `nl_client` binary) and waits for its `PID TID WORD fd=FD` line,
    /// checking that PID is the process spawned and equals TID (it is single-threaded).
    pub fn start(bin: &Path, name: &str, args: &[&str], word: &str) -> Result<Self> {
        let mut proc = Proc::spawn(name, Command::new(bin).args(args))?;
        let (sent, line) = proc.next_line(CLIENT_START_TIMEOUT)?;
        let sent_wall = SystemTime::now();
        let fields: Vec<&str> = line.split_whitespace().collect();
        let bad = || anyhow!("{name} (pid {}) printed {line:?}, not \"{} {} {word} fd=FD\"", proc.pid(), proc.pid(), proc.pid());
        let [pid, tid, said, fd] = fields[..] else {
            return Err(bad());
        };
        let pid: u32 = pid.parse().map_err(|_| bad())?;
        let fd: u32 = fd.strip_prefix("fd=").and_then(|f| f.parse().ok()).ok_or_else(bad)?;
        ensure!(said == word && pid == proc.pid() && tid == pid.to_string(), bad());
        Ok(Self { proc, pid, sent, sent_wall, fd })
    }

    /// `nl_client route-noreply` in `ns`: RTM_NEWLINK on lo with sequence number `seq` and
    /// NLM_F_REQUEST only, which the kernel applies and never answers.
    pub fn route_noreply(bin: &Path, ns: &NetNs, seq: u32) -> Result<Self> {
        Self::start(bin, "nl_client route-noreply", &["route-noreply", "--netns", ns.name(), "--seq", &seq.to_string()], "sent")
    }
}

/// What a [`IpTraffic`] loop did.
#[derive(Clone, Debug, Default)]
pub struct IpRounds {
    pub rounds: u32,
    pub commands: u32,
    pub slowest: Duration,
    /// The pid of every `ip` process run.
    pub pids: Vec<u32>,
}

/// A thread that runs ordinary `ip` requests in a namespace every `period` until stopped:
/// `ip addr show`, `ip route show`, `ip link set lo up`. Each is answered at once, so none may
/// be reported.
pub struct IpTraffic {
    stop: Arc<AtomicBool>,
    /// Rounds done so far.
    rounds: Arc<std::sync::atomic::AtomicU32>,
    thread: Option<JoinHandle<Result<IpRounds>>>,
}

impl IpTraffic {
    pub const COMMANDS: [&'static [&'static str]; 3] = [&["addr", "show"], &["route", "show"], &["link", "set", "lo", "up"]];

    pub fn start(netns: &str, period: Duration) -> Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let ns = netns.to_string();
        let thread = thread::Builder::new()
            .name("ip-traffic".into())
            .spawn({
                let stop = Arc::clone(&stop);
                let rounds = Arc::clone(&rounds);
                move || ip_loop(&ns, period, &stop, &rounds)
            })
            .context("spawn the ip-traffic thread")?;
        Ok(Self { stop, rounds, thread: Some(thread) })
    }

    /// Lets the loop go on until it has done `n` rounds, at most `timeout` (scaled: a slow
    /// machine or an emulated one runs fewer rounds in the same time); whether it did.
    pub fn wait_rounds(&self, n: u32, timeout: Duration) -> bool {
        let deadline = Instant::now() + crate::timing::scaled(timeout);
        while self.rounds.load(Ordering::Relaxed) < n {
            if Instant::now() >= deadline || self.thread.as_ref().is_none_or(|t| t.is_finished()) {
                return false;
            }
            thread::sleep(Duration::from_millis(50));
        }
        true
    }

    /// Stops the loop; an error if any command failed.
    pub fn stop(mut self) -> Result<IpRounds> {
        self.stop.store(true, Ordering::Relaxed);
        let thread = self.thread.take().context("ip-traffic already stopped")?;
        thread.join().map_err(|_| anyhow!("the ip-traffic thread panicked"))?
    }
}

impl Drop for IpTraffic {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn ip_loop(ns: &str, period: Duration, stop: &AtomicBool, rounds: &std::sync::atomic::AtomicU32) -> Result<IpRounds> {
    let mut done = IpRounds::default();
    while !stop.load(Ordering::Relaxed) {
        for args in IpTraffic::COMMANDS {
            let t = Instant::now();
            crate::sys::run_recorded(Command::new("ip").args(["-n", ns]).args(args), &mut done.pids)?;
            done.slowest = done.slowest.max(t.elapsed());
            done.commands += 1;
        }
        done.rounds += 1;
        rounds.store(done.rounds, Ordering::Relaxed);
        thread::sleep(period);
    }
    Ok(done)
}

/// The `stall` lines about processes named `comm`.
pub fn stalls_of_comm<'a>(events: &'a [Event], comm: &str) -> Vec<&'a Event> {
    events.iter().filter(|e| e.is("stall") && e.str("/comm") == Some(comm)).collect()
}

/// A failure message about the stall line `stall`: `what`, the line, then every line timed
/// from the request (`sent`).
pub fn bad_line(stall: &Event, events: &[Event], sent: Instant, what: &str) -> String {
    format!("{what} in {}\nall lines, timed from the request:\n{}", stall.json, dump(events, sent))
}

/// Asserts what every stall line about a `client` request must say, whenever it was sent:
/// `started_before_attach` as `before_attach`, kind `netlink_request`, level `warn`, the
/// client's pid as pid and tid (it is single-threaded), comm `nl_client`, and `protocol` and
/// the client's socket in `detail`. `bad` makes the failure messages ([`bad_line`]).
pub fn assert_client_stall(stall: &Event, client: &Client, protocol: &str, before_attach: bool, bad: &dyn Fn(&str) -> String) {
    let field = |p: &str| stall.get(p).cloned().unwrap_or(Value::Null);
    assert_eq!(
        field("/started_before_attach"),
        before_attach,
        "{}",
        bad(if before_attach { "not marked started_before_attach" } else { "a request sent after start is marked started_before_attach" })
    );
    assert_eq!(field("/kind"), "netlink_request", "{}", bad("wrong kind"));
    assert_eq!(field("/level"), "warn", "{}", bad("the first report is not level warn"));
    assert_eq!(field("/pid"), client.pid, "{}", bad("wrong pid"));
    assert_eq!(field("/tid"), client.pid, "{}", bad("wrong tid"));
    assert_eq!(field("/comm"), "nl_client", "{}", bad("wrong comm"));
    assert_eq!(field("/detail/protocol"), protocol, "{}", bad("wrong detail.protocol"));
    assert_eq!(field("/detail/fd"), client.fd, "{}", bad("wrong detail.fd"));
}

/// Asserts that `events` hold a `resolved` line closing `stall` (same id, kind, pid and tid)
/// after its waiter was killed at `killed`, with a `timing`, a line that came at most `late`
/// after the kill, and a `waited_s` within `late` of the real wait (`killed - started`; never
/// below it by more than 0.1 s, or 0.5 s for a wait found by the startup sweep, whose age is
/// a lower bound: the time since the thread last ran, which on a loaded machine can come a
/// little after its send). Prints the measured lateness; returns the line.
pub fn assert_resolved_after_kill(events: &[Event], stall: &Event, started: Instant, killed: Instant, late: Duration) -> Event {
    let all = || dump(events, started);
    let id = stall.u64("/id");
    let Some(resolved) = events.iter().find(|e| e.is("resolved") && e.u64("/id") == id).cloned() else {
        panic!(
            "no resolved line for stall id {id:?} ({}) after its waiter was killed {:.3}s in; \
             lines timed from the start of the wait:\n{}",
            stall.json,
            killed.duration_since(started).as_secs_f64(),
            all()
        );
    };
    for key in ["/kind", "/pid", "/tid"] {
        assert_eq!(resolved.get(key), stall.get(key), "resolved line {} does not match its stall line in {key}:\n{}", resolved.json, all());
    }
    let timing = resolved.str("/timing");
    assert!(matches!(timing, Some("exact" | "approximate")), "resolved timing {timing:?}:\n{}", all());
    let real = killed.duration_since(started).as_secs_f64();
    let total = resolved.f64("/waited_s").unwrap_or(f64::NAN);
    let after_kill = resolved.at.saturating_duration_since(killed).as_secs_f64();
    eprintln!(
        "resolved id {id:?} ({}): line {after_kill:.3}s after the kill; waited_s {total:.3} for a \
         real {real:.3}s ({:+.3}s)",
        timing.unwrap_or("?"),
        total - real
    );
    let late = late.as_secs_f64();
    assert!(
        after_kill <= late,
        "the resolved line came {after_kill:.3}s after the waiter was killed, more than \
         {late}s:\n{}",
        all()
    );
    let early = if stall.get("/started_before_attach").and_then(|v| v.as_bool()) == Some(true) { 0.5 } else { 0.1 };
    assert!(
        total >= real - early && total <= real + late,
        "resolved waited_s {total} not within [{real:.3} - {early}, {real:.3} + {late}] (the \
         waiter was killed {real:.3}s after it sent):\n{}",
        all()
    );
    resolved
}
