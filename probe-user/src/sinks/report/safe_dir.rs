//! The report directory, written only through file descriptors.
//!
//! plegwatch runs as root and writes bundles into a directory other users may reach. A
//! path-based writer follows whatever symlink is planted where a bundle is about to go
//! (`chmod` of its target, files written into it). So the root is opened once, with
//! `O_NOFOLLOW`, and checked: owned by this user (root) and writable by nobody else; a
//! root that fails is refused at start, in one line. Below it, every directory is made
//! with `mkdirat` and opened with `O_NOFOLLOW`, every file is created with
//! `O_CREAT | O_EXCL | O_NOFOLLOW` under a fresh random name and renamed into place
//! (`renameat`), all relative to the directory's descriptor (rustix's safe wrappers).
//!
//! Bundle names carry this host's tag and a random part, so that they cannot be guessed
//! ahead and retention ([`ReportRoot::bundles`]) only ever counts and removes directories
//! this host's plegwatch made: named so, owned by this user, not symlinks.

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;
use std::ffi::OsStr;
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

/// The report root, open.
#[derive(Debug)]
pub struct ReportRoot {
    fd: OwnedFd,
    path: PathBuf,
    host: String,
}

/// A bundle's directory, open.
#[derive(Debug)]
pub struct BundleDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// A bundle found under the root.
#[derive(Clone, Debug, PartialEq)]
pub struct OnDisk {
    pub name: String,
    pub modified: SystemTime,
    pub bytes: u64,
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Why `st` (of `what`) is not a directory this user alone may write, if it is not.
fn not_private(st: &Stat, what: &str) -> Option<String> {
    if FileType::from_raw_mode(st.st_mode) != FileType::Directory {
        return Some(format!("{what} is not a directory"));
    }
    if st.st_uid != euid() {
        return Some(format!("{what} is owned by uid {}, not by uid {} (plegwatch's)", st.st_uid, euid()));
    }
    if st.st_mode & 0o022 != 0 {
        return Some(format!("{what} is writable by group or others (mode {:04o})", st.st_mode & 0o7777));
    }
    None
}

/// This host's tag in bundle names: 8 hex digits of its hostname's FNV-1a hash.
pub fn host_tag() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut h: u32 = 0x811c_9dc5;
    for b in name.trim().bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    format!("{h:08x}")
}

/// 16 hex digits from the kernel's random pool.
pub fn random_hex() -> std::io::Result<String> {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut b)?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

impl ReportRoot {
    /// Opens `path` as the report root, making it (mode 0700, parents too) if missing.
    /// The error is one line naming the directory and what is wrong with it.
    pub fn open(path: &Path) -> Result<ReportRoot, String> {
        let name = path.display();
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(path) {
            return Err(format!("report dir {name}: cannot create it: {e}"));
        }
        let fd = rustix::fs::open(path, dir_flags(), Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => format!("report dir {name}: a symlink or not a directory: refused"),
            e => format!("report dir {name}: cannot open it: {e}"),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| format!("report dir {name}: {e}"))?;
        if let Some(why) = not_private(&st, &format!("report dir {name}")) {
            return Err(format!("{why}: refused (plegwatch writes there as root)"));
        }
        Ok(ReportRoot { fd, path: path.to_path_buf(), host: host_tag() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The prefix of this run's bundle names: `<stamp>-<host>-pid<N>-<random>`.
    pub fn run_name(&self, stamp: &str) -> std::io::Result<String> {
        Ok(format!("{stamp}-{}-pid{}-{}", self.host, std::process::id(), random_hex()?))
    }

    /// The bundle directory `name` (made, mode 0700, if missing; opened without following
    /// a symlink, and checked to be this user's alone).
    pub fn bundle_dir(&self, name: &str) -> std::io::Result<BundleDir> {
        self.bundle(name, true)
    }

    /// The bundle directory `name` if it is there (retention may have removed it).
    pub fn existing_bundle(&self, name: &str) -> std::io::Result<BundleDir> {
        self.bundle(name, false)
    }

    fn bundle(&self, name: &str, make: bool) -> std::io::Result<BundleDir> {
        if name.contains('/') || name.starts_with('.') {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name:?} is not a bundle name")));
        }
        if make {
            match rustix::fs::mkdirat(&self.fd, name, Mode::from_raw_mode(0o700)) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(e.into()),
            }
        }
        let path = self.path.join(name);
        let fd = rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => std::io::Error::other(format!("{}: a symlink or not a directory: refused", path.display())),
            e => e.into(),
        })?;
        let st = rustix::fs::fstat(&fd)?;
        if let Some(why) = not_private(&st, &path.display().to_string()) {
            return Err(std::io::Error::other(format!("{why}: refused")));
        }
        Ok(BundleDir { fd, path })
    }

    /// Whether `name` is one of this host's bundle names:
    /// `<stamp>-<host>-pid<N>-<random>-incident-<id>` or `…-run`.
    pub fn is_ours(&self, name: &str) -> bool {
        is_bundle_name(name).is_some_and(|host| host == self.host)
    }

    /// This host's bundles: directories named so, owned by this user, not symlinks.
    pub fn bundles(&self) -> Vec<OnDisk> {
        let Ok(dir) = Dir::read_from(&self.fd) else { return Vec::new() };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let Ok(name) = entry.file_name().to_str() else { continue };
            if !self.is_ours(name) {
                continue;
            }
            let Ok(st) = rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) else { continue };
            if not_private(&st, name).is_some() {
                continue;
            }
            let Ok(b) = self.existing_bundle(name) else { continue };
            let modified = SystemTime::UNIX_EPOCH + Duration::new(st.st_mtime.max(0) as u64, st.st_mtime_nsec.clamp(0, 999_999_999) as u32);
            out.push(OnDisk { name: name.to_string(), modified, bytes: b.bytes() });
        }
        out
    }

    /// Removes bundle `name`: its files, then the directory; nothing outside it.
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        if !self.is_ours(name) {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, format!("{name}: not this host's bundle")));
        }
        let b = self.existing_bundle(name)?;
        for f in b.files() {
            rustix::fs::unlinkat(&b.fd, f.as_str(), AtFlags::empty())?;
        }
        rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)?;
        Ok(())
    }
}

/// The host tag of a bundle name, if `name` is one.
pub fn is_bundle_name(name: &str) -> Option<&str> {
    let mut parts = name.split('-');
    let stamp = parts.next()?;
    let host = parts.next()?;
    let pid = parts.next()?.strip_prefix("pid")?;
    let random = parts.next()?;
    let ok = !stamp.is_empty()
        && stamp.chars().all(|c| c.is_ascii_alphanumeric())
        && host.len() == 8
        && host.chars().all(|c| c.is_ascii_hexdigit())
        && !pid.is_empty()
        && pid.chars().all(|c| c.is_ascii_digit())
        && random.len() == 16
        && random.chars().all(|c| c.is_ascii_hexdigit());
    let rest: Vec<&str> = parts.collect();
    let kind_ok = match rest.as_slice() {
        ["run"] => true,
        ["incident", id] => !id.is_empty() && id.chars().all(|c| c.is_ascii_digit()),
        _ => false,
    };
    (ok && kind_ok).then_some(host)
}

impl BundleDir {
    /// Opens an existing directory for writing a bundle into (no checks: tests and
    /// `plegwatch report` re-render into a directory a person named).
    pub fn open_path(path: &Path) -> std::io::Result<BundleDir> {
        let fd = rustix::fs::open(path, dir_flags(), Mode::empty())?;
        Ok(BundleDir { fd, path: path.to_path_buf() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Writes `name` (mode 0600): a new file under a random name, never following a
    /// symlink or reusing a file, renamed over `name`.
    pub fn write(&self, name: &str, body: &[u8]) -> std::io::Result<()> {
        let tmp = format!(".{name}.{}.tmp", random_hex()?);
        let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let fd = rustix::fs::openat(&self.fd, tmp.as_str(), flags, Mode::from_raw_mode(0o600))?;
        let mut f = std::fs::File::from(fd);
        if let Err(e) = f.write_all(body).and_then(|()| f.flush()) {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), AtFlags::empty());
            return Err(e);
        }
        drop(f);
        rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name)?;
        Ok(())
    }

    /// Reads `name`, not following a symlink.
    pub fn read(&self, name: &str) -> std::io::Result<Vec<u8>> {
        let fd = rustix::fs::openat(&self.fd, name, OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC, Mode::empty())?;
        let mut out = Vec::new();
        std::fs::File::from(fd).read_to_end(&mut out)?;
        Ok(out)
    }

    /// The names of the regular files in it.
    fn files(&self) -> Vec<String> {
        let Ok(dir) = Dir::read_from(&self.fd) else { return Vec::new() };
        let mut out = Vec::new();
        for entry in dir.flatten() {
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if entry.file_type() == FileType::RegularFile {
                if let Some(n) = name.to_str() {
                    out.push(n.to_string());
                }
            }
        }
        out
    }

    /// The bytes of its regular files.
    fn bytes(&self) -> u64 {
        self.files()
            .iter()
            .filter_map(|f| rustix::fs::statat(&self.fd, f.as_str(), AtFlags::SYMLINK_NOFOLLOW).ok())
            .map(|st| st.st_size.max(0) as u64)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root() -> (tempfile::TempDir, ReportRoot) {
        let t = tempfile::tempdir().unwrap();
        let r = ReportRoot::open(&t.path().join("reports")).unwrap();
        (t, r)
    }

    #[test]
    fn names_carry_the_host_and_a_random_part() {
        let (_t, r) = root();
        let a = r.run_name("20261126T100000Z").unwrap();
        let b = r.run_name("20261126T100000Z").unwrap();
        assert_ne!(a, b, "a bundle name cannot be guessed");
        assert!(r.is_ours(&format!("{a}-incident-7")) && r.is_ours(&format!("{a}-run")), "{a}");
        let other_host = a.replacen(&r.host, if r.host == "00000000" { "11111111" } else { "00000000" }, 1);
        assert!(!r.is_ours(&format!("{other_host}-run")), "another host's");
        for bad in ["notes", "20261124T031500Z-pid4242-run", "../x", "x-0000000g-pid1-0123456789abcdef-run", "x-00000000-pid1-0123-run"] {
            assert!(is_bundle_name(bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn files_are_private_and_written_whole() {
        let (_t, r) = root();
        let name = format!("{}-incident-1", r.run_name("s").unwrap());
        let b = r.bundle_dir(&name).unwrap();
        b.write("incident.json", b"{}").unwrap();
        b.write("incident.json", b"{\"a\":1}").unwrap();
        let p = r.path().join(&name);
        assert_eq!(std::fs::read(p.join("incident.json")).unwrap(), b"{\"a\":1}");
        assert_eq!(std::fs::metadata(p.join("incident.json")).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o700);
        assert_eq!(std::fs::read_dir(&p).unwrap().count(), 1, "no temporary file left");
        assert_eq!(r.bundles().len(), 1);
        r.remove(&name).unwrap();
        assert!(!p.exists());
    }

    /// A symlink planted where a bundle goes, and one planted inside a bundle: neither is
    /// followed (the target keeps its mode and gets no file).
    #[test]
    fn planted_symlinks_are_not_followed() {
        let (t, r) = root();
        let target = t.path().join("target");
        std::fs::create_dir(&target).unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o755)).unwrap();
        let name = format!("{}-incident-2", r.run_name("s").unwrap());
        std::os::unix::fs::symlink(&target, r.path().join(&name)).unwrap();
        let e = r.bundle_dir(&name).unwrap_err().to_string();
        assert!(e.contains("symlink") && !e.contains('\n'), "{e}");
        assert_eq!(std::fs::metadata(&target).unwrap().permissions().mode() & 0o777, 0o755, "its target's mode was changed");
        assert!(r.bundles().is_empty(), "a symlink is not a bundle");
        assert!(r.remove(&name).is_err());
        assert!(target.exists());
        // Inside a real bundle: a symlink at a file's temporary or final name.
        let name = format!("{}-incident-3", r.run_name("s").unwrap());
        let b = r.bundle_dir(&name).unwrap();
        let victim = t.path().join("victim");
        std::fs::write(&victim, b"keep").unwrap();
        std::os::unix::fs::symlink(&victim, r.path().join(&name).join("incident.json")).unwrap();
        b.write("incident.json", b"{}").unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"keep", "written through the symlink");
        assert!(std::fs::symlink_metadata(r.path().join(&name).join("incident.json")).unwrap().is_file(), "replaced, not followed");
    }

    #[test]
    fn a_root_others_can_write_or_a_symlinked_root_is_refused_in_one_line() {
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = ReportRoot::open(&open).unwrap_err();
        assert!(e.contains("writable by group or others") && e.contains("refused") && !e.contains('\n'), "{e}");
        let link = t.path().join("link");
        std::os::unix::fs::symlink(t.path().join("elsewhere"), &link).unwrap();
        std::fs::create_dir(t.path().join("elsewhere")).unwrap();
        let e = ReportRoot::open(&link).unwrap_err();
        assert!(e.contains("symlink") && !e.contains('\n'), "{e}");
        let file = t.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        let e = ReportRoot::open(&file.join("reports")).unwrap_err();
        assert!(e.contains("cannot create it") && !e.contains('\n'), "{e}");
    }
}
