//! vial's sync extension, `/v2/<name>/_vial/sync[/<id>]`: start, list, watch and cancel jobs that
//! copy a remote source into a sealed version of the repository (see [`crate::sync`]).

use axum::http::StatusCode;
use axum::response::Response;
use serde::Serialize;
use vial_core::{RepoName, Tag};

use super::manifests::{check_users, denied};
use super::vial::await_job;
use crate::error::{ApiError, ErrorCode};
use crate::http::json;
use crate::http::read_small_body;
use crate::service::Service;
use crate::storage::{Job, JobState};
use crate::sync::{check_spec, SpecError, SyncProgress, SyncSpec, SYNC_JOB};

/// A sync request is a small JSON object.
const MAX_SPEC_BODY: usize = 64 * 1024;
/// Jobs one listing returns, newest first.
const LIST_LIMIT: u32 = 100;

/// A sync job as clients see it.
#[derive(Serialize)]
#[serde(rename_all = "kebab-case")]
struct SyncView<'a> {
    id: &'a str,
    repository: &'a str,
    #[serde(flatten)]
    spec: Option<SyncSpec>,
    state: JobState,
    /// The sealed version's digest, once done.
    #[serde(skip_serializing_if = "Option::is_none")]
    digest: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    progress: SyncProgress,
    attempts: i64,
    created_at: i64,
    updated_at: i64,
}

fn view(job: &Job) -> SyncView<'_> {
    SyncView {
        id: &job.id,
        repository: job.scope(),
        spec: job
            .spec
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok()),
        state: job.state,
        digest: job.result.as_deref(),
        error: job.error.as_deref(),
        progress: job
            .progress
            .as_deref()
            .and_then(|p| serde_json::from_str(p).ok())
            .unwrap_or_default(),
        attempts: job.attempts,
        created_at: job.created_at,
        updated_at: job.updated_at,
    }
}

/// `POST /v2/<name>/_vial/sync` with a [`SyncSpec`]: checks it and queues the job (202).
pub(super) async fn sync_start(
    state: &Service,
    repo: &RepoName,
    subject: Option<&str>,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let bytes = read_small_body(body, MAX_SPEC_BODY, "sync request").await?;
    let mut spec: SyncSpec = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(
            ErrorCode::Unsupported,
            format!("expected {{\"source\": \"…\", \"tag\": \"…\"}}: {e}"),
        )
    })?;
    check_spec(state, &spec).map_err(|e| match e {
        SpecError::NotAllowed(_) => denied(e.to_string()),
        SpecError::Invalid(why) => ApiError::bad_request(ErrorCode::Unsupported, why),
    })?;
    let tag = Tag::parse(&spec.tag)
        .map_err(|e| ApiError::bad_request(ErrorCode::TagInvalid, e.to_string()))?;
    // The tag rules, as far as they can be checked before the version exists: the sync moves
    // the tag at the end on behalf of whoever started it.
    let rules: Vec<_> = state
        .config
        .tag_rules_for(repo.as_str(), tag.as_str())
        .collect();
    check_users(state, repo, &tag, subject)?;
    if rules.iter().any(|r| r.require_expect) {
        return Err(denied(format!(
            "tag {tag} in {repo} is protected: sync to another tag, then move {tag} with `vial tag set --expect`"
        )));
    }
    if rules.iter().any(|r| r.immutable) {
        if let Some(current) = state.tags().tag_target(repo, &tag).await? {
            return Err(denied(format!(
                "tag {tag} in {repo} is immutable and points at {current} already"
            )));
        }
    }
    spec.requested_by = subject.map(str::to_owned);
    let spec_json = serde_json::to_string(&spec).unwrap_or_default();
    let job = state
        .job_rows()
        .create_job(SYNC_JOB, Some(repo), &spec_json)
        .await?;
    tracing::info!(%repo, job = %job.id, source = %spec.source, tag = %spec.tag, by = subject.unwrap_or("anonymous"), "sync queued");
    if !state.config.run_jobs {
        tracing::info!(job = %job.id, "sync queued for a replica that runs jobs");
    }
    state.jobs.wake();
    Ok(json(StatusCode::ACCEPTED, &view(&job)))
}

/// `GET /v2/<name>/_vial/sync`: the repository's sync jobs, newest first.
pub(super) async fn sync_list(state: &Service, repo: &RepoName) -> Result<Response, ApiError> {
    let jobs = state
        .job_rows()
        .list_jobs(SYNC_JOB, repo, LIST_LIMIT)
        .await?;
    let views: Vec<SyncView<'_>> = jobs.iter().map(view).collect();
    Ok(crate::http::json_listing(
        &serde_json::json!({ "name": repo, "jobs": views }),
        "application/json",
    ))
}

async fn find(state: &Service, repo: &RepoName, id: &str) -> Result<Job, ApiError> {
    state
        .job_rows()
        .job_by_id(id)
        .await?
        .filter(|j| j.kind == SYNC_JOB && j.repository.as_ref() == Some(repo))
        .ok_or_else(|| {
            ApiError::not_found(
                ErrorCode::NameUnknown,
                format!("{repo} has no sync job {id}"),
            )
        })
}

/// `GET /v2/<name>/_vial/sync/<id>[?wait=SECONDS]`: where the job is; with `wait`, answered when
/// it finishes or the wait (at most 30 s) ends.
pub(super) async fn sync_status(
    state: &Service,
    repo: &RepoName,
    id: &str,
    wait: Option<&str>,
) -> Result<Response, ApiError> {
    let job = await_job(state, wait, || find(state, repo, id)).await?;
    Ok(json(StatusCode::OK, &view(&job)))
}

/// `DELETE /v2/<name>/_vial/sync/<id>`: cancels a job that has not finished. The runner holding
/// it stops at its next lease renewal; files copied so far stay until garbage collection.
pub(super) async fn sync_cancel(
    state: &Service,
    repo: &RepoName,
    id: &str,
    subject: Option<&str>,
) -> Result<Response, ApiError> {
    let job = find(state, repo, id).await?;
    if matches!(job.state, JobState::Done | JobState::Failed) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            ErrorCode::Denied,
            format!(
                "sync job {id} has already {}",
                match job.state {
                    JobState::Done => "finished",
                    _ => "failed",
                }
            ),
        ));
    }
    let reason = format!("cancelled by {}", subject.unwrap_or("an anonymous user"));
    let job = state
        .job_rows()
        .cancel_job(id, &reason)
        .await?
        .unwrap_or(job);
    tracing::info!(%repo, job = %id, by = subject.unwrap_or("anonymous"), "sync cancelled");
    Ok(json(StatusCode::OK, &view(&job)))
}
