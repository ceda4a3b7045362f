//! Sync jobs: the registry copies a remote source (a bucket, another registry, a Hugging Face Hub
//! repository) into a new sealed version, without the data passing through the user's machine.
//!
//! A sync is a durable job ([`crate::jobs`]). Its spec names what to copy; where the source is
//! served from and the credentials to read it come from the registry's configuration
//! ([`crate::config::SyncSource`]). Each finished file is recorded as the job goes
//! (`job_files`), so an attempt after a restart copies only the files not yet done; the source's
//! revision is pinned by the first attempt, so every attempt copies the same thing, and the version
//! sealed in the end is the one an uninterrupted run would have sealed.
//!
//! Here: checking a spec and running one attempt. `spec.rs` holds what a sync is asked (sources,
//! filters, progress, errors); `attempt.rs` the attempt's record; `files.rs` copies a bucket or a
//! Hub repository file by file (`remote.rs` lists and reads them); `oci.rs` copies from another
//! registry.

mod attempt;
mod files;
mod oci;
mod remote;
mod spec;

use std::sync::{Arc, Mutex};

use vial_core::{Digest, RepoName, Tag};

use crate::service::publish::Publish;
use crate::service::Service;
use crate::storage::{Job, TagPrecondition};

use attempt::Run;
use files::sync_files;
pub use spec::{Filter, Source, SpecError, SyncError, SyncProgress, SyncSpec};

/// The job kind under which syncs run.
pub const SYNC_JOB: &str = "sync";

/// Checks a spec before it is queued: everything that can be known without reaching the source.
pub fn check_spec(service: &Service, spec: &SyncSpec) -> Result<Source, SpecError> {
    let source = Source::parse(&spec.source).map_err(SpecError::Invalid)?;
    Tag::parse(&spec.tag).map_err(|e| SpecError::Invalid(format!("tag {:?}: {e}", spec.tag)))?;
    Filter::new(&spec.include, &spec.exclude).map_err(SpecError::Invalid)?;
    if service.config.sync_source_for(&spec.source).is_none() {
        return Err(SpecError::NotAllowed(spec.source.clone()));
    }
    Ok(source)
}

/// Runs one attempt of a sync job and returns the sealed version's digest.
pub async fn run(service: &Arc<Service>, job: &Job) -> Result<Digest, SyncError> {
    let spec: SyncSpec = serde_json::from_str(job.spec.as_deref().unwrap_or(""))
        .map_err(|e| SyncError::Invalid(format!("the job's spec cannot be read: {e}")))?;
    let source = check_spec(service, &spec).map_err(|e| SyncError::Invalid(e.to_string()))?;
    let repo = job
        .repository
        .clone()
        .ok_or_else(|| SyncError::Invalid("the sync job names no repository".into()))?;
    let tag = Tag::parse(&spec.tag).map_err(|e| SyncError::Invalid(e.to_string()))?;
    let entry = service
        .config
        .sync_source_for(&spec.source)
        .cloned()
        .unwrap_or_default();
    let progress: SyncProgress = job
        .progress
        .as_deref()
        .and_then(|p| serde_json::from_str(p).ok())
        .unwrap_or_default();
    let run = Run {
        service: Arc::clone(service),
        job: job.clone(),
        progress: Mutex::new(progress),
        publish: Publish {
            precondition: precondition_for(service, &repo, &tag),
            tags: vec![tag],
            by: spec.requested_by.clone(),
        },
        repo,
    };
    // A new attempt reads again whatever the last one had read.
    run.progress().bytes_read = 0;
    match source {
        Source::Oci(reference) => oci::sync(&run, &spec, &reference, &entry).await,
        Source::S3 { bucket, prefix } => {
            let lister = remote::S3Source::connect(&entry, &bucket, &prefix).await?;
            sync_files(&run, &spec, &remote::Remote::S3(lister)).await
        }
        Source::Hf {
            kind,
            repo,
            revision,
        } => {
            let hub = remote::HubSource::new(&entry, kind, &repo)?;
            sync_files(&run, &spec, &remote::Remote::Hub(hub, revision.clone())).await
        }
    }
}

/// An immutable tag is only ever created: the sync sets it only if nobody has meanwhile.
fn precondition_for(service: &Service, repo: &RepoName, tag: &Tag) -> TagPrecondition {
    if service
        .config
        .tag_rules_for(repo.as_str(), tag.as_str())
        .any(|r| r.immutable)
    {
        TagPrecondition::Absent
    } else {
        TagPrecondition::None
    }
}

#[cfg(test)]
mod tests {
    use super::attempt::published;
    use super::*;
    use crate::storage::CommitManifestError;

    #[test]
    fn sources_parse_or_say_what_is_expected() {
        assert_eq!(
            Source::parse("s3://models/llama/8b/").unwrap(),
            Source::S3 {
                bucket: "models".into(),
                prefix: "llama/8b".into()
            }
        );
        assert_eq!(
            Source::parse("hf://Qwen/Qwen3-8B@v1.0").unwrap(),
            Source::Hf {
                kind: "models",
                repo: "Qwen/Qwen3-8B".into(),
                revision: "v1.0".into()
            }
        );
        assert_eq!(
            Source::parse("hf://datasets/org/set").unwrap(),
            Source::Hf {
                kind: "datasets",
                repo: "org/set".into(),
                revision: "main".into()
            }
        );
        assert!(matches!(
            Source::parse("oci://ghcr.io/acme/w:v1"),
            Ok(Source::Oci(_))
        ));
        for bad in [
            "s3://",
            "hf://../etc",
            "hf://a/b/c",
            "hf://a/b@x/../../y",
            "oci://ghcr.io/acme/w",
            "ftp://x",
            "/local/dir",
        ] {
            assert!(Source::parse(bad).is_err(), "{bad} was accepted");
        }
    }

    #[test]
    fn a_tag_already_on_the_job_s_own_version_is_not_a_conflict() {
        let ours = vial_core::Algorithm::Sha256.digest_bytes(b"ours");
        let theirs = vial_core::Algorithm::Sha256.digest_bytes(b"theirs");
        let moved = |current: &Digest| {
            Err(CommitManifestError::TagMoved {
                tag: "v1".into(),
                current: Some(current.clone()),
                expected: TagPrecondition::Absent,
            })
        };
        assert!(published(moved(&ours), &ours).is_ok());
        let err = published(moved(&theirs), &ours).unwrap_err();
        assert!(
            !err.is_transient() && err.to_string().contains("set meanwhile"),
            "{err}"
        );
        let missing = published(Err(CommitManifestError::MissingBlobs(vec![theirs])), &ours);
        assert!(
            missing.unwrap_err().is_transient(),
            "collected chunks are copied again"
        );
    }

    #[test]
    fn filters_include_then_exclude() {
        let f = Filter::new(
            &["*.safetensors".into(), "config.json".into()],
            &["*.bin".into(), "old/*".into()],
        )
        .unwrap();
        assert!(f.wants("model-00001-of-00002.safetensors"));
        assert!(
            f.wants("sub/dir/x.safetensors"),
            "* crosses / as the Hub's patterns do"
        );
        assert!(f.wants("config.json"));
        assert!(!f.wants("pytorch_model.bin"));
        assert!(!f.wants("old/x.safetensors"));
        assert!(!f.wants("README.md"));
        let all = Filter::new(&[], &["*.md".into()]).unwrap();
        assert!(all.wants("a/b"));
        assert!(!all.wants("README.md"));
        assert!(Filter::new(&["[".into()], &[]).is_err());
    }
}
