//! What a sync is asked to do (its spec, as stored with the job), the sources it can copy from,
//! its filters, its progress, and how it fails.

use globset::{Glob, GlobSet, GlobSetBuilder};
use vial_core::Reference;

use crate::seal::SealError;
use crate::storage::{CommitManifestError, StorageError};

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

    pub(super) fn source(message: impl Into<String>, transient: bool) -> SyncError {
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
