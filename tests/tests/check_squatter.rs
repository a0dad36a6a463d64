//! A port squatter cannot fool `plegwatch check`. With no daemon on the node, an
//! unprivileged process (`nobody`) listens on the daemon's old TCP port and on a unix
//! socket in a directory of its own, both answering `/incidents` as a healthy daemon
//! would ("ready, no incident"). NPD's check must still say it cannot tell (exit 2): it
//! reads only the daemon's local socket, in a directory root's alone, answered by root.
//! The squatter is asked first, to prove it answers.

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use plegwatch_scenarios::canary::{self, http_get};
use plegwatch_scenarios::child::{Options, Proc, Stderr};
use plegwatch_scenarios::preflight::{self, plegwatch_bin};

const PYTHON: &str = "/usr/bin/python3";

/// The healthy answer the squatter replays.
const HEALTHY: &str = r#"{"ready":true,"incidents":[]}"#;

/// nobody's server: the same answer on TCP (argv[1]: port) and on a unix socket (argv[2]).
const SQUATTER: &str = r#"
import http.server, socketserver, sys, threading, os
BODY = sys.argv[3].encode()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)
    def address_string(self):
        return "squatter"
    def log_message(self, *a):
        pass
class U(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    def get_request(self):
        s, _ = self.socket.accept()
        return s, ("squatter", 0)
tcp = http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H)
unix = U(sys.argv[2], H)
threading.Thread(target=unix.serve_forever, daemon=True).start()
print("ready", flush=True)
tcp.serve_forever()
"#;

fn check(args: &[&str]) -> anyhow::Result<(i32, String)> {
    let out = Command::new(plegwatch_bin()?).arg("check").args(args).output().context("run plegwatch check")?;
    Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).trim().to_string()))
}

#[test]
fn a_squatter_on_the_port_or_its_own_socket_is_not_believed() -> anyhow::Result<()> {
    preflight::require();
    // Debian's python3 (a per-user one, under /root, is closed to nobody).
    if canary::which("setpriv").is_none() || !std::path::Path::new(PYTHON).is_file() {
        preflight::skip("check_squatter", &format!("setpriv (util-linux) or {PYTHON} is missing"));
        return Ok(());
    }
    // nobody's own directory, where it may make a socket.
    let dir = tempfile::Builder::new().prefix("plegwatch-squat-").tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))?;
    std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534))?;
    let socket = dir.path().join("plegwatch.sock");
    let port = canary::free_port()?;
    let mut cmd = Command::new("setpriv");
    cmd.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", PYTHON, "-c", SQUATTER])
        .arg(port.to_string())
        .arg(&socket)
        .arg(HEALTHY)
        .stdout(Stdio::piped());
    let mut squatter = Proc::spawn_with("squatter", &mut cmd, Options { stderr: Stderr::Echo, ..Options::default() })?;
    let addr = format!("127.0.0.1:{port}").parse()?;
    let deadline = Instant::now() + plegwatch_scenarios::timing::scaled(Duration::from_secs(10));
    let answered = loop {
        if let Ok((200, body)) = http_get(addr, "/incidents") {
            break Some(body);
        }
        if Instant::now() > deadline || !squatter.running() {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let body = answered.context("the squatter never answered on its port")?;
    assert_eq!(body, HEALTHY, "the squatter's answer");
    assert!(socket.exists(), "the squatter's socket");

    // The daemon's socket: none here (no daemon runs during the scenarios).
    let none = tempfile::tempdir()?;
    let daemon_socket = none.path().join("plegwatch.sock");
    let (code, line) = check(&["--socket", daemon_socket.to_str().unwrap_or("?"), "--timeout", "2s"])?;
    eprintln!("no daemon, a squatter on port {port}: exit {code}: {line}");
    assert_eq!(code, 2, "no daemon: NPD's Unknown, whatever listens on a port; said {line:?}");
    // Pointed at the squatter's own socket: not trusted.
    let (code, line) = check(&["--socket", socket.to_str().unwrap_or("?"), "--timeout", "2s"])?;
    eprintln!("pointed at the squatter's socket: exit {code}: {line}");
    assert_eq!(code, 2, "a socket nobody made: NPD's Unknown; said {line:?}");
    assert!(line.contains("not trusted") && line.contains("65534"), "{line}");
    drop(squatter);
    Ok(())
}
