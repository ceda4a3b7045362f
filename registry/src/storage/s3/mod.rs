//! The S3 blob store: blobs as objects under `<prefix>blobs/<algorithm>/<xx>/<hex>`, upload sessions
//! as objects under `<prefix>uploads/<id>/`, so that any replica can continue any session.
//!
//! A session is one object per appended chunk, named by the offset it starts at
//! (`data-<offset, 20 digits>`); an empty session has no objects, and whether a session exists is
//! the metadata store's to say. Each chunk object appears whole or not at all (a small
//! chunk is one PutObject, a large one a multipart upload completed only when the body ended well),
//! so a failed chunk leaves the session at its old size and the size is always the sum of the
//! listed chunk objects. Committing assembles the chunk objects into the blob's key server-side
//! (CopyObject, or a multipart upload of UploadPartCopy ranges) and then deletes them: a blob key
//! is only ever written with bytes the registry has verified, and only by a complete operation.
//!
//! Sizes: S3 allows 10,000 parts of at most 5 GiB per multipart upload. Streamed chunk objects use
//! parts that grow linearly from 16 MiB (see [`part_size`]), which keeps one upload's buffer small
//! for ordinary blobs and still reaches 1.6 TiB within the part limit; assembly copies ranges of up
//! to 5 GiB.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use aws_sdk_s3::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_s3::presigning::PresigningConfig;
use aws_sdk_s3::primitives::ByteStream as S3Body;
use aws_sdk_s3::types::{Delete, ObjectIdentifier};
use aws_sdk_s3::Client;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use vial_core::Digest;

mod bucket;
mod multipart;
mod packs;
mod requests;

pub(crate) use bucket::is_transient;
use bucket::{body_stream, is_not_found, s3_error, Bucket};
use multipart::Multipart;

use super::{BlobStore, ByteRange, ByteStream, PackId, StorageError, VerifyFuture};
use crate::config::S3Location;

/// S3's smallest part, except the last.
const MIN_PART: u64 = 5 * 1024 * 1024;
/// S3's largest part, and the largest range one UploadPartCopy may copy.
const MAX_PART: u64 = 5 * 1024 * 1024 * 1024;
/// The first part size of a streamed chunk object.
const BASE_PART: u64 = 16 * 1024 * 1024;
/// Small chunk objects are gathered into parts of this size when a session is assembled.
const GATHER_PART: usize = 16 * 1024 * 1024;

/// The size of part number `n` (0-based) of a streamed upload whose length is not known: 16 MiB for
/// the first 500 parts, 32 MiB for the next 500, and so on. 10,000 parts hold 1.6 TiB, with parts
/// of 256 MiB needed only past 0.9 TiB.
pub(crate) fn part_size(n: u64) -> u64 {
    (BASE_PART * (1 + n / 500)).min(MAX_PART)
}

#[derive(Clone)]
pub struct S3BlobStore {
    s3: Bucket,
    /// Empty, or ends with `/`.
    prefix: String,
    /// Set once the store has said it cannot list multipart uploads, so the janitor stops asking.
    cannot_list_uploads: Arc<AtomicBool>,
    /// Requests sent, by method, for `/metrics`.
    requests: Arc<requests::RequestCounts>,
}

impl std::fmt::Debug for S3BlobStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3BlobStore")
            .field("bucket", &self.s3.name)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

/// How to reach an S3-compatible server; what is not given comes from the standard AWS environment
/// (variables, `~/.aws/config` and credentials files, instance roles).
#[derive(Debug, Default)]
pub struct ClientSettings<'a> {
    pub endpoint: Option<&'a str>,
    pub region: Option<&'a str>,
    /// Path-style addressing; by default on exactly when a custom endpoint is set, since that is
    /// what self-hosted servers (MinIO, Garage, s3s) expect.
    pub path_style: Option<bool>,
    pub credentials: Option<aws_sdk_s3::config::Credentials>,
    pub read_timeout: Duration,
    /// Where to count the requests sent, if anywhere.
    pub count_requests: Option<Arc<requests::RequestCounts>>,
}

/// An S3 client for `settings`.
pub async fn client(settings: &ClientSettings<'_>) -> Client {
    use aws_config::timeout::TimeoutConfig;
    use aws_config::{BehaviorVersion, Region};

    let mut loader = aws_config::defaults(BehaviorVersion::latest()).timeout_config(
        TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(3))
            .read_timeout(settings.read_timeout)
            .build(),
    );
    if let Some(region) = settings.region {
        loader = loader.region(Region::new(region.to_owned()));
    }
    if let Some(endpoint) = settings.endpoint {
        loader = loader.endpoint_url(endpoint);
    }
    if let Some(credentials) = &settings.credentials {
        loader = loader.credentials_provider(credentials.clone());
    }
    let shared = loader.load().await;
    let path_style = settings
        .path_style
        .unwrap_or_else(|| shared.endpoint_url().is_some());
    let mut builder = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(path_style)
        // Checksums only where S3 requires them: several S3-compatible servers reject the newer
        // default trailers, and every blob is verified by its digest anyway.
        .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired);
    if shared.region().is_none() {
        builder = builder.region(Region::new("us-east-1"));
    }
    if let Some(counts) = &settings.count_requests {
        builder = builder.interceptor(requests::CountRequests(Arc::clone(counts)));
    }
    Client::from_conf(builder.build())
}

impl S3BlobStore {
    /// Builds a client from the standard AWS environment (variables, `~/.aws/config` and
    /// credentials files, instance roles), overridden by what the blob URL names. A custom endpoint
    /// gets path-style addressing unless the URL says otherwise, since that is what self-hosted
    /// servers (MinIO, Garage, s3s) expect.
    pub async fn open(location: &S3Location) -> Result<Self, StorageError> {
        let requests = Arc::new(requests::RequestCounts::default());
        let client = client(&ClientSettings {
            endpoint: location.endpoint.as_deref(),
            region: location.region.as_deref(),
            path_style: location.path_style,
            credentials: None,
            read_timeout: Duration::from_secs(60),
            count_requests: Some(Arc::clone(&requests)),
        })
        .await;
        let mut prefix = location.prefix.trim_matches('/').to_owned();
        if !prefix.is_empty() {
            prefix.push('/');
        }
        Ok(S3BlobStore {
            s3: Bucket {
                client,
                name: location.bucket.clone(),
            },
            prefix,
            cannot_list_uploads: Arc::new(AtomicBool::new(false)),
            requests,
        })
    }

    fn blob_key(&self, digest: &Digest) -> String {
        let hex = digest.hex();
        format!(
            "{}blobs/{}/{}/{}",
            self.prefix,
            digest.algorithm().as_str(),
            &hex[..2],
            hex
        )
    }

    fn session_prefix(&self, id: &str) -> Result<String, StorageError> {
        // Only UUIDs are handed out; anything else could escape the session's key prefix.
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(StorageError::UploadMissing(id.to_owned()));
        }
        Ok(format!("{}uploads/{id}/", self.prefix))
    }

    /// The session's chunk objects in offset order (none for an empty session).
    async fn session_parts(&self, id: &str) -> Result<Vec<ChunkObject>, StorageError> {
        let prefix = self.session_prefix(id)?;
        let mut parts = Vec::new();
        for (key, size) in self.list(&prefix).await? {
            let name = &key[prefix.len()..];
            if let Some(offset) = name.strip_prefix("data-").and_then(|o| o.parse().ok()) {
                parts.push(ChunkObject { key, offset, size });
            }
        }
        parts.sort_by_key(|p| p.offset);
        let mut expected = 0;
        for p in &parts {
            if p.offset != expected {
                return Err(StorageError::Corrupt(format!(
                    "upload {id} has a chunk at offset {} where {expected} was expected",
                    p.offset
                )));
            }
            expected += p.size;
        }
        Ok(parts)
    }

    async fn list(&self, prefix: &str) -> Result<Vec<(String, u64)>, StorageError> {
        let mut out = Vec::new();
        let mut pages = self
            .s3
            .client
            .list_objects_v2()
            .bucket(&self.s3.name)
            .prefix(prefix)
            .into_paginator()
            .send();
        while let Some(page) = pages.next().await {
            let page = page.map_err(|e| s3_error("ListObjectsV2", prefix, e))?;
            for object in page.contents() {
                if let Some(key) = object.key() {
                    out.push((key.to_owned(), object.size().unwrap_or(0).max(0) as u64));
                }
            }
        }
        Ok(out)
    }

    async fn put_object(&self, key: &str, body: Bytes) -> Result<(), StorageError> {
        self.s3
            .client
            .put_object()
            .bucket(&self.s3.name)
            .key(key)
            .body(S3Body::from(body))
            .send()
            .await
            .map_err(|e| s3_error("PutObject", key, e))?;
        Ok(())
    }

    async fn delete_keys(&self, keys: Vec<String>) -> Result<(), StorageError> {
        for batch in keys.chunks(1000) {
            let objects = batch
                .iter()
                .map(|k| ObjectIdentifier::builder().key(k).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| StorageError::Corrupt(e.to_string()))?;
            let delete = Delete::builder()
                .set_objects(Some(objects))
                .quiet(true)
                .build()
                .map_err(|e| StorageError::Corrupt(e.to_string()))?;
            let first = batch.first().map(String::as_str).unwrap_or("");
            let out = self
                .s3
                .client
                .delete_objects()
                .bucket(&self.s3.name)
                .delete(delete)
                .send()
                .await
                .map_err(|e| s3_error("DeleteObjects", first, e))?;
            if let Some(err) = out.errors().first() {
                return Err(StorageError::S3 {
                    op: "DeleteObjects",
                    key: err.key().unwrap_or(first).to_owned(),
                    message: err.message().unwrap_or("failed").to_owned(),
                    unavailable: false,
                });
            }
        }
        Ok(())
    }

    async fn head(&self, key: &str) -> Result<Option<u64>, StorageError> {
        match self
            .s3
            .client
            .head_object()
            .bucket(&self.s3.name)
            .key(key)
            .send()
            .await
        {
            Ok(out) => Ok(Some(out.content_length().unwrap_or(0).max(0) as u64)),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(s3_error("HeadObject", key, e)),
        }
    }

    /// Streams `body` into `key` as one object: a PutObject when it fits in the first part, else a
    /// multipart upload that is completed only if the body ended well and aborted otherwise.
    /// Returns the number of bytes stored.
    async fn stream_object(&self, key: &str, body: ByteStream) -> Result<u64, StorageError> {
        let accept: VerifyFuture = Box::pin(async { true });
        self.stream_object_if(key, body, accept)
            .await
            .map(|n| n.unwrap_or(0))
    }

    /// [`Self::stream_object`], publishing only if `verify` says yes once the body has ended;
    /// `None` when it said no and nothing was written.
    async fn stream_object_if(
        &self,
        key: &str,
        mut body: ByteStream,
        verify: VerifyFuture,
    ) -> Result<Option<u64>, StorageError> {
        let mut verify = Some(verify);
        let mut verified = async || match verify.take() {
            Some(v) => v.await,
            None => false,
        };
        let mut buf = BytesMut::new();
        let mut upload: Option<Multipart> = None;
        let mut total = 0u64;
        let result: Result<bool, StorageError> = async {
            loop {
                let part_len = part_size(upload.as_ref().map_or(0, |m| m.parts.len() as u64));
                let item = body.next().await;
                let ended = item.is_none();
                if let Some(item) = item {
                    let bytes = item.map_err(StorageError::BodyFailed)?;
                    total += bytes.len() as u64;
                    buf.extend_from_slice(&bytes);
                }
                if ended || buf.len() as u64 >= part_len {
                    if upload.is_none() && ended {
                        if !verified().await {
                            return Ok(false);
                        }
                        return self
                            .put_object(key, buf.split().freeze())
                            .await
                            .map(|()| true);
                    }
                    if upload.is_none() {
                        upload = Some(Multipart::create(&self.s3, key).await?);
                    }
                    if let Some(m) = upload.as_mut() {
                        while buf.len() as u64 >= part_len || (ended && !buf.is_empty()) {
                            let take = (part_len as usize).min(buf.len());
                            m.upload(&self.s3, buf.split_to(take).freeze()).await?;
                        }
                        if ended {
                            if !verified().await {
                                return Ok(false);
                            }
                            return m.complete(&self.s3).await.map(|()| true);
                        }
                    }
                }
            }
        }
        .await;
        match result {
            Ok(true) => Ok(Some(total)),
            Ok(false) => {
                if let Some(m) = upload {
                    m.abort(&self.s3).await;
                }
                Ok(None)
            }
            Err(e) => {
                if let Some(m) = upload {
                    m.abort(&self.s3).await;
                }
                Err(e)
            }
        }
    }

    /// Writes the concatenation of `parts` to `key` without passing large chunks through the
    /// registry: whole 5 MiB+ ranges are copied by the server, small chunks are gathered here.
    async fn assemble(&self, key: &str, parts: &[ChunkObject]) -> Result<(), StorageError> {
        let mut m = Multipart::create(&self.s3, key).await?;
        let result: Result<(), StorageError> = async {
            let mut gathered = BytesMut::new();
            for part in parts {
                let mut pos = 0u64;
                if !gathered.is_empty() || part.size < MIN_PART {
                    // Top up the gathered bytes to a whole part from this chunk object.
                    let want = (GATHER_PART - gathered.len()) as u64;
                    let take = want.min(part.size);
                    gathered.extend_from_slice(&self.get_range(&part.key, 0, take).await?);
                    pos = take;
                    if gathered.len() >= GATHER_PART {
                        m.upload(&self.s3, gathered.split().freeze()).await?;
                    }
                }
                while pos < part.size {
                    let len = (part.size - pos).min(MAX_PART);
                    if len < MIN_PART {
                        gathered
                            .extend_from_slice(&self.get_range(&part.key, pos, pos + len).await?);
                    } else {
                        m.copy(&self.s3, &part.key, pos, pos + len).await?;
                    }
                    pos += len;
                }
            }
            if !gathered.is_empty() {
                m.upload(&self.s3, gathered.split().freeze()).await?;
            }
            m.complete(&self.s3).await
        }
        .await;
        if result.is_err() {
            m.abort(&self.s3).await;
        }
        result
    }

    async fn get_range(&self, key: &str, start: u64, end: u64) -> Result<Bytes, StorageError> {
        if start == end {
            return Ok(Bytes::new());
        }
        let out = self
            .s3
            .client
            .get_object()
            .bucket(&self.s3.name)
            .key(key)
            .range(format!("bytes={start}-{}", end - 1))
            .send()
            .await
            .map_err(|e| s3_error("GetObject", key, e))?;
        let bytes = out.body.collect().await.map_err(|e| StorageError::S3 {
            op: "GetObject",
            key: key.to_owned(),
            message: e.to_string(),
            unavailable: true,
        })?;
        Ok(bytes.into_bytes())
    }
}

#[derive(Debug)]
struct ChunkObject {
    key: String,
    offset: u64,
    size: u64,
}

#[async_trait]
impl BlobStore for S3BlobStore {
    async fn stat(&self, digest: &Digest) -> Result<Option<u64>, StorageError> {
        self.head(&self.blob_key(digest)).await
    }

    async fn read(
        &self,
        digest: &Digest,
        range: Option<ByteRange>,
    ) -> Result<Option<ByteStream>, StorageError> {
        let key = self.blob_key(digest);
        let mut req = self.s3.client.get_object().bucket(&self.s3.name).key(&key);
        if let Some(r) = range {
            if r.is_empty() {
                return Ok(Some(Box::pin(futures_util::stream::empty())));
            }
            req = req.range(format!("bytes={}-{}", r.start, r.end - 1));
        }
        let out = match req.send().await {
            Ok(out) => out,
            Err(e) if is_not_found(&e) => return Ok(None),
            Err(e) => return Err(s3_error("GetObject", &key, e)),
        };
        Ok(Some(body_stream(out.body)))
    }

    async fn delete(&self, digest: &Digest) -> Result<bool, StorageError> {
        let key = self.blob_key(digest);
        if self.head(&key).await?.is_none() {
            return Ok(false);
        }
        self.s3
            .client
            .delete_object()
            .bucket(&self.s3.name)
            .key(&key)
            .send()
            .await
            .map_err(|e| s3_error("DeleteObject", &key, e))?;
        Ok(true)
    }

    fn min_chunk_length(&self) -> u64 {
        // Any chunk size works (small chunks are gathered when the blob is assembled), but chunks of
        // a part or more are copied by the server instead of passing through the registry.
        MIN_PART
    }

    fn prefers_whole_puts(&self) -> bool {
        true
    }

    async fn put(&self, digest: &Digest, bytes: Bytes) -> Result<(), StorageError> {
        let key = self.blob_key(digest);
        if digest.algorithm() != vial_core::Algorithm::Sha256 {
            return self.put_object(&key, bytes).await;
        }
        // The registry has just verified the body's SHA-256: hand it to the store as the object's
        // checksum, which the store verifies on receipt, instead of having the SDK hash the body
        // a second time to sign it. Integrity is the same, at half the hashing.
        let raw = hex::decode(digest.hex())
            .map_err(|_| StorageError::Corrupt(format!("digest {digest} is not hex")))?;
        use base64::Engine;
        self.s3
            .client
            .put_object()
            .bucket(&self.s3.name)
            .key(&key)
            .checksum_sha256(base64::engine::general_purpose::STANDARD.encode(raw))
            .body(S3Body::from(bytes))
            .customize()
            .disable_payload_signing()
            .send()
            .await
            .map_err(|e| s3_error("PutObject", &key, e))?;
        Ok(())
    }

    async fn put_streamed(
        &self,
        digest: &Digest,
        body: ByteStream,
        verify: VerifyFuture,
    ) -> Result<Option<u64>, StorageError> {
        // Straight to the blob's key: a multipart upload is invisible until completed, and it is
        // completed only once the registry has verified the digest.
        self.stream_object_if(&self.blob_key(digest), body, verify)
            .await
    }

    async fn create_upload(&self, id: &str) -> Result<(), StorageError> {
        // Nothing to write: a session with no chunk objects is an empty session. Whether it
        // exists at all is the metadata store's to say.
        self.session_prefix(id).map(drop)
    }

    async fn upload_size(&self, id: &str) -> Result<Option<u64>, StorageError> {
        let parts = self.session_parts(id).await?;
        Ok(Some(parts.iter().map(|p| p.size).sum()))
    }

    async fn append_upload(
        &self,
        id: &str,
        offset: u64,
        body: ByteStream,
    ) -> Result<u64, StorageError> {
        let prefix = self.session_prefix(id)?;
        let actual = self
            .upload_size(id)
            .await?
            .ok_or_else(|| StorageError::UploadMissing(id.to_owned()))?;
        if actual != offset {
            return Err(StorageError::OffsetMismatch {
                id: id.to_owned(),
                expected: offset,
                actual,
            });
        }
        let key = format!("{prefix}data-{offset:020}");
        let written = self.stream_object(&key, body).await?;
        if written == 0 {
            // An empty chunk adds nothing; do not leave an empty object that says otherwise.
            self.delete_keys(vec![key]).await?;
        }
        Ok(offset + written)
    }

    async fn read_upload(&self, id: &str) -> Result<ByteStream, StorageError> {
        let parts = self.session_parts(id).await?;
        let store = self.clone();
        let stream = futures_util::stream::iter(parts)
            .then(move |part| {
                let store = store.clone();
                async move {
                    match store
                        .s3
                        .client
                        .get_object()
                        .bucket(&store.s3.name)
                        .key(&part.key)
                        .send()
                        .await
                    {
                        Ok(out) => body_stream(out.body),
                        Err(e) => futures_util::stream::once(async move {
                            Err(std::io::Error::other(DisplayErrorContext(e).to_string()))
                        })
                        .boxed(),
                    }
                }
            })
            .flatten();
        Ok(Box::pin(stream))
    }

    async fn commit_upload(&self, id: &str, digest: &Digest) -> Result<u64, StorageError> {
        let prefix = self.session_prefix(id)?;
        let parts = self.session_parts(id).await?;
        let size: u64 = parts.iter().map(|p| p.size).sum();
        let key = self.blob_key(digest);
        if self.head(&key).await? != Some(size) {
            match parts.as_slice() {
                [] => self.put_object(&key, Bytes::new()).await?,
                [one] if one.size <= MAX_PART => {
                    self.s3
                        .client
                        .copy_object()
                        .bucket(&self.s3.name)
                        .key(&key)
                        .copy_source(format!("{}/{}", self.s3.name, one.key))
                        .send()
                        .await
                        .map_err(|e| s3_error("CopyObject", &key, e))?;
                }
                // A small blob of several chunks: one PutObject beats a multipart upload.
                _ if size <= GATHER_PART as u64 => {
                    let mut all = BytesMut::with_capacity(size as usize);
                    for part in &parts {
                        all.extend_from_slice(&self.get_range(&part.key, 0, part.size).await?);
                    }
                    self.put_object(&key, all.freeze()).await?;
                }
                _ => self.assemble(&key, &parts).await?,
            }
        }
        let keys = self
            .list(&prefix)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        self.delete_keys(keys).await?;
        Ok(size)
    }

    async fn abort_upload(&self, id: &str) -> Result<(), StorageError> {
        let prefix = self.session_prefix(id)?;
        let keys: Vec<String> = self
            .list(&prefix)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .collect();
        if !keys.is_empty() {
            self.delete_keys(keys).await?;
        }
        Ok(())
    }

    async fn put_pack(
        &self,
        id: &PackId,
        body: ByteStream,
        len: u64,
        verify: VerifyFuture,
    ) -> Result<bool, StorageError> {
        self.put_pack_object(id, body, len, verify).await
    }

    async fn read_pack(
        &self,
        id: &PackId,
        range: ByteRange,
    ) -> Result<Option<ByteStream>, StorageError> {
        self.read_pack_range(id, range).await
    }

    async fn delete_pack(&self, id: &PackId) -> Result<bool, StorageError> {
        self.delete_pack_object(id).await
    }

    async fn sweep(&self, older_than: SystemTime) -> Result<u64, StorageError> {
        if self.cannot_list_uploads.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let prefix = format!("{}uploads/", self.prefix);
        let out = match self
            .s3
            .client
            .list_multipart_uploads()
            .bucket(&self.s3.name)
            .prefix(&prefix)
            .send()
            .await
        {
            Ok(out) => out,
            Err(SdkError::ServiceError(e)) if e.err().code() == Some("NotImplemented") => {
                // Some S3-compatible servers lack the call. Say so once; their own lifecycle
                // rules (AbortIncompleteMultipartUpload) are the way to clean up there.
                self.cannot_list_uploads.store(true, Ordering::Relaxed);
                tracing::warn!(
                    bucket = %self.s3.name,
                    "the object store cannot list multipart uploads; abandoned ones are left to the bucket's lifecycle rules"
                );
                return Ok(0);
            }
            Err(e) => return Err(s3_error("ListMultipartUploads", &prefix, e)),
        };
        let mut aborted = 0;
        for upload in out.uploads() {
            let started = upload
                .initiated()
                .and_then(|t| SystemTime::try_from(*t).ok());
            if started.is_none_or(|t| t >= older_than) {
                continue;
            }
            let (Some(key), Some(upload_id)) = (upload.key(), upload.upload_id()) else {
                continue;
            };
            Multipart {
                key: key.to_owned(),
                upload_id: upload_id.to_owned(),
                parts: Vec::new(),
                in_flight: None,
            }
            .abort(&self.s3)
            .await;
            tracing::info!(key, "aborted abandoned multipart upload");
            aborted += 1;
        }
        Ok(aborted)
    }

    fn render_metrics(&self, out: &mut String) {
        self.requests.render(out);
    }

    async fn ping(&self) -> Result<(), StorageError> {
        self.s3
            .client
            .head_bucket()
            .bucket(&self.s3.name)
            .send()
            .await
            .map_err(|e| s3_error("HeadBucket", &self.s3.name, e))?;
        Ok(())
    }

    async fn presign_read(
        &self,
        digest: &Digest,
        expires_in: Duration,
    ) -> Result<Option<String>, StorageError> {
        let key = self.blob_key(digest);
        let config = PresigningConfig::expires_in(expires_in).map_err(|e| StorageError::S3 {
            op: "presign",
            key: key.clone(),
            message: e.to_string(),
            unavailable: false,
        })?;
        let request = self
            .s3
            .client
            .get_object()
            .bucket(&self.s3.name)
            .key(&key)
            .presigned(config)
            .await
            .map_err(|e| s3_error("presign GetObject", &key, e))?;
        Ok(Some(request.uri().to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streamed_parts_reach_a_tebibyte_within_the_part_limit() {
        let total: u64 = (0..multipart::MAX_PARTS as u64).map(part_size).sum();
        assert!(total >= 1 << 40, "10,000 parts hold only {total} bytes");
        // The part buffer stays small for ordinary blobs, and within S3's limits always.
        assert_eq!(part_size(0), 16 << 20);
        assert!((0..multipart::MAX_PARTS as u64)
            .all(|n| part_size(n) >= MIN_PART && part_size(n) <= MAX_PART));
        let mut sum = 0;
        let mut n = 0;
        while sum < 1 << 40 {
            sum += part_size(n);
            n += 1;
        }
        assert!(
            part_size(n) <= 256 << 20,
            "a 1 TiB blob needs parts of {}",
            part_size(n)
        );
    }
}
