//! fsync of a file holding 6 MiB of dirty data, on a loop device throttled to 1 MiB/s, from a
//! named thread of the test process itself (so pid and tid differ).

use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use serde_json::json;

use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::stall::{assert_reported, CausedWait};
use plegwatch_scenarios::{gettid, preflight, LoopFs, Plegwatch, WriteThrottle};

const DIRTY: usize = 6 * MIB;
const THROTTLE_BPS: u64 = 1 << 20;
const WARN: Duration = Duration::from_secs(2);
const REAL_STALL: Duration = Duration::from_secs(3);
const WRITER: &str = "fsync-writer";

/// What the writer thread tells the test just before it calls fsync.
struct AboutToSync {
    tid: u32,
    fd: i32,
    started: Instant,
    started_wall: SystemTime,
}

#[test]
fn fsync_of_dirty_file_on_throttled_disk_is_reported_in_flight() -> anyhow::Result<()> {
    preflight::require();
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("fsync_stall", &why);
        return Ok(());
    }
    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let _throttle = WriteThrottle::new(fs.dev(), THROTTLE_BPS)?;
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    let path = fs.mount_point().join("fsync.bin");
    let (tx, rx) = mpsc::channel();
    let writer = thread::Builder::new().name(WRITER.into()).spawn({
        let path = path.clone();
        move || -> std::io::Result<Duration> {
            let file = dirty::write_file(&path, DIRTY)?;
            let started_wall = SystemTime::now();
            let started = Instant::now();
            let _ = tx.send(AboutToSync { tid: gettid(), fd: file.as_raw_fd(), started, started_wall });
            file.sync_all()?;
            Ok(started.elapsed())
        }
    })?;
    let about = rx.recv();
    let measured = writer.join().expect("the writer thread panicked")?;
    let about = about.expect("the writer thread failed before its fsync");
    eprintln!("fsync of {} took {:.3}s", path.display(), measured.as_secs_f64());
    assert!(
        measured > REAL_STALL,
        "fsync of {DIRTY} dirty bytes took only {measured:?}: the {THROTTLE_BPS} B/s write \
         throttle on {} ({}) did not take, so there was no stall to report",
        fs.device().display(),
        fs.dev()
    );

    plegwatch.wait_for(Duration::from_secs(10), |e| e.is_about("resolved", about.tid));
    let events = plegwatch.stop()?;
    let report = assert_reported(
        &events,
        &CausedWait {
            kind: "sync",
            pid: std::process::id(),
            tid: about.tid,
            comm: WRITER,
            warn: WARN,
            started: about.started,
            started_wall: about.started_wall,
            measured,
        },
    );
    report.assert_detail(&[
        ("syscall", json!("fsync")),
        ("fd", json!(about.fd)),
        ("path", json!(path)),
        ("fstype", json!("ext4")),
        ("device", json!(fs.device())),
        ("dev", json!(fs.dev().to_string())),
    ]);
    Ok(())
}
