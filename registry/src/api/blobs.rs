//! Blob reads (GET, HEAD, with single byte ranges) and blob deletion.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use vial_core::{Digest, RepoName};

use super::{set_header, Request};
use crate::error::{ApiError, ErrorCode};
use crate::storage::ByteRange;
use crate::AppState;

/// How long a presigned blob URL stays valid: long enough for a slow download to start, short
/// enough that a leaked URL is soon useless.
const REDIRECT_TTL: std::time::Duration = std::time::Duration::from_secs(15 * 60);

pub(super) async fn get(
    state: &AppState,
    repo: &RepoName,
    digest: &Digest,
    req: &Request,
) -> Result<Response, ApiError> {
    let location = state
        .meta
        .blob_location(repo, digest)
        .await?
        .ok_or_else(|| ApiError::blob_unknown(digest))?;
    let size = location.size;
    let range = match req.header("range") {
        Some(h) => parse_range(h, size).map_err(|()| {
            ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                ErrorCode::RangeInvalid,
                format!("range {h:?} is not satisfiable for a blob of {size} bytes"),
            )
            .with_header("content-range", format!("bytes */{size}"))
        })?,
        None => None,
    };
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
        let Some(stream) =
            crate::storage::read_located(&*state.blobs, digest, &location, range).await?
        else {
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
    state: &AppState,
    repo: &RepoName,
    digest: &Digest,
) -> Result<Response, ApiError> {
    if state.meta.unlink_blob(repo, digest).await? {
        tracing::info!(%repo, %digest, "blob unlinked from repository");
        Ok(StatusCode::ACCEPTED.into_response())
    } else {
        Err(ApiError::blob_unknown(digest))
    }
}

/// Parses a `Range` header against a blob of `size` bytes.
///
/// `Ok(None)` means "serve the whole blob": RFC 9110 lets a server ignore a range it does not
/// understand or support (multiple ranges, other units). `Err` means the range is well formed but
/// unsatisfiable, which is a 416.
pub(crate) fn parse_range(header: &str, size: u64) -> Result<Option<ByteRange>, ()> {
    let Some(spec) = header.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((first, last)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let (first, last) = (first.trim(), last.trim());
    let range = if first.is_empty() {
        // Suffix range: the last N bytes.
        let Ok(n) = last.parse::<u64>() else {
            return Ok(None);
        };
        if n == 0 || size == 0 {
            return Err(());
        }
        ByteRange {
            start: size.saturating_sub(n),
            end: size,
        }
    } else {
        let Ok(start) = first.parse::<u64>() else {
            return Ok(None);
        };
        let end = if last.is_empty() {
            size
        } else {
            let Ok(last) = last.parse::<u64>() else {
                return Ok(None);
            };
            if last < start {
                return Ok(None);
            }
            last.saturating_add(1).min(size)
        };
        if start >= size {
            return Err(());
        }
        ByteRange { start, end }
    };
    Ok(Some(range))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(start: u64, end: u64) -> Result<Option<ByteRange>, ()> {
        Ok(Some(ByteRange { start, end }))
    }

    #[test]
    fn byte_ranges_of_every_form() {
        assert_eq!(parse_range("bytes=0-9", 100), r(0, 10));
        assert_eq!(parse_range("bytes=90-200", 100), r(90, 100));
        assert_eq!(parse_range("bytes=95-", 100), r(95, 100));
        assert_eq!(parse_range("bytes=-10", 100), r(90, 100));
        assert_eq!(parse_range("bytes=-1000", 100), r(0, 100));
    }

    #[test]
    fn unsatisfiable_ranges_are_errors() {
        assert_eq!(parse_range("bytes=100-", 100), Err(()));
        assert_eq!(parse_range("bytes=200-300", 100), Err(()));
        assert_eq!(parse_range("bytes=-0", 100), Err(()));
        assert_eq!(parse_range("bytes=0-0", 0), Err(()));
    }

    #[test]
    fn unsupported_range_forms_serve_the_whole_blob() {
        assert_eq!(parse_range("items=0-1", 100), Ok(None));
        assert_eq!(parse_range("bytes=0-1,5-6", 100), Ok(None));
        assert_eq!(parse_range("bytes=5-1", 100), Ok(None));
        assert_eq!(parse_range("bytes=x-1", 100), Ok(None));
    }
}
