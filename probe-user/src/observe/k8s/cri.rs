//! Pod and container names from the runtime over CRI (`--runtime-endpoint`),
//! asked on a thread of its own and kept in a table the scan only reads.
//!
//! plegwatch runs exactly when the CRI may be stuck: containerd#9770's
//! `ListContainers` blocks behind a container's Status lock, and a call that
//! times out on our side stays blocked in containerd. So:
//! - no CRI call is ever made on the scan loop: [`CriNames::sandbox`] and
//!   [`CriNames::container`] read the last table, and a miss only pokes the
//!   worker;
//! - the worker makes one call at a time (ListPodSandbox, then
//!   ListContainers), each with a 2 s deadline; it refreshes every
//!   [`REFRESH`] and on a poke, never more often than [`MIN_GAP`];
//! - after a call fails or times out, it waits [`BACKOFF_MIN`], doubling up
//!   to [`BACKOFF_MAX`], before asking again: a stuck runtime gets a call
//!   every few minutes at most, not one per scan. The table it had stays.

use super::bundle::Names;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::{self as api, runtime_service_client::RuntimeServiceClient};
use std::{
    collections::HashMap,
    path::PathBuf,
    sync::{
        mpsc::{self, RecvTimeoutError, SyncSender},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};
use tonic::transport::{Channel, Endpoint, Uri};

/// containerd's CRI socket.
pub const DEFAULT_ENDPOINT: &str = "unix:///run/containerd/containerd.sock";
/// Each call's deadline.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the table is refreshed while the runtime answers.
const REFRESH: Duration = Duration::from_secs(30);
/// The least time between two refreshes, however often a miss pokes.
const MIN_GAP: Duration = Duration::from_secs(5);
/// After a failed refresh: the first pause, and the longest.
const BACKOFF_MIN: Duration = Duration::from_secs(30);
const BACKOFF_MAX: Duration = Duration::from_secs(300);

/// `--runtime-endpoint` made a socket path: `unix:///path` or `/path`.
#[derive(Debug, thiserror::Error)]
#[error("--runtime-endpoint {0:?}: want unix:///path/to/socket")]
pub struct BadEndpoint(String);

/// The socket path of a CRI endpoint.
pub fn socket_path(endpoint: &str) -> Result<PathBuf, BadEndpoint> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(BadEndpoint(endpoint.to_string()))
    }
}

/// What the runtime last said: sandbox id → pod names, container id → names.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub sandboxes: HashMap<String, Names>,
    pub containers: HashMap<String, Names>,
}

impl Table {
    /// Joins ListPodSandbox's and ListContainers' answers.
    pub fn build(sandboxes: &[api::PodSandbox], containers: &[api::Container]) -> Self {
        let mut t = Table::default();
        for s in sandboxes {
            let Some(m) = &s.metadata else { continue };
            let n = Names {
                pod: Some(m.name.clone()).filter(|s| !s.is_empty()),
                namespace: Some(m.namespace.clone()).filter(|s| !s.is_empty()),
                pod_uid: Some(m.uid.clone()).filter(|s| !s.is_empty()),
                container: None,
            };
            t.sandboxes.insert(s.id.clone(), n);
        }
        for c in containers {
            let mut n = t.sandboxes.get(&c.pod_sandbox_id).cloned().unwrap_or_default();
            n.container = c.metadata.as_ref().map(|m| m.name.clone()).filter(|s| !s.is_empty());
            t.containers.insert(c.id.clone(), n);
        }
        t
    }
}

/// The worker's handle: the table, and a way to ask for a refresh.
pub struct CriNames {
    table: Arc<Mutex<Table>>,
    poke: SyncSender<()>,
}

impl CriNames {
    /// Starts the worker on `socket`; it connects (and reconnects) on its own.
    pub fn start(socket: PathBuf) -> std::io::Result<Self> {
        let table = Arc::new(Mutex::new(Table::default()));
        let (poke, rx) = mpsc::sync_channel(1);
        let shared = Arc::clone(&table);
        std::thread::Builder::new().name("cri-names".into()).spawn(move || run(socket, shared, rx))?;
        Ok(CriNames { table, poke })
    }

    /// The pod of sandbox `id`, if the last answer had it (else a refresh is asked for).
    pub fn sandbox(&self, id: &str) -> Option<Names> {
        self.look(|t| t.sandboxes.get(id).cloned())
    }

    /// The names of container `id`, if the last answer had it (else a refresh is asked for).
    pub fn container(&self, id: &str) -> Option<Names> {
        self.look(|t| t.containers.get(id).cloned())
    }

    fn look(&self, f: impl FnOnce(&Table) -> Option<Names>) -> Option<Names> {
        let found = self.table.lock().ok().and_then(|t| f(&t));
        if found.is_none() {
            // Full means a refresh is asked for already.
            let _ = self.poke.try_send(());
        }
        found
    }
}

fn run(socket: PathBuf, table: Arc<Mutex<Table>>, rx: mpsc::Receiver<()>) {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return tracing::warn!(error = %e, "CRI names: no runtime for the client; pod names come from bundles only"),
    };
    let channel = match channel(&socket, &rt) {
        Ok(c) => c,
        Err(e) => return tracing::warn!(error = %e, "CRI names: bad endpoint; pod names come from bundles only"),
    };
    let mut client = RuntimeServiceClient::new(channel);
    let mut last: Option<Instant> = None;
    let mut backoff = Duration::ZERO;
    let mut failing = false;
    loop {
        let wait = match last {
            None => Duration::ZERO,
            Some(at) => (at + REFRESH.max(backoff)).saturating_duration_since(Instant::now()),
        };
        match rx.recv_timeout(wait) {
            Ok(()) => {
                // A miss: refresh unless one was made lately or the runtime is backed off.
                if last.is_some_and(|at| at.elapsed() < MIN_GAP.max(backoff)) {
                    continue;
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        last = Some(Instant::now());
        match rt.block_on(refresh(&mut client)) {
            Ok(t) => {
                if failing {
                    tracing::info!(sandboxes = t.sandboxes.len(), containers = t.containers.len(), "CRI names: the runtime answers again");
                }
                failing = false;
                backoff = Duration::ZERO;
                if let Ok(mut cur) = table.lock() {
                    *cur = t;
                }
            }
            Err(e) => {
                backoff = (backoff * 2).clamp(BACKOFF_MIN, BACKOFF_MAX);
                // No socket at all is a node without that runtime (or not yet): not worth a
                // warning on a quiet start. A socket that does not answer is.
                if !failing && !socket.exists() {
                    tracing::info!(socket = %socket.display(), retry_s = backoff.as_secs(), "CRI names: no runtime socket; pod names come from bundles until one answers");
                } else if !failing {
                    tracing::warn!(socket = %socket.display(), error = %e, retry_s = backoff.as_secs(), "CRI names: no answer; pod names come from bundles until it answers");
                }
                failing = true;
            }
        }
    }
}

/// A lazily connected channel to the unix socket (the URI is a placeholder).
fn channel(socket: &std::path::Path, rt: &tokio::runtime::Runtime) -> Result<Channel, tonic::transport::Error> {
    let _guard = rt.enter();
    let path = socket.to_path_buf();
    let ep = Endpoint::from_static("http://[::]:50051").connect_timeout(CALL_TIMEOUT).timeout(CALL_TIMEOUT);
    Ok(ep.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) }
    })))
}

/// The error of one refresh, in words.
#[derive(Debug, thiserror::Error)]
enum RefreshError {
    #[error("{0}: no answer within {CALL_TIMEOUT:?}")]
    Timeout(&'static str),
    #[error("{0}: {1}")]
    Status(&'static str, String),
}

async fn call<T>(
    what: &'static str,
    f: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, RefreshError> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Err(_) => Err(RefreshError::Timeout(what)),
        Ok(Err(s)) => Err(RefreshError::Status(what, format!("{} ({:?})", s.message(), s.code()))),
        Ok(Ok(r)) => Ok(r.into_inner()),
    }
}

fn request<T>(m: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(m);
    r.set_timeout(CALL_TIMEOUT);
    r
}

async fn refresh(client: &mut RuntimeServiceClient<Channel>) -> Result<Table, RefreshError> {
    let pods = call("ListPodSandbox", client.list_pod_sandbox(request(api::ListPodSandboxRequest::default()))).await?;
    let ctrs = call("ListContainers", client.list_containers(request(api::ListContainersRequest::default()))).await?;
    Ok(Table::build(&pods.items, &ctrs.containers))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert_eq!(socket_path(DEFAULT_ENDPOINT).unwrap(), PathBuf::from("/run/containerd/containerd.sock"));
        assert_eq!(socket_path("/tmp/c.sock").unwrap(), PathBuf::from("/tmp/c.sock"));
        assert!(socket_path("tcp://1.2.3.4:1").is_err());
        assert!(socket_path("unix://relative").is_err());
    }

    #[test]
    fn a_table_joins_containers_to_their_pods() {
        let pods = [api::PodSandbox {
            id: "sb".into(),
            metadata: Some(api::PodSandboxMetadata { name: "web-0".into(), uid: "u-1".into(), namespace: "shop".into(), attempt: 0 }),
            ..Default::default()
        }];
        let ctrs = [
            api::Container {
                id: "c1".into(),
                pod_sandbox_id: "sb".into(),
                metadata: Some(api::ContainerMetadata { name: "app".into(), attempt: 0 }),
                ..Default::default()
            },
            api::Container {
                id: "c2".into(),
                pod_sandbox_id: "gone".into(),
                metadata: Some(api::ContainerMetadata { name: "orphan".into(), attempt: 0 }),
                ..Default::default()
            },
        ];
        let t = Table::build(&pods, &ctrs);
        assert_eq!(t.sandboxes["sb"].pod.as_deref(), Some("web-0"));
        assert_eq!(t.sandboxes["sb"].container, None);
        let c1 = &t.containers["c1"];
        assert_eq!(
            (c1.pod.as_deref(), c1.namespace.as_deref(), c1.pod_uid.as_deref(), c1.container.as_deref()),
            (Some("web-0"), Some("shop"), Some("u-1"), Some("app"))
        );
        assert_eq!((t.containers["c2"].pod.as_deref(), t.containers["c2"].container.as_deref()), (None, Some("orphan")));
    }

    #[test]
    fn a_runtime_that_is_not_there_is_a_miss() {
        let dir = tempfile::tempdir().unwrap();
        let names = CriNames::start(dir.path().join("none.sock")).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(names.container("c1"), None);
        assert_eq!(names.sandbox("sb"), None);
    }
}
