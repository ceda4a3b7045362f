//! Sync jobs: the registry copies a remote source (a bucket, another registry, a Hugging Face Hub
//! repository) into a new sealed version, without the data passing through the user's machine.
//!
//! A sync is a durable job ([`crate::jobs`]). Its spec names what to copy; where the source is
//! served from and the credentials to read it come from the registry's configuration
//! ([`crate::config::SyncSource`]). Each finished file is recorded as the job goes
//! (`job_files`), so an attempt after a restart copies only the files not yet done; the source's
//! revision is pinned by the first attempt, so every attempt copies the same thing, and the version
//! sealed in the end is the one an uninterrupted run would have sealed.

mod oci;
mod remote;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures_util::{StreamExt, TryStreamExt};
use globset::{Glob, GlobSet, GlobSetBuilder};
use vial_core::chunking::DEFAULT_PARAMS;
use vial_core::volume::{build_layout_for, validate_path, ChunkRef, ChunkingInfo, TreeBuilder};
use vial_core::{Digest, Reference, RepoName, Tag};

use crate::seal::{chunk_and_store, SealError};
use crate::service::publish::{commit_layout, Publish};
use crate::service::Service;
use crate::storage::{CommitManifestError, Job, JobFile, Presence, StorageError, TagPrecondition};

use remote::RemoteFile;

/// The job kind under which syncs run.
pub const SYNC_JOB: &str = "sync";

/// Files of a bucket or Hub repository copied at once: chunking is CPU-bound and the machine that
/// runs the registry serves requests too.
const PARALLEL_FILES: usize = 2;
/// Small files copied at once: each is a request to the source and a durable write or two here,
/// time spent waiting, not chunking (20,000 files of 3 KB took 390 s two at a time).
const PARALLEL_SMALL_FILES: usize = 32;
/// Files up to this size count as small.
const SMALL_FILE: u64 = 1 << 20;

/// What a sync was asked to do. This is the body of the request that starts one and is stored
/// with the job.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SyncSpec {
    /// `s3://bucket/prefix`, `oci://host/repo:tag` (or `@digest`), `hf://org/repo[@revision]`
    /// (`hf://datasets/org/repo` for a dataset).
    pub source: String,
    /// The tag the sealed version gets.
    pub tag: String,
    /// Paths to copy (globs; `*` matches across `/`); none means every file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Paths to leave out, even if included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Reach an `oci://` source over plain HTTP.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub plain_http: bool,
    /// Who started the sync (set by the registry, for the tag history).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

/// How far a sync has come. Stored with the job as it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SyncProgress {
    /// The source revision the first attempt pinned (a Hub commit, a manifest digest), so that
    /// every attempt copies the same thing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinned: Option<String>,
    /// Files to copy (blobs, for an `oci://` source) and their bytes.
    pub files_total: u64,
    pub bytes_total: u64,
    /// Files and bytes done, in any attempt.
    pub files_done: u64,
    pub bytes_done: u64,
    /// Bytes read from the source by the current attempt; files an earlier attempt finished are
    /// not read again.
    pub bytes_read: u64,
}

/// A parsed source URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    S3 {
        bucket: String,
        prefix: String,
    },
    Oci(Reference),
    Hf {
        /// `models` or `datasets`.
        kind: &'static str,
        repo: String,
        revision: String,
    },
}

impl Source {
    pub fn parse(source: &str) -> Result<Source, String> {
        if let Some(rest) = source.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            let valid = !bucket.is_empty()
                && bucket
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
            if !valid {
                return Err(format!("{source:?}: expected s3://BUCKET[/PREFIX]"));
            }
            return Ok(Source::S3 {
                bucket: bucket.to_owned(),
                prefix: prefix.trim_matches('/').to_owned(),
            });
        }
        if let Some(rest) = source.strip_prefix("oci://") {
            let reference = Reference::parse(rest).map_err(|e| {
                format!("{source:?}: expected oci://HOST/REPOSITORY:TAG or @DIGEST: {e}")
            })?;
            if reference.tag().is_none() && reference.digest().is_none() {
                return Err(format!("{source:?}: name a tag or a digest to copy"));
            }
            return Ok(Source::Oci(reference));
        }
        if let Some(rest) = source.strip_prefix("hf://") {
            let (name, revision) = rest.split_once('@').unwrap_or((rest, "main"));
            let (kind, repo) = match name.strip_prefix("datasets/") {
                Some(repo) => ("datasets", repo),
                None => ("models", name.strip_prefix("models/").unwrap_or(name)),
            };
            let valid_part = |p: &str| {
                !p.is_empty()
                    && p != "."
                    && p != ".."
                    && p.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b))
            };
            let parts: Vec<&str> = repo.split('/').collect();
            if parts.is_empty() || parts.len() > 2 || !parts.iter().all(|p| valid_part(p)) {
                return Err(format!("{source:?}: expected hf://ORG/REPO[@REVISION] or hf://datasets/ORG/REPO[@REVISION]"));
            }
            if revision.is_empty()
                || revision.contains("..")
                || revision.bytes().any(|b| b.is_ascii_control())
            {
                return Err(format!("{source:?}: {revision:?} is not a revision"));
            }
            return Ok(Source::Hf {
                kind,
                repo: repo.to_owned(),
                revision: revision.to_owned(),
            });
        }
        Err(format!(
            "{source:?} is not a source vial can sync from: use s3://BUCKET/PREFIX, oci://HOST/REPO:TAG or hf://ORG/REPO[@REVISION]"
        ))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// The job cannot succeed as asked; trying again will not help.
    #[error("{0}")]
    Invalid(String),
    /// The source failed to answer, or answered wrongly.
    #[error("{message}")]
    Source { message: String, transient: bool },
    #[error(transparent)]
    Seal(#[from] SealError),
    #[error("storage")]
    Storage(#[from] StorageError),
    /// The job was cancelled, or another runner took it over; nothing more may be recorded.
    #[error("the job is no longer held by this attempt (cancelled, or taken over)")]
    Lost,
}

impl SyncError {
    pub fn is_transient(&self) -> bool {
        match self {
            SyncError::Source { transient, .. } => *transient,
            SyncError::Seal(e) => e.is_transient(),
            SyncError::Storage(_) => true,
            SyncError::Invalid(_) | SyncError::Lost => false,
        }
    }

    fn source(message: impl Into<String>, transient: bool) -> SyncError {
        SyncError::Source {
            message: message.into(),
            transient,
        }
    }
}

impl From<CommitManifestError> for SyncError {
    fn from(e: CommitManifestError) -> SyncError {
        match e {
            CommitManifestError::Storage(s) => SyncError::Storage(s),
            CommitManifestError::TagMoved { tag, current, .. } => SyncError::Invalid(format!(
                "tag {tag} was set meanwhile (it points at {}); it was not moved",
                current.map_or_else(|| "nothing".to_owned(), |d| d.to_string())
            )),
            // Chunks collected meanwhile (a sync that outlived the GC grace period): the next
            // attempt finds them missing and copies those files again.
            e @ (CommitManifestError::MissingBlobs(_)
            | CommitManifestError::MissingManifests(_)) => {
                SyncError::source(format!("committing the synced version: {e}"), true)
            }
            e @ CommitManifestError::SizeMismatch { .. } => {
                SyncError::Invalid(format!("committing the synced version: {e}"))
            }
        }
    }
}

/// The include and exclude filters of a spec.
#[derive(Debug)]
pub struct Filter {
    include: Option<GlobSet>,
    exclude: GlobSet,
}

impl Filter {
    pub fn new(include: &[String], exclude: &[String]) -> Result<Filter, String> {
        let set = |patterns: &[String]| {
            let mut b = GlobSetBuilder::new();
            for p in patterns {
                b.add(Glob::new(p).map_err(|e| format!("bad glob {p:?}: {e}"))?);
            }
            b.build().map_err(|e| e.to_string())
        };
        Ok(Filter {
            include: if include.is_empty() {
                None
            } else {
                Some(set(include)?)
            },
            exclude: set(exclude)?,
        })
    }

    pub fn wants(&self, path: &str) -> bool {
        self.include.as_ref().is_none_or(|s| s.is_match(path)) && !self.exclude.is_match(path)
    }
}

/// Why a spec cannot be queued.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("{0}")]
    Invalid(String),
    /// The registry's operator did not allow the source.
    #[error("this registry may not sync from {0}: an operator allows sources with [[sync-sources]] in the config file or `vial serve --sync-source PREFIX` (docs/sync.md)")]
    NotAllowed(String),
}

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

/// One attempt at a job, with what it has recorded so far.
///
/// Copies run concurrently and each records its own outcome: nothing waits on the database
/// outside the futures being polled, since a suspended future may hold the (SQLite: only) write
/// connection in the middle of a transaction.
struct Run {
    service: Arc<Service>,
    job: Job,
    progress: Mutex<SyncProgress>,
    publish: Publish,
    /// The job's repository.
    repo: RepoName,
}

impl Run {
    fn repo(&self) -> &RepoName {
        &self.repo
    }

    fn progress(&self) -> std::sync::MutexGuard<'_, SyncProgress> {
        // A panic while the lock was held leaves counters, not invariants, behind.
        self.progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn progress_json(&self) -> String {
        serde_json::to_string(&*self.progress()).unwrap_or_default()
    }

    async fn save_progress(&self) -> Result<(), SyncError> {
        let held = self
            .service
            .meta
            .save_job_progress(&self.job.id, self.job.attempts, &self.progress_json())
            .await?;
        if held {
            Ok(())
        } else {
            Err(SyncError::Lost)
        }
    }

    async fn save_file(&self, file: &JobFile) -> Result<(), SyncError> {
        let held = self
            .service
            .meta
            .save_job_file(&self.job.id, self.job.attempts, file, &self.progress_json())
            .await?;
        if held {
            Ok(())
        } else {
            Err(SyncError::Lost)
        }
    }
}

/// A file finished by this or an earlier attempt.
#[derive(serde::Serialize, serde::Deserialize)]
struct FileEntry {
    size: u64,
    chunks: Vec<ChunkRef>,
}

/// Copies the files of a bucket or Hub repository, chunking each as `vial push` does, and seals
/// them into a version.
async fn sync_files(
    run: &Run,
    spec: &SyncSpec,
    remote: &remote::Remote,
) -> Result<Digest, SyncError> {
    let filter = Filter::new(&spec.include, &spec.exclude).map_err(SyncError::Invalid)?;
    let earlier = run.progress().pinned.clone();
    let (pinned, listing) = remote.list(earlier.as_deref()).await?;
    if earlier.is_none() {
        run.progress().pinned = pinned;
    }
    let mut files: Vec<RemoteFile> = listing
        .into_iter()
        .filter(|f| filter.wants(&f.path))
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    if files.is_empty() {
        return Err(SyncError::Invalid(format!(
            "{} holds no file to copy{}",
            spec.source,
            if spec.include.is_empty() && spec.exclude.is_empty() {
                ""
            } else {
                " that the filters let through"
            }
        )));
    }
    for f in &files {
        validate_path(&f.path).map_err(|e| {
            SyncError::Invalid(format!(
                "{}: {:?} cannot be a path in a volume: {e}",
                spec.source, f.path
            ))
        })?;
    }

    // What earlier attempts finished, if the file is still the same and its chunks still here.
    let mut finished: HashMap<String, JobFile> = run
        .service
        .meta
        .job_files(&run.job.id)
        .await?
        .into_iter()
        .map(|f| (f.path.clone(), f))
        .collect();
    let mut done: HashMap<String, Vec<ChunkRef>> = HashMap::new();
    for f in &files {
        let Some(prior) = finished.remove(&f.path) else {
            continue;
        };
        let Ok(entry) = serde_json::from_str::<FileEntry>(&prior.entry) else {
            continue;
        };
        if prior.version != f.version || entry.size != f.size {
            continue;
        }
        if chunks_present(run, &entry.chunks).await? {
            done.insert(f.path.clone(), entry.chunks);
        }
    }
    {
        let mut p = run.progress();
        p.files_total = files.len() as u64;
        p.bytes_total = files.iter().map(|f| f.size).sum();
        p.files_done = done.len() as u64;
        p.bytes_done = files
            .iter()
            .filter(|f| done.contains_key(&f.path))
            .map(|f| f.size)
            .sum();
    }
    run.save_progress().await?;
    tracing::info!(
        job = %run.job.id,
        source = %spec.source,
        files = files.len(),
        bytes = run.progress().bytes_total,
        resumed_files = done.len(),
        "sync: copying files"
    );

    let todo: Vec<&RemoteFile> = files
        .iter()
        .filter(|f| !done.contains_key(&f.path))
        .collect();
    // The futures are built up front: a stream of closures that borrow would not be `Send` for
    // every lifetime, which the job runner's task needs.
    let copies: Vec<_> = todo
        .into_iter()
        .map(|f| {
            (f.size <= SMALL_FILE, async move {
                let reader = remote.open(f).await?;
                // A read that fails midway is most often the network: worth another attempt, which
                // keeps what this one finished.
                let chunks = chunk_and_store(&run.service, run.repo(), &f.path, f.size, reader)
                    .await
                    .map_err(|e| match e {
                        SealError::Content { message, .. } => SyncError::source(
                            format!("reading {} from {}: {message}", f.path, spec.source),
                            true,
                        ),
                        other => other.into(),
                    })?;
                {
                    let mut p = run.progress();
                    p.files_done += 1;
                    p.bytes_done += f.size;
                    p.bytes_read += f.size;
                }
                let entry = FileEntry {
                    size: f.size,
                    chunks,
                };
                run.save_file(&JobFile {
                    path: f.path.clone(),
                    version: f.version.clone(),
                    entry: serde_json::to_string(&entry).unwrap_or_default(),
                })
                .await?;
                Ok::<_, SyncError>((f, entry.chunks))
            })
        })
        .collect();
    let (small, large): (Vec<_>, Vec<_>) = copies.into_iter().partition(|(small, _)| *small);
    let small: Vec<_> = small.into_iter().map(|(_, copy)| copy).collect();
    let large: Vec<_> = large.into_iter().map(|(_, copy)| copy).collect();
    // Both at once: a small file the source is slow to send must not hold up the large ones.
    let mut copies = futures_util::stream::select(
        futures_util::stream::iter(small).buffer_unordered(PARALLEL_SMALL_FILES),
        futures_util::stream::iter(large).buffer_unordered(PARALLEL_FILES),
    );
    while let Some((f, chunks)) = copies.try_next().await? {
        done.insert(f.path.clone(), chunks);
    }
    drop(copies);

    let mut builder = TreeBuilder::new(ChunkingInfo::v1(DEFAULT_PARAMS));
    for f in &files {
        let chunks = done.remove(&f.path).unwrap_or_default();
        builder
            .add_file(&f.path, 0o644, chunks)
            .map_err(|e| SyncError::Invalid(format!("{}: {e}", f.path)))?;
    }
    let tree = builder
        .finish()
        .map_err(|e| SyncError::Invalid(format!("{}: {e}", spec.source)))?;
    let layout = build_layout_for(&tree, None);
    // A cancel (or a takeover) that came in meanwhile stops the job before it publishes.
    run.save_progress().await?;
    let digest = layout.index.digest.clone();
    published(
        commit_layout(&run.service, run.repo(), &layout, &run.publish).await,
        &digest,
    )?;
    Ok(digest)
}

/// The outcome of committing `digest` with the job's tag. An immutable tag that already points at
/// `digest` is this job's own earlier attempt, not a conflict.
fn published(result: Result<(), CommitManifestError>, digest: &Digest) -> Result<(), SyncError> {
    match result {
        Err(CommitManifestError::TagMoved {
            current: Some(current),
            ..
        }) if &current == digest => Ok(()),
        other => other.map_err(SyncError::from),
    }
}

/// Whether every chunk is still in the registry (and linked to the job's repository).
async fn chunks_present(run: &Run, chunks: &[ChunkRef]) -> Result<bool, StorageError> {
    let mut digests: Vec<Digest> = chunks.iter().map(|c| c.digest.clone()).collect();
    digests.sort();
    digests.dedup();
    for batch in digests.chunks(4096) {
        let present = run
            .service
            .meta
            .link_present_blobs(run.repo(), batch, Presence::LinkAcross)
            .await?;
        if present.len() != batch.len() {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

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
