//! OCI image-layout archives built here, from the static `/bin/busybox` (Debian package
//! `busybox-static`), since no image registry can be reached; imported with
//! `ctr images import` into the `k8s.io` namespace, where CRI finds them.
//!
//! An archive holds `oci-layout`, `index.json` (one manifest, annotated with
//! `io.containerd.image.name`) and `blobs/sha256/`: one uncompressed layer tar of a busybox
//! rootfs, the image config and the manifest. Every byte is deterministic, so the digests are
//! the same on every run.

use std::collections::BTreeMap;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::daemon::Containerd;
use crate::sys::run;

/// The pod sandbox image: `sleep` as PID 1, forever (until SIGKILL, which is what
/// `StopPodSandbox` sends).
pub const PAUSE: &str = "docker.io/local/pause:1";
/// The workload image: busybox, running `sh` unless told otherwise.
pub const BUSYBOX: &str = "docker.io/local/busybox:1";
/// Where the static busybox comes from.
pub const BUSYBOX_BIN: &str = "/bin/busybox";
/// The applets linked into `/bin` of the rootfs (busybox runs by the name it is called by).
pub const APPLETS: &[&str] = &[
    "sh", "sleep", "dd", "sync", "echo", "cat", "ls", "true", "false", "mkdir", "rm", "env", "ps", "date", "head", "wc", "id", "hostname",
    "mount", "df", "kill", "touch",
];
/// A fixed mtime for every entry, so the layer digest never changes.
const MTIME: u64 = 1_700_000_000;
const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";
const CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.image.config.v1+json";
const MANIFEST_MEDIA_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX_MEDIA_TYPE: &str = "application/vnd.oci.image.index.v1+json";
/// How long CRI may take to see an image `ctr` imported.
const VISIBLE_TIMEOUT: Duration = Duration::from_secs(10);

/// `sha256:HEX` of `data`.
pub fn digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A layer tar of a minimal busybox rootfs: `/bin/busybox`, its applets as symlinks, the
/// usual empty dirs, `/etc/passwd` and `/etc/group`.
pub fn busybox_layer() -> Result<Vec<u8>> {
    let busybox = std::fs::read(BUSYBOX_BIN).with_context(|| format!("read {BUSYBOX_BIN} (install the Debian package busybox-static)"))?;
    let mut b = tar::Builder::new(Vec::new());
    for (dir, mode) in [
        ("bin", 0o755),
        ("dev", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("root", 0o700),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        ("var", 0o755),
    ] {
        let mut h = header(EntryType::Directory, mode, 0);
        b.append_data(&mut h, format!("{dir}/"), std::io::empty())?;
    }
    let mut h = header(EntryType::Regular, 0o755, busybox.len() as u64);
    b.append_data(&mut h, "bin/busybox", busybox.as_slice())?;
    for applet in APPLETS {
        let mut h = header(EntryType::Symlink, 0o777, 0);
        b.append_link(&mut h, format!("bin/{applet}"), "busybox")?;
    }
    for (file, text) in [
        ("etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n"),
        ("etc/group", "root:x:0:\nnogroup:x:65534:\n"),
    ] {
        let mut h = header(EntryType::Regular, 0o644, text.len() as u64);
        b.append_data(&mut h, file, text.as_bytes())?;
    }
    Ok(b.into_inner()?)
}

fn header(kind: EntryType, mode: u32, size: u64) -> Header {
    let mut h = Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_size(size);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(MTIME);
    h
}

/// An OCI image-layout archive of one image named `name` (`docker.io/...:tag`), made of
/// `layer` with `argv` as its `Cmd`.
pub fn oci_archive(name: &str, layer: &[u8], argv: &[&str]) -> Result<Vec<u8>> {
    let layer_digest = digest(layer);
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "created": "2023-11-14T22:13:20Z",
        "config": {
            "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "Cmd": argv,
            "WorkingDir": "/",
        },
        "rootfs": { "type": "layers", "diff_ids": [layer_digest] },
        "history": [{ "created": "2023-11-14T22:13:20Z", "created_by": "plegwatch-scenarios" }],
    }))?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": { "mediaType": CONFIG_MEDIA_TYPE, "digest": digest(&config), "size": config.len() },
        "layers": [{ "mediaType": LAYER_MEDIA_TYPE, "digest": layer_digest, "size": layer.len() }],
    }))?;
    let tag = name.rsplit_once(':').map_or("latest", |(_, t)| t);
    let index = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": INDEX_MEDIA_TYPE,
        "manifests": [{
            "mediaType": MANIFEST_MEDIA_TYPE,
            "digest": digest(&manifest),
            "size": manifest.len(),
            "platform": { "architecture": "amd64", "os": "linux" },
            "annotations": {
                "io.containerd.image.name": name,
                "org.opencontainers.image.ref.name": tag,
            },
        }],
    }))?;
    // Blobs by digest: a BTreeMap also dedups and orders them.
    let blobs: BTreeMap<String, &[u8]> = [layer, &config, &manifest].into_iter().map(|blob| (digest(blob), blob)).collect();
    let mut b = tar::Builder::new(Vec::new());
    for dir in ["blobs/", "blobs/sha256/"] {
        let mut h = header(EntryType::Directory, 0o755, 0);
        b.append_data(&mut h, dir, std::io::empty())?;
    }
    for (d, blob) in &blobs {
        let hex = d.trim_start_matches("sha256:");
        let mut h = header(EntryType::Regular, 0o644, blob.len() as u64);
        b.append_data(&mut h, format!("blobs/sha256/{hex}"), *blob)?;
    }
    let layout = br#"{"imageLayoutVersion":"1.0.0"}"#;
    for (file, data) in [("oci-layout", &layout[..]), ("index.json", &index)] {
        let mut h = header(EntryType::Regular, 0o644, data.len() as u64);
        b.append_data(&mut h, file, data)?;
    }
    Ok(b.into_inner()?)
}

/// Imports the archive at `archive` with `ctr images import` into the daemon's `k8s.io`
/// namespace (unpacked into overlayfs), and waits until CRI sees `name`.
pub fn import(containerd: &Containerd, archive: &Path, name: &str) -> Result<()> {
    let started = Instant::now();
    run(containerd.ctr().args(["images", "import", "--snapshotter", "overlayfs"]).arg(archive))
        .with_context(|| format!("import {name}\n{}", containerd.log_tail(20)))?;
    let cri = containerd.cri()?;
    let deadline = Instant::now() + VISIBLE_TIMEOUT;
    while !cri.has_image(name)? {
        if Instant::now() >= deadline {
            bail!(
                "ctr imported {name}, but CRI ImageStatus does not find it after \
                 {VISIBLE_TIMEOUT:?}: {}",
                images(containerd).unwrap_or_else(|e| format!("{e:#}"))
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("imported {name} in {:.2}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// `ctr images ls` of the daemon, for failure messages.
pub fn images(containerd: &Containerd) -> Result<String> {
    run(containerd.ctr().args(["images", "ls"]))
}

/// Builds [`PAUSE`] and [`BUSYBOX`] and imports both.
pub fn import_test_images(containerd: &Containerd) -> Result<()> {
    let layer = busybox_layer()?;
    let images: [(&str, &[&str]); 2] = [(PAUSE, &["/bin/sleep", "2147483647"]), (BUSYBOX, &["/bin/sh"])];
    for (name, argv) in images {
        let archive = oci_archive(name, &layer, argv)?;
        let file = containerd.dir().join(format!("{}.oci.tar", name.replace(['/', ':'], "_")));
        std::fs::write(&file, &archive).with_context(|| format!("write {}", file.display()))?;
        import(containerd, &file, name)?;
        std::fs::remove_file(&file).ok();
    }
    Ok(())
}

/// The JSON `index.json` of an archive (for tests of the builder).
pub fn index_of(archive: &[u8]) -> Result<Value> {
    let mut a = tar::Archive::new(archive);
    for entry in a.entries()? {
        let mut entry = entry?;
        if entry.path()?.as_os_str() == "index.json" {
            return Ok(serde_json::from_reader(&mut entry)?);
        }
    }
    bail!("no index.json in the archive")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_is_deterministic_and_names_the_image() {
        let layer = b"not really a tar".to_vec();
        let a = oci_archive(PAUSE, &layer, &["/bin/sleep", "1"]).unwrap();
        let b = oci_archive(PAUSE, &layer, &["/bin/sleep", "1"]).unwrap();
        assert_eq!(digest(&a), digest(&b));
        let index = index_of(&a).unwrap();
        assert_eq!(index["manifests"][0]["annotations"]["io.containerd.image.name"], PAUSE);
        let mut names = Vec::new();
        for e in tar::Archive::new(a.as_slice()).entries().unwrap() {
            names.push(e.unwrap().path().unwrap().to_string_lossy().into_owned());
        }
        assert!(names.contains(&format!("blobs/sha256/{}", digest(&layer).trim_start_matches("sha256:"))));
        assert!(names.contains(&"oci-layout".to_string()));
    }

    #[test]
    fn digest_of_empty() {
        assert_eq!(digest(b""), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
