//! A small OCI Distribution API client with retries, token authentication and vial's extensions.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use reqwest::{Method, RequestBuilder, Response, StatusCode};
use serde::Deserialize;
use vial_core::{Algorithm, Digest, RepoName, Target};

mod blobs;
mod bulk;
mod extensions;
mod mirror;
mod runs;
mod watch;

pub use extensions::{
    GcJob, LeaseInfo, RestoreReport, SealStatus, SyncJob, SyncProgress, SyncRequest, TagEventInfo,
    VersionInfo,
};
pub use mirror::Mirror;
pub use runs::{plan_runs, Arrived, ChunkRun, RunSize, Verified};
pub use watch::TagState;

use crate::auth::{self, Challenge, Credentials};
use crate::error::{ClientError, Expected};

/// Most digests one bulk existence check carries (the limit vial registries enforce).
pub(crate) const PRESENT_BATCH: usize = 4096;

/// How to reach a registry.
#[derive(Debug, Clone)]
pub struct RegistryOptions {
    /// Use `http://` instead of `https://`. Loopback hosts always use plain HTTP.
    pub plain_http: bool,
    /// Attempts for a request that fails transiently (connection refused, 5xx, 429).
    pub attempts: u32,
    /// Time limit for one request, body included.
    pub timeout: Duration,
    /// Explicit credentials; otherwise the Docker config file is read.
    pub credentials: Option<Credentials>,
    /// Caches to read through instead of the registry they mirror (`vial serve --upstream`).
    pub mirrors: Vec<Mirror>,
}

impl Default for RegistryOptions {
    fn default() -> Self {
        RegistryOptions {
            plain_http: false,
            attempts: 5,
            timeout: Duration::from_secs(300),
            credentials: None,
            mirrors: Vec::new(),
        }
    }
}

/// A manifest as fetched: its bytes, media type and digest (verified against the bytes).
#[derive(Debug, Clone)]
pub struct Manifest {
    pub bytes: Bytes,
    pub media_type: String,
    pub digest: Digest,
}

/// What is known of an optional extension of the registry.
const EXTENSION_UNKNOWN: u8 = 0;
const EXTENSION_YES: u8 = 1;
const EXTENSION_NO: u8 = 2;

const MONOLITHIC_UNKNOWN: u8 = 0;
const MONOLITHIC_YES: u8 = 1;
const MONOLITHIC_NO: u8 = 2;

/// A registry at `host[:port]`. Cheap to clone; clones share connections and tokens.
#[derive(Debug, Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    http: reqwest::Client,
    host: String,
    base: String,
    attempts: u32,
    credentials: Option<Credentials>,
    /// Bearer tokens by scope.
    tokens: Mutex<HashMap<String, String>>,
    /// Whether the registry has answered with a Basic challenge.
    basic: AtomicU8,
    /// Whether single-request (POST ?digest=) uploads work here.
    monolithic: AtomicU8,
    /// Whether the registry takes packs and bulk reads (vial's extensions), once known.
    packs: AtomicU8,
    bulk_reads: AtomicU8,
    /// The cache reads go to first, if one mirrors this registry.
    mirror: Option<Registry>,
    /// A mirror that failed is passed over until then.
    paused_until: Mutex<Option<std::time::Instant>>,
}

#[derive(Deserialize)]
struct ErrorEnvelope {
    errors: Vec<WireError>,
}

#[derive(Deserialize)]
struct WireError {
    code: String,
    #[serde(default)]
    message: String,
    #[serde(default)]
    detail: Option<serde_json::Value>,
}

fn is_loopback(host: &str) -> bool {
    let name = host.rsplit_once(':').map_or(host, |(h, _)| h);
    matches!(name, "localhost" | "127.0.0.1" | "[::1]" | "::1") || name.starts_with("127.")
}

/// How long an idle connection is kept for the next request.
pub const IDLE_CONNECTION: Duration = Duration::from_secs(20);

impl Registry {
    pub fn new(host: &str, options: &RegistryOptions) -> Result<Registry, ClientError> {
        let scheme = if options.plain_http || is_loopback(host) {
            "http"
        } else {
            "https"
        };
        let http = reqwest::Client::builder()
            .timeout(options.timeout)
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(64)
            // Idle connections are dropped before a server would close them (vial serve closes
            // one idle for its 30 s header timeout): a request sent on a connection the server
            // has just closed fails with a reset.
            .pool_idle_timeout(IDLE_CONNECTION)
            .user_agent(concat!("vial/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Invalid(format!("cannot build an HTTP client: {e}")))?;
        let credentials = match &options.credentials {
            Some(c) => Some(c.clone()),
            None => auth::credentials_for(host)?,
        };
        let mirror = match options.mirrors.iter().find(|m| m.origin == host) {
            Some(m) => {
                let (mirror_host, plain_http) = match m.url.split_once("://") {
                    Some(("http", h)) => (h, true),
                    Some((_, h)) => (h, false),
                    None => (m.url.as_str(), false),
                };
                Some(Registry::new(
                    mirror_host,
                    &RegistryOptions {
                        plain_http,
                        attempts: 1,
                        timeout: options.timeout,
                        credentials: None,
                        mirrors: Vec::new(),
                    },
                )?)
            }
            None => None,
        };
        Ok(Registry {
            inner: Arc::new(Inner {
                http,
                host: host.to_owned(),
                base: format!("{scheme}://{host}"),
                attempts: options.attempts.max(1),
                credentials,
                tokens: Mutex::new(HashMap::new()),
                basic: AtomicU8::new(0),
                monolithic: AtomicU8::new(MONOLITHIC_UNKNOWN),
                packs: AtomicU8::new(EXTENSION_UNKNOWN),
                bulk_reads: AtomicU8::new(EXTENSION_UNKNOWN),
                mirror,
                paused_until: Mutex::new(None),
            }),
        })
    }

    pub fn host(&self) -> &str {
        &self.inner.host
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.inner.base)
    }
    /// A Location header's URL, made absolute against the registry's base.
    fn absolute(&self, location: &str) -> String {
        if location.starts_with("http://") || location.starts_with("https://") {
            location.to_owned()
        } else {
            self.url(location)
        }
    }

    /// Sends a request built by `build`, authenticating on a challenge and retrying transient
    /// failures with exponential backoff. A read goes to the mirror first, if there is one, and
    /// to this registry when the mirror does not answer it.
    async fn send(
        &self,
        scope: &str,
        action: &str,
        build: impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, ClientError> {
        if let Some(mirror) = &self.inner.mirror {
            if let Some(r) = mirror.read_as_mirror(self, scope, &build).await {
                return Ok(r);
            }
        }
        let mut delay = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            let result = self.send_once(scope, &build).await;
            let retry = match &result {
                Ok(r) => {
                    r.status().is_server_error() || r.status() == StatusCode::TOO_MANY_REQUESTS
                }
                Err(e) => e.is_transient(),
            };
            if !retry || attempt >= self.inner.attempts {
                return result;
            }
            tracing::debug!(action, attempt, "transient registry failure, retrying");
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
            attempt += 1;
        }
    }

    async fn send_once(
        &self,
        scope: &str,
        build: &impl Fn(&reqwest::Client) -> RequestBuilder,
    ) -> Result<Response, ClientError> {
        let response = self
            .authorize(build(&self.inner.http), scope)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        if response.status() != StatusCode::UNAUTHORIZED {
            return Ok(response);
        }
        let challenge = response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok())
            .and_then(auth::parse_challenge);
        match challenge {
            Some(Challenge::Basic) if self.inner.credentials.is_some() => {
                self.inner.basic.store(1, Ordering::Relaxed);
            }
            Some(Challenge::Bearer {
                realm,
                service,
                scope: asked,
            }) => {
                // Ask for what this operation will need as well as what the registry asked for
                // (the request at hand may need less than the ones that follow: an existence
                // check before a push), so one token serves the whole operation.
                let mut scopes = vec![scope];
                if let Some(asked) = asked.as_deref().filter(|a| *a != scope) {
                    scopes.push(asked);
                }
                let token = self
                    .fetch_token(&realm, service.as_deref(), &scopes)
                    .await?;
                if let Ok(mut tokens) = self.inner.tokens.lock() {
                    tokens.insert(scope.to_owned(), token);
                }
            }
            _ => {
                return Err(ClientError::Unauthorized {
                    registry: self.inner.host.clone(),
                })
            }
        }
        let retried = self
            .authorize(build(&self.inner.http), scope)
            .send()
            .await
            .map_err(|e| self.transport(e))?;
        if retried.status() == StatusCode::UNAUTHORIZED {
            return Err(ClientError::Unauthorized {
                registry: self.inner.host.clone(),
            });
        }
        Ok(retried)
    }

    fn authorize(&self, request: RequestBuilder, scope: &str) -> RequestBuilder {
        let token = self
            .inner
            .tokens
            .lock()
            .ok()
            .and_then(|t| t.get(scope).cloned());
        if let Some(token) = token {
            return request.bearer_auth(token);
        }
        match &self.inner.credentials {
            Some(c) if self.inner.basic.load(Ordering::Relaxed) == 1 => {
                request.basic_auth(&c.username, Some(&c.password))
            }
            _ => request,
        }
    }

    async fn fetch_token(
        &self,
        realm: &str,
        service: Option<&str>,
        scopes: &[&str],
    ) -> Result<String, ClientError> {
        let mut request = self.inner.http.get(realm);
        for scope in scopes {
            request = request.query(&[("scope", scope)]);
        }
        if let Some(service) = service {
            request = request.query(&[("service", service)]);
        }
        if let Some(c) = &self.inner.credentials {
            request = request.basic_auth(&c.username, Some(&c.password));
        }
        let response = request.send().await.map_err(|e| self.transport(e))?;
        if !response.status().is_success() {
            return Err(match response.status() {
                StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => ClientError::Unauthorized {
                    registry: self.inner.host.clone(),
                },
                s => ClientError::Registry {
                    action: "token request".into(),
                    status: s.as_u16(),
                    code: String::new(),
                    message: String::new(),
                },
            });
        }
        #[derive(Deserialize)]
        struct TokenResponse {
            token: Option<String>,
            access_token: Option<String>,
        }
        let body: TokenResponse = response.json().await.map_err(|e| self.transport(e))?;
        body.token
            .or(body.access_token)
            .ok_or_else(|| self.broke("its token endpoint returned no token"))
    }

    /// An answer outside the protocol, `what` saying what it was.
    fn broke(&self, what: &str) -> ClientError {
        ClientError::Protocol {
            registry: self.inner.host.clone(),
            what: what.to_owned(),
        }
    }

    fn transport(&self, e: reqwest::Error) -> ClientError {
        ClientError::Unreachable {
            registry: self.inner.host.clone(),
            source: e,
        }
    }

    /// Turns a non-success response into an error, reading the OCI envelope if there is one.
    async fn error(&self, response: Response, action: &str) -> ClientError {
        let status = response.status();
        let body = response.bytes().await.unwrap_or_default();
        let first = serde_json::from_slice::<ErrorEnvelope>(&body)
            .ok()
            .and_then(|e| e.errors.into_iter().next());
        let (code, message, detail) = match first {
            Some(e) => (e.code, e.message, e.detail),
            None => (
                String::new(),
                String::from_utf8_lossy(&body).chars().take(200).collect(),
                None,
            ),
        };
        match status {
            StatusCode::UNAUTHORIZED => ClientError::Unauthorized {
                registry: self.inner.host.clone(),
            },
            StatusCode::FORBIDDEN => {
                let mut why = if message.is_empty() {
                    action.to_owned()
                } else {
                    message
                };
                if self.inner.credentials.is_none() {
                    why.push_str(&format!(
                        " (you are not logged in to {0}: run `vial login {0}`)",
                        self.inner.host
                    ));
                }
                ClientError::Denied(why)
            }
            StatusCode::NOT_FOUND if code == "NAME_UNKNOWN" => {
                ClientError::RepositoryNotFound(action.to_owned())
            }
            StatusCode::NOT_FOUND
                if detail
                    .as_ref()
                    .is_some_and(|d| d.get("restorable_until").is_some()) =>
            {
                let field = |name: &str| {
                    detail
                        .as_ref()
                        .and_then(|d| d.get(name))
                        .and_then(|v| v.as_str())
                        .unwrap_or_default()
                        .to_owned()
                };
                let version = Some(field("digest")).filter(|d| !d.is_empty());
                // A tag removed with its version: name the version, which `vial restore` takes.
                let what = match &version {
                    Some(v) if !action.contains(v.as_str()) => format!("{action}, version {v},"),
                    _ => action.to_owned(),
                };
                ClientError::Deleted {
                    what,
                    deleted_at: field("deleted_at"),
                    restorable_until: field("restorable_until"),
                    version,
                }
            }
            StatusCode::PRECONDITION_FAILED => ClientError::TagMoved {
                tag: action.to_owned(),
                current: detail
                    .and_then(|d| d.get("current").and_then(|c| c.as_str().map(str::to_owned)))
                    .unwrap_or_else(|| "nothing".to_owned()),
                expected: Expected::Unknown,
            },
            _ => ClientError::Registry {
                action: action.to_owned(),
                status: status.as_u16(),
                code,
                message,
            },
        }
    }

    fn scope(repo: &RepoName, push: bool) -> String {
        format!(
            "repository:{repo}:{}",
            if push { "pull,push" } else { "pull" }
        )
    }

    /// Checks that the registry speaks the Distribution API and that we may use it.
    pub async fn ping(&self) -> Result<(), ClientError> {
        let url = self.url("/v2/");
        let r = self
            .send("registry:catalog:*", "ping", |c| c.get(&url))
            .await?;
        if r.status().is_success() {
            Ok(())
        } else {
            Err(self.error(r, "ping").await)
        }
    }

    /// Fetches a manifest by tag or digest. `None` when it does not exist.
    pub async fn get_manifest(
        &self,
        repo: &RepoName,
        target: &Target,
    ) -> Result<Option<Manifest>, ClientError> {
        self.again_if_cut_off(|| self.get_manifest_once(repo, target))
            .await
    }

    async fn get_manifest_once(
        &self,
        repo: &RepoName,
        target: &Target,
    ) -> Result<Option<Manifest>, ClientError> {
        let reference = match target {
            Target::Tag(t) => t.to_string(),
            Target::Digest(d) => d.to_string(),
        };
        let url = self.url(&format!("/v2/{repo}/manifests/{reference}"));
        let accept = [
            vial_core::media::OCI_INDEX,
            vial_core::media::OCI_MANIFEST,
            vial_core::media::DOCKER_MANIFEST,
            vial_core::media::DOCKER_MANIFEST_LIST,
        ]
        .join(", ");
        let r = self
            .send(&Self::scope(repo, false), "manifest fetch", |c| {
                c.get(&url).header("accept", &accept)
            })
            .await?;
        match r.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => {
                let what = match target {
                    Target::Tag(t) => format!("{repo}:{t}"),
                    Target::Digest(d) => format!("{repo}@{d}"),
                };
                let err = self.error(r, &what).await;
                return match err {
                    ClientError::RepositoryNotFound(_) => {
                        Err(ClientError::RepositoryNotFound(repo.to_string()))
                    }
                    ClientError::Deleted { .. } => Err(err),
                    _ => Ok(None),
                };
            }
            _ => {
                return Err(self
                    .error(r, &format!("manifest {reference} of {repo}"))
                    .await)
            }
        }
        let media_type = r
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let header_digest = r
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .and_then(|d| Digest::parse(d).ok());
        let bytes = r.bytes().await.map_err(|e| self.transport(e))?;
        let algorithm = match target {
            Target::Digest(d) => d.algorithm(),
            Target::Tag(_) => header_digest
                .as_ref()
                .map_or(Algorithm::Sha256, Digest::algorithm),
        };
        let digest = algorithm.digest_bytes(&bytes);
        let expected = match target {
            Target::Digest(d) => Some(d.clone()),
            Target::Tag(_) => header_digest,
        };
        if let Some(expected) = expected {
            if expected != digest {
                return Err(ClientError::DigestMismatch {
                    what: format!("manifest {reference} of {repo}"),
                    expected,
                    actual: digest,
                });
            }
        }
        Ok(Some(Manifest {
            bytes,
            media_type,
            digest,
        }))
    }

    /// Pushes a manifest under a tag or its digest. `expect` makes a tag push conditional: `Some(None)`
    /// requires the tag not to exist, `Some(Some(d))` requires it to point at `d`.
    pub async fn put_manifest(
        &self,
        repo: &RepoName,
        reference: &str,
        media_type: &str,
        bytes: Bytes,
        expect: Option<Option<&Digest>>,
    ) -> Result<Digest, ClientError> {
        self.put_manifest_expiring(repo, reference, media_type, bytes, expect, None)
            .await
    }

    /// [`Registry::put_manifest`], with the tag it sets expiring at an RFC 3339 time (vial's
    /// `Vial-Tag-Expires` header; other registries ignore it).
    pub async fn put_manifest_expiring(
        &self,
        repo: &RepoName,
        reference: &str,
        media_type: &str,
        bytes: Bytes,
        expect: Option<Option<&Digest>>,
        expires_at: Option<&str>,
    ) -> Result<Digest, ClientError> {
        let url = self.url(&format!("/v2/{repo}/manifests/{reference}"));
        let action = format!("{repo}:{reference}");
        let r = self
            .send(&Self::scope(repo, true), &action, |c| {
                let mut req = c
                    .put(&url)
                    .header("content-type", media_type)
                    .body(bytes.clone());
                if let Some(at) = expires_at {
                    req = req.header("vial-tag-expires", at);
                }
                match expect {
                    None => req,
                    Some(None) => req.header("if-none-match", "*"),
                    Some(Some(d)) => req.header("if-match", format!("\"{d}\"")),
                }
            })
            .await?;
        if r.status() != StatusCode::CREATED {
            return Err(match self.error(r, reference).await {
                ClientError::TagMoved { tag, current, .. } => ClientError::TagMoved {
                    tag,
                    current,
                    expected: match expect {
                        Some(Some(d)) => Expected::At(d.to_string()),
                        _ => Expected::Absent,
                    },
                },
                e => e,
            });
        }
        Ok(Algorithm::Sha256.digest_bytes(&bytes))
    }

    /// Deletes a manifest by digest, or a tag. Returns whether it existed.
    pub async fn delete_manifest(
        &self,
        repo: &RepoName,
        reference: &str,
    ) -> Result<bool, ClientError> {
        let url = self.url(&format!("/v2/{repo}/manifests/{reference}"));
        let r = self
            .send(&Self::scope(repo, true), "delete", |c| c.delete(&url))
            .await?;
        match r.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.error(r, &format!("delete {repo}:{reference}")).await),
        }
    }

    /// Every tag of a repository, following pagination.
    pub async fn tags(&self, repo: &RepoName) -> Result<Vec<String>, ClientError> {
        #[derive(Deserialize)]
        struct TagList {
            #[serde(default)]
            tags: Option<Vec<String>>,
        }
        let mut out = Vec::new();
        let mut next = Some(format!("/v2/{repo}/tags/list?n=1000"));
        while let Some(path) = next.take() {
            let url = self.absolute(&path);
            let r = self
                .send(&Self::scope(repo, false), "tag list", |c| c.get(&url))
                .await?;
            if !r.status().is_success() {
                return Err(self.error(r, &repo.to_string()).await);
            }
            next = next_link(r.headers());
            let page: TagList = r.json().await.map_err(|e| self.transport(e))?;
            out.extend(page.tags.unwrap_or_default());
        }
        Ok(out)
    }

    /// Every repository the catalog lists, following pagination.
    pub async fn catalog(&self) -> Result<Vec<String>, ClientError> {
        #[derive(Deserialize)]
        struct Catalog {
            #[serde(default)]
            repositories: Vec<String>,
        }
        let mut out = Vec::new();
        let mut next = Some("/v2/_catalog?n=1000".to_owned());
        while let Some(path) = next.take() {
            let url = self.absolute(&path);
            let r = self
                .send("registry:catalog:*", "catalog", |c| c.get(&url))
                .await?;
            if !r.status().is_success() {
                return Err(self.error(r, "catalog").await);
            }
            next = next_link(r.headers());
            let page: Catalog = r.json().await.map_err(|e| self.transport(e))?;
            out.extend(page.repositories);
        }
        Ok(out)
    }

    /// Sends `method path_and_query` (below the registry's base URL) with this client's
    /// credentials for `scope`, retrying transient failures, and hands back the answer as it is,
    /// whatever its status: for a proxy that passes it on.
    pub async fn forward(
        &self,
        method: Method,
        path_and_query: &str,
        scope: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<Response, ClientError> {
        let url = self.url(path_and_query);
        self.send(scope, "forwarded request", |c| {
            let request = c.request(method.clone(), &url);
            let request = match content_type {
                Some(ct) => request.header("content-type", ct),
                None => request,
            };
            if body.is_empty() {
                request
            } else {
                request.body(body.clone())
            }
        })
        .await
    }

    /// A raw request for callers that need one (e.g. HEAD of a manifest by digest).
    pub async fn manifest_exists(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<bool, ClientError> {
        let url = self.url(&format!("/v2/{repo}/manifests/{digest}"));
        let r = self
            .send(&Self::scope(repo, false), "manifest check", |c| {
                c.request(Method::HEAD, &url)
            })
            .await?;
        match r.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.error(r, &format!("HEAD manifest {digest}")).await),
        }
    }
}

/// The `rel="next"` target of a `Link` header.
fn next_link(headers: &reqwest::header::HeaderMap) -> Option<String> {
    let link = headers.get("link")?.to_str().ok()?;
    let (target, params) = link.split_once(';')?;
    params.contains("rel=\"next\"").then(|| {
        target
            .trim()
            .trim_start_matches('<')
            .trim_end_matches('>')
            .to_owned()
    })
}
