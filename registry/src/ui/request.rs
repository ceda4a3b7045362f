//! What a page request brings with it: who is asking, which repositories they may see, and its
//! query parameters.

use vial_core::RepoName;

use crate::auth::Action;
use crate::error::ApiError;
use crate::state::AppState;

/// Who is looking: `subject` once signed in; `auth` when the registry checks credentials at all;
/// `host` is how clients name this registry in references (for the pinned references to copy).
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    pub subject: Option<String>,
    pub auth: bool,
    pub host: String,
}

impl AppState {
    /// Whether `viewer` may see `repo`: whether its pulls would be allowed.
    pub(crate) fn ui_may_pull(&self, viewer: &Viewer, repo: &str) -> bool {
        match &self.entrance.auth {
            None => true,
            Some(auth) => auth.allows(viewer.subject.as_deref(), repo, Action::Pull),
        }
    }

    /// Whether `viewer` may see registry-wide figures (storage, every job): only someone who may
    /// pull from every repository, since counts over all of them say something of each.
    pub(crate) fn ui_sees_everything(&self, viewer: &Viewer) -> bool {
        match &self.entrance.auth {
            None => true,
            Some(auth) => auth.allows(viewer.subject.as_deref(), "*", Action::Pull),
        }
    }
}

/// The repository, if `viewer` may see it; otherwise the same answer as for one that does not
/// exist.
pub(super) fn visible(state: &AppState, viewer: &Viewer, repo: &RepoName) -> Result<(), ApiError> {
    if state.ui_may_pull(viewer, repo.as_str()) {
        Ok(())
    } else {
        Err(ApiError::not_found(
            crate::error::ErrorCode::NameUnknown,
            "not visible",
        ))
    }
}

/// A query parameter, decoded.
pub(super) fn query_param(query: &str, key: &str) -> Option<String> {
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.into_owned())
}

/// `?page=N`, from 0.
pub(super) fn page_number(query: &str) -> usize {
    query_param(query, "page")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0)
        .min(1_000_000)
}
