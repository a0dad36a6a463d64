//! `soak_bench`: the node under `cargo xtask bench --soak-minutes M`, the daemon soak of
//! issue 19.
//!
//! plegwatch runs for weeks on canary nodes as `plegwatch daemon`. A slow leak of memory or
//! file descriptors, or a scan loop that falls behind, shows only over hours of ordinary
//! container churn with an incident now and then, so the soak gives the daemon that node
//! for as long as it is told:
//!
//! - a private containerd (Debian's 1.6.20, through the test bed's [`Containerd`], in a temp
//!   dir) with the busybox images imported, and one host-network pod;
//! - its "kubelet": the test bed's [`RelistDriver`], `ListPodSandbox` then `ListContainers`
//!   every second, as kubelet's PLEG relist. No kubelet binary can be had here, so there is
//!   no kubelet process, only its relist traffic over CRI;
//! - container churn: every `--churn-ms` (default 3000) a busybox `sleep` container is
//!   created and started in the pod, and once more than 4 run, the oldest is stopped
//!   (SIGKILL at once: `sleep` as PID 1 ignores SIGTERM) and removed;
//! - an incident every `--incident-every-s` (default 60): `nl_client route-noreply` (its path
//!   given by `--nl-client`), in a network namespace made once at start, sends an
//!   RTM_NEWLINK that the kernel applies and never answers, and blocks for the reply. It is
//!   killed after `--stall-s` (default 5): under `--warn 2s` the daemon raises it at 2 s and
//!   resolves it when the client dies, writing a report bundle. The first comes one period
//!   in; none is staged that could not run its full stall before the end.
//!
//! Protocol: JSON lines on stdout, commands on stdin.
//! - Once set up: `{"type":"ready","containerd_pid","socket","pod","netns"}`. The relist
//!   driver runs from here on.
//! - `start` on stdin begins the soak (so that the caller can start the daemon on this
//!   containerd, and wait until it is ready, first). It runs `--seconds S` (default 3600),
//!   printing each minute `{"type":"tick","minute":N,"containers_started",
//!   "containers_removed","incidents_staged","relists","relist_errors"}`, then
//!   `{"type":"done","completed":true,"seconds",...}` with the same counts and
//!   `ListContainers`' p99 and max in ms, and tears everything down: the churned containers,
//!   the relist driver, the pod, containerd, the network namespace. Counts start at `start`.
//! - `quit`, the end of stdin, SIGINT or SIGTERM stop it early: the same teardown, after a
//!   done line with `"completed":false` once the soak has started.
//!
//! Churn or staging that fails is an error: one line on stderr, exit status 1, after the
//! same teardown. Logs go to stderr. Needs root, like the rest of the test bed.
//! `cargo xtask bench` builds it and `nl_client` with `--release` and drives both.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use plegwatch_scenarios::containerd::cri::{self, ListCall, TimedCall};
use plegwatch_scenarios::containerd::{self, image, Containerd, Cri, Placement, Pod, RelistDriver};
use plegwatch_scenarios::netlink::{Client, NetNs};

/// Set by SIGINT, SIGTERM and the end of stdin.
static STOP: AtomicBool = AtomicBool::new(false);

/// Churned containers left running; one more is the cue to remove the oldest.
const MAX_RUNNING: usize = 4;
/// How often the soak loop looks at its clocks.
const STEP: Duration = Duration::from_millis(100);
/// A tick line every this often.
const TICK: Duration = Duration::from_secs(60);
/// The first incident's netlink sequence number (then one more each).
const FIRST_SEQ: u32 = 1000;

struct Opts {
    seconds: u64,
    churn: Duration,
    incident_every: Duration,
    stall: Duration,
    nl_client: PathBuf,
}

const USAGE: &str = "usage: soak_bench --nl-client PATH [--seconds S] [--churn-ms MS] [--incident-every-s S] [--stall-s S] \
                     (then `start` on stdin)";

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("soak_bench: error: {}", format!("{e:#}").replace('\n', " | "));
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<()> {
    let opts = parse_args()?;
    require_test_bed()?;
    catch_signals()?;
    let commands = read_stdin()?;

    // Guards in set-up order: they drop in reverse (the churned containers, the relist
    // driver, the pod through CRI, containerd, the netns), also on an error.
    let netns = NetNs::new("soak")?;
    let daemon = Containerd::start(Placement::TempDir)?;
    image::import_test_images(&daemon)?;
    let cri = daemon.cri()?;
    let config = cri::host_network_pod("soak-bench", daemon.cgroup_parent(), &daemon.pod_log_dir())?;
    let pod = Pod::run(&cri, config)?;
    let relists = RelistDriver::start(&cri, RelistDriver::KUBELET_PERIOD);
    let mut churn = Churn { cri: &cri, pod: &pod, running: VecDeque::new(), made: 0, started: 0, removed: 0 };
    emit(&json!({
        "type": "ready",
        "containerd_pid": daemon.pid(),
        "socket": daemon.socket(),
        "pod": pod.id(),
        "netns": netns.name(),
    }))?;

    if wait_for_start(&commands)? {
        let done = soak(&opts, &netns, &mut churn, &relists, &commands);
        // Whatever went wrong in the soak, what it did so far is said first.
        emit(&done.summary)?;
        if let Some(e) = done.error {
            return Err(e);
        }
    }
    eprintln!("soak_bench: tearing down");
    drop(churn);
    drop(relists);
    drop(pod);
    drop(daemon);
    drop(netns);
    Ok(())
}

/// `--nl-client PATH [--seconds S] [--churn-ms MS] [--incident-every-s S] [--stall-s S]`.
fn parse_args() -> Result<Opts> {
    let mut seconds = 3600u64;
    let mut churn_ms = 3000u64;
    let mut incident_every_s = 60u64;
    let mut stall_s = 5u64;
    let mut nl_client = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().with_context(|| format!("{flag} needs a value; {USAGE}"))?;
        let number = |range: std::ops::RangeInclusive<u64>| {
            value
                .parse::<u64>()
                .ok()
                .filter(|n| range.contains(n))
                .with_context(|| format!("{flag} takes a number from {} to {}, not {value:?}", range.start(), range.end()))
        };
        match flag.as_str() {
            "--seconds" => seconds = number(1..=86_400)?,
            "--churn-ms" => churn_ms = number(100..=600_000)?,
            "--incident-every-s" => incident_every_s = number(1..=86_400)?,
            "--stall-s" => stall_s = number(1..=3600)?,
            "--nl-client" => nl_client = Some(PathBuf::from(&value)),
            _ => bail!("unknown option {flag:?}; {USAGE}"),
        }
    }
    let nl_client = nl_client.with_context(|| format!("--nl-client is required; {USAGE}"))?;
    if !nl_client.is_file() {
        bail!("--nl-client {}: no such file (cargo build -p plegwatch-scenarios --bin nl_client)", nl_client.display());
    }
    if stall_s >= incident_every_s {
        bail!("--stall-s {stall_s} must be less than --incident-every-s {incident_every_s}: one incident at a time");
    }
    Ok(Opts {
        seconds,
        churn: Duration::from_millis(churn_ms),
        incident_every: Duration::from_secs(incident_every_s),
        stall: Duration::from_secs(stall_s),
        nl_client,
    })
}

/// [`containerd::require`] (root, containerd, runc, busybox), whose failures are panics
/// (it serves the tests), as an error.
fn require_test_bed() -> Result<()> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let checked = std::panic::catch_unwind(containerd::require);
    std::panic::set_hook(hook);
    checked.map_err(|payload| {
        let why = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "the containerd test bed's check failed".to_owned());
        anyhow!(why)
    })
}

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// SIGINT and SIGTERM set [`STOP`]: the soak loop then ends and the guards tear down.
fn catch_signals() -> Result<()> {
    for (sig, name) in [(libc::SIGINT, "SIGINT"), (libc::SIGTERM, "SIGTERM")] {
        let handler = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        if unsafe { libc::signal(sig, handler) } == libc::SIG_ERR {
            bail!("cannot catch {name}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Stdin's lines, read by a thread; the end of stdin sets [`STOP`].
fn read_stdin() -> Result<Receiver<String>> {
    let (tx, rx) = mpsc::channel();
    thread::Builder::new()
        .name("stdin".into())
        .spawn(move || {
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    return;
                }
            }
            eprintln!("soak_bench: end of stdin: stopping");
            STOP.store(true, Ordering::SeqCst);
        })
        .context("spawn the stdin reader")?;
    Ok(rx)
}

/// Waits for `start` (true) or `quit`, the end of stdin or a signal (false).
fn wait_for_start(commands: &Receiver<String>) -> Result<bool> {
    loop {
        if STOP.load(Ordering::SeqCst) {
            return Ok(false);
        }
        match commands.recv_timeout(STEP) {
            Ok(line) => match line.trim() {
                "start" => return Ok(true),
                "quit" => return Ok(false),
                "" => {}
                other => bail!("unknown command {other:?} (start | quit)"),
            },
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return Ok(false),
        }
    }
}

fn emit(value: &Value) -> Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{value}").context("write to stdout")?;
    out.flush().context("flush stdout")
}

/// The containers churned through the pod, oldest first. Dropping it stops and removes
/// those still there.
struct Churn<'a> {
    cri: &'a Cri,
    pod: &'a Pod,
    /// (name, id) of each container made and not yet removed.
    running: VecDeque<(String, String)>,
    made: u64,
    started: u64,
    removed: u64,
}

impl Churn<'_> {
    /// Creates and starts one `sleep` container; stops and removes the oldest while more than
    /// [`MAX_RUNNING`] run.
    fn step(&mut self) -> Result<()> {
        let name = format!("churn-{}", self.made);
        self.made += 1;
        let config = cri::container(&name, image::BUSYBOX, &["/bin/sleep", "2147483647"]);
        let id = self.pod.create_container(&config).with_context(|| format!("create container {name}"))?;
        // Kept before it starts, so that one that fails to start is still removed.
        self.running.push_back((name.clone(), id.clone()));
        self.cri.start_container(&id).with_context(|| format!("start container {name} ({id})"))?;
        self.started += 1;
        while self.running.len() > MAX_RUNNING {
            let Some((name, id)) = self.running.pop_front() else { break };
            self.remove(&name, &id)?;
            self.removed += 1;
        }
        Ok(())
    }

    fn remove(&self, name: &str, id: &str) -> Result<()> {
        self.cri
            .stop_container(id, Duration::ZERO)
            .and_then(|()| self.cri.remove_container(id))
            .with_context(|| format!("stop and remove container {name} ({id})"))
    }
}

impl Drop for Churn<'_> {
    fn drop(&mut self) {
        while let Some((name, id)) = self.running.pop_front() {
            match self.remove(&name, &id) {
                Ok(()) => self.removed += 1,
                Err(e) => eprintln!("cleanup: {e:#}"),
            }
        }
    }
}

/// The counts of a tick or done line.
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    containers_started: u64,
    containers_removed: u64,
    incidents_staged: u64,
    relists: u64,
    relist_errors: u64,
}

impl Counts {
    fn of(churn: &Churn, incidents_staged: u64, calls: &[TimedCall], since: Instant) -> Self {
        let since_start = || calls.iter().filter(|c| c.started >= since);
        Counts {
            containers_started: churn.started,
            containers_removed: churn.removed,
            incidents_staged,
            // One ListContainers per relist.
            relists: since_start().filter(|c| c.call == ListCall::Containers).count() as u64,
            relist_errors: since_start().filter(|c| c.error.is_some()).count() as u64,
        }
    }

    fn line(self, kind: &str) -> Value {
        json!({
            "type": kind,
            "containers_started": self.containers_started,
            "containers_removed": self.containers_removed,
            "incidents_staged": self.incidents_staged,
            "relists": self.relists,
            "relist_errors": self.relist_errors,
        })
    }
}

/// How a soak ended: its done line, and the error that ended it, if one did.
struct Done {
    summary: Value,
    error: Option<anyhow::Error>,
}

/// The soak itself, until `--seconds` pass, `quit`, a signal or the end of stdin.
fn soak(opts: &Opts, netns: &NetNs, churn: &mut Churn, relists: &RelistDriver, commands: &Receiver<String>) -> Done {
    let started = Instant::now();
    let mut staged = 0u64;
    let mut minute = 0u64;
    let result = soak_loop(opts, netns, churn, relists, commands, started, &mut staged, &mut minute);
    let calls = relists.calls();
    let mut summary = Counts::of(churn, staged, &calls, started).line("done");
    let (p99_ms, max_ms) = list_containers_ms(&calls, started);
    summary["completed"] = json!(matches!(result, Ok(true)));
    summary["seconds"] = json!((started.elapsed().as_secs_f64() * 10.0).round() / 10.0);
    summary["minutes"] = json!(minute);
    summary["list_containers_p99_ms"] = json!(p99_ms);
    summary["list_containers_max_ms"] = json!(max_ms);
    Done { summary, error: result.err() }
}

/// The loop of [`soak`]: whether it ran its full length.
#[allow(clippy::too_many_arguments)]
fn soak_loop(
    opts: &Opts,
    netns: &NetNs,
    churn: &mut Churn,
    relists: &RelistDriver,
    commands: &Receiver<String>,
    started: Instant,
    staged: &mut u64,
    minute: &mut u64,
) -> Result<bool> {
    let end = started + Duration::from_secs(opts.seconds);
    let mut next_churn = started;
    let mut next_incident = started + opts.incident_every;
    let mut next_tick = started + TICK;
    // The client blocked in its request, and when to kill it.
    let mut stalled: Option<(Client, Instant)> = None;
    eprintln!(
        "soak_bench: soak of {} s: a container every {} ms, an incident every {} s held {} s",
        opts.seconds,
        opts.churn.as_millis(),
        opts.incident_every.as_secs(),
        opts.stall.as_secs()
    );
    loop {
        match commands.try_recv() {
            Ok(line) if line.trim() == "quit" => return Ok(false),
            Ok(line) => eprintln!("soak_bench: ignored {line:?} during the soak (quit to stop)"),
            Err(TryRecvError::Empty | TryRecvError::Disconnected) => {}
        }
        if STOP.load(Ordering::SeqCst) {
            return Ok(false);
        }
        let now = Instant::now();
        if now >= end {
            return Ok(true);
        }
        if now >= next_churn {
            churn.step()?;
            // Paced from the schedule, but a slow step is not made up for with a burst.
            next_churn = (next_churn + opts.churn).max(Instant::now());
        }
        if stalled.is_none() && now >= next_incident {
            next_incident += opts.incident_every;
            if now + opts.stall < end {
                let seq = FIRST_SEQ.wrapping_add(*staged as u32);
                let client = Client::route_noreply(&opts.nl_client, netns, seq).context("stage an incident: nl_client route-noreply")?;
                eprintln!("soak_bench: incident {}: nl_client (pid {}) blocked in its request", *staged + 1, client.pid);
                stalled = Some((client, Instant::now() + opts.stall));
            }
        }
        if let Some((client, kill_at)) = stalled.as_mut() {
            if Instant::now() >= *kill_at {
                let held = client.sent.elapsed();
                client.proc.kill().with_context(|| format!("end the staged incident: nl_client (pid {})", client.pid))?;
                *staged += 1;
                eprintln!("soak_bench: incident {}: killed nl_client (pid {}) after {:.1} s", *staged, client.pid, held.as_secs_f64());
                stalled = None;
            }
        }
        if Instant::now() >= next_tick {
            *minute += 1;
            next_tick += TICK;
            let mut tick = Counts::of(churn, *staged, &relists.calls(), started).line("tick");
            tick["minute"] = json!(*minute);
            emit(&tick)?;
        }
        thread::sleep(STEP);
    }
}

/// `ListContainers`' p99 (nearest rank) and max, in ms, over the successful calls since
/// `since`; 0 for none.
fn list_containers_ms(calls: &[TimedCall], since: Instant) -> (f64, f64) {
    let mut ms: Vec<f64> = calls
        .iter()
        .filter(|c| c.call == ListCall::Containers && c.started >= since && c.error.is_none())
        .map(|c| c.latency.as_secs_f64() * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    let Some(&max) = ms.last() else {
        return (0.0, 0.0);
    };
    let rank = ((0.99 * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1;
    let round = |v: f64| (v * 100.0).round() / 100.0;
    (round(ms[rank]), round(max))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(call: ListCall, ms: u64, error: bool, started: Instant) -> TimedCall {
        TimedCall { call, relist: 0, started, latency: Duration::from_millis(ms), error: error.then(|| "boom".to_owned()) }
    }

    #[test]
    fn list_containers_p99_and_max_since_the_start() {
        let before = Instant::now();
        let since = before + Duration::from_millis(1);
        let after = since + Duration::from_millis(1);
        let mut calls: Vec<TimedCall> = (1..=100).map(|ms| call(ListCall::Containers, ms, false, after)).collect();
        calls.push(call(ListCall::Containers, 5000, false, before));
        calls.push(call(ListCall::Containers, 7000, true, after));
        calls.push(call(ListCall::PodSandbox, 9000, false, after));
        assert_eq!(list_containers_ms(&calls, since), (99.0, 100.0));
        assert_eq!(list_containers_ms(&[], since), (0.0, 0.0));
    }
}
