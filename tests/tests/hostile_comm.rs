//! A process names itself with an escape sequence and a newline (`prctl(PR_SET_NAME)`, as
//! any container may), then stalls in fsync on a throttled disk. plegwatch's text output
//! must show that name with its control characters made visible (`\x1b`, `\x0a`): no
//! escape sequence reaches the SRE's terminal, and no line of its own is forged.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use plegwatch_scenarios::dirty::{self, MIB};
use plegwatch_scenarios::{preflight, timing, LoopFs, WriteThrottle};

/// The thread's name: clear the screen, then a forged line.
const HOSTILE: &[u8] = b"x\x1b[2J\nFAKE OK\0";
/// How it must show.
const SHOWN: &str = "x\\x1b[2J\\x0aFAKE OK";

#[test]
fn a_hostile_comm_is_shown_escaped_in_text_output() -> anyhow::Result<()> {
    let bin = preflight::require();
    if let Some(why) = WriteThrottle::unavailable() {
        preflight::skip("hostile_comm", &why);
        return Ok(());
    }
    let fs = LoopFs::new(LoopFs::DEFAULT_SIZE)?;
    let _throttle = WriteThrottle::new(fs.dev(), 1 << 20)?;
    let mut child = Command::new(&bin)
        .args(["--color", "always", "watch", "--no-live", "--waits", "--warn", "1s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("start plegwatch")?;
    let out = Arc::new(Mutex::new(Vec::<u8>::new()));
    let reader = {
        let out = out.clone();
        let stdout = child.stdout.take().context("plegwatch's stdout")?;
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut line = Vec::new();
            while r.read_until(b'\n', &mut line).map(|n| n > 0).unwrap_or(false) {
                out.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(&line);
                line.clear();
            }
        })
    };
    let text = || String::from_utf8_lossy(&out.lock().unwrap_or_else(|e| e.into_inner())).into_owned();
    let wait_text = |what: &str, timeout: Duration| {
        let deadline = Instant::now() + timing::scaled(timeout);
        while Instant::now() < deadline {
            if text().contains(what) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    };
    let ready = wait_text("plegwatch watching", plegwatch_scenarios::plegwatch::READY_TIMEOUT);

    // A thread of this process renames itself and fsyncs 4 MiB at 1 MiB/s.
    let path = fs.mount_point().join("hostile.bin");
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from a
        // buffer that outlives the call.
        unsafe { libc::prctl(libc::PR_SET_NAME, HOSTILE.as_ptr()) };
        let file = dirty::write_file(&path, 4 * MIB)?;
        file.sync_all()
    });
    let shown = ready && wait_text(SHOWN, Duration::from_secs(8));
    writer.join().map_err(|_| anyhow::anyhow!("the writer panicked"))??;
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let _ = child.wait();
    let _ = reader.join();
    let all = text();
    assert!(ready, "plegwatch never said it was watching:\n{all}");
    assert!(shown, "the hostile comm is not shown escaped ({SHOWN}):\n{all}");
    // Colour is on, so ESC is in the output, but only as plegwatch's own SGR colour codes.
    for (i, _) in all.match_indices('\u{1b}') {
        let rest = &all[i + 1..];
        let sgr = rest.strip_prefix('[').is_some_and(|r| {
            let end = r.find(|c: char| !(c.is_ascii_digit() || c == ';')).unwrap_or(r.len());
            r[end..].starts_with('m')
        });
        assert!(sgr, "an escape sequence that is not a colour, at byte {i}: {:?}", &all[i..(i + 12).min(all.len())]);
    }
    assert!(!all.contains("\u{1b}[2J"), "the screen-clear reached the output:\n{all}");
    assert!(!all.lines().any(|l| l.starts_with("FAKE OK")), "a line was forged:\n{all}");
    Ok(())
}
