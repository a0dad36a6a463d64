//! A blocking CRI v1 client over containerd's unix socket, a [`Pod`] guard, and
//! [`RelistDriver`], the stand-in for kubelet's PLEG relist.
//!
//! [`Cri`] owns a small tokio runtime and a tonic channel; each call blocks the calling
//! thread (so never call it from async code). Like kubelet, every request carries a deadline
//! (`grpc-timeout`), [`Cri::DEFAULT_TIMEOUT`] unless set otherwise, which containerd turns
//! into the context of the call it serves.

use std::collections::HashMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1 as api;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tokio::net::UnixStream;
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint, Uri};
use tower::service_fn;

pub use k8s_cri::v1::{
    Container, ContainerConfig, ContainerState, ContainerStatusResponse, LinuxContainerResources, PodSandbox, PodSandboxConfig,
};

/// A CRI client on one containerd socket. Cheap to clone (clones share the runtime and the
/// connection), and usable from any thread that is not itself running async code.
#[derive(Clone)]
pub struct Cri {
    rt: Arc<Runtime>,
    channel: Channel,
    socket: PathBuf,
    timeout: Duration,
}

impl std::fmt::Debug for Cri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cri").field("socket", &self.socket).field("timeout", &self.timeout).finish()
    }
}

impl Cri {
    /// kubelet's default `--runtime-request-timeout`.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);
    /// How long past its deadline the client itself waits for an answer before giving up.
    const CLIENT_GRACE: Duration = Duration::from_secs(5);

    /// Connects to the CRI server on `socket` (fails at once if nothing listens there).
    pub fn connect(socket: &Path) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cri-client")
            .enable_all()
            .build()
            .context("build a tokio runtime for the CRI client")?;
        let path = socket.to_path_buf();
        let channel = rt
            .block_on(async move {
                // The URI is a placeholder: the connector ignores it and dials the socket.
                Endpoint::try_from("http://[::]:50051")?
                    .connect_with_connector(service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move { Ok::<_, std::io::Error>(TokioIo::new(UnixStream::connect(path).await?)) }
                    }))
                    .await
            })
            .with_context(|| format!("connect to the CRI socket {}", socket.display()))?;
        Ok(Self { rt: Arc::new(rt), channel, socket: socket.to_path_buf(), timeout: Self::DEFAULT_TIMEOUT })
    }

    /// The same client with another per-request deadline.
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self { timeout, ..self.clone() }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs one runtime-service call and waits for its answer.
    fn runtime_call<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: FnOnce(RuntimeServiceClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = RuntimeServiceClient::new(self.channel.clone());
        self.wait(what, call(client, self.timeout))
    }

    fn image_call<T, F, Fut>(&self, what: &str, call: F) -> Result<T>
    where
        F: FnOnce(ImageServiceClient<Channel>, Duration) -> Fut,
        Fut: Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        let client = ImageServiceClient::new(self.channel.clone());
        self.wait(what, call(client, self.timeout))
    }

    fn wait<T>(&self, what: &str, answer: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>) -> Result<T> {
        let limit = self.timeout + Self::CLIENT_GRACE;
        self.rt.block_on(async {
            match tokio::time::timeout(limit, answer).await {
                Err(_) => bail!("CRI {what}: no answer within {limit:?}"),
                Ok(Err(status)) => Err(anyhow!("CRI {what} failed: {} ({:?})", status.message(), status.code())),
                Ok(Ok(response)) => Ok(response.into_inner()),
            }
        })
    }

    pub fn version(&self) -> Result<api::VersionResponse> {
        self.runtime_call("Version", |mut c, t| async move { c.version(req(api::VersionRequest::default(), t)).await })
    }

    /// Whether the runtime says its pod network is ready: `Status`'s `NetworkReady`
    /// condition (containerd: a CNI config is loaded, which its config watcher does a
    /// moment after the file is written).
    pub fn network_ready(&self) -> Result<bool> {
        let request = api::StatusRequest { verbose: false };
        let r = self.runtime_call("Status", |mut c, t| async move { c.status(req(request, t)).await })?;
        Ok(r.status.is_some_and(|s| s.conditions.iter().any(|c| c.r#type == "NetworkReady" && c.status)))
    }

    /// `RunPodSandbox` with the default runtime handler; returns the sandbox id.
    pub fn run_pod_sandbox(&self, config: &PodSandboxConfig) -> Result<String> {
        let request = api::RunPodSandboxRequest { config: Some(config.clone()), runtime_handler: String::new() };
        let r = self.runtime_call("RunPodSandbox", |mut c, t| async move { c.run_pod_sandbox(req(request, t)).await })?;
        Ok(r.pod_sandbox_id)
    }

    pub fn stop_pod_sandbox(&self, id: &str) -> Result<()> {
        let request = api::StopPodSandboxRequest { pod_sandbox_id: id.into() };
        self.runtime_call("StopPodSandbox", |mut c, t| async move { c.stop_pod_sandbox(req(request, t)).await }).map(drop)
    }

    pub fn remove_pod_sandbox(&self, id: &str) -> Result<()> {
        let request = api::RemovePodSandboxRequest { pod_sandbox_id: id.into() };
        self.runtime_call("RemovePodSandbox", |mut c, t| async move { c.remove_pod_sandbox(req(request, t)).await }).map(drop)
    }

    pub fn list_pod_sandbox(&self) -> Result<Vec<PodSandbox>> {
        let r = self.runtime_call("ListPodSandbox", |mut c, t| async move {
            c.list_pod_sandbox(req(api::ListPodSandboxRequest::default(), t)).await
        })?;
        Ok(r.items)
    }

    /// `CreateContainer` in sandbox `pod_id` (created from `sandbox`); returns its id.
    pub fn create_container(&self, pod_id: &str, config: &ContainerConfig, sandbox: &PodSandboxConfig) -> Result<String> {
        let request = api::CreateContainerRequest {
            pod_sandbox_id: pod_id.into(),
            config: Some(config.clone()),
            sandbox_config: Some(sandbox.clone()),
        };
        let r = self.runtime_call("CreateContainer", |mut c, t| async move { c.create_container(req(request, t)).await })?;
        Ok(r.container_id)
    }

    pub fn start_container(&self, id: &str) -> Result<()> {
        let request = api::StartContainerRequest { container_id: id.into() };
        self.runtime_call("StartContainer", |mut c, t| async move { c.start_container(req(request, t)).await }).map(drop)
    }

    /// `StopContainer`: the stop signal, then SIGKILL after `grace` (0: SIGKILL at once).
    pub fn stop_container(&self, id: &str, grace: Duration) -> Result<()> {
        let request = api::StopContainerRequest { container_id: id.into(), timeout: grace.as_secs() as i64 };
        self.runtime_call("StopContainer", |mut c, t| async move { c.stop_container(req(request, t)).await }).map(drop)
    }

    pub fn remove_container(&self, id: &str) -> Result<()> {
        let request = api::RemoveContainerRequest { container_id: id.into() };
        self.runtime_call("RemoveContainer", |mut c, t| async move { c.remove_container(req(request, t)).await }).map(drop)
    }

    pub fn list_containers(&self) -> Result<Vec<Container>> {
        let r = self.runtime_call("ListContainers", |mut c, t| async move {
            c.list_containers(req(api::ListContainersRequest::default(), t)).await
        })?;
        Ok(r.containers)
    }

    pub fn container_status(&self, id: &str, verbose: bool) -> Result<ContainerStatusResponse> {
        let request = api::ContainerStatusRequest { container_id: id.into(), verbose };
        self.runtime_call("ContainerStatus", |mut c, t| async move { c.container_status(req(request, t)).await })
    }

    /// The host PID of a running container's init process: containerd reports it in the
    /// verbose `ContainerStatus` info (`info["info"]`, JSON with `pid`).
    pub fn container_pid(&self, id: &str) -> Result<u32> {
        let status = self.container_status(id, true)?;
        let info = status.info.get("info").with_context(|| format!("ContainerStatus of {id} has no verbose info"))?;
        let info: serde_json::Value = serde_json::from_str(info).context("parse ContainerStatus info")?;
        info.get("pid")
            .and_then(serde_json::Value::as_u64)
            .filter(|&pid| pid > 0)
            .map(|pid| pid as u32)
            .with_context(|| format!("ContainerStatus info of {id} names no pid: {info}"))
    }

    /// The state of container `id` (`ContainerStatus`).
    pub fn container_state(&self, id: &str) -> Result<ContainerState> {
        let status = self.container_status(id, false)?;
        let state = status.status.context("ContainerStatus without status")?.state;
        ContainerState::try_from(state).map_err(|e| anyhow!("unknown container state: {e}"))
    }

    /// `UpdateContainerResources` with new Linux resources.
    pub fn update_container_resources(&self, id: &str, resources: &LinuxContainerResources) -> Result<()> {
        let request =
            api::UpdateContainerResourcesRequest { container_id: id.into(), linux: Some(resources.clone()), ..Default::default() };
        self.runtime_call("UpdateContainerResources", |mut c, t| async move { c.update_container_resources(req(request, t)).await })
            .map(drop)
    }

    /// `ListContainerStats` of every container: the number of stats returned.
    pub fn list_container_stats(&self) -> Result<usize> {
        let r = self.runtime_call("ListContainerStats", |mut c, t| async move {
            c.list_container_stats(req(api::ListContainerStatsRequest::default(), t)).await
        })?;
        Ok(r.stats.len())
    }

    /// `PullImage`: CRI-O pulls every image it runs (it has no import).
    pub fn pull_image(&self, image: &str) -> Result<String> {
        let request =
            api::PullImageRequest { image: Some(api::ImageSpec { image: image.into(), ..Default::default() }), ..Default::default() };
        let r = self.image_call("PullImage", |mut c, t| async move { c.pull_image(req(request, t)).await })?;
        Ok(r.image_ref)
    }

    /// Whether the CRI image service knows `image` (e.g. `docker.io/local/pause:1`).
    pub fn has_image(&self, image: &str) -> Result<bool> {
        let request = api::ImageStatusRequest { image: Some(api::ImageSpec { image: image.into(), ..Default::default() }), verbose: false };
        let r = self.image_call("ImageStatus", |mut c, t| async move { c.image_status(req(request, t)).await })?;
        Ok(r.image.is_some())
    }
}

fn req<T>(message: T, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    request
}

/// A pod sandbox config as kubelet would send it for a host-network pod: node network
/// namespace, no hostname (a host-network pod shares the node's UTS namespace, and runc
/// fails when asked to set one), a cgroup parent, and a log directory (created here).
pub fn host_network_pod(name: &str, cgroup_parent: &str, log_dir: &Path) -> Result<PodSandboxConfig> {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let uid = format!("{name}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed));
    let log_directory = log_dir.join(&uid);
    std::fs::create_dir_all(&log_directory).with_context(|| format!("create {}", log_directory.display()))?;
    Ok(PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata { name: name.into(), uid, namespace: "plegwatch".into(), attempt: 0 }),
        log_directory: log_directory.to_string_lossy().into_owned(),
        labels: HashMap::from([("app".into(), name.into())]),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: cgroup_parent.into(),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    pid: api::NamespaceMode::Container as i32,
                    ipc: api::NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// A container config running `argv` in `image`, logging to `NAME.log` in the pod's log
/// directory, with CPU shares and a CFS quota kubelet-like resources start from.
pub fn container(name: &str, image: &str, argv: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(api::ContainerMetadata { name: name.into(), attempt: 0 }),
        image: Some(api::ImageSpec { image: image.into(), ..Default::default() }),
        command: argv.iter().map(|a| a.to_string()).collect(),
        log_path: format!("{name}.log"),
        labels: HashMap::from([("container".into(), name.into())]),
        linux: Some(api::LinuxContainerConfig { resources: Some(resources(256, 100_000, 100_000)), security_context: None }),
        ..Default::default()
    }
}

/// Linux resources with these CPU shares, CFS period and quota (µs), the rest unset.
pub fn resources(cpu_shares: i64, cpu_period: i64, cpu_quota: i64) -> LinuxContainerResources {
    LinuxContainerResources { cpu_shares, cpu_period, cpu_quota, ..Default::default() }
}

/// A running pod sandbox. Dropping it stops and removes it (which removes its containers),
/// logging what fails; [`Pod::remove`] does the same and reports failures.
pub struct Pod {
    cri: Cri,
    id: String,
    config: PodSandboxConfig,
    removed: bool,
}

impl Pod {
    /// How long each teardown call may take on drop.
    const TEARDOWN_TIMEOUT: Duration = Duration::from_secs(30);

    /// `RunPodSandbox`.
    pub fn run(cri: &Cri, config: PodSandboxConfig) -> Result<Self> {
        let id = cri.run_pod_sandbox(&config)?;
        eprintln!("pod sandbox {} running: {id}", config.metadata.as_ref().map_or("?", |m| m.name.as_str()));
        Ok(Self { cri: cri.clone(), id, config, removed: false })
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn config(&self) -> &PodSandboxConfig {
        &self.config
    }

    /// `CreateContainer` in this pod; returns the container id.
    pub fn create_container(&self, config: &ContainerConfig) -> Result<String> {
        self.cri.create_container(&self.id, config, &self.config)
    }

    /// `CreateContainer` then `StartContainer`; returns the container id.
    pub fn run_container(&self, config: &ContainerConfig) -> Result<String> {
        let id = self.create_container(config)?;
        self.cri.start_container(&id)?;
        Ok(id)
    }

    /// `StopPodSandbox` then `RemovePodSandbox`.
    pub fn remove(mut self) -> Result<()> {
        self.removed = true;
        self.cri.stop_pod_sandbox(&self.id)?;
        self.cri.remove_pod_sandbox(&self.id)
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        if self.removed {
            return;
        }
        let cri = self.cri.with_timeout(crate::timing::scaled(Self::TEARDOWN_TIMEOUT));
        if let Err(e) = cri.stop_pod_sandbox(&self.id).and_then(|()| cri.remove_pod_sandbox(&self.id)) {
            eprintln!("cleanup: pod sandbox {}: {e:#}", self.id);
        }
    }
}

/// Which list call of a relist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ListCall {
    PodSandbox,
    Containers,
}

impl ListCall {
    pub fn method(self) -> &'static str {
        match self {
            Self::PodSandbox => "ListPodSandbox",
            Self::Containers => "ListContainers",
        }
    }
}

/// One list call the driver made, and how long it took.
#[derive(Clone, Debug)]
pub struct TimedCall {
    pub call: ListCall,
    /// Which relist it belongs to (0, 1, ...).
    pub relist: u64,
    pub started: Instant,
    pub latency: Duration,
    pub error: Option<String>,
}

impl TimedCall {
    pub fn ended(&self) -> Instant {
        self.started + self.latency
    }
}

/// Count, median and maximum latency of a set of calls.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatencyStats {
    pub count: usize,
    pub failed: usize,
    pub median: Duration,
    pub max: Duration,
}

impl LatencyStats {
    /// The stats of the `call` calls that `keep` accepts; `None` if there are none.
    pub fn of(calls: &[TimedCall], call: ListCall, keep: impl Fn(&TimedCall) -> bool) -> Option<Self> {
        let picked: Vec<&TimedCall> = calls.iter().filter(|c| c.call == call && keep(c)).collect();
        let mut latencies: Vec<Duration> = picked.iter().map(|c| c.latency).collect();
        latencies.sort();
        Some(Self {
            count: latencies.len(),
            failed: picked.iter().filter(|c| c.error.is_some()).count(),
            median: *latencies.get(latencies.len() / 2)?,
            max: *latencies.last()?,
        })
    }
}

impl std::fmt::Display for LatencyStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} calls ({} failed), median {:.1} ms, max {:.3} s",
            self.count,
            self.failed,
            self.median.as_secs_f64() * 1e3,
            self.max.as_secs_f64()
        )
    }
}

/// Stands in for kubelet's PLEG relist: on a task of its own, `ListPodSandbox` then
/// `ListContainers` (the two calls of kubelet's `GetPods`), then a pause of `period`
/// after the relist *ends* (kubelet runs relist with `wait.Until`, so a slow relist delays
/// the next one). Each call is timed. This is the CRI traffic only: there is no kubelet.
pub struct RelistDriver {
    cri: Cri,
    period: Duration,
    calls: Arc<Mutex<Vec<TimedCall>>>,
    in_flight: Arc<Mutex<Option<(ListCall, Instant)>>>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl RelistDriver {
    /// kubelet's relist period.
    pub const KUBELET_PERIOD: Duration = Duration::from_secs(1);

    pub fn start(cri: &Cri, period: Duration) -> Self {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let in_flight = Arc::new(Mutex::new(None));
        let (stop, mut stopped) = watch::channel(false);
        let channel = cri.channel.clone();
        let timeout = cri.timeout;
        let task = cri.rt.spawn({
            let calls = Arc::clone(&calls);
            let in_flight = Arc::clone(&in_flight);
            async move {
                let mut client = RuntimeServiceClient::new(channel);
                for relist in 0.. {
                    for call in [ListCall::PodSandbox, ListCall::Containers] {
                        let started = Instant::now();
                        *in_flight.lock().unwrap() = Some((call, started));
                        let error = match call {
                            ListCall::PodSandbox => {
                                client.list_pod_sandbox(req(api::ListPodSandboxRequest::default(), timeout)).await.err()
                            }
                            ListCall::Containers => client.list_containers(req(api::ListContainersRequest::default(), timeout)).await.err(),
                        };
                        let latency = started.elapsed();
                        *in_flight.lock().unwrap() = None;
                        calls.lock().unwrap().push(TimedCall {
                            call,
                            relist,
                            started,
                            latency,
                            error: error.map(|s| format!("{} ({:?})", s.message(), s.code())),
                        });
                    }
                    tokio::select! {
                        _ = stopped.changed() => break,
                        _ = tokio::time::sleep(period) => {}
                    }
                }
            }
        });
        Self { cri: cri.clone(), period, calls, in_flight, stop, task: Some(task) }
    }

    pub fn period(&self) -> Duration {
        self.period
    }

    /// Every call finished so far.
    pub fn calls(&self) -> Vec<TimedCall> {
        self.calls.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// The call under way, and since when.
    pub fn in_flight(&self) -> Option<(ListCall, Instant)> {
        self.in_flight.lock().ok().and_then(|f| *f)
    }

    /// Stops after the relist under way (waiting up to `timeout` for it) and returns every
    /// call made.
    pub fn stop(mut self, timeout: Duration) -> Vec<TimedCall> {
        let _ = self.stop.send(true);
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            let finished = self.cri.rt.block_on(async { tokio::time::timeout(timeout, task).await.is_ok() });
            if !finished {
                eprintln!("relist driver: a call was still under way after {timeout:?}; aborted it");
                abort.abort();
            }
        }
        self.calls()
    }
}

impl Drop for RelistDriver {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(call: ListCall, ms: u64) -> TimedCall {
        TimedCall { call, relist: 0, started: Instant::now(), latency: Duration::from_millis(ms), error: None }
    }

    #[test]
    fn stats_pick_one_call_kind() {
        let calls = [
            call(ListCall::Containers, 1),
            call(ListCall::PodSandbox, 900),
            call(ListCall::Containers, 3),
            call(ListCall::Containers, 20_000),
        ];
        let s = LatencyStats::of(&calls, ListCall::Containers, |_| true).unwrap();
        assert_eq!(s.count, 3);
        assert_eq!(s.median, Duration::from_millis(3));
        assert_eq!(s.max, Duration::from_millis(20_000));
        assert!(LatencyStats::of(&calls, ListCall::Containers, |c| c.latency.is_zero()).is_none());
    }

    #[test]
    fn host_network_pod_sets_no_hostname() {
        let dir = tempfile::tempdir().unwrap();
        let pod = host_network_pod("p", "/x", dir.path()).unwrap();
        assert!(pod.hostname.is_empty());
        let ns = pod.linux.unwrap().security_context.unwrap().namespace_options.unwrap();
        assert_eq!(ns.network, api::NamespaceMode::Node as i32);
        assert!(Path::new(&pod.log_directory).is_dir());
    }
}
