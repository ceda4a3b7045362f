//! What every request handler of one registry process shares: the [`Service`] below them (the
//! stores and the work over them), and what only the HTTP side keeps: authentication, the upload
//! cap per client, the cache tier when this process is one, and the requests waiting for tags.

use std::ops::Deref;
use std::sync::Arc;

use crate::service::Service;
use crate::{auth, cache, front, watch};

/// Shared state of every request handler. It reads as the [`Service`] it holds (`state.meta`,
/// `state.config`), plus the fields below.
#[derive(Debug)]
pub struct AppState {
    pub(crate) service: Arc<Service>,
    pub(crate) auth: Option<auth::Auth>,
    /// Upload requests in flight per client address, against `Limits::max_uploads_per_client`.
    pub(crate) upload_slots: Arc<front::UploadSlots>,
    /// Set when this server is a cache of another registry (`--upstream`).
    pub(crate) cache: Option<Arc<cache::Cache>>,
    /// Requests waiting for tags to move, started by the first of them.
    pub(crate) tag_watch: std::sync::OnceLock<Arc<watch::TagWatch>>,
}

impl Deref for AppState {
    type Target = Service;

    fn deref(&self) -> &Service {
        &self.service
    }
}

impl AppState {
    /// The tag watch hub, started on first use (inside the runtime).
    pub(crate) fn tag_watch(&self) -> &Arc<watch::TagWatch> {
        self.tag_watch
            .get_or_init(|| watch::TagWatch::start(Arc::clone(&self.service.meta)))
    }
}
