//! What the D-Bus scenarios set up: a private `dbus-daemon` in a temp dir, a service on it
//! frozen with SIGSTOP, a `dbus-monitor` that timestamps every message to and from that
//! service (the ground truth the reports are checked against), the clients that call it, and
//! the checks on what plegwatch reported about those calls.
//!
//! Nothing here touches the system or session bus of the machine: every client gets
//! `DBUS_SESSION_BUS_ADDRESS` pointing at the private bus through its own environment.
//! Declare [`PrivateBus`] before the processes that use it: locals drop in reverse, so they
//! are killed before the daemon, and the daemon before its temp dir is removed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, ensure, Context, Result};
use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::child::{Options, Proc, Stderr};
use crate::sys::run;

/// The well-known name the frozen service owns.
pub const SERVICE: &str = "com.example.Frozen";
/// The object path and method every caller asks for.
pub const OBJECT_PATH: &str = "/x";
pub const MEMBER: &str = "Hello";
/// What `gdbus call` asks first, to learn the method's signature. GLib gives up on it after
/// 3 s and then sends the real call anyway.
pub const INTROSPECTABLE: &str = "org.freedesktop.DBus.Introspectable";
pub const INTROSPECT: &str = "Introspect";
/// How long the daemon, the service or a monitor may take to come up.
pub const START_TIMEOUT: Duration = Duration::from_secs(10);
/// A call's `resolved` line may come this late after the reply (its timing is approximate
/// today: up to about 2.5 s).
pub const RESOLVE_LATE_S: f64 = 3.5;

/// How the D-Bus scenarios run their children: stderr echoed with the child's name (several
/// clients talk at once), and SIGCONT before the cleanup's SIGKILL (the service is frozen).
pub const CHILD: Options = Options { stderr: Stderr::Echo, continue_before_kill: true };

/// Spawns `cmd` as a [`Proc`] with the [`CHILD`] options.
pub fn spawn(name: &str, cmd: &mut Command) -> Result<Proc> {
    Proc::spawn_with(name, cmd, CHILD)
}

/// A private session-type `dbus-daemon` listening on `DIR/bus` in a temp dir of its own,
/// killed (and the dir removed) on drop.
pub struct PrivateBus {
    // Fields drop in order: the daemon goes before its directory.
    daemon: Proc,
    socket: PathBuf,
    address: String,
    _dir: tempfile::TempDir,
}

impl PrivateBus {
    /// Writes the config, starts `dbus-daemon --nofork --print-address` and waits until it
    /// prints its address (it listens by then).
    pub fn start() -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("plegwatch-dbus-").tempdir().context("make a temp dir for the bus")?;
        let socket = dir.path().join("bus");
        Self::launch(dir, Command::new("dbus-daemon"), &socket, &socket)
    }

    /// A bus whose daemon runs as `daemon` (`dbus-daemon`, e.g. behind `nsenter` in another
    /// mount namespace) and listens on `listen` as it sees that path; clients started here
    /// reach it at `reach` (the same socket, as this process sees it).
    pub fn start_listening(daemon: Command, listen: &Path, reach: &Path) -> Result<Self> {
        let dir = tempfile::Builder::new().prefix("plegwatch-dbus-").tempdir().context("make a temp dir for the bus config")?;
        Self::launch(dir, daemon, listen, reach)
    }

    fn launch(dir: tempfile::TempDir, mut daemon: Command, listen: &Path, reach: &Path) -> Result<Self> {
        let config = dir.path().join("bus.conf");
        std::fs::write(&config, bus_config(listen)).with_context(|| format!("write {}", config.display()))?;
        let mut daemon =
            spawn("dbus-daemon", daemon.arg(format!("--config-file={}", config.display())).args(["--nofork", "--print-address"]))?;
        let Some((_, printed)) = daemon.wait_line(START_TIMEOUT, |l| l.starts_with("unix:")) else {
            bail!("dbus-daemon (pid {}) printed no address within {START_TIMEOUT:?}", daemon.pid());
        };
        let listening = format!("unix:path={}", listen.display());
        ensure!(printed.starts_with(&listening), "dbus-daemon listens on {printed}, not {listening}");
        Ok(Self { daemon, socket: reach.to_path_buf(), address: format!("unix:path={}", reach.display()), _dir: dir })
    }

    pub fn daemon_pid(&self) -> u32 {
        self.daemon.pid()
    }

    /// The bus socket's path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `program` with `DBUS_SESSION_BUS_ADDRESS` set to this bus.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.env("DBUS_SESSION_BUS_ADDRESS", &self.address);
        cmd
    }

    /// Calls a method of the bus itself with `dbus-send --print-reply` and returns the reply.
    fn ask_bus(&self, method: &str, arg: &str) -> Result<String> {
        run(self.command("dbus-send").args([
            "--session",
            "--dest=org.freedesktop.DBus",
            "--print-reply",
            "--reply-timeout=5000",
            "/org/freedesktop/DBus",
            &format!("org.freedesktop.DBus.{method}"),
            &format!("string:{arg}"),
        ]))
    }

    pub fn name_has_owner(&self, name: &str) -> Result<bool> {
        let reply = self.ask_bus("NameHasOwner", name)?;
        Ok(reply.contains("boolean true"))
    }

    /// Polls `NameHasOwner` until `name` is owned.
    pub fn wait_owned(&self, name: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + crate::timing::scaled(timeout);
        while !self.name_has_owner(name)? {
            ensure!(Instant::now() < deadline, "{name} is not owned on the bus after {timeout:?}");
            thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The PID the bus knows for the connection `unique_name` (`:1.N`):
    /// `GetConnectionUnixProcessID`, from the credentials of its socket.
    pub fn pid_of(&self, unique_name: &str) -> Result<u32> {
        let reply = self.ask_bus("GetConnectionUnixProcessID", unique_name)?;
        reply
            .split_whitespace()
            .skip_while(|w| *w != "uint32")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| anyhow!("no uint32 in the reply to GetConnectionUnixProcessID: {reply}"))
    }
}

/// A config for a session-type bus on `socket` that allows everything (eavesdropping too,
/// for `dbus-monitor`).
fn bus_config(socket: &Path) -> String {
    format!(
        r#"<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-Bus Bus Configuration 1.0//EN" "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig><type>session</type><listen>unix:path={}</listen><auth>EXTERNAL</auth>
<policy context="default"><allow send_destination="*" eavesdrop="true"/><allow eavesdrop="true"/><allow own="*"/><allow user="*"/></policy></busconfig>
"#,
        socket.display()
    )
}

/// `dbus-test-tool echo --name=NAME` (it answers any method call with an empty reply), frozen
/// with SIGSTOP once it owns its name. Dropping it continues and kills it.
pub struct FrozenService {
    proc: Proc,
}

impl FrozenService {
    /// Starts the service, waits until it owns `name`, stops it and checks that the kernel
    /// says so (`T` in `/proc/PID/stat`).
    pub fn start(bus: &PrivateBus, name: &str) -> Result<Self> {
        let mut proc =
            spawn("dbus-test-tool echo", bus.command("dbus-test-tool").args(["echo", "--session"]).arg(format!("--name={name}")))?;
        bus.wait_owned(name, START_TIMEOUT)?;
        proc.signal(libc::SIGSTOP)?;
        let service = Self { proc };
        service.wait_stopped(START_TIMEOUT)?;
        eprintln!("froze {name} (pid {})", service.pid());
        Ok(service)
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Waits until `/proc/PID/stat` says `T` (stopped by a signal).
    pub fn wait_stopped(&self, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let state = proc_state(self.pid());
            if state == Some('T') {
                return Ok(());
            }
            ensure!(Instant::now() < deadline, "the service (pid {}) is in state {state:?}, not T, {timeout:?} after SIGSTOP", self.pid());
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGCONT; returns the moment just before it was sent.
    pub fn thaw(&mut self) -> Result<Instant> {
        let at = Instant::now();
        self.proc.signal(libc::SIGCONT)?;
        eprintln!("thawed the service (pid {})", self.pid());
        Ok(at)
    }
}

/// A `gdbus monitor` listening to the bus daemon's own signals: a client that blocks in poll
/// forever by design, so it must never be reported. Returns once it says it listens.
pub fn start_signal_listener(bus: &PrivateBus) -> Result<Proc> {
    let mut listener = spawn("gdbus monitor", bus.command("gdbus").args(["monitor", "--session", "--dest", "org.freedesktop.DBus"]))?;
    listener
        .wait_line(START_TIMEOUT, |l| l.starts_with("The name org.freedesktop.DBus is owned"))
        .context("the gdbus monitor listener never said it was listening")?;
    Ok(listener)
}

/// `dbus_caller.py`: see the script.
const CALLER: &str = include_str!("dbus_caller.py");

/// A client connected to the bus (authenticated, Hello said) whose call to [`MEMBER`] of
/// [`SERVICE`] waits for [`HeldCall::call`]: so that the bus daemon can be frozen
/// between the two, which no stock client allows.
pub struct HeldCall {
    proc: Proc,
    /// The unique name the bus gave it.
    pub sender: String,
    /// Its call's serial.
    pub serial: u32,
}

impl HeldCall {
    /// Starts the client (python3) and waits until it has said Hello.
    pub fn start(bus: &PrivateBus) -> Result<Self> {
        let script = bus._dir.path().join("dbus_caller.py");
        std::fs::write(&script, CALLER).with_context(|| format!("write {}", script.display()))?;
        let mut proc =
            spawn("dbus_caller.py", Command::new("python3").arg(&script).arg(bus.socket()).args([SERVICE, OBJECT_PATH, SERVICE, MEMBER]))?;
        let Some((_, line)) = proc.wait_line(START_TIMEOUT, |l| l.starts_with("ready ")) else {
            bail!("dbus_caller.py (pid {}) did not say Hello within {START_TIMEOUT:?}", proc.pid());
        };
        let mut words = line.split_whitespace().skip(1);
        let (Some(sender), Some(serial)) = (words.next(), words.next().and_then(|s| s.parse().ok())) else {
            bail!("dbus_caller.py printed {line:?}");
        };
        Ok(Self { sender: sender.to_string(), serial, proc })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Makes the call (SIGUSR1); returns the moment just before.
    pub fn call(&mut self) -> Result<Instant> {
        let at = Instant::now();
        self.proc.signal(libc::SIGUSR1)?;
        Ok(at)
    }

    /// Waits for the reply (`reply 2`: a method return).
    pub fn wait_reply(&mut self, timeout: Duration) -> Result<()> {
        let Some((_, line)) = self.proc.wait_line(timeout, |l| l.starts_with("reply ")) else {
            bail!("dbus_caller.py (pid {}) got no reply within {timeout:?}", self.pid());
        };
        ensure!(line == "reply 2", "dbus_caller.py's call was answered with {line:?}, not a method return");
        Ok(())
    }
}

/// `dbus-send` calling [`MEMBER`] of the frozen [`SERVICE`] (libdbus: one thread, blocks in
/// poll), waiting up to 120 s for the reply.
pub fn dbus_send_call(bus: &PrivateBus) -> Command {
    let mut cmd = bus.command("dbus-send");
    cmd.args([
        "--session",
        &format!("--dest={SERVICE}"),
        "--print-reply",
        "--reply-timeout=120000",
        OBJECT_PATH,
        &format!("{SERVICE}.{MEMBER}"),
    ]);
    cmd
}

/// `gdbus call` of the same method (GLib: waits on a worker thread, and asks
/// [`INTROSPECT`] first), with a 120 s timeout.
pub fn gdbus_call(bus: &PrivateBus) -> Command {
    let mut cmd = bus.command("gdbus");
    cmd.args([
        "call",
        "--session",
        "--dest",
        SERVICE,
        "--object-path",
        OBJECT_PATH,
        "--method",
        &format!("{SERVICE}.{MEMBER}"),
        "--timeout",
        "120",
    ]);
    cmd
}

/// The state letter of `/proc/PID/stat` (`R`, `S`, `D`, `T`, ...).
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The comm in parentheses may hold spaces and parentheses: the state follows the last ')'.
    let (_, rest) = stat.rsplit_once(')')?;
    rest.trim_start().chars().next()
}

/// The thread ids of process `pid` now.
pub fn tids(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    dir.flatten().filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok())).collect()
}

/// How far apart the scheduler's per-CPU task clocks are now: the spread, over the CPUs this
/// process may use, of CLOCK_MONOTONIC minus `se.exec_start` of a thread that just started
/// running there. Each CPU's `rq_clock_task` leaves out that CPU's own irq and steal time, so
/// they drift apart with uptime (about 0.11 s after an hour on this VM kind). plegwatch dates
/// waits that began before it started from `se.exec_start` read on different CPUs, so its
/// lower bounds can be off by this much. Measured on a thread of its own (the caller's CPU
/// affinity is untouched); `None` if `/proc/thread-self/sched` has no `se.exec_start`.
pub fn task_clock_skew() -> Option<Duration> {
    thread::spawn(|| {
        // SAFETY: a zeroed cpu_set_t is valid; sched_getaffinity fills it for this thread.
        let mut allowed: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: pid 0 is the calling thread; `allowed` has `size` bytes.
        if unsafe { libc::sched_getaffinity(0, size, &mut allowed) } != 0 {
            return None;
        }
        let mut lags = Vec::new();
        for cpu in 0..libc::CPU_SETSIZE as usize {
            // SAFETY: cpu < CPU_SETSIZE.
            if !unsafe { libc::CPU_ISSET(cpu, &allowed) } {
                continue;
            }
            // SAFETY: as above; a zeroed set with one CPU added.
            let mut one: libc::cpu_set_t = unsafe { std::mem::zeroed() };
            unsafe { libc::CPU_SET(cpu, &mut one) };
            // SAFETY: pid 0 is this (throwaway) thread.
            if unsafe { libc::sched_setaffinity(0, size, &one) } != 0 {
                continue;
            }
            // Sleep, so that the thread was just picked to run on `cpu` (which stamps
            // exec_start) when it reads its own sched file.
            thread::sleep(Duration::from_millis(5));
            let mono = monotonic_ms();
            let sched = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
            let exec_start: f64 =
                sched.lines().find(|l| l.trim_start().starts_with("se.exec_start"))?.split(':').nth(1)?.trim().parse().ok()?;
            lags.push(mono - exec_start);
        }
        let max = lags.iter().copied().fold(f64::MIN, f64::max);
        let min = lags.iter().copied().fold(f64::MAX, f64::min);
        (!lags.is_empty()).then(|| Duration::from_secs_f64((max - min).max(0.0) / 1e3))
    })
    .join()
    .ok()
    .flatten()
}

fn monotonic_ms() -> f64 {
    // SAFETY: a zeroed timespec is valid; clock_gettime fills it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as f64 * 1e3 + ts.tv_nsec as f64 / 1e6
}

/// A pair of clocks read together, to place wall-clock stamps (`dbus-monitor`'s, plegwatch's
/// `started_at`) on the test's monotonic timeline.
#[derive(Clone, Copy, Debug)]
pub struct Clocks {
    pub at: Instant,
    pub wall: f64,
}

impl Clocks {
    pub fn now() -> Self {
        let at = Instant::now();
        Self { at, wall: wall_secs(SystemTime::now()) }
    }

    /// The monotonic moment of wall-clock time `wall` (seconds since the epoch).
    pub fn instant(&self, wall: f64) -> Instant {
        let d = wall - self.wall;
        if d >= 0.0 {
            self.at + Duration::from_secs_f64(d)
        } else {
            self.at - Duration::from_secs_f64(-d)
        }
    }

    /// The wall-clock time of monotonic moment `at`.
    pub fn wall(&self, at: Instant) -> f64 {
        match at.checked_duration_since(self.at) {
            Some(d) => self.wall + d.as_secs_f64(),
            None => self.wall - self.at.duration_since(at).as_secs_f64(),
        }
    }
}

pub fn wall_secs(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// An RFC 3339 timestamp as seconds since the epoch.
pub fn rfc3339_secs(s: &str) -> Option<f64> {
    let t = OffsetDateTime::parse(s, &Rfc3339).ok()?;
    Some(t.unix_timestamp_nanos() as f64 / 1e9)
}

/// The kind of a message `dbus-monitor` printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MsgKind {
    Call,
    Return,
    Error,
    Signal,
}

/// One message as `dbus-monitor` printed it (its header line).
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub kind: MsgKind,
    /// `time=`: when the monitor got it, seconds since the epoch.
    pub time: f64,
    pub sender: Option<String>,
    pub destination: Option<String>,
    pub serial: Option<u32>,
    pub reply_serial: Option<u32>,
    pub path: Option<String>,
    pub interface: Option<String>,
    pub member: Option<String>,
}

impl Seen {
    /// Parses a header line such as `method call time=1795317887.668391 sender=:1.2 ->
    /// destination=com.example.Frozen serial=3 path=/x; interface=com.example.Frozen;
    /// member=Hello`. `None` for argument lines and anything else.
    pub fn parse(line: &str) -> Option<Self> {
        let (kind, rest) = [
            ("method call ", MsgKind::Call),
            ("method return ", MsgKind::Return),
            ("error ", MsgKind::Error),
            ("signal ", MsgKind::Signal),
        ]
        .into_iter()
        .find_map(|(prefix, kind)| line.strip_prefix(prefix).map(|r| (kind, r)))?;
        let mut seen = Self {
            kind,
            time: f64::NAN,
            sender: None,
            destination: None,
            serial: None,
            reply_serial: None,
            path: None,
            interface: None,
            member: None,
        };
        for word in rest.split_whitespace() {
            let Some((key, value)) = word.split_once('=') else {
                continue;
            };
            let value = value.trim_end_matches(';');
            let s = Some(value.to_string());
            match key {
                "time" => seen.time = value.parse().ok()?,
                "sender" => seen.sender = s,
                "destination" => seen.destination = s,
                "serial" => seen.serial = value.parse().ok(),
                "reply_serial" => seen.reply_serial = value.parse().ok(),
                "path" => seen.path = s,
                "interface" => seen.interface = s,
                "member" => seen.member = s,
                _ => {}
            }
        }
        seen.time.is_finite().then_some(seen)
    }
}

/// `dbus-monitor` watching every message to and from one name: when each call really went
/// out, from which connection and with which serial, and when its reply came.
pub struct BusMonitor {
    proc: Proc,
}

impl BusMonitor {
    /// Starts it and waits until it is a monitor (it prints the `NameAcquired` signal of its
    /// own connection first).
    pub fn start(bus: &PrivateBus, name: &str) -> Result<Self> {
        let mut proc = spawn(
            "dbus-monitor",
            bus.command("dbus-monitor").args(["--session".to_string(), format!("destination='{name}'"), format!("sender='{name}'")]),
        )?;
        ensure!(
            proc.wait_line(START_TIMEOUT, |l| l.starts_with("signal ")).is_some(),
            "dbus-monitor (pid {}) printed nothing within {START_TIMEOUT:?}",
            proc.pid()
        );
        Ok(Self { proc })
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Every message seen so far.
    pub fn messages(&mut self) -> Vec<Seen> {
        self.proc.lines().iter().filter_map(|(_, l)| Seen::parse(l)).collect()
    }

    /// The first message, already seen or arriving within `timeout`, that `pred` accepts.
    pub fn wait(&mut self, timeout: Duration, pred: impl Fn(&Seen) -> bool) -> Option<Seen> {
        self.proc.wait_line(timeout, |l| Seen::parse(l).is_some_and(|m| pred(&m))).and_then(|(_, l)| Seen::parse(&l))
    }

    /// The method call `serial` sent by connection `sender`.
    pub fn call(&mut self, sender: &str, serial: u32) -> Option<Seen> {
        self.messages().into_iter().find(|m| m.kind == MsgKind::Call && m.sender.as_deref() == Some(sender) && m.serial == Some(serial))
    }

    /// The reply (return or error) to call `serial` of connection `caller`, already seen or
    /// arriving within `timeout`.
    pub fn reply(&mut self, caller: &str, serial: u32, timeout: Duration) -> Option<Seen> {
        self.wait(timeout, |m| {
            matches!(m.kind, MsgKind::Return | MsgKind::Error) && m.destination.as_deref() == Some(caller) && m.reply_serial == Some(serial)
        })
    }
}

/// What a `dbus_call` stall line must say about a call the test made.
#[derive(Clone, Debug)]
pub struct ExpectedStall<'a> {
    pub caller_pid: u32,
    /// The caller's threads while the call was open: the reported tid must be one of them.
    pub caller_tids: &'a [u32],
    pub comm: &'a str,
    /// The call as `dbus-monitor` saw it go out (serial, sender, path, interface, member).
    pub call: &'a Seen,
    pub service_pid: u32,
    /// Words the link to the holder (the stall's first hop's evidence) must contain.
    pub holder_link: &'a str,
    pub before_attach: bool,
}

/// Asserts the fields of a `dbus_call` stall line (not its timing): level `warn`; the
/// caller's pid, one of its tids and its comm; `started_before_attach`; `detail` naming the
/// call the monitor saw (destination, path, interface, member, serial, sender); `holder`
/// naming the frozen service in state `T`; `budget_used` = `waited_s`/180; a kernel stack.
pub fn assert_dbus_stall(stall: &crate::Event, want: &ExpectedStall, all: &dyn Fn() -> String) {
    use serde_json::{json, Value};
    let bad = |what: &str| format!("{what} in {}\nall lines:\n{}", stall.json, all());
    let field = |p: &str| stall.get(p).cloned().unwrap_or(Value::Null);
    assert_eq!(field("/type"), "stall", "{}", bad("not a stall line"));
    assert_eq!(field("/kind"), "dbus_call", "{}", bad("wrong kind"));
    assert_eq!(field("/level"), "warn", "{}", bad("first report not level warn"));
    assert_eq!(field("/pid"), want.caller_pid, "{}", bad("wrong pid"));
    let tid = stall.u64("/tid").unwrap_or(0);
    assert!(
        want.caller_tids.iter().any(|t| u64::from(*t) == tid),
        "{}",
        bad(&format!("tid {tid} is none of the caller's threads {:?}", want.caller_tids))
    );
    assert_eq!(field("/comm"), want.comm, "{}", bad("wrong comm"));
    assert_eq!(field("/started_before_attach"), json!(want.before_attach), "{}", bad("wrong started_before_attach"));
    let call = want.call;
    let expected = [
        ("destination", json!(SERVICE)),
        ("path", json!(call.path)),
        ("interface", json!(call.interface)),
        ("member", json!(call.member)),
        ("serial", json!(call.serial)),
        ("sender", json!(call.sender)),
    ];
    for (key, value) in expected {
        assert_eq!(field(&format!("/detail/{key}")), value, "{}", bad(&format!("detail.{key} is not the monitor's")));
    }
    // The holder, from the wait-for graph: the stopped service, linked by who owns the
    // name (or whose socket the call sits unread in).
    for (key, value) in [("pid", json!(want.service_pid)), ("comm", json!("dbus-test-tool"))] {
        assert_eq!(field(&format!("/holder/{key}")), value, "{}", bad(&format!("holder.{key}")));
    }
    if field("/holder/kind") == json!("process") {
        assert!(field("/holder/what").as_str().is_some_and(|w| w.contains("state T")), "{}", bad("the holder is not stopped"));
    }
    assert_eq!(field("/chain/0/edge"), json!("dbus_owner"), "{}", bad("chain[0].edge"));
    assert_eq!(field("/chain/0/exactness"), json!("exact"), "{}", bad("chain[0].exactness"));
    let link = field("/chain/0/evidence");
    assert!(
        link.as_str().is_some_and(|e| e.contains(want.holder_link)),
        "{}",
        bad(&format!("the link does not say {:?}", want.holder_link))
    );
    let waited = stall.f64("/waited_s").unwrap_or(f64::NAN);
    let budget = stall.f64("/budget_used").unwrap_or(f64::NAN);
    assert!((budget - waited / crate::stall::PLEG_BUDGET_S).abs() < 0.005, "{}", bad("budget_used is not waited_s/180"));
    assert!(stall.get("/kernel_stack").and_then(Value::as_array).is_some_and(|s| !s.is_empty()), "{}", bad("no kernel_stack"));
}

/// The stall lines (every level) about process `pid`.
pub fn stalls_of(events: &[crate::Event], pid: u32) -> Vec<&crate::Event> {
    events.iter().filter(|e| e.is("stall") && e.u64("/pid") == Some(u64::from(pid))).collect()
}

/// The `resolved` line with the same id as `stall`, checked to name the same kind, pid and
/// tid and to carry a `timing`.
pub fn resolved_of(events: &[crate::Event], stall: &crate::Event, all: &dyn Fn() -> String) -> crate::Event {
    let id = stall.u64("/id");
    let Some(resolved) = events.iter().find(|e| e.is("resolved") && e.u64("/id") == id).cloned() else {
        panic!("no resolved line for stall id {id:?} {}:\n{}", stall.json, all());
    };
    for key in ["/kind", "/pid", "/tid"] {
        assert_eq!(resolved.get(key), stall.get(key), "resolved {} differs from its stall in {key}:\n{}", resolved.json, all());
    }
    assert!(matches!(resolved.str("/timing"), Some("exact" | "approximate")), "resolved {} has no timing:\n{}", resolved.json, all());
    resolved
}

/// The ids (sorted, each once) of the stall lines about process `pid`.
pub fn stall_ids(events: &[crate::Event], pid: u32) -> Vec<u64> {
    let mut ids: Vec<u64> = stalls_of(events, pid).iter().filter_map(|e| e.u64("/id")).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Asserts that none of the processes a D-Bus scenario runs besides its callers was reported:
/// the signal listener, the monitor, the frozen service and the bus daemon.
pub fn assert_bystanders_quiet(
    events: &[crate::Event],
    listener: &Proc,
    monitor: &BusMonitor,
    service: &FrozenService,
    bus: &PrivateBus,
    all: &dyn Fn() -> String,
) {
    for (who, pid) in [
        ("the gdbus monitor listener", listener.pid()),
        ("dbus-monitor", monitor.pid()),
        ("the frozen service", service.pid()),
        ("dbus-daemon", bus.daemon_pid()),
    ] {
        let stalls = stalls_of(events, pid);
        assert!(stalls.is_empty(), "{who} (pid {pid}) was reported: {stalls:#?}\n{}", all());
    }
}

/// A call's real wait and what its `resolved` line says of it.
#[derive(Clone, Copy, Debug)]
pub struct ResolvedCall {
    /// From the monitor's stamp of the call to its stamp of the reply, in seconds.
    pub real: f64,
    /// The `resolved` line's `waited_s`.
    pub total: f64,
}

/// Checks the end of a call the service answered once thawed: the reply `dbus-monitor` saw to
/// call `call.serial` of connection `sender` (waited for up to 5 s), and the `resolved` line of
/// `stall` ([`resolved_of`]), which must come at most [`RESOLVE_LATE_S`] after that reply.
/// Prints how the two compare. The bounds on `waited_s` differ by scenario: the caller checks
/// them on what this returns.
pub fn assert_resolved_after_reply(
    monitor: &mut BusMonitor,
    events: &[crate::Event],
    stall: &crate::Event,
    call: &Seen,
    sender: &str,
    clocks: &Clocks,
    all: &dyn Fn() -> String,
) -> ResolvedCall {
    let serial = call.serial.unwrap_or(0);
    let reply = monitor.reply(sender, serial, Duration::from_secs(5)).unwrap_or_else(|| panic!("dbus-monitor saw no reply to {call:?}"));
    let resolved = resolved_of(events, stall, all);
    let real = reply.time - call.time;
    let total = resolved.f64("/waited_s").unwrap_or(f64::NAN);
    let late = resolved.at.saturating_duration_since(clocks.instant(reply.time)).as_secs_f64();
    eprintln!(
        "  resolved ({}): line {late:.3}s after the reply; waited_s {total:.3} for a real \
         {real:.3}s ({:+.3}s)",
        resolved.str("/timing").unwrap_or("?"),
        total - real
    );
    assert!(late <= RESOLVE_LATE_S, "the resolved line {} came {late:.3}s after the reply:\n{}", resolved.json, all());
    ResolvedCall { real, total }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_monitor_lines() {
        let call = Seen::parse(
            "method call time=1795317887.668391 sender=:1.2 -> destination=com.example.Frozen \
             serial=3 path=/x; interface=com.example.Frozen; member=Hello",
        )
        .unwrap();
        assert_eq!(call.kind, MsgKind::Call);
        assert!((call.time - 1795317887.668391).abs() < 1e-6);
        assert_eq!(call.sender.as_deref(), Some(":1.2"));
        assert_eq!(call.destination.as_deref(), Some("com.example.Frozen"));
        assert_eq!(call.serial, Some(3));
        assert_eq!(call.path.as_deref(), Some("/x"));
        assert_eq!(call.interface.as_deref(), Some("com.example.Frozen"));
        assert_eq!(call.member.as_deref(), Some("Hello"));
        let ret = Seen::parse(
            "method return time=1795317954.829357 sender=:1.2 -> destination=:1.3 serial=3 \
             reply_serial=2",
        )
        .unwrap();
        assert_eq!(ret.kind, MsgKind::Return);
        assert_eq!(ret.reply_serial, Some(2));
        assert_eq!(Seen::parse("   string \":1.0\""), None);
    }

    #[test]
    fn clocks_round_trip() {
        let c = Clocks::now();
        let later = c.at + Duration::from_millis(1500);
        assert!((c.wall(later) - c.wall - 1.5).abs() < 1e-6);
        let back = c.instant(c.wall(later));
        let off = back.checked_duration_since(later).unwrap_or_else(|| later.duration_since(back));
        assert!(off < Duration::from_micros(10), "{off:?}");
        let earlier = c.instant(c.wall - 2.0);
        assert!((c.at.duration_since(earlier).as_secs_f64() - 2.0).abs() < 1e-6);
    }

    #[test]
    fn task_clock_skew_is_measured() {
        let skew = task_clock_skew().expect("se.exec_start in /proc/thread-self/sched");
        eprintln!("per-CPU task clock skew: {skew:?}");
        assert!(skew < Duration::from_secs(3600), "{skew:?}");
    }

    #[test]
    fn state_of_this_thread_is_running() {
        assert_eq!(proc_state(crate::gettid()), Some('R'));
    }
}
