//! `cargo xtask bench`: plegwatch's overhead, measured interleaved in one run against an
//! untraced baseline from the same run:
//! - `loops`: tight syscall loops, untraced, under plegwatch, under a bpftrace script
//!   doing equivalent enter/exit tracking, and under the floors any hook costs (one empty
//!   program on `raw_syscalls:sys_enter`; one on a syscall tracepoint the loop never
//!   calls) and the hook-free set (`sched_switch` and the `sock:*` length tracepoints),
//!   and an empty raw_tp program on `sys_enter` (`floor-rawtp`, [`floor`]),
//!   and under plegwatch with its kernel-function variants passed over (`pw-fallback`),
//!   each with its spread over the rounds; `--kernel K` runs them in a guest of a Debian
//!   kernel, where the fentry/fexit variants run (this host refuses them), and the
//!   emulator counts the instructions each loop's vCPU executed (`bench/icount.c`, a QEMU
//!   plugin): those counts' ratios are the guest's figures, its wall time being noise;
//! - `relist`: the latency of containerd's `ListContainers` and `ListPodSandbox` under the
//!   test bed's relist driver (a private containerd 1.6.20, a pod of running containers),
//!   untraced, under plegwatch (its uprobes on containerd's CRI functions), untraced again
//!   ([`relist`]).
//!
//! Ratios to the untraced runs are the figures; nothing here fails on a number.

mod bpf_stats;
mod driver;
mod floor;
mod relist;
mod report;
mod service;
mod tracer;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::{cmd, setup};
use report::Sample;

/// Before each measurement, after a tracer attached or stopped.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(1);

/// In a guest with the icount plugin, the vCPU the loops run on; this xtask and every
/// tracer it starts stay on CPU 0 (`taskset`).
const LOOP_CPU: u32 = 1;

/// Loop modes, with their default iteration counts.
const MODES: &[(&str, u64)] = &[("unix", 200_000), ("unixrw", 200_000), ("fsync", 20_000)];

/// Arguments of `cargo xtask bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Loop iterations per measurement, for every mode [default: 200000 for unix, 20000 for fsync].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub iterations: Option<u64>,
    /// Rounds; each round measures every loop untraced, under plegwatch and under bpftrace,
    /// and every relist mode untraced, under plegwatch and untraced again.
    #[arg(long, value_name = "R", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub rounds: u32,
    /// Run only these benchmarks (repeatable) [default: all].
    #[arg(long, value_name = "BENCH", value_enum)]
    pub only: Vec<Bench>,
    /// Seconds of each relist phase (untraced, plegwatch, untraced again) per mode and round.
    #[arg(long, value_name = "S", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=600))]
    pub relist_seconds: u32,
    /// Running containers in the relist benchmark's pod (each one a Status `Get` per
    /// `ListContainers`).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=50))]
    pub containers: u32,
    /// Run the loops in a guest booting this kernel (`5.10`, `6.1`, `6.12`, as `cargo
    /// xtask vm`), where the kernel-function variants (fentry/fexit) run: plegwatch, its
    /// forced fallbacks, bpftrace and the floors side by side, ratios within the guest.
    #[arg(long, value_name = "KERNEL")]
    pub kernel: Option<String>,
    /// Set by `--kernel` for the run inside the guest: no setup, no build.
    #[arg(long, hide = true)]
    pub in_guest: bool,
    /// Set by `--kernel` for the run inside the guest: the file where the emulator's icount
    /// plugin (`xtask/bench/icount.c`) writes the instructions each loop executed on its
    /// vCPU ([`LOOP_CPU`]).
    #[arg(long, hide = true, value_name = "FILE")]
    pub icount_file: Option<PathBuf>,
    /// Minutes of the daemon soak of `service`: `plegwatch daemon` on a node of container
    /// churn with an incident a minute; its memory, fds and scan lateness (0: no soak;
    /// issue 19 asks for 60).
    #[arg(long, value_name = "M", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=600))]
    pub soak_minutes: u32,
}

/// The benchmarks of `cargo xtask bench`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Bench {
    /// Syscall loops: untraced, plegwatch, bpftrace.
    Loops,
    /// containerd's CRI list calls under the relist driver: untraced, plegwatch, untraced.
    Relist,
    /// plegwatch as a service: start time, CPU idle and busy, time to flag, a real
    /// workload, memory; with `--soak-minutes`, the daemon soak ([`service`]).
    Service,
}

impl Args {
    fn runs(&self, bench: Bench) -> bool {
        self.only.is_empty() || self.only.contains(&bench)
    }
}

pub fn run(args: &Args) -> Result<()> {
    if !cmd::is_root() {
        bail!("cargo xtask bench loads eBPF programs and needs root: run as root");
    }
    if let Some(kernel) = &args.kernel {
        return in_guest(args, kernel);
    }
    if !args.in_guest {
        setup::ensure()?;
    }

    let bench_dir = cmd::target_dir().join("bench");
    std::fs::create_dir_all(&bench_dir).with_context(|| format!("cannot create {}", bench_dir.display()))?;

    if !args.in_guest {
        cmd::header("build");
        cmd::run(cmd::cargo().args(["build", "--release", "-p", "plegwatch"]))?;
    }
    let plegwatch = cmd::target_dir().join("release").join("plegwatch");
    let relist_driver = args.runs(Bench::Relist).then(relist::build_driver).transpose()?;
    let soak = (args.runs(Bench::Service) && args.soak_minutes > 0).then(|| service::build_soak(args.soak_minutes)).transpose()?;
    ensure_tracefs()?;

    let mut report = String::new();
    let mut figures = Vec::new();
    if args.runs(Bench::Loops) {
        let (text, loop_figures) = loops(args, &plegwatch, &bench_dir)?;
        report += &text;
        figures.extend(loop_figures);
    }
    if let Some(driver) = relist_driver {
        cmd::header(&format!(
            "measure relist: {} round(s) of {} s phases, {} container(s), logs in {}",
            args.rounds,
            args.relist_seconds,
            args.containers,
            bench_dir.display()
        ));
        let results = relist::measure(&relist::Config {
            plegwatch: &plegwatch,
            driver: &driver,
            log_dir: &bench_dir,
            rounds: args.rounds,
            seconds: f64::from(args.relist_seconds),
            containers: args.containers,
        })?;
        if !report.is_empty() {
            report.push('\n');
        }
        report += &report::render_relist(&results.calls, relist::MODES, relist::CALLS);
        figures.extend(report::relist_figures(&results.calls));
        report.push('\n');
        report += &report::render_cpu(&results.cpu, relist::MODES);
        let load = |l: Option<f64>| l.map_or_else(|| "?".to_owned(), |l| format!("{l:.2}"));
        report += &format!(
            "load average (1 min): {} before the relist rounds, {} after, on {} CPU(s)\n",
            load(results.load.0),
            load(results.load.1),
            std::thread::available_parallelism().map_or(0, |n| n.get())
        );
        for warning in results.warnings {
            report += &format!("warning: {warning}\n");
        }
    }
    if args.runs(Bench::Service) {
        cmd::header(&format!("measure service: {} round(s), logs in {}", args.rounds, bench_dir.display()));
        let loop_bin = compile_loop(&bench_dir)?;
        let (service, maps) = service::measure(&plegwatch, &loop_bin, &bench_dir, args.rounds, soak.as_ref())?;
        figures.extend(service);
        if !report.is_empty() {
            report.push('\n');
        }
        report += &maps;
    }
    report.push('\n');
    report += &format!("issue 12's figures, {} round(s) (median, spread over the rounds, target):\n", args.rounds);
    report += &report::render_figures(&figures);
    println!();
    print!("{report}");
    Ok(())
}

/// The loops in a guest of `kernel`: plegwatch's release build from here, this xtask
/// run again inside with `--in-guest`, on two vCPUs: the loops on [`LOOP_CPU`], the rest
/// on CPU 0. Emulated wall time swings 2-3x between runs, so beside it the emulator counts
/// the instructions each loop's vCPU executed (`xtask/bench/icount.c`), and the figures
/// are those counts' ratios.
fn in_guest(args: &Args, kernel: &str) -> Result<()> {
    if args.only != [Bench::Loops] {
        bail!("--kernel runs the syscall loops only: add `--only loops`");
    }
    setup::ensure()?;
    cmd::header("build");
    cmd::run(cmd::cargo().args(["build", "--release", "-p", "plegwatch"]))?;
    let k = crate::vm::resolve(kernel)?;
    let bench_dir = cmd::target_dir().join("bench");
    std::fs::create_dir_all(&bench_dir).with_context(|| format!("cannot create {}", bench_dir.display()))?;
    let plugin = compile_icount_plugin(&bench_dir)?;
    let count_file = bench_dir.join("icount.out");
    let exe = std::env::current_exe().context("the xtask binary's path")?;
    let mut line = format!(
        "taskset -c 0 {} bench --in-guest --only loops --rounds {} --icount-file {}",
        exe.display(),
        args.rounds,
        count_file.display()
    );
    if let Some(n) = args.iterations {
        line += &format!(" --iterations {n}");
    }
    let limit = std::time::Duration::from_secs(4 * 3600);
    let qemu = format!("-plugin {},out={}", plugin.display(), count_file.display());
    let status = crate::vm::guest_on(&k, 2, "4G", "the loops bench", &line, &qemu, Some(limit), None)?;
    if status != 0 {
        bail!("the loops bench in the guest of {kernel} failed: exit {status}");
    }
    Ok(())
}

/// The syscall loops, untraced, under plegwatch and under bpftrace; the rendered table.
fn loops(args: &Args, plegwatch: &Path, bench_dir: &Path) -> Result<(String, Vec<report::Figure>)> {
    let loop_bin = compile_loop(bench_dir)?;
    let runner = LoopRunner { bin: &loop_bin, icount: args.icount_file.as_deref() };
    let floor_object = floor::build(bench_dir).map_err(|e| eprintln!("bench: no floor-rawtp column: {e:#}")).ok();
    let mut bpftrace_ok = match bpftrace_version() {
        Ok(version) => {
            eprintln!("bench: comparing against {version}");
            true
        }
        Err(e) => {
            eprintln!("bench: no bpftrace column: {e:#}");
            false
        }
    };

    cmd::header(&format!("measure loops: {} round(s), logs in {}", args.rounds, bench_dir.display()));
    let mut samples = Vec::new();
    let mut insn_samples = Vec::new();
    let mut hot_paths = Vec::new();
    for round in 1..=args.rounds {
        for &(mode, default_iterations) in MODES {
            let iterations = args.iterations.unwrap_or(default_iterations);
            // A short run first, discarded, then the measured one: in a guest, the
            // emulator translates the loop's and the kernel's code again after each attach
            // or detach rewrote some of it (static keys, trampolines); a tracer that just
            // stopped may still be tearing down.
            let measure = || {
                std::thread::sleep(SETTLE);
                runner.run(mode, (iterations / 10).max(1))?;
                runner.run(mode, iterations)
            };

            let untraced = measure()?;

            let mut pw = tracer::plegwatch(plegwatch, bench_dir)?;
            if round == 1 && hot_paths.is_empty() {
                hot_paths.push(format!("plegwatch ran {}", pw.hot_path()));
            }
            let traced = measure();
            pw.stop();
            let under_plegwatch = traced?;

            let mut under_bpftrace = None;
            if bpftrace_ok {
                match tracer::bpftrace(bench_dir) {
                    Ok(bt) => {
                        let traced = measure();
                        bt.stop();
                        under_bpftrace = Some(traced?);
                    }
                    Err(e) => {
                        eprintln!("bench: bpftrace failed to attach, continuing without it: {e:#}");
                        bpftrace_ok = false;
                    }
                }
            }
            let mut traced = vec![Some(under_plegwatch), under_bpftrace];
            for &(name, _) in tracer::REFERENCES {
                let t = if bpftrace_ok {
                    match tracer::reference(bench_dir, name) {
                        Ok(r) => {
                            let t = measure();
                            r.stop();
                            Some(t?)
                        }
                        Err(e) => {
                            eprintln!("bench: {name} failed to attach, left out: {e:#}");
                            None
                        }
                    }
                } else {
                    None
                };
                traced.push(t);
            }
            let floor = floor_object.as_deref().and_then(|object| {
                floor::RawTpFloor::attach(object).map_err(|e| eprintln!("bench: floor-rawtp failed to attach, left out: {e:#}")).ok()
            });
            match floor {
                Some(floor) => {
                    let t = measure();
                    drop(floor);
                    traced.push(Some(t?));
                }
                None => traced.push(None),
            }
            let mut pw = tracer::plegwatch_fallback(plegwatch, bench_dir)?;
            if round == 1 && hot_paths.len() == 1 {
                hot_paths.push(format!("pw-fallback ran {}", pw.hot_path()));
            }
            let t = measure();
            pw.stop();
            traced.push(Some(t?));

            let cells: Vec<String> = report::COLUMNS
                .iter()
                .zip(&traced)
                .map(|(c, t)| format!("{c} {}", t.map_or_else(|| "-".to_owned(), |t| t.to_string())))
                .collect();
            eprintln!("bench: round {round} {mode:<6} x{iterations}: untraced {untraced}, {}", cells.join(", "));
            samples.push(Sample { mode, round, untraced: untraced.ns, traced: traced.iter().map(|t| t.map(|t| t.ns)).collect() });
            if let Some(insns) = untraced.insns {
                let traced = traced.iter().map(|t| t.and_then(|t| t.insns)).collect();
                insn_samples.push(Sample { mode, round, untraced: insns, traced });
            }
        }
    }

    let modes: Vec<&str> = MODES.iter().map(|&(m, _)| m).collect();
    let mut text = String::new();
    if !insn_samples.is_empty() {
        text += "guest instructions per operation on the loop's vCPU (the emulator's count, xtask/bench/icount.c):\n";
        text += &report::render(&insn_samples, &modes, "insn/op");
        text += "\nwall time per operation (emulated: swings 2-3x between runs; not the figures):\n";
    }
    text += &report::render(&samples, &modes, "ns/op");
    text += &format!("kernel {}\n", std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim());
    for line in hot_paths {
        text += &line;
        text.push('\n');
    }
    match attribute(args, plegwatch, &loop_bin, bench_dir) {
        Ok(t) => text += &t,
        Err(e) => eprintln!("bench: no per-program figures (bpf_stats): {e:#}"),
    }
    // In a guest the figures are the instruction counts' ratios: emulated time is noise.
    let figures = report::loop_figures(if insn_samples.is_empty() { &samples } else { &insn_samples });
    Ok((text, figures))
}

/// After the measured rounds, one more run of each loop under plegwatch and under its
/// fallbacks with the kernel's BPF statistics on: where plegwatch's time in the kernel
/// goes, per program ([`bpf_stats`]). Not a ratio: statistics cost every run.
fn attribute(args: &Args, plegwatch: &Path, loop_bin: &Path, bench_dir: &Path) -> Result<String> {
    let mut text =
        String::from("\nwhere plegwatch's time goes (kernel.bpf_stats_enabled, one run per loop; the hooks' own cost is not in it):\n");
    for fallback in [false, true] {
        let pw = if fallback { tracer::plegwatch_fallback(plegwatch, bench_dir)? } else { tracer::plegwatch(plegwatch, bench_dir)? };
        let name = if fallback { "pw-fallback" } else { "plegwatch" };
        let stats = bpf_stats::Enabled::on()?;
        let mut run = || -> Result<()> {
            for &(mode, default_iterations) in MODES {
                let iterations = args.iterations.unwrap_or(default_iterations);
                std::thread::sleep(SETTLE);
                let before = bpf_stats::snapshot(pw.pid())?;
                time_loop(loop_bin, mode, iterations)?;
                let after = bpf_stats::snapshot(pw.pid())?;
                text += &bpf_stats::render(name, mode, iterations, &bpf_stats::delta(&before, &after));
            }
            Ok(())
        };
        let ran = run();
        drop(stats);
        pw.stop();
        ran?;
    }
    Ok(text)
}

/// `cc -O2 xtask/bench/loop.c -o target/bench/loop`, every time (it takes a moment).
fn compile_loop(bench_dir: &Path) -> Result<PathBuf> {
    let source = cmd::workspace_root().join("xtask").join("bench").join("loop.c");
    let binary = bench_dir.join("loop");
    cmd::run(Command::new("cc").args(["-O2", "-Wall", "-o"]).arg(&binary).arg(&source))?;
    Ok(binary)
}

/// How the loops run: the binary, and in a guest with the icount plugin, its count file.
struct LoopRunner<'a> {
    bin: &'a Path,
    icount: Option<&'a Path>,
}

/// One loop run: wall time per operation, and with the icount plugin, the instructions per
/// operation its vCPU executed.
#[derive(Clone, Copy, Debug)]
struct Measured {
    ns: f64,
    insns: Option<f64>,
}

impl std::fmt::Display for Measured {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.1} ns/op", self.ns)?;
        if let Some(insns) = self.insns {
            write!(f, " {insns:.0} insn/op")?;
        }
        Ok(())
    }
}

impl LoopRunner<'_> {
    fn run(&self, mode: &str, iterations: u64) -> Result<Measured> {
        let mut command = loop_command(self.bin, mode, iterations);
        let Some(count_file) = self.icount else {
            return Ok(Measured { ns: parse_ns(&mut command)?, insns: None });
        };
        // A count left by an earlier run must not pass for this one's.
        match std::fs::remove_file(count_file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", count_file.display())),
        }
        let ns = parse_ns(command.env("LOOP_CPU", LOOP_CPU.to_string()))?;
        let text = std::fs::read_to_string(count_file)
            .with_context(|| format!("the icount plugin wrote no count to {} (is the guest's QEMU running it?)", count_file.display()))?;
        let executed = parse_icount(&text, LOOP_CPU).with_context(|| format!("{}: {:?}", count_file.display(), text.trim()))?;
        Ok(Measured { ns, insns: Some(executed as f64 / iterations as f64) })
    }
}

/// The icount plugin's line, `INSTRUCTIONS VCPU`: the instructions, if they were counted on
/// `cpu`.
fn parse_icount(text: &str, cpu: u32) -> Result<u64> {
    let mut words = text.split_whitespace();
    let (Some(count), Some(vcpu), None) = (words.next(), words.next(), words.next()) else {
        bail!("not an icount line (INSTRUCTIONS VCPU)");
    };
    let count: u64 = count.parse().context("the instruction count is not a number")?;
    let vcpu: u32 = vcpu.parse().context("the vCPU is not a number")?;
    if vcpu != cpu {
        bail!("the loop ended on vCPU {vcpu}, not on {cpu} where it was pinned");
    }
    Ok(count)
}

/// `cc -O2 -shared xtask/bench/icount.c -o target/bench/icount.so`: the emulator's
/// instruction counter for `--kernel`.
fn compile_icount_plugin(bench_dir: &Path) -> Result<PathBuf> {
    let source = cmd::workspace_root().join("xtask").join("bench").join("icount.c");
    let plugin = bench_dir.join("icount.so");
    cmd::run(Command::new("cc").args(["-O2", "-Wall", "-shared", "-fPIC", "-fvisibility=hidden", "-o"]).arg(&plugin).arg(&source))?;
    Ok(plugin)
}

/// Run `loop MODE ITER` and parse the ns per iteration it prints.
pub(crate) fn time_loop(loop_bin: &Path, mode: &str, iterations: u64) -> Result<f64> {
    parse_ns(&mut loop_command(loop_bin, mode, iterations))
}

/// `loop MODE ITER`.
fn loop_command(loop_bin: &Path, mode: &str, iterations: u64) -> Command {
    let mut command = Command::new(loop_bin);
    command.arg(mode).arg(iterations.to_string());
    command
}

/// Run a loop command and parse the ns per iteration it prints.
fn parse_ns(command: &mut Command) -> Result<f64> {
    let line = cmd::display(command);
    let stdout = cmd::output(command)?;
    let value: f64 = stdout.trim().parse().with_context(|| format!("`{line}` printed {:?}, not a number", stdout.trim()))?;
    Ok(value)
}

fn bpftrace_version() -> Result<String> {
    let out = cmd::output(Command::new("bpftrace").arg("--version")).context("bpftrace is not available (Debian package bpftrace)")?;
    Ok(out.trim().to_owned())
}

/// bpftrace reads tracepoint formats from tracefs, which this machine kind does not mount at
/// boot. Mount it if needed and say so; it stays mounted, as plegwatch itself leaves it.
fn ensure_tracefs() -> Result<()> {
    const TRACEFS: &str = "/sys/kernel/tracing";
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    eprintln!("bench: tracefs is not mounted; mounting it at {TRACEFS}");
    cmd::run(Command::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))
}

#[cfg(test)]
mod tests {
    use super::parse_icount;

    #[test]
    fn an_icount_line_is_the_count_on_the_pinned_vcpu() {
        assert_eq!(parse_icount("123456 1\n", 1).ok(), Some(123_456));
        let moved = parse_icount("123456 0\n", 1).map_err(|e| e.to_string());
        assert!(moved.as_ref().is_err_and(|e| e.contains("vCPU 0, not on 1")), "{moved:?}");
        for bad in ["", "123456", "12x 1", "1 2 3", "-5 1"] {
            assert!(parse_icount(bad, 1).is_err(), "{bad:?} was taken");
        }
    }
}
