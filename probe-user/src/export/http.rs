//! The daemon's HTTP endpoint (hyper 1, HTTP/1.1, on the tokio runtime):
//! - `GET /metrics`: the Prometheus text format (0.0.4), or OpenMetrics text when the
//!   scraper's `Accept` asks for it, as Prometheus does (content negotiation, as the
//!   Prometheus client libraries answer). The official `prometheus-client` crate encodes
//!   OpenMetrics only; [`classic`] rewrites its few differences (the counter's `_total`
//!   family name, no `# UNIT`, no `# EOF`) by hand: no maintained crate does that;
//! - `GET /healthz`: `200 ok` once the probes are attached, `503` before;
//! - `GET /incidents`: the open incidents as JSON (what `plegwatch check` reads): pod
//!   names, container ids, comms and paths, so **only on the local unix socket**
//!   ([`Scope::Local`], root's alone), never on the TCP port ([`Scope::Public`]), which
//!   serves what an exporter serves.
//!
//! Each connection is its own task; a scrape encodes the registry under its locks and
//! never waits on the scan loop. At most [`MAX_CONNECTIONS`] are served at once (more
//! are closed at once); a connection gets [`HEADER_TIMEOUT`] for each request's headers
//! and lives [`CONNECTION_LIFETIME`] at most, keep-alive included.

use crate::sinks::Exposition;
use http_body_util::Full;
use hyper::{body::Bytes, header, server::conn::http1, service::service_fn, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{convert::Infallible, path::Path, sync::Arc, time::Duration};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

/// Connections served at once, per listener.
pub const MAX_CONNECTIONS: usize = 32;
/// How long a request's headers may take to arrive.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// The longest a connection is kept, keep-alive included.
pub const CONNECTION_LIFETIME: Duration = Duration::from_secs(30);

/// What a listener serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The TCP port: `/metrics` and `/healthz`, as an exporter.
    Public,
    /// The unix socket (root's alone): everything, `/incidents` too.
    Local,
}

/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Whether a request's `Accept` asks for OpenMetrics text.
fn wants_openmetrics<B>(req: &Request<B>) -> bool {
    req.headers().get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).any(|v| {
        v.split(',').any(|t| t.trim().starts_with("application/openmetrics-text") && !t.contains("q=0,") && !t.trim_end().ends_with("q=0"))
    })
}

/// OpenMetrics text as the Prometheus text format: a counter's family is named with its
/// `_total` (the name its samples carry), `# UNIT` and `# EOF` lines go, other types stay.
pub fn classic(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for l in openmetrics.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name.to_string());
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for l in openmetrics.lines() {
        if l == "# EOF" || l.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# TYPE ", "# HELP "].into_iter().find_map(|p| l.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{p}{name}_total {tail}"));
                } else {
                    out.push_str(l);
                }
            }
            None => out.push_str(l),
        }
        out.push('\n');
    }
    out
}

/// Serves the TCP port until the task is aborted.
pub async fn serve(listener: TcpListener, exposition: Exposition) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, exposition.clone(), Scope::Public, &slots),
            Err(e) => accept_failed(e).await,
        }
    }
}

/// Serves the unix socket until the task is aborted.
pub async fn serve_local(listener: UnixListener, exposition: Exposition) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        match listener.accept().await {
            Ok((stream, _)) => spawn_connection(stream, exposition.clone(), Scope::Local, &slots),
            Err(e) => accept_failed(e).await,
        }
    }
}

/// Out of file descriptors and the like: back off rather than spin.
async fn accept_failed(e: std::io::Error) {
    tracing::warn!(error = %e, "HTTP endpoint: accept failed");
    tokio::time::sleep(Duration::from_millis(100)).await;
}

/// Serves one connection on a task of its own, if a slot is free (else closes it).
fn spawn_connection<S>(stream: S, exposition: Exposition, scope: Scope, slots: &Arc<Semaphore>)
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let Ok(slot) = slots.clone().try_acquire_owned() else {
        tracing::debug!("HTTP endpoint: {MAX_CONNECTIONS} connections open, one more closed");
        return;
    };
    tokio::spawn(async move {
        let _slot = slot;
        let service = service_fn(move |req| {
            let response = route_in(scope, &exposition, &req);
            async move { Ok::<_, Infallible>(response) }
        });
        let conn = http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .serve_connection(TokioIo::new(stream), service);
        match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
            Ok(Err(e)) => tracing::debug!(error = %e, "HTTP endpoint: connection ended with an error"),
            Err(_) => tracing::debug!("HTTP endpoint: connection closed after {CONNECTION_LIFETIME:?}"),
            Ok(Ok(())) => {}
        }
    });
}

/// Binds the local socket at `path`: its directory made root's alone (mode 0700), a
/// stale socket file replaced, the socket mode 0600. The error is one line.
pub fn bind_local(path: &Path) -> Result<UnixListener, String> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    let shown = path.display();
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).ok_or_else(|| format!("--socket {shown}: no directory"))?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("--socket {shown}: cannot create its directory: {e}"))?;
    if let Err(why) = super::check::trusted_dir(dir) {
        return Err(format!("--socket {shown}: {why}"));
    }
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => std::fs::remove_file(path).map_err(|e| format!("--socket {shown}: a stale socket: {e}"))?,
        Ok(_) => return Err(format!("--socket {shown}: something else than a socket is there")),
        Err(_) => {}
    }
    let listener = UnixListener::bind(path).map_err(|e| format!("--socket {shown}: cannot listen: {e}"))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(|e| format!("--socket {shown}: {e}"))?;
    Ok(listener)
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// The response to one request on the local socket.
pub fn route<B>(exposition: &Exposition, req: &Request<B>) -> Response<Full<Bytes>> {
    route_in(Scope::Local, exposition, req)
}

/// The response to one request on a listener of `scope`.
pub fn route_in<B>(scope: Scope, exposition: &Exposition, req: &Request<B>) -> Response<Full<Bytes>> {
    const TEXT: &str = "text/plain; charset=utf-8";
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, TEXT, "only GET\n".into());
    }
    match req.uri().path() {
        "/metrics" => match exposition.metrics() {
            Ok(text) if wants_openmetrics(req) => reply(StatusCode::OK, OPENMETRICS, text),
            Ok(text) => reply(StatusCode::OK, PROMETHEUS_TEXT, classic(&text)),
            Err(_) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, "encoding the metrics failed\n".into()),
        },
        "/healthz" => match exposition.ready() {
            true => reply(StatusCode::OK, TEXT, "ok\n".into()),
            false => reply(StatusCode::SERVICE_UNAVAILABLE, TEXT, "starting: probes not attached yet\n".into()),
        },
        "/incidents" if scope == Scope::Public => {
            reply(StatusCode::NOT_FOUND, TEXT, "/incidents is served on the daemon's local socket only (plegwatch check reads it)\n".into())
        }
        "/incidents" => match serde_json::to_string(&exposition.incidents()) {
            Ok(json) => reply(StatusCode::OK, "application/json", json),
            Err(e) => reply(StatusCode::INTERNAL_SERVER_ERROR, TEXT, format!("{e}\n")),
        },
        _ => reply(StatusCode::NOT_FOUND, TEXT, "not found: try /metrics, /healthz or /incidents\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{Event, Ready, Sink};

    fn get(path: &str) -> Request<()> {
        Request::builder().uri(path).body(()).unwrap()
    }

    #[test]
    fn routes() {
        let (mut sink, exp) = crate::sinks::metrics::metrics();
        assert_eq!(route(&exp, &get("/healthz")).status(), StatusCode::SERVICE_UNAVAILABLE);
        sink.emit(&Event::Ready(Ready::new(1, vec![], 1.0, 2.0, 3.0)));
        assert_eq!(route(&exp, &get("/healthz")).status(), StatusCode::OK);
        let m = route(&exp, &get("/metrics"));
        assert_eq!(m.status(), StatusCode::OK);
        assert_eq!(m.headers()[header::CONTENT_TYPE], PROMETHEUS_TEXT, "no Accept: the classic text format");
        // Prometheus' own Accept header.
        let asks = |accept: &str| Request::builder().uri("/metrics").header(header::ACCEPT, accept).body(()).unwrap();
        let prom = "application/openmetrics-text;version=1.0.0;escaping=allow-utf-8;q=0.6,application/openmetrics-text;version=0.0.1;q=0.5,text/plain;version=1.0.0;escaping=allow-utf-8;q=0.4,text/plain;version=0.0.4;q=0.3,*/*;q=0.2";
        assert_eq!(route(&exp, &asks(prom)).headers()[header::CONTENT_TYPE], OPENMETRICS);
        assert_eq!(route(&exp, &asks("text/plain")).headers()[header::CONTENT_TYPE], PROMETHEUS_TEXT);
        assert_eq!(route(&exp, &get("/incidents")).status(), StatusCode::OK);
        assert_eq!(route(&exp, &get("/nope")).status(), StatusCode::NOT_FOUND);
        let post = Request::builder().method(Method::POST).uri("/metrics").body(()).unwrap();
        assert_eq!(route(&exp, &post).status(), StatusCode::METHOD_NOT_ALLOWED);
    }

    #[test]
    fn openmetrics_becomes_the_classic_text_format() {
        let om = "# HELP plegwatch_incidents Incidents raised.\n# TYPE plegwatch_incidents counter\nplegwatch_incidents_total 3\n\
                  # HELP plegwatch_rss_bytes Resident memory.\n# TYPE plegwatch_rss_bytes gauge\n# UNIT plegwatch_rss_bytes bytes\nplegwatch_rss_bytes 5\n# EOF\n";
        assert_eq!(
            classic(om),
            "# HELP plegwatch_incidents_total Incidents raised.\n# TYPE plegwatch_incidents_total counter\nplegwatch_incidents_total 3\n\
             # HELP plegwatch_rss_bytes Resident memory.\n# TYPE plegwatch_rss_bytes gauge\nplegwatch_rss_bytes 5\n"
        );
    }

    /// The daemon's real exposition, as classic text, passes `promtool check metrics`
    /// (when promtool is installed: `cargo xtask setup` installs Debian's prometheus).
    #[test]
    fn promtool_accepts_the_classic_text() {
        let (mut sink, exp) = crate::sinks::metrics::metrics();
        sink.emit(&Event::Ready(Ready::new(1, vec![], 1.0, 2.0, 3.0)));
        let body = classic(&exp.metrics().unwrap());
        let Ok(mut child) = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
        else {
            assert!(std::env::var_os("CI").is_none(), "CI: promtool is missing (`cargo xtask setup` installs it)");
            return;
        };
        use std::io::Write as _;
        child.stdin.take().unwrap().write_all(body.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success() && !said.contains("error"), "promtool: {said}\n{body}");
    }

    fn ready_exposition() -> Exposition {
        let (mut sink, exp) = crate::sinks::metrics::metrics();
        sink.emit(&Event::Ready(Ready::new(1, vec![], 1.0, 2.0, 3.0)));
        exp
    }

    /// A raw `GET path` over TCP: the status code, or 0 when the connection closed.
    async fn tcp_get(addr: std::net::SocketAddr, path: &str) -> u16 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let _ = s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await;
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out)).await;
        String::from_utf8_lossy(&out).split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0)
    }

    /// /incidents on the local socket (what check reads), never on the TCP port.
    #[tokio::test]
    async fn incidents_are_served_on_the_local_socket_only() {
        let exp = ready_exposition();
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/plegwatch.sock");
        let local = tokio::spawn(serve_local(bind_local(&socket).unwrap(), exp.clone()));
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(socket.parent().unwrap()).unwrap().permissions().mode() & 0o777, 0o700);
        let doc = super::super::check::ask(&socket, Duration::from_secs(5)).await.unwrap();
        assert!(doc.ready && doc.incidents.is_empty(), "{doc:?}");
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let public = tokio::spawn(serve(listener, exp));
        assert_eq!(tcp_get(addr, "/incidents").await, 404);
        assert_eq!(tcp_get(addr, "/healthz").await, 200);
        assert_eq!(tcp_get(addr, "/metrics").await, 200);
        local.abort();
        public.abort();
    }

    /// Past MAX_CONNECTIONS open at once, a new connection is closed at once.
    #[tokio::test]
    async fn connections_beyond_the_cap_are_closed() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, ready_exposition()));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(tokio::net::TcpStream::connect(addr).await.unwrap());
        }
        // Once the server has taken them all (polled: a loaded machine is slow), one more
        // is closed unanswered.
        let until = |want: u16| async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            loop {
                if tcp_get(addr, "/healthz").await == want {
                    return true;
                }
                if tokio::time::Instant::now() > deadline {
                    return false;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        assert!(until(0).await, "served past the cap");
        drop(idle);
        assert!(until(200).await, "slots not given back");
        server.abort();
    }

    /// check trusts a socket only in a directory nobody else may write, and reads a
    /// bounded answer.
    #[tokio::test]
    async fn check_refuses_an_open_directory_and_an_endless_answer() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("run/plegwatch.sock");
        let local = tokio::spawn(serve_local(bind_local(&socket).unwrap(), ready_exposition()));
        std::fs::set_permissions(socket.parent().unwrap(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = super::super::check::ask(&socket, Duration::from_secs(5)).await.unwrap_err().to_string();
        assert!(e.contains("not trusted") && !e.contains('\n'), "{e}");
        local.abort();
        // A server (in a trusted directory) that answers 2 MiB.
        let socket = dir.path().join("big/plegwatch.sock");
        let listener = bind_local(&socket).unwrap();
        let big = tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            let (mut s, _) = listener.accept().await.unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).await;
            let body = vec![b' '; 2 << 20];
            let _ = s.write_all(format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len()).as_bytes()).await;
            let _ = s.write_all(&body).await;
        });
        let e = super::super::check::ask(&socket, Duration::from_secs(5)).await.unwrap_err().to_string();
        assert!(e.contains("at most") && !e.contains('\n'), "{e}");
        big.abort();
    }
}
