//! Shared helpers: running external commands with their command line in every error,
//! workspace paths, the root check, and the processes running.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};

/// The workspace root: the parent of this crate's manifest directory.
pub fn workspace_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().map(Path::to_path_buf).unwrap_or_else(|| manifest_dir.to_path_buf())
}

/// Cargo's target directory: `$CARGO_TARGET_DIR` if set, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    let root = workspace_root();
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// Whether we run with effective UID 0.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A `cargo` command run from the workspace root (uses `$CARGO` when cargo gave us one).
/// Under CI (`CI` set) it builds without incremental state, unless told otherwise: a
/// fresh clone builds each crate once, and that state was 2.3 GB of its target directory.
pub fn cargo() -> Command {
    let program = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(program);
    cmd.current_dir(workspace_root());
    if std::env::var_os("CI").is_some() && std::env::var_os("CARGO_INCREMENTAL").is_none() {
        cmd.env("CARGO_INCREMENTAL", "0");
    }
    cmd
}

/// GiB free to an unprivileged writer on the filesystem holding `path` (or its nearest
/// existing ancestor).
pub fn free_gib(path: &Path) -> Result<f64> {
    let existing = path.ancestors().find(|p| p.exists()).unwrap_or(Path::new("/"));
    let c = std::ffi::CString::new(existing.as_os_str().as_encoded_bytes()).context("a path with a NUL byte")?;
    // SAFETY: a zeroed statvfs is a valid out-buffer; `c` is a NUL-terminated path.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("statvfs {}", existing.display()));
    }
    Ok(st.f_bavail as f64 * st.f_frsize as f64 / f64::from(1u32 << 30))
}

/// The command line as a shell would show it, with the env vars we set in front.
pub fn display(cmd: &Command) -> String {
    let mut parts: Vec<String> = cmd.get_envs().filter_map(|(k, v)| v.map(|v| format!("{}={}", k.to_string_lossy(), quote(v)))).collect();
    parts.push(quote(cmd.get_program()));
    parts.extend(cmd.get_args().map(quote));
    parts.join(" ")
}

fn quote(s: &OsStr) -> String {
    let s = s.to_string_lossy();
    let plain = !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        s.into_owned()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// Print a stage header.
pub fn header(title: &str) {
    eprintln!("\n==> {title}");
}

/// Run to completion with inherited stdio; a spawn failure or a non-zero exit is an error
/// that names the command line.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = display(cmd);
    eprintln!("+ {line}");
    let status = cmd.status().with_context(|| format!("cannot start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed: {status}");
    }
    Ok(())
}

/// Run to completion and return stdout; stderr is kept for the error message.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = display(cmd);
    let out = cmd.stdin(Stdio::null()).output().with_context(|| format!("cannot start `{line}`"))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        bail!("`{line}` failed: {}: {}", out.status, last_line(&stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Like [`output`], but `None` when the program can't be started or exits non-zero:
/// for probes such as `bpf-linker --version`.
pub fn probe(cmd: &mut Command) -> Option<String> {
    let out = cmd.stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The last non-empty line of some output, for one-line error messages.
pub fn last_line(text: &str) -> &str {
    text.lines().rev().map(str::trim).find(|l| !l.is_empty()).unwrap_or("(no output)")
}

/// Every process's pid and comm (`/proc/PID/comm`, without its newline); one that ends
/// while it is read is left out, and an unreadable `/proc` gives none.
pub fn processes() -> Vec<(u32, String)> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| Some((pid, std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?.trim_end().to_owned())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_what_needs_it() {
        let mut cmd = Command::new("bpftrace");
        cmd.arg("-e").arg("t { @s[tid] = 1; }").env("A", "b c");
        assert_eq!(display(&cmd), "A='b c' bpftrace -e 't { @s[tid] = 1; }'");
    }

    #[test]
    fn last_line_skips_blank_lines() {
        assert_eq!(last_line("a\nerror: x\n\n"), "error: x");
        assert_eq!(last_line(""), "(no output)");
    }
}
