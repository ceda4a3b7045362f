//! The HTTP front door: the connection loop and the tower layers every request passes before a
//! handler sees it.
//!
//! Outside in: `Connection: close` on an HTTP/1 answer given without reading the request's whole
//! body; a request id (`X-Request-Id`, made up when the client sent none, echoed on the response
//! and recorded in the request's span, so every log line of a request carries it);
//! `Authorization` and `Cookie` marked sensitive, so no log prints them; the request span;
//! panics caught and answered as a 500 in the OCI error envelope; gzip for JSON listings when
//! the client accepts it; and bounds on slow request bodies. The connection loop itself bounds
//! how long a client may take to send its request headers.

use std::collections::HashMap;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::http::{header, Request, Response, StatusCode};
use axum::response::IntoResponse;
use axum::Router;
use bytes::Bytes;
use http_body::{Body as HttpBody, Frame, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tower::ServiceExt;
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::compression::predicate::{Predicate, SizeAbove};
use tower_http::compression::CompressionLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::timeout::RequestBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

use crate::config::Limits;
use crate::error::{ApiError, ErrorCode};

/// The most a connection's read buffer grows to. Body frames are slices of it, so each frame a
/// slow consumer (a disk writer, a hasher) holds queued can keep up to this much alive.
const READ_BUFFER: usize = 128 << 10;

/// Wraps the application in the front door's layers.
pub(crate) fn layers(router: Router, limits: &Limits) -> Router {
    let min_rate = MinRateLayer {
        allowance: limits.body_idle_timeout,
        bytes_per_second: limits.min_body_rate,
    };
    // `Router::layer` wraps what is already there, so the last layer added is the outermost.
    router
        .layer(min_rate)
        .layer(RequestBodyTimeoutLayer::new(limits.body_idle_timeout))
        .layer(CompressionLayer::new().compress_when(ListingsOnly))
        .layer(CatchPanicLayer::custom(panic_response))
        .layer(
            // The span only: `v2::enter` logs each request's outcome with its endpoint.
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_request(())
                .on_response(())
                .on_failure(()),
        )
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetSensitiveRequestHeadersLayer::new([
            header::AUTHORIZATION,
            header::COOKIE,
            header::PROXY_AUTHORIZATION,
        ]))
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        // Outermost, to see the body as the connection gives it (the layers within may hide
        // that it is empty).
        .layer(axum::middleware::from_fn(close_if_body_unread))
}

/// One span per request, named for what every log line inside it needs: the request id, method
/// and path (never the query, which may carry a token's scope, nor the headers).
fn request_span(request: &Request<Body>) -> tracing::Span {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    tracing::info_span!("request", id, method = %request.method(), path = %request.uri().path())
}

/// A handler that panicked: a 500 in the OCI envelope, and the panic in the log.
fn panic_response(panic: Box<dyn std::any::Any + Send + 'static>) -> Response<Body> {
    let what = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())
        .unwrap_or("a panic without a message");
    tracing::error!(panic = what, "request handler panicked");
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        ErrorCode::Internal,
        "internal error",
    )
    .into_response()
}

/// Marks a response as a JSON listing, which the compression layer may gzip. Blobs and manifests
/// are never compressed: clients check their digests against the bytes as stored.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Listing;

#[derive(Debug, Clone, Copy)]
struct ListingsOnly;

impl Predicate for ListingsOnly {
    fn should_compress<B: HttpBody>(&self, response: &Response<B>) -> bool {
        response.extensions().get::<Listing>().is_some()
            && SizeAbove::new(256).should_compress(response)
    }
}

/// Cuts off a request body that arrives slower than the minimum rate: after an allowance, each
/// further second must bring `bytes_per_second` more (Apache's `mod_reqtimeout` rule). A body
/// that sends nothing at all is the idle timeout's to end.
#[derive(Debug, Clone, Copy)]
struct MinRateLayer {
    allowance: Duration,
    bytes_per_second: u64,
}

impl<S> tower::Layer<S> for MinRateLayer {
    type Service = MinRate<S>;

    fn layer(&self, inner: S) -> Self::Service {
        MinRate {
            inner,
            settings: *self,
        }
    }
}

#[derive(Debug, Clone)]
struct MinRate<S> {
    inner: S,
    settings: MinRateLayer,
}

impl<S, B> tower::Service<Request<B>> for MinRate<S>
where
    S: tower::Service<Request<MinRateBody<B>>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let settings = self.settings;
        self.inner.call(request.map(|body| MinRateBody {
            inner: body,
            started: tokio::time::Instant::now(),
            received: 0,
            settings,
            deadline: None,
        }))
    }
}

pin_project_lite::pin_project! {
    /// A request body held to a minimum rate (see [`MinRateLayer`]).
    struct MinRateBody<B> {
        #[pin]
        inner: B,
        started: tokio::time::Instant,
        received: u64,
        settings: MinRateLayer,
        // Armed while the body waits for data, at the moment it would fall below the rate.
        deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    }
}

/// The error a body that fell below the minimum rate ends with.
#[derive(Debug, thiserror::Error)]
#[error("request body arrived slower than {0} bytes per second; the request was cut off")]
pub(crate) struct TooSlow(u64);

impl<B> HttpBody for MinRateBody<B>
where
    B: HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        match this.inner.poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    *this.received += data.len() as u64;
                    *this.deadline = None;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => {
                let rate = this.settings.bytes_per_second;
                if rate == 0 {
                    return Poll::Pending;
                }
                let earned = Duration::from_secs_f64(*this.received as f64 / rate as f64);
                let at = *this.started + this.settings.allowance + earned;
                let sleep = this
                    .deadline
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Some(Err(Box::new(TooSlow(rate))))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// An HTTP/1 connection whose request body was left unread cannot carry another request: hyper
/// closes it after the answer. Saying so in the answer (`Connection: close`) keeps a client from
/// sending its next request down a connection that is about to go, which it would see as a
/// dropped request. Handlers answer a refused upload, a 401 or an endpoint that takes no body
/// without reading what was sent, and should.
async fn close_if_body_unread(
    request: Request<Body>,
    next: axum::middleware::Next,
) -> Response<Body> {
    let http1 = request.version() <= axum::http::Version::HTTP_11;
    // A request without a body has nothing left to read.
    let read = Arc::new(std::sync::atomic::AtomicBool::new(
        request.body().is_end_stream(),
    ));
    let request = request.map(|inner| {
        Body::new(ReadToEnd {
            inner,
            read: Arc::clone(&read),
        })
    });
    let mut response = next.run(request).await;
    if http1 && !read.load(std::sync::atomic::Ordering::Acquire) {
        response.headers_mut().insert(
            header::CONNECTION,
            header::HeaderValue::from_static("close"),
        );
    }
    response
}

pin_project_lite::pin_project! {
    /// A request body that notes when it has been read to its end (see [`close_if_body_unread`]).
    struct ReadToEnd {
        #[pin]
        inner: Body,
        read: Arc<std::sync::atomic::AtomicBool>,
    }
}

impl HttpBody for ReadToEnd {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let frame = this.inner.as_mut().poll_frame(cx);
        if matches!(frame, Poll::Ready(None)) || this.inner.is_end_stream() {
            this.read.store(true, std::sync::atomic::Ordering::Release);
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        let end = self.inner.is_end_stream();
        if end {
            self.read.store(true, std::sync::atomic::Ordering::Release);
        }
        end
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// How many upload requests each client address has in flight, against a cap.
#[derive(Debug, Default)]
pub(crate) struct UploadSlots {
    in_flight: Mutex<HashMap<IpAddr, usize>>,
}

/// One client's upload request in flight; its slot is given back when this drops.
#[derive(Debug)]
pub(crate) struct UploadSlot {
    slots: Arc<UploadSlots>,
    client: IpAddr,
}

impl UploadSlots {
    /// Takes a slot for `client`, or answers 429 when it already has `cap` (0: no cap).
    pub(crate) fn take(
        self: &Arc<Self>,
        client: IpAddr,
        cap: usize,
    ) -> Result<Option<UploadSlot>, ApiError> {
        if cap == 0 {
            return Ok(None);
        }
        let Ok(mut in_flight) = self.in_flight.lock() else {
            return Ok(None);
        };
        let n = in_flight.entry(client).or_default();
        if *n >= cap {
            tracing::warn!(%client, cap, "upload refused: too many uploads in flight from one client");
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::TooManyRequests,
                format!("this client has {cap} uploads in flight, the most allowed; retry when one ends"),
            )
            .with_header("retry-after", "1".into()));
        }
        *n += 1;
        Ok(Some(UploadSlot {
            slots: Arc::clone(self),
            client,
        }))
    }
}

impl Drop for UploadSlot {
    fn drop(&mut self) {
        if let Ok(mut in_flight) = self.slots.in_flight.lock() {
            if let Some(n) = in_flight.get_mut(&self.client) {
                *n -= 1;
                if *n == 0 {
                    in_flight.remove(&self.client);
                }
            }
        }
    }
}

/// The client's address, for handlers that need it (the token endpoint's failure counting).
#[derive(Debug, Clone, Copy)]
pub(crate) struct ClientAddr(pub std::net::SocketAddr);

/// Serves connections from `listener` until `shutdown` completes, then lets the requests in flight
/// finish. Each connection's requests carry the client's address ([`ClientAddr`]).
pub(crate) async fn serve<L>(
    mut listener: L,
    router: Router,
    limits: &Limits,
    shutdown: impl Future<Output = ()>,
) where
    L: axum::serve::Listener<Addr = SocketAddr>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(READ_BUFFER);
    builder.http2().timer(TokioTimer::new());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (io, peer) = tokio::select! {
            conn = listener.accept() => conn,
            () = &mut shutdown => break,
        };
        let service =
            router
                .clone()
                .map_request(move |mut request: Request<hyper::body::Incoming>| {
                    request
                        .extensions_mut()
                        .insert(ConnectInfo(ClientAddr(peer)));
                    request
                });
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(io), TowerToHyperService::new(service))
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    tracing::info!(
        connections = graceful.count(),
        "no longer accepting connections; finishing requests in flight"
    );
    graceful.shutdown().await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::get;

    #[tokio::test]
    async fn a_handler_that_panics_answers_500_in_the_oci_envelope() {
        let router: Router = Router::new().route(
            "/boom",
            get(|| async {
                if std::hint::black_box(true) {
                    panic!("deliberately");
                }
                "unreachable"
            }),
        );
        let app = layers(router, &Limits::default());
        let response = app
            .oneshot(Request::get("/boom").body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert!(response.headers().contains_key("x-request-id"));
        let body = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(json["errors"][0]["code"], "INTERNAL_ERROR");
        assert!(!String::from_utf8_lossy(&body).contains("deliberately"));
    }

    /// An answer given without reading the request's body closes the connection; one that read
    /// it, or had none to read, keeps it open.
    #[tokio::test]
    async fn an_answer_that_leaves_the_body_unread_closes_the_connection() {
        let router: Router = Router::new()
            .route("/ignore", axum::routing::post(|| async { "ignored" }))
            .route(
                "/read",
                axum::routing::post(|body: Bytes| async move { body.len().to_string() }),
            )
            .route("/get", get(|| async { "got" }));
        let app = layers(router, &Limits::default());
        let send = |method: &str, path: &str, body: Body| {
            let request = Request::builder()
                .method(method)
                .uri(path)
                .body(body)
                .unwrap();
            app.clone().oneshot(request)
        };
        let stream = || {
            Body::from_stream(futures_util::stream::iter(
                (0..4).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![7u8; 1000]))),
            ))
        };
        let closes = |r: &Response<Body>| {
            r.headers()
                .get(header::CONNECTION)
                .is_some_and(|v| v == "close")
        };
        let ignored = send("POST", "/ignore", stream()).await.unwrap();
        assert_eq!(ignored.status(), StatusCode::OK);
        assert!(closes(&ignored));
        let read = send("POST", "/read", stream()).await.unwrap();
        assert_eq!(read.status(), StatusCode::OK);
        assert!(!closes(&read));
        let got = send("GET", "/get", Body::empty()).await.unwrap();
        assert!(!closes(&got));
        let empty_post = send("POST", "/ignore", Body::empty()).await.unwrap();
        assert!(!closes(&empty_post));
    }
}
