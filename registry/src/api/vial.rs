//! vial's extensions to the Distribution API, under `/v2/<name>/_vial/…`. Clients use them when
//! present and fall back to plain OCI calls when a registry answers 404.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use vial_core::manifest::ImageManifest;
use vial_core::volume::VOLUME_ARTIFACT_TYPE;
use vial_core::{Digest, RepoName};

use crate::error::{ApiError, ErrorCode};
use crate::http::read_small_body;
use crate::seal::SEAL_JOB;
use crate::service::Service;
use crate::storage::{Job, JobState, Presence, Window};

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
/// repository holds, so one request replaces thousands of HEADs and cross-repository mounts.
///
/// What else it does depends on the caller (`presence`, from its rights): for one who may push
/// here, the blobs found are kept from collection for the grace period, and for one who may also
/// pull from every repository, blobs the registry holds elsewhere are linked here (a bulk
/// cross-repository mount). A caller who may only pull learns what the repository holds and
/// nothing is written, not even the repository.
pub(super) async fn blobs_present(
    state: &Service,
    repo: &RepoName,
    body: axum::body::Body,
    presence: Presence,
) -> Result<Response, ApiError> {
    let bytes = read_small_body(body, MAX_PRESENT_BODY, "existence check").await?;
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
        .blob_rows()
        .link_present_blobs(repo, &request.digests, presence)
        .await?;
    Ok(crate::http::json(
        StatusCode::OK,
        &PresentResponse { present },
    ))
}

#[derive(Serialize)]
struct Version<'a> {
    digest: &'a Digest,
    created_at: String,
    tags: &'a [String],
    #[serde(skip_serializing_if = "Option::is_none")]
    annotations: Option<&'a std::collections::BTreeMap<String, String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    deleted_by: Option<&'a str>,
    /// Until when `vial restore` can bring it back.
    #[serde(skip_serializing_if = "Option::is_none")]
    restorable_until: Option<String>,
}

pub(super) fn rfc3339(millis: i64) -> String {
    humantime::format_rfc3339_seconds(
        std::time::UNIX_EPOCH + std::time::Duration::from_millis(millis.max(0) as u64),
    )
    .to_string()
}

/// `GET /v2/<name>/_vial/versions[?deleted=true]`: every sealed volume version of the repository,
/// newest first; or the deleted ones that can still be restored, with their remembered tags.
pub(super) async fn versions(
    state: &Service,
    repo: &RepoName,
    deleted: bool,
) -> Result<Response, ApiError> {
    let retention = state.config.retention_for(repo.as_str()).as_millis() as i64;
    let rows = state
        .manifests()
        .list_versions(repo, VOLUME_ARTIFACT_TYPE, deleted, Window::ALL)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                ErrorCode::NameUnknown,
                format!("repository {repo} is not known"),
            )
        })?;
    let now = crate::storage::now_millis();
    let versions: Vec<Version> = rows
        .iter()
        // Past its window a deleted version is gone, whether or not the janitor has run yet.
        .filter(|r| r.deleted_at.is_none_or(|at| at + retention > now))
        .map(|r| Version {
            digest: &r.digest,
            created_at: rfc3339(r.created_at),
            tags: &r.tags,
            annotations: r.annotations.as_ref(),
            deleted_at: r.deleted_at.map(rfc3339),
            deleted_by: r.deleted_by.as_deref(),
            restorable_until: r.deleted_at.map(|at| rfc3339(at + retention)),
        })
        .collect();
    Ok(crate::http::json_listing(
        &serde_json::json!({ "name": repo, "versions": versions }),
        "application/json",
    ))
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
    crate::http::json(
        status,
        &SealStatus {
            subject: &job.target,
            state: job.state,
            volume: job.result.as_deref(),
            error: job.error.as_deref(),
            attempts: job.attempts,
        },
    )
}

/// `POST /v2/<name>/_vial/seal/<digest>`: queue a seal of the artifact (again, if it failed), and
/// answer 202 with the job's state, or 200 once it is done.
pub(super) async fn seal_start(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
) -> Result<Response, ApiError> {
    if state
        .manifests()
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
        .job_rows()
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

/// Longest `?wait=` a job status request may hold.
const MAX_JOB_WAIT: std::time::Duration = std::time::Duration::from_secs(30);
/// How often a waiting status request looks again for a job another replica runs.
const JOB_RECHECK: std::time::Duration = std::time::Duration::from_millis(500);

/// A `?wait=` parameter: seconds (`30`, `2.5`) or a duration (`30s`, `1m`), capped at `max`
/// before it becomes a `Duration`, so no number a client sends can overflow one.
pub(super) fn parse_wait(
    raw: Option<&str>,
    max: std::time::Duration,
) -> Result<std::time::Duration, ApiError> {
    let Some(raw) = raw.map(str::trim).filter(|r| !r.is_empty()) else {
        return Ok(std::time::Duration::ZERO);
    };
    let invalid = || {
        ApiError::bad_request(
            ErrorCode::Unsupported,
            format!("wait={raw:?} is not a number of seconds or a duration such as 30s"),
        )
    };
    let wait = match raw.parse::<f64>() {
        Ok(seconds) if seconds.is_nan() => return Err(invalid()),
        Ok(seconds) => std::time::Duration::from_secs_f64(seconds.clamp(0.0, max.as_secs_f64())),
        Err(_) => humantime::parse_duration(raw).map_err(|_| invalid())?,
    };
    Ok(wait.min(max))
}

/// Looks a job up with `fetch` and, with `wait` (seconds, at most 30), keeps looking until it
/// finishes or the wait ends, so a client learns of the outcome at once without polling fast.
pub(super) async fn await_job<F, Fut>(
    state: &Service,
    wait: Option<&str>,
    mut fetch: F,
) -> Result<Job, ApiError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Job, ApiError>>,
{
    let wait = parse_wait(wait, MAX_JOB_WAIT)?;
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        // Listen before looking, so a finish between the two is not missed.
        let finished = state.jobs.finished();
        let job = fetch().await?;
        let now = tokio::time::Instant::now();
        if matches!(job.state, JobState::Done | JobState::Failed) || now >= deadline {
            return Ok(job);
        }
        let recheck = (deadline - now).min(JOB_RECHECK);
        tokio::select! {
            () = finished => {}
            () = tokio::time::sleep(recheck) => {}
        }
    }
}

/// `GET /v2/<name>/_vial/seal/<digest>[?wait=SECONDS]`: where the artifact's seal job is.
pub(super) async fn seal_status(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    wait: Option<&str>,
) -> Result<Response, ApiError> {
    let job = await_job(state, wait, || async {
        state
            .job_rows()
            .get_job(SEAL_JOB, repo, digest.as_str())
            .await?
            .ok_or_else(|| {
                ApiError::not_found(
                    ErrorCode::ManifestUnknown,
                    format!("no seal of {digest} has been asked for in {repo}"),
                )
            })
    })
    .await?;
    Ok(seal_response(StatusCode::OK, &job))
}

/// After a manifest push: queue a seal when the manifest is a file artifact another tool pushed.
/// The push has succeeded whatever happens here.
pub(super) async fn seal_on_push(
    state: &Service,
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
        .job_rows()
        .enqueue_job(SEAL_JOB, repo, digest.as_str(), false)
        .await
    {
        Ok(job) => {
            tracing::info!(%repo, %digest, job = %job.id, "file artifact pushed; seal queued");
            state.jobs.wake();
        }
        Err(e) => {
            tracing::warn!(%repo, %digest, error = %vial_core::error_chain(&e), "could not queue a seal")
        }
    }
}

/// `POST /v2/<name>/_vial/restore/<digest>[?tags=true]`: brings back a version deleted within the
/// repository's retention window, and with `tags` the tags it had that nobody has taken since.
pub(super) async fn restore(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    with_tags: bool,
) -> Result<Response, ApiError> {
    let retention = state.config.retention_for(repo.as_str());
    let since = crate::storage::now_millis() - retention.as_millis() as i64;
    let restored = state
        .manifests()
        .restore_manifest(repo, digest, since, with_tags)
        .await?
        .ok_or_else(|| {
            ApiError::not_found(
                ErrorCode::ManifestUnknown,
                format!(
                    "{repo} has no deleted manifest {digest} to restore: it was never deleted, or was \
                     deleted more than {} ago (this repository's retention window)",
                    humantime::format_duration(retention)
                ),
            )
        })?;
    tracing::info!(%repo, %digest, tags = ?restored.tags, tags_moved_on = ?restored.tags_moved_on, "deleted manifest restored");
    Ok(crate::http::json(
        StatusCode::OK,
        &serde_json::json!({
            "digest": digest,
            "tags": restored.tags,
            "tags_moved_on": restored.tags_moved_on,
        }),
    ))
}

/// Longest lease a node may take at once; it renews well before the end.
const MAX_LEASE: std::time::Duration = std::time::Duration::from_secs(3600);

#[derive(Deserialize)]
struct LeaseRequest {
    holder: String,
    #[serde(default)]
    ttl_seconds: Option<u64>,
}

/// `GET /v2/<name>/_vial/leases/<digest>`: the nodes that say they have this version mounted.
pub(super) async fn leases(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
) -> Result<Response, ApiError> {
    let leases = state
        .leases()
        .leases(repo, digest, crate::storage::now_millis())
        .await?;
    let list: Vec<_> = leases
        .iter()
        .map(|l| serde_json::json!({"holder": l.holder, "expires_at": rfc3339(l.expires_at)}))
        .collect();
    Ok(crate::http::json_listing(
        &serde_json::json!({ "leases": list }),
        "application/json",
    ))
}

/// `PUT` (take or renew, `{"holder", "ttl_seconds"}`) or `DELETE` (`{"holder"}`) a lease.
pub(super) async fn lease_change(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    req: &crate::http::Request,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let bytes = axum::body::to_bytes(body, 64 * 1024)
        .await
        .map_err(|e| ApiError::bad_request(ErrorCode::Unsupported, format!("lease body: {e}")))?;
    let request: LeaseRequest = serde_json::from_slice(&bytes).map_err(|e| {
        ApiError::bad_request(
            ErrorCode::Unsupported,
            format!("expected {{\"holder\": \"...\", \"ttl_seconds\": N}}: {e}"),
        )
    })?;
    if request.holder.is_empty() || request.holder.len() > 512 {
        return Err(ApiError::bad_request(
            ErrorCode::Unsupported,
            "a lease holder is 1 to 512 bytes",
        ));
    }
    if req.method == axum::http::Method::DELETE {
        state
            .leases()
            .drop_lease(repo, digest, &request.holder)
            .await?;
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let ttl = std::time::Duration::from_secs(request.ttl_seconds.unwrap_or(300)).min(MAX_LEASE);
    let expires_at = crate::storage::now_millis() + ttl.as_millis() as i64;
    state
        .leases()
        .put_lease(repo, digest, &request.holder, expires_at)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v2/<name>/_vial/tags/<tag>/history`: every move of the tag, oldest first.
pub(super) async fn tag_history(
    state: &Service,
    repo: &RepoName,
    tag: &vial_core::Tag,
) -> Result<Response, ApiError> {
    let events = state.tags().tag_history(repo, tag).await?.ok_or_else(|| {
        ApiError::not_found(
            ErrorCode::NameUnknown,
            format!("repository {repo} is not known"),
        )
    })?;
    let list: Vec<_> = events
        .iter()
        .map(|e| {
            serde_json::json!({
                "at": rfc3339(e.at),
                "from": e.from,
                "to": e.to,
                "by": e.actor,
                "reason": e.reason,
            })
        })
        .collect();
    Ok(crate::http::json_listing(
        &serde_json::json!({ "name": repo, "tag": tag.as_str(), "history": list }),
        "application/json",
    ))
}

/// Longest `?wait=` a tag watch may hold: long enough that an idle follower asks twice a
/// minute, short enough for proxies that cut idle requests.
const MAX_TAG_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// `GET /v2/<name>/_vial/tags/<tag>[?since=<digest>|absent][&wait=SECONDS]`: where a tag points.
/// With `since`, the answer waits (at most `wait`, itself at most 60 s) while the tag still points
/// at `since` (or, for `absent`, while it does not exist), and comes the moment it moves: 200 with
/// the digest, or 404 MANIFEST_UNKNOWN once the tag is gone.
pub(super) async fn tag_watch(
    state: &Service,
    watch: &crate::watch::TagWatch,
    repo: &RepoName,
    tag: &vial_core::Tag,
    req: &crate::http::Request,
) -> Result<Response, ApiError> {
    let since = match req.query.get("since").map(str::trim) {
        None | Some("") => None,
        Some("absent") => Some(None),
        Some(d) => Some(Some(Digest::parse(d).map_err(|e| {
            ApiError::bad_request(
                ErrorCode::DigestInvalid,
                format!("since={d:?} is neither a digest nor \"absent\": {e}"),
            )
        })?)),
    };
    let wait = parse_wait(req.query.get("wait"), MAX_TAG_WAIT)?;
    let now = match &since {
        Some(since) => watch.wait(repo, tag, since, wait).await?,
        None => state.tags().tag_target(repo, tag).await?,
    };
    let Some(digest) = now else {
        return Err(ApiError::not_found(
            ErrorCode::ManifestUnknown,
            format!("tag {tag} is not in {repo}"),
        ));
    };
    let mut response = crate::http::json(
        StatusCode::OK,
        &serde_json::json!({ "name": repo, "tag": tag.as_str(), "digest": digest }),
    );
    crate::http::set_header(&mut response, "docker-content-digest", digest.as_str());
    crate::http::set_header(&mut response, "cache-control", "no-store");
    Ok(response)
}

/// A garbage collection job as the API shows it: `report` is what the pass reclaimed once it is
/// done, and what it has reclaimed so far while it runs.
#[derive(Serialize)]
struct GcJobView<'a> {
    id: &'a str,
    state: JobState,
    report: Option<serde_json::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<&'a str>,
    attempts: i64,
    created_at: i64,
    updated_at: i64,
}

fn gc_job_response(job: &Job) -> Response {
    let finished = matches!(job.state, JobState::Done | JobState::Failed);
    let report = if job.state == JobState::Done {
        &job.result
    } else {
        &job.progress
    };
    let view = GcJobView {
        id: &job.id,
        state: job.state,
        report: report.as_deref().and_then(|r| serde_json::from_str(r).ok()),
        error: job.error.as_deref(),
        attempts: job.attempts,
        created_at: job.created_at,
        updated_at: job.updated_at,
    };
    let status = if finished {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    let mut response = crate::http::json(status, &view);
    crate::http::set_header(
        &mut response,
        "location",
        &format!("/v2/_vial/gc/{}", job.id),
    );
    response
}

/// `POST /v2/_vial/gc[?dry-run=true][&wait=SECONDS]`: a garbage collection pass now. Dry, the
/// answer is what a pass would reclaim. Otherwise the pass is a job (the one already queued or
/// running, if there is one) that runs to the end whoever waits for it: the answer is 200 with
/// its report if it finished within `wait` (at most 30 s), else 202 with where it is and, in
/// `Location`, where to follow it.
pub(super) async fn gc(
    state: &Service,
    dry_run: bool,
    wait: Option<&str>,
) -> Result<Response, ApiError> {
    if dry_run {
        let report = crate::service::gc::collect(state, true, None).await?;
        return Ok(crate::http::json(StatusCode::OK, &report));
    }
    let queued = crate::service::gc::start(state).await?;
    if !state.config.run_jobs {
        tracing::info!(job = %queued.id, "garbage collection queued for a replica that runs jobs");
    }
    gc_status(state, &queued.id, wait).await
}

/// `GET /v2/_vial/gc/<id>[?wait=SECONDS]`: where a garbage collection job is; with `wait`,
/// answered when it finishes or the wait (at most 30 s) ends.
pub(super) async fn gc_status(
    state: &Service,
    id: &str,
    wait: Option<&str>,
) -> Result<Response, ApiError> {
    let job = await_job(state, wait, || async {
        state
            .job_rows()
            .job_by_id(id)
            .await?
            .filter(|j| j.kind == crate::service::gc::GC_JOB)
            .ok_or_else(|| {
                ApiError::not_found(
                    ErrorCode::NameUnknown,
                    format!("no garbage collection job {id}"),
                )
            })
    })
    .await?;
    Ok(gc_job_response(&job))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn waits_are_capped_before_they_become_durations() {
        let max = MAX_JOB_WAIT;
        for huge in [
            "1e20",
            "1e308",
            "inf",
            "18446744073709551616",
            "9999999999h",
        ] {
            assert_eq!(parse_wait(Some(huge), max).unwrap(), max, "{huge}");
        }
        assert_eq!(parse_wait(Some("-3"), max).unwrap(), Duration::ZERO);
        assert_eq!(
            parse_wait(Some("2.5"), max).unwrap(),
            Duration::from_millis(2500)
        );
        assert_eq!(parse_wait(Some("4s"), max).unwrap(), Duration::from_secs(4));
        assert_eq!(parse_wait(None, max).unwrap(), Duration::ZERO);
        assert!(parse_wait(Some("NaN"), max).is_err());
        assert!(parse_wait(Some("soon"), max).is_err());
    }
}
