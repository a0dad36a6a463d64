//! Who owns a D-Bus name: asked of the bus daemon itself, on a connection of
//! plegwatch's own (`org.freedesktop.DBus.GetConnectionUnixProcessID`, with
//! zbus's `DBusProxy`).
//!
//! A call stuck on a bus socket is only waiting on the daemon as a relay; the
//! holder is the process that owns the call's destination. Every read has a
//! short timeout: when the daemon itself does not answer, that is the answer
//! (the daemon is the holder).

use std::{path::Path, time::Duration};

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

/// Asks the bus at `bus_path` which process owns `name`, waiting at most
/// `timeout` for the whole exchange (connect, auth, Hello, the call).
///
/// Blocking: call it off the scan loop (`sources::request_holders` does). It runs
/// zbus on a throwaway current-thread tokio runtime, so that the one deadline
/// also bounds the SASL handshake, which a frozen daemon never finishes.
pub fn owner_of(bus_path: &Path, name: &str, timeout: Duration) -> Owner {
    if tokio::runtime::Handle::try_current().is_ok() {
        // On a runtime's thread (the startup sweep runs on the main one), where a
        // runtime of our own may not block: the lookup goes to a thread of its own.
        return std::thread::scope(|s| {
            s.spawn(|| owner_of(bus_path, name, timeout))
                .join()
                .unwrap_or_else(|_| Owner::Unknown("the bus-owner lookup thread panicked".into()))
        });
    }
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return Owner::Unknown(format!("no runtime for the lookup: {e}")),
    };
    rt.block_on(async {
        match tokio::time::timeout(timeout, ask(bus_path, name)).await {
            Ok(Ok(pid)) => Owner::Pid(pid),
            Ok(Err(e)) => Owner::Unknown(e.to_string()),
            Err(_) => Owner::BusNotAnswering,
        }
    })
}

/// `org.freedesktop.DBus.GetConnectionUnixProcessID(name)` on a connection of our own.
async fn ask(bus_path: &Path, name: &str) -> zbus::Result<u32> {
    let stream = tokio::net::UnixStream::connect(bus_path).await?;
    // Connected without blocking (a full backlog waits here, under the deadline).
    let conn = zbus::connection::Builder::unix_stream(stream.into_std()?).build().await?;
    let bus = zbus::fdo::DBusProxy::new(&conn).await?;
    let name = zbus::names::BusName::try_from(name)?;
    Ok(bus.get_connection_unix_process_id(name).await?)
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
    fn a_missing_bus_is_not_a_pid() {
        let o = owner_of(Path::new("/nonexistent/bus"), ":1.1", Duration::from_millis(100));
        assert!(matches!(o, Owner::Unknown(_)), "{o:?}");
    }

    /// Asked from a runtime's own thread (the startup sweep's case), the lookup answers
    /// rather than panicking ("Cannot start a runtime from within a runtime").
    #[test]
    fn asked_from_inside_a_runtime_it_answers() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let o = rt.block_on(async { owner_of(Path::new("/nonexistent/bus"), ":1.1", Duration::from_millis(100)) });
        assert!(matches!(o, Owner::Unknown(_)), "{o:?}");
    }
}
