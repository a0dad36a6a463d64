//! Health check of the containerd bed, with no plegwatch and no throttle, on every
//! [`Version`] the beds run: a private containerd (Debian's 1.6.20 with runc 1.1.5, or the
//! 1.7.34 and 2.3.4 release builds with runc 1.4.3, each with its own shim and `ctr`)
//! starts, imports the locally built images, and runs a host-network pod and a busybox
//! container over CRI as kubelet would (run, list, status, update, stop, remove, and a few
//! relists at kubelet's period), then shuts down leaving nothing behind: no shim, no mount,
//! no cgroup, no dir. The daemon, its shim and the runc its shim ran are checked to be the
//! version's own binaries.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::containerd::cri::{self, ContainerState, LatencyStats, ListCall};
use plegwatch_scenarios::containerd::image::{self, BUSYBOX};
use plegwatch_scenarios::containerd::{self, daemon, procs, Containerd, Placement, Pod, RelistDriver, Runc, Version};

/// The whole test should take well under this (about 3 s here).
const BUDGET: Duration = Duration::from_secs(20);
const MESSAGE: &str = "hello from busybox";

/// Debian's containerd 1.6.20 and runc 1.1.5.
#[test]
fn pod_and_container_lifecycle_over_cri() -> Result<()> {
    lifecycle(Version::DEBIAN)
}

/// The containerd 1.7.34 release build, its shim and runc 1.4.3.
#[test]
fn pod_and_container_lifecycle_over_cri_on_1_7() -> Result<()> {
    lifecycle(Version::V1_7)
}

/// The containerd 2.3.4 release build (config version 3), its shim and runc 1.4.3.
#[test]
fn pod_and_container_lifecycle_over_cri_on_2_3() -> Result<()> {
    lifecycle(Version::V2_3)
}

fn lifecycle(v: Version) -> Result<()> {
    if !containerd::require_version(v, &format!("containerd_cri_smoke on {v}")) {
        return Ok(());
    }
    let t0 = Instant::now();
    let daemon = Containerd::start_version(v, Placement::TempDir, Runc::Real)?;
    image::import_test_images(&daemon)?;
    let cri = daemon.cri()?.with_timeout(Duration::from_secs(30));
    let version = cri.version()?;
    assert_eq!(version.runtime_name, "containerd");
    assert_eq!(version.runtime_api_version, "v1");
    assert!(
        version.runtime_version.contains(v.containerd.number()),
        "CRI Version says {} {}, the bed wanted {v}",
        version.runtime_name,
        version.runtime_version
    );
    // The daemon runs the release binary, under the name plegwatch knows it by.
    let binaries = daemon.binaries().clone();
    assert_eq!(std::fs::read_link(format!("/proc/{}/exe", daemon.pid()))?, binaries.containerd);
    assert_eq!(procs::comm(daemon.pid()).as_deref(), Some("containerd"));
    let runc_version = plegwatch_scenarios::sys::run(std::process::Command::new(daemon.runc()).arg("--version"))?;
    assert!(
        runc_version.starts_with(&format!("runc version {}", v.runc.number())),
        "{} --version: {runc_version}",
        daemon.runc().display()
    );

    let pod = Pod::run(&cri, cri::host_network_pod("smoke", daemon.cgroup_parent(), &daemon.pod_log_dir())?)
        .with_context(|| daemon.log_tail(30))?;
    let script = format!("echo {MESSAGE}; exec sleep 600");
    let id = pod.run_container(&cri::container("hello", BUSYBOX, &["/bin/sh", "-c", &script])).with_context(|| daemon.log_tail(30))?;
    assert_eq!(cri.container_state(&id)?, ContainerState::ContainerRunning);

    // The shim: found by its -address, serving the pod, parent of the container's process.
    let pid = cri.container_pid(&id)?;
    let shims = daemon.shims();
    assert_eq!(shims.len(), 1, "one shim per pod expected: {shims:?}");
    let shim = &shims[0];
    assert_eq!(shim.id, pod.id(), "the shim serves the pod sandbox");
    assert_eq!(shim.namespace, containerd::K8S_NAMESPACE);
    // The version's own shim (found on the daemon's PATH; it re-executes itself by its real
    // path, so its comm is the first 15 bytes of either name: `containerd-shim`).
    assert_eq!(std::fs::read_link(format!("/proc/{}/exe", shim.pid))?, binaries.shim, "the shim is not {v}'s");
    assert_eq!(procs::comm(shim.pid).as_deref(), Some("containerd-shim"));
    assert_eq!(procs::ppid(pid), Some(shim.pid), "the shim is the container's parent");
    // Where the cleanup looks for a killed shim's socket: the rule must match containerd's.
    let shim_socket = daemon::shim_socket(daemon.socket(), &shim.namespace, &shim.id);
    assert!(
        std::fs::symlink_metadata(&shim_socket).is_ok_and(|m| m.file_type().is_socket()),
        "no shim socket at {}",
        shim_socket.display()
    );
    eprintln!("container {id} runs as pid {pid} under shim {}", shim.pid);

    let containers = cri.list_containers()?;
    assert!(containers.iter().any(|c| c.id == id && c.pod_sandbox_id == pod.id()), "ListContainers misses {id}: {containers:?}");
    let sandboxes = cri.list_pod_sandbox()?;
    assert!(sandboxes.iter().any(|s| s.id == pod.id()), "ListPodSandbox misses {}: {sandboxes:?}", pod.id());

    // The relist driver at kubelet's period: two relists in 1.5 s, each quick.
    let relist = RelistDriver::start(&cri, RelistDriver::KUBELET_PERIOD);
    thread::sleep(Duration::from_millis(1500));
    let calls = relist.stop(Duration::from_secs(5));
    for call in [ListCall::PodSandbox, ListCall::Containers] {
        let stats =
            LatencyStats::of(&calls, call, |_| true).with_context(|| format!("the relist driver made no {} call", call.method()))?;
        eprintln!("relist driver, {}: {stats}", call.method());
        assert!(stats.count == 2 && stats.failed == 0 && stats.max < Duration::from_secs(1), "{}: {stats}", call.method());
    }

    // With no I/O pressure, UpdateContainerResources is quick and reaches the cgroup.
    let t = Instant::now();
    cri.update_container_resources(&id, &cri::resources(512, 100_000, 50_000))?;
    let took = t.elapsed();
    assert!(took < Duration::from_secs(2), "UpdateContainerResources took {took:?}");
    let cpu = Path::new("/sys/fs/cgroup/cpu").join(daemon.cgroup_parent().trim_start_matches('/')).join(&id);
    if cpu.is_dir() {
        assert_eq!(read_trim(&cpu.join("cpu.shares"))?, "512");
        assert_eq!(read_trim(&cpu.join("cpu.cfs_quota_us"))?, "50000");
    } else {
        eprintln!("note: no {} to check the update against", cpu.display());
    }

    let log = PathBuf::from(&pod.config().log_directory).join("hello.log");
    wait_for(Duration::from_secs(5), || std::fs::read_to_string(&log).is_ok_and(|l| l.contains(MESSAGE)))
        .with_context(|| format!("{} never showed {MESSAGE:?}", log.display()))?;

    cri.stop_container(&id, Duration::ZERO)?;
    assert_eq!(cri.container_state(&id)?, ContainerState::ContainerExited);
    ensure!(!procs::alive(pid), "pid {pid} still alive after StopContainer");
    cri.remove_container(&id)?;
    ensure!(!cri.list_containers()?.iter().any(|c| c.id == id), "container {id} still listed after RemoveContainer");

    let shim_pid = shim.pid;
    let pod_id = pod.id().to_string();
    pod.remove()?;
    ensure!(cri.list_pod_sandbox()?.iter().all(|s| s.id != pod_id), "pod {pod_id} still listed after RemovePodSandbox");
    wait_for(Duration::from_secs(5), || !procs::alive(shim_pid))
        .with_context(|| format!("shim {shim_pid} still runs after the pod was removed"))?;
    assert!(!shim_socket.exists(), "{} outlived its shim", shim_socket.display());

    // The config is the version's own: no key of it was ignored or refused.
    let log = std::fs::read_to_string(daemon.log_path())?;
    let complaints: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("level=warning") || l.contains("level=error"))
        .filter(|l| {
            let l = l.to_ascii_lowercase();
            l.contains("unknown key") || l.contains("deprecated") || l.contains("failed to load plugin")
        })
        .collect();
    assert!(complaints.is_empty(), "containerd complained about its config:\n{}", complaints.join("\n"));

    // Clean shutdown: containerd gone, and nothing of it left.
    let (dir, socket, cgroup) = (daemon.dir().to_path_buf(), daemon.socket().to_path_buf(), daemon.cgroup_parent().to_string());
    drop(cri);
    drop(daemon);
    assert!(!dir.exists(), "{} was not removed", dir.display());
    assert!(procs::shims_of(&socket).is_empty(), "shims of {} remain", socket.display());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")?;
    assert!(!mountinfo.contains(&*dir.to_string_lossy()), "mounts under {} remain", dir.display());
    for ctl in ["cpu", "memory", "pids", "blkio"] {
        let leftover = Path::new("/sys/fs/cgroup").join(ctl).join(cgroup.trim_start_matches('/'));
        assert!(!leftover.exists(), "cgroup {} remains", leftover.display());
    }

    let took = t0.elapsed();
    eprintln!("smoke test took {:.2}s", took.as_secs_f64());
    assert!(took < BUDGET, "the smoke test took {took:?} (budget {BUDGET:?})");
    Ok(())
}

fn read_trim(path: &Path) -> Result<String> {
    Ok(std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?.trim().to_string())
}

fn wait_for(timeout: Duration, mut done: impl FnMut() -> bool) -> Result<()> {
    let deadline = Instant::now() + timeout;
    while !done() {
        ensure!(Instant::now() < deadline, "not within {timeout:?}");
        thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}
