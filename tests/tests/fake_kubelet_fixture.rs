//! The fake-kubelet fixture itself (a Go test program, not kubelet; see
//! `plegwatch_scenarios::gofixture`): it builds stripped and still carries kubelet's relist
//! symbol, relists every second, and parks one relist on command and lets it go.
//!
//! Unlike the scenarios, this needs neither root nor plegwatch, only `go` (golang-go).

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use plegwatch_scenarios::gofixture::{self, FakeKubelet, RELIST_SYMBOL};

const BLOCK_FOR: Duration = Duration::from_secs(3);

#[test]
fn fake_kubelet_relists_blocks_and_releases() -> Result<()> {
    let bin = gofixture::build_fake_kubelet()?;
    let bytes = std::fs::read(&bin)?;
    gofixture::check_binary(&bytes)?;
    eprintln!("{} is {} bytes, stripped, and names {RELIST_SYMBOL}", bin.display(), bytes.len());
    // Building again in the same process is free and gives the same binary.
    assert_eq!(gofixture::build_fake_kubelet()?, bin);

    let mut kubelet = FakeKubelet::start(&bin)?;

    // Relists tick every ~1 s: the next one starts one period after the previous ended.
    let first = kubelet.wait_relist_start(Duration::from_secs(3)).context("no first relist")?;
    ensure!(kubelet.wait_relist_end(first, Duration::from_secs(2)).is_some(), "relist {first} did not end");
    let second = kubelet.wait_relist_start(Duration::from_secs(3)).context("no second relist")?;
    ensure!(second == first + 1, "relist {second} after {first}");
    let third = kubelet.wait_relist_start(Duration::from_secs(3)).context("no third relist")?;
    ensure!(third == second + 1, "relist {third} after {second}");
    let (a, b, c) = (kubelet.relist(first).unwrap(), kubelet.relist(second).unwrap(), kubelet.relist(third).unwrap());
    for (x, y) in [(a, b), (b, c)] {
        let gap = y.start - x.start;
        ensure!((0.9..1.5).contains(&gap), "relists {} and {} started {gap:.3} s apart, not ~1 s", x.n, y.n);
    }
    let (ok, message) = kubelet.healthy()?;
    ensure!(ok, "Healthy() said {message:?} while relisting");

    // Park the next relist for BLOCK_FOR.
    kubelet.block_next()?;
    let blocked = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after `block`")?;
    ensure!(blocked > third, "relist {blocked} after {third}");
    let parked_at = Instant::now();
    ensure!(kubelet.wait_relist_end(blocked, BLOCK_FOR).is_none(), "the blocked relist {blocked} ended: {:?}", kubelet.relist(blocked));
    ensure!(kubelet.is_running(), "fake-kubelet exited with a relist parked");
    ensure!(kubelet.relist(blocked).and_then(|r| r.blocking).is_some(), "relist {blocked} never said it parked");
    // Relists never overlap: nothing else started meanwhile.
    ensure!(kubelet.relist(blocked + 1).is_none(), "relist {} started while {blocked} was parked", blocked + 1);
    // Still well under the 3 min threshold.
    let (ok, message) = kubelet.healthy()?;
    ensure!(ok, "Healthy() said {message:?} 3 s into a parked relist");

    kubelet.release()?;
    let ended = kubelet.wait_relist_end(blocked, Duration::from_secs(2)).context("the released relist did not end")?;
    let r = kubelet.relist(blocked).unwrap();
    let took = ended - r.start;
    ensure!(
        took >= BLOCK_FOR.as_secs_f64() && took < BLOCK_FOR.as_secs_f64() + 1.0,
        "relist {blocked} took {took:.3} s (parked for {:?} by the test's clock)",
        parked_at.elapsed()
    );
    eprintln!("relist {blocked} was parked for {took:.3} s");

    // And the loop goes on.
    let after = kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist after the release")?;
    ensure!(after == blocked + 1, "relist {after} after {blocked}");
    ensure!(kubelet.wait_relist_end(after, Duration::from_secs(2)).is_some(), "relist {after} did not end");

    let status = kubelet.quit()?;
    ensure!(status.success(), "fake-kubelet exited {status}");
    Ok(())
}

/// `--pods 0` takes Relist's early return; a short `--threshold` makes Healthy() fail while a
/// relist is parked, with kubelet's message; `quit` works with a relist parked.
#[test]
fn fake_kubelet_goes_unhealthy_while_parked() -> Result<()> {
    let bin = gofixture::build_fake_kubelet()?;
    let mut kubelet = FakeKubelet::start_with_args(&bin, &["--period", "200ms", "--pods", "0", "--threshold", "1s"])?;
    let first = kubelet.wait_relist_start(Duration::from_secs(2)).context("no first relist")?;
    kubelet.wait_relist_end(first, Duration::from_secs(2)).context("first relist did not end")?;
    kubelet.block_next()?;
    let blocked = kubelet.wait_relist_start(Duration::from_secs(2)).context("no relist after `block`")?;
    thread::sleep(Duration::from_millis(1500));
    let (ok, message) = kubelet.healthy()?;
    ensure!(
        !ok && message.starts_with("pleg was last seen active ") && message.contains("threshold is 1s"),
        "Healthy() said ({ok}, {message:?}) with relist {blocked} parked for 1.5 s"
    );
    ensure!(kubelet.wait_relist_end(blocked, Duration::ZERO).is_none());
    kubelet.quit()?;
    Ok(())
}
