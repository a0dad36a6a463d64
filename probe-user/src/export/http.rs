//! The daemon's HTTP endpoint (hyper 1, HTTP/1.1, on the tokio runtime):
//! - `GET /metrics`: OpenMetrics text;
//! - `GET /healthz`: `200 ok` once the probes are attached, `503` before;
//! - `GET /incidents`: the open incidents as JSON (what `plegwatch check` reads).
//!
//! Each connection is its own task; a scrape encodes the registry under its
//! locks and never waits on the scan loop.

use crate::sinks::Exposition;
use http_body_util::Full;
use hyper::{Method, Request, Response, StatusCode, body::Bytes, header, server::conn::http1, service::service_fn};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::{convert::Infallible, time::Duration};
use tokio::net::TcpListener;

/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

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
            Ok(text) => reply(StatusCode::OK, OPENMETRICS, text),
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
        assert_eq!(m.headers()[header::CONTENT_TYPE], OPENMETRICS);
        assert_eq!(route(&exp, &get("/incidents")).status(), StatusCode::OK);
        assert_eq!(route(&exp, &get("/nope")).status(), StatusCode::NOT_FOUND);
        let post = Request::builder().method(Method::POST).uri("/metrics").body(()).unwrap();
        assert_eq!(route(&exp, &post).status(), StatusCode::METHOD_NOT_ALLOWED);
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
