//! Netlink clients for the netlink scenarios: each is its own single-threaded process, so its
//! pid is the tid plegwatch reports.
//!
//! ```text
//! nl_client route-noreply    [--netns NAME] [--seq N]
//! nl_client usersock-peer    [--netns NAME] --portid P
//! nl_client usersock-request [--netns NAME] --portid P [--seq N] [--type T]
//! nl_client route-then-reuse [--netns NAME] [--seq N] --reuse HOW [--reuse-seq M] [--first-wait-ms T]
//! ```
//!
//! - `route-noreply`: a NETLINK_ROUTE socket sends RTM_NEWLINK for ifindex 1 (lo) with only
//!   NLM_F_REQUEST and no change: the kernel succeeds silently and sends nothing back. The
//!   process then blocks in `recvfrom` on that socket, forever.
//! - `usersock-peer`: binds a NETLINK_USERSOCK socket to portid P and never reads it.
//! - `usersock-request`: sends a NETLINK_USERSOCK message of type T (NLM_F_REQUEST|NLM_F_ACK)
//!   to portid P and blocks in `recvfrom` for the reply, which the peer never sends.
//!
//! - `route-then-reuse`: as `route-noreply`, but the blocking `recvfrom` times out after T ms
//!   (`SO_RCVTIMEO`, default 3500). Then the netlink socket's fd is reused for one end of an
//!   AF_UNIX socketpair, HOW being `dup2` or `dup3` (the end is duplicated onto it),
//!   `close-range` (`close_range(fd, fd, 0)`, then the socketpair takes the freed fd),
//!   `close-range-all` (`close_range(3, ~0U, 0)`, likewise) or `exec` (the process execs itself;
//!   the socket was opened with SOCK_CLOEXEC, so the new program's socketpair takes its fd). For
//!   `exec` the socket is made above seven fds on /dev/null (3 to 9), of which the first is
//!   closed before the exec: the dynamic loader's own open and close then use fd 3, and leave
//!   the socket's fd for the socketpair's second end, with no close(2) of it in between.
//!   On that fd the process writes the bytes of a netlink request that expects a reply
//!   (RTM_GETLINK with NLM_F_REQUEST|NLM_F_ACK, seq M), prints `PID TID reused fd=FD` and blocks
//!   reading it: the other end never writes. No netlink request is open there.
//!
//! - `canary-alias` (the `no_body_bytes` scenario): reads a line of hex from stdin; sets lo's
//!   alias (IFLA_IFALIAS) to that hex and the bytes it encodes (RTM_NEWLINK, acked), reads it
//!   back (RTM_GETLINK), then sets it again with NLM_F_REQUEST only (seq N+2), prints `sent`
//!   and blocks in `recvfrom` like `route-noreply`.
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
const RTM_GETLINK: u16 = 18;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;

#[derive(Debug)]
struct Opts {
    mode: String,
    netns: Option<String>,
    seq: u32,
    portid: u32,
    msg_type: u16,
    reuse: String,
    reuse_seq: u32,
    first_wait_ms: u32,
    fd: i32,
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
    if opts.mode != "after-exec" {
        // Fds a CI runner or job server leaked into us (pipes, not close-on-exec) would
        // shift every fd number the reuse modes count on: start from stdio alone.
        // SAFETY: close_range(2) on this process's own fds; nothing here holds one yet.
        if unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) } != 0 {
            return Err(os_err("close_range of inherited fds"));
        }
    }
    if let Some(ns) = &opts.netns {
        enter_netns(ns)?;
    }
    match opts.mode.as_str() {
        "route-noreply" => {
            let fd = netlink_socket(libc::NETLINK_ROUTE, 0)?;
            send_to(fd, &newlink_lo(opts.seq), 0)?;
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
        "route-then-reuse" => {
            if opts.reuse == "exec" {
                hold_low_fds()?;
            }
            let fd = netlink_socket(libc::NETLINK_ROUTE, 0)?;
            send_to(fd, &newlink_lo(opts.seq), 0)?;
            announce("sent", fd)?;
            recv_until_timeout(fd, opts.first_wait_ms)?;
            reuse(fd, &opts)
        }
        // What `route-then-reuse --reuse exec` runs after its exec.
        "after-exec" => {
            let fd = socketpair_at(opts.fd)?;
            write_request_and_block(fd, opts.reuse_seq)
        }
        "usersock-request" => {
            let fd = netlink_socket(libc::NETLINK_USERSOCK, 0)?;
            let mut msg = nlmsghdr(20, opts.msg_type, NLM_F_REQUEST | NLM_F_ACK, opts.seq);
            msg.extend_from_slice(b"ping");
            send_to(fd, &msg, opts.portid)?;
            announce("sent", fd)?;
            block_in_recv(fd)
        }
        "canary-alias" => {
            let alias = canary_alias()?;
            let fd = netlink_socket(libc::NETLINK_ROUTE, 0)?;
            // Set lo's alias, acked; read it back; then set it again unacked and block.
            send_to(fd, &newlink_lo_alias(opts.seq, NLM_F_REQUEST | NLM_F_ACK, &alias), 0)?;
            let ack = recv_vec(fd)?;
            if ack.get(16..20) != Some(&0i32.to_ne_bytes()[..]) {
                return Err(format!("setting lo's alias was refused: {ack:?}"));
            }
            send_to(fd, &getlink_lo(opts.seq + 1), 0)?;
            let reply = recv_vec(fd)?;
            if !reply.windows(alias.len()).any(|w| w == alias) {
                return Err("RTM_GETLINK's reply does not carry lo's alias".into());
            }
            send_to(fd, &newlink_lo_alias(opts.seq + 2, NLM_F_REQUEST, &alias), 0)?;
            announce("sent", fd)?;
            block_in_recv(fd)
        }
        other => Err(format!("unknown mode {other:?}")),
    }
}

/// `canary-alias`: the alias is a line of hex read from stdin (never an argument), then the
/// bytes it encodes.
fn canary_alias() -> Result<Vec<u8>, String> {
    let mut line = String::new();
    io::stdin().read_line(&mut line).map_err(|e| format!("stdin: {e}"))?;
    let hex = line.trim();
    if hex.is_empty() || !hex.len().is_multiple_of(2) {
        return Err(format!("stdin: want a line of hex, got {} chars", hex.len()));
    }
    let raw = (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).map_err(|e| format!("stdin: {e}")))
        .collect::<Result<Vec<u8>, String>>()?;
    let mut alias = hex.as_bytes().to_vec();
    alias.extend(raw);
    if alias.len() > 127 {
        return Err("stdin: the alias would be over 127 bytes".into());
    }
    Ok(alias)
}

/// RTM_NEWLINK for lo (ifindex 1) with IFLA_IFALIAS = `alias`.
fn newlink_lo_alias(seq: u32, flags: u16, alias: &[u8]) -> Vec<u8> {
    const IFLA_IFALIAS: u16 = 20;
    let attr_len = 4 + alias.len();
    let total = 32 + ((attr_len + 3) & !3);
    let mut msg = nlmsghdr(total as u32, RTM_NEWLINK, flags, seq);
    msg.extend_from_slice(&ifinfomsg_lo());
    msg.extend_from_slice(&(attr_len as u16).to_ne_bytes());
    msg.extend_from_slice(&IFLA_IFALIAS.to_ne_bytes());
    msg.extend_from_slice(alias);
    msg.resize(total, 0);
    msg
}

/// RTM_GETLINK for lo (ifindex 1): answered with its RTM_NEWLINK.
fn getlink_lo(seq: u32) -> Vec<u8> {
    let mut msg = nlmsghdr(32, RTM_GETLINK, NLM_F_REQUEST, seq);
    msg.extend_from_slice(&ifinfomsg_lo());
    msg
}

/// `struct ifinfomsg` for lo: family, pad, type, index 1, flags 0, change 0.
fn ifinfomsg_lo() -> Vec<u8> {
    let mut m = vec![libc::AF_UNSPEC as u8, 0];
    m.extend_from_slice(&0u16.to_ne_bytes());
    m.extend_from_slice(&1i32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m
}

/// One blocking `recvfrom`: the bytes it got.
fn recv_vec(fd: i32) -> Result<Vec<u8>, String> {
    let mut buf = vec![0u8; 65536];
    // SAFETY: buf is valid for its length; no source address is asked for.
    let n = unsafe { libc::recvfrom(fd, buf.as_mut_ptr().cast(), buf.len(), 0, std::ptr::null_mut(), std::ptr::null_mut()) };
    if n < 0 {
        return Err(os_err("recvfrom"));
    }
    buf.truncate(n as usize);
    Ok(buf)
}

fn parse_args() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    let mode = args.next().ok_or("usage: nl_client MODE [OPTIONS]")?;
    let mut opts =
        Opts { mode, netns: None, seq: 42, portid: 0, msg_type: 0x10, reuse: String::new(), reuse_seq: 43, first_wait_ms: 3500, fd: -1 };
    while let Some(flag) = args.next() {
        let value = args.next().ok_or(format!("{flag} needs a value"))?;
        let number = || value.parse::<u32>().map_err(|e| format!("{flag} {value}: {e}"));
        match flag.as_str() {
            "--netns" => opts.netns = Some(value.clone()),
            "--seq" => opts.seq = number()?,
            "--portid" => opts.portid = number()?,
            "--reuse" => opts.reuse = value.clone(),
            "--reuse-seq" => opts.reuse_seq = number()?,
            "--first-wait-ms" => opts.first_wait_ms = number()?,
            "--fd" => opts.fd = i32::try_from(number()?).map_err(|e| format!("--fd: {e}"))?,
            "--type" => opts.msg_type = u16::try_from(number()?).map_err(|e| format!("--type: {e}"))?,
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
    let fd = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(os_err(&format!("socket(AF_NETLINK, {protocol})")));
    }
    let sa = sockaddr_nl(portid);
    // SAFETY: sa is a valid sockaddr_nl and the length is its size.
    let rc = unsafe { libc::bind(fd, (&sa as *const libc::sockaddr_nl).cast(), mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t) };
    if rc != 0 {
        return Err(os_err(&format!("bind netlink portid {portid}")));
    }
    Ok(fd)
}

/// RTM_NEWLINK for ifindex 1 (lo) that changes nothing, with only NLM_F_REQUEST: applied
/// silently, never answered.
fn newlink_lo(seq: u32) -> Vec<u8> {
    let mut msg = nlmsghdr(32, RTM_NEWLINK, NLM_F_REQUEST, seq);
    // struct ifinfomsg: family, pad, type, index = 1 (lo), flags = 0, change = 0.
    msg.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
    msg.extend_from_slice(&0u16.to_ne_bytes());
    msg.extend_from_slice(&1i32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg.extend_from_slice(&0u32.to_ne_bytes());
    msg
}

/// One blocking `recvfrom` on `fd` into a 64 KiB buffer: its return value.
fn recv_once(fd: i32) -> isize {
    let mut buf = vec![0u8; 65536];
    // SAFETY: buf is valid for its length; no source address is asked for.
    unsafe { libc::recvfrom(fd, buf.as_mut_ptr().cast(), buf.len(), 0, std::ptr::null_mut(), std::ptr::null_mut()) }
}

/// Blocks in `recvfrom` on `fd` for at most `ms` milliseconds; an error if anything comes.
fn recv_until_timeout(fd: i32, ms: u32) -> Result<(), String> {
    let tv = libc::timeval { tv_sec: libc::time_t::from(ms / 1000), tv_usec: libc::suseconds_t::from((ms % 1000) * 1000) };
    // SAFETY: tv is a valid timeval and the length is its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&tv as *const libc::timeval).cast(),
            mem::size_of::<libc::timeval>() as libc::socklen_t,
        )
    };
    if rc != 0 {
        return Err(os_err("setsockopt SO_RCVTIMEO"));
    }
    let n = recv_once(fd);
    let err = io::Error::last_os_error();
    match n {
        n if n >= 0 => Err(format!("recvfrom got {n} bytes: the request was answered")),
        _ if err.kind() == io::ErrorKind::WouldBlock => Ok(()),
        _ => Err(format!("recvfrom failed: {err}")),
    }
}

/// Makes the netlink socket's fd `fd` one end of an AF_UNIX socketpair, as `opts.reuse`
/// says, then writes a netlink-looking request there and blocks reading it.
fn reuse(fd: i32, opts: &Opts) -> Result<(), String> {
    let end = match opts.reuse.as_str() {
        "dup2" | "dup3" => {
            let (a, _b) = socketpair()?;
            // SAFETY: dup2/dup3 on fds this process owns; the results are checked.
            let rc = unsafe {
                if opts.reuse == "dup2" {
                    libc::dup2(a, fd)
                } else {
                    libc::dup3(a, fd, libc::O_CLOEXEC)
                }
            };
            if rc != fd {
                return Err(os_err(&opts.reuse));
            }
            // SAFETY: closing the fd we made; its file lives on at `fd`. `_b`, the other
            // end, stays open and silent.
            unsafe { libc::close(a) };
            fd
        }
        "close-range" | "close-range-all" => {
            let (first, last) = if opts.reuse == "close-range" { (fd as u32, fd as u32) } else { (3, u32::MAX) };
            // SAFETY: close_range(2) on this process's own fds (stdio is below 3).
            if unsafe { libc::syscall(libc::SYS_close_range, first, last, 0u32) } != 0 {
                return Err(os_err("close_range"));
            }
            socketpair_at(fd)?
        }
        "exec" => {
            // SAFETY: fd 3 is the first /dev/null of `hold_low_fds`: the loader will use it.
            unsafe { libc::close(3) };
            let exe = CString::new("/proc/self/exe").map_err(|e| e.to_string())?;
            let args: Vec<CString> = ["nl_client", "after-exec", "--fd", &fd.to_string(), "--reuse-seq", &opts.reuse_seq.to_string()]
                .iter()
                .map(|a| CString::new(*a).map_err(|e| e.to_string()))
                .collect::<Result<_, _>>()?;
            let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
            argv.push(std::ptr::null());
            // SAFETY: NUL-terminated strings and a NULL-terminated argv that outlive the call;
            // execv returns only on failure.
            unsafe { libc::execv(exe.as_ptr(), argv.as_ptr()) };
            return Err(os_err("execv /proc/self/exe"));
        }
        other => return Err(format!("unknown --reuse {other:?}")),
    };
    write_request_and_block(end, opts.reuse_seq)
}

/// Opens /dev/null on fds 3 to 9 (not close-on-exec), so that the next socket lands above
/// them; `reuse` closes fd 3 again just before the exec.
fn hold_low_fds() -> Result<(), String> {
    let null = CString::new("/dev/null").map_err(|e| e.to_string())?;
    for want in 3..10 {
        // SAFETY: a NUL-terminated path; the fd is checked.
        let fd = unsafe { libc::open(null.as_ptr(), libc::O_RDONLY) };
        if fd != want {
            return Err(format!("/dev/null opened as fd {fd}, not {want}"));
        }
    }
    Ok(())
}

/// An AF_UNIX stream socketpair.
fn socketpair() -> Result<(i32, i32), String> {
    let mut fds = [0i32; 2];
    // SAFETY: fds has room for the two fds returned.
    if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) } != 0 {
        return Err(os_err("socketpair"));
    }
    Ok((fds[0], fds[1]))
}

/// A socketpair one of whose ends is `fd`, a freed fd (an error otherwise). The other end
/// stays open and silent.
fn socketpair_at(fd: i32) -> Result<i32, String> {
    let (a, b) = socketpair()?;
    if a != fd && b != fd {
        return Err(format!("the socketpair took fds {a} and {b}, not the freed fd {fd}"));
    }
    Ok(fd)
}

/// Writes a netlink request that expects a reply (RTM_GETLINK for lo, NLM_F_REQUEST|NLM_F_ACK,
/// sequence number `seq`) on `fd`, which is not a netlink socket, says `reused`, and blocks
/// reading `fd` forever.
fn write_request_and_block(fd: i32, seq: u32) -> Result<(), String> {
    let mut msg = newlink_lo(seq);
    msg[4..6].copy_from_slice(&RTM_GETLINK.to_ne_bytes());
    msg[6..8].copy_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    // SAFETY: msg is valid for its length.
    let n = unsafe { libc::write(fd, msg.as_ptr().cast(), msg.len()) };
    if n != msg.len() as isize {
        return Err(os_err("write the request-looking bytes"));
    }
    announce("reused", fd)?;
    let mut buf = [0u8; 4096];
    // SAFETY: buf is valid for its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    Err(format!("the blocking read on fd {fd} returned {n}"))
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
    writeln!(out, "{pid} {tid} {what} fd={fd}").and_then(|()| out.flush()).map_err(|e| format!("stdout: {e}"))
}

/// Blocks in one `recvfrom` on `fd`. Returning at all means the scenario went wrong.
fn block_in_recv(fd: i32) -> ! {
    let n = recv_once(fd);
    let what = if n < 0 { os_err("recvfrom failed") } else { format!("received {n} bytes") };
    println!("{what}");
    eprintln!("nl_client: the blocking recvfrom returned: {what}");
    std::process::exit(3);
}
