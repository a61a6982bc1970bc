//! The metrics endpoint: `/metrics`, `/healthz`, `/readyz`, served by hyper on tokio. It serves
//! what the daemon hands it, and knows neither the sinks nor the capture.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::convert::Infallible;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::watch;

pub struct ServerState {
    /// The Prometheus text exposition for `/metrics`.
    pub render_metrics: Box<dyn Fn() -> String + Send + Sync>,
    /// `/readyz`: `Ok` when ready, else why not (one line).
    pub readiness: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
}

fn text(status: StatusCode, content_type: &str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(hyper::header::CONTENT_TYPE, v);
    }
    r
}

fn route(req: &Request<Incoming>, state: &ServerState) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return text(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET only\n".into(),
        );
    }
    match req.uri().path() {
        "/metrics" => text(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            (state.render_metrics)(),
        ),
        "/healthz" => text(StatusCode::OK, "text/plain", "ok\n".into()),
        "/readyz" => match (state.readiness)() {
            Ok(()) => text(StatusCode::OK, "text/plain", "ready\n".into()),
            Err(why) => text(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                format!("not ready: {why}\n"),
            ),
        },
        _ => text(StatusCode::NOT_FOUND, "text/plain", "not found\n".into()),
    }
}

/// Serves until `shutdown` turns true.
pub async fn serve(
    listener: TcpListener,
    state: Arc<ServerState>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((stream, _)) = accepted else { continue };
                let state = state.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req: Request<Incoming>| {
                        let resp = route(&req, &state);
                        async move { Ok::<_, Infallible>(resp) }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
            _ = shutdown.changed() => break,
        }
    }
}
