//! Hostile binaries given to plegwatch, or swapped under it: each gives a clear message and
//! never a panic.
//! - `--kubelet FILE` naming a file that is not a Go binary (`/etc/passwd`), a stripped Go
//!   binary cut short (the fake-kubelet FIXTURE's first 64 KiB, then its first half), and
//!   one whose `.gopclntab` is overwritten with garbage: plegwatch refuses to start, with
//!   one line naming the file and what is wrong with it, and exits non-zero;
//! - the fixture's binary replaced on disk while plegwatch probes the process running it:
//!   plegwatch goes on (no panic), and still reports a relist parked after the swap.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::gofixture::{self, FakeKubelet};
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::preflight::plegwatch_bin;
use plegwatch_scenarios::{preflight, Plegwatch};

/// `plegwatch watch --json --kubelet FILE --duration 3s`: its exit status and stderr.
fn watch_with_kubelet(file: &Path) -> Result<(std::process::ExitStatus, String)> {
    let out = Command::new(plegwatch_bin()?)
        .args(["watch", "--json", "--duration", "3s", "--kubelet"])
        .arg(file)
        .output()
        .context("run plegwatch")?;
    Ok((out.status, String::from_utf8_lossy(&out.stderr).into_owned()))
}

/// The fixture's bytes with the start of its `.gopclntab` section overwritten.
fn garbled_pclntab(data: &[u8]) -> Result<Vec<u8>> {
    use object::{Object as _, ObjectSection as _};
    let file = object::File::parse(data).context("parse the fixture")?;
    let section = file.section_by_name(".gopclntab").context("the fixture has no .gopclntab")?;
    let (offset, size) = section.file_range().context(".gopclntab has no file range")?;
    let mut out = data.to_vec();
    let end = (offset + size.min(4096)) as usize;
    for (i, b) in out[offset as usize..end].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(37) ^ 0xa5;
    }
    Ok(out)
}

/// A line of stderr that reports an error: `plegwatch: error: …` or a tracing line at ERROR.
fn is_error_line(line: &str) -> bool {
    line.starts_with("plegwatch: error") || line.split_whitespace().nth(1) == Some("ERROR")
}

#[test]
fn hostile_binaries_named_by_flag_are_refused_in_one_line() -> Result<()> {
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let data = std::fs::read(&bin)?;
    let dir = tempfile::tempdir()?;
    let cases: Vec<(&str, std::path::PathBuf)> = {
        let mut v = vec![("not a Go binary", Path::new("/etc/passwd").to_path_buf())];
        for (name, bytes) in [
            ("cut at 64 KiB", data[..64 * 1024].to_vec()),
            ("cut in half", data[..data.len() / 2].to_vec()),
            ("garbled .gopclntab", garbled_pclntab(&data)?),
        ] {
            let path = dir.path().join(name.replace(' ', "-"));
            std::fs::write(&path, bytes)?;
            v.push((name, path));
        }
        v
    };
    for (name, path) in &cases {
        let (status, stderr) = watch_with_kubelet(path)?;
        eprintln!("{name}: {status}: {}", stderr.lines().last().unwrap_or(""));
        assert!(!status.success(), "{name}: plegwatch started with {}:\n{stderr}", path.display());
        assert!(!stderr.contains("panicked"), "{name}: a panic:\n{stderr}");
        // Error lines are plegwatch's last word and tracing's ERROR level; a WARN line
        // quoting an OS error (a probe variant passed over: "os error 1") is not one.
        let errors: Vec<&str> = stderr.lines().filter(|l| is_error_line(l)).collect();
        assert_eq!(errors.len(), 1, "{name}: want one error line:\n{stderr}");
        assert!(errors[0].contains(&path.display().to_string()), "{name}: the error names the file: {}", errors[0]);
        // And says what is wrong with it, not only that it was refused.
        let why = errors[0].split("not probed: ").nth(1).unwrap_or("");
        assert!(why.len() > 10 && !why.contains("see the target line"), "{name}: the error says why: {}", errors[0]);
    }
    Ok(())
}

#[test]
fn a_binary_replaced_while_probed_does_not_stop_plegwatch() -> Result<()> {
    preflight::require();
    let bin = gofixture::build_fake_kubelet()?;
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("fake-kubelet");
    std::fs::copy(&bin, &copy)?;
    let mut kubelet = FakeKubelet::start(&copy)?;
    let pid = kubelet.pid();
    kubelet.wait_relist_start(Duration::from_secs(3)).context("the fixture does not relist")?;
    let started = Instant::now();
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    plegwatch.wait_probed(pid, Duration::from_secs(5))?;
    // Swap the file under the running process: a new inode at the same path, with garbage.
    let swap = dir.path().join("fake-kubelet.new");
    std::fs::write(&swap, vec![0x5a; 1 << 20])?;
    std::fs::rename(&swap, &copy)?;
    // The poll looks at the binaries again meanwhile.
    std::thread::sleep(Duration::from_secs(3));
    kubelet.block_next()?;
    kubelet.wait_relist_start(Duration::from_secs(3)).context("no relist started after block")?;
    let stall = plegwatch.wait_for(Duration::from_secs(5), |e| e.is_about_pid("stall", pid));
    kubelet.release()?;
    let stderr = plegwatch.stderr();
    let events = plegwatch.stop()?;
    let _ = kubelet.quit()?;
    let all = || dump(&events, started);
    assert!(!stderr.contains("panicked"), "a panic:\n{stderr}");
    let stall = stall.unwrap_or_else(|| panic!("the relist parked after the swap was not reported:\n{}", all()));
    assert_eq!(stall.str("/kind"), Some("pleg_relist"), "{}", all());
    assert!(events.iter().any(|e| e.is("summary")), "plegwatch ended without its summary:\n{}", all());
    Ok(())
}
