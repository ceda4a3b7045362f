//! The Distribution API of a registry that stores: the tier over [`AppState`] hands each request
//! that passed the entrance ([`crate::v2`]) to one handler module per resource.

mod blobs;
pub(crate) mod bodies;
mod listing;
mod manifests;
mod packs;
mod sync;
mod uploads;
mod vial;

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};

use crate::error::{ApiError, ErrorCode};
use crate::http::Request;
use crate::route::{self, Endpoint};
use crate::state::{AppState, Entrance};

/// The tier behind the entrance in a registry that stores.
impl crate::v2::Tier for AppState {
    fn entrance(&self) -> &Entrance {
        &self.entrance
    }

    async fn handle(
        state: Arc<AppState>,
        endpoint: Endpoint,
        req: Request,
        body: Body,
    ) -> Result<Response, ApiError> {
        handle(&state, endpoint, req, body).await
    }
}

async fn handle(
    state: &Arc<AppState>,
    endpoint: Endpoint,
    req: Request,
    body: Body,
) -> Result<Response, ApiError> {
    match (endpoint, req.method.clone()) {
        (Endpoint::Base, Method::GET | Method::HEAD) => Ok(StatusCode::OK.into_response()),
        (Endpoint::Catalog, Method::GET) => listing::catalog(state, &req).await,
        (Endpoint::Gc, Method::POST) => {
            may_collect(state, &req)?;
            let dry_run = matches!(req.query.get("dry-run"), Some("true" | "1"));
            vial::gc(state, dry_run, req.query.get("wait")).await
        }
        (Endpoint::GcJob(id), Method::GET) => {
            may_collect(state, &req)?;
            vial::gc_status(state, &id, req.query.get("wait")).await
        }
        (Endpoint::TagsList(repo), Method::GET) => listing::tags(state, &repo, &req).await,
        (Endpoint::Referrers(repo, digest), Method::GET) => {
            listing::referrers(state, &repo, &digest, &req).await
        }
        (Endpoint::Manifest(repo, target), Method::GET | Method::HEAD) => {
            manifests::get(state, &repo, &target, &req).await
        }
        (Endpoint::BadManifestReference(repo, reference), Method::GET | Method::HEAD) => {
            Err(ApiError::not_found(
                ErrorCode::ManifestUnknown,
                format!(
                    "{reference:?} is neither a tag nor a digest: it names no manifest in {repo}"
                ),
            ))
        }
        (Endpoint::BadManifestReference(_, reference), Method::PUT | Method::DELETE) => {
            Err(route::parse_target(&reference).err().unwrap_or_else(|| {
                ApiError::bad_request(ErrorCode::TagInvalid, "invalid reference")
            }))
        }
        (Endpoint::Manifest(repo, target), Method::PUT) => {
            manifests::put(state, &repo, &target, &req, body).await
        }
        (Endpoint::Manifest(repo, target), Method::DELETE) => {
            manifests::delete(state, &repo, &target, req.subject.as_deref()).await
        }
        (Endpoint::Blob(repo, digest), Method::GET | Method::HEAD) => {
            blobs::get(state, &repo, &digest, &req).await
        }
        (Endpoint::Blob(repo, digest), Method::DELETE) => {
            blobs::delete(state, &repo, &digest).await
        }
        (Endpoint::UploadStart(repo), Method::POST) => {
            uploads::start(state, &repo, &req, body).await
        }
        (Endpoint::Upload(repo, id), Method::GET) => uploads::status(state, &repo, &id).await,
        (Endpoint::Upload(repo, id), Method::PATCH) => {
            uploads::patch(state, &repo, &id, &req, body).await
        }
        (Endpoint::Upload(repo, id), Method::PUT) => {
            uploads::finish(state, &repo, &id, &req, body).await
        }
        (Endpoint::Upload(repo, id), Method::DELETE) => uploads::cancel(state, &repo, &id).await,
        (Endpoint::BlobsPresent(repo), Method::POST) => {
            vial::blobs_present(state, &repo, body, req.presence).await
        }
        (Endpoint::Packs(repo), Method::POST) => packs::upload(state, &repo, &req, body).await,
        (Endpoint::Chunks(repo), Method::POST) => packs::read(state, &repo, body).await,
        (Endpoint::Versions(repo), Method::GET) => {
            let deleted = matches!(req.query.get("deleted"), Some("true" | "1"));
            vial::versions(state, &repo, deleted).await
        }
        (Endpoint::Restore(repo, digest), Method::POST) => {
            let tags = matches!(req.query.get("tags"), Some("true" | "1"));
            vial::restore(state, &repo, &digest, tags).await
        }
        (Endpoint::TagHistory(repo, tag), Method::GET) => {
            vial::tag_history(state, &repo, &tag).await
        }
        (Endpoint::TagWatch(repo, tag), Method::GET | Method::HEAD) => {
            vial::tag_watch(state, state.tag_watch(), &repo, &tag, &req).await
        }
        (Endpoint::Leases(repo, digest), Method::GET) => vial::leases(state, &repo, &digest).await,
        (Endpoint::Leases(repo, digest), Method::PUT | Method::DELETE) => {
            vial::lease_change(state, &repo, &digest, &req, body).await
        }
        (Endpoint::Seal(repo, digest), Method::POST) => {
            vial::seal_start(state, &repo, &digest).await
        }
        (Endpoint::Seal(repo, digest), Method::GET) => {
            vial::seal_status(state, &repo, &digest, req.query.get("wait")).await
        }
        (Endpoint::Syncs(repo), Method::POST) => {
            sync::sync_start(state, &repo, req.subject.as_deref(), body).await
        }
        (Endpoint::Syncs(repo), Method::GET) => sync::sync_list(state, &repo).await,
        (Endpoint::Sync(repo, id), Method::GET) => {
            sync::sync_status(state, &repo, &id, req.query.get("wait")).await
        }
        (Endpoint::Sync(repo, id), Method::DELETE) => {
            sync::sync_cancel(state, &repo, &id, req.subject.as_deref()).await
        }
        (endpoint, method) => Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::Unsupported,
            format!(
                "{method} is not supported on the {} endpoint",
                endpoint.label()
            ),
        )),
    }
}

/// Garbage collection is for whoever may delete in every repository (anyone, without auth).
fn may_collect(state: &AppState, req: &Request) -> Result<(), ApiError> {
    if let (Some(auth), Some(subject)) = (&state.entrance.auth, &req.subject) {
        if !auth.may_delete_everything(subject) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                ErrorCode::Denied,
                format!(
                    "{subject} may not run garbage collection: it needs delete on every repository"
                ),
            ));
        }
    }
    Ok(())
}
