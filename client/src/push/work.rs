//! What the stages of a push hand one another.

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use bytes::Bytes;
use vial_core::volume::ChunkRef;
use vial_core::Digest;

use crate::chunker::FileChunk;
use crate::scan::Stamp;

/// A file to push, as the scan found it.
pub(super) struct FileJob {
    pub(super) path: String,
    pub(super) abs: Arc<PathBuf>,
    pub(super) mode: u32,
    pub(super) stamp: Stamp,
    /// Chunks known from the local index; `None` means the file must be read.
    pub(super) cached: Option<Vec<ChunkRef>>,
}

/// A chunk to check and perhaps upload, with where its bytes are.
#[derive(Clone)]
pub(super) struct ChunkLoc {
    pub(super) digest: Digest,
    pub(super) abs: Arc<PathBuf>,
    pub(super) offset: u64,
    pub(super) len: u64,
    /// The bytes, as the hashers read them (`None` for files the local index vouched for: read
    /// again if they must be uploaded).
    pub(super) bytes: Option<Bytes>,
}

/// What the hashers hand on: a file, a segment of it, and the next chunks cut from it.
pub(super) type Hashed = (usize, usize, Vec<(FileChunk, Option<Bytes>)>);

/// What the stages count, for the report.
#[derive(Default)]
pub(super) struct Stats {
    pub(super) uploaded: AtomicU64,
    pub(super) bytes_uploaded: AtomicU64,
    pub(super) reused: AtomicU64,
    pub(super) bytes_reused: AtomicU64,
    pub(super) bytes_read: AtomicU64,
}
