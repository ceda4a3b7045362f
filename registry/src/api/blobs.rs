//! Blob reads (GET, HEAD, with single byte ranges) and blob deletion.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use vial_core::{Digest, RepoName};

use crate::error::ApiError;
use crate::http::{set_header, Request};
use crate::service::Service;

/// How long a presigned blob URL stays valid: long enough for a slow download to start, short
/// enough that a leaked URL is soon useless.
const REDIRECT_TTL: std::time::Duration = std::time::Duration::from_secs(15 * 60);

pub(super) async fn get(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    req: &Request,
) -> Result<Response, ApiError> {
    let location = state
        .blob_rows()
        .blob_location(repo, digest)
        .await?
        .ok_or_else(|| ApiError::blob_unknown(digest))?;
    let size = location.size;
    let range = req.range(size)?;
    let (status, length) = match range {
        Some(r) => (StatusCode::PARTIAL_CONTENT, r.len()),
        None => (StatusCode::OK, size),
    };
    // A chunk stored as a range of another blob is served through the registry: a presigned URL
    // would take the client's Range header relative to the wrong object.
    if state.config.redirect_blobs && req.method == Method::GET && location.source.is_none() {
        // The client fetches from the object store directly, sending its Range header there.
        if let Some(url) = state.blobs.presign_read(digest, REDIRECT_TTL).await? {
            let mut response = StatusCode::TEMPORARY_REDIRECT.into_response();
            set_header(&mut response, "location", &url);
            set_header(&mut response, "docker-content-digest", digest.as_str());
            set_header(&mut response, "content-length", "0");
            return Ok(response);
        }
    }
    let body = if req.method == Method::HEAD {
        Body::empty()
    } else {
        let Some(stream) = state.read_blob(repo, digest, &location, range).await? else {
            // The metadata says the blob is here but its bytes are gone: a storage fault, not a
            // client error. Say so loudly and answer as if it were unknown.
            tracing::error!(%repo, %digest, "blob is linked in metadata but missing from the blob store");
            return Err(ApiError::blob_unknown(digest));
        };
        let metrics = Arc::clone(&state.metrics);
        Body::from_stream(stream.inspect(move |chunk| {
            if let Ok(bytes) = chunk {
                metrics.add_bytes_out(bytes.len() as u64);
            }
        }))
    };
    let mut response = (status, body).into_response();
    set_header(&mut response, "content-length", &length.to_string());
    set_header(&mut response, "content-type", "application/octet-stream");
    set_header(&mut response, "docker-content-digest", digest.as_str());
    set_header(&mut response, "accept-ranges", "bytes");
    set_header(&mut response, "etag", &format!("\"{digest}\""));
    if let Some(r) = range {
        set_header(
            &mut response,
            "content-range",
            &format!("bytes {}-{}/{size}", r.start, r.end - 1),
        );
    }
    Ok(response)
}

pub(super) async fn delete(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
) -> Result<Response, ApiError> {
    if state.blob_rows().unlink_blob(repo, digest).await? {
        tracing::info!(%repo, %digest, "blob unlinked from repository");
        Ok(StatusCode::ACCEPTED.into_response())
    } else {
        Err(ApiError::blob_unknown(digest))
    }
}
