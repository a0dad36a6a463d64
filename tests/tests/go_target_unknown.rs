//! Binaries that look like a Go target but aren't one plegwatch knows: reported, left
//! alone, and every other probe goes on.
//! - the fake-kubelet FIXTURE (a stripped Go 1.19 program; not containerd) copied under the
//!   name `containerd`: a Go binary of an "unknown containerd version", with none of
//!   containerd's CRI functions;
//! - `/bin/sleep` copied as `containerd`: not a Go binary at all.
//!
//! plegwatch must print a `target` line `unmatched` for each with the reason, warn on stderr,
//! list them in `plegwatch doctor`, and still catch a parked relist of the real fixture.

use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::gofixture::{self, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::preflight::plegwatch_bin;
use plegwatch_scenarios::{preflight, Plegwatch};

/// Kills and reaps a child on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn copy_as_containerd(from: &Path, dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let to = dir.join("containerd");
    std::fs::copy(from, &to).with_context(|| format!("copying {} to {}", from.display(), to.display()))?;
    Ok(to)
}

#[test]
fn unknown_binaries_are_reported_and_left_alone() -> Result<()> {
    preflight::require();
    let fixture = gofixture::build_fake_kubelet()?;
    let base = std::env::temp_dir().join(format!("plegwatch-unknown-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let go_copy = copy_as_containerd(&fixture, &base.join("go"))?;
    let c_copy = copy_as_containerd(Path::new("/bin/sleep"), &base.join("c"))?;

    let mut plegwatch = Plegwatch::start(&["--warn", "1s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let t0 = Instant::now();
    let fake = FakeKubelet::start(&go_copy)?;
    let sleeper = Reaped(Command::new(&c_copy).arg("60").spawn().context("spawn the sleep copy")?);
    let (fake_pid, sleep_pid) = (fake.pid(), sleeper.0.id());
    for (pid, why) in [(fake_pid, "none of the expected functions"), (sleep_pid, "non-Go binary")] {
        let line = plegwatch.wait_for(Duration::from_secs(3), |e| e.is("target") && e.u64("/pid") == Some(u64::from(pid)));
        let all = dump(plegwatch.events(), t0);
        let line = line.unwrap_or_else(|| panic!("no target line for pid {pid}:\n{all}"));
        assert_eq!(line.str("/status"), Some("unmatched"), "{all}");
        assert_eq!(line.str("/target"), Some("containerd"), "{all}");
        assert!(line.str("/why").is_some_and(|w| w.contains(why)), "why should say {why:?}:\n{all}");
    }
    ensure!(plegwatch.wait_stderr("Go binary not probed", Duration::from_secs(2)), "no warning on stderr:\n{}", plegwatch.stderr());

    // doctor lists them too, without attaching anything.
    let out = Command::new(plegwatch_bin()?).args(["doctor", "--json"]).output().context("run doctor")?;
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).context("doctor --json output")?;
    let targets = report["go_targets"].as_array().cloned().unwrap_or_default();
    for (path, pid) in [(&go_copy, fake_pid), (&c_copy, sleep_pid)] {
        let t = targets
            .iter()
            .find(|t| t["binary"].as_str() == path.to_str())
            .unwrap_or_else(|| panic!("doctor does not list {}: {targets:?}", path.display()));
        assert_eq!(t["status"], "unmatched", "{t}");
        assert!(t["pids"].as_array().is_some_and(|p| p.iter().any(|x| x.as_u64() == Some(u64::from(pid)))), "{t}");
    }

    // The other probes go on: the real fixture's parked relist is caught.
    let mut kubelet = FakeKubelet::start(&fixture)?;
    let pid = kubelet.pid();
    // Found at its exec; a relist begun before its uprobes are on would not be seen.
    plegwatch.wait_probed(pid, Duration::from_secs(5))?;
    kubelet.block_next()?;
    kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist after block")?;
    let stall = plegwatch.wait_for(Duration::from_secs(4), |e| e.is_about_pid("stall", pid) && e.str("/kind") == Some("pleg_relist"));
    kubelet.release()?;
    let events = plegwatch.stop()?;
    ensure!(stall.is_some(), "no pleg_relist stall once unknown binaries were seen:\n{}", dump(&events, t0));
    ensure!(kubelet.quit()?.success(), "the fixture exited badly under the probes");
    ensure!(fake.quit()?.success(), "the copy named containerd exited badly");
    drop(sleeper);
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}
