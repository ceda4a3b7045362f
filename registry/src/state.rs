//! What every handler, job and background task of one registry process shares: the stores,
//! the configuration and the process's own bookkeeping (upload sessions, metrics, the job queue's
//! wake-ups, the cache tier when this process is one).

use std::sync::Arc;

use tokio::sync::Notify;

use crate::config::Config;
use crate::storage::{self, BlobStore, MetadataStore, StorageError};
use crate::{auth, cache, front, metrics, watch};

/// Shared state of every request handler.
#[derive(Debug)]
pub struct AppState {
    pub(crate) meta: Arc<dyn MetadataStore>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    pub(crate) config: Config,
    pub(crate) sessions: crate::api::sessions::Sessions,
    pub(crate) metrics: Arc<metrics::Metrics>,
    pub(crate) auth: Option<auth::Auth>,
    pub(crate) jobs: JobQueue,
    /// Garbage collection passes in this process take turns.
    pub(crate) gc_turn: tokio::sync::Mutex<()>,
    pub(crate) gc_metrics: crate::gc::report::GcMetrics,
    /// Upload requests in flight per client address, against `Limits::max_uploads_per_client`.
    pub(crate) upload_slots: Arc<front::UploadSlots>,
    /// Set when this server is a cache of another registry (`--upstream`).
    pub(crate) cache: Option<Arc<cache::Cache>>,
    /// Requests waiting for tags to move, started by the first of them.
    pub(crate) tag_watch: std::sync::OnceLock<Arc<watch::TagWatch>>,
}

impl AppState {
    /// The tag watch hub, started on first use (inside the runtime).
    pub(crate) fn tag_watch(&self) -> &Arc<watch::TagWatch> {
        self.tag_watch
            .get_or_init(|| watch::TagWatch::start(Arc::clone(&self.meta)))
    }
}

impl AppState {
    /// Records a blob whose verified bytes the blob store now holds and links it to `repo`.
    pub(crate) async fn commit_stored_blob(
        &self,
        repo: &vial_core::RepoName,
        digest: &vial_core::Digest,
        size: u64,
    ) -> Result<(), StorageError> {
        let check = storage::stored_check(&self.blobs, digest);
        self.meta.commit_blob(repo, digest, size, check).await
    }
}

/// Wakes the runner when a job is queued in this process, and waiters when one finishes here.
#[derive(Debug, Default)]
pub struct JobQueue {
    pub(crate) wake: Notify,
    pub(crate) finished: Notify,
}

impl JobQueue {
    pub fn wake(&self) {
        self.wake.notify_one();
    }

    /// Resolves when a job this process runs next records its outcome.
    pub fn finished(&self) -> tokio::sync::futures::Notified<'_> {
        self.finished.notified()
    }
}
