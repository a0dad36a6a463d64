//! Who owns a D-Bus name: asked of the bus daemon itself, on a connection of
//! plegwatch's own (`org.freedesktop.DBus.GetConnectionUnixProcessID`).
//!
//! A call stuck on a bus socket is only waiting on the daemon as a relay; the
//! holder is the process that owns the call's destination. Every read has a
//! short timeout: when the daemon itself does not answer, that is the answer
//! (the daemon is the holder).

use crate::proto::dbus::header::{self, Fixed, MessageKind};
use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::{Duration, Instant},
};

/// What the bus said about a name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The owner's pid.
    Pid(u32),
    /// The bus answered with an error (no such name, ...).
    Unknown(String),
    /// The bus did not answer in time: it is stuck itself.
    BusNotAnswering,
}

const BUS: &str = "org.freedesktop.DBus";
const BUS_PATH: &str = "/org/freedesktop/DBus";

fn pad(buf: &mut Vec<u8>, align: usize) {
    while !buf.len().is_multiple_of(align) {
        buf.push(0);
    }
}

/// A little-endian METHOD_CALL to the bus with an optional single string argument.
pub fn method_call(serial: u32, member: &str, arg: Option<&str>) -> Vec<u8> {
    let mut body = Vec::new();
    if let Some(a) = arg {
        body.extend_from_slice(&(a.len() as u32).to_le_bytes());
        body.extend_from_slice(a.as_bytes());
        body.push(0);
    }
    let mut fields = Vec::new();
    let mut field = |code: u8, sig: u8, value: &str| {
        pad(&mut fields, 8);
        fields.extend_from_slice(&[code, 1, sig, 0]);
        if sig == b'g' {
            fields.push(value.len() as u8);
        } else {
            fields.extend_from_slice(&(value.len() as u32).to_le_bytes());
        }
        fields.extend_from_slice(value.as_bytes());
        fields.push(0);
    };
    field(1, b'o', BUS_PATH);
    field(2, b's', BUS);
    field(3, b's', member);
    field(6, b's', BUS);
    if arg.is_some() {
        field(8, b'g', "s");
    }
    let mut msg = vec![b'l', 1, 0, 1];
    msg.extend_from_slice(&(body.len() as u32).to_le_bytes());
    msg.extend_from_slice(&serial.to_le_bytes());
    msg.extend_from_slice(&(fields.len() as u32).to_le_bytes());
    msg.extend_from_slice(&fields);
    pad(&mut msg, 8);
    msg.extend_from_slice(&body);
    msg
}

/// Asks the bus at `bus_path` which process owns `name`, waiting at most
/// `timeout` for each answer.
pub fn owner_of(bus_path: &Path, name: &str, timeout: Duration) -> Owner {
    match ask(bus_path, name, timeout) {
        Ok(o) => o,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Owner::BusNotAnswering,
        Err(e) => Owner::Unknown(e.to_string()),
    }
}

fn ask(bus_path: &Path, name: &str, timeout: Duration) -> std::io::Result<Owner> {
    let mut s = UnixStream::connect(bus_path)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() }.to_string();
    let hex: String = uid.bytes().map(|b| format!("{b:02x}")).collect();
    s.write_all(format!("\0AUTH EXTERNAL {hex}\r\n").as_bytes())?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\r\n") {
        s.read_exact(&mut byte)?;
        line.push(byte[0]);
        if line.len() > 512 {
            return Ok(Owner::Unknown("bus sent an overlong auth line".into()));
        }
    }
    if !line.starts_with(b"OK ") {
        return Ok(Owner::Unknown(format!("bus refused auth: {}", String::from_utf8_lossy(&line).trim())));
    }
    s.write_all(b"BEGIN\r\n")?;
    s.write_all(&method_call(1, "Hello", None))?;
    s.write_all(&method_call(2, "GetConnectionUnixProcessID", Some(name)))?;
    let deadline = Instant::now() + timeout;
    let mut buf = Vec::new();
    loop {
        // Parse whatever whole messages are buffered.
        while let Ok(fixed) = Fixed::parse(&buf) {
            let len = fixed.message_len();
            if buf.len() < len {
                break;
            }
            let msg = header::parse(&buf[..len]);
            let body_at = fixed.header_len();
            if let Ok(m) = msg {
                if m.reply_serial == Some(2) {
                    return Ok(match m.kind {
                        MessageKind::MethodReturn => match buf.get(body_at..body_at + 4) {
                            Some(b) => {
                                let raw = [b[0], b[1], b[2], b[3]];
                                Owner::Pid(if buf[0] == b'B' { u32::from_be_bytes(raw) } else { u32::from_le_bytes(raw) })
                            }
                            None => Owner::Unknown("short reply".into()),
                        },
                        _ => Owner::Unknown(m.error_name.unwrap_or_else(|| "error".into())),
                    });
                }
            }
            buf.drain(..len);
        }
        if Instant::now() >= deadline {
            return Ok(Owner::BusNotAnswering);
        }
        let mut chunk = [0u8; 4096];
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Ok(Owner::Unknown("bus closed the connection".into()));
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// The longest path a unix socket address holds (`sun_path` is 108 bytes, NUL included).
const SUN_PATH_MAX: usize = 107;

/// Where plegwatch can connect to the bus socket that the daemon `daemon`
/// bound at `path` (the address sock_diag reports, as the daemon named it).
///
/// The path means something only in the daemon's mount namespace. When that
/// is plegwatch's own (`same_mount_ns`), it is used as it is. Otherwise (a
/// bus daemon in a container, or plegwatch in one) it is reached under the
/// daemon's root, `/proc/PID/root`, which the kernel walks in the daemon's
/// namespace; the plain path could name another bus, or none. `None` when
/// that form is too long for a socket address.
pub fn reachable_bus_path(path: &str, daemon: Option<u32>, same_mount_ns: bool) -> Option<String> {
    let Some(pid) = daemon.filter(|_| !same_mount_ns && path.starts_with('/')) else {
        return Some(path.to_string());
    };
    let via = format!("/proc/{pid}/root{path}");
    (via.len() <= SUN_PATH_MAX).then_some(via)
}

/// Whether process `pid` shares plegwatch's mount namespace (true when
/// either link can't be read: the plain path is then the best guess).
pub fn in_my_mount_ns(pid: u32) -> bool {
    let mine = std::fs::read_link("/proc/self/ns/mnt");
    let theirs = std::fs::read_link(format!("/proc/{pid}/ns/mnt"));
    match (mine, theirs) {
        (Ok(a), Ok(b)) => a == b,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bus_in_another_mount_namespace_is_reached_under_its_root() {
        let bus = "/run/dbus/system_bus_socket";
        assert_eq!(reachable_bus_path(bus, Some(42), true).as_deref(), Some(bus));
        assert_eq!(reachable_bus_path(bus, None, false).as_deref(), Some(bus), "no daemon known: the path as it is");
        assert_eq!(reachable_bus_path(bus, Some(42), false).as_deref(), Some("/proc/42/root/run/dbus/system_bus_socket"));
        assert_eq!(reachable_bus_path("@abstract", Some(42), false).as_deref(), Some("@abstract"), "not a path");
        let long = format!("/{}", "x".repeat(100));
        assert_eq!(reachable_bus_path(&long, Some(42), false), None, "too long for sun_path");
        assert!(in_my_mount_ns(std::process::id()));
    }

    #[test]
    fn built_calls_parse_back() {
        let m = method_call(2, "GetConnectionUnixProcessID", Some(":1.7"));
        let parsed = header::parse(&m).unwrap();
        assert_eq!(parsed.kind, MessageKind::MethodCall);
        assert_eq!(parsed.serial, 2);
        assert_eq!(parsed.member.as_deref(), Some("GetConnectionUnixProcessID"));
        assert_eq!(parsed.destination.as_deref(), Some(BUS));
        assert_eq!(parsed.signature.as_deref(), Some("s"));
        let fixed = Fixed::parse(&m).unwrap();
        assert_eq!(fixed.message_len(), m.len());
        assert_eq!(&m[fixed.header_len()..fixed.header_len() + 4], &4u32.to_le_bytes());
    }

    #[test]
    fn a_missing_bus_is_not_a_pid() {
        let o = owner_of(Path::new("/nonexistent/bus"), ":1.1", Duration::from_millis(100));
        assert!(matches!(o, Owner::Unknown(_)), "{o:?}");
    }
}
