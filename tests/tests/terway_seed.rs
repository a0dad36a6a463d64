//! Seed incident 000: Terway (stall-catalog.md pattern 5; issue 8 §6.1), driven through
//! containerd's own CNI invocation.
//!
//! A private containerd 1.6.20 (Debian's) whose CRI plugin has the `terway-cni` plugin
//! fixture and a network config in its own `bin_dir`/`conf_dir`; the `terwayd-fixture`
//! daemon serves that plugin on a unix socket. Both are **fixtures standing in for Terway**
//! (see `plegwatch_scenarios::terway`). `plegwatch watch --warn 3s` runs; then a CRI
//! `RunPodSandbox` for a pod with its own network namespace makes containerd run the plugin
//! (ADD) as its child; the plugin asks the daemon and blocks in `read`; the daemon's serving
//! thread takes its mutex and blocks in `recvfrom` on a netlink request the kernel never
//! answers, and three more of its threads block on the mutex. After the incident has been
//! raised and has stood a while, SIGUSR1 lifts the fault: the daemon answers, the plugin
//! prints its result, and RunPodSandbox returns.
//!
//! Expected: exactly one incident, raised within 1 s of its oldest wait crossing --warn,
//! whose chain runs RunPodSandbox (cri_call, containerd) → the plugin's `unix_recv` (child,
//! inferred) → the daemon thread's `netlink_request` (unix_peer, exact, by sock_diag inode),
//! the root → the kernel (no_reply); the three mutex waiters attached to the root (futex,
//! sibling, heuristic); resolved after the lift. The raise time and the chain are printed.

use std::time::{Duration, Instant};

use anyhow::{anyhow, ensure, Context, Result};
use plegwatch_scenarios::child::{Options, Proc};
use plegwatch_scenarios::containerd::{self, image, Containerd, Placement};
use plegwatch_scenarios::incidents::{self, Incident};
use plegwatch_scenarios::netlink::NetNs;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::terway::{self, Daemon};
use plegwatch_scenarios::{preflight, variants, Plegwatch};
use serde_json::Value;

const WARN: Duration = Duration::from_secs(3);
/// How long the fault stands: the incident is raised at WARN, then stays open a while.
const HOLD: Duration = Duration::from_secs(6);
const WAITERS: usize = 3;

#[test]
fn one_incident_from_run_pod_sandbox_to_the_daemons_netlink_request() -> Result<()> {
    preflight::require();
    containerd::require();
    terway::require();
    let (daemon_bin, plugin_bin) = terway::build()?;

    // Guards in setup order (dropped in reverse): netns, containerd, daemon, plegwatch.
    let netns = NetNs::new("terway")?;
    let ctrd = Containerd::start(Placement::TempDir)?;
    image::import_test_images(&ctrd)?;
    terway::install_cni(&ctrd, &plugin_bin)?;
    let cri = ctrd.cri()?.with_timeout(Duration::from_secs(120));
    let mut daemon = Daemon::start(&daemon_bin, &terway::daemon_socket(&ctrd), &netns, WAITERS as u32)?;
    let mut pw = Plegwatch::start(&["--warn", &format!("{}ms", WARN.as_millis())])?;
    let ready = pw.wait_ready(READY_TIMEOUT)?;
    // The netlink requests are seen by fentry/fexit on the syscalls' functions where
    // the kernel takes them (and has bpf_loop), else by the syscall tracepoints.
    variants::assert_variant(&ready, "socket_io", "fentry+fexit", (5, 17), "tracepoint syscalls:sys_exit_{write");
    pw.wait_probed(ctrd.pid(), Duration::from_secs(30))?;
    // containerd's CNI config watcher picks up the config written after it started: wait
    // until its Status says the pod network is ready.
    let deadline = Instant::now() + plegwatch_scenarios::timing::scaled(Duration::from_secs(30));
    while !cri.network_ready()? {
        ensure!(Instant::now() < deadline, "containerd never loaded the CNI config:\n{}", ctrd.log_tail(30));
        std::thread::sleep(Duration::from_millis(100));
    }

    let config = terway::pod_network_pod("terway-seed", &ctrd)?;
    let sent = Instant::now();
    let run = {
        let cri = cri.clone();
        std::thread::spawn(move || cri.run_pod_sandbox(&config))
    };
    let root_tid = daemon.tid_of("sent", Duration::from_secs(20)).with_context(|| ctrd.log_tail(30))?;
    let waiters = daemon.tids_of("waiting", WAITERS, Duration::from_secs(5))?;
    eprintln!("the daemon's thread {root_tid} is in the netlink request; mutex waiters {waiters:?}");
    // Let the incident be raised and stand.
    let until = sent + WARN + HOLD;
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    ensure!(!run.is_finished(), "RunPodSandbox returned while the daemon was stuck");
    let lifted = Instant::now();
    daemon.lift()?;
    let sandbox = run.join().map_err(|_| anyhow!("the RunPodSandbox thread panicked"))?;
    let answered = Instant::now();
    let sandbox = sandbox.with_context(|| ctrd.log_tail(40))?;
    eprintln!("RunPodSandbox returned {:.2}s after it was sent ({sandbox})", answered.duration_since(sent).as_secs_f64());
    daemon.tid_of("lifted", Duration::from_secs(5))?;

    let is_root = |h: &Value| h["kind"] == "netlink_request" && h["pid"].as_u64() == Some(u64::from(daemon.pid));
    pw.wait_for(Duration::from_secs(5), |e| {
        e.is("incident_resolved") && e.get("/longest_chain").and_then(Value::as_array).is_some_and(|c| c.iter().any(is_root))
    });
    // Tear the pod down (StopPodSandbox runs the plugin's DEL, which the daemon answers).
    cri.stop_pod_sandbox(&sandbox).and_then(|()| cri.remove_pod_sandbox(&sandbox)).with_context(|| ctrd.log_tail(30))?;
    let events = pw.stop()?;
    let all = || plegwatch_scenarios::events::dump(&events, sent);

    let i = incidents::the_one(&events, WARN, Some(lifted), is_root).map_err(|e| anyhow!("{e}\n{}", all()))?;
    // Down to the kernel: an earlier line may stop at the request, before its no-reply
    // link was found (a loaded guest, ci7).
    let full = |c: &[Value]| {
        c.first().is_some_and(|h| h["kind"] == "cri_call")
            && c.iter().any(|h| h["kind"] == "unix_recv")
            && c.last().is_some_and(|h| h["kind"] == "kernel")
    };
    let line =
        i.line_where(full).unwrap_or_else(|| panic!("incident #{} never ran from RunPodSandbox through the plugin:\n{}", i.id, all()));
    let chain = Incident::chain(line);
    let text = incidents::chain_text(&chain);
    let raised = i.raised_after_warn(WARN);
    eprintln!(
        "incident #{} raised {:.3}s after its oldest wait crossed --warn {WARN:?} (first line: {} hops); full chain {}:\n{text}",
        i.id,
        raised.as_secs_f64(),
        Incident::chain(i.first()).len(),
        if std::ptr::eq(line, i.first()) { "in the first line" } else { "in a later line" },
    );
    let s = |h: &Value, f: &str| h[f].as_str().unwrap_or_default().to_string();

    // 1. RunPodSandbox in containerd → the plugin, its child.
    ensure!(chain.len() == 4, "want RunPodSandbox → plugin → netlink request → kernel:\n{text}\n{}", all());
    let rps = &chain[0];
    ensure!(rps["pid"].as_u64() == Some(u64::from(ctrd.pid())) && s(rps, "what").contains("RunPodSandbox"), "{text}");
    ensure!((s(rps, "edge"), s(rps, "exactness")) == ("child".into(), "inferred".into()), "{text}");
    // 2. The plugin blocked reading its unix socket → the daemon, by the peer's inode.
    let plugin = &chain[1];
    ensure!(s(plugin, "kind") == "unix_recv" && s(plugin, "comm") == terway::PLUGIN, "{text}");
    ensure!(s(plugin, "what").contains("unix stream socket") && s(plugin, "what").contains("terwayd.sock"), "{text}");
    ensure!((s(plugin, "edge"), s(plugin, "exactness")) == ("unix_peer".into(), "exact".into()), "{text}");
    let ev = s(plugin, "evidence");
    ensure!(ev.contains("UNIX_DIAG_PEER names inode") && ev.contains(&format!("pid {}", daemon.pid)), "{ev}");
    // 3. The root: the daemon's thread in the netlink request; then the kernel.
    let root = &chain[2];
    ensure!(root["root"] == true && root["tid"].as_u64() == Some(u64::from(root_tid)), "{text}");
    ensure!(s(root, "edge") == "no_reply" && chain[3]["kind"] == "kernel", "{text}");
    ensure!(line.get("/root/tid").and_then(Value::as_u64) == Some(u64::from(root_tid)), "{}", line.json);
    // The mutex waiters, attached to the root by the sibling heuristic.
    let attached = line.get("/attached").and_then(Value::as_array).cloned().unwrap_or_default();
    let mut got: Vec<u64> = attached
        .iter()
        .filter(|h| h["kind"] == "futex" && h["edge"] == "sibling" && h["exactness"] == "heuristic")
        .filter(|h| h["evidence"].as_str().is_some_and(|e| e.contains(&format!("sibling thread {root_tid}"))))
        .filter_map(|h| h["tid"].as_u64())
        .collect();
    got.sort_unstable();
    let mut want: Vec<u64> = waiters.iter().map(|&t| u64::from(t)).collect();
    want.sort_unstable();
    ensure!(got == want, "attached mutex waiters {got:?}, want {want:?}: {}", line.json);
    eprintln!("attached (heuristic): {}", incidents::chain_text(&attached));
    // Nothing else made an incident of the daemon's, the plugin's or containerd's waits.
    for other in incidents::incidents(&events).iter().filter(|o| o.id != i.id) {
        let mine =
            |h: &Value| [daemon.pid, ctrd.pid()].iter().any(|&p| h["pid"].as_u64() == Some(u64::from(p))) || h["comm"] == terway::PLUGIN;
        ensure!(!other.any_hop(mine), "another incident #{} has a hop of this stall:\n{}", other.id, all());
    }
    eprintln!("resolved {:?} after the lift", i.resolved.as_ref().map(|r| r.at.duration_since(lifted)));
    Ok(())
}

/// Issue 19: the client's hop was lost when the client was no child of an anchor (a
/// plugin run by hand, a node agent, a CLI): the sampler only followed unix receives
/// *from* a sampled process to its peer, so a client blocked on the daemon was never
/// sampled, and the incident held only the daemon's netlink wait. Now the sampler also
/// follows each long-waiting process's accepted unix connections back to their clients.
///
/// The same fixtures, no containerd: the plugin runs as a child of this test (ADD on the
/// daemon's socket), the daemon's serving thread takes the mutex into an unanswered
/// netlink request, two more threads wait on the mutex. Expected: one incident whose
/// chain starts at the plugin (`unix_recv`, `unix_peer` exact, by sock_diag inode) and
/// runs to the daemon's netlink request and the kernel.
#[test]
fn a_client_outside_containerd_is_the_top_of_the_daemons_incident() -> Result<()> {
    preflight::require();
    terway::require();
    let (daemon_bin, plugin_bin) = terway::build()?;
    const WAITERS: usize = 2;
    let netns = NetNs::new("terway-client")?;
    let dir = tempfile::tempdir()?;
    let socket = dir.path().join("terwayd.sock");
    let mut daemon = Daemon::start(&daemon_bin, &socket, &netns, WAITERS as u32)?;
    let mut pw = Plegwatch::start(&["--warn", &format!("{}ms", WARN.as_millis())])?;
    pw.wait_ready(READY_TIMEOUT)?;

    let config =
        format!(r#"{{"cniVersion":"0.4.0","name":"{}","type":"{}","socket":"{}"}}"#, terway::NETWORK, terway::PLUGIN, socket.display());
    let sent = Instant::now();
    let mut plugin = Proc::spawn_with_input(
        terway::PLUGIN,
        std::process::Command::new(&plugin_bin)
            .env("CNI_COMMAND", "ADD")
            .env("CNI_CONTAINERID", "client-outside-containerd")
            .env("CNI_NETNS", format!("/run/netns/{}", netns.name()))
            .env("CNI_IFNAME", "eth0")
            .env("CNI_PATH", plugin_bin.parent().unwrap_or(std::path::Path::new("/"))),
        Options::default(),
        config.as_bytes(),
    )?;
    let root_tid = daemon.tid_of("sent", terway::START_TIMEOUT)?;
    daemon.tids_of("waiting", WAITERS, Duration::from_secs(5))?;
    eprintln!("plugin pid {} asked the daemon (pid {}); its thread {root_tid} is in the netlink request", plugin.pid(), daemon.pid);
    let until = sent + WARN + HOLD;
    std::thread::sleep(until.saturating_duration_since(Instant::now()));
    ensure!(plugin.running(), "the plugin returned while the daemon was stuck");
    let lifted = Instant::now();
    daemon.lift()?;
    let status = plugin.wait_exit(Duration::from_secs(30))?;
    ensure!(status.success(), "the plugin failed after the lift: {status}");
    let is_root = |h: &Value| h["kind"] == "netlink_request" && h["pid"].as_u64() == Some(u64::from(daemon.pid));
    pw.wait_for(Duration::from_secs(5), |e| {
        e.is("incident_resolved") && e.get("/longest_chain").and_then(Value::as_array).is_some_and(|c| c.iter().any(is_root))
    });
    let events = pw.stop()?;
    let all = || plegwatch_scenarios::events::dump(&events, sent);

    let i = incidents::the_one(&events, WARN, Some(lifted), is_root).map_err(|e| anyhow!("{e}\n{}", all()))?;
    let from_client = |c: &[Value]| c.first().is_some_and(|h| h["kind"] == "unix_recv");
    let line = i.line_where(from_client).ok_or_else(|| anyhow!("incident #{} never started at the plugin's receive:\n{}", i.id, all()))?;
    let chain = Incident::chain(line);
    let text = incidents::chain_text(&chain);
    eprintln!(
        "incident #{}: the client's hop {} the first line:\n{text}",
        i.id,
        if std::ptr::eq(line, i.first()) { "in" } else { "after" }
    );
    let s = |h: &Value, f: &str| h[f].as_str().unwrap_or_default().to_string();
    ensure!(chain.len() == 3, "want plugin → netlink request → kernel:\n{text}\n{}", all());
    let client = &chain[0];
    ensure!(client["pid"].as_u64() == Some(u64::from(plugin.pid())) && s(client, "comm") == terway::PLUGIN, "{text}");
    ensure!((s(client, "edge"), s(client, "exactness")) == ("unix_peer".into(), "exact".into()), "{text}");
    ensure!(s(client, "evidence").contains(&format!("pid {}", daemon.pid)), "{text}");
    let root = &chain[1];
    ensure!(root["root"] == true && root["tid"].as_u64() == Some(u64::from(root_tid)), "{text}");
    ensure!(chain[2]["kind"] == "kernel", "{text}");
    Ok(())
}
