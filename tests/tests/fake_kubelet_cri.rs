//! The fake-kubelet fixture (a Go test program, not kubelet; see
//! `plegwatch_scenarios::gofixture`) in CRI mode against the bed's real containerd 1.6.20:
//! each relist calls `ListPodSandbox` and `ListContainers` over gRPC on containerd's socket,
//! as kubelet's generic PLEG does. The counts it reports must be what the test's own CRI
//! client (k8s-cri) sees, follow a container started mid-run, and its calls must be quick on
//! an idle containerd; `block`, `release`, `health` and `quit` work as in the fake mode.
//!
//! Needs root and the bed's tools (containerd, runc, busybox-static) and the fixture's build
//! (golang-go, protoc, protoc-gen-go, protoc-gen-go-grpc, Debian's Go gRPC sources); a missing
//! one fails the test, naming it. No plegwatch.

use std::thread;
use std::time::Duration;

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::containerd::bed::Stage;
use plegwatch_scenarios::containerd::cri::{self, Cri};
use plegwatch_scenarios::containerd::image::BUSYBOX;
use plegwatch_scenarios::containerd::{self, Placement, Runc};
use plegwatch_scenarios::gofixture::{self, CriListed, FakeKubelet};

const PERIOD: &str = "500ms";
/// Each CRI call's deadline (`--runtime-request-timeout`): short, so a hang shows as an error.
const REQUEST_TIMEOUT: &str = "10s";
/// Relists to compare one by one with the test's own listing.
const COMPARED: usize = 5;
/// On an idle containerd a list call takes about a millisecond.
const IDLE_LIMIT: Duration = Duration::from_secs(1);
const WAIT: Duration = Duration::from_secs(5);

#[test]
fn fake_kubelet_relists_over_cri_against_containerd() -> Result<()> {
    containerd::require();
    let bin = gofixture::build_fake_kubelet()?;

    let stage = Stage::start(Placement::TempDir, Runc::Real, "fk-cri")?;
    let cri = stage.cri().with_timeout(Duration::from_secs(30));
    let sleeper = |name: &str| cri::container(name, BUSYBOX, &["/bin/sh", "-c", "exec sleep 600"]);
    let first = stage.pod().run_container(&sleeper("sleeper-a")).with_context(|| stage.containerd().log_tail(30))?;
    eprintln!("container {first} runs in pod {}", stage.pod().id());

    let endpoint = format!("unix://{}", stage.containerd().socket().display());
    let mut kubelet = FakeKubelet::start_cri(&bin, &endpoint, &["--period", PERIOD, "--runtime-request-timeout", REQUEST_TIMEOUT])?;

    // Relist after relist, the fixture sees what our own client sees: one sandbox, one
    // container, grouped into one pod.
    let mut seen: Vec<CriListed> = Vec::new();
    let mut after = 0;
    while seen.len() < COMPARED {
        let relist = kubelet
            .wait_cri_relist(after, WAIT)
            .with_context(|| format!("no CRI relist after relist {after}: {:?}", kubelet.transcript()))?;
        let listed = relist.result.clone().map_err(|f| anyhow::anyhow!("relist {}: {} failed: {}", relist.n, f.method, f.error))?;
        let own = own_counts(&cri)?;
        ensure!(
            (listed.sandboxes, listed.containers) == own && own == (1, 1),
            "relist {}: the fixture saw {} sandboxes and {} containers, our client {own:?} \
             (expected (1, 1))",
            relist.n,
            listed.sandboxes,
            listed.containers
        );
        kubelet.wait_relist_end(relist.n, WAIT).with_context(|| format!("relist {} did not end", relist.n))?;
        let end = end_line(&kubelet, relist.n)?;
        ensure!(end.contains(" pods=1 ") && !end.contains("err="), "relist {}: {end:?}, expected one pod and no error", relist.n);
        after = relist.n;
        seen.push(listed);
    }
    // Consecutive relists, one period apart.
    ensure!(
        after as usize == COMPARED,
        "the first {COMPARED} CRI relists were not relists 1..={COMPARED} (last {after}): {:?}",
        kubelet.transcript()
    );

    // A second container: the first relist that starts after it runs lists it.
    let second = stage.pod().run_container(&sleeper("sleeper-b"))?;
    let since = gofixture::monotonic_now();
    let next = kubelet.wait_relist_started_since(since, WAIT).context("no relist started after the second container")?;
    let relist = kubelet.wait_cri_relist(next - 1, WAIT).context("no CRI relist after the second container started")?;
    let listed = relist.result.clone().map_err(|f| anyhow::anyhow!("relist {}: {} failed: {}", relist.n, f.method, f.error))?;
    let own = own_counts(&cri)?;
    ensure!(
        (listed.sandboxes, listed.containers) == own && own == (1, 2),
        "relist {} after {second} started: the fixture saw {} sandboxes and {} containers, our \
         client {own:?} (expected (1, 2))",
        relist.n,
        listed.sandboxes,
        listed.containers
    );
    seen.push(listed);

    // Quick on an idle containerd.
    let stats = |pick: fn(&CriListed) -> Duration| {
        let mut v: Vec<Duration> = seen.iter().map(pick).collect();
        v.sort();
        (v[v.len() / 2], v[v.len() - 1])
    };
    let (sb_median, sb_max) = stats(|l| l.list_pod_sandbox);
    let (ct_median, ct_max) = stats(|l| l.list_containers);
    eprintln!(
        "fake-kubelet CRI relists ({} of them): ListPodSandbox median {sb_median:?} max \
         {sb_max:?}; ListContainers median {ct_median:?} max {ct_max:?}",
        seen.len()
    );
    ensure!(
        ct_max < IDLE_LIMIT && sb_max < IDLE_LIMIT,
        "CRI calls on an idle containerd took up to {ct_max:?} (ListContainers) and {sb_max:?} \
         (ListPodSandbox); limit {IDLE_LIMIT:?}"
    );

    // `block` parks the next relist before its CRI calls; `release` lets them run.
    kubelet.block_next()?;
    let blocked = kubelet.wait_relist_start(WAIT).context("no relist started after `block`")?;
    thread::sleep(Duration::from_millis(1500));
    ensure!(
        kubelet.relist(blocked).and_then(|r| r.blocking).is_some(),
        "relist {blocked} never said it parked: {:?}",
        kubelet.relist(blocked)
    );
    ensure!(
        kubelet.cri_relist(blocked).is_none() && kubelet.wait_relist_end(blocked, Duration::ZERO).is_none(),
        "the parked relist {blocked} went on: {:?}",
        kubelet.cri_relist(blocked)
    );
    let (ok, message) = kubelet.healthy()?;
    ensure!(ok, "Healthy() said {message:?} 1.5 s into a parked relist");
    kubelet.release()?;
    let released = kubelet.wait_cri_relist(blocked - 1, WAIT).context("the released relist made no CRI calls")?;
    ensure!(released.n == blocked && released.result.is_ok(), "after the release: {released:?} (expected relist {blocked}, answered)");
    kubelet.wait_relist_end(blocked, WAIT).context("the released relist did not end")?;

    let status = kubelet.quit()?;
    ensure!(status.success(), "fake-kubelet exited {status}");
    Ok(())
}

/// (sandboxes, containers) as the test's own k8s-cri client lists them.
fn own_counts(cri: &Cri) -> Result<(usize, usize)> {
    Ok((cri.list_pod_sandbox()?.len(), cri.list_containers()?.len()))
}

fn end_line(kubelet: &FakeKubelet, n: u64) -> Result<String> {
    let prefix = format!("relist end {n} ");
    kubelet.transcript().into_iter().find(|l| l.starts_with(&prefix)).with_context(|| format!("no `{prefix}…` line"))
}
