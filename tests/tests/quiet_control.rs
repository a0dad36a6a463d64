//! Negative control: 30 s of ordinary, fast file I/O on healthy disks (small writes, every
//! flavour of sync, mounts and umounts) must not produce a single stall line, while the
//! probes count at least the syscalls it made (so a plegwatch that attached nothing fails).

use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::sys::run;
use plegwatch_scenarios::{preflight, LoopFs, Mount, Plegwatch};

const DURATION: Duration = Duration::from_secs(30);
const PAUSE: Duration = Duration::from_millis(200);
const SMALL: usize = 64 << 10;

#[test]
fn ordinary_io_and_mounts_report_no_stall() -> Result<()> {
    preflight::require();
    let mut fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let scratch = tempfile::Builder::new().prefix("plegwatch-quiet-").tempdir()?;
    let tmpfs_dir = scratch.path().join("tmpfs");
    std::fs::create_dir(&tmpfs_dir)?;
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    let started = Instant::now();
    let mut rounds = 0;
    while started.elapsed() < DURATION {
        plegwatch_scenarios::dirty::synced_writes(fs.mount_point(), SMALL).context("small synced writes on the loop ext4")?;
        let tmpfs = Mount::new("tmpfs", &tmpfs_dir, "tmpfs", Some("size=8m"))?;
        plegwatch_scenarios::dirty::synced_writes(tmpfs.target(), SMALL).context("small synced writes on a tmpfs")?;
        tmpfs.unmount()?;
        if rounds % 4 == 3 {
            run(&mut Command::new("sync"))?;
            fs.unmount()?;
            fs.mount()?;
        }
        rounds += 1;
        thread::sleep(PAUSE);
    }
    eprintln!("{rounds} rounds of ordinary I/O in {:.1}s", started.elapsed().as_secs_f64());

    // stop() fails unless plegwatch was still running, exits 0 and printed its summary.
    let events = plegwatch.stop()?;
    let reports: Vec<_> = events.iter().filter(|e| e.is("stall") || e.is("resolved")).collect();
    assert!(
        reports.is_empty(),
        "plegwatch reported stalls during ordinary I/O that never waited 2 s; all lines, timed \
         from the start of the I/O:\n{}",
        dump(&events, started)
    );
    let summary = events.iter().rev().find(|e| e.is("summary")).context("no summary line")?;
    // Each round: fsync, fdatasync, sync_file_range and syncfs on the loop ext4 and on a tmpfs,
    // and one tmpfs umount. The counts are node-wide, so they are floors.
    let made =
        [("fsync", 2 * rounds), ("fdatasync", 2 * rounds), ("sync_file_range", 2 * rounds), ("syncfs", 2 * rounds), ("umount2", rounds)];
    for (syscall, floor) in made {
        let seen = summary.syscall_count(syscall);
        eprintln!("{syscall}: the probes counted {seen}, the test made {floor}");
        assert!(seen >= floor, "the probes counted {seen} {syscall} calls; the test made {floor}:\n{}", dump(&events, started));
    }
    assert!(
        summary.u64("/waits_started").unwrap_or(0) >= 9 * rounds,
        "waits_started {:?} < the {} syncs and umounts made",
        summary.u64("/waits_started"),
        9 * rounds
    );
    Ok(())
}
