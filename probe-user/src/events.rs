//! The output contract: the typed events the engine hands to its sinks, and
//! the [`Sink`] port they go through. Sinks format them;
//! nothing here writes anything.
//!
//! Types: `ready` (probes attached), `target` (a Go binary looked at),
//! `stall` (a wait crossed a level), `resolved` (a reported wait ended),
//! `incident` (a chain of waits raised, escalated or updated),
//! `incident_resolved`, `summary` (at exit), and for the daemon only
//! `status` (once a second, for the metrics). Later kinds add fields and
//! `kind` values; the fields here stay.

use crate::{
    graph::model::{Hop, WaitKey},
    levels::Level,
    syscalls::WaitKind,
};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A wait that crossed a level.
#[derive(Clone, Debug, Serialize)]
pub struct Stall {
    pub level: Level,
    pub id: u64,
    pub kind: WaitKind,
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    pub waited_s: f64,
    /// RFC 3339, UTC.
    pub started_at: String,
    pub budget_used: f64,
    /// The wait was already open when plegwatch started (found by its sweep of
    /// `/proc`); `waited_s` and `started_at` are then the best lower bound the
    /// kernel offers (the thread has not run since).
    pub started_before_attach: bool,
    pub detail: Value,
    /// What holds this wait: the next hop down its chain (another wait, or a
    /// process, device or the kernel); `None` when nothing is known to. Decided by
    /// the wait-for graph, as the incidents' hops are.
    pub holder: Option<Hop>,
    /// The root wait the chain leads to (e.g. a shim's umount), when that is
    /// another wait.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cause: Option<Hop>,
    /// This wait's hops, from itself down to its root, then the root's holder when
    /// that is not a wait (empty when nothing holds it). The first hop carries the
    /// link to the holder (`edge`, `evidence`, `exactness`).
    pub chain: Vec<Hop>,
    /// The wait's name in the wait-for graph, to find its links there.
    #[serde(skip)]
    pub wait: Option<WaitKey>,
    pub kernel_stack: Vec<String>,
    /// Outermost frame last, as `kernel_stack`; named on the way out (see `sources::decorate`).
    pub user_stack: Vec<String>,
    /// The user stack's id in the kernel's stack map, until it is named (-1: none).
    #[serde(skip)]
    pub user_stack_id: i32,
    /// The waiting process's pod and container (omitted for a host process).
    #[serde(flatten)]
    pub pod: crate::graph::model::PodRef,
}

/// A reported wait that ended.
#[derive(Clone, Debug, Serialize)]
pub struct Resolved {
    pub id: u64,
    pub kind: WaitKind,
    pub pid: u32,
    pub tid: u32,
    pub waited_s: f64,
    pub comm: String,
    /// `exact` from the kernel's end record; `approximate` when plegwatch saw the
    /// wait disappear without one (its end record was lost, or the thread vanished).
    pub timing: &'static str,
}

/// One attached probe, as chosen from the attach table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProbeChoice {
    pub probe: String,
    pub variant: String,
    /// Why better variants were passed over (for a probe that is off or on a
    /// fallback), the first reason in a few words; omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// For a probe that is off: what goes unseen; omitted otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loses: Option<String>,
    /// That loss breaks a seed chain: plegwatch runs degraded.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub seed_chain: bool,
}

/// The version of this contract, in the `ready` line. 2: a `stall` line's `holder`,
/// `cause` and `chain` are hops, as an incident's are (1: free-form objects).
pub const CONTRACT: u32 = 2;

/// Printed once every probe is attached.
#[derive(Clone, Debug, Serialize)]
pub struct Ready {
    /// [`CONTRACT`].
    pub contract: u32,
    pub pid: u32,
    pub probes: Vec<ProbeChoice>,
    pub warn_s: f64,
    pub critical_s: f64,
    pub imminent_s: f64,
}

impl Ready {
    /// The `ready` line of this contract ([`CONTRACT`]), for `pid` with these probes
    /// and levels (seconds).
    pub fn new(pid: u32, probes: Vec<ProbeChoice>, warn_s: f64, critical_s: f64, imminent_s: f64) -> Self {
        Ready { contract: CONTRACT, pid, probes, warn_s, critical_s, imminent_s }
    }
}

/// What the startup sweep found already waiting when plegwatch started (sent only when
/// it found a wait): those waits are tracked like the others, and each one that
/// crosses `--warn` gets its `stall` line.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    /// Threads already in a watched syscall or in umount2's task_work tail.
    pub kernel_waits: usize,
    /// Netlink sockets already open (tracked from then on).
    pub netlink_sockets: usize,
    /// Threads already blocked in a receive on a netlink request socket.
    pub netlink_waiters: usize,
    /// D-Bus connections already open (tracked from then on).
    pub dbus_connections: usize,
    /// D-Bus calls found queued unread in a callee's socket.
    pub dbus_calls: usize,
    /// containerd → shim ttrpc connections already open.
    pub ttrpc_connections: usize,
    /// Threads already blocked in `wait4`/`waitid` (a parent waiting on a child).
    pub child_waits: usize,
}

impl Sweep {
    /// Whether it found a wait (sockets and connections alone are not news).
    pub fn found_waits(&self) -> bool {
        self.kernel_waits + self.netlink_waiters + self.dbus_calls + self.child_waits > 0
    }
}

/// Latency of one watched syscall over the run (from the kernel histogram).
#[derive(Clone, Debug, Serialize)]
pub struct SyscallSummary {
    pub syscall: String,
    pub count: u64,
    /// Upper bounds of the buckets holding the 50th, 90th and 99.9th
    /// percentiles, in seconds (incident bundles' `latency.json`).
    pub p50_le_s: f64,
    pub p90_le_s: f64,
    /// Upper bound of the bucket holding the 99th percentile, in seconds.
    pub p99_le_s: f64,
    pub p999_le_s: f64,
    /// Upper bound of the highest non-empty bucket, in seconds.
    pub max_le_s: f64,
    /// Calls timed exactly: those that lasted at least `--warn`, from their
    /// end records (hdrhistogram over the measured durations).
    pub measured: u64,
    /// The measured 50th, 90th and 99th percentiles and maximum, in seconds,
    /// each when it falls among the measured calls (the slowest `measured`
    /// of `count`); otherwise only the bucket bound above is known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p90_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_s: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_s: Option<f64>,
}

/// Printed at exit.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Summary {
    pub ran_s: f64,
    pub stalls: u64,
    pub resolved: u64,
    pub still_open: u64,
    pub waits_started: u64,
    /// Waits the kernel could not record (in-flight map full).
    pub dropped_waits: u64,
    /// End records the kernel could not send (ring buffer full).
    pub dropped_events: u64,
    /// Every kernel drop counter at exit, by probe and reason (zeros
    /// included, so that a consumer can tell a counter that stayed at zero).
    pub dropped: Vec<DropCount>,
    pub syscalls: Vec<SyscallSummary>,
    /// The (process, kernel stack) pairs with the most D-state time, for the
    /// processes that matter.
    pub offcpu_top: Vec<Value>,
    /// Probed Go functions' call latencies (hdrhistogram), by target and function.
    pub go_latency: Vec<crate::latency::LatencyRow>,
    /// kubelet relist clocks, one per kubelet process seen.
    pub relists: Vec<Value>,
    /// containerd's CRI Status locks held longest (write holds, and the
    /// longest read wait on each).
    pub go_locks: Vec<Value>,
    /// Go function ids (attach cookies) in use at exit, and probed binaries
    /// given up because they were replaced on disk and no longer run.
    pub go_funcs_in_use: usize,
    pub go_binaries_retired: u64,
    /// Go calls dropped because their goroutine ended without returning
    /// through a probed RET (a panic unwound past them, or `runtime.Goexit`).
    pub go_calls_orphaned: u64,
    /// Incidents raised, and resolved, over the run.
    pub incidents: u64,
    pub incidents_resolved: u64,
    /// How late the scans ran after their tick, and how long they took.
    pub scans: ScanSummary,
    /// Netlink requests and D-Bus calls the socket probes saw go by.
    pub requests_seen: RequestsSeen,
}

/// Requests and calls the socket probes saw over the run, answered or not:
/// what shows, on a quiet run, that they were attached and parsing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RequestsSeen {
    /// Netlink requests sent that the kernel answers (a get, a dump, or an
    /// ack asked for): the ones tracked until their reply.
    pub netlink_requests: u64,
    /// Of those, the ones closed by their reply (or a dump's end).
    pub netlink_answered: u64,
    /// D-Bus METHOD_CALLs written on client connections, expecting a reply.
    pub dbus_calls: u64,
    /// Of those, the ones whose METHOD_RETURN or ERROR was read.
    pub dbus_answered: u64,
    /// ttrpc request frames written to containerd shims.
    pub ttrpc_requests: u64,
    /// Of those, the ones whose response frame was read back.
    pub ttrpc_answered: u64,
    /// ttrpc connections dropped because a frame header made no sense (the
    /// stream was joined out of step): their requests are no longer seen.
    pub ttrpc_lost_step: u64,
}

/// The scan loop's timing over the run (hdrhistogram, µs resolution).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ScanSummary {
    pub scans: u64,
    pub late_p50_ms: f64,
    pub late_p99_ms: f64,
    pub late_max_ms: f64,
    pub took_p50_ms: f64,
    pub took_p99_ms: f64,
    pub took_max_ms: f64,
    /// The longest turn the loop spent attaching a new Go binary's uprobes
    /// (its reading is done off the loop; the attach goes a 20 ms slice at a
    /// time, so one slow attach can make a turn longer).
    pub go_attach_max_ms: f64,
    /// Where the slowest scan's time went: its phases in the order they ran, those
    /// under 0.1 ms left out.
    pub slowest: Vec<PhaseTime>,
}

/// One phase of a scan and how long it took.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseTime {
    pub phase: &'static str,
    pub ms: f64,
}

/// A Go binary plegwatch looked at: probed, or left alone and why.
#[derive(Clone, Debug, Serialize)]
pub struct Target {
    /// `containerd`, `containerd-shim`, `kubelet`, `runc`.
    pub target: String,
    /// `probed` (uprobes attached to every expected function of this
    /// binary), `partial` (attached, but some expected functions were left
    /// out: see `left_out`), `traced` (a new process of a binary already
    /// probed), `unmatched` (none of the expected functions: left alone),
    /// `failed` (could not be read or attached).
    pub status: &'static str,
    /// The process that led to it (0 for a binary given by path).
    pub pid: u32,
    pub binary: String,
    /// What brought it up: `startup`, `exec`, `poll` or `flag`.
    pub found_by: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_version: Option<String>,
    /// The probed functions, with their RET counts.
    pub functions: Vec<String>,
    /// Expected functions not probed, each as `pkg.(*T).M (why)` (only
    /// with `partial`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
    /// Where `g` sits from fsbase (for goroutine ids at kernel probes).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub g_tls_offset: Option<i64>,
    /// How its probe points name their function: `cookie` (Linux ≥ 5.15) or
    /// `address` (before).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uprobes: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

impl Target {
    /// A line with nothing but who and what.
    pub fn new(target: &str, status: &'static str, pid: u32, binary: &std::path::Path, found_by: &'static str) -> Self {
        Target {
            target: target.to_string(),
            status,
            pid,
            binary: binary.display().to_string(),
            found_by,
            go_version: None,
            functions: Vec::new(),
            left_out: Vec::new(),
            g_tls_offset: None,
            uprobes: None,
            why: None,
        }
    }
}

/// The daemon's periodic snapshot (`plegwatch daemon` only, once a second):
/// what changes without an event, for the metrics. Counters are totals since
/// start.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Status {
    /// Every open incident, with its PLEG budget as of the last scan.
    pub incidents: Vec<crate::graph::incidents::OpenBudget>,
    /// kubelet relist clocks, as in the summary.
    pub relists: Vec<Value>,
    /// Records the kernel could not keep, by probe and reason.
    pub dropped: Vec<DropCount>,
    /// Watched syscalls' latency from the kernel's log2 histogram.
    pub syscalls: Vec<SyscallHistogram>,
    /// Probed Go calls' latency tables.
    pub go_latency: Vec<crate::latency::LatencyRow>,
    /// How late each scan since the last status started after its tick, in seconds.
    pub scan_late_s: Vec<f64>,
    /// plegwatch's own CPU time (user + system) and resident memory.
    pub cpu_s: f64,
    pub rss_bytes: u64,
}

/// A kernel drop counter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct DropCount {
    /// The probe whose records were lost (`wait_enter`, `socket_io`, ...).
    pub probe: &'static str,
    /// Why: `inflight_full`, `ringbuf_full`, ...
    pub reason: &'static str,
    pub count: u64,
}

/// One syscall's latency buckets (not cumulative): (upper bound in seconds, count).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SyscallHistogram {
    pub syscall: String,
    pub buckets: Vec<(f64, u64)>,
}

/// The goroutines of a probed Go process, read from outside once its probes were on
/// (`sources::gowatch::late`): the calls found open on them, begun before plegwatch
/// could see them start, become open waits marked `started_before_attach`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GoroutineScan {
    /// `containerd`, `containerd-shim`, `kubelet`.
    pub target: String,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub go_version: Option<String>,
    /// Goroutines read (dead ones left out).
    pub goroutines: usize,
    /// Probed calls found open on them and taken as open waits.
    pub open_calls: usize,
    /// Goroutines in a system call matched to their thread.
    pub in_syscall: usize,
    /// Goroutines whose read did not make sense twice (left out).
    pub inconsistent: usize,
    pub took_ms: f64,
    /// Why the goroutines could not be read (an unknown Go version, named): every
    /// other probe goes on.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Anything plegwatch prints on stdout.
#[derive(Clone, Debug, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    Ready(Ready),
    Sweep(Sweep),
    Target(Target),
    GoroutineScan(GoroutineScan),
    Stall(Box<Stall>),
    Resolved(Resolved),
    Summary(Summary),
    Incident(Box<crate::graph::incidents::Incident>),
    IncidentResolved(crate::graph::incidents::IncidentResolved),
    Status(Box<Status>),
}

/// Where events go.
pub trait Sink {
    fn emit(&mut self, event: &Event);
}
