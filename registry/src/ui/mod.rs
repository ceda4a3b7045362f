//! The web UI at `/ui/`: server-rendered pages (maud) over the metadata and blob stores, for
//! volumes, versions, tags, diffs, jobs and storage. Read-only; a little inline JavaScript copies
//! digests, and nothing else needs it.
//!
//! The UI obeys the registry's `[auth]` rules: a visitor who has not signed in sees what anonymous
//! may pull; signing in (`/ui/login`) sets a session cookie holding a short-lived token, and every
//! page, list, search and count shows only repositories its holder may pull.
//!
//! Parse, then handle: [`parse`] turns a path under `/ui/` into a [`Page`] first. Repository names
//! contain `/`, so a repository's own pages sit after `/-/` (no name component can be `-`).

mod admin;
mod browse;
mod data;
mod layout;
mod request;
mod session;
mod version;

use std::sync::Arc;

use axum::extract::{ConnectInfo, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Redirect, Response};
use maud::{html, Markup};
use vial_core::{Digest, RepoName, Tag};

use crate::error::ApiError;
use crate::front::ClientAddr;
use crate::state::AppState;
use layout::html_response;
pub(crate) use request::Viewer;

/// A page of the UI.
#[derive(Debug, PartialEq, Eq)]
enum Page {
    Home,
    Repository(RepoName),
    Version(RepoName, Digest),
    Compare(RepoName),
    TagHistory(RepoName, Tag),
    Jobs,
    Storage,
    Login,
}

/// Turns the path after `/ui` into a page.
fn parse(path: &str) -> Option<Page> {
    let rest = path.strip_prefix("/ui")?;
    match rest {
        "" | "/" => return Some(Page::Home),
        "/jobs" => return Some(Page::Jobs),
        "/storage" => return Some(Page::Storage),
        "/login" => return Some(Page::Login),
        _ => {}
    }
    let rest = rest.strip_prefix("/r/")?;
    let (name, sub) = match rest.split_once("/-/") {
        Some((name, sub)) => (name, Some(sub)),
        None => (rest.trim_end_matches('/'), None),
    };
    let repo = RepoName::parse(name).ok()?;
    Some(match sub.map(|s| s.split_once('/').unwrap_or((s, ""))) {
        None => Page::Repository(repo),
        Some(("v", digest)) => Page::Version(repo, Digest::parse(digest).ok()?),
        Some(("compare", "")) => Page::Compare(repo),
        Some(("tags", tag)) => Page::TagHistory(repo, Tag::parse(tag).ok()?),
        Some(_) => return None,
    })
}

/// `GET /`: to the UI.
pub(crate) async fn root() -> Redirect {
    Redirect::to("/ui/")
}

/// Every `GET` and `POST` under `/ui`.
pub(crate) async fn handle(
    State(state): State<Arc<AppState>>,
    ConnectInfo(client): ConnectInfo<ClientAddr>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if uri.path() == "/ui/logout" && method == Method::POST {
        return session::sign_out(&state);
    }
    let Some(page) = parse(uri.path()) else {
        let viewer = session::viewer(&state, &headers);
        return error_page(&viewer, StatusCode::NOT_FOUND, "There is no such page.");
    };
    match (method, &page) {
        (Method::POST, Page::Login) => {
            return session::sign_in(&state, client, &body).await;
        }
        (Method::GET, Page::Login) => return session::form(&state, None),
        (Method::GET | Method::HEAD, _) => {}
        _ => {
            return (StatusCode::METHOD_NOT_ALLOWED, "the UI only shows things").into_response();
        }
    }
    let viewer = session::viewer(&state, &headers);
    let query = uri.query().unwrap_or("");
    let result = match page {
        Page::Home => browse::home(&state, &viewer, query).await,
        Page::Repository(repo) => browse::repository(&state, &viewer, &repo, query).await,
        Page::Version(repo, digest) => version::version(&state, &viewer, &repo, &digest).await,
        Page::Compare(repo) => version::compare(&state, &viewer, &repo, query).await,
        Page::TagHistory(repo, tag) => browse::tag_history(&state, &viewer, &repo, &tag).await,
        Page::Jobs => admin::jobs(&state, &viewer).await,
        Page::Storage => admin::storage(&state, &viewer).await,
        Page::Login => unreachable_login(),
    };
    match result {
        Ok(markup) => html_response(StatusCode::OK, markup),
        Err(e) => {
            let status = e.status;
            if status.is_server_error() {
                tracing::warn!(error = %e.message, "UI page failed");
            }
            // A repository the viewer may not pull is answered exactly like one that does not
            // exist: the page says nothing of what is private.
            let message = if status == StatusCode::NOT_FOUND || status == StatusCode::FORBIDDEN {
                "Nothing here: it does not exist, or you may not see it.".to_owned()
            } else if status.is_server_error() {
                "Something went wrong; the registry's log says what.".to_owned()
            } else {
                e.message.clone()
            };
            let status = if status == StatusCode::FORBIDDEN {
                StatusCode::NOT_FOUND
            } else {
                status
            };
            error_page(&viewer, status, &message)
        }
    }
}

/// The login page is answered before the others; this arm cannot be reached.
fn unreachable_login() -> Result<Markup, ApiError> {
    Err(ApiError::not_found(
        crate::error::ErrorCode::Unsupported,
        "no such page",
    ))
}

fn error_page(viewer: &Viewer, status: StatusCode, message: &str) -> Response {
    let markup = layout::page(
        status.canonical_reason().unwrap_or("Error"),
        viewer,
        None,
        html! {
            h1 { (status.as_u16()) " " (status.canonical_reason().unwrap_or("")) }
            p.error { (message) }
            p { a href="/ui/" { "Back to the volumes" } }
        },
    );
    html_response(status, markup)
}

#[cfg(test)]
mod tests {
    use super::layout::repo_url;
    use super::*;

    #[test]
    fn paths_become_pages_with_names_of_any_depth() {
        let repo = |s: &str| RepoName::parse(s).unwrap();
        let d = "sha256:".to_owned() + &"ab".repeat(32);
        assert_eq!(parse("/ui/"), Some(Page::Home));
        assert_eq!(parse("/ui"), Some(Page::Home));
        assert_eq!(parse("/ui/r/a/b/c"), Some(Page::Repository(repo("a/b/c"))));
        assert_eq!(
            parse(&format!("/ui/r/weights/m/-/v/{d}")),
            Some(Page::Version(repo("weights/m"), Digest::parse(&d).unwrap()))
        );
        assert_eq!(
            parse("/ui/r/weights/m/-/tags/prod"),
            Some(Page::TagHistory(
                repo("weights/m"),
                Tag::parse("prod").unwrap()
            ))
        );
        assert_eq!(
            parse("/ui/r/weights/m/-/compare"),
            Some(Page::Compare(repo("weights/m")))
        );
        assert_eq!(parse("/ui/r/weights/m/-/v/nonsense"), None);
        assert_eq!(parse("/ui/r/Bad Name"), None);
        assert_eq!(parse("/ui/elsewhere"), None);
        assert_eq!(repo_url(&repo("a/b"), "compare"), "/ui/r/a/b/-/compare");
    }
}
