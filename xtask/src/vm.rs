//! Debian's own kernels booted here in a guest: `cargo xtask vm KERNEL -- CMD`, and the guest
//! stages of `cargo xtask test --kernel KERNEL` / `--kernels all`.
//!
//! The guest is virtme-ng (PyPI) on `qemu-system-x86` (Debian) with TCG: this host opens
//! `/dev/kvm` but only runs PVM guests, and a standard kernel hangs under `-accel kvm`.
//! TCG runs single-threaded (`-accel tcg,thread=single`: the two vCPUs take turns on one
//! host thread). Multi-threaded TCG locked guests up: on 5.10 and 6.1, while a plegwatch
//! detached its tracepoints (the kernel rewriting its static-key jumps), both vCPUs stayed
//! on the same rewritten NOP in `syscall_exit_to_user_mode` for minutes (soft lockups,
//! RCU stalls; the stacks are in the guest logs of 2026-11-26), and once a guest died. It
//! was never seen on this host's own kernel. One host thread per guest also lets
//! `--kernels all` run two guests at once on two cores. The
//! host's root is shared read-only over 9p with copy-on-write overlays (`/etc`, `/var`,
//! `/tmp`, ...); the target directory is shared read-write, so that the scenarios find the
//! `plegwatch` build and the fixtures the host already built, and `/root` gets an overlay of
//! its own (Go's build cache). Nothing is written back to the host but the target directory.
//!
//! A kernel is a generic flavour from its suite's Debian registry, named as the host's apt
//! sources name them ([`sources_for`]): its `vmlinuz` is kept under the cache directory and
//! its modules go to `/lib/modules/RELEASE`, where virtme-ng builds its initramfs from.
//! The `-cloud-` flavour has no 9p and cannot mount the root.
//!
//! Every guest command runs after [`GUEST_PREP`]: tracefs, debugfs and bpffs mounted, the
//! loop module loaded, a tmpfs on `/tmp`, and on cgroup v2 the `io`, `memory`, `pids` and `cpu` controllers
//! enabled for the root's children (a throttle's `io.max` and cgroup writeback need `io`
//! and `memory`). The scenario crate itself does not know whether it runs in a guest.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::cmd;

/// A kernel of the matrix, by the name `--kernel` takes.
#[derive(Clone, Copy, Debug)]
pub struct KernelSpec {
    /// `5.10`, `6.1`, `6.12`.
    pub name: &'static str,
    /// The Debian suite that ships it.
    pub suite: &'static str,
    /// The release checked here; taken when the registry still has it.
    pub preferred: &'static str,
    /// What every release of the family starts with, to find a newer one when the
    /// preferred one is gone from the registry (`6.1.0-` leaves out bookworm's 6.12
    /// backports).
    pub family: &'static str,
    /// What a release of the suite ends with (`+deb13-amd64` leaves out trixie's others).
    pub suffix: &'static str,
}

/// The matrix: Debian 11, 12 and 13's kernels (generic amd64 flavour).
pub const KERNELS: &[KernelSpec] = &[
    KernelSpec { name: "5.10", suite: "bullseye", preferred: "5.10.0-32-amd64", family: "5.10.0-", suffix: "-amd64" },
    KernelSpec { name: "6.1", suite: "bookworm", preferred: "6.1.0-56-amd64", family: "6.1.0-", suffix: "-amd64" },
    KernelSpec { name: "6.12", suite: "trixie", preferred: "6.12.117+deb13-amd64", family: "6.12.", suffix: "+deb13-amd64" },
];

/// A kernel ready to boot: its `vmlinuz` and its release (`uname -r`).
#[derive(Clone, Debug)]
pub struct Kernel {
    pub name: String,
    pub vmlinuz: PathBuf,
    pub release: String,
}

/// Arguments of `cargo xtask vm`.
#[derive(clap::Args)]
pub struct Args {
    /// `5.10`, `6.1`, `6.12`, or a path to a vmlinuz (its modules in /lib/modules/RELEASE).
    #[arg(value_name = "KERNEL")]
    pub kernel: String,
    /// Guest memory.
    #[arg(long, default_value = "6G")]
    pub memory: String,
    /// Stop the guest from the host after this many seconds, and fail.
    #[arg(long, value_name = "SECONDS")]
    pub limit: Option<u64>,
    /// The command, run as root in the guest by a shell (after `--`); one argument is
    /// taken as a shell command line.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// `cargo xtask vm KERNEL -- CMD`: boots KERNEL and runs CMD; exits with CMD's status.
pub fn run(args: &Args) -> Result<()> {
    let kernel = resolve(&args.kernel)?;
    let line = if args.command.len() == 1 { args.command[0].clone() } else { shell_words(&args.command) };
    let started = Instant::now();
    let status = guest(&kernel, &args.memory, &line, &line, args.limit.map(Duration::from_secs), None)?;
    eprintln!("vm: {} ({}): exit {} after {:.0} s", kernel.name, kernel.release, status, started.elapsed().as_secs_f64());
    if status != 0 {
        bail!("the guest command exited {status}");
    }
    Ok(())
}

/// The kernel `arg` names: one of [`KERNELS`] (installed when missing) or a vmlinuz path.
pub fn resolve(arg: &str) -> Result<Kernel> {
    if let Some(spec) = KERNELS.iter().find(|k| k.name == arg) {
        return ensure_kernel(spec);
    }
    let path = Path::new(arg);
    if path.is_file() {
        let release = release_of(path).with_context(|| format!("{arg}: no kernel release string found in the image"))?;
        if !Path::new("/lib/modules").join(&release).join("modules.dep").is_file() {
            bail!("{arg} is {release}, but /lib/modules/{release}/modules.dep is missing: install its modules and run depmod {release}");
        }
        return Ok(Kernel { name: arg.to_string(), vmlinuz: path.to_path_buf(), release });
    }
    let names: Vec<&str> = KERNELS.iter().map(|k| k.name).collect();
    bail!("unknown kernel {arg:?}: name one of {} or a path to a vmlinuz", names.join(", "))
}

/// `uname -r` of a bzImage: the version string its setup header points to
/// (`kernel_version` at 0x20e, an offset from 0x200; boot protocol 2.00+).
fn release_of(vmlinuz: &Path) -> Option<String> {
    let img = std::fs::read(vmlinuz).ok()?;
    let off = u16::from_le_bytes([*img.get(0x20e)?, *img.get(0x20f)?]) as usize + 0x200;
    let s = img.get(off..off + 256)?;
    let end = s.iter().position(|&b| b == 0 || b == b' ')?;
    String::from_utf8(s[..end].to_vec()).ok().filter(|r| !r.is_empty())
}

/// Where the kernels, their packages and apt lists are kept: beside the Go toolchains.
fn cache_dir() -> PathBuf {
    crate::setup::cache_dir().join("kernels")
}

/// The virtme-ng virtual environment.
fn vng_dir() -> PathBuf {
    crate::setup::cache_dir().join("virtme-ng")
}

/// virtme-ng's version, pinned: 1.42 is the one checked here.
pub const VIRTME_NG: &str = "1.42";

/// `pip install virtme-ng==VERSION` into its own venv, unless its `vng --version` says it.
pub fn ensure_vng() -> Result<()> {
    let venv = vng_dir();
    let vng = venv.join("bin/vng");
    crate::setup::pip_venv(&format!("virtme-ng {VIRTME_NG}"), &venv, &format!("virtme-ng=={VIRTME_NG}"), || {
        let said = cmd::probe(Command::new(&vng).arg("--version")).unwrap_or_default();
        if said.split_whitespace().any(|w| w == VIRTME_NG) {
            Ok(())
        } else {
            Err(format!("{} --version said {:?}", vng.display(), said.trim()))
        }
    })
}

/// Installs every kernel of [`KERNELS`] that is missing (for `cargo xtask setup`).
pub fn ensure_kernels() -> Result<()> {
    for spec in KERNELS {
        let k = ensure_kernel(spec)?;
        eprintln!("setup: kernel {}: {} ready ({})", spec.name, k.release, k.vmlinuz.display());
    }
    Ok(())
}

/// The kernel of `spec`, downloaded and its modules installed if they are not.
pub fn ensure_kernel(spec: &KernelSpec) -> Result<Kernel> {
    let dir = cache_dir();
    // A release installed earlier (the preferred one or the one taken instead).
    if let Some(k) = installed(spec, &dir) {
        return Ok(k);
    }
    if !cmd::is_root() {
        bail!("kernel {} is not installed: run `cargo xtask setup` as root", spec.name);
    }
    let lists = dir.join("apt").join(spec.suite);
    std::fs::create_dir_all(lists.join("lists/partial")).with_context(|| format!("create {}", lists.display()))?;
    let sources = lists.join("sources.list");
    std::fs::write(&sources, sources_for(spec.suite)?).with_context(|| format!("write {}", sources.display()))?;
    let apt = |tool: &str| {
        let mut c = Command::new(tool);
        c.arg("-o").arg(format!("Dir::Etc::sourcelist={}", sources.display()));
        c.args(["-o", "Dir::Etc::sourceparts=-"]);
        c.arg("-o").arg(format!("Dir::State::Lists={}", lists.join("lists").display()));
        c
    };
    eprintln!("setup: kernel {}: reading {}'s package lists", spec.name, spec.suite);
    cmd::run(apt("apt-get").args(["update", "-q"]))?;
    let names = cmd::output(apt("apt-cache").args(["pkgnames", "linux-image-"]))?;
    let release =
        pick_release(spec, names.lines()).with_context(|| format!("{} has no linux-image-{}*{}", spec.suite, spec.family, spec.suffix))?;
    if release != spec.preferred {
        eprintln!("setup: kernel {}: {} is gone from {}; taking {release}", spec.name, spec.preferred, spec.suite);
    }
    let debs = dir.join("deb");
    std::fs::create_dir_all(&debs)?;
    // As root, apt-get download warns that _apt cannot write here, and downloads anyway.
    cmd::run(apt("apt-get").current_dir(&debs).args(["download", "-q"]).arg(format!("linux-image-{release}")))?;
    let deb = std::fs::read_dir(&debs)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&format!("linux-image-{release}_")) && n.ends_with(".deb"))
        })
        .with_context(|| format!("apt-get download left no linux-image-{release}_*.deb in {}", debs.display()))?;
    let unpacked = dir.join("x").join(&release);
    let _ = std::fs::remove_dir_all(&unpacked);
    std::fs::create_dir_all(&unpacked)?;
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&unpacked))?;
    // bullseye and bookworm put modules under lib/, trixie (merged /usr) under usr/lib/.
    let modules = ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| unpacked.join(m).join(&release))
        .find(|p| p.is_dir())
        .with_context(|| format!("{} has no lib/modules/{release}", deb.display()))?;
    let dest = Path::new("/lib/modules").join(&release);
    let _ = std::fs::remove_dir_all(&dest);
    std::fs::create_dir_all("/lib/modules")?;
    cmd::run(Command::new("cp").arg("-a").arg(&modules).arg(&dest))?;
    cmd::run(Command::new("depmod").arg(&release))?;
    let kdir = dir.join(&release);
    std::fs::create_dir_all(&kdir)?;
    let vmlinuz = kdir.join("vmlinuz");
    std::fs::copy(unpacked.join("boot").join(format!("vmlinuz-{release}")), &vmlinuz).with_context(|| format!("copy vmlinuz-{release}"))?;
    let _ = std::fs::remove_dir_all(&unpacked);
    let _ = std::fs::remove_file(&deb);
    Ok(Kernel { name: spec.name.to_string(), vmlinuz, release })
}

/// A release of `spec` already under `dir` with its modules installed: the preferred one
/// first, else the newest.
fn installed(spec: &KernelSpec, dir: &Path) -> Option<Kernel> {
    let entries = std::fs::read_dir(dir).ok()?;
    let mut releases: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|r| r.starts_with(spec.family) && r.ends_with(spec.suffix))
        .filter(|r| dir.join(r).join("vmlinuz").is_file() && Path::new("/lib/modules").join(r).join("modules.dep").is_file())
        .collect();
    releases.sort_by_key(|r| (r == spec.preferred, version_key(r)));
    let release = releases.pop()?;
    Some(Kernel { name: spec.name.to_string(), vmlinuz: dir.join(&release).join("vmlinuz"), release })
}

/// The release to take among `linux-image-*` package names: the preferred one if listed,
/// else the newest generic one of the family (no `-cloud-`, `-rt-`, `-dbg`, `-unsigned`).
fn pick_release<'a>(spec: &KernelSpec, names: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut found: Vec<String> = names
        .filter_map(|n| n.trim().strip_prefix("linux-image-"))
        .filter(|r| r.starts_with(spec.family) && r.ends_with(spec.suffix))
        .filter(|r| !["-cloud-", "-rt-", "-dbg", "-unsigned"].iter().any(|x| r.contains(x)))
        .map(str::to_string)
        .collect();
    if found.iter().any(|r| r == spec.preferred) {
        return Some(spec.preferred.to_string());
    }
    found.sort_by_key(|r| version_key(r));
    found.pop()
}

/// The numbers in a release, in order, to compare releases of one family.
fn version_key(release: &str) -> Vec<u64> {
    release.split(|c: char| !c.is_ascii_digit()).filter_map(|p| p.parse().ok()).collect()
}

/// A one-line-per-entry apt sources list for `suite`, made from the host's own apt
/// sources: every `deb` entry of the host's codename, with that codename replaced
/// (`bookworm-security` → `bullseye-security`). The registry is named only where the
/// host's apt configuration names it.
fn sources_for(suite: &str) -> Result<String> {
    let mut text = String::new();
    for dir in ["/etc/apt/sources.list.d"] {
        if let Ok(entries) = std::fs::read_dir(dir) {
            let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            for p in paths {
                if p.extension().is_some_and(|e| e == "sources") {
                    text.push_str(&std::fs::read_to_string(&p).unwrap_or_default());
                    text.push('\n');
                }
            }
        }
    }
    let legacy = std::fs::read_to_string("/etc/apt/sources.list").unwrap_or_default();
    let out = retarget_sources(&text, &legacy, suite);
    if out.is_empty() {
        bail!("no Debian `deb` entry in /etc/apt/sources.list or /etc/apt/sources.list.d/*.sources to take {suite}'s from");
    }
    Ok(out)
}

/// [`sources_for`]'s pure part: deb822 stanzas (`deb822`) and one-line entries (`legacy`)
/// retargeted to `suite`.
fn retarget_sources(deb822: &str, legacy: &str, suite: &str) -> String {
    let mut entries: Vec<(String, String)> = Vec::new();
    for stanza in deb822.split("\n\n") {
        let field =
            |name: &str| stanza.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':'))).map(|v| v.trim().to_string());
        if field("Types").is_some_and(|t| t.split_whitespace().any(|t| t == "deb")) {
            if let (Some(uris), Some(suites)) = (field("URIs"), field("Suites")) {
                for uri in uris.split_whitespace() {
                    for s in suites.split_whitespace() {
                        entries.push((uri.to_string(), s.to_string()));
                    }
                }
            }
        }
    }
    for line in legacy.lines() {
        let words: Vec<&str> = line.split_whitespace().filter(|w| !w.starts_with('[')).collect();
        if words.first() == Some(&"deb") && words.len() >= 3 {
            entries.push((words[1].to_string(), words[2].to_string()));
        }
    }
    let mut out = String::new();
    for (uri, s) in entries {
        // The host's codename is what comes before the first '-' (bookworm-updates).
        let rest = s.split_once('-').map(|(_, r)| format!("-{r}")).unwrap_or_default();
        let line = format!("deb {uri} {suite}{rest} main\n");
        if !out.contains(&line) {
            out.push_str(&line);
        }
    }
    out
}

/// Shell words joined into one command line.
fn shell_words(words: &[String]) -> String {
    words
        .iter()
        .map(|w| {
            if !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c)) {
                w.clone()
            } else {
                format!("'{}'", w.replace('\'', r"'\''"))
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Run once in every guest before its command (see the module doc).
pub const GUEST_PREP: &str = r#"
mountpoint -q /sys/kernel/tracing || mount -t tracefs nodev /sys/kernel/tracing
mountpoint -q /sys/kernel/debug || mount -t debugfs nodev /sys/kernel/debug
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
modprobe -q loop 2>/dev/null || true
# virtme-ng's /tmp is an overlay on the host's root: containerd's overlayfs snapshots
# there are overlay-on-overlay, which 5.10 refuses (EINVAL). A tmpfs of its own instead.
[ "$(stat -fc %T /tmp)" = tmpfs ] || mount -t tmpfs -o mode=1777 tmpfs /tmp
if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ]; then
  for c in io memory pids cpu; do echo "+$c" > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null || true; done
  cg="v2 ($(cat /sys/fs/cgroup/cgroup.subtree_control))"
else
  cg=v1
fi
echo "guest: Linux $(uname -r), cgroup $cg, $(nproc) CPUs" >&2
# A task stuck in D state is named with its stack after 60 s (not Debian's 120 s), and a
# soft lockup shows every CPU's backtrace: what a hang leaves on the console.
sysctl -qw kernel.hung_task_timeout_secs=60 kernel.softlockup_all_cpu_backtrace=1 2>/dev/null || true
"#;

/// Boots `kernel` with `memory` and runs `line` as root after [`GUEST_PREP`]; returns
/// its exit status. `label` says what runs, for the log.
///
/// The script goes to a file in the target directory, which the guest shares: virtme-ng
/// passes its command on the kernel's command line, which the kernel cuts at 2 KiB.
///
/// With `limit`, a guest still running after it is stopped from here (vng, QEMU and
/// everything they started, as one process group) and the call fails naming `label`: a
/// guest whose kernel hangs never runs its own `timeout`s.
/// Set by [`cancel_guests`]: every running guest is stopped.
static CANCELLED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Stops every guest this process runs, within half a second (a stage that runs beside
/// them failed: no need to wait for theirs).
pub fn cancel_guests() {
    CANCELLED.store(true, std::sync::atomic::Ordering::Relaxed);
}

pub fn guest(kernel: &Kernel, memory: &str, label: &str, line: &str, limit: Option<Duration>, log: Option<&Path>) -> Result<i32> {
    guest_on(kernel, 2, memory, label, line, "", limit, log)
}

/// [`guest`] with `cpus` vCPUs and more of QEMU's options (`qemu_opts`, after the
/// accelerator's): the loops bench adds its instruction-counting plugin.
#[allow(clippy::too_many_arguments)]
pub fn guest_on(
    kernel: &Kernel,
    cpus: u32,
    memory: &str,
    label: &str,
    line: &str,
    qemu_opts: &str,
    limit: Option<Duration>,
    log: Option<&Path>,
) -> Result<i32> {
    ensure_vng()?;
    if cmd::probe(Command::new("qemu-system-x86_64").arg("--version")).is_none() {
        bail!("qemu-system-x86_64 is missing: run `cargo xtask setup` (Debian's qemu-system-x86)");
    }
    let root = cmd::workspace_root();
    let target = cmd::target_dir();
    let scripts = target.join("guest");
    std::fs::create_dir_all(&scripts).with_context(|| format!("create {}", scripts.display()))?;
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let path = std::env::var("PATH").unwrap_or_default();
    // One script per guest: guests of one xtask run side by side.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let script = scripts.join(format!("run-{}-{n}.sh", std::process::id()));
    std::fs::write(&script, format!("{GUEST_PREP}\nexport HOME={home} PATH={path}\n{line}\n"))
        .with_context(|| format!("write {}", script.display()))?;
    let mut vng = Command::new(vng_dir().join("bin/vng"));
    // vng runs its siblings (virtme-run) from PATH.
    vng.env("PATH", format!("{}:{path}", vng_dir().join("bin").display()));
    vng.arg("--run")
        .arg(&kernel.vmlinuz)
        .args(["--disable-kvm", "--cpus", &cpus.to_string(), "--memory", memory])
        .arg(format!("--qemu-opts=-accel tcg,thread=single {qemu_opts}"))
        // The kernel's own warnings on stderr, with their stacks (printed at the default
        // level, 4: hence 5): soft lockups, RCU stalls, hung tasks, OOM, a panic's last
        // words. Without them a guest that hangs or reboots says nothing.
        .args(["--verbose", "--append", "loglevel=5"])
        .arg(format!("--rwdir={}", target.display()))
        .arg(format!("--overlay-rwdir={home}"))
        .arg(format!("--cwd={}", root.display()))
        .arg("--")
        .arg(format!("bash {}", script.display()));
    eprintln!(
        "+ vng --run {} --disable-kvm --cpus {cpus} --memory {memory} -- bash {} ({label})",
        kernel.vmlinuz.display(),
        script.display()
    );
    // QEMU reopens its stdout and stderr by /proc/self/fd/N, which truncates a regular
    // file and writes each from offset 0: hand it pipes, copied through here.
    let mut child = vng.stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn().context("cannot start vng")?;
    let started = Instant::now();
    // Into `log` when given (guests run side by side), else through to ours.
    let file = match log {
        Some(path) => Some(std::fs::File::create(path).with_context(|| format!("create {}", path.display()))?),
        None => None,
    };
    let sink = |f: &Option<std::fs::File>, stderr: bool| -> Result<Box<dyn std::io::Write + Send>> {
        Ok(match f {
            Some(f) => Box::new(f.try_clone().context("the guest log")?),
            None if stderr => Box::new(std::io::stderr()),
            None => Box::new(std::io::stdout()),
        })
    };
    let (mut to_out, mut to_err) = (sink(&file, false)?, sink(&file, true)?);
    let out = child.stdout.take().map(|mut o| std::thread::spawn(move || std::io::copy(&mut o, &mut to_out)));
    let err = child.stderr.take().map(|mut e| std::thread::spawn(move || std::io::copy(&mut e, &mut to_err)));
    let status = loop {
        if let Some(status) = child.try_wait().context("waiting for vng")? {
            break Some(status);
        }
        let cancelled = CANCELLED.load(std::sync::atomic::Ordering::Relaxed);
        if cancelled || limit.is_some_and(|l| started.elapsed() >= l) {
            // SAFETY: kill(2) on the process group this call created (the child leads it).
            unsafe { libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL) };
            let _ = child.wait();
            if cancelled {
                let _ = std::fs::remove_file(&script);
                bail!("the guest on Linux {} ({label}) was stopped: another stage failed", kernel.release);
            }
            break None;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    if status.is_some() {
        // (After a kill, a stray holder of the pipes must not keep this waiting.)
        for copier in [out, err].into_iter().flatten() {
            let _ = copier.join();
        }
    }
    let _ = std::fs::remove_file(&script);
    match status {
        Some(status) => Ok(status.code().unwrap_or(128)),
        None => bail!("the guest on Linux {} ({label}) still ran after {:.0} s: stopped", kernel.release, started.elapsed().as_secs_f64()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_sources_are_retargeted() {
        let deb822 = "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n\n\
                      Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n\
                      Types: deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm\n";
        let out = retarget_sources(deb822, "# none\n", "trixie");
        assert_eq!(
            out,
            "deb http://mirror.example/debian trixie main\n\
             deb http://mirror.example/debian trixie-updates main\n\
             deb http://mirror.example/debian-security trixie-security main\n"
        );
        let out = retarget_sources("", "deb [arch=amd64] http://m.example/debian bookworm main contrib\n", "bullseye");
        assert_eq!(out, "deb http://m.example/debian bullseye main\n");
    }

    #[test]
    fn the_preferred_release_else_the_newest_generic_one() {
        let spec = KERNELS[1];
        let names = [
            "linux-image-6.1.0-9-amd64",
            "linux-image-6.1.0-56-amd64",
            "linux-image-6.1.0-56-cloud-amd64",
            "linux-image-6.12.57+deb12-amd64",
        ];
        assert_eq!(pick_release(&spec, names.into_iter()).as_deref(), Some("6.1.0-56-amd64"));
        let names = [
            "linux-image-6.1.0-9-amd64",
            "linux-image-6.1.0-57-rt-amd64",
            "linux-image-6.1.0-60-amd64",
            "linux-image-6.1.0-60-cloud-amd64",
        ];
        assert_eq!(pick_release(&spec, names.into_iter()).as_deref(), Some("6.1.0-60-amd64"));
        let trixie = KERNELS[2];
        let names = ["linux-image-6.12.200+deb12-amd64", "linux-image-6.12.118+deb13-amd64"];
        assert_eq!(pick_release(&trixie, names.into_iter()).as_deref(), Some("6.12.118+deb13-amd64"));
        assert_eq!(pick_release(&trixie, std::iter::empty()), None);
    }

    #[test]
    fn shell_words_quote_what_needs_it() {
        assert_eq!(shell_words(&["echo".into(), "a b".into(), "it's".into()]), "echo 'a b' 'it'\\''s'");
    }
}
