//! vial's extensions to the Distribution API, under `/v2/<name>/_vial/…`. Clients use them when
//! present and fall back to plain OCI calls when a registry answers 404.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use vial_core::manifest::ImageManifest;
use vial_core::volume::VOLUME_ARTIFACT_TYPE;
use vial_core::{Digest, RepoName};

use super::set_header;
use crate::error::{ApiError, ErrorCode};
use crate::seal::SEAL_JOB;
use crate::storage::{Job, JobState};
use crate::AppState;

/// Most digests one existence check may ask about.
pub const MAX_PRESENT_DIGESTS: usize = 4096;
/// Generous room for 4096 digests of any supported algorithm in JSON.
const MAX_PRESENT_BODY: usize = 1024 * 1024;

#[derive(Deserialize)]
struct PresentRequest {
    digests: Vec<Digest>,
}

#[derive(Serialize)]
struct PresentResponse {
    present: Vec<Digest>,
}

/// `POST /v2/<name>/_vial/blobs/present` with `{"digests": [...]}`: which of these blobs the
/// repository holds, linking blobs the registry holds elsewhere, so one request replaces thousands
/// of HEADs and cross-repository mounts.
///
/// Linking from other repositories is a bulk cross-repository mount, so with authentication on it
/// happens only for callers that may pull from every repository; others learn only what this
/// repository already holds, and upload the rest.
pub(super) async fn blobs_present(
    state: &AppState,
    repo: &RepoName,
    body: axum::body::Body,
    across_repositories: bool,
) -> Result<Response, ApiError> {
    let mut stream = body.into_data_stream();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(ErrorCode::Unsupported, format!("request body failed: {e}"))
        })?;
        if bytes.len() + chunk.len() > MAX_PRESENT_BODY {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::SizeInvalid,
                "existence check body is too large",
            ));
        }
        bytes.extend_from_slice(&chunk);
    }
    let request: PresentRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(
            ErrorCode::DigestInvalid,
            format!("expected {{\"digests\": [...]}} with valid digests: {e}"),
        )
    })?;
    if request.digests.len() > MAX_PRESENT_DIGESTS {
        return Err(ApiError::bad_request(
            ErrorCode::SizeInvalid,
            format!(
                "at most {MAX_PRESENT_DIGESTS} digests per request, got {}",
                request.digests.len()
            ),
        ));
    }
    let present = state
        .meta
        .link_present_blobs(repo, &request.digests, across_repositories)
        .await?;
    let body = serde_json::to_vec(&PresentResponse { present }).unwrap_or_default();
    let mut r = (StatusCode::OK, body).into_response();
    set_header(&mut r, "content-type", "application/json");
    Ok(r)
}

#[derive(Serialize)]
struct Version<'a> {
    digest: &'a Digest,
    created_at: String,
    tags: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<&'a std::collections::BTreeMap<String, String>>,
}

/// `GET /v2/<name>/_vial/versions`: every sealed volume version of the repository, newest first.
pub(super) async fn versions(state: &AppState, repo: &RepoName) -> Result<Response, ApiError> {
    let rows = state
        .meta
        .list_versions(repo, VOLUME_ARTIFACT_TYPE)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                ErrorCode::NameUnknown,
                format!("repository {repo} is not known"),
            )
        })?;
    let versions: Vec<Version> = rows
        .iter()
        .map(|r| Version {
            digest: &r.digest,
            created_at: humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH
                    + std::time::Duration::from_millis(r.created_at.max(0) as u64),
            )
            .to_string(),
            tags: &r.tags,
            annotations: r.annotations.as_ref(),
        })
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({ "name": repo, "versions": versions }))
        .unwrap_or_default();
    let mut r = (StatusCode::OK, body).into_response();
    set_header(&mut r, "content-type", "application/json");
    Ok(r)
}

/// A seal job as clients see it.
#[derive(Serialize)]
struct SealStatus<'a> {
    subject: &'a str,
    state: JobState,
    #[serde(skip_serializing_if = "Option::is_none")]
    volume: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    attempts: i64,
}

fn seal_response(status: StatusCode, job: &Job) -> Response {
    let body = serde_json::to_vec(&SealStatus {
        subject: &job.target,
        state: job.state,
        volume: job.result.as_deref(),
        error: job.error.as_deref(),
        attempts: job.attempts,
    })
    .unwrap_or_default();
    let mut r = (status, body).into_response();
    set_header(&mut r, "content-type", "application/json");
    r
}

/// `POST /v2/<name>/_vial/seal/<digest>`: queue a seal of the artifact (again, if it failed), and
/// answer 202 with the job's state, or 200 once it is done.
pub(super) async fn seal_start(
    state: &AppState,
    repo: &RepoName,
    digest: &Digest,
) -> Result<Response, ApiError> {
    if state
        .meta
        .get_manifest(repo, &vial_core::Target::Digest(digest.clone()))
        .await?
        .is_none()
    {
        return Err(ApiError::not_found(
            ErrorCode::ManifestUnknown,
            format!("manifest {digest} is not in {repo}"),
        ));
    }
    let job = state
        .meta
        .enqueue_job(SEAL_JOB, repo, digest.as_str(), true)
        .await?;
    if job.state == JobState::Done {
        return Ok(seal_response(StatusCode::OK, &job));
    }
    if !state.config.run_jobs {
        tracing::info!(%repo, %digest, "seal queued for a replica that runs jobs");
    }
    state.jobs.wake();
    Ok(seal_response(StatusCode::ACCEPTED, &job))
}

/// Longest `?wait=` a seal status request may hold.
const MAX_SEAL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How often a waiting status request looks again for a job another replica runs.
const SEAL_RECHECK: std::time::Duration = std::time::Duration::from_millis(500);

/// `GET /v2/<name>/_vial/seal/<digest>[?wait=SECONDS]`: where the artifact's seal job is. With
/// `wait`, an unfinished job is answered once it finishes or the wait (at most 30 s) ends, so a
/// client learns of the outcome at once without polling fast.
pub(super) async fn seal_status(
    state: &AppState,
    repo: &RepoName,
    digest: &Digest,
    wait: Option<&str>,
) -> Result<Response, ApiError> {
    let wait = wait
        .and_then(|w| w.parse::<f64>().ok())
        .filter(|w| w.is_finite() && *w > 0.0)
        .map_or(std::time::Duration::ZERO, |w| {
            std::time::Duration::from_secs_f64(w).min(MAX_SEAL_WAIT)
        });
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Listen before looking, so a finish between the two is not missed.
        let finished = state.jobs.finished();
        let job = state
            .meta
            .get_job(SEAL_JOB, repo, digest.as_str())
            .await?
            .ok_or_else(|| {
                ApiError::not_found(
                    ErrorCode::ManifestUnknown,
                    format!("no seal of {digest} has been asked for in {repo}"),
                )
            })?;
        let now = tokio::time::Instant::now();
        if matches!(job.state, JobState::Done | JobState::Failed) || now >= deadline {
            return Ok(seal_response(StatusCode::OK, &job));
        }
        let recheck = (deadline - now).min(SEAL_RECHECK);
        tokio::select! {
            () = finished => {}
            () = tokio::time::sleep(recheck) => {}
        }
    }
}

/// After a manifest push: queue a seal when the manifest is a file artifact another tool pushed.
/// The push has succeeded whatever happens here.
pub(super) async fn seal_on_push(
    state: &AppState,
    repo: &RepoName,
    digest: &Digest,
    content: &[u8],
) {
    let Ok(manifest) = serde_json::from_slice::<ImageManifest>(content) else {
        return;
    };
    if vial_oras_compat::recognize(&manifest).is_err() {
        return;
    }
    match state
        .meta
        .enqueue_job(SEAL_JOB, repo, digest.as_str(), false)
        .await
    {
        Ok(job) => {
            tracing::info!(%repo, %digest, job = %job.id, "file artifact pushed; seal queued");
            state.jobs.wake();
        }
        Err(e) => {
            tracing::warn!(%repo, %digest, error = %crate::error::error_chain(&e), "could not queue a seal")
        }
    }
}
