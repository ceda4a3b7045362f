//! The vial registry: an OCI Distribution API v1.1 server.
//!
//! Start reading at [`serve`], which opens the configured backends and runs the HTTP server until a
//! shutdown signal; then `v2::enter`, which turns every `/v2/…` request into a typed
//! [`route::Endpoint`], authorizes it and hands it to the router behind it: the API (`api/`, one
//! handler module per resource, over `state::AppState`) or, in a cache, the cache tier
//! (`cache::api`, over its own `CacheState`, which opens no store). Storage sits behind the
//! [`storage::BlobStore`] and [`storage::MetadataStore`] traits.

mod api;
pub mod auth;
mod cache;
pub mod config;
pub mod error;
mod front;
mod http;
mod jobs;
mod listener;
mod metrics;
pub mod route;
mod seal;
pub mod service;
mod state;
pub mod storage;
pub mod sync;
mod ui;
mod v2;
mod watch;

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;

use cache::api::CacheState;
pub use config::{BlobBackend, Config, MetadataBackend};
use state::{AppState, Entrance};
use storage::{BlobStore, FsBlobStore, MetadataStore, S3BlobStore, SqlMetadataStore, StorageError};

/// Opens the backends named by the configuration. This is the one place that picks implementations.
pub async fn open_storage(
    config: &Config,
) -> Result<(Arc<dyn MetadataStore>, Arc<dyn BlobStore>), StorageError> {
    let meta: Arc<dyn MetadataStore> = match &config.metadata {
        MetadataBackend::Sqlite { path } => {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                tokio::fs::create_dir_all(dir)
                    .await
                    .map_err(|e| StorageError::io(dir, e))?;
            }
            Arc::new(
                SqlMetadataStore::open_sqlite(path)
                    .await?
                    .with_touch_slack(config.touch_slack()),
            )
        }
        MetadataBackend::Postgres { url } => Arc::new(
            SqlMetadataStore::open_postgres(url)
                .await?
                .with_touch_slack(config.touch_slack()),
        ),
    };
    let blobs: Arc<dyn BlobStore> = match &config.blobs {
        BlobBackend::Filesystem { root } => Arc::new(FsBlobStore::open(root).await?),
        BlobBackend::S3(location) => Arc::new(S3BlobStore::open(location).await?),
    };
    Ok((meta, blobs))
}

/// Builds the HTTP application of a registry that stores, over already-open storage.
pub fn app(
    config: Config,
    meta: Arc<dyn MetadataStore>,
    blobs: Arc<dyn BlobStore>,
) -> Result<(Router, Arc<AppState>), ServeError> {
    let config = Arc::new(config);
    let metrics = Arc::new(metrics::Metrics::default());
    let entrance = Entrance::new(Arc::clone(&config), Arc::clone(&metrics))?;
    let state = Arc::new(AppState {
        entrance,
        service: Arc::new(service::Service::new(config, metrics, meta, blobs)),
        tag_watch: std::sync::OnceLock::new(),
    });
    let router = entrance_routes::<AppState>()
        .route("/metrics", get(metrics_handler))
        .route("/readyz", get(ready_handler))
        .route("/", get(ui::root))
        .route("/ui", axum::routing::any(ui::handle))
        .route("/ui/", axum::routing::any(ui::handle))
        .route("/ui/{*page}", axum::routing::any(ui::handle))
        .fallback(v2::enter::<AppState>)
        .with_state(Arc::clone(&state));
    Ok((front::layers(router, &state.config.limits), state))
}

/// Builds the HTTP application of a cache of another registry (`--upstream`), over the cache
/// `serve` opened. It opens no store: what it holds lives in its cache directory.
fn cache_app(config: Config, cache: cache::Cache) -> Result<(Router, Arc<CacheState>), ServeError> {
    let config = Arc::new(config);
    let state = Arc::new(CacheState {
        entrance: Entrance::new(Arc::clone(&config), Arc::default())?,
        cache: Arc::new(cache),
    });
    let router = entrance_routes::<CacheState>()
        .route("/metrics", get(cache_metrics))
        .route("/readyz", get(|| async { "ready\n" }))
        .route("/_vial/cache/id", get(cache_id))
        .route("/", get(cache_root))
        .route("/ui", get(cache_root))
        .route("/ui/", get(cache_root))
        .route("/ui/{*page}", get(cache_root))
        .fallback(v2::enter::<CacheState>)
        .with_state(Arc::clone(&state));
    Ok((front::layers(router, &config.limits), state))
}

/// The routes every process answers the same way, whichever tier stands behind the entrance.
fn entrance_routes<T: v2::Tier>() -> Router<Arc<T>> {
    Router::new()
        .route("/token", get(v2::token::<T>).post(v2::token::<T>))
        .route("/healthz", get(|| async { "ok\n" }))
}

/// Runs the registry, or a cache when the configuration names an upstream, on `listener` until
/// `shutdown` completes, then finishes in-flight requests.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    if let Some(upstream) = &config.upstream {
        let cache = cache::Cache::open(upstream).map_err(ServeError::Cache)?;
        return serve_cache(config, cache, listener, shutdown).await;
    }
    let (meta, blobs) = open_storage(&config).await?;
    let (router, state) = app(config, meta, blobs)?;
    // An unreachable bucket or wrong credentials should be the first thing an operator reads, not
    // something to infer from failed pushes. The server serves meanwhile (the store may come
    // back); /readyz reports it until then.
    let probe = Arc::clone(&state);
    tokio::spawn(async move {
        if let Err(e) = probe.blobs.ping().await {
            tracing::warn!(blobs = ?probe.config.blobs, error = %vial_core::error_chain(&e), "blob store is not reachable yet");
        }
    });
    let janitor = tokio::spawn(service::upkeep::run(Arc::clone(&state.service)));
    let collector = (!state.config.gc_interval.is_zero())
        .then(|| tokio::spawn(service::gc::schedule(Arc::clone(&state.service))));
    // The job runner stops taking work as soon as shutdown begins and hands back the job it holds.
    let (stop_jobs, stopped) = tokio::sync::watch::channel(false);
    let runner = state
        .config
        .run_jobs
        .then(|| tokio::spawn(jobs::run(Arc::clone(&state.service), stopped)));
    let watching = Arc::clone(&state);
    let shutdown = async move {
        shutdown.await;
        let _ = stop_jobs.send(true);
        // Requests waiting on tags answer now instead of holding the shutdown for their wait.
        if let Some(watch) = watching.tag_watch.get() {
            watch.close();
        }
    };
    listen(&state.config, "registry", listener, router, shutdown).await?;
    janitor.abort();
    if let Some(collector) = collector {
        collector.abort();
    }
    if let Some(runner) = runner {
        if tokio::time::timeout(std::time::Duration::from_secs(10), runner)
            .await
            .is_err()
        {
            tracing::warn!("background job runner did not stop within 10 s");
        }
    }
    tracing::info!("registry stopped");
    Ok(())
}

/// A cache keeps nothing of its own in stores: nothing to sweep, collect or run.
async fn serve_cache(
    config: Config,
    cache: cache::Cache,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let (router, state) = cache_app(config, cache)?;
    let cache = &state.cache;
    tracing::info!(
        upstream = %cache.upstream_url,
        "serving as a read-through cache; the metadata and blob stores are not opened"
    );
    if !cache.peers.is_empty() {
        let cache = Arc::clone(cache);
        tokio::spawn(async move { cache.peers.find_myself().await });
    }
    listen(&state.entrance.config, "cache", listener, router, shutdown).await?;
    cache.close();
    tracing::info!("cache stopped");
    Ok(())
}

/// Serves `router` over plain TCP or TLS, as configured, until `shutdown` completes. `tier` says
/// in the log what listens: the registry or a cache.
async fn listen(
    config: &Config,
    tier: &str,
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
    let addr = listener.local_addr().map_err(ServeError::Listen)?;
    tracing::info!(%addr, "{tier} listening");
    let limits = &config.limits;
    match &config.tls {
        Some(files) => {
            let tls = listener::server_config(files).map_err(ServeError::Tls)?;
            let listener = listener::TlsListener::new(listener, tls).map_err(ServeError::Listen)?;
            tracing::info!(cert = %files.cert.display(), "serving HTTPS");
            front::serve(listener, router, limits, shutdown).await;
        }
        None => front::serve(listener::PlainListener(listener), router, limits, shutdown).await,
    }
    Ok(())
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not open storage")]
    Storage(#[from] StorageError),
    #[error("http server")]
    Listen(#[source] std::io::Error),
    #[error("authentication settings")]
    Auth(#[from] auth::AuthConfigError),
    #[error("TLS certificate or key")]
    Tls(#[source] std::io::Error),
    #[error("cache: {0}")]
    Cache(String),
}

async fn metrics_handler(State(state): State<Arc<AppState>>) -> Response {
    let uploads = state.upload_rows().count_uploads().await.ok();
    let mut text = state.metrics.render(uploads);
    let metadata = match state.config.metadata {
        MetadataBackend::Sqlite { .. } => "sqlite",
        MetadataBackend::Postgres { .. } => "postgres",
    };
    let blobs = match state.config.blobs {
        BlobBackend::Filesystem { .. } => "filesystem",
        BlobBackend::S3(_) => "s3",
    };
    backend_info(&mut text, &state.entrance, metadata, blobs);
    let packs = match state.pack_state().await {
        Ok(packs) => Some(packs),
        Err(e) => {
            tracing::debug!(error = %vial_core::error_chain(&e), "could not read the packs for /metrics");
            None
        }
    };
    state.gc_metrics.render(&mut text, packs);
    if let Some(watch) = state.tag_watch.get() {
        watch.render_metrics(&mut text);
    }
    state.blobs.render_metrics(&mut text);
    prometheus_text(text)
}

/// A cache's metrics: its requests and what it holds; it runs on no store.
async fn cache_metrics(State(state): State<Arc<CacheState>>) -> Response {
    let mut text = state.entrance.metrics.render(None);
    backend_info(&mut text, &state.entrance, "none", "none");
    state.cache.render_metrics(&mut text);
    prometheus_text(text)
}

fn backend_info(text: &mut String, entrance: &Entrance, metadata: &str, blobs: &str) {
    text.push_str("# HELP vial_backend_info The stores this process runs on (none in a cache).\n");
    text.push_str("# TYPE vial_backend_info gauge\n");
    text.push_str(&format!(
        "vial_backend_info{{metadata=\"{metadata}\",blobs=\"{blobs}\",auth=\"{}\",tls=\"{}\"}} 1\n",
        entrance.auth.is_some(),
        entrance.config.tls.is_some()
    ));
}

fn prometheus_text(text: String) -> Response {
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// A cache replica's instance id, by which it recognizes itself in its list of peers.
async fn cache_id(State(state): State<Arc<CacheState>>) -> String {
    state.cache.peers.instance.clone()
}

/// A cache has no web UI of its own: it says what it is and where its content comes from.
async fn cache_root(State(state): State<Arc<CacheState>>) -> String {
    format!(
        "vial: a read-through cache of {}. Its web UI is the upstream's; this server answers \
         the registry API under /v2/.\n",
        state.cache.upstream_url
    )
}

/// Ready when both stores answer: a load balancer stops sending requests to a replica that has lost
/// either.
async fn ready_handler(State(state): State<Arc<AppState>>) -> Response {
    let (meta, blobs) = state.service.ping().await;
    let mut problems = Vec::new();
    if let Err(e) = meta {
        tracing::warn!(error = %vial_core::error_chain(&e), "readiness: metadata store unreachable");
        problems.push("metadata store unreachable");
    }
    if let Err(e) = blobs {
        tracing::warn!(error = %vial_core::error_chain(&e), "readiness: blob store unreachable");
        problems.push("blob store unreachable");
    }
    if problems.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("{}\n", problems.join("\n")),
        )
            .into_response()
    }
}
