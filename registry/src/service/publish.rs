//! Publishing what the registry built or copied: a volume's blobs and manifests, committed so
//! that a reader never sees a manifest whose content is not all there.

use bytes::Bytes;
use vial_core::manifest::summarize;
use vial_core::volume::Layout;
use vial_core::{media, Digest, RepoName, Tag};

use super::Service;
use crate::storage::{CommitManifestError, ManifestRecord, StorageError, TagPrecondition};

/// How the registry publishes a volume it built: the tags its index gets, on what condition, and
/// on whose behalf (for the tag history).
#[derive(Debug, Default)]
pub(crate) struct Publish {
    pub tags: Vec<Tag>,
    pub precondition: TagPrecondition,
    pub by: Option<String>,
}

/// Commits a volume whose chunks the repository holds: the tree blob and the empty config, then
/// the manifests bottom-up, the index last with its tags. A reader never sees a manifest whose
/// content is not all there, and a crash leaves only unreferenced rows behind.
pub(crate) async fn commit_layout(
    service: &Service,
    repo: &RepoName,
    layout: &Layout,
    publish: &Publish,
) -> Result<(), CommitManifestError> {
    for blob in layout.blobs() {
        service
            .ensure_blob(repo, &blob.digest, Bytes::from(blob.bytes.clone()))
            .await?;
    }
    let empty =
        Digest::parse(media::OCI_EMPTY_DIGEST).map_err(|e| StorageError::Corrupt(e.to_string()))?;
    service
        .ensure_blob(repo, &empty, Bytes::from_static(b"{}"))
        .await?;
    for manifest in layout.child_manifests() {
        commit_manifest(
            service,
            repo,
            media::OCI_MANIFEST,
            manifest,
            &Publish::default(),
        )
        .await?;
    }
    commit_manifest(service, repo, media::OCI_INDEX, &layout.index, publish).await
}

/// Commits one manifest the registry wrote or copied, with `publish`'s tags.
pub(crate) async fn commit_manifest(
    service: &Service,
    repo: &RepoName,
    media_type: &str,
    manifest: &vial_core::volume::Blob,
    publish: &Publish,
) -> Result<(), CommitManifestError> {
    let summary = summarize(Some(media_type), &manifest.bytes)
        .map_err(|e| StorageError::Corrupt(format!("a manifest to commit is not valid: {e}")))?;
    let record = ManifestRecord {
        digest: manifest.digest.clone(),
        media_type: summary.media_type,
        artifact_type: summary.artifact_type,
        subject: summary.subject.map(|s| s.digest),
        annotations: summary.annotations,
        content: manifest.bytes.clone(),
        blobs: summary.blobs,
        children: summary.children,
        sparse: false,
        pushed_by: publish.by.clone(),
        tags_expire_at: None,
    };
    service
        .meta
        .commit_manifest(repo, &record, &publish.tags, &publish.precondition)
        .await
}
