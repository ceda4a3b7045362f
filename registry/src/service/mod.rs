//! The service floor: the registry below its routers. The API and the web UI call it; so does the
//! background work (the job runner and what it runs, the janitor, garbage collection). A cache
//! has none of it: it keeps nothing in these stores and does not open them. The service never
//! knows HTTP, and nothing in it imports a router or `AppState`.
//!
//! # Who may call the stores directly
//! A call that touches one store once is atomic by itself, and any caller may make it: a
//! manifest read, a tag move, listing jobs, appending a chunk to an upload session or marking the
//! session as touched (neither order of those two matters to a crash). An operation whose steps
//! write **both** stores in an order that matters is a protocol, and it lives here, written once,
//! because that order is what keeps a crash at any moment harmless. `tests/architecture.rs`
//! fails if one of those writes appears anywhere else. The protocols, all of one shape (bytes
//! before the row that names them; a row that names no bytes yet is one the janitor can find):
//!
//! - **Put a blob** ([`Service::put_blob`], [`Service::put_streamed_blob`],
//!   [`Service::commit_stored_blob`]): the blob store publishes verified bytes, then the metadata
//!   store links them to a repository, checking under the blob's row lock that the bytes are
//!   still there (a collection may have removed them in between). A crash after the bytes leaves
//!   bytes no row names: nothing reads them, and a later push of the same blob adopts them
//!   (docs/gc.md, "Safety").
//! - **Store a pack** ([`Service::store_pack`]): a row for the pack first, then its bytes, then
//!   one commit that makes every chunk in it a blob. A crash before the commit leaves a row the
//!   janitor finds ([`upkeep`]) and removes, bytes first ([`Service::remove_pack`]).
//! - **Open an upload** ([`Service::open_upload`]): the session's row first, then its place in
//!   the blob store, so the janitor can always find what a crash left.
//! - **Commit an upload** ([`Service::publish_upload`]): the blob store moves the session's
//!   verified bytes into place, the blob is linked, and only then the session row goes. A crash
//!   in between leaves a session the janitor discards ([`Service::discard_upload`]).
//! - **Publish a volume** ([`publish`]): blobs first, then manifests bottom-up, the index last
//!   with its tags, so a reader never sees a manifest whose content is not all there.
//! - **Purge and collect** ([`upkeep`], [`gc`]): a deleted version past its retention window
//!   leaves in one transaction; garbage bytes go before their rows, under the rows' locks
//!   (docs/gc.md argues why that is safe beside live pushes).

mod blobs;
pub(crate) mod blocking;
pub mod gc;
mod packs;
pub(crate) mod publish;
mod reads;
mod sessions;
pub(crate) mod upkeep;

use std::sync::Arc;

use tokio::sync::Notify;

pub(crate) use packs::ChunkCheck;
pub(crate) use reads::plan;
pub(crate) use sessions::{HashState, Sessions};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::storage::{
    BlobMeta, BlobStore, JobMeta, LeaseMeta, ManifestMeta, MetadataStore, SealMeta, StorageError,
    TagMeta, UploadMeta,
};

/// What the registry's work shares below HTTP: the two stores and the protocols over them, the
/// configuration, and this process's own bookkeeping of that work.
///
/// The whole metadata store is seen only here, in `service/`. Everyone else reads and writes it
/// through one of its facades, each the size of a use: [`Service::manifests`],
/// [`Service::tags`], [`Service::blob_rows`], [`Service::upload_rows`], [`Service::job_rows`],
/// [`Service::leases`] and [`Service::seal_cache`]. A caller names the part it uses; the
/// writes that must follow a protocol are kept to this module by `tests/architecture.rs`.
#[derive(Debug)]
pub struct Service {
    meta: Arc<dyn MetadataStore>,
    pub(crate) blobs: Arc<dyn BlobStore>,
    pub(crate) config: Arc<Config>,
    pub(crate) metrics: Arc<Metrics>,
    /// Upload sessions this process has seen: a lock each, and the running digest.
    pub(crate) sessions: Sessions,
    pub(crate) jobs: JobQueue,
    /// Garbage collection passes in this process take turns.
    pub(crate) gc_turn: tokio::sync::Mutex<()>,
    pub(crate) gc_metrics: gc::report::GcMetrics,
}

impl Service {
    pub(crate) fn new(
        config: Arc<Config>,
        metrics: Arc<Metrics>,
        meta: Arc<dyn MetadataStore>,
        blobs: Arc<dyn BlobStore>,
    ) -> Service {
        Service {
            meta,
            blobs,
            config,
            metrics,
            sessions: Sessions::default(),
            jobs: JobQueue::default(),
            gc_turn: tokio::sync::Mutex::new(()),
            gc_metrics: gc::report::GcMetrics::default(),
        }
    }
}

/// The facades of the metadata store.
impl Service {
    /// Versions (manifests) of repositories: read, commit, delete, restore, list, referrers.
    pub(crate) fn manifests(&self) -> &dyn ManifestMeta {
        &*self.meta
    }

    /// Tags: where they point, their history and expiry, and the feed of their moves.
    pub(crate) fn tags(&self) -> &dyn TagMeta {
        &*self.meta
    }

    /// The same, held: for a task that outlives the request that starts it (the tag watch).
    pub(crate) fn tag_feed(&self) -> Arc<dyn TagMeta> {
        self.meta.clone()
    }

    /// Which blobs exist, where their bytes are, and which repositories they are linked to.
    pub(crate) fn blob_rows(&self) -> &dyn BlobMeta {
        &*self.meta
    }

    /// Upload sessions' rows.
    pub(crate) fn upload_rows(&self) -> &dyn UploadMeta {
        &*self.meta
    }

    /// The durable job queue: sync, seal and collection jobs, their files and progress.
    pub(crate) fn job_rows(&self) -> &dyn JobMeta {
        &*self.meta
    }

    /// Leases: nodes that say they have a version mounted.
    pub(crate) fn leases(&self) -> &dyn LeaseMeta {
        &*self.meta
    }

    /// What sealing has learnt about layers, so a layer is sealed once.
    pub(crate) fn seal_cache(&self) -> &dyn SealMeta {
        &*self.meta
    }

    /// Whether each store answers: the metadata store's result, then the blob store's.
    pub(crate) async fn ping(&self) -> (Result<(), StorageError>, Result<(), StorageError>) {
        tokio::join!(self.meta.ping(), self.blobs.ping())
    }
}

/// Wakes the runner when a job is queued in this process, and waiters when one finishes here.
#[derive(Debug, Default)]
pub struct JobQueue {
    pub(crate) wake: Notify,
    pub(crate) finished: Notify,
    /// Reads jobs run on blocking threads: a shutdown stops them and waits for them.
    pub(crate) readers: Arc<blocking::Readers>,
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
