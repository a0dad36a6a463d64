//! `plegwatch check`: node-problem-detector's custom-plugin protocol, answered
//! by asking a running daemon's `/incidents` on its local unix socket.
//!
//! Only a daemon it can trust is asked: the socket's directory must belong to root (or
//! to the user running the check) and be writable by nobody else, and the process
//! that answers must run as root (or as that user: `SO_PEERCRED`). A TCP port could be
//! squatted by any local user while the daemon is down, and a replayed "all is well"
//! would hide a stall. The answer is read up to [`MAX_ANSWER`] bytes.
//!
//! Exit 0: no incident at the level asked (or worse); 1: one is; 2: it can't
//! tell (no daemon, or the daemon not ready): NPD's Unknown. One line on
//! stdout, naming the root.

use crate::levels::Level;
use crate::sinks::metrics::{IncidentView, IncidentsDoc};
use http_body_util::{BodyExt as _, Empty, Limited};
use hyper::{body::Bytes, Request, StatusCode};
use hyper_util::rt::TokioIo;
use std::{path::Path, time::Duration};

/// The most of an answer read: a node's open incidents take a few KiB.
pub const MAX_ANSWER: usize = 1 << 20;

/// Whether uid `uid` may own what check trusts: root, or the user running it.
fn trusted_uid(uid: u32) -> bool {
    uid == 0 || uid == rustix::process::geteuid().as_raw()
}

/// Why `dir` cannot hold a socket this user may trust, if it cannot.
pub fn trusted_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    if !m.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if !trusted_uid(m.uid()) {
        return Err(format!("{} belongs to uid {}, not root: not trusted", dir.display(), m.uid()));
    }
    if m.mode() & 0o022 != 0 {
        return Err(format!("{} is writable by group or others (mode {:04o}): not trusted", dir.display(), m.mode() & 0o7777));
    }
    Ok(())
}

/// NPD's custom-plugin exit codes.
pub const OK: i32 = 0;
pub const PROBLEM: i32 = 1;
pub const UNKNOWN: i32 = 2;

/// Why the daemon could not be asked.
#[derive(Debug)]
pub enum AskError {
    /// Nothing listens there (connection refused): no daemon runs.
    NoDaemon(String),
    /// Something listens but did not answer as the daemon (or in time).
    Other(String),
}

impl AskError {
    pub fn is_no_daemon(&self) -> bool {
        matches!(self, AskError::NoDaemon(_))
    }
}

impl std::fmt::Display for AskError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AskError::NoDaemon(s) | AskError::Other(s) => f.write_str(s),
        }
    }
}

/// Asks the daemon on the unix socket `socket` for its open incidents, within `timeout`.
pub async fn ask(socket: &Path, timeout: Duration) -> Result<IncidentsDoc, AskError> {
    let shown = socket.display();
    tokio::time::timeout(timeout, ask_now(socket)).await.map_err(|_| AskError::Other(format!("no answer on {shown} within {timeout:?}")))?
}

async fn ask_now(socket: &Path) -> Result<IncidentsDoc, AskError> {
    let shown = socket.display();
    let dir = socket.parent().unwrap_or(Path::new("/"));
    if !dir.exists() || !socket.exists() {
        return Err(AskError::NoDaemon(format!("no daemon at {shown} (no such socket)")));
    }
    trusted_dir(dir).map_err(|why| AskError::Other(format!("{shown}: {why}")))?;
    let stream = tokio::net::UnixStream::connect(socket).await.map_err(|e| {
        let line = format!("no daemon at {shown}: {e}");
        match e.kind() {
            std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::NotFound => AskError::NoDaemon(line),
            _ => AskError::Other(line),
        }
    })?;
    let peer = stream.peer_cred().map_err(|e| AskError::Other(format!("{shown}: who answers: {e}")))?;
    if !trusted_uid(peer.uid()) {
        return Err(AskError::Other(format!("{shown}: answered by uid {}, not root: not trusted", peer.uid())));
    }
    ask_on(&shown.to_string(), stream).await.map_err(AskError::Other)
}

async fn ask_on(shown: &str, stream: tokio::net::UnixStream) -> Result<IncidentsDoc, String> {
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await.map_err(|e| format!("{shown}: {e}"))?;
    let driver = tokio::spawn(conn);
    let req = Request::get("/incidents").header(hyper::header::HOST, "localhost").body(Empty::<Bytes>::new()).map_err(|e| e.to_string())?;
    let res = send.send_request(req).await.map_err(|e| format!("{shown} /incidents: {e}"))?;
    let status = res.status();
    let body = Limited::new(res.into_body(), MAX_ANSWER)
        .collect()
        .await
        .map_err(|e| format!("{shown} /incidents: {e} (at most {MAX_ANSWER} bytes read)"))?
        .to_bytes();
    driver.abort();
    if status != StatusCode::OK {
        return Err(format!("{shown} /incidents answered {status}"));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{shown} /incidents: not plegwatch's answer: {e}"))
}

fn level_of(v: &IncidentView) -> Option<Level> {
    match v.level.as_str() {
        "warn" => Some(Level::Warn),
        "critical" => Some(Level::Critical),
        "imminent" => Some(Level::Imminent),
        _ => None,
    }
}

/// The exit code and the line for what the daemon said (or why it could not be asked):
/// one line, whatever the answer held (a control character in a root's path or comm is
/// shown as `\xNN`, so node-problem-detector's message stays one line).
pub fn verdict(answer: Result<IncidentsDoc, String>, at: Level) -> (i32, String) {
    let (code, line) = verdict_raw(answer, at);
    (code, crate::sinks::escape::text(&line).into_owned())
}

fn verdict_raw(answer: Result<IncidentsDoc, String>, at: Level) -> (i32, String) {
    let doc = match answer {
        Ok(doc) => doc,
        Err(e) => return (UNKNOWN, format!("cannot tell: {e}")),
    };
    if !doc.ready {
        return (UNKNOWN, "cannot tell: the plegwatch daemon is starting (probes not attached yet)".into());
    }
    let worst = doc
        .incidents
        .iter()
        .filter(|i| level_of(i).is_some_and(|l| l >= at))
        .max_by(|a, b| (level_of(a), a.budget_used).partial_cmp(&(level_of(b), b.budget_used)).unwrap_or(std::cmp::Ordering::Equal));
    match worst {
        Some(i) => (
            PROBLEM,
            format!(
                "PLEG stall {} (incident #{}, {:.0}% of the PLEG budget used, {:.0}s): root {}: {}",
                i.level,
                i.id,
                i.budget_used * 100.0,
                i.waited_s,
                i.root_kind,
                i.root
            ),
        ),
        None => {
            let below = doc.incidents.len();
            (OK, format!("no PLEG stall at {} or worse ({below} incident(s) below)", at.as_str()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(id: u64, level: &str, budget: f64) -> IncidentView {
        IncidentView {
            id,
            level: level.into(),
            root_kind: "umount".into(),
            root: "umount2 /mnt [umount pid=42]".into(),
            symptom: "relist".into(),
            budget_used: budget,
            waited_s: budget * 180.0,
            started_at: String::new(),
        }
    }

    #[test]
    fn exit_codes_follow_npd() {
        let doc = |v: Vec<IncidentView>| Ok(IncidentsDoc { ready: true, incidents: v });
        assert_eq!(verdict(doc(vec![]), Level::Critical).0, OK);
        assert_eq!(verdict(doc(vec![view(1, "warn", 0.1)]), Level::Critical).0, OK);
        let (code, line) = verdict(doc(vec![view(1, "warn", 0.1), view(2, "critical", 0.4), view(3, "imminent", 0.9)]), Level::Critical);
        assert_eq!(code, PROBLEM);
        assert!(line.contains("incident #3") && line.contains("umount2 /mnt") && line.contains("90%"), "{line}");
        assert!(!line.contains('\n'));
        assert_eq!(verdict(doc(vec![view(1, "warn", 0.1)]), Level::Warn).0, PROBLEM);
        assert_eq!(verdict(Err("no daemon at 127.0.0.1:9792: refused".into()), Level::Critical).0, UNKNOWN);
        assert_eq!(verdict(Ok(IncidentsDoc::default()), Level::Critical).0, UNKNOWN, "not ready");
        // A hostile comm in the root: still one line, no escape sequence.
        let mut hostile = view(4, "critical", 0.5);
        hostile.root = "umount2 /mnt [x\u{1b}]0;owned\u{7}\nOK pid=42]".into();
        let (_, line) = verdict(doc(vec![hostile]), Level::Critical);
        assert!(!line.contains('\n') && !line.contains('\u{1b}') && line.contains("x\\x1b]0;owned\\x07\\x0aOK"), "{line}");
    }
}
