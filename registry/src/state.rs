//! What request handlers share. Two routers stand behind the entrance ([`crate::v2`]), one per
//! kind of process: the API of a registry that stores, over [`AppState`], and the cache tier,
//! over its own state in `cache/`, which opens no store. Both carry an [`Entrance`]: what the
//! entrance itself needs, whichever router answers.

use std::ops::Deref;
use std::sync::Arc;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::service::Service;
use crate::{auth, front, watch};

/// What the entrance keeps for every router: the configuration, authentication, the upload cap
/// per client and the request counters.
#[derive(Debug)]
pub struct Entrance {
    pub(crate) config: Arc<Config>,
    pub(crate) auth: Option<Arc<auth::Auth>>,
    /// Upload requests in flight per client address, against `Limits::max_uploads_per_client`.
    pub(crate) upload_slots: Arc<front::UploadSlots>,
    pub(crate) metrics: Arc<Metrics>,
}

impl Entrance {
    pub(crate) fn new(
        config: Arc<Config>,
        metrics: Arc<Metrics>,
    ) -> Result<Entrance, auth::AuthConfigError> {
        Ok(Entrance {
            auth: config
                .auth
                .clone()
                .map(auth::Auth::load)
                .transpose()?
                .map(Arc::new),
            config,
            upload_slots: Arc::default(),
            metrics,
        })
    }
}

/// The state of the API's router. Its entry (`api/mod.rs`, `ui/mod.rs`) takes it apart: a handler
/// is handed the [`Service`] (which this reads as, so `&state` passes for one) and whatever else
/// it uses of the fields below.
#[derive(Debug)]
pub struct AppState {
    pub(crate) entrance: Entrance,
    pub(crate) service: Arc<Service>,
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
        self.tag_watch.get_or_init(|| {
            // The hub reads tags only: it is handed that facade of the store.
            watch::TagWatch::start(self.service.tag_feed())
        })
    }
}
