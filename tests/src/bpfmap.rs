//! Filling one of plegwatch's eBPF maps from a test, through Debian's `bpftool`: how a test
//! makes a map full on a real kernel (a map of in-flight calls never fills by itself in a
//! test: it would take a thousand threads inside the same syscall at once).

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;
use std::process::Command;

/// The id of the hash map `name` that process `owner` holds (`bpftool map show`: its `pids`;
/// without them, the newest map of that name, ids being handed out in increasing order).
pub fn map_id(owner: u32, name: &str) -> Result<u64> {
    let out = Command::new("bpftool").args(["-j", "map", "show"]).output().context("run bpftool (Debian package bpftool)")?;
    ensure!(out.status.success(), "bpftool map show: {}", String::from_utf8_lossy(&out.stderr).trim());
    let maps: Vec<Value> = serde_json::from_slice(&out.stdout).context("bpftool map show's JSON")?;
    let named: Vec<&Value> = maps.iter().filter(|m| m["name"] == name).collect();
    let owned = |m: &&Value| m["pids"].as_array().is_some_and(|p| p.iter().any(|p| p["pid"].as_u64() == Some(u64::from(owner))));
    let pick = named.iter().copied().filter(owned).chain(named.iter().copied()).max_by_key(|m| (owned(m), m["id"].as_u64()));
    pick.and_then(|m| m["id"].as_u64()).with_context(|| format!("no eBPF map named {name} (of pid {owner}) in bpftool map show"))
}

/// Puts `count` entries of 4-byte keys from `first_key` up and `value_size` zero bytes
/// each into map `id`, in one `bpftool batch`, which stops at the first update the map
/// refuses (it is full: the point). Then returns (entries, max_entries) as bpftool sees them.
pub fn fill_u32_keys(id: u64, first_key: u32, count: u32, value_size: usize) -> Result<(usize, u64)> {
    let value = vec!["0"; value_size].join(" ");
    let mut batch = String::new();
    for k in first_key..first_key + count {
        let b = k.to_ne_bytes();
        batch.push_str(&format!("map update id {id} key {} {} {} {} value {value} noexist\n", b[0], b[1], b[2], b[3]));
    }
    let file = tempfile::NamedTempFile::new().context("batch file")?;
    std::fs::write(file.path(), batch).context("write the batch file")?;
    let out = Command::new("bpftool").arg("batch").arg("file").arg(file.path()).output().context("run bpftool batch")?;
    eprintln!("bpftool batch of {count} updates on map {id}: {}", String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("ok"));
    let show = Command::new("bpftool").args(["-j", "map", "show", "id", &id.to_string()]).output().context("bpftool map show id")?;
    let max = serde_json::from_slice::<Value>(&show.stdout).ok().and_then(|m| m["max_entries"].as_u64()).context("max_entries")?;
    let dump = Command::new("bpftool").args(["-j", "map", "dump", "id", &id.to_string()]).output().context("bpftool map dump")?;
    if !dump.status.success() {
        bail!("bpftool map dump id {id}: {}", String::from_utf8_lossy(&dump.stderr).trim());
    }
    let entries = serde_json::from_slice::<Vec<Value>>(&dump.stdout).context("bpftool map dump's JSON")?.len();
    Ok((entries, max))
}
