//! The daemon's HTTP endpoint (hyper 1, HTTP/1.1, on the tokio runtime):
//! - `GET /metrics`: the Prometheus text format (0.0.4), or OpenMetrics text when the
//!   scraper's `Accept` asks for it, as Prometheus does (content negotiation, as the
//!   Prometheus client libraries answer). The official `prometheus-client` crate encodes
//!   OpenMetrics only; [`classic`] rewrites its few differences (the counter's `_total`
//!   family name, no `# UNIT`, no `# EOF`) by hand: no maintained crate does that;
//! - `GET /healthz`: `200 ok` once the probes are attached, `503` before;
//! - `GET /incidents`: the open incidents as JSON (what `plegwatch check` reads).
//!
//! Each connection is its own task; a scrape encodes the registry under its
//! locks and never waits on the scan loop.

use crate::sinks::Exposition;
use http_body_util::Full;
use hyper::{body::Bytes, header, server::conn::http1, service::service_fn, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{convert::Infallible, time::Duration};
use tokio::net::TcpListener;

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

/// Serves until the task is aborted.
pub async fn serve(listener: TcpListener, exposition: Exposition) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(e) => {
                // Out of file descriptors and the like: back off rather than spin.
                tracing::warn!(error = %e, "HTTP endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let exposition = exposition.clone();
        tokio::spawn(async move {
            let service = service_fn(move |req| {
                let response = route(&exposition, &req);
                async move { Ok::<_, Infallible>(response) }
            });
            let served = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                tracing::debug!(error = %e, "HTTP endpoint: connection ended with an error");
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = header::HeaderValue::from_str(content_type) {
        r.headers_mut().insert(header::CONTENT_TYPE, v);
    }
    r
}

/// The response to one request.
pub fn route<B>(exposition: &Exposition, req: &Request<B>) -> Response<Full<Bytes>> {
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
        sink.emit(&Event::Ready(Ready { pid: 1, probes: vec![], warn_s: 1.0, critical_s: 2.0, imminent_s: 3.0 }));
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
        sink.emit(&Event::Ready(Ready { pid: 1, probes: vec![], warn_s: 1.0, critical_s: 2.0, imminent_s: 3.0 }));
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

    #[tokio::test]
    async fn serves_over_tcp() {
        let (mut sink, exp) = crate::sinks::metrics::metrics();
        sink.emit(&Event::Ready(Ready { pid: 1, probes: vec![], warn_s: 1.0, critical_s: 2.0, imminent_s: 3.0 }));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(listener, exp));
        let doc = super::super::check::ask(addr, Duration::from_secs(5)).await.unwrap();
        assert!(doc.ready && doc.incidents.is_empty(), "{doc:?}");
        server.abort();
    }
}
