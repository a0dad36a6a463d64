//! Issue 12: only D-Bus and netlink *headers* are read, never message bodies, and no body
//! byte reaches plegwatch's memory.
//!
//! plegwatch's eBPF ring buffers are mapped into its address space, so any byte the kernel
//! side copies out lands in its memory. The test makes a random canary at run time (24
//! random non-zero bytes; "hex" is their 48-character hex form, "raw" the bytes themselves), hands it
//! to two clients on their stdin (never in an argument, a file or an environment plegwatch
//! reads) and has them put it in message bodies while plegwatch watches:
//!
//! - D-Bus (`dbus_canary`, two connections to a private `dbus-daemon`): a method call whose
//!   body (signature `say`) carries hex and raw, answered by the other connection with the
//!   same body (so the body is written and read on both), then the same call to a frozen
//!   service, never answered;
//! - netlink (`nl_client canary-alias`, in a network namespace of the test's own): lo's alias
//!   (`IFLA_IFALIAS`) set to hex + raw (RTM_NEWLINK, acked), read back in RTM_GETLINK's
//!   reply, then set again with NLM_F_REQUEST only, after which the client blocks in
//!   `recvfrom`.
//!
//! plegwatch must show that it saw that traffic: the unanswered D-Bus call reported as a
//! `dbus_call` stall naming its member, the netlink request as a `netlink_request` stall with
//! its seq. Then every readable mapping of plegwatch with resident pages (its heap, stacks,
//! and the ring buffers' `anon_inode:bpf-map` mappings) is read through `/proc/PID/mem`, and
//! neither hex nor raw may be anywhere, nor in its stdout or stderr.
//!
//! The scan is checked to work: the member name of the calls is a second canary (also given
//! on stdin), a header field plegwatch does copy out of the kernel; it must be found, and
//! found in a ring buffer mapping. Not covered: the SASL handshake (copied as it is: it
//! carries no message), and the ttrpc payloads (the `ttrpc_frames` scenario's subject).

use std::process::Command;
use std::time::Duration;

use plegwatch_scenarios::child::{Options, Proc};
use plegwatch_scenarios::dbus::{self, FrozenService, PrivateBus, SERVICE};
use plegwatch_scenarios::events::dump;
use plegwatch_scenarios::memscan;
use plegwatch_scenarios::netlink::NetNs;
use plegwatch_scenarios::plegwatch::READY_TIMEOUT;
use plegwatch_scenarios::{preflight, Event, Plegwatch};

const DBUS_CANARY: &str = env!("CARGO_BIN_EXE_dbus_canary");
const NL_CLIENT: &str = env!("CARGO_BIN_EXE_nl_client");
/// The netlink client's first seq; its unanswered request is `NL_SEQ + 2`.
const NL_SEQ: u32 = 0x5eed_0c00;
const WARN: &str = "1s";
/// Each stall is due 1 s after its request: this is plenty.
const DUE: Duration = Duration::from_secs(8);

fn random_bytes(n: usize) -> Vec<u8> {
    let mut b = vec![0u8; n];
    // SAFETY: `b` is valid for `n` bytes.
    let got = unsafe { libc::getrandom(b.as_mut_ptr().cast(), n, 0) };
    assert_eq!(got, n as isize, "getrandom");
    b
}

fn to_hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
fn no_body_byte_reaches_plegwatch() -> anyhow::Result<()> {
    preflight::require();
    // No zero byte: the kernel keeps IFLA_IFALIAS as a C string, so a 0 would cut the
    // alias short and the client's read-back check would fail (1 run in 11 with 24 fully
    // random bytes). 255^24 values are still far beyond chance in a memory scan.
    let raw: Vec<u8> = random_bytes(24).into_iter().map(|b| if b == 0 { 1 } else { b }).collect();
    let hex = to_hex(&raw);
    // A valid D-Bus member name, random too.
    let member = format!("M{}", to_hex(&random_bytes(16)));

    let origin = std::time::Instant::now();
    let ns = NetNs::new("canary")?;
    let bus = PrivateBus::start()?;
    let _service = FrozenService::start(&bus, SERVICE)?;
    let mut plegwatch = Plegwatch::start(&["--warn", WARN])?;
    plegwatch.wait_ready(READY_TIMEOUT)?;

    let mut dbus_client = Proc::spawn_with_input(
        "dbus_canary",
        Command::new(DBUS_CANARY).arg("--bus").arg(bus.socket()).args(["--frozen", SERVICE]),
        dbus::CHILD,
        format!("{hex}\n{member}\n").as_bytes(),
    )?;
    let (_, said) = dbus_client.next_line(Duration::from_secs(10))?;
    assert!(said.contains(" sent serial="), "dbus_canary said {said:?}");
    let mut nl_client = Proc::spawn_with_input(
        "nl_client canary-alias",
        Command::new(NL_CLIENT).args(["canary-alias", "--netns", ns.name(), "--seq", &NL_SEQ.to_string()]),
        Options::default(),
        format!("{hex}\n").as_bytes(),
    )?;
    let (_, said) = nl_client.next_line(Duration::from_secs(10))?;
    assert!(said.contains(" sent fd="), "nl_client said {said:?}");
    let (dbus_pid, nl_pid) = (u64::from(dbus_client.pid()), u64::from(nl_client.pid()));

    // plegwatch saw both: the unanswered call and request are reported.
    let dbus_stall =
        plegwatch.wait_for(DUE, |e: &Event| e.is("stall") && e.str("/kind") == Some("dbus_call") && e.u64("/pid") == Some(dbus_pid));
    let nl_stall =
        plegwatch.wait_for(DUE, |e: &Event| e.is("stall") && e.str("/kind") == Some("netlink_request") && e.u64("/pid") == Some(nl_pid));

    // Every readable page of plegwatch, while the calls are still open.
    let pid = plegwatch.pid();
    let scan = memscan::scan(pid, &[hex.as_bytes(), &raw, member.as_bytes()])?;
    let ring_read: u64 = scan.regions.iter().filter(|r| r.name.contains("bpf")).map(|r| r.read).sum();
    eprintln!(
        "scanned {} regions of plegwatch (pid {pid}), {} MiB, {} KiB of them bpf-map mappings",
        scan.regions.len(),
        scan.bytes_read() >> 20,
        ring_read >> 10
    );
    eprintln!("hex found at {:?}, raw at {:?}, member at {:?}", scan.hits[0], scan.hits[1], scan.hits[2]);

    drop(dbus_client);
    drop(nl_client);
    let stderr = plegwatch.stderr();
    let events = plegwatch.stop()?;
    let all = || dump(&events, origin);

    let dbus_stall = dbus_stall.unwrap_or_else(|| panic!("no dbus_call stall for dbus_canary (pid {dbus_pid}):\n{}", all()));
    assert_eq!(dbus_stall.str("/detail/member"), Some(member.as_str()), "{}", dbus_stall.json);
    assert_eq!(dbus_stall.str("/detail/destination"), Some(SERVICE), "{}", dbus_stall.json);
    let nl_stall = nl_stall.unwrap_or_else(|| panic!("no netlink_request stall for nl_client (pid {nl_pid}):\n{}", all()));
    assert_eq!(nl_stall.u64("/detail/seq"), Some(u64::from(NL_SEQ + 2)), "{}", nl_stall.json);

    // The scan works: it read the ring buffers, and found the header canary there.
    assert!(ring_read > 0, "no bpf-map mapping of plegwatch was read: {:?}", scan.regions.iter().map(|r| &r.name).collect::<Vec<_>>());
    assert!(
        scan.hits[2].iter().any(|h| h.contains("bpf")),
        "the member name (a header field the kernel copies out) is not in a ring buffer mapping: found at {:?}",
        scan.hits[2]
    );
    // No body byte anywhere.
    assert!(scan.hits[0].is_empty(), "the body canary (hex) is in plegwatch's memory at {:?}", scan.hits[0]);
    assert!(scan.hits[1].is_empty(), "the body canary (raw bytes) is in plegwatch's memory at {:?}", scan.hits[1]);
    let out: String = events.iter().map(|e| e.json.to_string()).collect();
    assert!(!out.contains(&hex) && !stderr.contains(&hex), "the body canary is in plegwatch's output");
    Ok(())
}
