//! Manifest push (with `?tag=` and `subject`), pull by tag or digest, and deletion.

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use vial_core::manifest::{summarize, ManifestKind};
use vial_core::volume::VOLUME_ARTIFACT_TYPE;
use vial_core::{media, Algorithm, RepoName, Tag, Target};

use crate::error::{ApiError, ErrorCode};
use crate::http::{append_header, set_header, Request};
use crate::service::Service;
use crate::storage::{ManifestRecord, TagPrecondition};

/// Manifests larger than this are hashed off the executor.
const INLINE_HASH_LIMIT: usize = 256 * 1024;

pub(super) async fn get(
    state: &Service,
    repo: &RepoName,
    target: &Target,
    req: &Request,
) -> Result<Response, ApiError> {
    let Some(manifest) = state.manifests().get_manifest(repo, target).await? else {
        return Err(match target {
            Target::Digest(d) => deleted_or_unknown(state, repo, d).await?,
            Target::Tag(tag) => tag_gone_or_unknown(state, repo, tag).await?,
        });
    };
    let length = manifest.content.len();
    let etag = format!("\"{}\"", manifest.digest);
    // A poller that already has this manifest (`If-None-Match: "<digest>"`, the ETag it was given)
    // learns that nothing changed without the bytes: how any client follows a tag over plain OCI.
    let unchanged = req.header("if-none-match").is_some_and(|h| {
        h.split(',')
            .any(|t| t.trim().trim_start_matches("W/") == etag)
    });
    let mut response = if unchanged {
        StatusCode::NOT_MODIFIED.into_response()
    } else if req.method == Method::HEAD {
        StatusCode::OK.into_response()
    } else {
        (StatusCode::OK, manifest.content).into_response()
    };
    if !unchanged {
        set_header(&mut response, "content-type", &manifest.media_type);
        set_header(&mut response, "content-length", &length.to_string());
    }
    set_header(
        &mut response,
        "docker-content-digest",
        manifest.digest.as_str(),
    );
    set_header(&mut response, "etag", &etag);
    Ok(response)
}

pub(super) async fn put(
    state: &Service,
    repo: &RepoName,
    target: &Target,
    req: &Request,
    body: axum::body::Body,
) -> Result<Response, ApiError> {
    let limit = state.config.max_manifest_size;
    if req.content_length().is_some_and(|l| l > limit) {
        return Err(too_large(limit));
    }
    let content_type = req.header("content-type").map(str::to_owned);
    let mut tags: Vec<Tag> = Vec::new();
    if let Target::Tag(t) = target {
        tags.push(t.clone());
    }
    for t in req.query.all("tag") {
        let tag = Tag::parse(t)
            .map_err(|e| ApiError::bad_request(ErrorCode::TagInvalid, e.to_string()))?;
        if !tags.contains(&tag) {
            tags.push(tag);
        }
    }

    let content = read_limited(body, limit).await?;
    state.metrics.add_manifest_bytes_in(content.len() as u64);
    let summary = summarize(content_type.as_deref(), &content)
        .map_err(|e| ApiError::bad_request(ErrorCode::ManifestInvalid, e.to_string()))?;
    let algorithm = match target {
        Target::Digest(d) => d.algorithm(),
        Target::Tag(_) => Algorithm::Sha256,
    };
    let (content, digest) = if content.len() > INLINE_HASH_LIMIT {
        tokio::task::spawn_blocking(move || {
            let d = algorithm.digest_bytes(&content);
            (content, d)
        })
        .await
        .map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
            )
        })?
    } else {
        let d = algorithm.digest_bytes(&content);
        (content, d)
    };
    if let Target::Digest(expected) = target {
        if expected != &digest {
            return Err(ApiError::bad_request(
                ErrorCode::DigestInvalid,
                format!("manifest content has digest {digest}, not the {expected} in the URL"),
            ));
        }
    }

    let subject = summary.subject.as_ref().map(|s| s.digest.clone());
    let mut precondition = tag_precondition(req)?;
    let tags = check_tag_rules(state, repo, tags, &digest, &mut precondition, req).await?;
    let tags_expire_at = tag_expiry(req)?;
    // A volume's index must be complete (docs/format.md); any other index may be sparse, as
    // partial multi-platform copies make them, unless the operator turned that off.
    let sparse = state.config.sparse_indexes
        && summary.kind == ManifestKind::Index
        && summary.artifact_type.as_deref() != Some(VOLUME_ARTIFACT_TYPE);
    let record = ManifestRecord {
        digest: digest.clone(),
        sparse,
        media_type: summary.media_type,
        artifact_type: summary.artifact_type,
        subject: subject.clone(),
        annotations: summary.annotations,
        content,
        blobs: summary.blobs,
        children: summary.children,
        pushed_by: req.subject.clone(),
        tags_expire_at,
    };
    state
        .manifests()
        .commit_manifest(repo, &record, &tags, &precondition)
        .await?;
    tracing::info!(%repo, %digest, tags = ?tags.iter().map(Tag::as_str).collect::<Vec<_>>(), "manifest committed");

    if state.config.seal_on_push
        && (record.media_type == media::OCI_MANIFEST || record.media_type == media::DOCKER_MANIFEST)
    {
        super::vial::seal_on_push(state, repo, &digest, &record.content).await;
    }
    let mut response = StatusCode::CREATED.into_response();
    set_header(
        &mut response,
        "location",
        &format!("/v2/{repo}/manifests/{digest}"),
    );
    set_header(&mut response, "docker-content-digest", digest.as_str());
    set_header(&mut response, "content-length", "0");
    if let Some(subject) = subject {
        set_header(&mut response, "oci-subject", subject.as_str());
    }
    for tag in &tags {
        append_header(&mut response, "oci-tag", tag.as_str());
    }
    Ok(response)
}

/// DELETE by digest hides the manifest at once and keeps it restorable for the repository's
/// retention window; DELETE by tag removes only the tag.
pub(super) async fn delete(
    state: &Service,
    repo: &RepoName,
    target: &Target,
    by: Option<&str>,
) -> Result<Response, ApiError> {
    let existed = match target {
        Target::Digest(d) => {
            // Deleting a version removes its tags: not if one of them may never move.
            for tag in state.tags().manifest_tags(repo, d).await? {
                if state
                    .config
                    .tag_rules_for(repo.as_str(), &tag)
                    .any(|r| r.immutable)
                {
                    return Err(denied(format!(
                        "{repo}@{d} carries the immutable tag {tag}: it cannot be deleted"
                    )));
                }
            }
            state.manifests().delete_manifest(repo, d, by).await?
        }
        Target::Tag(t) => {
            // Removing a tag is moving it to nowhere: the same rules apply.
            if state
                .config
                .tag_rules_for(repo.as_str(), t.as_str())
                .any(|r| r.immutable)
            {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    ErrorCode::Denied,
                    format!("tag {t} in {repo} is immutable: it cannot be removed"),
                ));
            }
            check_users(state, repo, t, by)?;
            state.tags().delete_tag(repo, t, by).await?
        }
    };
    if !existed {
        return Err(manifest_unknown(repo, target));
    }
    match target {
        Target::Digest(d) => tracing::info!(
            %repo,
            digest = %d,
            by = by.unwrap_or("anonymous"),
            retention = %humantime::format_duration(state.config.retention_for(repo.as_str())),
            "manifest deleted; restorable within the retention window"
        ),
        Target::Tag(t) => tracing::info!(%repo, tag = %t, "tag deleted"),
    }
    Ok(StatusCode::ACCEPTED.into_response())
}

pub(super) fn denied(message: String) -> ApiError {
    ApiError::new(StatusCode::FORBIDDEN, ErrorCode::Denied, message)
}

/// The `users` of every rule on `tag` must include the caller.
pub(super) fn check_users(
    state: &Service,
    repo: &RepoName,
    tag: &Tag,
    by: Option<&str>,
) -> Result<(), ApiError> {
    for rule in state.config.tag_rules_for(repo.as_str(), tag.as_str()) {
        if let Some(users) = &rule.users {
            if !by.is_some_and(|u| users.iter().any(|x| x == u)) {
                return Err(denied(format!(
                    "tag {tag} in {repo} may only be moved by {}",
                    users.join(", ")
                )));
            }
        }
    }
    Ok(())
}

/// Applies the tag protection rules to a push that sets `tags` on `digest`: users, required
/// preconditions, and immutability (an immutable tag may be created, never moved; setting it
/// where it already points is a no-op). Returns the tags left to set.
async fn check_tag_rules(
    state: &Service,
    repo: &RepoName,
    tags: Vec<Tag>,
    digest: &vial_core::Digest,
    precondition: &mut TagPrecondition,
    req: &Request,
) -> Result<Vec<Tag>, ApiError> {
    let mut keep = Vec::with_capacity(tags.len());
    let several = tags.len() > 1;
    for tag in tags {
        let rules: Vec<_> = state
            .config
            .tag_rules_for(repo.as_str(), tag.as_str())
            .collect();
        if rules.is_empty() {
            keep.push(tag);
            continue;
        }
        check_users(state, repo, &tag, req.subject.as_deref())?;
        if rules.iter().any(|r| r.require_expect) && *precondition == TagPrecondition::None {
            return Err(denied(format!(
                "tag {tag} in {repo} is protected: say where it points now to move it (vial tag set --expect, or HTTP If-Match / If-None-Match: *)"
            )));
        }
        if rules.iter().any(|r| r.immutable) {
            match state.tags().tag_target(repo, &tag).await? {
                Some(current) if &current == digest => continue,
                Some(current) => {
                    return Err(denied(format!(
                        "tag {tag} in {repo} is immutable: it points at {current} and cannot move"
                    )))
                }
                None if several => {
                    return Err(denied(format!(
                        "tag {tag} in {repo} is immutable: set it in a push of its own"
                    )))
                }
                // Created only if nobody creates it first.
                None => *precondition = TagPrecondition::Absent,
            }
        }
        keep.push(tag);
    }
    Ok(keep)
}

/// `Vial-Tag-Expires: <RFC 3339 time>` on a manifest push: the tags it sets stop resolving then.
fn tag_expiry(req: &Request) -> Result<Option<i64>, ApiError> {
    let Some(v) = req.header("vial-tag-expires") else {
        return Ok(None);
    };
    let at = humantime::parse_rfc3339_weak(v.trim()).map_err(|e| {
        ApiError::bad_request(
            ErrorCode::Unsupported,
            format!("Vial-Tag-Expires {v:?} is not an RFC 3339 time: {e}"),
        )
    })?;
    let millis = at
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0);
    Ok(Some(millis))
}

/// `If-None-Match: *` (the tag must not exist) or `If-Match: "<digest>"` (the tag must point there):
/// vial's compare-and-swap for tag moves, on the ETag the manifest GET returns.
fn tag_precondition(req: &Request) -> Result<TagPrecondition, ApiError> {
    if req.header("if-none-match").map(str::trim) == Some("*") {
        return Ok(TagPrecondition::Absent);
    }
    match req.header("if-match") {
        None => Ok(TagPrecondition::None),
        Some(v) => {
            let d = v.trim().trim_start_matches("W/").trim_matches('"');
            crate::route::parse_digest(d).map(TagPrecondition::At)
        }
    }
}

/// Reads a request body into memory, refusing it as soon as it passes `limit` bytes.
async fn read_limited(body: axum::body::Body, limit: u64) -> Result<Vec<u8>, ApiError> {
    let mut stream = body.into_data_stream();
    let mut content = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(
                ErrorCode::ManifestInvalid,
                format!("manifest body was not received whole: {e}"),
            )
        })?;
        if content.len() as u64 + chunk.len() as u64 > limit {
            return Err(too_large(limit));
        }
        content.extend_from_slice(&chunk);
    }
    Ok(content)
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        ErrorCode::SizeInvalid,
        format!("manifest is larger than this registry's limit of {limit} bytes"),
    )
}

/// The 404 for a digest: saying, for a version deleted within its retention window, when it was
/// deleted and until when `vial restore` can bring it back.
async fn deleted_or_unknown(
    state: &Service,
    repo: &RepoName,
    digest: &vial_core::Digest,
) -> Result<ApiError, ApiError> {
    let Some(deleted) = restorable(state, repo, digest).await? else {
        return Ok(manifest_unknown(repo, &Target::Digest(digest.clone())));
    };
    Ok(ApiError::not_found(
        ErrorCode::ManifestUnknown,
        format!(
            "{repo}@{digest} was deleted at {}; it can be restored until {}",
            deleted.at, deleted.until
        ),
    )
    .with_detail(deleted.detail(digest)))
}

/// The 404 for a tag: for a tag removed when the version it pointed at was deleted, within the
/// version's retention window, which version that was and until when both can be restored.
async fn tag_gone_or_unknown(
    state: &Service,
    repo: &RepoName,
    tag: &Tag,
) -> Result<ApiError, ApiError> {
    let unknown = manifest_unknown(repo, &Target::Tag(tag.clone()));
    let last = state
        .tags()
        .tag_history(repo, tag)
        .await?
        .and_then(|h| h.into_iter().last());
    let Some(digest) = last
        .filter(|e| e.reason == "version-deleted")
        .and_then(|e| e.from)
    else {
        return Ok(unknown);
    };
    let Some(deleted) = restorable(state, repo, &digest).await? else {
        return Ok(unknown);
    };
    Ok(ApiError::not_found(
        ErrorCode::ManifestUnknown,
        format!(
            "{repo}:{tag} was removed when its version {digest} was deleted at {}; `vial restore \
             {repo}@{digest} --tags` brings both back until {}",
            deleted.at, deleted.until
        ),
    )
    .with_detail(deleted.detail(&digest)))
}

/// A deleted version that can still be restored: when it was deleted, by whom, and until when.
struct Restorable {
    at: String,
    by: Option<String>,
    until: String,
}

impl Restorable {
    fn detail(&self, digest: &vial_core::Digest) -> serde_json::Value {
        serde_json::json!({
            "digest": digest, "deleted_at": self.at, "deleted_by": self.by,
            "restorable_until": self.until,
        })
    }
}

async fn restorable(
    state: &Service,
    repo: &RepoName,
    digest: &vial_core::Digest,
) -> Result<Option<Restorable>, ApiError> {
    let Some((deleted_at, by)) = state.manifests().deleted_manifest(repo, digest).await? else {
        return Ok(None);
    };
    let until = deleted_at + state.config.retention_for(repo.as_str()).as_millis() as i64;
    if until <= crate::storage::now_millis() {
        return Ok(None);
    }
    Ok(Some(Restorable {
        at: super::vial::rfc3339(deleted_at),
        by,
        until: super::vial::rfc3339(until),
    }))
}

fn manifest_unknown(repo: &RepoName, target: &Target) -> ApiError {
    let what = match target {
        Target::Digest(d) => d.to_string(),
        Target::Tag(t) => format!("tag {t}"),
    };
    ApiError::not_found(
        ErrorCode::ManifestUnknown,
        format!("manifest {what} is not in {repo}"),
    )
}
