//! Searching a live process's memory for a byte string: every readable mapping of
//! `/proc/PID/maps` that has pages (`Rss` in `/proc/PID/smaps`), read through `/proc/PID/mem`
//! (root). Used to prove that secrets a traced process sent never reached plegwatch.

use std::fs::File;
use std::os::unix::fs::FileExt;

use anyhow::{Context, Result};

/// One mapping that was read.
#[derive(Clone, Debug)]
pub struct Region {
    pub start: u64,
    pub end: u64,
    /// The mapping's name (`[heap]`, a path, `anon_inode:bpf-map`), empty for anonymous.
    pub name: String,
    /// Bytes actually read (some mappings refuse reads: `[vvar]`).
    pub read: u64,
}

/// What a scan found.
#[derive(Clone, Debug, Default)]
pub struct Scan {
    pub regions: Vec<Region>,
    /// For each needle, the names of the regions it was found in (with its address).
    pub hits: Vec<Vec<String>>,
}

impl Scan {
    pub fn bytes_read(&self) -> u64 {
        self.regions.iter().map(|r| r.read).sum()
    }
}

/// Reads every readable mapping of `pid` that has resident pages and looks for each of
/// `needles` in it (a needle cut by a chunk boundary is still found: chunks overlap).
pub fn scan(pid: u32, needles: &[&[u8]]) -> Result<Scan> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).with_context(|| format!("read /proc/{pid}/smaps"))?;
    let mem = File::open(format!("/proc/{pid}/mem")).with_context(|| format!("open /proc/{pid}/mem"))?;
    let longest = needles.iter().map(|n| n.len()).max().unwrap_or(0);
    let mut out = Scan { hits: vec![Vec::new(); needles.len()], ..Scan::default() };
    let mut current: Option<(u64, u64, bool, String)> = None;
    let mut regions = Vec::new();
    for line in smaps.lines() {
        let mut f = line.split_whitespace();
        let first = f.next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|(a, _)| u64::from_str_radix(a, 16).is_ok()) {
            let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else { continue };
            let perms = f.next().unwrap_or("");
            let name = f.nth(3).map(str::to_string).unwrap_or_default();
            current = Some((start, end, perms.starts_with('r'), name));
        } else if first == "Rss:" {
            let kb: u64 = f.next().and_then(|k| k.parse().ok()).unwrap_or(0);
            if let Some((start, end, readable, name)) = current.take() {
                if readable && kb > 0 {
                    regions.push((start, end, name));
                }
            }
        }
    }
    const CHUNK: u64 = 1 << 20;
    for (start, end, name) in regions {
        let mut region = Region { start, end, name: name.clone(), read: 0 };
        let mut at = start;
        while at < end {
            let len = (end - at).min(CHUNK + longest as u64);
            let mut buf = vec![0u8; len as usize];
            match mem.read_at(&mut buf, at) {
                Ok(n) if n > 0 => {
                    buf.truncate(n);
                    region.read += (n as u64).min(CHUNK);
                    for (i, needle) in needles.iter().enumerate() {
                        if let Some(off) = memchr::memmem::find(&buf, needle) {
                            let hit = format!(
                                "{:#x} in {:#x}-{:#x} {}",
                                at + off as u64,
                                start,
                                end,
                                if name.is_empty() { "[anon]" } else { &name }
                            );
                            if !out.hits[i].contains(&hit) {
                                out.hits[i].push(hit);
                            }
                        }
                    }
                }
                _ => break,
            }
            at += CHUNK;
        }
        out.regions.push(region);
    }
    Ok(out)
}
