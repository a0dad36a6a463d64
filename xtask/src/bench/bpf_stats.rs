//! Where plegwatch's time in the kernel goes: each of its programs' runs and run time
//! over one loop, from the kernel's own BPF statistics (`kernel.bpf_stats_enabled`,
//! each program fd's `/proc/PID/fdinfo`: `run_cnt`, `run_time_ns`).
//!
//! Statistics cost every program run two clock reads, so they are on only for this
//! attribution pass, after the measured rounds: never under the ratios. What they
//! count is the programs' bodies; the hook's own cost (a trampoline, a tracepoint's
//! dispatch) is not in them, and is what the ratios against the floors show.

use std::collections::BTreeMap;
use std::process::Command;

use anyhow::{bail, Context, Result};

const SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

/// Statistics on while this lives; the old setting back on drop.
pub struct Enabled {
    old: String,
}

impl Enabled {
    pub fn on() -> Result<Self> {
        let old = std::fs::read_to_string(SYSCTL).with_context(|| format!("cannot read {SYSCTL}"))?;
        std::fs::write(SYSCTL, "1").with_context(|| format!("cannot write 1 to {SYSCTL}"))?;
        Ok(Enabled { old: old.trim().to_owned() })
    }
}

impl Drop for Enabled {
    fn drop(&mut self) {
        if let Err(e) = std::fs::write(SYSCTL, &self.old) {
            eprintln!("bench: cannot set {SYSCTL} back to {}: {e}", self.old);
        }
    }
}

/// Runs and run time of one program, by its name.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Counts {
    pub runs: u64,
    pub ns: u64,
}

/// The programs process `pid` holds open, by name (programs of one name summed: one
/// loaded per function it is attached to). The counts are the kernel's, from each
/// program fd's `/proc/PID/fdinfo` (`prog_id`, `run_cnt`, `run_time_ns`); the names are
/// bpftool's (`bpftool -j prog show`), by id, since fdinfo has none and a bpftool built
/// without pid iterators cannot say which process holds a program.
pub fn snapshot(pid: u32) -> Result<BTreeMap<String, Counts>> {
    let out = Command::new("bpftool").args(["-j", "prog", "show"]).output().context("cannot run bpftool")?;
    if !out.status.success() {
        bail!("bpftool -j prog show: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    let names = names(&out.stdout)?;
    let dir = format!("/proc/{pid}/fd");
    let mut by_id: BTreeMap<u64, Counts> = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("cannot list {dir}"))? {
        let Ok(entry) = entry else { continue };
        let is_prog = std::fs::read_link(entry.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:bpf-prog");
        if !is_prog {
            continue;
        }
        let info = format!("/proc/{pid}/fdinfo/{}", entry.file_name().to_string_lossy());
        if let Some((id, c)) = std::fs::read_to_string(&info).ok().as_deref().and_then(fdinfo) {
            by_id.insert(id, c);
        }
    }
    let mut by_name: BTreeMap<String, Counts> = BTreeMap::new();
    for (id, c) in by_id {
        let name = names.get(&id).cloned().unwrap_or_else(|| format!("prog {id}"));
        let sum = by_name.entry(name).or_default();
        sum.runs += c.runs;
        sum.ns += c.ns;
    }
    Ok(by_name)
}

/// Program names by id, from bpftool's JSON.
fn names(json: &[u8]) -> Result<BTreeMap<u64, String>> {
    let progs: Vec<serde_json::Value> = serde_json::from_slice(json).context("bpftool's JSON")?;
    Ok(progs.iter().filter_map(|p| Some((p["id"].as_u64()?, p["name"].as_str().unwrap_or("?").to_owned()))).collect())
}

/// A program fd's id and counts, from its fdinfo text (`prog_id:`, `run_cnt:`,
/// `run_time_ns:`; the counts are 0 while statistics are off).
fn fdinfo(text: &str) -> Option<(u64, Counts)> {
    let field = |key: &str| {
        text.lines().find_map(|l| l.strip_prefix(key).and_then(|v| v.strip_prefix(':')).and_then(|v| v.trim().parse::<u64>().ok()))
    };
    Some((field("prog_id")?, Counts { runs: field("run_cnt").unwrap_or(0), ns: field("run_time_ns").unwrap_or(0) }))
}

/// What ran between two snapshots, per program, busiest first.
pub fn delta(before: &BTreeMap<String, Counts>, after: &BTreeMap<String, Counts>) -> Vec<(String, Counts)> {
    let mut out: Vec<(String, Counts)> = after
        .iter()
        .map(|(name, a)| {
            let b = before.get(name).copied().unwrap_or_default();
            (name.clone(), Counts { runs: a.runs.saturating_sub(b.runs), ns: a.ns.saturating_sub(b.ns) })
        })
        .filter(|(_, c)| c.runs > 0)
        .collect();
    out.sort_by(|a, b| b.1.ns.cmp(&a.1.ns).then_with(|| a.0.cmp(&b.0)));
    out
}

/// The table for one tracer and loop: per program, runs per loop operation, ns per run
/// and ns per operation, and the total per operation.
pub fn render(tracer: &str, mode: &str, ops: u64, ran: &[(String, Counts)]) -> String {
    let ops = ops.max(1) as f64;
    let mut text = format!("{tracer}, loop {mode} ({ops:.0} operations): program, runs/op, ns/run, ns/op\n");
    let mut total = 0.0;
    for (name, c) in ran {
        let per_op = c.ns as f64 / ops;
        total += per_op;
        text += &format!("  {name:<16} {:>7.2} {:>8.1} {:>8.1}\n", c.runs as f64 / ops, c.ns as f64 / c.runs.max(1) as f64, per_op);
    }
    text += &format!("  {:<16} {:>7} {:>8} {:>8.1}\n", "all", "", "", total);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_fds_counts_come_from_its_fdinfo() {
        let text = "pos:\t0\nflags:\t02000002\nmnt_id:\t15\nino:\t1057\nprog_type:\t26\nprog_jited:\t1\n\
                    prog_tag:\t0d45edc78f35552f\nmemlock:\t4096\nprog_id:\t815\nrun_time_ns:\t6000\nrun_cnt:\t20\n";
        assert_eq!(fdinfo(text), Some((815, Counts { runs: 20, ns: 6000 })));
        assert_eq!(fdinfo("prog_id:\t9\n"), Some((9, Counts::default())), "statistics off: no counts");
        assert_eq!(fdinfo("map_id:\t3\n"), None, "not a program");
        let named = names(br#"[{"id":815,"name":"sock_fexit_w"},{"id":816}]"#).expect("parsed");
        assert_eq!(named.get(&815).map(String::as_str), Some("sock_fexit_w"));
        assert!(names(b"not json").is_err());
    }

    #[test]
    fn a_delta_keeps_what_ran_busiest_first() {
        let before: BTreeMap<String, Counts> =
            [("a".to_string(), Counts { runs: 1, ns: 10 }), ("b".to_string(), Counts { runs: 5, ns: 50 })].into();
        let mut after = before.clone();
        after.insert("a".into(), Counts { runs: 21, ns: 6010 });
        after.insert("c".into(), Counts { runs: 10, ns: 9000 });
        let ran = delta(&before, &after);
        assert_eq!(
            ran,
            vec![("c".to_string(), Counts { runs: 10, ns: 9000 }), ("a".to_string(), Counts { runs: 20, ns: 6000 })],
            "unchanged programs left out"
        );
        let text = render("plegwatch", "unix", 10, &ran);
        assert!(text.contains("2.00") && text.contains("300.0") && text.contains("600.0") && text.contains("1500.0"), "{text}");
    }
}
