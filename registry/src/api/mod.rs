//! The Distribution API: one dispatcher that parses the path into an endpoint, then one handler
//! module per resource.

pub(crate) mod blobs;
mod listing;
mod manifests;
pub(crate) mod packs;
mod sessions;
mod sync;
mod uploads;
pub(crate) mod vial;

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};

pub use sessions::Sessions;

use crate::auth::{Action, Need};
use crate::error::{ApiError, ErrorCode};
use crate::route::{self, Endpoint};
use crate::storage::Presence;
use crate::{AppState, ClientAddr};

/// Everything a handler needs from the request, besides the endpoint.
#[derive(Debug)]
pub(crate) struct Request {
    pub method: Method,
    pub query: Query,
    pub headers: HeaderMap,
    /// Who is asking, once authorized (`None` with authentication off).
    pub subject: Option<String>,
    /// What a presence check may do for this caller, decided with its rights (see [`authorize`]).
    pub presence: Presence,
    /// The path and query as sent, for a cache passing the request on.
    pub path_and_query: String,
}

/// Decoded query parameters, keeping repeated keys (`?tag=a&tag=b`).
#[derive(Debug, Default)]
pub(crate) struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<&str>) -> Self {
        Query(
            raw.map(|q| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
                .unwrap_or_default(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    pub fn all<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

impl Request {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The declared body length, if the client sent a valid `Content-Length`.
    pub fn content_length(&self) -> Option<u64> {
        self.header("content-length")
            .and_then(|v| v.trim().parse().ok())
    }
}

/// The fallback handler: every `/v2/…` request comes through here, inside the span the front
/// door opened for it (`front::request_span`).
pub(crate) async fn dispatch(
    State(state): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
    method: Method,
    version: axum::http::Version,
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
            let response = match authorize(&state, &endpoint, &mut request) {
                Ok(()) => {
                    match upload_slot(&state, &endpoint, &request.method, sent_body, client) {
                        // Held until the handler has read the body and answered.
                        Ok(_slot) => handle(&state, endpoint, request, body)
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
    if sent_body && status.as_u16() >= 400 && version < axum::http::Version::HTTP_2 {
        // An error may answer before the body was read (a chunk out of order, a denied push).
        // The server then drops the connection; saying so keeps the client from sending its
        // next request down a connection that is about to close.
        response
            .headers_mut()
            .insert("connection", HeaderValue::from_static("close"));
    }
    state
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
    state: &AppState,
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
    state
        .upload_slots
        .take(client.0.ip(), state.config.limits.max_uploads_per_client)
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
fn authorize(state: &AppState, endpoint: &Endpoint, req: &mut Request) -> Result<(), ApiError> {
    let Some(auth) = &state.auth else {
        return Ok(());
    };
    let realm = token_realm(state, req.header("host"));
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
fn token_realm(state: &AppState, host: Option<&str>) -> String {
    if let Some(base) = &state.config.public_url {
        return format!("{base}/token");
    }
    let scheme = if state.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    let host = host
        .filter(|h| is_plain_authority(h))
        .unwrap_or("localhost");
    format!("{scheme}://{host}/token")
}

/// `host[:port]` with a DNS name, an IPv4 address or a bracketed IPv6 address: nothing that could
/// end a quoted string or start another parameter.
pub(crate) fn is_plain_authority(host: &str) -> bool {
    !host.is_empty()
        && host.len() <= 261
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b".-:[]_".contains(&b))
}

/// `GET /token` (HTTP Basic credentials, `?scope=` repeated) and `POST /token` (the OAuth2 password
/// grant): the token endpoint of the Docker token flow.
pub(crate) async fn token(
    State(state): State<Arc<AppState>>,
    axum::extract::ConnectInfo(peer): axum::extract::ConnectInfo<crate::ClientAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    let Some(auth) = &state.auth else {
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

async fn handle(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    req: Request,
    body: Body,
) -> Result<Response, ApiError> {
    if let Some(cache) = &state.cache {
        return crate::cache::api::handle(cache, endpoint, &req, body).await;
    }
    match (endpoint, req.method.clone()) {
        (Endpoint::Base, Method::GET | Method::HEAD) => Ok(StatusCode::OK.into_response()),
        (Endpoint::Catalog, Method::GET) => listing::catalog(state, &req).await,
        (Endpoint::Gc, Method::POST) => {
            may_collect(state, &req)?;
            let dry_run = matches!(req.query.get("dry-run"), Some("true" | "1"));
            vial::gc(state, dry_run, req.query.get("wait")).await
        }
        (Endpoint::GcJob(id), Method::GET) => {
            may_collect(state, &req)?;
            vial::gc_status(state, &id, req.query.get("wait")).await
        }
        (Endpoint::TagsList(repo), Method::GET) => listing::tags(state, &repo, &req).await,
        (Endpoint::Referrers(repo, digest), Method::GET) => {
            listing::referrers(state, &repo, &digest, &req).await
        }
        (Endpoint::Manifest(repo, target), Method::GET | Method::HEAD) => {
            manifests::get(state, &repo, &target, &req).await
        }
        (Endpoint::BadManifestReference(repo, reference), Method::GET | Method::HEAD) => {
            Err(ApiError::not_found(
                ErrorCode::ManifestUnknown,
                format!(
                    "{reference:?} is neither a tag nor a digest: it names no manifest in {repo}"
                ),
            ))
        }
        (Endpoint::BadManifestReference(_, reference), Method::PUT | Method::DELETE) => {
            Err(route::parse_target(&reference).err().unwrap_or_else(|| {
                ApiError::bad_request(ErrorCode::TagInvalid, "invalid reference")
            }))
        }
        (Endpoint::Manifest(repo, target), Method::PUT) => {
            manifests::put(state, &repo, &target, &req, body).await
        }
        (Endpoint::Manifest(repo, target), Method::DELETE) => {
            manifests::delete(state, &repo, &target, req.subject.as_deref()).await
        }
        (Endpoint::Blob(repo, digest), Method::GET | Method::HEAD) => {
            blobs::get(state, &repo, &digest, &req).await
        }
        (Endpoint::Blob(repo, digest), Method::DELETE) => {
            blobs::delete(state, &repo, &digest).await
        }
        (Endpoint::UploadStart(repo), Method::POST) => {
            uploads::start(state, &repo, &req, body).await
        }
        (Endpoint::Upload(repo, id), Method::GET) => uploads::status(state, &repo, &id).await,
        (Endpoint::Upload(repo, id), Method::PATCH) => {
            uploads::patch(state, &repo, &id, &req, body).await
        }
        (Endpoint::Upload(repo, id), Method::PUT) => {
            uploads::finish(state, &repo, &id, &req, body).await
        }
        (Endpoint::Upload(repo, id), Method::DELETE) => uploads::cancel(state, &repo, &id).await,
        (Endpoint::BlobsPresent(repo), Method::POST) => {
            vial::blobs_present(state, &repo, body, req.presence).await
        }
        (Endpoint::Packs(repo), Method::POST) => packs::upload(state, &repo, &req, body).await,
        (Endpoint::Chunks(repo), Method::POST) => packs::read(state, &repo, body).await,
        (Endpoint::Versions(repo), Method::GET) => {
            let deleted = matches!(req.query.get("deleted"), Some("true" | "1"));
            vial::versions(state, &repo, deleted).await
        }
        (Endpoint::Restore(repo, digest), Method::POST) => {
            let tags = matches!(req.query.get("tags"), Some("true" | "1"));
            vial::restore(state, &repo, &digest, tags).await
        }
        (Endpoint::TagHistory(repo, tag), Method::GET) => {
            vial::tag_history(state, &repo, &tag).await
        }
        (Endpoint::TagWatch(repo, tag), Method::GET | Method::HEAD) => {
            vial::tag_watch(state, &repo, &tag, &req).await
        }
        (Endpoint::Leases(repo, digest), Method::GET) => vial::leases(state, &repo, &digest).await,
        (Endpoint::Leases(repo, digest), Method::PUT | Method::DELETE) => {
            vial::lease_change(state, &repo, &digest, &req, body).await
        }
        (Endpoint::Seal(repo, digest), Method::POST) => {
            vial::seal_start(state, &repo, &digest).await
        }
        (Endpoint::Seal(repo, digest), Method::GET) => {
            vial::seal_status(state, &repo, &digest, req.query.get("wait")).await
        }
        (Endpoint::Syncs(repo), Method::POST) => {
            sync::sync_start(state, &repo, req.subject.as_deref(), body).await
        }
        (Endpoint::Syncs(repo), Method::GET) => sync::sync_list(state, &repo).await,
        (Endpoint::Sync(repo, id), Method::GET) => {
            sync::sync_status(state, &repo, &id, req.query.get("wait")).await
        }
        (Endpoint::Sync(repo, id), Method::DELETE) => {
            sync::sync_cancel(state, &repo, &id, req.subject.as_deref()).await
        }
        (endpoint, method) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Unsupported,
            format!(
                "{method} is not supported on the {} endpoint",
                endpoint.label()
            ),
        )),
    }
}

/// Garbage collection is for whoever may delete in every repository (anyone, without auth).
fn may_collect(state: &AppState, req: &Request) -> Result<(), ApiError> {
    if let (Some(auth), Some(subject)) = (&state.auth, &req.subject) {
        if !auth.may_delete_everything(subject) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::Denied,
                format!(
                    "{subject} may not run garbage collection: it needs delete on every repository"
                ),
            ));
        }
    }
    Ok(())
}

/// A JSON answer.
pub(crate) fn json(status: StatusCode, value: &impl serde::Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_default();
    let mut r = (status, body).into_response();
    set_header(&mut r, "content-type", "application/json");
    r
}

/// A listing (tags, catalog, referrers, vial's listings) as JSON of `content_type`: gzipped by
/// the front door for clients that accept it.
pub(crate) fn json_listing(value: &impl serde::Serialize, content_type: &str) -> Response {
    let mut r = json(StatusCode::OK, value);
    set_header(&mut r, "content-type", content_type);
    r.extensions_mut().insert(crate::front::Listing);
    r
}

/// Adds a header whose value we built ourselves; values that are not valid header text are skipped
/// rather than failing the response.
pub(crate) fn set_header(response: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        response.headers_mut().insert(name, v);
    }
}

pub(crate) fn append_header(response: &mut Response, name: &'static str, value: &str) {
    if let Ok(v) = HeaderValue::from_str(value) {
        response.headers_mut().append(name, v);
    }
}

#[cfg(test)]
fn _dispatch_is_send(
    state: State<Arc<AppState>>,
    c: ConnectInfo<ClientAddr>,
    m: Method,
    v: axum::http::Version,
    u: Uri,
    h: HeaderMap,
    b: Body,
) {
    fn is_send<T: Send>(_: T) {}
    is_send(dispatch(state, c, m, v, u, h, b));
}
