//! The entrance to `/v2/…`, for the API and the cache tier alike: the path parsed into an
//! endpoint, the caller authorized, uploads capped per client, then the router's handler; the
//! outcome logged and counted. Also the token endpoint (`/token`) of the Docker token flow.

use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, Uri};
use axum::response::{IntoResponse, Response};

use crate::auth::{Action, Need};
use crate::error::{ApiError, ErrorCode};
use crate::front::ClientAddr;
use crate::http::{is_plain_authority, Query, Request};
use crate::route::{self, Endpoint};
use crate::state::Entrance;
use crate::storage::Presence;

/// A router behind the entrance, named by its state: the API of a registry that stores
/// ([`AppState`](crate::state::AppState)), or the cache tier. The registry installs `enter::<T>`
/// for one of them as its fallback.
pub(crate) trait Tier: Send + Sync + 'static {
    /// What the entrance needs of every router.
    fn entrance(&self) -> &Entrance;

    fn handle(
        state: Arc<Self>,
        endpoint: Endpoint,
        req: Request,
        body: Body,
    ) -> impl Future<Output = Result<Response, ApiError>> + Send;
}

/// Every `/v2/…` request comes through here, inside the span the front door opened for it
/// (`front::request_span`), and is answered by tier `T`.
pub(crate) async fn enter<T: Tier>(
    State(state): State<Arc<T>>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    let sent_body = headers
        .get("content-length")
        .is_some_and(|v| v.as_bytes() != b"0")
        || headers.contains_key("transfer-encoding");
    // Credentials were marked sensitive at the front door: they print as "Sensitive".
    tracing::trace!(?headers, "request headers");
    let (label, mut response) = match route::parse(uri.path()) {
        None => (
            "unknown",
            ApiError::not_found(
                ErrorCode::Unsupported,
                format!("no API endpoint at {}", uri.path()),
            )
            .into_response(),
        ),
        Some(Err(e)) => ("invalid", e.into_response()),
        Some(Ok(endpoint)) => {
            let label = endpoint.label();
            let mut request = Request {
                method: method.clone(),
                query: Query::parse(uri.query()),
                headers,
                subject: None,
                presence: Presence::LinkAcross,
                path_and_query: uri
                    .path_and_query()
                    .map_or_else(|| uri.path().to_owned(), |p| p.as_str().to_owned()),
            };
            let entrance = state.entrance();
            let response = match authorize(entrance, &endpoint, &mut request) {
                Ok(()) => {
                    match upload_slot(entrance, &endpoint, &request.method, sent_body, client) {
                        // Held until the handler has read the body and answered.
                        Ok(_slot) => T::handle(Arc::clone(&state), endpoint, request, body)
                            .await
                            .unwrap_or_else(IntoResponse::into_response),
                        Err(e) => e.into_response(),
                    }
                }
                Err(e) => e.into_response(),
            };
            (label, response)
        }
    };
    response.headers_mut().insert(
        "docker-distribution-api-version",
        HeaderValue::from_static("registry/2.0"),
    );
    let status = response.status();
    state
        .entrance()
        .metrics
        .record_request(label, method.as_str(), status.as_u16());
    let elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    if status.is_server_error() {
        tracing::warn!(status = status.as_u16(), elapsed_ms, "request failed");
    } else {
        tracing::debug!(status = status.as_u16(), elapsed_ms, "request done");
    }
    response
}

/// A slot for an upload request that sends data, under the per-client cap
/// (`Limits::max_uploads_per_client`); `None` for every other request.
fn upload_slot(
    entrance: &Entrance,
    endpoint: &Endpoint,
    method: &Method,
    sent_body: bool,
    client: ClientAddr,
) -> Result<Option<crate::front::UploadSlot>, ApiError> {
    let uploads = match endpoint {
        Endpoint::UploadStart(_) => sent_body,
        Endpoint::Packs(_) => true,
        Endpoint::Upload(..) => *method == Method::PATCH || *method == Method::PUT,
        _ => false,
    };
    if !uploads {
        return Ok(None);
    }
    entrance
        .upload_slots
        .take(client.0.ip(), entrance.config.limits.max_uploads_per_client)
}

/// What an endpoint needs from the caller's token.
fn need(endpoint: &Endpoint, method: &Method) -> Need {
    let repo = |r: &vial_core::RepoName, action| Need::Repository(r.to_string(), action);
    match endpoint {
        Endpoint::Base => Need::SignedIn,
        Endpoint::Catalog => Need::Catalog,
        Endpoint::Gc | Endpoint::GcJob(_) => Need::SignedIn,
        Endpoint::Manifest(r, _) | Endpoint::BadManifestReference(r, _) | Endpoint::Blob(r, _)
            if *method == Method::DELETE =>
        {
            repo(r, Action::Delete)
        }
        Endpoint::Manifest(r, _) | Endpoint::BadManifestReference(r, _)
            if *method == Method::PUT =>
        {
            repo(r, Action::Push)
        }
        Endpoint::UploadStart(r) | Endpoint::Upload(r, _) | Endpoint::Packs(r) => {
            repo(r, Action::Push)
        }
        Endpoint::Seal(r, _) if *method == Method::POST => repo(r, Action::Push),
        Endpoint::Syncs(r) if *method == Method::POST => repo(r, Action::Push),
        Endpoint::Sync(r, _) if *method == Method::DELETE => repo(r, Action::Push),
        Endpoint::Restore(r, _) => repo(r, Action::Delete),
        Endpoint::Manifest(r, _)
        | Endpoint::BadManifestReference(r, _)
        | Endpoint::Blob(r, _)
        | Endpoint::TagsList(r)
        | Endpoint::Referrers(r, _)
        | Endpoint::BlobsPresent(r)
        | Endpoint::Chunks(r)
        | Endpoint::Versions(r)
        | Endpoint::Seal(r, _)
        | Endpoint::Leases(r, _)
        | Endpoint::TagHistory(r, _)
        | Endpoint::TagWatch(r, _)
        | Endpoint::Syncs(r)
        | Endpoint::Sync(r, _) => repo(r, Action::Pull),
    }
}

/// Checks the caller's token when authentication is on. A cross-repository mount also needs pull
/// access to the source; without it the mount is dropped and the client gets an ordinary upload
/// session, as the spec allows, so no blob leaks between repositories.
fn authorize(entrance: &Entrance, endpoint: &Endpoint, req: &mut Request) -> Result<(), ApiError> {
    let Some(auth) = &entrance.auth else {
        return Ok(());
    };
    let realm = token_realm(entrance, req.header("host"));
    let authorization = req.header("authorization").map(str::to_owned);
    let identity = auth.authorize(
        authorization.as_deref(),
        &need(endpoint, &req.method),
        &realm,
    )?;
    // A presence check answers anyone who may pull, but changes something only for a caller who
    // may push here: keeping blobs from collection, or linking blobs from other repositories,
    // which is a bulk cross-repository mount and so needs pull rights on all of them.
    if let Endpoint::BlobsPresent(repo) = endpoint {
        let push = Need::Repository(repo.to_string(), Action::Push);
        req.presence = if auth
            .authorize(authorization.as_deref(), &push, &realm)
            .is_err()
        {
            Presence::Answer
        } else if auth.may_pull_everything(&identity.subject) {
            Presence::LinkAcross
        } else {
            Presence::Touch
        };
    }
    req.subject = Some(identity.subject);
    if let (Endpoint::UploadStart(_), Some(from)) = (endpoint, req.query.get("from")) {
        let source = Need::Repository(from.to_owned(), Action::Pull);
        if auth
            .authorize(authorization.as_deref(), &source, &realm)
            .is_err()
        {
            req.query.0.retain(|(k, _)| k != "mount" && k != "from");
        }
    }
    Ok(())
}

/// The token endpoint clients are sent to: under `public-url` when the operator set one, else
/// under the `Host` the client used, if that is a plain `host[:port]`. Anything else in `Host` is
/// a client's say, not an address, and never reaches the challenge header.
fn token_realm(entrance: &Entrance, host: Option<&str>) -> String {
    if let Some(base) = &entrance.config.public_url {
        return format!("{base}/token");
    }
    let scheme = if entrance.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let host = host
        .filter(|h| is_plain_authority(h))
        .unwrap_or("localhost");
    format!("{scheme}://{host}/token")
}

/// `GET /token` (HTTP Basic credentials, `?scope=` repeated) and `POST /token` (the OAuth2 password
/// grant): the token endpoint of the Docker token flow.
pub(crate) async fn token<T: Tier>(
    State(state): State<Arc<T>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<crate::front::ClientAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(auth) = &state.entrance().auth else {
        return ApiError::not_found(
            ErrorCode::Unsupported,
            "authentication is off: no token is needed",
        )
        .into_response();
    };
    let query = Query::parse(uri.query());
    let (credentials, scopes, service) = if method == Method::POST {
        let form = Query::parse(std::str::from_utf8(&body).ok());
        if form.get("grant_type") != Some("password") {
            return ApiError::bad_request(
                ErrorCode::Unsupported,
                "only grant_type=password is supported; or GET with HTTP Basic credentials",
            )
            .into_response();
        }
        let credentials = form
            .get("username")
            .zip(form.get("password"))
            .map(|(u, p)| (u.to_owned(), p.to_owned()));
        let scopes = form
            .get("scope")
            .map(|s| s.split(' ').map(str::to_owned).collect())
            .unwrap_or_default();
        (credentials, scopes, form.get("service").map(str::to_owned))
    } else {
        let credentials = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(basic_credentials);
        let scopes = query
            .all("scope")
            .flat_map(|s| s.split(' '))
            .map(str::to_owned)
            .collect();
        (credentials, scopes, query.get("service").map(str::to_owned))
    };
    if let Some(service) = service.filter(|s| s != auth.service()) {
        return ApiError::bad_request(
            ErrorCode::Denied,
            format!(
                "this registry issues tokens for service {:?}, not {service:?}",
                auth.service()
            ),
        )
        .into_response();
    }
    match auth.token(credentials, scopes, peer.0.ip()).await {
        Ok(json) => (
            [
                ("content-type", "application/json"),
                ("cache-control", "no-store"),
            ],
            json.to_string(),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// `Basic base64(user:password)`.
fn basic_credentials(header: &str) -> Option<(String, String)> {
    use base64::Engine;
    let encoded = header
        .strip_prefix("Basic ")
        .or_else(|| header.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_owned(), password.to_owned()))
}
