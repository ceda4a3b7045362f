//! The vial registry: an OCI Distribution API v1.1 server.
//!
//! Start reading at [`serve`], which opens the configured backends and runs the HTTP server until a
//! shutdown signal; then `v2::enter`, which turns every `/v2/…` request into a typed
//! [`route::Endpoint`], authorizes it and hands it to the API (`api::Api`, one handler module
//! per resource) or, in a cache, to the cache tier (`cache::api::Tier`). Storage sits behind the
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

pub use config::{BlobBackend, Config, MetadataBackend};
use state::AppState;
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

/// Builds the HTTP application over already-open storage.
pub fn app(
    config: Config,
    meta: Arc<dyn MetadataStore>,
    blobs: Arc<dyn BlobStore>,
) -> Result<(Router, Arc<AppState>), ServeError> {
    let auth = config.auth.clone().map(auth::Auth::load).transpose()?;
    let cache = config
        .upstream
        .as_ref()
        .map(|u| cache::Cache::open(u).map(Arc::new))
        .transpose()
        .map_err(ServeError::Cache)?;
    let state = Arc::new(AppState {
        service: Arc::new(service::Service::new(config, meta, blobs)),
        auth,
        upload_slots: Arc::default(),
        cache,
        tag_watch: std::sync::OnceLock::new(),
    });
    let router = Router::new()
        .route("/token", get(v2::token).post(v2::token))
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/_vial/cache/id", get(cache_id))
        .route("/readyz", get(ready_handler))
        .route("/", get(ui::root))
        .route("/ui", axum::routing::any(ui::handle))
        .route("/ui/", axum::routing::any(ui::handle))
        .route("/ui/{*page}", axum::routing::any(ui::handle));
    // A cache answers `/v2/…` from what it holds and its upstream; a registry from its stores.
    let router = if state.cache.is_some() {
        router.fallback(v2::enter::<cache::api::Tier>)
    } else {
        router.fallback(v2::enter::<api::Api>)
    }
    .with_state(Arc::clone(&state));
    let router = front::layers(router, &state.config.limits);
    Ok((router, state))
}

/// Runs the registry on `listener` until `shutdown` completes, then finishes in-flight requests.
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), ServeError> {
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
    // A cache keeps nothing of its own in the stores: nothing to sweep, collect or run.
    let caching = state.cache.is_some();
    if let Some(cache) = &state.cache {
        tracing::info!(upstream = %cache.upstream_url, "serving as a read-through cache");
        if !cache.peers.is_empty() {
            let cache = Arc::clone(cache);
            tokio::spawn(async move { cache.peers.find_myself().await });
        }
    }
    let janitor =
        (!caching).then(|| tokio::spawn(service::upkeep::run(Arc::clone(&state.service))));
    let collector = (!caching && !state.config.gc_interval.is_zero())
        .then(|| tokio::spawn(service::gc::schedule(Arc::clone(&state.service))));
    // The job runner stops taking work as soon as shutdown begins and hands back the job it holds.
    let (stop_jobs, stopped) = tokio::sync::watch::channel(false);
    let runner = (state.config.run_jobs && !caching)
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
    let addr = listener.local_addr().map_err(ServeError::Listen)?;
    tracing::info!(%addr, "registry listening");
    let limits = &state.config.limits;
    match &state.config.tls {
        Some(files) => {
            let config = listener::server_config(files).map_err(ServeError::Tls)?;
            let listener =
                listener::TlsListener::new(listener, config).map_err(ServeError::Listen)?;
            tracing::info!(cert = %files.cert.display(), "serving HTTPS");
            front::serve(listener, router, limits, shutdown).await;
        }
        None => front::serve(listener::PlainListener(listener), router, limits, shutdown).await,
    }
    if let Some(janitor) = janitor {
        janitor.abort();
    }
    if let Some(cache) = &state.cache {
        cache.close();
    }
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
    let uploads = state.meta.count_uploads().await.ok();
    let mut text = state.metrics.render(uploads);
    let metadata = match state.config.metadata {
        MetadataBackend::Sqlite { .. } => "sqlite",
        MetadataBackend::Postgres { .. } => "postgres",
    };
    let blobs = match state.config.blobs {
        BlobBackend::Filesystem { .. } => "filesystem",
        BlobBackend::S3(_) => "s3",
    };
    text.push_str("# HELP vial_backend_info The stores this registry runs on.\n");
    text.push_str("# TYPE vial_backend_info gauge\n");
    text.push_str(&format!(
        "vial_backend_info{{metadata=\"{metadata}\",blobs=\"{blobs}\",auth=\"{}\",tls=\"{}\"}} 1\n",
        state.auth.is_some(),
        state.config.tls.is_some()
    ));
    state.gc_metrics.render(&mut text);
    if let Some(cache) = &state.cache {
        cache.render_metrics(&mut text);
    }
    if let Some(watch) = state.tag_watch.get() {
        watch.render_metrics(&mut text);
    }
    state.blobs.render_metrics(&mut text);
    ([("content-type", "text/plain; version=0.0.4")], text).into_response()
}

/// A cache replica's instance id, by which it recognizes itself in its list of peers.
async fn cache_id(State(state): State<Arc<AppState>>) -> Response {
    match &state.cache {
        Some(cache) => cache.peers.instance.clone().into_response(),
        None => StatusCode::NOT_FOUND.into_response(),
    }
}

/// Ready when both stores answer: a load balancer stops sending requests to a replica that has lost
/// either.
async fn ready_handler(State(state): State<Arc<AppState>>) -> Response {
    let (meta, blobs) = tokio::join!(state.meta.ping(), state.blobs.ping());
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
