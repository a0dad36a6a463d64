//! Which containerd (with its own shim and `ctr`) and which runc a bed runs, and the config
//! format that containerd takes.
//!
//! - containerd 1.6.20 is Debian's (`apt-get install containerd`: `containerd`, `ctr` and
//!   `containerd-shim-runc-v2` in `PATH`), runc 1.1.5 Debian's `/usr/sbin/runc`;
//! - containerd 1.7.34 and 2.3.4 and runc 1.4.3 are stripped release builds in
//!   [`shared_bin`] (`/work/shared/bin`, or `PLEGWATCH_SHARED_BIN`), named
//!   `containerd-1.7.34`, `containerd-shim-runc-v2-1.7.34`, `ctr-1.7.34`, `runc-1.4.3`, …
//!
//! They are run as they are, never modified: a daemon gets a private bin dir
//! ([`Version::link_into`]) of symlinks named as containerd looks for them
//! (`containerd-shim-runc-v2` on its `PATH`, `runc` as the runtime's `BinaryName`), so that
//! each process's comm is the name plegwatch and the beds know it by (`containerd`,
//! `containerd-shim`, `runc`) while `/proc/PID/exe` is the release binary itself.

use std::fmt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// The environment variable naming the dir of the release builds, if not
/// [`DEFAULT_SHARED_BIN`].
pub const SHARED_BIN_ENV: &str = "PLEGWATCH_SHARED_BIN";
/// Where the release builds of containerd and runc are (shared/bin/README.md).
pub const DEFAULT_SHARED_BIN: &str = "/work/shared/bin";

/// The dir holding the release builds.
pub fn shared_bin() -> PathBuf {
    std::env::var_os(SHARED_BIN_ENV).map(PathBuf::from).unwrap_or_else(|| PathBuf::from(DEFAULT_SHARED_BIN))
}

/// A containerd release, with the shim and `ctr` of the same release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ContainerdRelease {
    /// Debian 12's containerd 1.6.20 (Go 1.19), from `PATH`.
    V1_6_20,
    /// containerd v1.7.34 (Go 1.25), a release build in [`shared_bin`].
    V1_7_34,
    /// containerd v2.3.4 (Go 1.26), a release build in [`shared_bin`].
    V2_3_4,
}

/// A runc release.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RuncRelease {
    /// Debian 12's runc 1.1.5 (Go 1.19), `/usr/sbin/runc`.
    V1_1_5,
    /// runc v1.4.3 (Go 1.26, PIE), a release build in [`shared_bin`].
    V1_4_3,
}

/// The format of containerd's `config.toml`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigFormat {
    /// `version = 2` (containerd 1.x): the CRI plugin is `io.containerd.grpc.v1.cri`, with
    /// its runtimes under `.containerd`.
    V2,
    /// `version = 3` (containerd 2.x): the CRI config is split into
    /// `io.containerd.cri.v1.images` (snapshotter, pinned sandbox image),
    /// `io.containerd.cri.v1.runtime` (runtimes, CNI, security options) and
    /// `io.containerd.grpc.v1.cri` (the streaming server) (docs/cri/config.md at v2.3.4).
    V3,
}

impl ContainerdRelease {
    /// The version string, as `containerd --version` and CRI `Version` show it.
    pub fn number(self) -> &'static str {
        match self {
            Self::V1_6_20 => "1.6.20",
            Self::V1_7_34 => "1.7.34",
            Self::V2_3_4 => "2.3.4",
        }
    }

    pub fn config_format(self) -> ConfigFormat {
        match self {
            Self::V1_6_20 | Self::V1_7_34 => ConfigFormat::V2,
            Self::V2_3_4 => ConfigFormat::V3,
        }
    }

    /// Where `program` (`containerd`, `containerd-shim-runc-v2` or `ctr`) of this release is,
    /// the release builds being in `shared`.
    fn program(self, program: &str, shared: &Path) -> Result<PathBuf, String> {
        match self {
            Self::V1_6_20 => which(program).ok_or_else(|| {
                format!(
                    "{program} (containerd 1.6.20) is not in PATH: install the Debian package \
                     containerd (`cargo xtask setup`)"
                )
            }),
            Self::V1_7_34 | Self::V2_3_4 => {
                let path = shared.join(format!("{program}-{}", self.number()));
                executable(&path).then_some(path.clone()).ok_or_else(|| {
                    format!(
                        "{} (containerd {} release build) is missing or not executable \
                             (set {SHARED_BIN_ENV} to the dir holding it)",
                        path.display(),
                        self.number()
                    )
                })
            }
        }
    }
}

impl RuncRelease {
    pub fn number(self) -> &'static str {
        match self {
            Self::V1_1_5 => "1.1.5",
            Self::V1_4_3 => "1.4.3",
        }
    }

    fn program(self, shared: &Path) -> Result<PathBuf, String> {
        let path = match self {
            Self::V1_1_5 => PathBuf::from("/usr/sbin/runc"),
            Self::V1_4_3 => shared.join("runc-1.4.3"),
        };
        if executable(&path) {
            Ok(path)
        } else {
            Err(match self {
                Self::V1_1_5 => format!(
                    "{} (runc 1.1.5) is missing: install the Debian package runc (`cargo xtask \
                     setup`)",
                    path.display()
                ),
                Self::V1_4_3 => format!(
                    "{} (runc 1.4.3 release build) is missing or not executable (set \
                     {SHARED_BIN_ENV} to the dir holding it)",
                    path.display()
                ),
            })
        }
    }
}

/// The components a bed runs: a containerd release (its daemon, shim and `ctr`) and a runc.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Version {
    pub containerd: ContainerdRelease,
    pub runc: RuncRelease,
}

/// The release binaries of a [`Version`], found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Binaries {
    pub containerd: PathBuf,
    pub shim: PathBuf,
    pub ctr: PathBuf,
    pub runc: PathBuf,
}

impl Version {
    /// Debian 12's containerd 1.6.20 and runc 1.1.5: what the beds first ran on.
    pub const DEBIAN: Self = Self { containerd: ContainerdRelease::V1_6_20, runc: RuncRelease::V1_1_5 };
    /// containerd 1.7.34 with runc 1.4.3.
    pub const V1_7: Self = Self { containerd: ContainerdRelease::V1_7_34, runc: RuncRelease::V1_4_3 };
    /// containerd 2.3.4 with runc 1.4.3.
    pub const V2_3: Self = Self { containerd: ContainerdRelease::V2_3_4, runc: RuncRelease::V1_4_3 };
    /// Every version a bed is run on.
    pub const ALL: [Self; 3] = [Self::DEBIAN, Self::V1_7, Self::V2_3];

    pub fn config_format(self) -> ConfigFormat {
        self.containerd.config_format()
    }

    /// The four binaries, or what is missing (each named, with where it was looked for).
    pub fn binaries(self) -> Result<Binaries, String> {
        self.binaries_in(&shared_bin())
    }

    /// [`Version::binaries`], with the release builds looked for in `shared`.
    pub fn binaries_in(self, shared: &Path) -> Result<Binaries, String> {
        let found = [
            self.containerd.program("containerd", shared),
            self.containerd.program("containerd-shim-runc-v2", shared),
            self.containerd.program("ctr", shared),
            self.runc.program(shared),
        ];
        let missing: Vec<&str> = found.iter().filter_map(|r| r.as_ref().err().map(String::as_str)).collect();
        if !missing.is_empty() {
            return Err(format!("{self}: {}", missing.join("; ")));
        }
        let [containerd, shim, ctr, runc] = found.map(|r| r.unwrap_or_default());
        Ok(Binaries { containerd, shim, ctr, runc })
    }

    /// Makes `dir` (if need be) and fills it with symlinks to this version's binaries named as
    /// containerd expects them: `containerd`, `containerd-shim-runc-v2`, `ctr` and `runc`.
    /// Put `dir` first on the daemon's `PATH`, and name `dir/runc` as the runtime's
    /// `BinaryName`.
    pub fn link_into(self, dir: &Path) -> Result<Binaries> {
        let b = self.binaries().map_err(anyhow::Error::msg)?;
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        for (name, target) in
            [(BinName::Containerd, &b.containerd), (BinName::Shim, &b.shim), (BinName::Ctr, &b.ctr), (BinName::Runc, &b.runc)]
        {
            let link = dir.join(name.file_name());
            std::os::unix::fs::symlink(target, &link).with_context(|| format!("symlink {} -> {}", link.display(), target.display()))?;
        }
        Ok(b)
    }
}

impl Default for Version {
    fn default() -> Self {
        Self::DEBIAN
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "containerd {} + runc {}", self.containerd.number(), self.runc.number())
    }
}

/// The names of a daemon's private bin dir.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinName {
    Containerd,
    Shim,
    Ctr,
    Runc,
}

impl BinName {
    pub fn file_name(self) -> &'static str {
        match self {
            Self::Containerd => "containerd",
            Self::Shim => "containerd-shim-runc-v2",
            Self::Ctr => "ctr",
            Self::Runc => "runc",
        }
    }
}

fn executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The absolute, canonical path of `program` in PATH.
pub fn which(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).map(|d| d.join(program)).find(|p| p.is_file()).and_then(|p| p.canonicalize().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_name_their_config_format_and_numbers() {
        assert_eq!(Version::DEBIAN.config_format(), ConfigFormat::V2);
        assert_eq!(Version::V1_7.config_format(), ConfigFormat::V2);
        assert_eq!(Version::V2_3.config_format(), ConfigFormat::V3);
        assert_eq!(Version::V2_3.to_string(), "containerd 2.3.4 + runc 1.4.3");
        assert_eq!(Version::default(), Version::DEBIAN);
    }

    #[test]
    fn a_missing_release_build_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = Version::V2_3.binaries_in(dir.path()).unwrap_err();
        for name in ["containerd-2.3.4", "containerd-shim-runc-v2-2.3.4", "ctr-2.3.4", "runc-1.4.3"] {
            assert!(err.contains(name), "{err}");
        }
    }
}
