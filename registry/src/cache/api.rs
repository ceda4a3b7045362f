//! The Distribution API of a cache: manifests, blobs and bulk chunk reads from the cache (filled
//! from the upstream), vial's other read extensions passed to the upstream, writes refused.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use vial_core::{Digest, RepoName, Target};

use super::flight::Failure;
use super::{read_stored, Cache, Claim, Via};
use crate::error::{ApiError, ErrorCode};
use crate::http::{set_header, Request};
use crate::route::Endpoint;
use crate::state::Entrance;
use crate::storage::ByteStream;

/// Shared state of a cache's handlers: the entrance's part and the cache. No store: a cache
/// keeps what it holds in its own directory.
#[derive(Debug)]
pub(crate) struct CacheState {
    pub(crate) entrance: Entrance,
    pub(crate) cache: Arc<Cache>,
}

/// The tier behind the entrance in a cache.
impl crate::v2::Tier for CacheState {
    fn entrance(&self) -> &Entrance {
        &self.entrance
    }

    async fn handle(
        state: Arc<CacheState>,
        endpoint: Endpoint,
        req: Request,
        body: Body,
    ) -> Result<Response, ApiError> {
        handle(&state.cache, endpoint, &req, body).await
    }
}

async fn handle(
    cache: &Arc<Cache>,
    endpoint: Endpoint,
    req: &Request,
    body: Body,
) -> Result<Response, ApiError> {
    let read = matches!(req.method, Method::GET | Method::HEAD);
    let hop = req.header(super::peers::HOP_HEADER);
    if hop == Some(cache.peers.instance.as_str()) {
        // Sent to ourselves as if to a peer: the sender learns it and asks the upstream.
        return Err(ApiError::new(
            StatusCode::LOOP_DETECTED,
            ErrorCode::Unsupported,
            "this is the replica the request came from",
        ));
    }
    let via = Via {
        authorization: req.header("authorization").map(str::to_owned),
        hop: hop.is_some(),
    };
    match endpoint {
        Endpoint::Base if read => Ok(StatusCode::OK.into_response()),
        Endpoint::Manifest(repo, target) if read => manifest(cache, &repo, &target, req).await,
        Endpoint::Blob(repo, digest) if read => blob(cache, &repo, &digest, req, &via).await,
        Endpoint::Chunks(repo) if req.method == Method::POST => {
            chunks(cache, &repo, body, &via).await
        }
        Endpoint::Catalog if read => forward(cache, "registry:catalog:*", req, body).await,
        Endpoint::TagsList(repo)
        | Endpoint::Referrers(repo, _)
        | Endpoint::Versions(repo)
        | Endpoint::TagHistory(repo, _)
        | Endpoint::TagWatch(repo, _)
        | Endpoint::Seal(repo, _)
        | Endpoint::Syncs(repo)
        | Endpoint::Sync(repo, _)
            if read =>
        {
            forward(cache, &format!("repository:{repo}:pull"), req, body).await
        }
        // A node's lease keeps the origin from collecting what it has mounted: the origin must
        // hear of it.
        Endpoint::Leases(repo, _) => {
            forward(cache, &format!("repository:{repo}:pull"), req, body).await
        }
        _ => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Unsupported,
            format!(
                "this registry is a read-only cache of {0}: push, tag, delete and sync at {0}",
                cache.upstream_url
            ),
        )),
    }
}

async fn manifest(
    cache: &Arc<Cache>,
    repo: &RepoName,
    target: &Target,
    req: &Request,
) -> Result<Response, ApiError> {
    let (bytes, media_type, digest) = cache.manifest(repo, target).await?;
    let length = bytes.len();
    let mut response = if req.method == Method::HEAD {
        StatusCode::OK.into_response()
    } else {
        (StatusCode::OK, bytes).into_response()
    };
    set_header(&mut response, "content-type", &media_type);
    set_header(&mut response, "content-length", &length.to_string());
    set_header(&mut response, "docker-content-digest", digest.as_str());
    set_header(&mut response, "etag", &format!("\"{digest}\""));
    Ok(response)
}

async fn blob(
    cache: &Arc<Cache>,
    repo: &RepoName,
    digest: &Digest,
    req: &Request,
    via: &Via,
) -> Result<Response, ApiError> {
    let size = cache
        .blob_size(repo, digest)
        .await?
        .ok_or_else(|| ApiError::blob_unknown(digest))?;
    let range = req.range(size)?;
    let (start, end) = range.map_or((0, size), |r| (r.start, r.end));
    let body = if req.method == Method::HEAD {
        Body::empty()
    } else {
        let claim = cache
            .claim(repo, vec![(digest.clone(), size)], via)
            .await?
            .pop()
            .ok_or_else(|| ApiError::internal("a claim went missing"))?;
        let stream = stream_of(claim, start, end)
            .await
            .map_err(|f| fill_error(cache, digest, &f))?;
        Body::from_stream(stream)
    };
    let status = if range.is_some() {
        StatusCode::PARTIAL_CONTENT
    } else {
        StatusCode::OK
    };
    let mut response = (status, body).into_response();
    set_header(&mut response, "content-length", &(end - start).to_string());
    set_header(&mut response, "content-type", "application/octet-stream");
    set_header(&mut response, "docker-content-digest", digest.as_str());
    set_header(&mut response, "accept-ranges", "bytes");
    set_header(&mut response, "etag", &format!("\"{digest}\""));
    if range.is_some() {
        set_header(
            &mut response,
            "content-range",
            &format!("bytes {start}-{}/{size}", end - 1),
        );
    }
    Ok(response)
}

/// The bytes `start..end` of a claimed blob; `Err` when its fill failed before it began.
async fn stream_of(claim: Claim, start: u64, end: u64) -> Result<ByteStream, Failure> {
    match claim {
        Claim::Stored(stored) => Ok(read_stored(stored.file, start, end.min(stored.size))),
        Claim::Follow(flight) => {
            flight.started().await?;
            Ok(flight.follow(start, end))
        }
    }
}

fn fill_error(cache: &Cache, digest: &Digest, f: &Failure) -> ApiError {
    if f.not_found {
        ApiError::blob_unknown(digest)
    } else {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            ErrorCode::Unavailable,
            format!(
                "the cache could not fetch {digest} from {}: {}",
                cache.upstream_url, f.message
            ),
        )
    }
}

/// `POST /v2/<name>/_vial/chunks`: many blobs end to end, the ones the cache lacks fetched from
/// the upstream in one bulk read.
async fn chunks(
    cache: &Arc<Cache>,
    repo: &RepoName,
    body: Body,
    via: &Via,
) -> Result<Response, ApiError> {
    #[derive(serde::Deserialize)]
    struct ReadRequest {
        digests: Vec<Digest>,
    }
    let bytes = crate::http::read_small_body(body, 1 << 20, "bulk read").await?;
    let request: ReadRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(
            ErrorCode::DigestInvalid,
            format!("expected {{\"digests\": [...]}} with valid digests: {e}"),
        )
    })?;
    let max = crate::http::MAX_PACK_CHUNKS;
    if request.digests.is_empty() || request.digests.len() > max {
        return Err(ApiError::bad_request(
            ErrorCode::SizeInvalid,
            format!("ask for 1 to {max} blobs at once"),
        ));
    }
    let mut wanted = Vec::with_capacity(request.digests.len());
    let mut missing = Vec::new();
    for digest in request.digests {
        match cache.blob_size(repo, &digest).await? {
            Some(size) => wanted.push((digest, size)),
            None => missing.push(digest),
        }
    }
    if !missing.is_empty() {
        return Err(ApiError::not_found(
            ErrorCode::BlobUnknown,
            format!("{} of the blobs asked for are not in {repo}", missing.len()),
        )
        .with_detail(serde_json::json!({ "missing": missing })));
    }
    let total: u64 = wanted.iter().map(|(_, s)| s).sum();
    if total > crate::http::MAX_PACK_BYTES {
        return Err(ApiError::bad_request(
            ErrorCode::SizeInvalid,
            format!(
                "a bulk read returns at most {} bytes",
                crate::http::MAX_PACK_BYTES
            ),
        ));
    }
    let sizes: Vec<u64> = wanted.iter().map(|(_, s)| *s).collect();
    let claims = cache.claim(repo, wanted, via).await?;
    let stream = futures_util::stream::iter(claims.into_iter().zip(sizes))
        .then(|(claim, size)| async move {
            match stream_of(claim, 0, size).await {
                Ok(s) => s,
                Err(f) => {
                    let e = std::io::Error::other(f.message.to_string());
                    Box::pin(futures_util::stream::once(async move { Err(e) })) as ByteStream
                }
            }
        })
        .flatten();
    let mut response = (StatusCode::OK, Body::from_stream(stream)).into_response();
    set_header(&mut response, "content-length", &total.to_string());
    set_header(&mut response, "content-type", "application/octet-stream");
    Ok(response)
}

/// Passes a request to the upstream with the cache's credentials and its answer back as is.
async fn forward(
    cache: &Cache,
    scope: &str,
    req: &Request,
    body: Body,
) -> Result<Response, ApiError> {
    let body = crate::http::read_small_body(body, 1 << 20, "request").await?;
    let method = reqwest::Method::from_bytes(req.method.as_str().as_bytes())
        .map_err(|e| ApiError::internal(e.to_string()))?;
    let upstream = cache
        .forward(
            method,
            &req.path_and_query,
            scope,
            req.header("content-type"),
            bytes::Bytes::from(body),
        )
        .await?;
    let status =
        StatusCode::from_u16(upstream.status().as_u16()).unwrap_or(StatusCode::BAD_GATEWAY);
    let headers: Vec<(&'static str, String)> = [
        "content-type",
        "content-length",
        "link",
        "docker-content-digest",
        "oci-filters-applied",
        "retry-after",
    ]
    .into_iter()
    .filter_map(|name| {
        let value = upstream.headers().get(name)?.to_str().ok()?;
        Some((name, value.to_owned()))
    })
    .collect();
    let stream = upstream
        .bytes_stream()
        .map(|b| b.map_err(std::io::Error::other));
    let mut response = (status, Body::from_stream(stream)).into_response();
    for (name, value) in headers {
        set_header(&mut response, name, &value);
    }
    Ok(response)
}
