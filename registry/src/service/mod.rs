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
pub mod gc;
pub(crate) mod publish;
mod sessions;
pub(crate) mod upkeep;

use std::sync::Arc;

use tokio::sync::Notify;

pub(crate) use sessions::{HashState, Sessions};

use crate::config::Config;
use crate::metrics::Metrics;
use crate::storage::{BlobStore, MetadataStore};

/// What the registry's work shares below HTTP: the two stores and the protocols over them, the
/// configuration, and this process's own bookkeeping of that work.
#[derive(Debug)]
pub struct Service {
    pub(crate) meta: Arc<dyn MetadataStore>,
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
