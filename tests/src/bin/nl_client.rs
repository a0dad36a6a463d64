//! Netlink clients for the netlink scenarios: each is its own single-threaded process, so its
//! pid is the tid plegwatch reports.
//!
//! ```text
//! nl_client route-noreply    [--netns NAME] [--seq N]
//! nl_client usersock-peer    [--netns NAME] --portid P
//! nl_client usersock-request [--netns NAME] --portid P [--seq N] [--type T]
//! ```
//!
//! - `route-noreply`: a NETLINK_ROUTE socket sends RTM_NEWLINK for ifindex 1 (lo) with only
//!   NLM_F_REQUEST and no change: the kernel succeeds silently and sends nothing back. The
//!   process then blocks in `recvfrom` on that socket, forever.
//! - `usersock-peer`: binds a NETLINK_USERSOCK socket to portid P and never reads it.
//! - `usersock-request`: sends a NETLINK_USERSOCK message of type T (NLM_F_REQUEST|NLM_F_ACK)
//!   to portid P and blocks in `recvfrom` for the reply, which the peer never sends.
//!
//! With `--netns NAME` the process first enters `/run/netns/NAME` (made by `ip netns add`).
//! Once the request is sent (or the peer bound) it prints one line, `PID TID sent fd=FD` (or
//! `PID TID bound fd=FD`), FD being the netlink socket, and flushes it: the test times the wait from there. Should `recvfrom`
//! ever return, it prints `received N` (or `recvfrom failed: ...`) and exits with status 3.

use std::ffi::CString;
use std::io::{self, Write};
use std::mem;
use std::process::ExitCode;

const RTM_NEWLINK: u16 = 16;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;

#[derive(Debug)]
struct Opts {
    mode: String,
    netns: Option<String>,
    seq: u32,
    portid: u32,
    msg_type: u16,
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nl_client: {e}");
            ExitCode::from(2)
        }
    }
}

fn run() -> Result<(), String> {
    let opts = parse_args()?;
    if let Some(ns) = &opts.netns {
        enter_netns(ns)?;
    }
    match opts.mode.as_str() {
        "route-noreply" => {
            let fd = netlink_socket(libc::NETLINK_ROUTE, 0)?;
            let mut msg = nlmsghdr(32, RTM_NEWLINK, NLM_F_REQUEST, opts.seq);
            // struct ifinfomsg: family, pad, type, index = 1 (lo), flags = 0, change = 0.
            msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
            msg.extend_from_slice(&0u16.to_ne_bytes());
            msg.extend_from_slice(&1i32.to_ne_bytes());
            msg.extend_from_slice(&0u32.to_ne_bytes());
            msg.extend_from_slice(&0u32.to_ne_bytes());
            send_to(fd, &msg, 0)?;
            announce("sent", fd)?;
            block_in_recv(fd)
        }
        "usersock-peer" => {
            let fd = netlink_socket(libc::NETLINK_USERSOCK, opts.portid)?;
            announce("bound", fd)?;
            loop {
                // SAFETY: pause(2) takes no arguments; it returns only after a caught signal.
                unsafe { libc::pause() };
            }
        }
        "usersock-request" => {
            let fd = netlink_socket(libc::NETLINK_USERSOCK, 0)?;
            let mut msg = nlmsghdr(20, opts.msg_type, NLM_F_REQUEST | NLM_F_ACK, opts.seq);
            msg.extend_from_slice(b"ping");
            send_to(fd, &msg, opts.portid)?;
            announce("sent", fd)?;
            block_in_recv(fd)
        }
        other => Err(format!("unknown mode {other:?}")),
    }
}

fn parse_args() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().ok_or("usage: nl_client MODE [OPTIONS]")?;
    let mut opts = Opts {
        mode,
        netns: None,
        seq: 42,
        portid: 0,
        msg_type: 0x10,
    };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || {
            value
                .parse::<u32>()
                .map_err(|e| format!("{flag} {value}: {e}"))
        };
        match flag.as_str() {
            "--netns" => opts.netns = Some(value.clone()),
            "--seq" => opts.seq = number()?,
            "--portid" => opts.portid = number()?,
            "--type" => {
                opts.msg_type = u16::try_from(number()?).map_err(|e| format!("--type: {e}"))?
            }
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(opts)
}

fn os_err(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

/// Enters the network namespace `ip netns add NAME` made.
fn enter_netns(name: &str) -> Result<(), String> {
    let path = CString::new(format!("/run/netns/{name}")).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated path; the returned fd is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(os_err(&format!("open /run/netns/{name}")));
    }
    // SAFETY: fd is a namespace file we just opened; this process is single-threaded.
    let rc = unsafe { libc::setns(fd, libc::CLONE_NEWNET) };
    let err = os_err(&format!("setns /run/netns/{name}"));
    // SAFETY: closing the fd we opened.
    unsafe { libc::close(fd) };
    if rc != 0 {
        return Err(err);
    }
    Ok(())
}

fn sockaddr_nl(portid: u32) -> libc::sockaddr_nl {
    // SAFETY: sockaddr_nl is plain old data, valid when zeroed.
    let mut sa: libc::sockaddr_nl = unsafe { mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    sa.nl_pid = portid;
    sa.nl_groups = 0;
    sa
}

/// A netlink socket of `protocol` bound to `portid` (0: the kernel picks one), no groups.
fn netlink_socket(protocol: i32, portid: u32) -> Result<i32, String> {
    // SAFETY: socket(2) with constant arguments; the result is checked.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            protocol,
        )
    };
    if fd < 0 {
        return Err(os_err(&format!("socket(AF_NETLINK, {protocol})")));
    }
    let sa = sockaddr_nl(portid);
    // SAFETY: sa is a valid sockaddr_nl and the length is its size.
    let rc = unsafe {
        libc::bind(
            fd,
            (&sa as *const libc::sockaddr_nl).cast(),
            mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(os_err(&format!("bind netlink portid {portid}")));
    }
    Ok(fd)
}

/// A `struct nlmsghdr` (portid 0: the kernel fills in ours).
fn nlmsghdr(len: u32, msg_type: u16, flags: u16, seq: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(len as usize);
    h.extend_from_slice(&len.to_ne_bytes());
    h.extend_from_slice(&msg_type.to_ne_bytes());
    h.extend_from_slice(&flags.to_ne_bytes());
    h.extend_from_slice(&seq.to_ne_bytes());
    h.extend_from_slice(&0u32.to_ne_bytes());
    h
}

fn send_to(fd: i32, msg: &[u8], portid: u32) -> Result<(), String> {
    let sa = sockaddr_nl(portid);
    // SAFETY: msg and sa are valid for the lengths given.
    let n = unsafe {
        libc::sendto(
            fd,
            msg.as_ptr().cast(),
            msg.len(),
            0,
            (&sa as *const libc::sockaddr_nl).cast(),
            mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    };
    if n < 0 {
        return Err(os_err(&format!("sendto netlink portid {portid}")));
    }
    if n as usize != msg.len() {
        return Err(format!("sendto sent {n} of {} bytes", msg.len()));
    }
    Ok(())
}

/// Prints `PID TID WHAT fd=FD` on stdout and flushes it.
fn announce(what: &str, fd: i32) -> Result<(), String> {
    // SAFETY: getpid(2) and gettid(2) take no arguments and cannot fail.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let mut out = io::stdout().lock();
    writeln!(out, "{pid} {tid} {what} fd={fd}")
        .and_then(|()| out.flush())
        .map_err(|e| format!("stdout: {e}"))
}

/// Blocks in one `recvfrom` on `fd`. Returning at all means the scenario went wrong.
fn block_in_recv(fd: i32) -> ! {
    let mut buf = vec![0u8; 65536];
    // SAFETY: buf is valid for its length; no source address is asked for.
    let n = unsafe {
        libc::recvfrom(
            fd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            0,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        )
    };
    let what = if n < 0 {
        os_err("recvfrom failed")
    } else {
        format!("received {n} bytes")
    };
    println!("{what}");
    eprintln!("nl_client: the blocking recvfrom returned: {what}");
    std::process::exit(3);
}
