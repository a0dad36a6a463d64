//! The kernel-mutex probe (`lock:contention_begin`) records the waits of threads that can be
//! in a chain, with the mutex's owner, and only those (issue 12: it used to take a stack on
//! every contended mutex on the node).
//!
//! `rtnl_holder hold` (tests/fixtures/rtnl-holder) holds the real `rtnl_mutex`: an ethtool
//! ioctl whose argument straddles into a userfaultfd page the fixture leaves unresolved, so
//! the kernel sleeps on the fault with the mutex held. Behind it, while plegwatch runs:
//! - `ip link set dev lo mtu <its mtu>`, started after plegwatch is ready: its netlink socket
//!   is tracked, and it is in a socket call (`sendmsg`) when it blocks on the mutex. It must
//!   be in plegwatch's `LOCK_WAITS`, with the holder's thread as the owner;
//! - `rtnl_holder contend`, an ethtool ioctl on an AF_INET socket from a process of no
//!   interest: it must not be there.
//!
//! After both end, the map's gate (`LOCK_WAITS_OPEN`) must be back at 0: `contention_end`
//! removed what `contention_begin` put in. The maps are read with bpftool, by the ids of the
//! maps plegwatch's process holds (other tracers may run at the same time).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use serde_json::Value;

use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Plegwatch};

/// How long the holder keeps rtnl_mutex: long enough for the map to be read while the
/// others wait, short enough not to disturb the node.
const HOLD_S: u32 = 3;

fn build_fixture() -> Result<PathBuf> {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    let dir = target.join("rtnl-holder");
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let bin = dir.join("rtnl_holder");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/rtnl-holder/rtnl_holder.c");
    let status = Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .context("run gcc (Debian package gcc)")?;
    ensure!(status.success(), "gcc {}: {status}", src.display());
    Ok(bin)
}

/// Starts `bin args` and reads its first stdout line, `WORD <tid>`.
fn start_tid(bin: &Path, args: &[&str], word: &str) -> Result<(Child, u32)> {
    let mut child = Command::new(bin).args(args).stdout(Stdio::piped()).spawn().with_context(|| format!("start {}", bin.display()))?;
    let mut line = String::new();
    let out = child.stdout.take().context("no stdout")?;
    BufReader::new(out).read_line(&mut line)?;
    let tid = line
        .strip_prefix(word)
        .and_then(|r| r.trim().parse().ok())
        .with_context(|| format!("rtnl_holder {args:?} printed {line:?}, not `{word} <tid>`"))?;
    Ok((child, tid))
}

fn bpftool(args: &[&str]) -> Result<Value> {
    let out = Command::new("bpftool").arg("-j").args(args).output().context("run bpftool (cargo xtask setup installs it)")?;
    ensure!(out.status.success(), "bpftool {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).with_context(|| format!("bpftool {args:?} output"))
}

/// The id of the map called `name` that process `pid` holds: its fds' `map_id` lines in
/// /proc/PID/fdinfo, matched with `bpftool map show`.
fn map_id(name: &str, pid: u32) -> Result<u64> {
    let mut held = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))?.flatten() {
        let info = std::fs::read_to_string(e.path()).unwrap_or_default();
        held.extend(info.lines().filter_map(|l| l.strip_prefix("map_id:")).filter_map(|v| v.trim().parse::<u64>().ok()));
    }
    let maps = bpftool(&["map", "show"])?;
    let all = maps.as_array().cloned().unwrap_or_default();
    let ours = all.iter().find(|m| m["name"] == name && m["id"].as_u64().is_some_and(|id| held.contains(&id)));
    match ours {
        Some(m) => m["id"].as_u64().context("map without id"),
        None => bail!("no map {name} among the {} maps plegwatch (pid {pid}) holds", held.len()),
    }
}

/// A bpftool hex-byte array as little-endian bytes.
fn bytes(v: &Value) -> Vec<u8> {
    v.as_array()
        .map(|a| a.iter().filter_map(|b| b.as_str().and_then(|s| u8::from_str_radix(s.trim_start_matches("0x"), 16).ok())).collect())
        .unwrap_or_default()
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    b.get(off..off + 4).map(|s| u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

/// `LOCK_WAITS`: waiter tid → owner tid (`LockWait.owner_tid` at byte 16).
fn lock_waits(id: u64) -> Result<Vec<(u32, u32)>> {
    let dump = bpftool(&["map", "dump", "id", &id.to_string()])?;
    Ok(dump
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|e| Some((u32_at(&bytes(&e["key"]), 0)?, u32_at(&bytes(&e["value"]), 16)?)))
        .collect())
}

fn gate(id: u64) -> Result<u64> {
    let dump = bpftool(&["map", "dump", "id", &id.to_string()])?;
    let b = bytes(&dump[0]["value"]);
    ensure!(b.len() == 8, "LOCK_WAITS_OPEN value {:?}", dump);
    Ok(u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
}

#[test]
fn only_waiters_that_matter_are_recorded_with_the_owner() -> Result<()> {
    preflight::require();
    let holder_bin = build_fixture()?;
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;
    let waits_id = map_id("LOCK_WAITS", plegwatch.pid())?;

    let (mut holder, owner) = start_tid(&holder_bin, &["hold", &HOLD_S.to_string()], "HOLDING")?;
    let began = Instant::now();
    let mtu = std::fs::read_to_string("/sys/class/net/lo/mtu").context("lo's mtu")?;
    let mut ip = Command::new("ip").args(["link", "set", "dev", "lo", "mtu", mtu.trim()]).spawn().context("run ip")?;
    let ip_pid = ip.id();
    let (mut other, other_tid) = start_tid(&holder_bin, &["contend"], "CONTENDING")?;

    // Both are behind the mutex within moments; read the map until both have had time.
    let mut seen = Vec::new();
    while began.elapsed() < Duration::from_secs(HOLD_S as u64 - 1) {
        std::thread::sleep(Duration::from_millis(200));
        seen = lock_waits(waits_id)?;
        if seen.iter().any(|(t, _)| *t == ip_pid) && began.elapsed() > Duration::from_millis(1000) {
            break;
        }
    }
    let ip_still_blocked = ip.try_wait()?.is_none();
    let other_still_blocked = other.try_wait()?.is_none();
    eprintln!(
        "LOCK_WAITS after {:.1}s (waiter tid, owner tid): {seen:?}; holder tid {owner}, ip {ip_pid}, other {other_tid}",
        began.elapsed().as_secs_f64()
    );

    let holder_ok = holder.wait()?.success();
    let ip_ok = ip.wait()?.success();
    other.wait()?;
    ensure!(holder_ok, "rtnl_holder hold failed (userfaultfd or ethtool ioctl refused?)");
    ensure!(
        ip_still_blocked && other_still_blocked,
        "ip or the contender did not wait on rtnl_mutex (ip blocked {ip_still_blocked}, contender {other_still_blocked})"
    );
    ensure!(ip_ok, "ip link set failed");
    let ip_entry = seen.iter().find(|(t, _)| *t == ip_pid);
    ensure!(ip_entry.is_some(), "the netlink requester (ip, tid {ip_pid}) behind rtnl_mutex is not in LOCK_WAITS: {seen:?}");
    ensure!(ip_entry.map(|e| e.1) == Some(owner), "owner of ip's wait is {:?}, not the holder's thread {owner}", ip_entry.map(|e| e.1));
    ensure!(!seen.iter().any(|(t, _)| *t == other_tid), "a contender of no interest (tid {other_tid}) was recorded: {seen:?}");

    // Everything has let go: their entries are gone and the gate counts what is left (other
    // threads that matter may contend on some mutex meanwhile, each for a moment).
    let gate_id = map_id("LOCK_WAITS_OPEN", plegwatch.pid())?;
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let g = gate(gate_id)?;
        let left = lock_waits(waits_id)?;
        let ours = left.iter().any(|(t, _)| *t == ip_pid || *t == other_tid);
        if g == left.len() as u64 && !ours {
            break;
        }
        ensure!(Instant::now() < deadline, "LOCK_WAITS_OPEN is {g} with entries {left:?} after the waiters let go");
        std::thread::sleep(Duration::from_millis(100));
    }
    plegwatch.stop()?;
    Ok(())
}
