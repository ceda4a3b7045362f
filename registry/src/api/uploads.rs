//! Blob uploads: monolithic and chunked pushes, session status, cancel, and cross-repository mount.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use vial_core::{Algorithm, Digest, RepoName};

use super::bodies::{hash_stream, tee_body, HashPipe};
use crate::error::{ApiError, ErrorCode};
use crate::http::{set_header, Request};
use crate::route::parse_digest;
use crate::service::HashState;
use crate::service::Service;
use crate::storage::{StorageError, UploadSession, VerifyFuture};

/// `POST /v2/<name>/blobs/uploads/`: mount, monolithic upload, or a new session.
pub(super) async fn start(
    state: &Service,
    repo: &RepoName,
    req: &Request,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    if let Some(mount) = req.query.get("mount") {
        let digest = parse_digest(mount)?;
        if let Some(from) = req.query.get("from").and_then(|f| RepoName::parse(f).ok()) {
            if let Some(size) = state.blob_rows().mount_blob(&from, repo, &digest).await? {
                tracing::info!(%digest, %from, to = %repo, size, "blob mounted across repositories");
                return Ok(created_blob(repo, &digest));
            }
        }
        // The spec's fallback: no mount, but an ordinary session the client can upload into.
    }
    let algorithm = match req.query.get("digest-algorithm") {
        None => Algorithm::Sha256,
        Some(a) => a.parse().map_err(|_| {
            ApiError::bad_request(
                ErrorCode::Unsupported,
                format!("digest algorithm {a:?} is not supported; use sha256, sha512 or blake3"),
            )
        })?,
    };
    let monolithic = req.query.get("digest").map(parse_digest).transpose()?;
    if let Some(digest) = monolithic
        .as_ref()
        .filter(|_| state.blobs.prefers_whole_puts())
    {
        return match req.content_length().filter(|&l| l <= SMALL_PUT) {
            Some(len) => put_small(state, repo, digest, body, len).await,
            None => put_streaming(state, repo, digest, body, req.content_length()).await,
        };
    }

    let id = state
        .open_upload(
            repo,
            monolithic.as_ref().map_or(algorithm, Digest::algorithm),
        )
        .await?;

    match monolithic {
        Some(digest) => {
            let lock = state.sessions.get(&id);
            let mut hash = lock.lock().await;
            let declared = req.content_length();
            let result = async {
                append(state, &id, &mut hash, body, Some(0), declared).await?;
                commit(state, repo, &id, &mut hash, &digest).await
            }
            .await;
            if result.is_err() {
                // A monolithic upload is one request: nobody can resume it, so do not leave it behind.
                discard(state, &id).await;
            }
            result
        }
        None => Ok(session_response(
            StatusCode::ACCEPTED,
            repo,
            &id,
            0,
            Some(state.blobs.min_chunk_length()),
        )),
    }
}

/// On object stores, blobs up to this size sent in one request are received in memory, verified
/// and stored in one call, without an upload session: the common case of chunk pushes, where a
/// session would cost more object-store calls (and metadata writes) than the bytes themselves.
const SMALL_PUT: u64 = 16 * 1024 * 1024;

async fn put_small(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    body: axum::body::Body,
    len: u64,
) -> Result<Response, ApiError> {
    let bytes = receive_whole(state, Some(body), len).await?;
    let computed = hash_in_background(&bytes, digest.algorithm()).await?;
    if &computed != digest {
        return Err(digest_mismatch(digest, &computed));
    }
    store_verified(state, repo, digest, bytes).await
}

/// Writes a verified in-memory blob to the store and links it to `repo`.
async fn store_verified(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    bytes: bytes::Bytes,
) -> Result<Response, ApiError> {
    let size = bytes.len() as u64;
    state.put_blob(repo, digest, bytes).await?;
    Ok(committed(repo, digest, size))
}

/// The answer to a push that made a blob of `repo`: from here on it is visible.
fn committed(repo: &RepoName, digest: &Digest, size: u64) -> Response {
    tracing::info!(%repo, %digest, size, "blob committed");
    created_blob(repo, digest)
}

/// A blob of any size in one request, its digest known up front: streamed to the store, hashed
/// on the way, and published by the store only if the digest matched.
async fn put_streaming(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    body: axum::body::Body,
    declared: Option<u64>,
) -> Result<Response, ApiError> {
    let pipe = HashPipe::spawn(digest.algorithm().hasher());
    let stream = tee_body(body, Some(&pipe), declared, state.metrics.clone());
    let computed = std::sync::Arc::new(std::sync::Mutex::new(None));
    let (slot, expected) = (std::sync::Arc::clone(&computed), digest.clone());
    let verify: VerifyFuture = Box::pin(async move {
        let Some((hasher, _)) = pipe.finish().await else {
            return false;
        };
        let actual = hasher.finish();
        let ok = actual == expected;
        if let Ok(mut slot) = slot.lock() {
            *slot = Some(actual);
        }
        ok
    });
    match state.put_streamed_blob(repo, digest, stream, verify).await {
        Ok(Some(size)) => Ok(committed(repo, digest, size)),
        Ok(None) => {
            let actual = computed.lock().ok().and_then(|mut c| c.take());
            Err(match actual {
                Some(actual) => digest_mismatch(digest, &actual),
                None => ApiError::bad_request(
                    ErrorCode::DigestInvalid,
                    format!("uploaded content does not have digest {digest}"),
                ),
            })
        }
        Err(StorageError::BodyFailed(e)) => Err(ApiError::bad_request(
            ErrorCode::BlobUploadInvalid,
            format!("upload was not received whole, nothing of it was kept: {e}"),
        )),
        Err(e) => Err(e.into()),
    }
}

fn digest_mismatch(given: &Digest, computed: &Digest) -> ApiError {
    ApiError::bad_request(
        ErrorCode::DigestInvalid,
        format!("uploaded content has digest {computed}, not the {given} given"),
    )
    .with_detail(serde_json::json!({ "expected": given, "actual": computed }))
}

/// `GET /v2/<name>/blobs/uploads/<id>`: how much the session holds.
pub(super) async fn status(
    state: &Service,
    repo: &RepoName,
    id: &str,
) -> Result<Response, ApiError> {
    session(state, repo, id).await?;
    let size = state
        .blobs
        .upload_size(id)
        .await?
        .ok_or_else(|| ApiError::upload_unknown(id))?;
    Ok(session_response(
        StatusCode::NO_CONTENT,
        repo,
        id,
        size,
        None,
    ))
}

/// `PATCH /v2/<name>/blobs/uploads/<id>`: append one chunk, in order.
pub(super) async fn patch(
    state: &Service,
    repo: &RepoName,
    id: &str,
    req: &Request,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    session(state, repo, id).await?;
    let range = req
        .header("content-range")
        .map(parse_content_range)
        .transpose()?;
    let declared = declared_length(req, range)?;
    let lock = state.sessions.get(id);
    let mut hash = lock.lock().await;
    let size = append(state, id, &mut hash, body, range.map(|r| r.0), declared)
        .await
        .map_err(|e| with_session_headers(e, repo, id))?;
    state.upload_rows().touch_upload(id).await?;
    Ok(session_response(StatusCode::ACCEPTED, repo, id, size, None))
}

/// `PUT /v2/<name>/blobs/uploads/<id>?digest=`: optional last chunk, verify, publish.
pub(super) async fn finish(
    state: &Service,
    repo: &RepoName,
    id: &str,
    req: &Request,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let digest = req
        .query
        .get("digest")
        .ok_or_else(|| {
            ApiError::bad_request(
                ErrorCode::DigestInvalid,
                "the digest query parameter is required to finish an upload",
            )
        })
        .and_then(parse_digest)?;
    session(state, repo, id).await?;
    let range = req
        .header("content-range")
        .map(parse_content_range)
        .transpose()?;
    let declared = declared_length(req, range)?;
    let lock = state.sessions.get(id);
    let mut hash = lock.lock().await;
    let mut body = Some(body);
    let whole = declared.filter(|&l| l > 0 && l <= SMALL_PUT && state.blobs.prefers_whole_puts());
    if let Some(len) = whole {
        // POST then PUT with the whole blob, as most clients push: if the body alone has the
        // digest, it is the blob, whatever the session holds, so store it in one write. Otherwise
        // it is the last chunk of a longer upload and goes the ordinary way.
        let bytes = receive_whole(state, body.take(), len).await?;
        let computed = hash_in_background(&bytes, digest.algorithm()).await?;
        if computed == digest {
            let response = store_verified(state, repo, &digest, bytes).await?;
            discard(state, id).await;
            return Ok(response);
        }
        body = Some(axum::body::Body::from(bytes));
    }
    if whole.is_none()
        && declared != Some(0)
        && range.is_none_or(|(start, _)| start == 0)
        && state.blobs.prefers_whole_puts()
        && state.blobs.upload_size(id).await? == Some(0)
    {
        // A large blob in the PUT of an empty session: the body is the whole blob, streamed to
        // its place and published once verified, with no session data to copy.
        let body = body.take().unwrap_or_else(axum::body::Body::empty);
        let response = put_streaming(state, repo, &digest, body, declared).await?;
        discard(state, id).await;
        return Ok(response);
    }
    if declared != Some(0) {
        let body = body.unwrap_or_else(axum::body::Body::empty);
        append(state, id, &mut hash, body, range.map(|r| r.0), declared)
            .await
            .map_err(|e| with_session_headers(e, repo, id))?;
    }
    commit(state, repo, id, &mut hash, &digest).await
}

/// Reads a body of exactly `len` bytes into memory.
async fn receive_whole(
    state: &Service,
    body: Option<axum::body::Body>,
    len: u64,
) -> Result<bytes::Bytes, ApiError> {
    let body = body.unwrap_or_else(axum::body::Body::empty);
    let bytes = axum::body::to_bytes(body, len as usize + 1)
        .await
        .map_err(|e| {
            ApiError::bad_request(
                ErrorCode::BlobUploadInvalid,
                format!("upload was not received whole, nothing of it was kept: {e}"),
            )
        })?;
    state.metrics.add_bytes_in(bytes.len() as u64);
    if bytes.len() as u64 != len {
        return Err(ApiError::bad_request(
            ErrorCode::SizeInvalid,
            format!("body has {} bytes but Content-Length is {len}", bytes.len()),
        ));
    }
    Ok(bytes)
}

/// Hashes in-memory bytes off the executor.
async fn hash_in_background(
    bytes: &bytes::Bytes,
    algorithm: Algorithm,
) -> Result<Digest, ApiError> {
    let bytes = bytes.clone();
    tokio::task::spawn_blocking(move || algorithm.digest_bytes(&bytes))
        .await
        .map_err(|e| ApiError::from(StorageError::io("hash", std::io::Error::other(e))))
}

/// `DELETE /v2/<name>/blobs/uploads/<id>`: abandon the session and its bytes.
pub(super) async fn cancel(
    state: &Service,
    repo: &RepoName,
    id: &str,
) -> Result<Response, ApiError> {
    session(state, repo, id).await?;
    let lock = state.sessions.get(id);
    let _held = lock.lock().await;
    state.discard_upload(id).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn session(state: &Service, repo: &RepoName, id: &str) -> Result<UploadSession, ApiError> {
    if uuid::Uuid::parse_str(id).is_err() {
        return Err(ApiError::upload_unknown(id));
    }
    state
        .upload_rows()
        .get_upload(repo, id)
        .await?
        .ok_or_else(|| ApiError::upload_unknown(id))
}

/// Appends a body at `start` (the session's current size if not given) and keeps the running digest
/// only if it saw exactly the bytes that were stored.
async fn append(
    state: &Service,
    id: &str,
    hash: &mut HashState,
    body: axum::body::Body,
    start: Option<u64>,
    declared_len: Option<u64>,
) -> Result<u64, ApiError> {
    let current = state
        .blobs
        .upload_size(id)
        .await?
        .ok_or_else(|| ApiError::upload_unknown(id))?;
    if let Some(start) = start {
        if start != current {
            // A small chunk is read and dropped before the refusal, so the client, still sending
            // it, reads the 416 instead of a reset connection; a large one is cut short.
            if declared_len.is_some_and(|n| n <= DRAIN_LIMIT) {
                let mut stream = body.into_data_stream();
                while let Some(Ok(_)) = futures_util::StreamExt::next(&mut stream).await {}
            }
            return Err(out_of_order(current, start));
        }
    }
    let pipe = match hash.hasher.take() {
        Some(h) if hash.offset == current => Some(HashPipe::spawn(h)),
        _ => None,
    };
    let stream = tee_body(body, pipe.as_ref(), declared_len, state.metrics.clone());
    let result = state.blobs.append_upload(id, current, stream).await;
    let hashed = match pipe {
        Some(p) => p.finish().await,
        None => None,
    };
    match result {
        Ok(size) => {
            match hashed {
                Some((h, n)) if n == size - current => {
                    hash.hasher = Some(h);
                    hash.offset = size;
                }
                _ => hash.hasher = None,
            }
            Ok(size)
        }
        Err(StorageError::BodyFailed(e)) => Err(ApiError::bad_request(
            ErrorCode::BlobUploadInvalid,
            format!("upload chunk was not received whole, nothing of it was kept: {e}"),
        )),
        Err(StorageError::OffsetMismatch {
            actual, expected, ..
        }) => Err(out_of_order(actual, expected)),
        Err(StorageError::UploadMissing(_)) => Err(ApiError::upload_unknown(id)),
        Err(e) => Err(e.into()),
    }
}

/// Verifies the session's bytes against `digest`, publishes them and links the blob to `repo`.
async fn commit(
    state: &Service,
    repo: &RepoName,
    id: &str,
    hash: &mut HashState,
    digest: &Digest,
) -> Result<Response, ApiError> {
    let size = state
        .blobs
        .upload_size(id)
        .await?
        .ok_or_else(|| ApiError::upload_unknown(id))?;
    let computed = match hash.hasher.take() {
        Some(h) if hash.offset == size && h.algorithm() == digest.algorithm() => h.finish(),
        _ => {
            tracing::debug!(
                upload = id,
                "running digest unavailable, hashing the upload again"
            );
            let stream = state.blobs.read_upload(id).await?;
            hash_stream(stream, digest.algorithm())
                .await
                .map_err(|e| ApiError::from(StorageError::io("upload", e)))?
        }
    };
    if &computed != digest {
        return Err(digest_mismatch(digest, &computed));
    }
    let size = state.publish_upload(repo, id, digest).await?;
    Ok(committed(repo, digest, size))
}

/// Best-effort removal of a session nobody will come back to.
async fn discard(state: &Service, id: &str) {
    if let Err(e) = state.discard_upload(id).await {
        tracing::warn!(upload = id, error = %e, "could not remove an upload session; the janitor tries again");
    }
}

/// `Content-Range: <start>-<end>` (inclusive), as chunked uploads send it. A `bytes ` prefix and a
/// `/<total>` suffix are tolerated since some clients send the RFC 9110 form.
fn parse_content_range(value: &str) -> Result<(u64, u64), ApiError> {
    let bad = || {
        ApiError::new(
            StatusCode::RANGE_NOT_SATISFIABLE,
            ErrorCode::BlobUploadInvalid,
            format!("invalid Content-Range {value:?}, expected <start>-<end>"),
        )
    };
    let v = value.trim();
    let v = v.strip_prefix("bytes ").unwrap_or(v);
    let v = v.split('/').next().unwrap_or(v);
    let (start, end) = v.split_once('-').ok_or_else(bad)?;
    let start: u64 = start.trim().parse().map_err(|_| bad())?;
    let end: u64 = end.trim().parse().map_err(|_| bad())?;
    if end < start {
        return Err(bad());
    }
    Ok((start, end))
}

/// The body length a chunk declares through Content-Range and Content-Length, which must agree.
fn declared_length(req: &Request, range: Option<(u64, u64)>) -> Result<Option<u64>, ApiError> {
    let from_range = range.map(|(s, e)| e - s + 1);
    match (from_range, req.content_length()) {
        (Some(r), Some(l)) if r != l => Err(ApiError::bad_request(
            ErrorCode::SizeInvalid,
            format!("Content-Range covers {r} bytes but Content-Length is {l}"),
        )),
        (r, l) => Ok(r.or(l)),
    }
}

/// Largest refused chunk the registry still reads to the end (see `append`): above the 5 MiB
/// chunks that clients of S3-backed registries send (OCI-Chunk-Min-Length), with room to spare.
const DRAIN_LIMIT: u64 = 16 << 20;

fn out_of_order(current: u64, start: u64) -> ApiError {
    ApiError::new(
        StatusCode::RANGE_NOT_SATISFIABLE,
        ErrorCode::BlobUploadInvalid,
        format!("chunk starts at byte {start} but the upload holds {current} bytes; send chunks in order"),
    )
    .with_header("range", range_value(current))
}

fn with_session_headers(mut e: ApiError, repo: &RepoName, id: &str) -> ApiError {
    if e.status == StatusCode::RANGE_NOT_SATISFIABLE {
        e.headers.push(("location", upload_location(repo, id)));
        e.headers.push(("docker-upload-uuid", id.to_owned()));
    }
    e
}

/// `0-<last byte>`; an empty session reports `0-0` as Distribution does, since the header cannot
/// express an empty range.
fn range_value(size: u64) -> String {
    format!("0-{}", size.saturating_sub(1))
}

fn upload_location(repo: &RepoName, id: &str) -> String {
    format!("/v2/{repo}/blobs/uploads/{id}")
}

fn session_response(
    status: StatusCode,
    repo: &RepoName,
    id: &str,
    size: u64,
    min_chunk: Option<u64>,
) -> Response {
    let mut r = status.into_response();
    set_header(&mut r, "location", &upload_location(repo, id));
    set_header(&mut r, "range", &range_value(size));
    set_header(&mut r, "docker-upload-uuid", id);
    set_header(&mut r, "content-length", "0");
    if let Some(min) = min_chunk {
        set_header(&mut r, "oci-chunk-min-length", &min.to_string());
    }
    r
}

fn created_blob(repo: &RepoName, digest: &Digest) -> Response {
    let mut r = StatusCode::CREATED.into_response();
    set_header(&mut r, "location", &format!("/v2/{repo}/blobs/{digest}"));
    set_header(&mut r, "docker-content-digest", digest.as_str());
    set_header(&mut r, "content-length", "0");
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_forms() {
        assert_eq!(parse_content_range("0-99").unwrap(), (0, 99));
        assert_eq!(parse_content_range("bytes 100-199/*").unwrap(), (100, 199));
        assert!(parse_content_range("5-1").is_err());
        assert!(parse_content_range("x-1").is_err());
        assert!(parse_content_range("12").is_err());
    }

    #[test]
    fn range_header_of_an_empty_session_is_zero_zero() {
        assert_eq!(range_value(0), "0-0");
        assert_eq!(range_value(10), "0-9");
    }
}
