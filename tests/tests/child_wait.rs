//! A parent blocked in `waitpid` on a child that is stopped (SIGSTOP): the child never exits,
//! so the parent waits for ever, and nothing else about it is an open wait. plegwatch sees the
//! parent's `wait4` in the kernel (fentry and fexit on `__x64_sys_wait4` where the kernel
//! takes them, else the tracepoints `syscalls:sys_enter_wait4`/`sys_exit_wait4`) and raises
//! one incident: the parent's `child_wait` → `child` (exact: the pid argument names it) →
//! the stopped child (state T). Continuing the child lets it exit; the wait ends and the
//! incident resolves.
//!
//! A parent waiting on a running child (the `python3` guard's own `sleep` beforehand) is no
//! incident.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{incidents, preflight, variants, Plegwatch};

const WARN: Duration = Duration::from_secs(2);

/// `wait4`'s number on x86_64, as `/proc/PID/syscall` gives it.
const WAIT4_NR: &str = "61";

/// The parent: forks a child that stops itself, prints the child's pid, then `waitpid`s it
/// (glibc's waitpid is `wait4(pid, &status, 0, NULL)`). A second, running child is waited
/// for first, for a second: a wait on a running child must raise nothing.
const PARENT: &str = r#"
import os, signal, subprocess, sys
subprocess.run(["sleep", "1"])
pid = os.fork()
if pid == 0:
    os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(0)
print(pid, flush=True)
os.waitpid(pid, 0)
print("reaped", flush=True)
"#;

/// Kills the parent and continues then kills the child on drop, also on a panic.
struct Family {
    parent: Child,
    child: Option<u32>,
}

impl Drop for Family {
    fn drop(&mut self) {
        if let Some(c) = self.child {
            // SAFETY: kill(2) on the process this test's parent forked.
            unsafe {
                libc::kill(c as libc::pid_t, libc::SIGCONT);
                libc::kill(c as libc::pid_t, libc::SIGKILL);
            }
        }
        let _ = self.parent.kill();
        let _ = self.parent.wait();
    }
}

fn state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..].split_whitespace().next()?.chars().next()
}

#[test]
fn a_parent_in_waitpid_on_a_stopped_child_is_one_exact_incident() -> Result<()> {
    preflight::require();
    let mut plegwatch = Plegwatch::start(&["--warn", "2s"])?;
    let ready = plegwatch.wait_ready(READY_TIMEOUT)?;
    variants::assert_variant(&ready, "child_wait", "fentry+fexit __x64_sys_{wait4,waitid}", (5, 5), "tracepoint syscalls:sys_exit_wait4");

    let started = Instant::now();
    let parent = Command::new("python3").args(["-c", PARENT]).stdout(Stdio::piped()).spawn().context("python3")?;
    let parent_pid = parent.id();
    let mut family = Family { parent, child: None };
    let stdout = family.parent.stdout.take().context("the parent's stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let child: u32 = lines.next().context("the parent printed nothing")??.trim().parse()?;
    family.child = Some(child);
    let deadline = Instant::now() + Duration::from_secs(5);
    while state(child) != Some('T') {
        anyhow::ensure!(Instant::now() < deadline, "child {child} never stopped (state {:?})", state(child));
        std::thread::sleep(Duration::from_millis(10));
    }
    // The parent prints the pid before it calls waitpid: wait for it to be blocked in
    // wait4 (a single look right after the print can find it still running Python).
    let in_wait4 =
        |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/syscall")).is_ok_and(|s| s.split_whitespace().next() == Some(WAIT4_NR));
    let deadline = Instant::now() + Duration::from_secs(5);
    while !(in_wait4(parent_pid) && state(parent_pid) == Some('S')) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let parent_state = state(parent_pid).filter(|_| in_wait4(parent_pid));
    let raised = plegwatch.wait_for(WARN + Duration::from_secs(3), |e| {
        e.is("incident")
            && incidents::Incident::chain(e).iter().any(|h| h["kind"] == "child_wait" && h["pid"].as_u64() == Some(u64::from(parent_pid)))
    });
    // SAFETY: kill(2) on the child this test's parent forked.
    unsafe { libc::kill(child as libc::pid_t, libc::SIGCONT) };
    let lifted = Instant::now();
    let reaped = lines.next().transpose()?;
    plegwatch.wait_for(Duration::from_secs(4), |e| e.is("incident_resolved"));
    let events = plegwatch.stop()?;
    let all = || dump(&events, started);

    assert_eq!(parent_state, Some('S'), "the parent should sleep in waitpid (wait4) within 5 s of printing the pid");
    assert_eq!(reaped.as_deref(), Some("reaped"), "the parent should reap its child once continued");
    assert!(raised.is_some(), "no incident with the parent's child_wait:\n{}", all());
    let mine = |h: &serde_json::Value| h["kind"] == "child_wait" && h["pid"].as_u64() == Some(u64::from(parent_pid));
    let i = incidents::the_one(&events, WARN, Some(lifted), mine).map_err(|e| anyhow::anyhow!("{e}\n{}", all()))?;
    let chain = incidents::Incident::chain(i.first());
    let text = incidents::chain_text(&chain);
    assert_eq!(chain.len(), 2, "the parent's wait, then the stopped child:\n{text}");
    let wait = &chain[0];
    assert_eq!(wait["kind"], "child_wait", "{text}");
    assert_eq!(wait["tid"].as_u64(), Some(u64::from(parent_pid)), "{text}");
    assert_eq!(wait["edge"], "child", "{text}");
    assert_eq!(wait["exactness"], "exact", "{text}");
    let evidence = wait["evidence"].as_str().unwrap_or("");
    assert!(evidence.contains(&format!("wait4(pid {child})")), "the evidence should name wait4 and the pid: {evidence}");
    let waited = wait["waited_s"].as_f64().unwrap_or(0.0);
    assert!(waited >= WARN.as_secs_f64(), "timed from sys_enter_wait4: {waited}s\n{text}");
    let end = &chain[1];
    assert_eq!(end["kind"], "process", "{text}");
    assert_eq!(end["pid"].as_u64(), Some(u64::from(child)), "{text}");
    assert!(end["what"].as_str().is_some_and(|w| w.contains("state T")), "{text}");
    // Only the stopped child's wait made an incident: not the wait on the running `sleep`.
    let others: Vec<_> = incidents::incidents(&events)
        .into_iter()
        .filter(|x| x.any_hop(|h| h["pid"].as_u64() == Some(u64::from(parent_pid))) && x.id != i.id)
        .map(|x| x.id)
        .collect();
    assert!(others.is_empty(), "other incidents for the parent: {others:?}\n{}", all());
    eprintln!("incident #{} raised {:.3}s after crossing --warn; chain:\n{text}", i.id, i.raised_after_warn(WARN).as_secs_f64());
    Ok(())
}
