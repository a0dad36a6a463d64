//! Golden files of the first screen an SRE sees, one per kind of incident: the start line,
//! then the incident as `watch --no-live` prints it. The clock at the start of each line is
//! masked (`HH:MM:SS.mmm`); everything else must match `golden/<kind>.txt` byte for byte.
//! The hops carry what the engine puts in them (the wording of each source's `what`, the
//! edges and their exactness), after the seed incidents this tool was built for.
//!
//! `PLEGWATCH_BLESS=1 cargo test -p plegwatch --lib first_screen` rewrites the files after
//! a deliberate change of wording; review the diff before committing it.

use crate::events::{Event, ProbeChoice, Ready, Sink as _};
use crate::graph::incidents::Incident;
use crate::graph::model::{EdgeKind, Exactness, Hop, PodRef, StartTiming};
use crate::levels::Level;
use crate::sinks::{TextOptions, TextSink};
use std::path::PathBuf;

fn hop(kind: &str, pid: u32, comm: &str, what: &str, waited: Option<f64>, edge: Option<(EdgeKind, Exactness, &str)>) -> Hop {
    Hop {
        wait_id: waited.map(|_| u64::from(pid) * 10),
        kind: kind.into(),
        pid: Some(pid),
        tid: Some(pid),
        comm: Some(comm.into()),
        goroutine: None,
        what: what.into(),
        waited_s: waited,
        edge: edge.map(|e| e.0),
        evidence: edge.map(|e| e.2.to_string()),
        exactness: edge.map(|e| e.1),
        root: false,
        pod: PodRef::default(),
        start: StartTiming::Exact,
    }
}

fn terminal(kind: &str, pid: Option<u32>, what: &str) -> Hop {
    Hop { wait_id: None, pid, tid: None, comm: None, ..hop(kind, 0, "", what, None, None) }
}

fn incident(level: Level, mut chain: Vec<Hop>, root: usize) -> Incident {
    chain[root].root = true;
    let waited = chain[0].waited_s.unwrap_or(0.0);
    Incident {
        level,
        id: 1,
        changed: Vec::new(),
        root: Some(chain[root].clone()),
        symptom: chain[0].clone(),
        waits: chain.iter().filter_map(|h| h.wait_id).collect(),
        chain,
        attached: Vec::new(),
        budget_used: waited / 180.0,
        started_at: "2026-11-24T03:00:00.000Z".into(),
        waited_s: waited,
        cycle: false,
        started_before_attach: false,
    }
}

fn ready() -> Event {
    let mut probes: Vec<ProbeChoice> = [
        "wait_enter",
        "wait_exit",
        "umount_tail_end",
        "thread_exit",
        "socket_classify",
        "socket_io",
        "offcpu",
        "lock_contention",
        "go_uprobes",
    ]
    .iter()
    .map(|p| ProbeChoice { probe: p.to_string(), variant: "tracepoint".into(), ..Default::default() })
    .collect();
    probes[7].variant = "off".into();
    probes[7].why = Some("no tracepoint lock:contention_begin".into());
    Event::Ready(Ready::new(4100, probes, 10.0, 60.0, 150.0))
}

/// The seed incidents, by golden file name.
fn cases() -> Vec<(&'static str, Incident)> {
    let shim_pod = PodRef { pod: Some("web-0".into()), namespace: Some("shop".into()), container: Some("app".into()), container_id: None };
    let umount = vec![
        hop(
            "umount",
            27157,
            "umount",
            "umount2 /var/lib/kubelet/pods/x/volumes/vol (task_work after the syscall returned)",
            Some(12.4),
            Some((EdgeKind::Device, Exactness::Exact, "its writeback waits on the device")),
        ),
        terminal("device", None, "block device 7:0 (loop0): 0 requests in flight, 1002 KiB/s written over the last 5 s"),
    ];
    let c9770 = vec![
        hop(
            "pleg_relist",
            900,
            "kubelet",
            "pleg.(*GenericPLEG).Relist",
            Some(74.2),
            Some((EdgeKind::CriCall, Exactness::Inferred, "the relist's CRI call")),
        ),
        hop(
            "cri_call",
            1200,
            "containerd",
            "server.(*criService).ListContainers, waiting on Status lock 0xc0000bd800",
            Some(73.9),
            Some((EdgeKind::GoLock, Exactness::Exact, "RLock on the lock UpdateSync holds")),
        ),
        hop(
            "go_lock",
            1200,
            "containerd",
            "container.(*statusStorage).UpdateSync holding Status lock 0xc0000bd800",
            Some(73.5),
            Some((EdgeKind::Ttrpc, Exactness::Exact, "its goroutine waits on a ttrpc Update to the shim")),
        ),
        Hop {
            pod: shim_pod.clone(),
            ..hop(
                "go_call",
                15351,
                "containerd-shim",
                "task.(*service).Update for container 606c6b6fe6fe",
                Some(73.4),
                Some((EdgeKind::ShimMutex, Exactness::Inferred, "the shim's per-process mutex, held by Delete")),
            )
        },
        Hop {
            pod: shim_pod.clone(),
            ..hop(
                "go_call",
                15353,
                "containerd-shim",
                "task.(*service).Delete for container 606c6b6fe6fe",
                Some(73.2),
                Some((EdgeKind::SameGoroutine, Exactness::Exact, "the same goroutine is in umount2")),
            )
        },
        Hop {
            pod: shim_pod,
            ..hop(
                "umount",
                15353,
                "containerd-shim",
                "umount2 /run/containerd/io.containerd.runtime.v2.task/k8s.io/606c6b6fe6fe/rootfs (task_work after the syscall returned)",
                Some(73.0),
                Some((EdgeKind::Device, Exactness::Exact, "its writeback waits on the device")),
            )
        },
        terminal("device", None, "block device 7:1 (loop1): 0 requests in flight, 1.0 MiB/s written over the last 5 s"),
    ];
    let netlink = vec![
        hop(
            "netlink_request",
            3100,
            "terwayd",
            "route RTM_NEWLINK seq 7",
            Some(95.0),
            Some((
                EdgeKind::NoReply,
                Exactness::Exact,
                "sent to the kernel (port 0); no reply matched its seq, and the sender waits in a receive",
            )),
        ),
        terminal("kernel", None, "the kernel: no reply"),
    ];
    let dbus = vec![
        hop(
            "dbus_call",
            5200,
            "runc",
            "D-Bus org.freedesktop.systemd1.Manager.StartTransientUnit to org.freedesktop.systemd1",
            Some(31.0),
            Some((EdgeKind::DbusOwner, Exactness::Exact, "owner of org.freedesktop.systemd1 (GetConnectionUnixProcessID)")),
        ),
        terminal("process", Some(1), "systemd pid 1: state S, not reading its bus socket"),
    ];
    let child = vec![
        hop(
            "child_wait",
            15351,
            "containerd-shim",
            "wait4(pid 15402)",
            Some(20.5),
            Some((EdgeKind::Child, Exactness::Exact, "the pid argument names it")),
        ),
        terminal("process", Some(15402), "runc pid 15402: state T (stopped)"),
    ];
    let mut late = c9770_found_late();
    late.started_before_attach = true;
    vec![
        ("umount", incident(Level::Warn, umount, 0)),
        ("containerd-9770", incident(Level::Critical, c9770, 5)),
        ("netlink", incident(Level::Warn, netlink, 0)),
        ("dbus", incident(Level::Warn, dbus, 0)),
        ("child-wait", incident(Level::Warn, child, 0)),
        ("started-before-attach", late),
    ]
}

/// A run started mid-stall: ages found by the goroutine scan and the sweep.
fn c9770_found_late() -> Incident {
    let mut relist = hop(
        "pleg_relist",
        900,
        "kubelet",
        "pleg.(*GenericPLEG).Relist",
        Some(12.0),
        Some((EdgeKind::CriCall, Exactness::Inferred, "the relist's CRI call")),
    );
    relist.start = StartTiming::Waitsince;
    let mut list = hop(
        "cri_call",
        1200,
        "containerd",
        "server.(*criService).ListContainers, waiting on Status lock 0xc0000bd800",
        Some(2.0),
        Some((EdgeKind::GoLock, Exactness::Exact, "RLock on the lock UpdateSync holds")),
    );
    list.start = StartTiming::Unknown;
    let mut umount = hop(
        "umount",
        15353,
        "containerd-shim",
        "umount2 (task_work after the syscall returned; found there, its target already unmounted)",
        Some(6.1),
        None,
    );
    umount.start = StartTiming::LowerBound;
    incident(Level::Warn, vec![relist, list, umount], 2)
}

/// The clock at the start of a line (`09:41:44.674 `) masked.
fn mask(text: &str) -> String {
    text.lines()
        .map(|l| {
            let b = l.as_bytes();
            let clock = b.len() >= 13
                && b[..12].iter().enumerate().all(|(i, c)| match i {
                    2 | 5 => *c == b':',
                    8 => *c == b'.',
                    _ => c.is_ascii_digit(),
                })
                && b[12] == b' ';
            if clock {
                format!("HH:MM:SS.mmm{}", &l[12..])
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src").join("sinks").join("golden")
}

#[test]
fn the_first_screen_of_each_incident_kind_matches_its_golden_file() {
    let bless = std::env::var_os("PLEGWATCH_BLESS").is_some();
    let mut wrong = Vec::new();
    for (name, incident) in cases() {
        let mut out = Vec::new();
        {
            let mut sink = TextSink::new(&mut out, TextOptions::default());
            sink.emit(&ready());
            sink.emit(&Event::Incident(Box::new(incident)));
        }
        let got = mask(&String::from_utf8_lossy(&out));
        assert!(!got.contains("{\""), "{name}: JSON on the first screen:\n{got}");
        assert!(got.lines().all(|l| l.chars().count() <= 240), "{name}: a line longer than 240 characters:\n{got}");
        let path = golden_dir().join(format!("{name}.txt"));
        if bless {
            std::fs::create_dir_all(golden_dir()).expect("golden dir");
            std::fs::write(&path, &got).expect("write golden");
            continue;
        }
        match std::fs::read_to_string(&path) {
            Ok(want) if want == got => {}
            Ok(want) => wrong.push(format!("{name}: differs from {}\n--- want\n{want}--- got\n{got}", path.display())),
            Err(e) => wrong.push(format!("{name}: cannot read {}: {e} (PLEGWATCH_BLESS=1 writes it)", path.display())),
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn the_mask_takes_the_clock_only() {
    assert_eq!(
        mask("09:41:44.674 WARN incident #1 waited 2.1s\n  ROOT 1. umount 2.1s"),
        "HH:MM:SS.mmm WARN incident #1 waited 2.1s\n  ROOT 1. umount 2.1s\n"
    );
    assert_eq!(mask("9:41:44.674 x"), "9:41:44.674 x\n");
}
