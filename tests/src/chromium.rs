//! Headless Chromium (Debian's `chromium`, `/usr/bin/chromium`) opening a local page: a
//! screenshot, the DOM after its scripts ran (`--dump-dom`), and every console message the
//! page or a frame in it logged.
//!
//! Console messages come from `--enable-logging=stderr --v=0`: Chromium writes each one,
//! from any frame (an `<object>`'s SVG document too), as a `...:CONSOLE:N] "message",
//! source: URL (line)` line on stderr; uncaught exceptions and failed loads among them. A
//! page meant to log nothing must give none: [`Opened::console`] lists them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// Where Debian installs Chromium.
pub const BIN: &str = "/usr/bin/chromium";
/// How long one Chromium run may take.
const TIMEOUT: Duration = Duration::from_secs(90);
/// The window: wide enough for the page's 1320 px, tall enough for a post-mortem's first screens.
pub const WINDOW: (u32, u32) = (1400, 2000);

/// `chromium` when installed; why not otherwise.
pub fn find() -> Result<PathBuf, String> {
    let bin = PathBuf::from(BIN);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(format!("{BIN} is missing (Debian package `chromium`; `cargo xtask setup` installs it)"))
    }
}

/// What Chromium made of a page.
#[derive(Debug)]
pub struct Opened {
    /// The screenshot's size in bytes, width and height (from its PNG header).
    pub png_bytes: u64,
    pub png_size: (usize, usize),
    /// The DOM after load.
    pub dom: String,
    /// Every console line, from both runs.
    pub console: Vec<String>,
}

/// Console lines of a Chromium stderr.
pub fn console_lines(stderr: &str) -> Vec<String> {
    stderr.lines().filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught")).map(str::to_string).collect()
}

fn run(bin: &Path, page: &Path, mode: &[String]) -> Result<(String, String)> {
    let url = format!("file://{}", page.canonicalize().with_context(|| page.display().to_string())?.display());
    let profile = tempfile::tempdir()?;
    let mut child = Command::new(bin)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr", "--v=0", "--no-first-run"])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--window-size={},{}", WINDOW.0, WINDOW.1))
        .args(mode)
        .arg(&url)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .with_context(|| format!("{}: cannot start", bin.display()))?;
    // Read both pipes off this thread so that a chatty Chromium never blocks on a full pipe.
    let mut out = child.stdout.take().context("chromium stdout")?;
    let mut err = child.stderr.take().context("chromium stderr")?;
    let out_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut out, &mut s);
        s
    });
    let err_t = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut err, &mut s);
        s
    });
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if started.elapsed() > TIMEOUT {
            let _ = child.kill();
            let _ = child.wait();
            bail!("chromium {mode:?} {url} did not finish in {TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    if !status.success() {
        bail!("chromium {mode:?} {url}: {status}\n{stderr}");
    }
    Ok((stdout, stderr))
}

/// Opens `page` twice: once for a screenshot into `screenshot`, once for its DOM.
pub fn open(bin: &Path, page: &Path, screenshot: &Path) -> Result<Opened> {
    let (_, shot_err) = run(bin, page, &[format!("--screenshot={}", screenshot.display())])?;
    let (dom, dom_err) = run(bin, page, &["--dump-dom".to_string()])?;
    let png_bytes = std::fs::metadata(screenshot).with_context(|| format!("no screenshot at {}", screenshot.display()))?.len();
    let size = imagesize::size(screenshot).with_context(|| format!("{}: not an image", screenshot.display()))?;
    let mut console = console_lines(&shot_err);
    console.extend(console_lines(&dom_err));
    Ok(Opened { png_bytes, png_size: (size.width, size.height), dom, console })
}
