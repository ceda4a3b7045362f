//! What a page request brings with it: who is asking, which repositories they may see, and its
//! query parameters.

use vial_core::RepoName;

use std::sync::Arc;

use crate::auth::{Action, Auth};
use crate::error::ApiError;

/// Who is looking: `subject` once signed in; `rules`, the registry's authentication, when it
/// checks credentials at all; `host` is how clients name this registry in references (for the
/// pinned references to copy). A page asks the viewer what it may see, so the pages need nothing
/// of the router's state but the service.
#[derive(Debug, Clone)]
pub(crate) struct Viewer {
    pub subject: Option<String>,
    pub rules: Option<Arc<Auth>>,
    pub host: String,
}

impl Viewer {
    /// Whether the registry asks for credentials (so a page offers to sign in).
    pub(crate) fn signs_in(&self) -> bool {
        self.rules.is_some()
    }

    /// Whether this viewer may see `repo`: whether its pulls would be allowed.
    pub(crate) fn may_pull(&self, repo: &str) -> bool {
        match &self.rules {
            None => true,
            Some(auth) => auth.allows(self.subject.as_deref(), repo, Action::Pull),
        }
    }

    /// Whether this viewer may see registry-wide figures (storage, every job): only someone who
    /// may pull from every repository, since counts over all of them say something of each.
    pub(crate) fn sees_everything(&self) -> bool {
        self.may_pull("*")
    }
}

/// The repository, if `viewer` may see it; otherwise the same answer as for one that does not
/// exist.
pub(super) fn visible(viewer: &Viewer, repo: &RepoName) -> Result<(), ApiError> {
    if viewer.may_pull(repo.as_str()) {
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
