//! The wait-for graph's vocabulary: open waits (nodes), what holds them
//! (edges), and the hops an incident's chain is printed as.
//!
//! Sources (kernel waits, netlink and D-Bus requests, Go calls) describe
//! each wait still open as an [`OpenWait`]; resolvers add [`Edge`]s from a
//! waiter to its holder. Nothing here reads `/proc` or the kernel: the
//! incident builder works on these values alone, with time passed in.

use crate::syscalls::WaitKind;
use serde::{Deserialize, Serialize};

/// Names one open wait for as long as it stays open, whichever source saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WaitKey {
    /// A syscall wait in the kernel's `INFLIGHT` map: (thread, start ns).
    Kernel { tid: u32, start_ns: u64 },
    /// A netlink request: (socket `tgid << 32 | fd`, start ns).
    Netlink { sock: u64, start_ns: u64 },
    /// A D-Bus method call: (socket, serial and start folded).
    Dbus { sock: u64, tag: u64 },
    /// A probed Go call still running: (process, goroutine, function id, start ns).
    /// The start is part of it: one goroutine makes the same call again and again
    /// (kubelet's relists), and each is a wait of its own.
    Go { tgid: u32, g: u64, func: u32, start_ns: u64 },
    /// A kubelet whose relist loop has not started a relist since `since_ns`.
    RelistOverdue { tgid: u32, since_ns: u64 },
    /// A thread found parked by `/proc` sampling (see `graph::parked`): (thread,
    /// start ns, the syscall it is parked in).
    Parked { tid: u32, start_ns: u64, nr: u32 },
}

/// Who waits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Who {
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// The goroutine (`g` address), for Go processes when known.
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "hex_opt", deserialize_with = "hex_opt_de")]
    pub goroutine: Option<u64>,
}

/// Reads a goroutine id back from its `0x…` form (`plegwatch explain`).
fn hex_opt_de<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    let s: Option<String> = Option::deserialize(d)?;
    s.map(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).map_err(serde::de::Error::custom)).transpose()
}

fn hex_opt<S: serde::Serializer>(g: &Option<u64>, s: S) -> Result<S::Ok, S::Error> {
    match g {
        Some(g) => s.serialize_str(&format!("{g:#x}")),
        None => s.serialize_none(),
    }
}

/// The Kubernetes pod and container a process belongs to, as far as plegwatch
/// could tell (see `observe::k8s`): every field is omitted when unknown, and
/// all of them for a host process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct PodRef {
    /// The pod's name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's namespace.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// The container's name (none for a pod's shim or sandbox: they serve the whole pod).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// The container's full id (from its cgroup, or the runc command line).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container_id: Option<String>,
}

impl PodRef {
    /// Nothing known: a host process.
    pub fn is_empty(&self) -> bool {
        self.pod.is_none() && self.namespace.is_none() && self.container.is_none() && self.container_id.is_none()
    }

    /// `namespace/pod` (with `/container` when known), or none without a pod name.
    pub fn label(&self) -> Option<String> {
        let pod = self.pod.as_deref()?;
        let mut out = format!("{}/{pod}", self.namespace.as_deref().unwrap_or("?"));
        if let Some(c) = &self.container {
            out.push('/');
            out.push_str(c);
        }
        Some(out)
    }
}

/// How exact a wait's start time is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StartTiming {
    /// Seen by a probe as it began.
    #[default]
    Exact,
    /// Found already open (the startup sweep): the start is a lower bound of its age.
    LowerBound,
    /// Found already open on a goroutine (the goroutine scan): the start is the
    /// goroutine's `waitsince`, a GC's stamp that may read up to one GC interval
    /// before the real park.
    Waitsince,
    /// Found already open with no clue to its start: counted from when it was found.
    Unknown,
}

impl StartTiming {
    pub fn is_exact(&self) -> bool {
        *self == StartTiming::Exact
    }

    /// `snake_case`, as in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            StartTiming::Exact => "exact",
            StartTiming::LowerBound => "lower_bound",
            StartTiming::Waitsince => "waitsince",
            StartTiming::Unknown => "unknown",
        }
    }
}

/// A wait still in flight, as a source saw it at this scan.
#[derive(Clone, Debug, PartialEq)]
pub struct OpenWait {
    pub key: WaitKey,
    pub who: Who,
    pub kind: WaitKind,
    /// What it waits in or for, in words: `umount2 /mnt/x (task_work)`,
    /// `ListContainers`, `StartTransientUnit to org.freedesktop.systemd1`.
    pub what: String,
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    pub start: StartTiming,
    /// On kubelet's relist path: a relist, or a CRI call a relist makes
    /// (ListPodSandbox, ListContainers). Such a wait is an incident's symptom first.
    pub pleg_path: bool,
}

/// How an edge was established.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Exactness {
    /// A heuristic: likely, not shown (threads parked beside a sibling's long wait).
    Heuristic,
    /// Inferred from circumstance (timing, who is connected to whom).
    Inferred,
    /// Seen by a probe or a lookup that names this very holder.
    Exact,
}

impl Exactness {
    pub fn as_str(self) -> &'static str {
        match self {
            Exactness::Heuristic => "heuristic",
            Exactness::Inferred => "inferred",
            Exactness::Exact => "exact",
        }
    }

    /// How sure the link is, in words (`plegwatch explain`).
    pub fn meaning(self) -> &'static str {
        match self {
            Exactness::Heuristic => "a guess from what runs beside it",
            Exactness::Inferred => "inferred from timing and who is connected to whom",
            Exactness::Exact => "seen directly by a probe or a lookup naming this holder",
        }
    }
}

/// The kinds of waiter → holder links.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EdgeKind {
    /// A Go call waits on a call it made itself, still open on the same goroutine.
    NestedCall,
    /// The goroutine holding the lock (or making the call) is in a kernel wait.
    SameGoroutine,
    /// A reader parked on a Go `sync.RWMutex` waits on the goroutine holding it.
    GoLock,
    /// kubelet's relist waits on the CRI call it made to the runtime.
    CriCall,
    /// containerd waits on a shim's reply to its ttrpc task call.
    Ttrpc,
    /// A shim task call waits on another task call for the same container in
    /// that shim (the shim's per-process mutex).
    ShimMutex,
    /// A parent waits on its child process.
    Child,
    /// A client waits on the peer of its unix socket.
    UnixPeer,
    /// A D-Bus call waits on the owner of its destination name.
    DbusOwner,
    /// A netlink request waits on the process holding the destination port id.
    NetlinkPeer,
    /// A netlink request that the kernel never answers.
    NoReply,
    /// A thread waits on the owner of a kernel mutex.
    KernelMutex,
    /// A writeback wait waits on its block device.
    Device,
    /// A thread parked on a futex beside a sibling thread's long wait.
    Sibling,
}

impl EdgeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            EdgeKind::NestedCall => "nested_call",
            EdgeKind::SameGoroutine => "same_goroutine",
            EdgeKind::GoLock => "go_lock",
            EdgeKind::CriCall => "cri_call",
            EdgeKind::Ttrpc => "ttrpc",
            EdgeKind::ShimMutex => "shim_mutex",
            EdgeKind::Child => "child",
            EdgeKind::UnixPeer => "unix_peer",
            EdgeKind::DbusOwner => "dbus_owner",
            EdgeKind::NetlinkPeer => "netlink_peer",
            EdgeKind::NoReply => "no_reply",
            EdgeKind::KernelMutex => "kernel_mutex",
            EdgeKind::Device => "device",
            EdgeKind::Sibling => "sibling",
        }
    }

    /// The link in words, for a reader who has not read the JSON contract
    /// (`plegwatch explain`): "this hop ... the next one".
    pub fn meaning(self) -> &'static str {
        match self {
            EdgeKind::NestedCall => "is waiting for a call it made itself, on the same goroutine, to return",
            EdgeKind::SameGoroutine => "is held by a goroutine that is itself stuck in the kernel wait below",
            EdgeKind::GoLock => "is parked on a Go lock (sync.RWMutex) that the next hop holds",
            EdgeKind::CriCall => "is kubelet waiting for its CRI call to the container runtime to return",
            EdgeKind::Ttrpc => "is containerd waiting for the shim to answer its ttrpc task call",
            EdgeKind::ShimMutex => "is a shim task call queued behind another call for the same container in that shim",
            EdgeKind::Child => "is a parent process waiting for its child to finish",
            EdgeKind::UnixPeer => "is a client waiting for the process at the other end of its unix socket",
            EdgeKind::DbusOwner => "is a D-Bus call waiting for the service that owns its destination name",
            EdgeKind::NetlinkPeer => "is a netlink request waiting for the process that owns its destination port",
            EdgeKind::NoReply => "is a netlink request the kernel has not answered",
            EdgeKind::KernelMutex => "is blocked on a kernel mutex that the next hop owns",
            EdgeKind::Device => "is waiting for writes to reach the block device below",
            EdgeKind::Sibling => "is a thread parked on a lock beside a sibling thread's long wait (a guess)",
        }
    }
}

/// What a terminal holder is, when it is one thing that several waits can
/// share: waits held by the same one are one incident.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HolderId {
    Process(u32),
    /// A block device (major, minor).
    Device(u32, u32),
}

/// Something that holds a wait and is not itself an open wait: the end of a
/// chain (a frozen process, the kernel, a disk).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Terminal {
    /// Set for holders several waits can share (a process, a device); none
    /// for "the kernel", which stands for a different thing each time.
    #[serde(skip)]
    pub id: Option<HolderId>,
    /// `process`, `kernel`, `device`.
    pub kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// What it is doing, in words: `stopped (state T)`, `no reply from the kernel`.
    pub what: String,
}

/// What an edge points at.
#[derive(Clone, Debug, PartialEq)]
pub enum HeldBy {
    Wait(WaitKey),
    Terminal(Terminal),
}

/// waiter → holder.
#[derive(Clone, Debug, PartialEq)]
pub struct Edge {
    pub from: WaitKey,
    pub to: HeldBy,
    pub kind: EdgeKind,
    /// Which probe or lookup saw it.
    pub evidence: String,
    pub exactness: Exactness,
}

/// One line of an incident's chain: a wait, or the terminal holder at its end.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hop {
    /// The wait's id (as in its `stall` lines); none for a terminal holder.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wait_id: Option<u64>,
    /// The wait's kind (`umount`, `go_lock`, ...), or the terminal's (`process`, `kernel`, `device`).
    pub kind: String,
    pub pid: Option<u32>,
    pub tid: Option<u32>,
    pub comm: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none", serialize_with = "hex_opt", deserialize_with = "hex_opt_de")]
    pub goroutine: Option<u64>,
    pub what: String,
    /// How long this wait has been open (none for a terminal).
    pub waited_s: Option<f64>,
    /// The link from this hop to the next one down the chain (none at the end).
    pub edge: Option<EdgeKind>,
    pub evidence: Option<String>,
    pub exactness: Option<Exactness>,
    /// The root: the deepest open wait, where the chain's cause sits.
    #[serde(default)]
    pub root: bool,
    /// The pod and container of the process at this hop (omitted for a host process).
    #[serde(flatten)]
    pub pod: PodRef,
    /// How exact its age is (omitted when exact): `lower_bound` (found by the startup
    /// sweep), `waitsince` (by the goroutine scan, from a GC's stamp), `unknown`.
    #[serde(default, skip_serializing_if = "StartTiming::is_exact")]
    pub start: StartTiming,
}

impl Hop {
    /// Who waits (or holds), in words: `comm pid=1 tid=2 g=0x…` (the tid
    /// only when it is not the pid).
    pub fn who(&self) -> String {
        let g = self.goroutine.map(|g| format!("{g:#x}"));
        who_text(self.comm.as_deref(), self.pid, self.tid, g.as_deref())
    }
}

/// Who waits, in words: `comm pid=… tid=… g=…` (the tid only when it is not the
/// pid; the goroutine as given, `0x…`). A hop's, or a report record's.
pub fn who_text(comm: Option<&str>, pid: Option<u32>, tid: Option<u32>, goroutine: Option<&str>) -> String {
    let mut who = comm.unwrap_or("?").to_string();
    if let Some(p) = pid {
        who.push_str(&format!(" pid={p}"));
    }
    if let Some(t) = tid.filter(|t| Some(*t) != pid) {
        who.push_str(&format!(" tid={t}"));
    }
    if let Some(g) = goroutine {
        who.push_str(&format!(" g={g}"));
    }
    // A holder known only by its pid reads `pid=1`, not `? pid=1`.
    match who.strip_prefix("? ") {
        Some(rest) if comm.is_none() => rest.to_string(),
        _ => who,
    }
}
