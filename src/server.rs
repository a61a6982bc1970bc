//! The metrics endpoint: `/metrics`, `/healthz`, `/readyz`, served by hyper on tokio. It serves
//! what the daemon hands it, and knows neither the sinks nor the capture.

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};

pub struct ServerState {
    /// The Prometheus text exposition for `/metrics`.
    pub render_metrics: Box<dyn Fn() -> String + Send + Sync>,
    /// `/readyz`: `Ok` when ready, else why not (one line).
    pub readiness: Box<dyn Fn() -> Result<(), String> + Send + Sync>,
    /// Hears what the endpoint did to protect itself (for a counter).
    pub on_event: Box<dyn Fn(ServerEvent) + Send + Sync>,
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

/// How the endpoint protects itself from slow, idle and too many clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections served at once; a new one beyond it closes the connection idle the longest.
    pub max_connections: usize,
    /// Time allowed for a request head, counted from when the connection waits for one (so it
    /// also closes a connection that never sends, or idles between requests, this long).
    pub header_timeout: Duration,
    /// A connection without a byte read or written for this long is closed (a client that
    /// stops reading its response).
    pub idle_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> Self {
        ServerLimits {
            max_connections: 128,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
        }
    }
}

/// What the endpoint did to protect itself, for a counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerEvent {
    /// `accept` failed for lack of file descriptors (EMFILE/ENFILE): backed off, and closed
    /// the connection idle the longest to free one, if it had been idle for
    /// [`FD_LIMIT_MIN_IDLE`].
    FdLimit,
    /// `accept` failed otherwise (backed off briefly).
    AcceptError,
    /// The connection cap was reached: the connection idle the longest was closed.
    ConnectionLimit,
    /// A connection was closed by the header or idle timeout.
    Timeout,
}

impl ServerEvent {
    pub fn as_str(&self) -> &'static str {
        match self {
            ServerEvent::FdLimit => "fd_limit",
            ServerEvent::AcceptError => "accept_error",
            ServerEvent::ConnectionLimit => "connection_limit",
            ServerEvent::Timeout => "timeout",
        }
    }
}

/// Milliseconds since the server started, the clock of connection activity.
fn millis_since(start: Instant) -> u64 {
    u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// A stream that notes when it last moved a byte.
struct Tracked<S> {
    inner: S,
    start: Instant,
    last_activity: Arc<AtomicU64>,
}

impl<S> Tracked<S> {
    fn touch(&self) {
        self.last_activity
            .store(millis_since(self.start), Ordering::Relaxed);
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// The connections being served: their last activity, and how to close each.
#[derive(Default)]
struct Connections {
    next_id: u64,
    open: HashMap<u64, (Arc<AtomicU64>, Arc<Notify>)>,
}

/// At the descriptor limit only a connection idle this long is closed to free one. Linux fails
/// `accept` with EMFILE whenever no descriptor is free, even with nothing waiting to be
/// accepted: without this, the connection accepted with the last free descriptor, before it
/// sent its request, was the one closed.
const FD_LIMIT_MIN_IDLE: Duration = Duration::from_secs(1);

impl Connections {
    /// Closes the connection idle the longest; false when there is none.
    fn close_most_idle(&mut self) -> bool {
        self.close_idle_since(u64::MAX)
    }

    /// Closes the connection idle the longest if its last activity was at or before
    /// `before_ms`; false when there is none.
    fn close_idle_since(&mut self, before_ms: u64) -> bool {
        let Some(id) = self
            .open
            .iter()
            .map(|(id, (last, _))| (last.load(Ordering::Relaxed), *id))
            .filter(|(last, _)| *last <= before_ms)
            .min()
            .map(|(_, id)| id)
        else {
            return false;
        };
        if let Some((_, close)) = self.open.remove(&id) {
            close.notify_one();
        }
        true
    }
}

fn is_fd_limit(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(code) if code == nix::libc::EMFILE || code == nix::libc::ENFILE)
}

/// Serves until `shutdown` turns true. Never spins: a failing `accept` backs off (up to a
/// second) and, at the descriptor limit, frees one by closing the connection idle the longest
/// (if idle for [`FD_LIMIT_MIN_IDLE`]).
pub async fn serve(
    listener: TcpListener,
    state: Arc<ServerState>,
    limits: ServerLimits,
    mut shutdown: watch::Receiver<bool>,
) {
    let start = Instant::now();
    let connections = Arc::new(Mutex::new(Connections::default()));
    let max = limits.max_connections.max(1);
    let mut backoff = Duration::ZERO;
    loop {
        if !backoff.is_zero() {
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.changed() => break,
            }
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.changed() => break,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::ZERO;
                stream
            }
            Err(e) => {
                let fd_limit = is_fd_limit(&e);
                (state.on_event)(if fd_limit {
                    ServerEvent::FdLimit
                } else {
                    ServerEvent::AcceptError
                });
                let min_idle_ms = u64::try_from(FD_LIMIT_MIN_IDLE.as_millis()).unwrap_or(0);
                if fd_limit && let Some(before) = millis_since(start).checked_sub(min_idle_ms) {
                    let mut c = connections.lock().unwrap_or_else(|p| p.into_inner());
                    c.close_idle_since(before);
                }
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                tracing::debug!("metrics endpoint: accept failed: {e}; retrying in {backoff:?}");
                continue;
            }
        };
        let last_activity = Arc::new(AtomicU64::new(millis_since(start)));
        let close = Arc::new(Notify::new());
        let id = {
            let mut c = connections.lock().unwrap_or_else(|p| p.into_inner());
            while c.open.len() >= max && c.close_most_idle() {
                (state.on_event)(ServerEvent::ConnectionLimit);
            }
            let id = c.next_id;
            c.next_id += 1;
            c.open.insert(id, (last_activity.clone(), close.clone()));
            id
        };
        let state = state.clone();
        let connections = connections.clone();
        tokio::spawn(async move {
            let io = Tracked {
                inner: stream,
                start,
                last_activity: last_activity.clone(),
            };
            let service = service_fn({
                let state = state.clone();
                move |req: Request<Incoming>| {
                    let resp = route(&req, &state);
                    async move { Ok::<_, Infallible>(resp) }
                }
            });
            let conn = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_timeout)
                .serve_connection(TokioIo::new(io), service);
            tokio::pin!(conn);
            let idle_ms = u64::try_from(limits.idle_timeout.as_millis()).unwrap_or(u64::MAX);
            loop {
                let last = last_activity.load(Ordering::Relaxed);
                let idle_for = millis_since(start).saturating_sub(last);
                let check_in = Duration::from_millis(idle_ms.saturating_sub(idle_for).max(1));
                tokio::select! {
                    r = conn.as_mut() => {
                        if r.as_ref().is_err_and(|e| e.is_timeout()) {
                            (state.on_event)(ServerEvent::Timeout);
                        }
                        break;
                    }
                    _ = close.notified() => break,
                    _ = tokio::time::sleep(check_in) => {
                        let last = last_activity.load(Ordering::Relaxed);
                        if millis_since(start).saturating_sub(last) >= idle_ms {
                            (state.on_event)(ServerEvent::Timeout);
                            break;
                        }
                    }
                }
            }
            connections
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .open
                .remove(&id);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_activity(at_ms: &[u64]) -> (Connections, Vec<Arc<Notify>>) {
        let mut c = Connections::default();
        let mut closers = Vec::new();
        for (id, at) in at_ms.iter().enumerate() {
            let close = Arc::new(Notify::new());
            c.open
                .insert(id as u64, (Arc::new(AtomicU64::new(*at)), close.clone()));
            closers.push(close);
        }
        (c, closers)
    }

    #[test]
    fn at_the_descriptor_limit_only_a_connection_idle_long_enough_is_closed() {
        // Activity at 5 s and 9.5 s; now 10 s: only the first has been idle a second.
        let (mut c, _closers) = with_activity(&[5_000, 9_500]);
        assert!(c.close_idle_since(9_000));
        assert_eq!(c.open.keys().copied().collect::<Vec<_>>(), vec![1]);
        // The connection just accepted stays open, however full the table is.
        assert!(!c.close_idle_since(9_000));
        assert_eq!(c.open.len(), 1);
        // The connection cap closes the one idle the longest whatever its age.
        assert!(c.close_most_idle());
        assert!(c.open.is_empty());
        assert!(!c.close_most_idle());
    }
}
