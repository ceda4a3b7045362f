//! The two storage facades every backend implements: a blob store for bytes and a metadata store for
//! everything else.
//!
//! The registry only ever talks to `Arc<dyn BlobStore>` and `Arc<dyn MetadataStore>`; the backend is
//! chosen once, at start-up, from the configured URL scheme. Metadata methods are named for use cases
//! and each runs as one transaction, so a crash between two of them never leaves a half-done change.

mod blob;
mod compact;
mod direct;
mod fs;
mod metadata;
pub(crate) mod s3;
mod sql;

pub use blob::{failed_stream, BlobStore, ByteRange, ByteStream, PackId, VerifyFuture};
pub use compact::{ChunkMove, CompactMeta, PackChunk, PackUse};
pub use fs::FsBlobStore;
pub use metadata::{
    BlobLocation, BlobMeta, BytesDeletion, Candidates, CommitManifestError, Garbage, GcEstimate,
    GcMeta, Job, JobFile, JobMeta, JobOutcome, JobState, Lease, LeaseMeta, ManifestMeta,
    ManifestRecord, MetadataStore, PackedChunk, Page, Presence, RangeChunk, Restored, SealMeta,
    Source, StoredCheck, StoredManifest, TagEvent, TagMeta, TagMoved, TagPrecondition, UploadMeta,
    UploadSession, VersionRow, VersionTotals, Window,
};
pub use s3::S3BlobStore;
pub use sql::{Dialect, SqlMetadataStore};

/// A failure of a storage backend. These are internal: they are logged in full and reach clients
/// only as a generic 5xx.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("blob store i/o at {path}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("metadata database")]
    Database(#[from] sqlx::Error),
    #[error("metadata migration")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error("request body failed")]
    BodyFailed(#[source] std::io::Error),
    #[error("upload session {0} has no data in the blob store")]
    UploadMissing(String),
    #[error("upload session {id} is at offset {actual}, not {expected}")]
    OffsetMismatch {
        id: String,
        expected: u64,
        actual: u64,
    },
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
    #[error("object store {op} on {key}: {message}")]
    S3 {
        op: &'static str,
        key: String,
        message: String,
        /// The store could not be reached or was overloaded, rather than refusing the request.
        unavailable: bool,
    },
    /// The operation needs something an operator has to set up first (the message says what).
    #[error("{0}")]
    NotReady(String),
}

impl StorageError {
    pub(crate) fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        StorageError::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }

    /// Whether the backend is unreachable (the client should retry later) rather than broken.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StorageError::Database(e) => matches!(
                e,
                sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed | sqlx::Error::Io(_)
            ),
            StorageError::Io { source, .. } => matches!(
                source.kind(),
                std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
            ),
            StorageError::S3 { unavailable, .. } => *unavailable,
            _ => false,
        }
    }
}

/// The check [`MetadataStore::commit_blob`] runs while it holds the blob's row.
pub fn stored_check(
    blobs: &std::sync::Arc<dyn BlobStore>,
    digest: &vial_core::Digest,
) -> StoredCheck {
    let (blobs, digest) = (std::sync::Arc::clone(blobs), digest.clone());
    Box::pin(async move { Ok(blobs.stat(&digest).await?.is_some()) })
}

/// Streams a blob, or a range of it, from wherever its bytes are: stored whole under its own
/// digest, or as a range of another stored blob (`location.source`, a chunk of a sealed layer).
pub async fn read_located(
    blobs: &dyn BlobStore,
    digest: &vial_core::Digest,
    location: &BlobLocation,
    range: Option<ByteRange>,
) -> Result<Option<ByteStream>, StorageError> {
    let Some((source, offset)) = &location.source else {
        return blobs.read(digest, range).await;
    };
    let r = range.unwrap_or(ByteRange {
        start: 0,
        end: location.size,
    });
    let within = ByteRange {
        start: offset + r.start,
        end: offset + r.end,
    };
    match source {
        Source::Blob(source) => blobs.read(source, Some(within)).await,
        Source::Pack(pack) => blobs.read_pack(pack, within).await,
    }
}

/// Current time as Unix milliseconds, the timestamp format of every metadata table.
pub(crate) fn now_millis() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
