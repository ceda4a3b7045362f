//! vial's extensions to the Distribution API, each with its plain-OCI fallback where one exists:
//! bulk existence checks, versions, seals, syncs, restores, leases, tag history, collection.

use std::collections::HashSet;
use std::time::Duration;

use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use vial_core::{Digest, RepoName};

use super::{Registry, PRESENT_BATCH};
use crate::error::ClientError;

/// What a sync copies: the body of a request that starts one.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SyncRequest {
    pub source: String,
    pub tag: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub plain_http: bool,
}

/// How long one request for a garbage collection job's state waits for it to finish.
const GC_WAIT: Duration = Duration::from_secs(25);

/// A garbage collection pass that runs as a job on the registry.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct GcJob {
    pub id: String,
    /// `queued`, `running`, `done` or `failed`.
    pub state: String,
    /// What the pass reclaimed, once done; what it has reclaimed so far while it runs.
    pub report: Option<serde_json::Value>,
    pub error: Option<String>,
}

impl GcJob {
    pub fn finished(&self) -> bool {
        matches!(self.state.as_str(), "done" | "failed")
    }

    /// The finished pass's report, or why it failed.
    pub fn outcome(self) -> Result<serde_json::Value, ClientError> {
        match (self.state.as_str(), self.report) {
            ("done", Some(report)) => Ok(report),
            _ => Err(ClientError::Invalid(format!(
                "the garbage collection pass {} failed: {}",
                self.id,
                self.error
                    .as_deref()
                    .unwrap_or("the registry gave no reason")
            ))),
        }
    }
}

/// A sync job as vial's sync extension reports it.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SyncJob {
    pub id: String,
    pub repository: String,
    pub source: String,
    pub tag: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// `queued`, `running`, `done` or `failed`.
    pub state: String,
    /// The sealed version, once done.
    #[serde(default)]
    pub digest: Option<Digest>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub progress: SyncProgress,
    #[serde(default)]
    pub attempts: i64,
    /// Unix milliseconds.
    #[serde(default)]
    pub created_at: i64,
    #[serde(default)]
    pub updated_at: i64,
}

/// How far a sync job has come. For an `oci://` source, files are blobs.
#[derive(Debug, Clone, Default, Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct SyncProgress {
    #[serde(default)]
    pub pinned: Option<String>,
    #[serde(default)]
    pub files_total: u64,
    #[serde(default)]
    pub bytes_total: u64,
    #[serde(default)]
    pub files_done: u64,
    #[serde(default)]
    pub bytes_done: u64,
    #[serde(default)]
    pub bytes_read: u64,
}

/// A seal job as vial's seal extension reports it.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct SealStatus {
    pub subject: String,
    /// `queued`, `running`, `done` or `failed`.
    pub state: String,
    #[serde(default)]
    pub volume: Option<Digest>,
    #[serde(default)]
    pub error: Option<String>,
    #[serde(default)]
    pub attempts: i64,
}

/// One entry of vial's versions extension.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct VersionInfo {
    pub digest: Digest,
    pub created_at: String,
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub annotations: Option<std::collections::BTreeMap<String, String>>,
    /// For a deleted version: when, by whom, and until when it can be restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_at: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deleted_by: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restorable_until: Option<String>,
}

/// What a restore brought back.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct RestoreReport {
    pub digest: Digest,
    /// Tags pointed at the version again.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Remembered tags left alone because they point at another version now.
    #[serde(default)]
    pub tags_moved_on: Vec<String>,
}

/// One move of a tag.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct TagEventInfo {
    pub at: String,
    #[serde(default)]
    pub from: Option<Digest>,
    #[serde(default)]
    pub to: Option<Digest>,
    #[serde(default)]
    pub by: Option<String>,
    pub reason: String,
}

/// A node's claim that it has a version mounted.
#[derive(Debug, Clone, Deserialize, serde::Serialize)]
pub struct LeaseInfo {
    pub holder: String,
    pub expires_at: String,
}

impl Registry {
    /// vial's bulk existence check. `None` when the registry does not have the extension.
    pub async fn blobs_present(
        &self,
        repo: &RepoName,
        digests: &[Digest],
    ) -> Result<Option<Vec<Digest>>, ClientError> {
        let url = self.url(&format!("/v2/{repo}/_vial/blobs/present"));
        let body =
            serde_json::to_vec(&serde_json::json!({ "digests": digests })).unwrap_or_default();
        let r = self
            .send(&Self::scope(repo, true), "existence check", |c| {
                c.post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
            })
            .await?;
        match r.status() {
            StatusCode::OK => {
                #[derive(Deserialize)]
                struct Present {
                    present: Vec<Digest>,
                }
                let p: Present = r.json().await.map_err(|e| self.transport(e))?;
                Ok(Some(p.present))
            }
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED | StatusCode::BAD_REQUEST => {
                Ok(None)
            }
            _ => Err(self.error(r, "existence check").await),
        }
    }

    /// Of `digests`, those `repo` holds: vial's bulk check in batches where the registry has it,
    /// else one HEAD per blob, 32 at a time.
    pub async fn present_blobs(
        &self,
        repo: &RepoName,
        digests: &[Digest],
    ) -> Result<HashSet<Digest>, ClientError> {
        let mut present = HashSet::new();
        for batch in digests.chunks(PRESENT_BATCH) {
            match self.blobs_present(repo, batch).await? {
                Some(p) => present.extend(p),
                None => {
                    let checks = futures_util::stream::iter(digests.iter().cloned())
                        .map(|d| async move { self.blob_exists(repo, &d).await.map(|e| (d, e)) })
                        .buffer_unordered(32)
                        .collect::<Vec<_>>()
                        .await;
                    for check in checks {
                        let (d, exists) = check?;
                        if exists {
                            present.insert(d);
                        }
                    }
                    return Ok(present);
                }
            }
        }
        Ok(present)
    }

    /// Asks a vial registry for a garbage collection pass now (administrators only) and returns
    /// its report as JSON: dry, what a pass would reclaim; otherwise what the pass reclaimed,
    /// following its job to the end.
    pub async fn gc(&self, dry_run: bool) -> Result<serde_json::Value, ClientError> {
        if dry_run {
            let r = self.gc_request(true, Duration::ZERO).await?;
            return r.json().await.map_err(|e| self.transport(e));
        }
        let mut job = self.gc_start(GC_WAIT).await?;
        while !job.finished() {
            job = self.gc_status(&job.id, GC_WAIT).await?;
        }
        job.outcome()
    }

    /// Queues a garbage collection pass as a job (or joins the one queued or running) and
    /// returns where it is once it finishes or `wait` (at most 30 s) passes.
    pub async fn gc_start(&self, wait: Duration) -> Result<GcJob, ClientError> {
        let r = self.gc_request(false, wait).await?;
        r.json().await.map_err(|e| self.transport(e))
    }

    async fn gc_request(
        &self,
        dry_run: bool,
        wait: Duration,
    ) -> Result<reqwest::Response, ClientError> {
        let url = self.url(&format!(
            "/v2/_vial/gc?dry-run={dry_run}&wait={}",
            wait.as_secs_f64()
        ));
        let r = self
            .send("registry:catalog:*", "garbage collection", |c| c.post(&url))
            .await?;
        match r.status() {
            StatusCode::OK | StatusCode::ACCEPTED => Ok(r),
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => Err(ClientError::NotVial {
                registry: self.host().to_owned(),
                what: "garbage collection",
            }),
            _ => Err(self.error(r, "garbage collection").await),
        }
    }

    /// A garbage collection job; with `wait`, the registry answers once it finishes or that much
    /// time (at most 30 s) passes.
    pub async fn gc_status(&self, id: &str, wait: Duration) -> Result<GcJob, ClientError> {
        let url = self.url(&format!("/v2/_vial/gc/{id}?wait={}", wait.as_secs_f64()));
        let r = self
            .send("registry:catalog:*", "garbage collection status", |c| {
                c.get(&url)
            })
            .await?;
        match r.status() {
            StatusCode::OK | StatusCode::ACCEPTED => r.json().await.map_err(|e| self.transport(e)),
            StatusCode::NOT_FOUND => Err(ClientError::NotFound(format!(
                "garbage collection job {id} on {}",
                self.host()
            ))),
            _ => Err(self.error(r, &format!("garbage collection job {id}")).await),
        }
    }

    /// Every move of a tag, oldest first (vial's tag history extension). `None` when the registry
    /// does not keep tag history.
    pub async fn tag_history(
        &self,
        repo: &RepoName,
        tag: &vial_core::Tag,
    ) -> Result<Option<Vec<TagEventInfo>>, ClientError> {
        #[derive(Deserialize)]
        struct History {
            history: Vec<TagEventInfo>,
        }
        let url = self.url(&format!("/v2/{repo}/_vial/tags/{tag}/history"));
        let h: Option<History> = self.get_extension(repo, &url, "tag history").await?;
        Ok(h.map(|h| h.history))
    }

    /// GETs one of vial's per-repository extensions: `None` when the registry answers 404 for a
    /// repository it knows (it lacks the extension), an error when the repository is unknown.
    async fn get_extension<T: serde::de::DeserializeOwned>(
        &self,
        repo: &RepoName,
        url: &str,
        action: &str,
    ) -> Result<Option<T>, ClientError> {
        let r = self
            .send(&Self::scope(repo, false), action, |c| c.get(url))
            .await?;
        match r.status() {
            StatusCode::OK => Ok(Some(r.json().await.map_err(|e| self.transport(e))?)),
            StatusCode::NOT_FOUND => match self.error(r, &repo.to_string()).await {
                e @ ClientError::RepositoryNotFound(_) => Err(e),
                _ => Ok(None),
            },
            _ => Err(self.error(r, action).await),
        }
    }

    /// Asks the registry to copy a remote source into a sealed version of `repo` (vial's sync
    /// extension) and returns the queued job.
    pub async fn sync_start(
        &self,
        repo: &RepoName,
        spec: &SyncRequest,
    ) -> Result<SyncJob, ClientError> {
        let url = self.url(&format!("/v2/{repo}/_vial/sync"));
        let r = self
            .send(&Self::scope(repo, true), "sync", |c| {
                c.post(&url).json(spec)
            })
            .await?;
        match r.status() {
            s if s.is_success() => r.json().await.map_err(|e| self.transport(e)),
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {
                match self.error(r, "sync").await {
                    e @ ClientError::RepositoryNotFound(_) => Err(e),
                    _ => Err(ClientError::NotVial {
                        registry: self.host().to_owned(),
                        what: "sync jobs",
                    }),
                }
            }
            _ => Err(self.error(r, "sync").await),
        }
    }

    /// A sync job of `repo`; with `wait`, the registry answers once the job finishes or that
    /// much time (at most 30 s) passes.
    pub async fn sync_status(
        &self,
        repo: &RepoName,
        id: &str,
        wait: Duration,
    ) -> Result<SyncJob, ClientError> {
        let mut url = self.url(&format!("/v2/{repo}/_vial/sync/{id}"));
        if !wait.is_zero() {
            url.push_str(&format!("?wait={}", wait.as_secs_f64()));
        }
        let r = self
            .send(&Self::scope(repo, false), "sync status", |c| c.get(&url))
            .await?;
        match r.status() {
            StatusCode::OK => r.json().await.map_err(|e| self.transport(e)),
            _ => Err(self.error(r, &format!("sync job {id} of {repo}")).await),
        }
    }

    /// The sync jobs of `repo`, newest first.
    pub async fn sync_list(&self, repo: &RepoName) -> Result<Vec<SyncJob>, ClientError> {
        #[derive(Deserialize)]
        struct Jobs {
            jobs: Vec<SyncJob>,
        }
        let url = self.url(&format!("/v2/{repo}/_vial/sync"));
        let jobs: Option<Jobs> = self.get_extension(repo, &url, "sync listing").await?;
        jobs.map(|j| j.jobs).ok_or_else(|| ClientError::NotVial {
            registry: self.host().to_owned(),
            what: "sync jobs",
        })
    }

    /// Cancels a sync job that has not finished.
    pub async fn sync_cancel(&self, repo: &RepoName, id: &str) -> Result<SyncJob, ClientError> {
        let url = self.url(&format!("/v2/{repo}/_vial/sync/{id}"));
        let r = self
            .send(&Self::scope(repo, true), "sync cancel", |c| c.delete(&url))
            .await?;
        match r.status() {
            StatusCode::OK => r.json().await.map_err(|e| self.transport(e)),
            _ => Err(self
                .error(r, &format!("cancel of sync job {id} in {repo}"))
                .await),
        }
    }

    /// vial's versions extension (with `deleted`, the deleted versions that can still be
    /// restored). `None` when the registry does not have it.
    pub async fn versions(
        &self,
        repo: &RepoName,
        deleted: bool,
    ) -> Result<Option<Vec<VersionInfo>>, ClientError> {
        #[derive(Deserialize)]
        struct Versions {
            versions: Vec<VersionInfo>,
        }
        let mut url = self.url(&format!("/v2/{repo}/_vial/versions"));
        if deleted {
            url.push_str("?deleted=true");
        }
        let v: Option<Versions> = self.get_extension(repo, &url, "versions").await?;
        Ok(v.map(|v| v.versions))
    }

    /// Where vial's seal of the artifact `digest` is (the `_vial/seal` extension). `start` asks
    /// for the seal (needs push access) and queues it again if it failed; otherwise `wait` lets
    /// the registry hold the answer until the seal finishes or that much time passes. `None` when
    /// the registry cannot seal, or has not been asked to seal this artifact.
    pub async fn seal(
        &self,
        repo: &RepoName,
        digest: &Digest,
        start: bool,
        wait: Duration,
    ) -> Result<Option<SealStatus>, ClientError> {
        let mut url = self.url(&format!("/v2/{repo}/_vial/seal/{digest}"));
        if !start && !wait.is_zero() {
            url.push_str(&format!("?wait={}", wait.as_secs_f64()));
        }
        let method = if start { Method::POST } else { Method::GET };
        let r = self
            .send(&Self::scope(repo, start), "seal", |c| {
                c.request(method.clone(), &url)
            })
            .await?;
        match r.status() {
            s if s.is_success() => Ok(Some(r.json().await.map_err(|e| self.transport(e))?)),
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {
                match self.error(r, &format!("seal of {repo}@{digest}")).await {
                    e @ ClientError::RepositoryNotFound(_) => Err(e),
                    _ => Ok(None),
                }
            }
            _ => Err(self.error(r, &format!("seal of {repo}@{digest}")).await),
        }
    }

    /// Brings back a deleted version (vial's restore extension), with its remembered tags if
    /// `tags`. `None` when there is nothing to restore (never deleted, or past the retention
    /// window); the registry's message says which.
    pub async fn restore(
        &self,
        repo: &RepoName,
        digest: &Digest,
        tags: bool,
    ) -> Result<RestoreReport, ClientError> {
        let url = self.url(&format!(
            "/v2/{repo}/_vial/restore/{digest}{}",
            if tags { "?tags=true" } else { "" }
        ));
        let r = self
            .send(&format!("repository:{repo}:delete"), "restore", |c| {
                c.post(&url)
            })
            .await?;
        if r.status().is_success() {
            return r.json().await.map_err(|e| self.transport(e));
        }
        Err(self.error(r, &format!("restore of {repo}@{digest}")).await)
    }

    /// The nodes that say they have a version mounted. `None` when the registry does not keep
    /// leases.
    pub async fn leases(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<Vec<LeaseInfo>>, ClientError> {
        let url = self.url(&format!("/v2/{repo}/_vial/leases/{digest}"));
        let r = self
            .send(&Self::scope(repo, false), "leases", |c| c.get(&url))
            .await?;
        match r.status() {
            StatusCode::OK => {
                #[derive(Deserialize)]
                struct Leases {
                    leases: Vec<LeaseInfo>,
                }
                let l: Leases = r.json().await.map_err(|e| self.transport(e))?;
                Ok(Some(l.leases))
            }
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => Ok(None),
            _ => Err(self.error(r, &format!("leases of {repo}@{digest}")).await),
        }
    }

    /// Takes or renews (`ttl` = `Some`) or drops (`None`) `holder`'s lease on a version. Returns
    /// false when the registry does not keep leases.
    pub async fn lease(
        &self,
        repo: &RepoName,
        digest: &Digest,
        holder: &str,
        ttl: Option<Duration>,
    ) -> Result<bool, ClientError> {
        let url = self.url(&format!("/v2/{repo}/_vial/leases/{digest}"));
        let body = serde_json::json!({
            "holder": holder,
            "ttl_seconds": ttl.map(|t| t.as_secs()),
        })
        .to_string();
        let method = if ttl.is_some() {
            Method::PUT
        } else {
            Method::DELETE
        };
        let r = self
            .send(&Self::scope(repo, false), "lease", |c| {
                c.request(method.clone(), &url)
                    .header("content-type", "application/json")
                    .body(body.clone())
            })
            .await?;
        match r.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => Ok(false),
            _ => Err(self.error(r, &format!("lease on {repo}@{digest}")).await),
        }
    }
}
