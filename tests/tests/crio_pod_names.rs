//! Pod names for CRI-O's containers, from their cgroups: a process in a CRI-O container,
//! stalled in `sync` behind a slow volume, is reported with its pod, namespace and container.
//!
//! Real CRI-O 1.35.6, conmon 2.1.6 and runc 1.1.5 (see `plegwatch_scenarios::crio`). A pod
//! (namespace `plegwatch`) runs a busybox container `syncer` with a host directory on a loop
//! ext4 as its volume; the disk's writes are throttled. On the test's word the container
//! writes 6 MiB there and runs `sync`: 6 s at the throttle's pace (the flusher's writeback,
//! which cgroup v1 charges to the root blkio cgroup, where the limit is), past `--warn 2s`.
//! plegwatch must name the `sync` (a child of the container's shell, not a process CRI-O
//! knows) by its cgroup: CRI-O's `crio-<id>` (cgroupfs driver) or
//! `crio-<id>.scope` (systemd driver, on a private bus with a systemd stand-in, as in
//! `crio_systemd_dbus`), the container id, and the names CRI-O's answers give it.

use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use k8s_cri::v1 as api;
use plegwatch_scenarios::containerd::cri::{container, Pod};
use plegwatch_scenarios::containerd::issue9770::syncfs;
use plegwatch_scenarios::containerd::systemd_dbus::{self, FakeSystemd, NodeRun, BUS_SOCKET};
use plegwatch_scenarios::crio::{Crio, Setup, BUSYBOX_REPO};
use plegwatch_scenarios::dbus::PrivateBus;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::throttle::WriteThrottle;
use plegwatch_scenarios::{preflight, LoopFs, Plegwatch};

const SCENARIO: &str = "crio_pod_names";
const WARN: Duration = Duration::from_secs(2);
/// What the container writes and syncs, and how fast the disk takes it: about 6 s.
const SYNC_MIB: u64 = 6;
const THROTTLE_BPS: u64 = 1 << 20;
const DISK_SIZE: u64 = 64 << 20;
/// How long the container may take to finish its sync once told to start.
const SYNC_TIMEOUT: Duration = Duration::from_secs(60);

#[test]
fn a_container_stalled_in_sync_is_named_by_its_crio_cgroup() -> Result<()> {
    names_by_cgroup(false)
}

#[test]
fn a_container_stalled_in_sync_is_named_by_its_crio_scope() -> Result<()> {
    names_by_cgroup(true)
}

fn names_by_cgroup(systemd: bool) -> Result<()> {
    preflight::require();
    let scenario = format!("{SCENARIO} ({} driver)", if systemd { "systemd" } else { "cgroupfs" });
    if let Some(why) = Crio::missing().or_else(WriteThrottle::unavailable) {
        preflight::skip(&scenario, &why);
        return Ok(());
    }
    if systemd {
        systemd_dbus::require();
    }
    // The volume's disk first: the namespace below copies the mount table as it is.
    let fs = LoopFs::new(DISK_SIZE)?;
    let vol = fs.mount_point().join("vol");
    std::fs::create_dir_all(&vol)?;
    let ns = if systemd { Some(NodeRun::start()?) } else { None };
    let bus = match &ns {
        Some(ns) => {
            Some(PrivateBus::start_listening(ns.command("dbus-daemon"), Path::new(BUS_SOCKET), &ns.host_path("dbus/system_bus_socket"))?)
        }
        None => None,
    };
    let _systemd = match (&ns, &bus) {
        (Some(ns), Some(bus)) => Some(FakeSystemd::start(ns, bus)?),
        _ => None,
    };
    let crio = Crio::start_with(Setup { systemd_ns: ns.as_ref().map(NodeRun::pid), ..Setup::default() })?;
    let cri = crio.cri().clone();
    // In a cgroup parent of the bed's own: on cgroup v2 the write limit goes on it.
    let sandbox = crio.pod_config("criopodnames", crio.cgroup_parent())?;
    let pod = Pod::run(&cri, sandbox)?;
    let image = crio.image(BUSYBOX_REPO);
    let script = format!(
        "while [ ! -e /vol/go ]; do sleep 0.1; done; dd if=/dev/zero of=/vol/data bs=1M count={SYNC_MIB} 2>/dev/null; sync; \
         touch /vol/done; exec sleep 100000"
    );
    let mut config = container("syncer", &image, &["/bin/sh", "-c", &script]);
    if let Some(i) = config.image.as_mut() {
        // CRI-O checks the image's signature policy against the name the user gave.
        i.user_specified_image = image.clone();
    }
    config.mounts.push(api::Mount { container_path: "/vol".into(), host_path: vol.to_string_lossy().into_owned(), ..Default::default() });
    let ctr = pod.run_container(&config)?;
    let ctr_pid = cri.container_pid(&ctr).with_context(|| format!("the pid of container {}", &ctr[..12]))?;
    let cgroup = std::fs::read_to_string(format!("/proc/{ctr_pid}/cgroup")).unwrap_or_default();
    let want_element = if systemd { format!("crio-{ctr}.scope") } else { format!("crio-{ctr}") };
    ensure!(cgroup.contains(&want_element), "container pid {ctr_pid} is not in a {want_element} cgroup:\n{cgroup}");

    let endpoint = format!("unix://{}", crio.socket().display());
    let warn = format!("{}ms", WARN.as_millis());
    let mut plegwatch = Plegwatch::start(&["--warn", &warn, "--runtime-endpoint", &endpoint])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    // Only what the container writes is to be dirty when the throttle goes on.
    syncfs(fs.mount_point())?;
    let throttle = WriteThrottle::for_cgroup(fs.dev(), THROTTLE_BPS, crio.cgroup_parent())?;
    let sent = Instant::now();
    std::fs::write(vol.join("go"), b"")?;
    let stall = plegwatch.wait_for(plegwatch_scenarios::timing::scaled(Duration::from_secs(15)), |e| {
        e.is("stall") && e.str("/comm") == Some("sync") && e.str("/kind") == Some("sync")
    });
    let deadline = sent + plegwatch_scenarios::timing::scaled(SYNC_TIMEOUT);
    while !vol.join("done").exists() {
        ensure!(Instant::now() < deadline, "the container's sync did not finish within {SYNC_TIMEOUT:?}");
        thread::sleep(Duration::from_millis(50));
    }
    let synced = sent.elapsed();
    drop(throttle);
    let events = plegwatch.stop()?;
    let all = || plegwatch_scenarios::events::dump(&events, sent);
    let stall = stall.with_context(|| format!("no sync stall line for the container's sync (it synced for {synced:?}):\n{}", all()))?;
    let field = |k: &str| stall.str(k).map(str::to_string);
    assert_eq!(
        (field("/pod"), field("/namespace"), field("/container"), field("/container_id")),
        (Some("criopodnames".into()), Some("plegwatch".into()), Some("syncer".into()), Some(ctr.clone())),
        "the sync's stall line should name its pod, namespace, container and id:\n{}",
        stall.json
    );
    eprintln!(
        "{scenario}: the container's sync wrote {SYNC_MIB} MiB for {:.1}s; plegwatch's stall line (pid {}, cgroup {want_element}) names {}/{}/{}",
        synced.as_secs_f64(),
        stall.u64("/pid").unwrap_or(0),
        field("/namespace").unwrap_or_default(),
        field("/pod").unwrap_or_default(),
        field("/container").unwrap_or_default(),
    );
    drop(pod);
    Ok(())
}
