//! The metadata store facade: repositories, blob links, manifests, tags and upload sessions, with one
//! method per use case and one transaction per method.

use std::collections::BTreeMap;

use async_trait::async_trait;
use vial_core::manifest::{Descriptor, Referenced};
use vial_core::{Digest, RepoName, Tag, Target};

use super::StorageError;

/// A manifest ready to be committed: its bytes and what the registry learnt by parsing them.
#[derive(Debug, Clone)]
pub struct ManifestRecord {
    pub digest: Digest,
    pub media_type: String,
    pub artifact_type: Option<String>,
    pub subject: Option<Digest>,
    pub annotations: Option<BTreeMap<String, String>>,
    pub content: Vec<u8>,
    /// Blobs that must be linked to the repository (config and layers), at the sizes declared.
    pub blobs: Vec<Referenced>,
    /// Manifests that must already be in the repository (an index's children), at the sizes
    /// declared.
    pub children: Vec<Referenced>,
    /// Whether children may be missing: an image index that is not a vial volume may be sparse
    /// (a partial multi-platform copy); a child that is present must still match its size.
    pub sparse: bool,
    /// Who pushed it, for the tag history.
    pub pushed_by: Option<String>,
    /// When the tags this push sets stop resolving (Unix milliseconds); `None` never.
    pub tags_expire_at: Option<i64>,
}

/// One move of a tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TagEvent {
    pub from: Option<Digest>,
    pub to: Option<Digest>,
    pub at: i64,
    pub actor: Option<String>,
    /// `push`, `delete`, `version-deleted`, `restore` or `expired`.
    pub reason: String,
}

/// What a presence check ([`BlobMeta::link_present_blobs`]) may change besides answering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    /// Nothing: say which blobs the repository holds (a caller who may only pull).
    Answer,
    /// Keep the blobs the repository holds out of the next collection's reach for the grace
    /// period (a pusher about to reference them).
    Touch,
    /// Also link blobs the registry holds in other repositories (a pusher who may pull from
    /// every repository, or the registry's own jobs).
    LinkAcross,
}

/// Asks the blob store whether a blob's bytes are there.
pub type StoredCheck =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<bool, StorageError>> + Send>>;

/// Deletes a blob's bytes from the blob store.
pub type BytesDeletion =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), StorageError>> + Send>>;

/// A condition on where a tag points before a manifest push moves it (HTTP `If-Match` /
/// `If-None-Match: *` on the manifest PUT), for compare-and-swap tag moves.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum TagPrecondition {
    #[default]
    None,
    /// The tag must not exist yet.
    Absent,
    /// The tag must point at this digest now.
    At(Digest),
}

/// A sealed version as `vial versions` lists it.
#[derive(Debug, Clone)]
pub struct VersionRow {
    pub digest: Digest,
    pub created_at: i64,
    pub annotations: Option<BTreeMap<String, String>>,
    /// Tags pointing at it; for a deleted version, the tags that pointed at it when it was deleted.
    pub tags: Vec<String>,
    /// When it was deleted (Unix milliseconds), for a deleted version.
    pub deleted_at: Option<i64>,
    pub deleted_by: Option<String>,
}

/// A stretch of a listing: `limit` rows after the first `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub offset: u64,
    pub limit: u32,
}

impl Window {
    /// Every row.
    pub const ALL: Window = Window {
        offset: 0,
        limit: u32::MAX,
    };
}

/// Live versions counted: how many, and the bytes of their files.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VersionTotals {
    pub versions: u64,
    pub bytes: u64,
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Remembered tags pointed at the version again.
    pub tags: Vec<String>,
    /// Remembered tags left alone because they now point elsewhere.
    pub tags_moved_on: Vec<String>,
}

/// A node's claim that it has a version mounted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub holder: String,
    pub expires_at: i64,
}

/// A manifest as stored.
#[derive(Debug, Clone)]
pub struct StoredManifest {
    pub digest: Digest,
    pub media_type: String,
    pub content: Vec<u8>,
}

/// Why a manifest could not be committed, other than a backend failure.
#[derive(Debug, thiserror::Error)]
pub enum CommitManifestError {
    #[error("manifest references blobs the repository does not hold: {}", list(.0))]
    MissingBlobs(Vec<Digest>),
    #[error("index references manifests the repository does not hold: {}", list(.0))]
    MissingManifests(Vec<Digest>),
    #[error("manifest declares {digest} as {declared} bytes, but it is {actual}")]
    SizeMismatch {
        digest: Digest,
        declared: u64,
        actual: u64,
    },
    #[error("tag {tag} points at {current:?}, not at the expected {expected:?}")]
    TagMoved {
        tag: String,
        current: Option<Digest>,
        expected: TagPrecondition,
    },
    #[error(transparent)]
    Storage(#[from] StorageError),
}

fn list(digests: &[Digest]) -> String {
    digests
        .iter()
        .map(Digest::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

impl From<sqlx::Error> for CommitManifestError {
    fn from(e: sqlx::Error) -> Self {
        CommitManifestError::Storage(e.into())
    }
}

/// An upload session's metadata. Its bytes are in the blob store under the same id.
#[derive(Debug, Clone)]
pub struct UploadSession {
    pub id: String,
    pub repository: RepoName,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Where a blob's bytes are: stored whole under its own digest, or as a range of something else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlobLocation {
    pub size: u64,
    /// What holds these bytes, and their offset in it; `None` for a blob stored whole.
    pub source: Option<(Source, u64)>,
}

/// What holds the bytes of a blob that has no object of its own.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    /// Another blob stored whole: a chunk of a file layer an artifact was sealed from.
    Blob(Digest),
    /// A pack: chunks uploaded together in one request (`POST /_vial/packs`).
    Pack(super::PackId),
}

/// Written as the blob's digest, or `pack:<id>`: the string form records of sealed layers keep
/// (those written before packs existed hold plain digests, and still read).
impl serde::Serialize for Source {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Source::Blob(d) => s.serialize_str(d.as_str()),
            Source::Pack(p) => s.serialize_str(&format!("pack:{p}")),
        }
    }
}

impl<'de> serde::Deserialize<'de> for Source {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        match text.strip_prefix("pack:") {
            Some(id) => super::PackId::parse(id)
                .map(Source::Pack)
                .ok_or_else(|| serde::de::Error::custom(format!("bad pack id {id:?}"))),
            None => Digest::parse(&text)
                .map(Source::Blob)
                .map_err(serde::de::Error::custom),
        }
    }
}

/// A chunk of a pack: its digest, its size and its offset in the pack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedChunk {
    pub digest: Digest,
    pub size: u64,
    pub offset: u64,
}

/// A chunk stored as a byte range of a blob that is stored whole, or of a pack.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RangeChunk {
    pub digest: Digest,
    pub size: u64,
    pub source: Source,
    pub offset: u64,
}

/// Where a job is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum JobState {
    Queued,
    Running,
    Done,
    Failed,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        Some(match s {
            "queued" => JobState::Queued,
            "running" => JobState::Running,
            "done" => JobState::Done,
            "failed" => JobState::Failed,
            _ => return None,
        })
    }
}

/// A durable background job: one per kind, repository and target.
#[derive(Debug, Clone)]
pub struct Job {
    pub id: String,
    pub kind: String,
    /// The repository the job works in; `None` for a job over the whole registry (a garbage
    /// collection pass).
    pub repository: Option<RepoName>,
    pub target: String,
    pub state: JobState,
    /// What a finished job produced (a sealed volume's digest).
    pub result: Option<String>,
    /// Why the last attempt failed.
    pub error: Option<String>,
    /// How many times the job was claimed; fences a worker whose lease lapsed.
    pub attempts: i64,
    pub created_at: i64,
    pub updated_at: i64,
    /// What was asked, for jobs that carry more than a target (a sync's source and filters; JSON).
    pub spec: Option<String>,
    /// What the job has done so far (JSON), for status reports and resuming.
    pub progress: Option<String>,
}

impl Job {
    /// The job's repository, or `-` for a job over the whole registry: for logs and pages.
    pub fn scope(&self) -> &str {
        self.repository.as_ref().map_or("-", RepoName::as_str)
    }
}

/// A file a job has finished: which copy of it was read, and what came of it (JSON).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobFile {
    pub path: String,
    pub version: String,
    pub entry: String,
}

/// How an attempt at a job ended.
#[derive(Debug, Clone)]
pub enum JobOutcome {
    Done(String),
    Failed(String),
    /// A transient failure: try again, not before the given time (Unix milliseconds).
    Retry {
        error: String,
        not_before: i64,
    },
}

/// One page of a sorted listing, and whether more follow it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<String>,
    pub more: bool,
}

/// Blobs: which repository holds which blob, where its bytes are, and collecting the ones nothing needs.
#[async_trait]
pub trait BlobMeta: Send + Sync {
    /// The size of a blob if it is linked to `repo`.
    async fn blob_in_repo(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, StorageError>;

    /// Records a verified blob the blob store holds and links it to `repo`. `stored` is asked,
    /// while the blob's row is held, whether the bytes are still there: a garbage collection that
    /// removed them between their upload and this call makes it fail rather than record a blob
    /// without bytes (docs/gc.md).
    async fn commit_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        size: u64,
        stored: StoredCheck,
    ) -> Result<(), StorageError>;

    /// Links a blob held by `from` to `to` (cross-repository mount). Returns its size, or `None` when
    /// `from` does not hold it.
    async fn mount_blob(
        &self,
        from: &RepoName,
        to: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, StorageError>;

    /// Removes a blob's link from `repo`. Returns whether it was linked.
    async fn unlink_blob(&self, repo: &RepoName, digest: &Digest) -> Result<bool, StorageError>;

    /// Of `digests`, those the repository holds after the call: blobs already linked, and, with
    /// [`Presence::LinkAcross`], blobs the registry holds in another repository, which are
    /// linked (a bulk cross-repository mount). Only `LinkAcross` may create the repository.
    async fn link_present_blobs(
        &self,
        repo: &RepoName,
        digests: &[Digest],
        presence: Presence,
    ) -> Result<Vec<Digest>, StorageError>;

    /// Records that a pack's bytes are about to be stored, before they are: a pack whose request
    /// dies before [`BlobMeta::commit_pack`] is then found by [`BlobMeta::stale_packs`].
    async fn begin_pack(&self, pack: &super::PackId, size: u64) -> Result<(), StorageError>;

    /// Packs begun before `created_before` and never committed, oldest first.
    async fn stale_packs(
        &self,
        created_before: i64,
        limit: u32,
    ) -> Result<Vec<super::PackId>, StorageError>;

    /// Forgets a pack that was never committed (its bytes are gone).
    async fn drop_pack(&self, pack: &super::PackId) -> Result<(), StorageError>;

    /// Commits a begun pack whose verified bytes the blob store holds: its chunks as ranges of
    /// it, every chunk linked to `repo`. One transaction, so a pack's chunks appear together or
    /// not at all. A chunk the registry already holds keeps where it is.
    async fn commit_pack(
        &self,
        repo: &RepoName,
        pack: &super::PackId,
        size: u64,
        chunks: &[PackedChunk],
    ) -> Result<(), StorageError>;

    /// Where the bytes of each of `digests` that `repo` holds are; the others are left out.
    async fn blob_locations(
        &self,
        repo: &RepoName,
        digests: &[Digest],
    ) -> Result<std::collections::HashMap<Digest, BlobLocation>, StorageError>;

    /// How many blobs the registry holds and their bytes, each counted once.
    async fn stored_totals(&self) -> Result<(u64, u64), StorageError>;

    /// Where the bytes of a blob linked to `repo` are, or `None` if `repo` does not hold it.
    async fn blob_location(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<BlobLocation>, StorageError>;

    /// Records chunks that are ranges of stored blobs and links them to `repo`. A chunk the
    /// registry already knows keeps the bytes it has.
    async fn commit_range_chunks(
        &self,
        repo: &RepoName,
        chunks: &[RangeChunk],
    ) -> Result<(), StorageError>;
}

/// A batch of collection candidates, and where the next batch starts (`None`: none is left).
#[derive(Debug)]
pub struct Candidates<T> {
    /// How many candidates the batch looked at.
    pub examined: u64,
    pub ready: Vec<T>,
    /// Opaque to the caller: passed back as `after` to read the next batch.
    pub next: Option<String>,
}

/// A blob a collection pass may remove: its size and whether it has bytes of its own (a chunk
/// that is a range of a pack or of another blob does not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Garbage {
    pub digest: Digest,
    pub size: u64,
    pub own_bytes: bool,
    /// The pack its bytes are a range of, if they are.
    pub pack: Option<super::PackId>,
}

/// What a collection pass would remove: the dry run's answer.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct GcEstimate {
    pub blobs: u64,
    /// Bytes of the blobs with bytes of their own, and of the packs.
    pub bytes: u64,
    pub packs: u64,
    /// Bytes of the committed packs now, and of them, the bytes no live chunk covers.
    pub pack_bytes: u64,
    pub pack_dead_bytes: u64,
    /// The same once the pass has run: the chunks it collects leave dead bytes in the packs that
    /// keep a live chunk.
    pub pack_bytes_after: u64,
    pub pack_dead_bytes_after: u64,
    /// The bytes of the chunks the pass collects in each pack (removed or not), which compaction
    /// then finds dead.
    pub pack_freed: Vec<(super::PackId, u64)>,
}

/// What garbage collection reads and removes (docs/gc.md). Candidates are the blobs and packs that
/// are new or may have lost their last reference since the last pass, so a pass costs in proportion
/// to what changed, not to the size of the registry.
#[async_trait]
pub trait GcMeta: Send + Sync {
    /// Why collection must not run, if it must not (an index it relies on is missing or invalid).
    async fn gc_blocker(&self) -> Result<Option<String>, StorageError>;

    /// Looks at up to `limit` blob candidates after `after` (the `next` of the batch before, or
    /// `None` for the first): those referenced by a
    /// manifest (live or deleted), the source of a range chunk, or gone stop being candidates; those
    /// nothing references and nobody touched since `touched_before` are returned; the rest (touched
    /// recently) stay for a later pass.
    async fn blob_candidates(
        &self,
        after: Option<&str>,
        touched_before: i64,
        limit: u32,
    ) -> Result<Candidates<Garbage>, StorageError>;

    /// Removes those of `digests` that are still unreferenced and untouched once their rows are
    /// locked, in one transaction: `delete_bytes` runs under the locks for each blob with bytes of
    /// its own, before its row goes; a blob whose bytes could not be deleted keeps its row.
    /// Returns what was removed.
    async fn collect_blobs(
        &self,
        digests: &[Digest],
        touched_before: i64,
        delete_bytes: &(dyn Fn(Digest) -> BytesDeletion + Send + Sync),
    ) -> Result<Vec<Garbage>, StorageError>;

    /// [`GcMeta::blob_candidates`] for packs: committed packs created before `created_before` that
    /// no chunk lives in, with their sizes; packs some chunk lives in stop being candidates.
    async fn pack_candidates(
        &self,
        after: Option<&str>,
        created_before: i64,
        limit: u32,
    ) -> Result<Candidates<(super::PackId, u64)>, StorageError>;

    /// Removes those of `packs` no chunk lives in once their rows are locked; `delete_bytes` runs
    /// under the locks, before each row goes. Returns what was removed.
    async fn collect_packs(
        &self,
        packs: &[super::PackId],
        created_before: i64,
        delete_bytes: &(dyn Fn(super::PackId) -> BytesDeletion + Send + Sync),
    ) -> Result<Vec<(super::PackId, u64)>, StorageError>;

    /// What a pass would remove after purging `purged` (deleted manifests past their retention),
    /// changing nothing.
    async fn gc_estimate(
        &self,
        purged: &[(RepoName, Digest)],
        touched_before: i64,
        created_before: i64,
    ) -> Result<GcEstimate, StorageError>;
}

/// Upload sessions (their bytes are in the blob store under the same id).
#[async_trait]
pub trait UploadMeta: Send + Sync {
    async fn create_upload(&self, session: &UploadSession) -> Result<(), StorageError>;

    async fn get_upload(
        &self,
        repo: &RepoName,
        id: &str,
    ) -> Result<Option<UploadSession>, StorageError>;

    async fn touch_upload(&self, id: &str) -> Result<(), StorageError>;

    async fn delete_upload(&self, id: &str) -> Result<(), StorageError>;

    /// Sessions not touched since `before_millis`, oldest first.
    async fn stale_uploads(
        &self,
        before_millis: i64,
        limit: u32,
    ) -> Result<Vec<UploadSession>, StorageError>;

    async fn count_uploads(&self) -> Result<u64, StorageError>;
}

/// Manifests: commits, reads, soft deletion, restore and purge, and the listings built on them.
#[async_trait]
pub trait ManifestMeta: Send + Sync {
    /// When a deleted (and not yet purged) manifest was deleted, and by whom: what a client
    /// asking for it is told, so it learns it can be restored.
    async fn deleted_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<(i64, Option<String>)>, StorageError>;

    /// Stores a manifest and points `tags` at it, after checking that everything it references is in
    /// the repository.
    async fn commit_manifest(
        &self,
        repo: &RepoName,
        manifest: &ManifestRecord,
        tags: &[Tag],
        precondition: &TagPrecondition,
    ) -> Result<(), CommitManifestError>;

    async fn get_manifest(
        &self,
        repo: &RepoName,
        target: &Target,
    ) -> Result<Option<StoredManifest>, StorageError>;

    /// Soft-deletes a manifest: hides it and removes the tags pointing at it, remembering them.
    /// Returns whether a live manifest was there.
    async fn delete_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
        by: Option<&str>,
    ) -> Result<bool, StorageError>;

    /// Brings back a manifest deleted at or after `deleted_since` (Unix milliseconds), and with
    /// `with_tags` the tags it had that nobody has taken since. `None` when there is no such
    /// deleted manifest.
    async fn restore_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
        deleted_since: i64,
        with_tags: bool,
    ) -> Result<Option<Restored>, StorageError>;

    /// Deleted manifests (repository, digest, deleted at) deleted at or after `since` and before
    /// `before`, oldest first.
    async fn deleted_before(
        &self,
        since: i64,
        before: i64,
        limit: u32,
    ) -> Result<Vec<(RepoName, Digest, i64)>, StorageError>;

    /// Removes deleted manifests for good, in one transaction (their tags and references go with
    /// them, and so do the children no other manifest lists and no tag names). Returns those of
    /// `versions` that were there, still deleted.
    async fn purge_manifests(
        &self,
        versions: &[(RepoName, Digest)],
    ) -> Result<Vec<(RepoName, Digest)>, StorageError>;

    /// Manifests in `repo` whose subject is `subject`, optionally only those of one artifact type.
    async fn referrers(
        &self,
        repo: &RepoName,
        subject: &Digest,
        artifact_type: Option<&str>,
    ) -> Result<Vec<Descriptor>, StorageError>;

    /// Manifests of `artifact_type` in `repo`, newest first, with the tags pointing at each; with
    /// `deleted`, the deleted ones instead, most recently deleted first, with their remembered tags.
    async fn list_versions(
        &self,
        repo: &RepoName,
        artifact_type: &str,
        deleted: bool,
        window: Window,
    ) -> Result<Option<Vec<VersionRow>>, StorageError>;

    /// How many live manifests of `artifact_type` `repo` holds (every repository's, for `None`),
    /// and the sum of their [`vial_core::volume::ANNOTATION_BYTES`] annotations: one indexed
    /// count, not a listing.
    async fn version_totals(
        &self,
        repo: Option<&RepoName>,
        artifact_type: &str,
    ) -> Result<VersionTotals, StorageError>;

    /// The live manifest of `artifact_type` listed right after `digest` in [`list_versions`]'s
    /// order (the version pushed before it), with `digest`'s own creation time; `None` when
    /// `digest` is not a live one.
    ///
    /// [`list_versions`]: ManifestMeta::list_versions
    async fn version_before(
        &self,
        repo: &RepoName,
        artifact_type: &str,
        digest: &Digest,
    ) -> Result<Option<(i64, Option<Digest>)>, StorageError>;

    /// Repository names in lexical order after `last`.
    async fn list_repositories(&self, last: Option<&str>, limit: u32)
        -> Result<Page, StorageError>;
}

/// Tags: where they point, their history, removal and expiry. Tags move as part of a manifest commit ([`ManifestMeta::commit_manifest`]).
#[async_trait]
pub trait TagMeta: Send + Sync {
    /// Deletes a tag, leaving its manifest. Returns whether it existed.
    async fn delete_tag(
        &self,
        repo: &RepoName,
        tag: &Tag,
        by: Option<&str>,
    ) -> Result<bool, StorageError>;

    /// Every move of a tag, oldest first. `None` when the repository is unknown.
    async fn tag_history(
        &self,
        repo: &RepoName,
        tag: &Tag,
    ) -> Result<Option<Vec<TagEvent>>, StorageError>;

    /// Removes tags whose expiry has passed by `now`, recording why. Returns (repository, tag).
    async fn expire_tags(&self, now: i64) -> Result<Vec<(RepoName, String)>, StorageError>;

    /// The tags pointing at a manifest now.
    async fn manifest_tags(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Vec<String>, StorageError>;

    /// Where a tag points now, if it exists and has not expired.
    async fn tag_target(&self, repo: &RepoName, tag: &Tag) -> Result<Option<Digest>, StorageError>;

    /// Tags of `repo` in lexical order after `last`, or `None` when the repository is unknown.
    async fn list_tags(
        &self,
        repo: &RepoName,
        last: Option<&str>,
        limit: u32,
    ) -> Result<Option<Page>, StorageError>;

    /// Tag moves as they commit: in this process, and on PostgreSQL on every replica sharing the
    /// database. A notice says which tag may have moved, not where to: a reader asks
    /// [`TagMeta::tag_target`] once per notice, however many of its clients wait on the tag.
    fn tag_moves(&self) -> tokio::sync::broadcast::Receiver<TagMoved>;
}

/// A notice from [`TagMeta::tag_moves`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TagMoved {
    /// This tag was set, moved or removed.
    Tag(RepoName, String),
    /// Notices may have been lost (the connection that hears other replicas was re-established):
    /// any tag may have moved.
    Lost,
}

/// Leases: nodes that say they have a version mounted.
#[async_trait]
pub trait LeaseMeta: Send + Sync {
    /// Records or renews `holder`'s lease on a version until `expires_at`.
    async fn put_lease(
        &self,
        repo: &RepoName,
        digest: &Digest,
        holder: &str,
        expires_at: i64,
    ) -> Result<(), StorageError>;

    /// Drops a lease. Returns whether it was there.
    async fn drop_lease(
        &self,
        repo: &RepoName,
        digest: &Digest,
        holder: &str,
    ) -> Result<bool, StorageError>;

    /// Removes leases that expired before `before` (nodes that died holding them).
    async fn drop_expired_leases(&self, before: i64) -> Result<u64, StorageError>;

    /// Leases on a version that have not expired by `now`.
    async fn leases(
        &self,
        repo: &RepoName,
        digest: &Digest,
        now: i64,
    ) -> Result<Vec<Lease>, StorageError>;
}

/// Durable background jobs: seals, syncs and asked-for collection passes.
#[async_trait]
pub trait JobMeta: Send + Sync {
    /// Creates the job for (`kind`, `repo`, `target`) unless it exists, and returns it. With
    /// `retry_failed`, a failed job is queued again.
    async fn enqueue_job(
        &self,
        kind: &str,
        repo: &RepoName,
        target: &str,
        retry_failed: bool,
    ) -> Result<Job, StorageError>;

    async fn get_job(
        &self,
        kind: &str,
        repo: &RepoName,
        target: &str,
    ) -> Result<Option<Job>, StorageError>;

    /// Claims the oldest job that is queued and due, or running under a lapsed lease, holding it
    /// for `lease_millis`.
    async fn claim_job(&self, lease_millis: i64) -> Result<Option<Job>, StorageError>;

    /// Extends the lease of a job still held by the attempt `attempts`; false if it was lost.
    async fn renew_job(
        &self,
        id: &str,
        attempts: i64,
        lease_millis: i64,
    ) -> Result<bool, StorageError>;

    /// Creates a job that is its own target (each sync is a new job) with its spec, queued;
    /// `repo` is `None` for a job over the whole registry.
    async fn create_job(
        &self,
        kind: &str,
        repo: Option<&RepoName>,
        spec: &str,
    ) -> Result<Job, StorageError>;

    /// The oldest job of `kind` over the whole registry that is queued or running.
    async fn unfinished_registry_job(&self, kind: &str) -> Result<Option<Job>, StorageError>;

    async fn job_by_id(&self, id: &str) -> Result<Option<Job>, StorageError>;

    /// The most recently updated jobs of every kind and repository.
    async fn recent_jobs(&self, limit: u32) -> Result<Vec<Job>, StorageError>;

    /// The jobs of a kind in `repo`, newest first.
    async fn list_jobs(
        &self,
        kind: &str,
        repo: &RepoName,
        limit: u32,
    ) -> Result<Vec<Job>, StorageError>;

    /// Stops a job that has not finished: it fails with `reason`, and the runner holding it loses
    /// its lease at the next renewal. Returns the job as it now is, or `None` if there is no such
    /// job.
    async fn cancel_job(&self, id: &str, reason: &str) -> Result<Option<Job>, StorageError>;

    /// Records a file the attempt `attempts` finished, with the job's progress; false if the job
    /// is no longer held by that attempt (cancelled, or taken over).
    async fn save_job_file(
        &self,
        id: &str,
        attempts: i64,
        file: &JobFile,
        progress: &str,
    ) -> Result<bool, StorageError>;

    /// Records the job's progress; false if the attempt no longer holds it.
    async fn save_job_progress(
        &self,
        id: &str,
        attempts: i64,
        progress: &str,
    ) -> Result<bool, StorageError>;

    /// The files a job has finished, in any attempt.
    async fn job_files(&self, id: &str) -> Result<Vec<JobFile>, StorageError>;

    /// Records how the attempt `attempts` ended; false if the job was no longer held by it.
    async fn finish_job(
        &self,
        id: &str,
        attempts: i64,
        outcome: &JobOutcome,
    ) -> Result<bool, StorageError>;
}

/// What sealing has learnt about layers, so a layer sealed once (in any repository, by any job)
/// is not read again.
#[async_trait]
pub trait SealMeta: Send + Sync {
    /// What sealing recorded for a layer blob read the given way, if it was sealed before.
    async fn sealed_layer(
        &self,
        layer: &Digest,
        reading: &str,
    ) -> Result<Option<String>, StorageError>;

    /// Records what sealing read from a layer blob (kept if already recorded).
    async fn record_sealed_layer(
        &self,
        layer: &Digest,
        reading: &str,
        files: &str,
    ) -> Result<(), StorageError>;
}

/// The whole metadata store: every concern above, and a health check. Backends implement the
/// concerns one by one; this trait comes with them.
#[async_trait]
pub trait MetadataStore:
    BlobMeta
    + GcMeta
    + super::CompactMeta
    + UploadMeta
    + ManifestMeta
    + TagMeta
    + LeaseMeta
    + JobMeta
    + SealMeta
    + std::fmt::Debug
{
    /// Whether the backend answers, for readiness probes.
    async fn ping(&self) -> Result<(), StorageError>;
}
