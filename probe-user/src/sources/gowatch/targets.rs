//! Which Go functions plegwatch probes, in which binaries, and what each means.
//!
//! Every symbol is a function with a stable name in `.gopclntab` (never an
//! inlined helper). Names move between releases, so each probed function is
//! a [`Group`] of alternatives: the first one the binary has is probed. A
//! binary with none of its target's groups is reported (doctor, a warning)
//! and left alone; the other probes go on.
//!
//! Checked on binaries here (every non-optional group found, entry and
//! RETs decoded, by `probe-user/tests/real_binaries.rs`): Debian's containerd 1.6.20, its
//! containerd-shim-runc-v2 and runc 1.1.5 (Go 1.19.8); containerd 1.7.34
//! (Go 1.25.5) and 2.3.4 (Go 1.26.6) with their shims; runc 1.4.3 (Go
//! 1.26.6); and the fake-kubelet fixture (a test fixture, not kubelet) built
//! with Go 1.19, 1.21, 1.23, 1.25 and 1.27, each also under plegwatch (the
//! `go_versions` scenario). kubelet's
//! `relist`/`Relist` come from its sources, unchecked on a binary.
//!
//! The probed functions and their prototypes (containerd 1.6.20 sources,
//! checked against Debian's binaries; registers under Go's register ABI):
//!
//! | function | prototype | read at entry |
//! |---|---|---|
//! | `sync.runtime_SemacquireMutex` (Go ≤ 1.19), `sync.runtime_SemacquireRWMutexR` (≥ 1.20) | `func runtime_SemacquireMutex(s *uint32, lifo bool, skipframes int)`: where `RWMutex.RLock` parks a reader while a writer holds the lock | RAX = s = `&rw.readerSem`, 12 bytes into the RWMutex |
//! | `(*statusStorage).Update` / `UpdateSync` | `func (s *statusStorage) UpdateSync(u UpdateFunc) error` | RAX = s (the lock) |
//! | `pkg/cri/server.(*criService).ListContainers`, `ListPodSandbox` | `func (c *criService) ListContainers(ctx context.Context, r *runtime.ListContainersRequest) (*runtime.ListContainersResponse, error)` | nothing |
//! | `(*criService).ContainerStatus`, `PodSandboxStatus`, `UpdateContainerResources` | `func (c *criService) UpdateContainerResources(ctx context.Context, r *runtime.UpdateContainerResourcesRequest) (*runtime.UpdateContainerResourcesResponse, error)` | RDI = r; its first field is the id |
//! | `pkg/cri/server.handleContainerExit` | `func handleContainerExit(ctx context.Context, e *eventtypes.TaskExit, cntr containerstore.Container) error` | RCX = e; `ContainerID` first |
//! | `pkg/cri/server.(*instrumentedService).StartContainer` (1.7: `pkg/cri/instrument.`) | `func (in *instrumentedService) StartContainer(ctx context.Context, r *runtime.StartContainerRequest) (_ *runtime.StartContainerResponse, err error)`: the v1 API's logging wrapper of `(*criService).StartContainer`, which creates the task (shim `Create`, `runc create`) and starts it | RDI = r; `ContainerId` first |
//! | `(*instrumentedService).CreateContainer` | `func (in *instrumentedService) CreateContainer(ctx context.Context, r *runtime.CreateContainerRequest) (res *runtime.CreateContainerResponse, err error)`: metadata and snapshot only, no task | nothing (its first field is the `PodSandboxId`; the container id is made inside) |
//! | `(*instrumentedService).RunPodSandbox` | `func (in *instrumentedService) RunPodSandbox(ctx context.Context, r *runtime.RunPodSandboxRequest) (res *runtime.RunPodSandboxResponse, err error)`: starts the shim, creates and starts the pause task | nothing (`Config` pointer first; the sandbox id is made inside) |
//!
//! Those three are probed on their wrappers (3 RETs each in 1.6.20) rather
//! than on `(*criService)`'s methods (16, 26 and 36 RETs): every probe point
//! is a perf-event link, and closing one takes about 100 ms in the kernel
//! (`uprobe_unregister_sync`, serialized), so the 81 links of the handlers
//! themselves would add 8 s to plegwatch's exit. The wrappers serve the v1
//! CRI API only; 1.6/1.7's v1alpha2 (`instrumentedAlphaService`) is not probed.
//! | shim `runtime/v2/runc/task.(*service).Update` / `Delete` | `func (s *service) Update(ctx context.Context, r *taskAPI.UpdateTaskRequest) (*ptypes.Empty, error)` | RDI = r; `ID` first |
//! | shim `runtime/v2/runc/task.(*service).Create` | `func (s *service) Create(ctx context.Context, r *taskAPI.CreateTaskRequest) (_ *taskAPI.CreateTaskResponse, err error)`: runs `runc create` (where runc's systemd driver calls `StartTransientUnit`) | RDI = r; `ID` first |
//! | shim `runtime/v2/runc/task.(*service).Start` | `func (s *service) Start(ctx context.Context, r *taskAPI.StartRequest) (*taskAPI.StartResponse, error)`: runs `runc start` | RDI = r; `ID` first |
//! | runc `libcontainer/cgroups/systemd.startUnit` | `func startUnit(cm *dbusConnManager, unitName string, properties []systemdDbus.Property) error` (1.1; 1.2 adds `ignoreExist bool`) | nothing |
//! | runc `systemd.setUnitProperties` | `func setUnitProperties(cm *dbusConnManager, name string, properties ...systemdDbus.Property) error` | nothing |
//! | kubelet `pkg/kubelet/pleg.(*GenericPLEG).Relist` (`relist` ≤ 1.25) | `func (g *GenericPLEG) Relist()` | nothing (R14 = g at entry and RET, as everywhere) |
//! | containerd `github.com/containerd/ttrpc.(*Client).dispatch` (ttrpc 1.1 only: no `createStream`; entry only, program `ttrpc_dispatch`) | `func (c *Client) dispatch(ctx context.Context, req *Request, resp *Response) error` (v1.1.1): the caller hands `req` to the client's sender goroutine | RDI = req; R14 = the caller's g |
//! | containerd `ttrpc.(*Client).send` (ttrpc 1.1 only; entry only, program `ttrpc_send`) | `func (c *Client) send(streamID uint32, mtype messageType, msg interface{}) error` (v1.1.1): the sender goroutine writes the request next | RBX = stream id, RCX = type, RSI = msg's data word (the `*Request`) |
//! | `runtime.goexit0` (every probed binary, entry only: it never returns) | `func goexit0(gp *g)`: the goroutine `gp` ended; runs on g0 through `mcall` | RAX = gp (R14 is g0 here): calls still open on it are dropped |

use plegwatch_abi::{GoArgSpec, GO_ARG_NONE};

/// What a probed function means for the chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// kubelet's PLEG relist.
    Relist,
    /// A goroutine parked on a sync lock's semaphore: for a reader of a
    /// `sync.RWMutex` (`(*statusStorage).Get` → `RLock` while `UpdateSync`
    /// holds the write lock) the receiver is `&rw.readerSem`, at
    /// [`READER_SEM_OFF`] in the lock. Probing this instead of `Get` costs
    /// nothing while locks are free: `Get` runs for every container at every
    /// relist, this only when a reader really waits.
    LockWait,
    /// Holds a container's lock for writing: containerd's Status store
    /// (`(*statusStorage).Update`/`UpdateSync`, the receiver is the lock), CRI-O's
    /// `opLock` (`(*runtimeOCI).UpdateContainer` and the other OCI runtime calls:
    /// the receiver reported is the lock, at [`Recv`] in the container).
    LockHold,
    /// A CRI handler (ListContainers, UpdateContainerResources, ...).
    CriHandler,
    /// A shim's task service method (containerd's ttrpc request to the shim).
    ShimTask,
    /// runc's systemd calls (its D-Bus requests to systemd).
    RuncSystemd,
}

/// Offset of `readerSem` in Go's `sync.RWMutex` (`w Mutex` 8 bytes, then
/// `writerSem`, `readerSem`: Go 1.9 to 1.26).
pub const READER_SEM_OFF: u64 = 12;

/// Where in a `sync.RWMutex` the semaphore a [`Role::LockWait`] function parks on
/// sits, by the function (its first argument, RAX, is the semaphore's address):
/// - `sync.runtime_SemacquireRWMutexR` (Go >= 1.20): a reader (`RLock`), `readerSem` at 12;
/// - `sync.runtime_SemacquireRWMutex` (Go >= 1.20): a writer waiting for the readers
///   to leave (`Lock`), `writerSem` at 8;
/// - `internal/sync.runtime_SemacquireMutex` (Go >= 1.24): a writer waiting for another
///   writer: the `sema` of the lock's `w`, a `sync.Mutex` (`state`, then `sema`), at 4;
/// - `sync.runtime_SemacquireMutex` (Go <= 1.19, where every contended sync lock parks
///   in it): taken as a reader, at 12 (the case that matters there: a relist's `Get`).
///
/// Checked on Go 1.25.5 (CRI-O 1.35.6) and 1.19.8 (containerd 1.6.20) by disassembly.
pub fn sem_off(symbol: &str) -> u64 {
    match symbol {
        "sync.runtime_SemacquireRWMutex" => 8,
        "internal/sync.runtime_SemacquireMutex" => 4,
        _ => READER_SEM_OFF,
    }
}

/// Whether a [`Role::LockWait`] function parks a writer (see [`sem_off`]).
pub fn parks_a_writer(symbol: &str) -> bool {
    sem_off(symbol) != READER_SEM_OFF
}

/// The string argument captured at a function's entry (see [`GoArgSpec`]).
///
/// Where the field sits in the request struct depends on the code generator
/// that made it, not on the function: gogo structs (containerd 1.6, and
/// cri-api up to v0.27 in containerd 1.7) start with their fields;
/// protoc-gen-go before v1.36 puts `state`, `sizeCache` and `unknownFields`
/// (40 bytes) first (containerd's own API from 1.7); v1.36 and later only
/// `state` (8 bytes; cri-api v0.36 in containerd 2.3). So the offset is read
/// from the binary at attach time ([`Arg::resolve`]): from the field's
/// generated getter when the binary has one, else [`Arg::off`] if the binary
/// has one of the gogo marker functions, else nothing is captured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arg {
    /// What it is, for the output (`container`, `sandbox`).
    pub name: &'static str,
    /// Go register ABI integer register index (0 RAX, 1 RBX, 2 RCX, 3 RDI, ...).
    pub reg: u32,
    /// Offset of the `string` header in the struct that register points to
    /// (once resolved; before, the gogo layout's offset).
    pub off: u32,
    /// The field's getters (`(*T).GetContainerId`), one per package path
    /// the type has lived at; the first in the binary gives the offset.
    pub getters: &'static [&'static str],
    /// Functions only a gogo-generated type has (`(*T).XXX_Unmarshal`):
    /// with no getter, one of them vouches for [`Arg::off`].
    pub gogo: &'static [&'static str],
}

/// What the kernel captures at a function's entry: its string argument, and where
/// its receiver is (RAX plus 0 when `recv` is none).
pub fn arg_spec(arg: Option<Arg>, recv: Option<Recv>) -> GoArgSpec {
    let (reg, off) = arg.map_or((GO_ARG_NONE, 0), |a| (a.reg, a.off));
    let (recv_reg, recv_off) = recv.map_or((0, 0), |r| (r.reg, r.off));
    GoArgSpec { reg, off, recv_reg, recv_off }
}

/// A call whose receiver, as plegwatch reports it, is a lock inside one of its
/// arguments: register `reg` (Go register ABI order) plus the offset of a lock field
/// of the struct it points to. The offset is read from the binary, from a method that
/// locks the same field of its own receiver ([`FoundIn`]), so that a field moved by a
/// release is still found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Recv {
    pub reg: u32,
    /// The lock's offset in the struct, once resolved.
    pub off: u32,
    pub found_in: FoundIn,
    /// The lock, in words: its name (`opLock`) and its type.
    pub lock: (&'static str, &'static str),
}

/// Where a [`Recv`]'s lock offset is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoundIn {
    /// A method that read-locks the `sync.RWMutex` (`GoBinary::rlock_field_offset`).
    RLock(&'static str),
    /// A method that locks the `sync.Mutex` (`GoBinary::lock_field_offset`).
    Lock(&'static str),
}

impl Recv {
    /// This receiver with the offset `bin` really uses.
    pub fn resolve(self, bin: &crate::proto::gosym::GoBinary) -> Result<Recv, String> {
        let (off, method) = match self.found_in {
            FoundIn::RLock(m) => (bin.rlock_field_offset(m), m),
            FoundIn::Lock(m) => (bin.lock_field_offset(m), m),
        };
        let off = off.map_err(|e| e.to_string())?;
        let off = u32::try_from(off).map_err(|_| format!("{}: lock offset {off:#x} out of range", short(method)))?;
        Ok(Recv { off, ..self })
    }

    /// Whether the lock is a plain `sync.Mutex` (else a `sync.RWMutex`).
    pub fn is_mutex(self) -> bool {
        matches!(self.found_in, FoundIn::Lock(_))
    }
}

impl Arg {
    /// This argument with the offset `bin` really uses, or `None` (nothing
    /// captured) when the binary says nothing about the layout.
    pub fn resolve(self, bin: &crate::proto::gosym::GoBinary) -> Result<Arg, String> {
        for g in self.getters {
            if bin.symbols().lookup(g).is_none() {
                continue;
            }
            let off = bin.string_getter_offset(g).map_err(|e| e.to_string())?;
            let off = u32::try_from(off).map_err(|_| format!("{g}: field offset {off:#x} out of range"))?;
            return Ok(Arg { off, ..self });
        }
        if self.gogo.iter().any(|m| bin.symbols().lookup(m).is_some()) {
            return Ok(self);
        }
        Err(format!("no getter ({}) and no gogo marker: request layout unknown", self.getters.first().map_or("-", |g| short(g))))
    }
}

/// A Go function plegwatch probes.
#[derive(Clone, Copy, Debug)]
pub struct GoFuncSpec {
    /// The exact name in `.gopclntab`.
    pub symbol: &'static str,
    pub role: Role,
    pub arg: Option<Arg>,
    /// Where its receiver is, when not RAX (a lock inside an argument).
    pub recv: Option<Recv>,
}

const fn spec(symbol: &'static str, role: Role) -> GoFuncSpec {
    GoFuncSpec { symbol, role, arg: None, recv: None }
}

const fn with_arg(symbol: &'static str, role: Role, arg: Arg) -> GoFuncSpec {
    GoFuncSpec { symbol, role, arg: Some(arg), recv: None }
}

const fn holding(symbol: &'static str, recv: Recv) -> GoFuncSpec {
    GoFuncSpec { symbol, role: Role::LockHold, arg: None, recv: Some(recv) }
}

/// The getter (or gogo marker) `$m` of cri-api's `$t`, vendored (Debian's
/// GOPATH build of 1.6) or as a module (1.7, 2.x).
macro_rules! cri {
    ($t:literal, $m:literal) => {
        &[
            concat!("k8s.io/cri-api/pkg/apis/runtime/v1.(*", $t, ").", $m),
            concat!("github.com/containerd/containerd/vendor/k8s.io/cri-api/pkg/apis/runtime/v1.(*", $t, ").", $m),
        ]
    };
}

/// `(c *criService) M(ctx context.Context, r *runtime.MRequest)`: RAX = c,
/// RBX:RCX = ctx, RDI = r; the id is `r.ContainerId` / `r.PodSandboxId`:
/// offset 0 in 1.6/1.7 (gogo cri-api), 8 in 2.3 (cri-api v0.36).
const fn cri_arg(name: &'static str, getters: &'static [&'static str], gogo: &'static [&'static str]) -> Arg {
    Arg { name, reg: 3, off: 0, getters, gogo }
}
const UPDATE_RESOURCES: Arg = cri_arg(
    "container",
    cri!("UpdateContainerResourcesRequest", "GetContainerId"),
    cri!("UpdateContainerResourcesRequest", "XXX_Unmarshal"),
);
const CONTAINER_STATUS: Arg =
    cri_arg("container", cri!("ContainerStatusRequest", "GetContainerId"), cri!("ContainerStatusRequest", "XXX_Unmarshal"));
const SANDBOX_STATUS: Arg =
    cri_arg("sandbox", cri!("PodSandboxStatusRequest", "GetPodSandboxId"), cri!("PodSandboxStatusRequest", "XXX_Unmarshal"));
const START_CONTAINER: Arg =
    cri_arg("container", cri!("StartContainerRequest", "GetContainerId"), cri!("StartContainerRequest", "XXX_Unmarshal"));
/// `handleContainerExit(ctx context.Context, e *eventtypes.TaskExit, cntr
/// containerstore.Container)` (1.6/1.7), `(c *criService)
/// handleContainerExit(ctx, e *eventtypes.TaskExit, cntr, sandboxID string)`
/// (2.x): RAX:RBX = ctx, RCX = e in 1.6/1.7; in 2.x RAX = c, RBX:RCX = ctx,
/// RDI = e. `TaskExit.ContainerID`: offset 0 in 1.6 (gogo), 40 from 1.7.
const EXIT_CONTAINER: Arg = Arg {
    name: "container",
    reg: 2,
    off: 0,
    getters: &["github.com/containerd/containerd/api/events.(*TaskExit).GetContainerID"],
    gogo: &["github.com/containerd/containerd/api/events.(*TaskExit).XXX_Unmarshal"],
};
const EXIT_CONTAINER_V2: Arg = Arg { reg: 3, ..EXIT_CONTAINER };
/// `(s *service) M(ctx context.Context, r *taskAPI.MRequest)` in the runc v2
/// shim: RDI = r, whose `ID` is the container: offset 0 in 1.6 (gogo), 40
/// in 1.7 (`api/runtime/task/v2`) and 2.3 (`api/runtime/task/v3`).
macro_rules! shim_arg {
    ($t:literal) => {
        Arg {
            name: "container",
            reg: 3,
            off: 0,
            getters: &[
                concat!("github.com/containerd/containerd/api/runtime/task/v3.(*", $t, ").GetID"),
                concat!("github.com/containerd/containerd/api/runtime/task/v2.(*", $t, ").GetID"),
                concat!("github.com/containerd/containerd/runtime/v2/task.(*", $t, ").GetID"),
            ],
            gogo: &[concat!("github.com/containerd/containerd/runtime/v2/task.(*", $t, ").XXX_Unmarshal")],
        }
    };
}
const SHIM_UPDATE: Arg = shim_arg!("UpdateTaskRequest");
const SHIM_DELETE: Arg = shim_arg!("DeleteRequest");
const SHIM_CREATE: Arg = shim_arg!("CreateTaskRequest");
const SHIM_START: Arg = shim_arg!("StartRequest");

/// A group of names for one function across versions: the first found is probed.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub funcs: &'static [GoFuncSpec],
    /// Only some versions have it at all (1.7's `sbserver`): not missing when absent.
    pub optional: bool,
    /// A Go runtime or standard library function, present in every Go
    /// binary: probed only when the binary matched on its own functions.
    pub runtime: bool,
    /// Probed only in binaries that also have this function (and not
    /// missing without it): a group only a test fixture gets.
    pub only_with: Option<&'static str>,
}

const fn need(funcs: &'static [GoFuncSpec]) -> Group {
    Group { funcs, optional: false, runtime: false, only_with: None }
}

const fn opt(funcs: &'static [GoFuncSpec]) -> Group {
    Group { funcs, optional: true, runtime: false, only_with: None }
}

const fn runtime(funcs: &'static [GoFuncSpec]) -> Group {
    Group { funcs, optional: false, runtime: true, only_with: None }
}

/// A runtime function only some Go versions have.
const fn runtime_opt(funcs: &'static [GoFuncSpec]) -> Group {
    Group { funcs, optional: true, runtime: true, only_with: None }
}

/// Where a writer of a `sync.RWMutex` parks (see [`sem_off`]): waiting for the
/// readers to leave, or for another writer (Go >= 1.24: `internal/sync`). A CRI-O
/// `ListContainerStats` waits here behind a held `opLock` (`ContainerStats` takes it for
/// writing); so does a second update.
const WRITER_WAITS: &[Group] = &[
    runtime_opt(&[spec("sync.runtime_SemacquireRWMutex", Role::LockWait)]),
    runtime_opt(&[spec("internal/sync.runtime_SemacquireMutex", Role::LockWait)]),
];

/// Where `sync.RWMutex.RLock` parks a reader while a writer holds the lock:
/// `runtime_SemacquireRWMutexR` from Go 1.20, `runtime_SemacquireMutex`
/// (every contended sync lock) before. Checked on the fake-kubelet fixture
/// built with Go 1.19, 1.21, 1.23, 1.25 and 1.27 (the `go_versions` scenario):
/// RAX = `&rw.readerSem` at [`READER_SEM_OFF`] on each.
const LOCK_WAITS: &[GoFuncSpec] = &[
    // Go ≥ 1.20: readers only. Go ≤ 1.19: every contended sync lock; only
    // those whose semaphore sits in a Status lock are kept (userspace).
    spec("sync.runtime_SemacquireRWMutexR", Role::LockWait),
    spec("sync.runtime_SemacquireMutex", Role::LockWait),
];

/// A function only the fake-kubelet TEST FIXTURE has (it is not kubelet; its
/// `tests/fixtures/fake-kubelet/cmd/fake-kubelet/main.go`): the goroutine
/// that holds its `sync.RWMutex` for writing while a relist parks in `RLock`.
/// A binary with it also gets [`LOCK_WAITS`] probed, so that the fixture can
/// check the reader-wait probe on every Go version; a real kubelet has no
/// such function and its probes stay the relist alone.
pub const FIXTURE_READER_WAITS: &str = "main.(*fakeRuntime).holdWriteLock";

/// kubelet's relist, newest name first: `Relist` from v1.26 (Evented PLEG PR
/// #111384), `relist` up to v1.25.
///
/// In the fake-kubelet test fixture only (gated on [`FIXTURE_READER_WAITS`]),
/// also the reader waits: a relist parked in `RLock` shows in its
/// `pleg_relist` report (`detail.reader_wait`).
pub const KUBELET: &[Group] = &[
    need(&[
        spec("k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).Relist", Role::Relist),
        spec("k8s.io/kubernetes/pkg/kubelet/pleg.(*GenericPLEG).relist", Role::Relist),
    ]),
    Group { only_with: Some(FIXTURE_READER_WAITS), ..runtime(LOCK_WAITS) },
];

/// containerd's CRI Status store and handlers. Checked on binaries:
/// Debian's 1.6.20 (Go 1.19.8), 1.7.34 (Go 1.25.5) and 2.3.4 (Go 1.26.6),
/// every group found; and against the sources at tags v1.7.34 and v2.3.4:
///
/// - 1.6/1.7: `pkg/cri/server` (`handleContainerExit` a function); 1.7 runs
///   it unless `ENABLE_CRI_SANDBOXES` is set (`pkg/cri/cri.go`), which picks
///   `pkg/cri/sbserver` instead (optional groups); its logging wrappers moved
///   from `pkg/cri/server` to `pkg/cri/instrument`.
/// - 2.x: `v2/internal/cri/server` (`handleContainerExit` a method, RDI = the
///   `TaskExit`), the Status store in `v2/internal/cri/store/container`, the
///   wrappers in `v2/internal/cri/instrument`.
pub const CONTAINERD: &[Group] = &[
    runtime(LOCK_WAITS),
    need(&[
        spec("github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).Update", Role::LockHold),
        spec("github.com/containerd/containerd/v2/internal/cri/store/container.(*statusStorage).Update", Role::LockHold),
    ]),
    need(&[
        spec("github.com/containerd/containerd/pkg/cri/store/container.(*statusStorage).UpdateSync", Role::LockHold),
        spec("github.com/containerd/containerd/v2/internal/cri/store/container.(*statusStorage).UpdateSync", Role::LockHold),
    ]),
    need(&[
        spec("github.com/containerd/containerd/pkg/cri/server.(*criService).ListContainers", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/server.(*criService).ListContainers", Role::CriHandler),
    ]),
    need(&[
        spec("github.com/containerd/containerd/pkg/cri/server.(*criService).ListPodSandbox", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/server.(*criService).ListPodSandbox", Role::CriHandler),
    ]),
    need(&[
        with_arg("github.com/containerd/containerd/pkg/cri/server.(*criService).ContainerStatus", Role::CriHandler, CONTAINER_STATUS),
        with_arg(
            "github.com/containerd/containerd/v2/internal/cri/server.(*criService).ContainerStatus",
            Role::CriHandler,
            CONTAINER_STATUS,
        ),
    ]),
    need(&[
        with_arg("github.com/containerd/containerd/pkg/cri/server.(*criService).PodSandboxStatus", Role::CriHandler, SANDBOX_STATUS),
        with_arg(
            "github.com/containerd/containerd/v2/internal/cri/server.(*criService).PodSandboxStatus",
            Role::CriHandler,
            SANDBOX_STATUS,
        ),
    ]),
    need(&[
        with_arg(
            "github.com/containerd/containerd/pkg/cri/server.(*criService).UpdateContainerResources",
            Role::CriHandler,
            UPDATE_RESOURCES,
        ),
        with_arg(
            "github.com/containerd/containerd/v2/internal/cri/server.(*criService).UpdateContainerResources",
            Role::CriHandler,
            UPDATE_RESOURCES,
        ),
    ]),
    need(&[
        with_arg("github.com/containerd/containerd/pkg/cri/server.handleContainerExit", Role::CriHandler, EXIT_CONTAINER),
        with_arg(
            "github.com/containerd/containerd/v2/internal/cri/server.(*criService).handleContainerExit",
            Role::CriHandler,
            EXIT_CONTAINER_V2,
        ),
    ]),
    need(&[
        with_arg(
            "github.com/containerd/containerd/pkg/cri/server.(*instrumentedService).StartContainer",
            Role::CriHandler,
            START_CONTAINER,
        ),
        with_arg(
            "github.com/containerd/containerd/pkg/cri/instrument.(*instrumentedService).StartContainer",
            Role::CriHandler,
            START_CONTAINER,
        ),
        with_arg(
            "github.com/containerd/containerd/v2/internal/cri/instrument.(*instrumentedService).StartContainer",
            Role::CriHandler,
            START_CONTAINER,
        ),
    ]),
    need(&[
        spec("github.com/containerd/containerd/pkg/cri/server.(*instrumentedService).CreateContainer", Role::CriHandler),
        spec("github.com/containerd/containerd/pkg/cri/instrument.(*instrumentedService).CreateContainer", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/instrument.(*instrumentedService).CreateContainer", Role::CriHandler),
    ]),
    need(&[
        spec("github.com/containerd/containerd/pkg/cri/server.(*instrumentedService).RunPodSandbox", Role::CriHandler),
        spec("github.com/containerd/containerd/pkg/cri/instrument.(*instrumentedService).RunPodSandbox", Role::CriHandler),
        spec("github.com/containerd/containerd/v2/internal/cri/instrument.(*instrumentedService).RunPodSandbox", Role::CriHandler),
    ]),
    opt(&[spec("github.com/containerd/containerd/pkg/cri/sbserver.(*criService).ListContainers", Role::CriHandler)]),
    opt(&[with_arg(
        "github.com/containerd/containerd/pkg/cri/sbserver.(*criService).UpdateContainerResources",
        Role::CriHandler,
        UPDATE_RESOURCES,
    )]),
];

/// containerd-shim-runc-v2's task service: the other end of containerd's
/// ttrpc calls. 1.6/1.7: `runtime/v2/runc/task` (the `api/runtime/task/v2`
/// API; gogo requests in 1.6, protoc-gen-go from 1.7); 2.x:
/// `cmd/containerd-shim-runc-v2/task` (`api/runtime/task/v3`). Checked on
/// Debian's 1.6.20 shim and the 1.7.34 and 2.3.4 shims: all four found.
pub const SHIM: &[Group] = &[
    need(&[
        with_arg("github.com/containerd/containerd/runtime/v2/runc/task.(*service).Update", Role::ShimTask, SHIM_UPDATE),
        with_arg("github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task.(*service).Update", Role::ShimTask, SHIM_UPDATE),
    ]),
    need(&[
        with_arg("github.com/containerd/containerd/runtime/v2/runc/task.(*service).Delete", Role::ShimTask, SHIM_DELETE),
        with_arg("github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task.(*service).Delete", Role::ShimTask, SHIM_DELETE),
    ]),
    need(&[
        with_arg("github.com/containerd/containerd/runtime/v2/runc/task.(*service).Create", Role::ShimTask, SHIM_CREATE),
        with_arg("github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task.(*service).Create", Role::ShimTask, SHIM_CREATE),
    ]),
    need(&[
        with_arg("github.com/containerd/containerd/runtime/v2/runc/task.(*service).Start", Role::ShimTask, SHIM_START),
        with_arg("github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/task.(*service).Start", Role::ShimTask, SHIM_START),
    ]),
];

/// runc's cgroup calls to systemd over D-Bus: `libcontainer/cgroups/systemd`
/// up to 1.2 (Debian's 1.1.5), `github.com/opencontainers/cgroups/systemd`
/// from 1.3 (runc 1.4.3 links cgroups v0.0.6; Go 1.26.6).
///
/// In 1.4.3 `setUnitProperties` (a one-line `cm.retryOnDisconnect(func...)`)
/// is inlined into `(*UnifiedManager).Set` and `(*LegacyManager).Set`: what
/// is left of it is its closure, `Set.setUnitProperties.func1`, which makes
/// the D-Bus call (`SetUnitPropertiesContext`) on the caller's goroutine. The
/// cgroup v2 manager's closure stands for `setUnitProperties`; the v1 one is
/// an optional group.
pub const RUNC: &[Group] = &[
    need(&[
        spec("github.com/opencontainers/runc/libcontainer/cgroups/systemd.startUnit", Role::RuncSystemd),
        spec("github.com/opencontainers/cgroups/systemd.startUnit", Role::RuncSystemd),
    ]),
    need(&[
        spec("github.com/opencontainers/runc/libcontainer/cgroups/systemd.setUnitProperties", Role::RuncSystemd),
        spec("github.com/opencontainers/cgroups/systemd.setUnitProperties", Role::RuncSystemd),
        spec("github.com/opencontainers/cgroups/systemd.(*UnifiedManager).Set.setUnitProperties.func1", Role::RuncSystemd),
    ]),
    opt(&[spec("github.com/opencontainers/cgroups/systemd.(*LegacyManager).Set.setUnitProperties.func1", Role::RuncSystemd)]),
];

/// CRI-O's OCI runtime calls that hold a container's `opLock` for writing while they
/// run the runtime (`update`, `start`, `delete`, `state`, the stop loop's `kill`):
/// `func (r *runtimeOCI) UpdateContainer(ctx context.Context, c *Container, res
/// *rspec.LinuxResources) error`, and `(ctx, c)` for the others: RDI = c. The lock is
/// `c.opLock`, the `sync.RWMutex` that `(*Container).State` read-locks (at 0xd0 in
/// 1.35.6). Checked on CRI-O 1.35.6 (Go 1.25.5) and its sources at the tag.
const OP_LOCK: Recv = Recv {
    reg: 3,
    off: 0,
    found_in: FoundIn::RLock("github.com/cri-o/cri-o/internal/oci.(*Container).State"),
    lock: ("opLock", "sync.RWMutex (CRI-O container opLock)"),
};

/// CRI-O's NRI lock: `internal/nri.local` embeds a `sync.Mutex` that each of its event
/// methods (`func (l *local) StartContainer(ctx context.Context, pod PodSandbox, ctr
/// Container) error`, ...) and `func (l *local) syncPlugin(ctx context.Context, syncFn
/// nri.SyncCB) error` lock for their whole run: RAX = l, the lock at 0 in 1.35.6 (read
/// from `syncPlugin`'s inlined `Lock`). One per CRI-O: a holder that waits stops every
/// container and pod lifecycle call on the node (cri-o#9804, #9835).
const NRI_LOCK: Recv = Recv {
    reg: 0,
    off: 0,
    found_in: FoundIn::Lock("github.com/cri-o/cri-o/internal/nri.(*local).syncPlugin"),
    lock: (NRI_LOCK_NAME, "sync.Mutex (CRI-O NRI adaptation)"),
};

/// [`NRI_LOCK`]'s name, for what is reported of its waiters.
pub const NRI_LOCK_NAME: &str = "NRI lock";

/// `(s *Server) M(ctx context.Context, req *types.MRequest)`: RDI = req (cri-api
/// v0.35 in CRI-O 1.35.6; the field's offset is read from its getter).
const STOP_CONTAINER: Arg =
    cri_arg("container", cri!("StopContainerRequest", "GetContainerId"), cri!("StopContainerRequest", "XXX_Unmarshal"));
const REMOVE_CONTAINER: Arg =
    cri_arg("container", cri!("RemoveContainerRequest", "GetContainerId"), cri!("RemoveContainerRequest", "XXX_Unmarshal"));
const STOP_SANDBOX: Arg =
    cri_arg("sandbox", cri!("StopPodSandboxRequest", "GetPodSandboxId"), cri!("StopPodSandboxRequest", "XXX_Unmarshal"));

/// `(*local).$m` of CRI-O's NRI adaptation (`internal/nri`).
macro_rules! nri {
    ($m:literal) => {
        concat!("github.com/cri-o/cri-o/internal/nri.(*local).", $m)
    };
}

/// CRI-O's CRI server, the OCI runtime calls that hold a container's `opLock`, and the
/// NRI calls that hold its NRI lock.
/// Checked on CRI-O 1.35.6 (Go 1.25.5; `../shared/bin/crio-1.35.6`): every group
/// found, entries and RETs decoded, `opLock` at 0xd0 (`probe-user/tests/real_binaries.rs`).
///
/// | function | prototype | read at entry |
/// |---|---|---|
/// | `server.(*Server).ListContainers`, `ListPodSandbox`, `ListContainerStats`, `CreateContainer`, `RunPodSandbox` | `func (s *Server) ListContainers(ctx context.Context, req *types.ListContainersRequest) (*types.ListContainersResponse, error)` | nothing |
/// | `(*Server).ContainerStatus`, `UpdateContainerResources`, `StartContainer`, `StopContainer`, `RemoveContainer` | `func (s *Server) UpdateContainerResources(ctx context.Context, req *types.UpdateContainerResourcesRequest) (*types.UpdateContainerResourcesResponse, error)` | RDI = req; its `ContainerId` |
/// | `(*Server).PodSandboxStatus`, `StopPodSandbox` | as above | RDI = req; its `PodSandboxId` |
/// | `internal/oci.(*runtimeOCI).UpdateContainer`, `StartContainer`, `DeleteContainer`, `UpdateContainerStatus`, `StopLoopForContainer` | `func (r *runtimeOCI) UpdateContainer(ctx context.Context, c *Container, res *rspec.LinuxResources) error` | RDI = c: the receiver reported is `&c.opLock` |
/// | `internal/nri.(*local).syncPlugin`, `updateFromPlugin` and the event methods (`RunPodSandbox`, `StartContainer`, `UpdateContainer`, `StopContainer`, ...; optional) | `func (l *local) StartContainer(ctx context.Context, pod PodSandbox, ctr Container) error` | RAX = l: the receiver reported is `&l.Mutex` (the NRI lock) |
/// | `sync.runtime_SemacquireRWMutexR` | as for containerd: a reader parked while a writer holds the lock (`(*Container).State`) | RAX = `&rw.readerSem` |
/// | `internal/sync.runtime_SemacquireMutex` | a goroutine parked in `sync.Mutex.Lock` (the NRI lock, or an `opLock`'s writer mutex) | RAX = `&m.sema` |
///
/// In 1.35.6 the relist's own calls do not take `opLock` (`ListContainers` reads
/// `StateNoLock`, `ListPodSandbox` the sandbox's own lock); what parks behind a held
/// `opLock` is another update, `ListContainerStats`, a stop, the exit handler and,
/// with NRI on, every lifecycle call: the NRI lock's holder may itself wait on a held
/// `opLock` (`syncPlugin` lists every container's state for a plugin that registers,
/// each through `State`'s `RLock`), and every pod and container lifecycle call on the
/// node then parks behind it.
pub const CRIO: &[Group] = &[
    runtime(LOCK_WAITS),
    WRITER_WAITS[0],
    WRITER_WAITS[1],
    need(&[spec("github.com/cri-o/cri-o/server.(*Server).ListContainers", Role::CriHandler)]),
    need(&[spec("github.com/cri-o/cri-o/server.(*Server).ListPodSandbox", Role::CriHandler)]),
    need(&[with_arg("github.com/cri-o/cri-o/server.(*Server).ContainerStatus", Role::CriHandler, CONTAINER_STATUS)]),
    need(&[with_arg("github.com/cri-o/cri-o/server.(*Server).PodSandboxStatus", Role::CriHandler, SANDBOX_STATUS)]),
    need(&[with_arg("github.com/cri-o/cri-o/server.(*Server).UpdateContainerResources", Role::CriHandler, UPDATE_RESOURCES)]),
    need(&[with_arg("github.com/cri-o/cri-o/server.(*Server).StartContainer", Role::CriHandler, START_CONTAINER)]),
    need(&[with_arg("github.com/cri-o/cri-o/server.(*Server).StopContainer", Role::CriHandler, STOP_CONTAINER)]),
    need(&[with_arg("github.com/cri-o/cri-o/server.(*Server).RemoveContainer", Role::CriHandler, REMOVE_CONTAINER)]),
    need(&[with_arg("github.com/cri-o/cri-o/server.(*Server).StopPodSandbox", Role::CriHandler, STOP_SANDBOX)]),
    need(&[spec("github.com/cri-o/cri-o/server.(*Server).CreateContainer", Role::CriHandler)]),
    need(&[spec("github.com/cri-o/cri-o/server.(*Server).RunPodSandbox", Role::CriHandler)]),
    need(&[spec("github.com/cri-o/cri-o/server.(*Server).ListContainerStats", Role::CriHandler)]),
    need(&[holding("github.com/cri-o/cri-o/internal/oci.(*runtimeOCI).UpdateContainer", OP_LOCK)]),
    need(&[holding("github.com/cri-o/cri-o/internal/oci.(*runtimeOCI).StartContainer", OP_LOCK)]),
    need(&[holding("github.com/cri-o/cri-o/internal/oci.(*runtimeOCI).DeleteContainer", OP_LOCK)]),
    need(&[holding("github.com/cri-o/cri-o/internal/oci.(*runtimeOCI).UpdateContainerStatus", OP_LOCK)]),
    need(&[holding("github.com/cri-o/cri-o/internal/oci.(*runtimeOCI).StopLoopForContainer", OP_LOCK)]),
    opt(&[holding(nri!("syncPlugin"), NRI_LOCK)]),
    opt(&[holding(nri!("updateFromPlugin"), NRI_LOCK)]),
    opt(&[holding(nri!("RunPodSandbox"), NRI_LOCK)]),
    opt(&[holding(nri!("UpdatePodSandbox"), NRI_LOCK)]),
    opt(&[holding(nri!("StopPodSandbox"), NRI_LOCK)]),
    opt(&[holding(nri!("RemovePodSandbox"), NRI_LOCK)]),
    opt(&[holding(nri!("CreateContainer"), NRI_LOCK)]),
    opt(&[holding(nri!("PostCreateContainer"), NRI_LOCK)]),
    opt(&[holding(nri!("StartContainer"), NRI_LOCK)]),
    opt(&[holding(nri!("PostStartContainer"), NRI_LOCK)]),
    opt(&[holding(nri!("UpdateContainer"), NRI_LOCK)]),
    opt(&[holding(nri!("PostUpdateContainer"), NRI_LOCK)]),
    opt(&[holding(nri!("StopContainer"), NRI_LOCK)]),
    opt(&[holding(nri!("RemoveContainer"), NRI_LOCK)]),
];

/// A kind of binary plegwatch probes.
#[derive(Clone, Copy, Debug)]
pub struct Target {
    /// What it is (`containerd`, `kubelet`, ...), for the output.
    pub name: &'static str,
    /// Whether a process with this comm runs it.
    pub by_comm: fn(&str) -> bool,
    pub groups: &'static [Group],
}

/// Every target, matched by comm (15 bytes at most: `containerd-shim-runc-v2`
/// shows as `containerd-shim`).
pub const TARGETS: &[Target] = &[
    Target { name: "kubelet", by_comm: |c| c.contains("kubelet"), groups: KUBELET },
    Target { name: "containerd", by_comm: |c| c == "containerd", groups: CONTAINERD },
    Target { name: "containerd-shim", by_comm: |c| c.starts_with("containerd-shim"), groups: SHIM },
    Target { name: "runc", by_comm: |c| c == "runc", groups: RUNC },
    // A release names its binary `crio`; a versioned copy (`crio-1.35.6`) keeps the prefix.
    Target { name: "crio", by_comm: |c| c == "crio" || c.starts_with("crio-"), groups: CRIO },
];

/// The target a process with `comm` runs, if any.
pub fn target_of(comm: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| (t.by_comm)(comm))
}

/// The target called `name`.
pub fn target_named(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// A captured argument as text, if it looks like an id (printable ASCII
/// without spaces); anything else means the layout did not match.
pub fn arg_text(bytes: &[u8]) -> Option<String> {
    let ok = !bytes.is_empty() && bytes.iter().all(|b| b.is_ascii_graphic());
    ok.then(|| String::from_utf8_lossy(bytes).into_owned())
}

/// The lock a [`Role::LockHold`] call holds, in words (name, type): its [`Recv`]'s, else
/// containerd's Status lock (the receiver itself).
pub fn held_lock(recv: Option<Recv>) -> (&'static str, &'static str) {
    recv.map_or(("Status lock", "sync.RWMutex (CRI container Status)"), |r| r.lock)
}

/// `pkg.(*T).Method` without the import path.
pub fn short(symbol: &str) -> &str {
    symbol.rsplit('/').next().unwrap_or(symbol)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comms_pick_targets() {
        assert_eq!(target_of("containerd").map(|t| t.name), Some("containerd"));
        assert_eq!(target_of("containerd-shim").map(|t| t.name), Some("containerd-shim"));
        assert_eq!(target_of("kubelet").map(|t| t.name), Some("kubelet"));
        assert_eq!(target_of("fake-kubelet").map(|t| t.name), Some("kubelet"));
        assert_eq!(target_of("runc").map(|t| t.name), Some("runc"));
        assert_eq!(target_of("crio").map(|t| t.name), Some("crio"));
        assert_eq!(target_of("crio-1.35.6").map(|t| t.name), Some("crio"));
        assert!(target_of("criostat").is_none());
        assert!(target_of("containerd-stres").is_none());
        assert!(target_of("bash").is_none());
    }

    #[test]
    fn args_must_look_like_ids() {
        assert_eq!(arg_text(b"0123abcd"), Some("0123abcd".into()));
        assert_eq!(arg_text(b""), None);
        assert_eq!(arg_text(b"a b"), None);
        assert_eq!(arg_text(&[0x41, 0xff]), None);
    }

    #[test]
    fn every_group_has_one_role() {
        for t in TARGETS {
            for g in t.groups {
                assert!(!g.funcs.is_empty());
                assert!(g.funcs.iter().all(|s| s.role == g.funcs[0].role), "{:?}", g.funcs[0].symbol);
                let writer_wait = g.funcs[0].role == Role::LockWait && parks_a_writer(g.funcs[0].symbol);
                let nri = g.funcs[0].symbol.contains("/internal/nri.(*local).");
                let only_some =
                    g.funcs[0].symbol.contains("/sbserver.") || g.funcs[0].symbol.contains("(*LegacyManager).Set.") || writer_wait || nri;
                assert_eq!(g.optional, only_some, "{:?}", g.funcs[0].symbol);
                let go_runtime = g.funcs[0].symbol.starts_with("sync.") || g.funcs[0].symbol.starts_with("internal/sync.");
                assert_eq!(g.runtime, go_runtime, "{:?}", g.funcs[0].symbol);
            }
            assert!(t.groups.iter().any(|g| !g.runtime), "{}: matched by its own functions", t.name);
        }
    }

    #[test]
    fn only_the_fixture_gets_reader_waits_in_kubelet() {
        let gated: Vec<&Group> = TARGETS.iter().flat_map(|t| t.groups).filter(|g| g.only_with.is_some()).collect();
        assert_eq!(gated.len(), 1);
        assert_eq!(gated[0].only_with, Some(FIXTURE_READER_WAITS));
        assert!(gated[0].runtime && gated[0].funcs.iter().all(|f| f.role == Role::LockWait));
        // The relist alone otherwise: a real kubelet's probes are unchanged.
        let kubelet = target_named("kubelet").unwrap();
        assert_eq!(kubelet.groups.iter().filter(|g| g.only_with.is_none()).count(), 1);
    }

    #[test]
    fn each_park_names_its_semaphore_in_the_lock() {
        assert_eq!(sem_off("sync.runtime_SemacquireRWMutexR"), 12);
        assert_eq!(sem_off("sync.runtime_SemacquireMutex"), 12, "Go <= 1.19: taken as a reader");
        assert_eq!(sem_off("sync.runtime_SemacquireRWMutex"), 8);
        assert_eq!(sem_off("internal/sync.runtime_SemacquireMutex"), 4);
        // Only CRI-O gets the writer waits.
        for t in TARGETS {
            let writers = t.groups.iter().filter(|g| g.funcs.iter().any(|f| f.role == Role::LockWait && parks_a_writer(f.symbol))).count();
            assert_eq!(writers, if t.name == "crio" { 2 } else { 0 }, "{}", t.name);
        }
    }

    #[test]
    fn short_names() {
        assert_eq!(short("github.com/containerd/containerd/pkg/cri/server.handleContainerExit"), "server.handleContainerExit");
        assert_eq!(short("main.main"), "main.main");
    }
}
