//! The blob store facade: content-addressed bytes, and upload sessions that become blobs.

use std::pin::Pin;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::Stream;
use vial_core::Digest;

use super::StorageError;

/// A stream of body bytes, as read from a request or a stored blob.
pub type ByteStream = Pin<Box<dyn Stream<Item = Result<Bytes, std::io::Error>> + Send>>;

/// A stream that fails at once with `why`: what a reader gets for bytes it cannot have.
pub fn failed_stream(why: impl Into<String>) -> ByteStream {
    let why = why.into();
    Box::pin(futures_util::stream::once(async move {
        Err(std::io::Error::other(why))
    }))
}

/// Says, once a streamed body has ended, whether it had the claimed digest.
pub type VerifyFuture = Pin<Box<dyn std::future::Future<Output = bool> + Send>>;

/// The name of a pack in the blob store: 32 hex digits the registry made up. Packs are named by
/// id, not digest: their chunks carry the digests, and nothing outside the registry names a pack.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PackId(String);

impl PackId {
    pub fn random() -> PackId {
        PackId(uuid::Uuid::new_v4().simple().to_string())
    }

    /// An id read back from storage; `None` if it is not one.
    pub fn parse(s: &str) -> Option<PackId> {
        (s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| PackId(s.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for PackId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A half-open byte range `[start, end)` inside a blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.start >= self.end
    }
}

/// Where blob bytes live.
///
/// Upload sessions are named by opaque ids the registry allocates. Bytes are appended to a session,
/// the registry verifies the digest of what was appended, and only then asks the store to publish the
/// session under that digest, atomically: a reader sees either no blob or the whole verified blob.
#[async_trait]
pub trait BlobStore: Send + Sync + std::fmt::Debug {
    /// The blob's size, or `None` when it is not stored.
    async fn stat(&self, digest: &Digest) -> Result<Option<u64>, StorageError>;

    /// Streams a blob, or the given range of it. The caller has checked the range against the size.
    async fn read(
        &self,
        digest: &Digest,
        range: Option<ByteRange>,
    ) -> Result<Option<ByteStream>, StorageError>;

    /// Removes a blob's bytes. Returns whether anything was there.
    async fn delete(&self, digest: &Digest) -> Result<bool, StorageError>;

    /// The smallest chunk, except the last, that this store wants in a chunked upload.
    fn min_chunk_length(&self) -> u64;

    /// Starts an empty upload session.
    async fn create_upload(&self, id: &str) -> Result<(), StorageError>;

    /// Bytes received so far by a session, or `None` if the store knows the session does not exist
    /// (stores that keep nothing for an empty session answer `Some(0)`: the metadata store is what
    /// says whether a session exists).
    async fn upload_size(&self, id: &str) -> Result<Option<u64>, StorageError>;

    /// Appends `body` to a session that currently holds exactly `offset` bytes and returns the new
    /// size. If the body fails midway the session is put back to `offset`, so a failed chunk can be
    /// sent again.
    async fn append_upload(
        &self,
        id: &str,
        offset: u64,
        body: ByteStream,
    ) -> Result<u64, StorageError>;

    /// Streams what a session holds, to hash it again when the incremental hash state was lost.
    async fn read_upload(&self, id: &str) -> Result<ByteStream, StorageError>;

    /// Publishes a session's bytes as the blob `digest`, which the caller has verified, and removes the
    /// session. Durable when it returns.
    async fn commit_upload(&self, id: &str, digest: &Digest) -> Result<u64, StorageError>;

    /// Discards a session's bytes. Missing sessions are not an error.
    async fn abort_upload(&self, id: &str) -> Result<(), StorageError>;

    /// Whether small blobs should reach the store whole, through [`BlobStore::put`], rather than
    /// streamed through an upload session: true for object stores, where a session costs several
    /// requests; false for files, where streaming overlaps receiving, hashing and writing.
    fn prefers_whole_puts(&self) -> bool {
        false
    }

    /// Stores a whole blob the caller holds in memory and has verified. Durable when it returns.
    /// The default goes through a private upload session; stores that can write an object in one
    /// call do so.
    async fn put(&self, digest: &Digest, bytes: Bytes) -> Result<(), StorageError> {
        let body: ByteStream = Box::pin(futures_util::stream::once(async move { Ok(bytes) }));
        let verified: VerifyFuture = Box::pin(async { true });
        self.put_streamed(digest, body, verified).await.map(drop)
    }

    /// Streams a blob whose digest the client claimed up front and publishes it only if `verify`,
    /// awaited once the body has ended, says the bytes have that digest. Returns the size, or `None`
    /// when verification failed and nothing was published. Object stores stream straight to the
    /// blob's key in an upload that only completes after verification, instead of writing a
    /// session and copying it.
    async fn put_streamed(
        &self,
        digest: &Digest,
        body: ByteStream,
        verify: VerifyFuture,
    ) -> Result<Option<u64>, StorageError> {
        let id = uuid::Uuid::new_v4().to_string();
        self.create_upload(&id).await?;
        let result = async {
            let size = self.append_upload(&id, 0, body).await?;
            if !verify.await {
                return Ok(None);
            }
            self.commit_upload(&id, digest).await?;
            Ok(Some(size))
        }
        .await;
        if !matches!(result, Ok(Some(_))) {
            let _ = self.abort_upload(&id).await;
        }
        result
    }

    /// Stores `body`, `len` bytes, as the pack `id` if `verify`, awaited once the body has ended,
    /// says yes; returns whether it did. Durable when it returns `Ok(true)`. A store may hold the
    /// bytes under `id` before verification (nothing names an uncommitted pack), but removes them
    /// when verification fails.
    async fn put_pack(
        &self,
        id: &PackId,
        body: ByteStream,
        len: u64,
        verify: VerifyFuture,
    ) -> Result<bool, StorageError>;

    /// Streams a range of a pack.
    async fn read_pack(
        &self,
        id: &PackId,
        range: ByteRange,
    ) -> Result<Option<ByteStream>, StorageError>;

    /// Removes a pack's bytes. Returns whether anything was there.
    async fn delete_pack(&self, id: &PackId) -> Result<bool, StorageError>;

    /// Removes leftovers of uploads that a crash interrupted before `older_than` and that no upload
    /// session names (multipart uploads, for object stores). Returns how many it removed.
    async fn sweep(&self, _older_than: SystemTime) -> Result<u64, StorageError> {
        Ok(0)
    }

    /// Appends the store's own counters to `/metrics` (an object store's requests, say).
    fn render_metrics(&self, _out: &mut String) {}

    /// Whether the store is reachable, for readiness checks.
    async fn ping(&self) -> Result<(), StorageError> {
        Ok(())
    }

    /// A URL a client can GET the blob from directly for `expires_in`, if the store offers one.
    async fn presign_read(
        &self,
        _digest: &Digest,
        _expires_in: Duration,
    ) -> Result<Option<String>, StorageError> {
        Ok(None)
    }
}
