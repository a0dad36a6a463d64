//! `plegwatch doctor`: what this node offers, tried for real, and the attach
//! variant each probe will use.

use crate::{
    kernel::loader::{self, LoadOptions},
    kernel::probes::{self, program_mut},
};
use aya::{
    maps::MapType,
    programs::{
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
        uprobe::UProbeScope,
        BtfTracePoint, FEntry, KProbe, PerfEvent, RawTracePoint, TracePoint, UProbe,
    },
    Btf, Ebpf,
};
use serde::Serialize;
use std::time::Duration;

/// One line of the report.
#[derive(Clone, Debug, Serialize)]
pub struct Check {
    pub name: String,
    pub ok: bool,
    /// Needed for `plegwatch watch` to run at all.
    pub required: bool,
    pub detail: String,
}

/// The variant a probe will use.
#[derive(Clone, Debug, Serialize)]
pub struct ProbeReport {
    pub probe: String,
    pub about: String,
    pub variant: Option<String>,
    pub passed_over: Vec<String>,
}

/// Everything `doctor` found.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub kernel: String,
    pub checks: Vec<Check>,
    pub program_types: Vec<Check>,
    pub probes: Vec<ProbeReport>,
    /// The Go binaries plegwatch would probe (running now, or at their usual
    /// paths), and whether their version is one it knows. Never fatal: an
    /// unknown binary is left alone and the other probes go on.
    pub go_targets: Vec<GoTargetReport>,
    /// `None` when ready; else the first required thing missing.
    pub problem: Option<String>,
    /// What seed chains lose to probes that are off, one entry per probe
    /// (`probe off: what`): the verdict is `degraded` when any is.
    pub degraded: Vec<String>,
}

impl Report {
    /// `ready`, `degraded` or `not ready`.
    pub fn verdict(&self) -> &'static str {
        match (&self.problem, self.degraded.is_empty()) {
            (Some(_), _) => "not ready",
            (None, false) => "degraded",
            (None, true) => "ready",
        }
    }
}

/// What the seed chains lose to the probes in `probes` that are off: `probe off: what`.
fn seed_chain_losses(probes: &[ProbeReport]) -> Vec<String> {
    probes
        .iter()
        .filter(|p| p.variant.as_deref() == Some("off"))
        .filter_map(|p| probes::loss_of(&p.probe).filter(|l| l.seed_chain).map(|l| format!("{} off: {}", p.probe, l.what)))
        .collect()
}

/// A Go binary plegwatch would probe.
#[derive(Clone, Debug, Serialize)]
pub struct GoTargetReport {
    pub target: String,
    pub binary: String,
    /// Processes running it now.
    pub pids: Vec<u32>,
    /// `supported` (every expected function found and decoded), `partial`
    /// (some left out: see `missing`), `unmatched` (none, or not a Go
    /// binary: not probed) or `unreadable`.
    pub status: &'static str,
    pub go_version: Option<String>,
    pub functions: Vec<String>,
    /// Expected functions left out, each as `pkg.(*T).M (why)`.
    pub missing: Vec<String>,
    pub g_tls_offset: Option<i64>,
    pub detail: Option<String>,
}

/// Target binaries named on the command line (`--containerd PATH`, ...),
/// looked at besides those running now or at their usual paths.
#[derive(Clone, Debug, Default)]
pub struct Named(pub Vec<(&'static str, std::path::PathBuf)>);

/// Looks at every target binary without attaching anything: running now,
/// at the usual paths, or `named`. Needs no privileges.
pub fn go_targets(named: &Named) -> Vec<GoTargetReport> {
    use crate::sources::gowatch::{attach, targets::short};
    attach::survey_with(&named.0)
        .into_iter()
        .map(|f| {
            let mut r = GoTargetReport {
                target: f.target.name.into(),
                binary: f.path.display().to_string(),
                pids: f.pids.clone(),
                status: "unreadable",
                go_version: None,
                functions: Vec::new(),
                missing: Vec::new(),
                g_tls_offset: None,
                detail: None,
            };
            match attach::inspect(&f.path, f.target) {
                Ok(i) => {
                    r.status = match (i.found.len(), i.missing.len()) {
                        (0, _) => "unmatched",
                        (_, 0) => "supported",
                        _ => "partial",
                    };
                    r.go_version = i.go_version;
                    r.functions = i.found.iter().map(|(s, p)| format!("{} ({} RETs)", short(s.symbol), p.ret_offsets.len())).collect();
                    r.missing = i.missing.iter().map(attach::Missing::describe).collect();
                    r.g_tls_offset = i.g_tls.as_ref().ok().copied();
                    r.detail = i.g_tls.err().map(|e| format!("no goroutine ids at kernel probes: {e}"));
                }
                Err(e) => {
                    if !matches!(e, crate::proto::gosym::GoSymError::Io { .. }) {
                        r.status = "unmatched";
                    }
                    r.detail = Some(e.to_string());
                }
            }
            r
        })
        .collect()
}

fn check(name: &str, required: bool, r: Result<String, String>) -> Check {
    match r {
        Ok(detail) => Check { name: name.into(), ok: true, required, detail },
        Err(detail) => Check { name: name.into(), ok: false, required, detail },
    }
}

/// The function the uprobe check attaches to: a symbol of plegwatch's own binary.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn plegwatch_doctor_uprobe_target() -> u64 {
    std::hint::black_box(42)
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map(|s| s.trim().to_string()).unwrap_or_else(|_| "unknown".into())
}

/// Runs every check. Fixes what it can: mounts tracefs if it is not mounted.
pub fn run(named: &Named) -> Report {
    let mut checks = Vec::new();
    let root = loader::require_root();
    checks.push(check("privileges", true, root.as_ref().map(|_| "root (euid 0)".to_string()).map_err(|e| e.to_string())));
    let btf = Btf::from_sys_fs();
    checks.push(check(
        "btf",
        false,
        btf.as_ref()
            .map(|_| "/sys/kernel/btf/vmlinux".to_string())
            .map_err(|e| format!("no kernel BTF ({e}): tp_btf and fentry probes are off")),
    ));
    let tracefs = if root.is_ok() {
        loader::ensure_tracefs()
            .map(|t| if t.mounted_now { format!("{} (was not mounted: mounted it now)", t.path) } else { t.path.to_string() })
            .map_err(|e| e.to_string())
    } else {
        Err("not checked: needs root".into())
    };
    checks.push(check("tracefs", true, tracefs));

    let mut program_types = Vec::new();
    let mut probes_out = Vec::new();
    if root.is_ok() {
        match loader::load(LoadOptions { report_min: Duration::from_secs(1), tracer_tgid: crate::observe::namespaces::self_tgid() }) {
            Ok((mut ebpf, offsets)) => {
                checks.push(check(
                    "goroutines",
                    false,
                    offsets
                        .task_fsbase
                        .offset()
                        .map(|off| format!("task_struct.thread.fsbase at {off}: kernel waits of Go targets carry their goroutine"))
                        .ok_or_else(|| {
                            format!(
                                "{}: Go locks are joined to their holder's kernel waits by thread only",
                                offsets.task_fsbase.reason().unwrap_or_default()
                            )
                        }),
                ));
                checks.push(check("go uprobes", false, go_uprobes(&mut ebpf, &offsets)));
                program_types = try_program_types(&mut ebpf, btf.as_ref().ok());
                let env = probes::AttachEnv::probe(offsets.task_pid.offset().is_some());
                for p in probes::PROBES {
                    let r = probes::attach(&mut ebpf, &env, p);
                    probes_out.push(ProbeReport {
                        probe: p.name.into(),
                        about: p.about.into(),
                        variant: r.as_ref().ok().map(|c| c.variant.describe()),
                        passed_over: match &r {
                            Ok(c) => c.passed_over.clone(),
                            Err(e) => vec![e.to_string()],
                        },
                    });
                }
            }
            Err(e) => checks.push(check("ebpf object", true, Err(e.to_string()))),
        }
    }
    let problem =
        checks.iter().chain(program_types.iter()).find(|c| c.required && !c.ok).map(|c| format!("{}: {}", c.name, c.detail)).or_else(
            || probes_out.iter().find(|p| p.variant.is_none()).map(|p| format!("probe {}: {}", p.probe, p.passed_over.join("; "))),
        );
    let degraded = seed_chain_losses(&probes_out);
    Report { kernel: kernel_release(), checks, program_types, probes: probes_out, go_targets: go_targets(named), problem, degraded }
}

/// How Go probe points will name their function here: attach cookies, or
/// (before Linux 5.15) their place in the code, whose programs must load and
/// whose kernel fields must be in BTF.
fn go_uprobes(ebpf: &mut Ebpf, offsets: &crate::kernel::btf::KernelOffsets) -> Result<String, String> {
    use crate::sources::gowatch::attach::{choose_mode, GoUprobes};
    match choose_mode(ebpf, GoUprobes::Auto) {
        (GoUprobes::Cookie, _) => Ok("cookie: each probe point names its function with an attach cookie".into()),
        (_, why) => {
            if let Some(f) = [&offsets.task_mm, &offsets.mm_start_code, &offsets.mm_end_code].into_iter().find(|f| f.offset().is_none()) {
                return Err(format!("no Go function timing: {f}"));
            }
            for program in ["go_entry_at", "go_ret_at"] {
                let p: &mut UProbe = program_mut(ebpf, program)?;
                p.load().map_err(|e| format!("no Go function timing: {program} does not load: {e}"))?;
            }
            Ok(format!("address: probe points are found by their place in the code ({})", why.unwrap_or_default()))
        }
    }
}

fn try_program_types(ebpf: &mut Ebpf, btf: Option<&Btf>) -> Vec<Check> {
    let need_btf = || Err::<String, String>("needs kernel BTF".into());
    vec![
        check(
            "tracepoint",
            true,
            (|| {
                let p: &mut TracePoint = program_mut(ebpf, "doctor_tracepoint")?;
                p.load().map_err(|e| e.to_string())?;
                p.attach("sched", "sched_process_fork").map_err(|e| e.to_string())?;
                Ok("loads and attaches".to_string())
            })(),
        ),
        check(
            "raw_tp",
            false,
            (|| {
                let p: &mut RawTracePoint = program_mut(ebpf, "doctor_raw_tp")?;
                p.load().map_err(|e| e.to_string())?;
                p.attach("sched_process_fork").map_err(|e| e.to_string())?;
                Ok("loads and attaches".to_string())
            })(),
        ),
        check(
            "tp_btf",
            false,
            match btf {
                None => need_btf(),
                Some(btf) => (|| {
                    let p: &mut BtfTracePoint = program_mut(ebpf, "doctor_tp_btf")?;
                    p.load("sched_switch", btf).map_err(|e| e.to_string())?;
                    p.attach().map_err(|e| e.to_string())?;
                    Ok("loads and attaches".to_string())
                })(),
            },
        ),
        check(
            "fentry",
            false,
            match btf {
                None => need_btf(),
                Some(btf) => (|| {
                    let p: &mut FEntry = program_mut(ebpf, "doctor_fentry")?;
                    p.load("vfs_fsync_range", btf).map_err(|e| {
                        format!("refused: {}", e.to_string().trim_end_matches([' ', ':']).trim_end_matches(". Verifier output"))
                    })?;
                    p.attach().map_err(|e| format!("refused: {e}"))?;
                    Ok("loads and attaches".to_string())
                })(),
            },
        ),
        check(
            "kprobe",
            false,
            (|| {
                let p: &mut KProbe = program_mut(ebpf, "doctor_kprobe")?;
                p.load().map_err(|e| e.to_string())?;
                p.attach("vfs_fsync_range", 0).map_err(|e| format!("absent or refused: {e}"))?;
                Ok("loads and attaches".to_string())
            })(),
        ),
        check(
            "uprobe",
            false,
            (|| {
                let p: &mut UProbe = program_mut(ebpf, "doctor_uprobe")?;
                p.load().map_err(|e| e.to_string())?;
                let exe = std::fs::read_link("/proc/self/exe").map_err(|e| e.to_string())?;
                p.attach("plegwatch_doctor_uprobe_target", &exe, UProbeScope::AllProcesses).map_err(|e| e.to_string())?;
                plegwatch_doctor_uprobe_target();
                Ok("loads and attaches".to_string())
            })(),
        ),
        check(
            "ring buffer",
            true,
            match aya::sys::is_map_supported(MapType::RingBuf) {
                Ok(true) => Ok("supported".into()),
                Ok(false) => Err("not supported (needs Linux >= 5.8)".into()),
                Err(e) => Err(e.to_string()),
            },
        ),
        check(
            "perf event",
            false,
            (|| {
                let p: &mut PerfEvent = program_mut(ebpf, "doctor_perf_event")?;
                p.load().map_err(|e| e.to_string())?;
                p.attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu: 0 },
                    SamplePolicy::Frequency(1),
                    false,
                )
                .map_err(|e| e.to_string())?;
                Ok("loads and attaches (software CPU clock)".to_string())
            })(),
        ),
    ]
}

/// The report as text.
pub fn render(r: &Report) -> String {
    let mark = |c: &Check| {
        if c.ok {
            "ok  "
        } else if c.required {
            "FAIL"
        } else {
            "off "
        }
    };
    let mut out = format!("plegwatch doctor\n  kernel        {}\n", r.kernel);
    for c in &r.checks {
        out.push_str(&format!("  {:<13} {} {}\n", c.name, mark(c), c.detail));
    }
    if !r.program_types.is_empty() {
        out.push_str("  program types (loaded and attached for real)\n");
        for c in &r.program_types {
            out.push_str(&format!("    {:<11} {} {}\n", c.name, mark(c), c.detail));
        }
    }
    if !r.probes.is_empty() {
        out.push_str("  probes (attach variant chosen)\n");
        for p in &r.probes {
            out.push_str(&format!("    {:<16} {}\n", p.probe, p.variant.as_deref().unwrap_or("NONE")));
            for why in &p.passed_over {
                out.push_str(&format!("      passed over: {why}\n"));
            }
        }
    }
    if !r.go_targets.is_empty() {
        out.push_str("  Go targets (entry + RET uprobes from .gopclntab)\n");
        for t in &r.go_targets {
            let pids = if t.pids.is_empty() { "not running".to_string() } else { format!("pids {:?}", t.pids) };
            out.push_str(&format!(
                "    {:<16} {:<10} {} ({}, {})\n",
                t.target,
                t.status,
                t.binary,
                t.go_version.as_deref().unwrap_or("go version unknown"),
                pids
            ));
            if !t.missing.is_empty() {
                out.push_str(&format!("      left out: {}\n", t.missing.join(", ")));
            }
            if let Some(d) = &t.detail {
                out.push_str(&format!("      {d}\n"));
            }
        }
    }
    match &r.problem {
        Some(p) => out.push_str(&format!("  verdict       NOT READY: {p}\n")),
        None if !r.degraded.is_empty() => {
            out.push_str("  verdict       DEGRADED: plegwatch runs, but these chains are not seen\n");
            for d in &r.degraded {
                out.push_str(&format!("                - {d}\n"));
            }
        }
        None => out.push_str("  verdict       ready\n"),
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `doctor --containerd X --shim Y --runc Z` (the Go target part needs no
    /// root): the release builds in /work/shared/bin are `supported`, with
    /// every expected function and `g`'s TLS offset. Under `CI` a missing
    /// binary fails naming it.
    #[test]
    fn named_binaries_are_supported() {
        let dir = std::path::Path::new("/work/shared/bin");
        let named: Vec<(&'static str, std::path::PathBuf)> = [
            ("containerd", "containerd-1.7.34"),
            ("containerd", "containerd-2.3.4"),
            ("containerd-shim", "containerd-shim-runc-v2-1.7.34"),
            ("containerd-shim", "containerd-shim-runc-v2-2.3.4"),
            ("runc", "runc-1.4.3"),
        ]
        .into_iter()
        .map(|(t, f)| (t, dir.join(f)))
        .filter(|(_, p)| {
            let there = p.exists();
            assert!(there || std::env::var_os("CI").is_none(), "{}: required under CI", p.display());
            if !there {
                println!("SKIP {}: missing; under CI this fails", p.display());
            }
            there
        })
        .collect();
        let report = go_targets(&Named(named.clone()));
        for (target, path) in &named {
            let r = report
                .iter()
                .find(|r| std::path::Path::new(&r.binary) == path)
                .unwrap_or_else(|| panic!("{} not in the report", path.display()));
            assert_eq!((r.target.as_str(), r.status), (*target, "supported"), "{}: {:?}", path.display(), r.missing);
            assert!(r.missing.is_empty() && !r.functions.is_empty(), "{r:?}");
            assert_eq!(r.g_tls_offset, Some(-8), "{r:?}");
        }
        let text = render(&Report {
            kernel: "test".into(),
            checks: Vec::new(),
            program_types: Vec::new(),
            probes: Vec::new(),
            go_targets: report,
            problem: None,
            degraded: Vec::new(),
        });
        for (_, path) in &named {
            assert!(text.lines().any(|l| l.contains("supported") && l.contains(&*path.to_string_lossy())), "{text}");
        }
    }

    /// A probe a seed chain needs, off: the verdict is degraded and names what is lost;
    /// one no seed chain needs leaves it ready; a missing requirement is not ready.
    #[test]
    fn the_verdict_is_degraded_when_a_seed_chain_is_lost() {
        let probe = |name: &str, variant: &str| ProbeReport {
            probe: name.into(),
            about: String::new(),
            variant: Some(variant.into()),
            passed_over: Vec::new(),
        };
        let report = |probes: Vec<ProbeReport>, problem: Option<String>| {
            let degraded = seed_chain_losses(&probes);
            Report {
                kernel: "test".into(),
                checks: Vec::new(),
                program_types: Vec::new(),
                probes,
                go_targets: Vec::new(),
                problem,
                degraded,
            }
        };
        let r = report(vec![probe("wait_enter", "tracepoint x"), probe("socket_io", "off"), probe("block_io", "off")], None);
        assert_eq!(r.verdict(), "degraded");
        let text = render(&r);
        assert!(text.contains("verdict       DEGRADED") && !text.contains("ready"), "{text}");
        assert!(text.contains("- socket_io off: netlink requests (the Terway chain)"), "{text}");
        assert!(text.contains("- block_io off: the device hop"), "{text}");
        let r = report(vec![probe("socket_io", "tracepoint x"), probe("lock_contention", "off")], None);
        assert_eq!(r.verdict(), "ready");
        assert!(render(&r).contains("verdict       ready"));
        let r = report(vec![probe("socket_io", "off")], Some("tracefs: missing".into()));
        assert_eq!(r.verdict(), "not ready");
    }
}
