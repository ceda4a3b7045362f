//! Chunks in bulk, a vial extension: many new chunks uploaded in one request and stored as one pack
//! (`POST /v2/<name>/_vial/packs`), and many chunks read back in one request
//! (`POST /v2/<name>/_vial/chunks`). docs/format.md, "Packs", is the wire description.
//!
//! A chunk pushed one by one costs a request, a blob store write with its fsync (or PUT), and a
//! metadata commit; a pack of 64 MiB costs one of each for all its chunks. Every chunk is still a
//! blob, verified against its own digest on the way in and readable on its own by any OCI client
//! (as a range of its pack).

use std::sync::Arc;

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::StreamExt;
use serde::Deserialize;
use vial_core::{Digest, RepoName};

use crate::error::{ApiError, ErrorCode};
use crate::http::{set_header, Request, MAX_PACK_BYTES, MAX_PACK_CHUNKS};
use crate::service::ChunkCheck;
use crate::service::Service;
use crate::storage::{ByteStream, PackedChunk, VerifyFuture};

/// The largest chunk list line at the start of a pack (`MAX_PACK_CHUNKS` entries fit).
const MAX_LIST_BYTES: usize = 1 << 20;

/// The first line of a pack: its chunks, in the order their bytes follow.
#[derive(Deserialize)]
struct ChunkList {
    chunks: Vec<(Digest, u64)>,
}

fn invalid(code: ErrorCode, message: impl Into<String>) -> ApiError {
    ApiError::bad_request(code, message)
}

/// Splits the body into its chunk list line and the bytes after it (as a stream that starts with
/// whatever of them arrived with the line).
async fn read_list(body: Body) -> Result<(ChunkList, usize, ByteStream), ApiError> {
    let mut stream = body.into_data_stream();
    let mut head = Vec::new();
    let newline = loop {
        let Some(frame) = stream.next().await else {
            return Err(invalid(
                ErrorCode::BlobUploadInvalid,
                "a pack starts with its chunk list on one line",
            ));
        };
        let frame = frame.map_err(|e| {
            invalid(
                ErrorCode::BlobUploadInvalid,
                format!("pack body failed: {e}"),
            )
        })?;
        head.extend_from_slice(&frame);
        if let Some(at) = head.iter().position(|&b| b == b'\n') {
            break at;
        }
        if head.len() > MAX_LIST_BYTES {
            return Err(invalid(
                ErrorCode::SizeInvalid,
                format!("a pack's chunk list is at most {MAX_LIST_BYTES} bytes"),
            ));
        }
    };
    let list: ChunkList = serde_json::from_slice(&head[..newline]).map_err(|e| {
        invalid(
            ErrorCode::DigestInvalid,
            format!("expected {{\"chunks\": [[digest, size], ...]}} with valid digests: {e}"),
        )
    })?;
    let rest = Bytes::from(head).slice(newline + 1..);
    let body: ByteStream = Box::pin(
        futures_util::stream::once(async move { Ok(rest) })
            .chain(stream.map(|frame| frame.map_err(std::io::Error::other))),
    );
    Ok((list, newline + 1, body))
}

/// `POST /v2/<name>/_vial/packs`: a body of one line `{"chunks": [[digest, size], ...]}`, then
/// the chunks' bytes end to end. Stored as one pack if every chunk has its digest; then every
/// chunk is a blob of the repository, served as a range of the pack.
pub(super) async fn upload(
    state: &Service,
    repo: &RepoName,
    req: &Request,
    body: Body,
) -> Result<Response, ApiError> {
    let Some(total) = req.content_length() else {
        return Err(ApiError::new(
            StatusCode::LENGTH_REQUIRED,
            ErrorCode::SizeInvalid,
            "a pack needs a Content-Length",
        ));
    };
    if total > MAX_PACK_BYTES + MAX_LIST_BYTES as u64 {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::SizeInvalid,
            format!("a pack carries at most {MAX_PACK_BYTES} bytes"),
        ));
    }
    let (list, list_len, bytes) = read_list(body).await?;
    let chunks = list.chunks;
    if chunks.is_empty() || chunks.len() > MAX_PACK_CHUNKS {
        return Err(invalid(
            ErrorCode::SizeInvalid,
            format!("a pack holds 1 to {MAX_PACK_CHUNKS} chunks"),
        ));
    }
    let size: u64 = chunks.iter().map(|(_, s)| s).sum();
    if size + list_len as u64 != total {
        return Err(invalid(
            ErrorCode::SizeInvalid,
            format!(
                "the chunks add up to {size} bytes, but the body after the list is {}",
                total.saturating_sub(list_len as u64)
            ),
        ));
    }
    let mut offset = 0;
    let packed: Vec<PackedChunk> = chunks
        .iter()
        .map(|(digest, size)| {
            let c = PackedChunk {
                digest: digest.clone(),
                size: *size,
                offset,
            };
            offset += size;
            c
        })
        .collect();

    let check = ChunkCheck::spawn(chunks);
    let verdict = check.verdict;
    let failure = Arc::new(std::sync::Mutex::new(None::<String>));
    let why = Arc::clone(&failure);
    let verify: VerifyFuture = Box::pin(async move {
        let ok = match verdict.await {
            Ok(Ok(())) => true,
            Ok(Err(e)) => {
                if let Ok(mut w) = why.lock() {
                    *w = Some(e);
                }
                false
            }
            Err(_) => false,
        };
        ok
    });
    let tx = check.tx;
    let metrics = Arc::clone(&state.metrics);
    let teed: ByteStream = Box::pin(bytes.then(move |item| {
        let tx = tx.clone();
        let metrics = Arc::clone(&metrics);
        async move {
            let bytes = super::bodies::hold(item?).await;
            metrics.add_bytes_in(bytes.len() as u64);
            // The checker only ever stops early on a mismatch, which fails the pack anyway.
            let _ = tx.send(bytes.clone()).await;
            Ok(bytes)
        }
    }));
    let id = match state.store_pack(repo, &packed, size, teed, verify).await {
        Ok(Some(id)) => id,
        Ok(None) => {
            let why = failure.lock().ok().and_then(|w| w.clone());
            tracing::info!(%repo, why, "pack refused");
            return Err(match why {
                Some(why) => invalid(ErrorCode::DigestInvalid, why),
                None => invalid(
                    ErrorCode::BlobUploadInvalid,
                    "the pack's bytes did not arrive whole",
                ),
            });
        }
        Err(crate::storage::StorageError::BodyFailed(e)) => {
            return Err(invalid(
                ErrorCode::BlobUploadInvalid,
                format!("the pack's bytes did not arrive whole: {e}"),
            ))
        }
        Err(e) => return Err(e.into()),
    };
    tracing::info!(%repo, pack = %id, chunks = packed.len(), bytes = size, "pack stored");
    Ok(crate::http::json(
        StatusCode::CREATED,
        &serde_json::json!({ "chunks": packed.len(), "bytes": size }),
    ))
}

#[derive(Deserialize)]
struct ReadRequest {
    digests: Vec<Digest>,
}

/// `POST /v2/<name>/_vial/chunks` with `{"digests": [...]}`: the blobs' bytes end to end, in the
/// order asked, in one response (404 `BLOB_UNKNOWN` naming any the repository lacks). The client
/// knows the sizes and digests, and verifies each chunk as it arrives.
pub(super) async fn read(
    state: &Service,
    repo: &RepoName,
    body: Body,
) -> Result<Response, ApiError> {
    let bytes = crate::http::read_small_body(body, 1 << 20, "bulk read").await?;
    let request: ReadRequest = serde_json::from_slice(&bytes).map_err(|e| {
        invalid(
            ErrorCode::DigestInvalid,
            format!("expected {{\"digests\": [...]}} with valid digests: {e}"),
        )
    })?;
    if request.digests.is_empty() || request.digests.len() > MAX_PACK_CHUNKS {
        return Err(invalid(
            ErrorCode::SizeInvalid,
            format!("ask for 1 to {MAX_PACK_CHUNKS} blobs at once"),
        ));
    }
    let locations = state
        .blob_rows()
        .blob_locations(repo, &request.digests)
        .await?;
    let missing: Vec<&Digest> = request
        .digests
        .iter()
        .filter(|d| !locations.contains_key(*d))
        .collect();
    if !missing.is_empty() {
        return Err(ApiError::not_found(
            ErrorCode::BlobUnknown,
            format!("{} of the blobs asked for are not in {repo}", missing.len()),
        )
        .with_detail(serde_json::json!({ "missing": missing })));
    }
    let total: u64 = request
        .digests
        .iter()
        .filter_map(|d| locations.get(d))
        .map(|l| l.size)
        .sum();
    if total > MAX_PACK_BYTES {
        return Err(invalid(
            ErrorCode::SizeInvalid,
            format!("a bulk read returns at most {MAX_PACK_BYTES} bytes"),
        ));
    }
    let segments = crate::service::plan(&request.digests, &locations);
    let metrics = Arc::clone(&state.metrics);
    let stream = state.read_segments(repo, segments).inspect(move |chunk| {
        if let Ok(bytes) = chunk {
            metrics.add_bytes_out(bytes.len() as u64);
        }
    });
    let mut r = (StatusCode::OK, Body::from_stream(stream)).into_response();
    set_header(&mut r, "content-length", &total.to_string());
    set_header(&mut r, "content-type", "application/octet-stream");
    Ok(r)
}
