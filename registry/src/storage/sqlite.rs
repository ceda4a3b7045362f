//! The embedded metadata store: SQLite through sqlx, in WAL mode with full fsync.
//!
//! All writes go through a pool of one connection, so write transactions queue in the process instead
//! of failing with SQLITE_BUSY; reads use their own pool and see the last committed state.

use std::path::Path;
use std::str::FromStr;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};
use vial_core::manifest::Descriptor;
use vial_core::{Digest, RepoName, Tag, Target};

use super::metadata::{
    CommitManifestError, ManifestRecord, MetadataStore, Page, StoredManifest, TagPrecondition,
    UploadSession, VersionRow,
};
use super::{now_millis, StorageError};

/// The schema, in order. A database records which of these it has applied.
const MIGRATIONS: &[(i64, &str, &str)] = &[(
    1,
    "registry",
    include_str!("../../../migrations/sqlite/0001_registry.sql"),
)];

#[derive(Debug, Clone)]
pub struct SqliteMetadataStore {
    reader: SqlitePool,
    writer: SqlitePool,
}

impl SqliteMetadataStore {
    /// Opens (creating if needed) the database at `path` and brings its schema up to date.
    pub async fn open(path: &Path) -> Result<Self, StorageError> {
        let options = SqliteConnectOptions::from_str("sqlite://")?
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .foreign_keys(true)
            .busy_timeout(Duration::from_secs(30));
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.clone())
            .await?;
        migrate(&writer).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect_with(options.read_only(true))
            .await?;
        Ok(SqliteMetadataStore { reader, writer })
    }
}

async fn migrate(pool: &SqlitePool) -> Result<(), StorageError> {
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS vial_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at INTEGER NOT NULL)",
    )
    .execute(pool)
    .await?;
    for (version, name, sql) in MIGRATIONS {
        let mut tx = pool.begin().await?;
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT version FROM vial_migrations WHERE version = ?")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
        if applied.is_none() {
            tracing::info!(version, name, "applying metadata migration");
            sqlx::raw_sql(sql).execute(&mut *tx).await?;
            sqlx::query("INSERT INTO vial_migrations (version, name, applied_at) VALUES (?, ?, ?)")
                .bind(version)
                .bind(name)
                .bind(now_millis())
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

async fn repo_id_for_write(
    tx: &mut Transaction<'_, Sqlite>,
    repo: &RepoName,
) -> Result<i64, sqlx::Error> {
    sqlx::query(
        "INSERT INTO repositories (name, created_at) VALUES (?, ?) ON CONFLICT (name) DO NOTHING",
    )
    .bind(repo.as_str())
    .bind(now_millis())
    .execute(&mut **tx)
    .await?;
    sqlx::query_scalar("SELECT id FROM repositories WHERE name = ?")
        .bind(repo.as_str())
        .fetch_one(&mut **tx)
        .await
}

async fn repo_id(pool: &SqlitePool, repo: &RepoName) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM repositories WHERE name = ?")
        .bind(repo.as_str())
        .fetch_optional(pool)
        .await
}

fn parse_digest(s: &str) -> Result<Digest, StorageError> {
    Digest::parse(s).map_err(|e| StorageError::Corrupt(format!("stored digest {s:?}: {e}")))
}

fn upload_from_row(row: &sqlx::sqlite::SqliteRow) -> Result<UploadSession, StorageError> {
    let repo: String = row.try_get("repository")?;
    Ok(UploadSession {
        id: row.try_get("id")?,
        repository: RepoName::parse(&repo)
            .map_err(|e| StorageError::Corrupt(format!("stored repository {repo:?}: {e}")))?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[async_trait]
impl MetadataStore for SqliteMetadataStore {
    async fn blob_in_repo(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, StorageError> {
        let size: Option<i64> = sqlx::query_scalar(
            "SELECT b.size FROM repository_blobs rb
               JOIN repositories r ON r.id = rb.repository_id
               JOIN blobs b ON b.digest = rb.digest
              WHERE r.name = ? AND rb.digest = ?",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .fetch_optional(&self.reader)
        .await?;
        Ok(size.map(|s| s as u64))
    }

    async fn commit_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        size: u64,
    ) -> Result<(), StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        sqlx::query("INSERT INTO blobs (digest, size, created_at) VALUES (?, ?, ?) ON CONFLICT (digest) DO NOTHING")
            .bind(digest.as_str())
            .bind(size as i64)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        sqlx::query("INSERT INTO repository_blobs (repository_id, digest, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
            .bind(repo_id)
            .bind(digest.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn mount_blob(
        &self,
        from: &RepoName,
        to: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, StorageError> {
        let mut tx = self.writer.begin().await?;
        let size: Option<i64> = sqlx::query_scalar(
            "SELECT b.size FROM repository_blobs rb
               JOIN repositories r ON r.id = rb.repository_id
               JOIN blobs b ON b.digest = rb.digest
              WHERE r.name = ? AND rb.digest = ?",
        )
        .bind(from.as_str())
        .bind(digest.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(size) = size else {
            return Ok(None);
        };
        let repo_id = repo_id_for_write(&mut tx, to).await?;
        sqlx::query("INSERT INTO repository_blobs (repository_id, digest, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
            .bind(repo_id)
            .bind(digest.as_str())
            .bind(now_millis())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(size as u64))
    }

    async fn unlink_blob(&self, repo: &RepoName, digest: &Digest) -> Result<bool, StorageError> {
        let done = sqlx::query(
            "DELETE FROM repository_blobs
              WHERE repository_id = (SELECT id FROM repositories WHERE name = ?) AND digest = ?",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn create_upload(&self, session: &UploadSession) -> Result<(), StorageError> {
        sqlx::query(
            "INSERT INTO uploads (id, repository, created_at, updated_at) VALUES (?, ?, ?, ?)",
        )
        .bind(&session.id)
        .bind(session.repository.as_str())
        .bind(session.created_at)
        .bind(session.updated_at)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn get_upload(
        &self,
        repo: &RepoName,
        id: &str,
    ) -> Result<Option<UploadSession>, StorageError> {
        let row = sqlx::query("SELECT * FROM uploads WHERE id = ? AND repository = ?")
            .bind(id)
            .bind(repo.as_str())
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(upload_from_row).transpose()
    }

    async fn touch_upload(&self, id: &str) -> Result<(), StorageError> {
        sqlx::query("UPDATE uploads SET updated_at = ? WHERE id = ?")
            .bind(now_millis())
            .bind(id)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn delete_upload(&self, id: &str) -> Result<(), StorageError> {
        sqlx::query("DELETE FROM uploads WHERE id = ?")
            .bind(id)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn stale_uploads(
        &self,
        before_millis: i64,
        limit: u32,
    ) -> Result<Vec<UploadSession>, StorageError> {
        let rows =
            sqlx::query("SELECT * FROM uploads WHERE updated_at < ? ORDER BY updated_at LIMIT ?")
                .bind(before_millis)
                .bind(limit)
                .fetch_all(&self.reader)
                .await?;
        rows.iter().map(upload_from_row).collect()
    }

    async fn count_uploads(&self) -> Result<u64, StorageError> {
        let n: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM uploads")
            .fetch_one(&self.reader)
            .await?;
        Ok(n as u64)
    }

    async fn commit_manifest(
        &self,
        repo: &RepoName,
        manifest: &ManifestRecord,
        tags: &[Tag],
        precondition: &TagPrecondition,
    ) -> Result<(), CommitManifestError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;

        if *precondition != TagPrecondition::None {
            for tag in tags {
                let current: Option<String> = sqlx::query_scalar(
                    "SELECT manifest_digest FROM tags WHERE repository_id = ? AND name = ?",
                )
                .bind(repo_id)
                .bind(tag.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                let ok = match precondition {
                    TagPrecondition::None => true,
                    TagPrecondition::Absent => current.is_none(),
                    TagPrecondition::At(d) => current.as_deref() == Some(d.as_str()),
                };
                if !ok {
                    return Err(CommitManifestError::TagMoved {
                        tag: tag.to_string(),
                        current: current.as_deref().map(parse_digest).transpose()?,
                        expected: precondition.clone(),
                    });
                }
            }
        }

        let mut missing_blobs = Vec::new();
        for digest in dedup(&manifest.blobs) {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM repository_blobs WHERE repository_id = ? AND digest = ?",
            )
            .bind(repo_id)
            .bind(digest.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if found.is_none() {
                missing_blobs.push(digest.clone());
            }
        }
        if !missing_blobs.is_empty() {
            return Err(CommitManifestError::MissingBlobs(missing_blobs));
        }
        let mut missing_manifests = Vec::new();
        for digest in dedup(&manifest.children) {
            let found: Option<i64> = sqlx::query_scalar(
                "SELECT 1 FROM manifests WHERE repository_id = ? AND digest = ?",
            )
            .bind(repo_id)
            .bind(digest.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if found.is_none() {
                missing_manifests.push(digest.clone());
            }
        }
        if !missing_manifests.is_empty() {
            return Err(CommitManifestError::MissingManifests(missing_manifests));
        }

        let annotations = manifest
            .annotations
            .as_ref()
            .map(|a| serde_json::to_string(a).unwrap_or_default());
        let inserted = sqlx::query(
            "INSERT INTO manifests (repository_id, digest, media_type, artifact_type, subject, annotations, size, content, created_at)
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
        )
        .bind(repo_id)
        .bind(manifest.digest.as_str())
        .bind(&manifest.media_type)
        .bind(&manifest.artifact_type)
        .bind(manifest.subject.as_ref().map(Digest::as_str))
        .bind(annotations)
        .bind(manifest.content.len() as i64)
        .bind(&manifest.content)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if inserted.rows_affected() > 0 {
            let targets = dedup(&manifest.blobs)
                .into_iter()
                .map(|d| (d, false))
                .chain(dedup(&manifest.children).into_iter().map(|d| (d, true)));
            for (target, is_manifest) in targets {
                sqlx::query(
                    "INSERT INTO manifest_references (repository_id, manifest_digest, target_digest, is_manifest)
                     VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                )
                .bind(repo_id)
                .bind(manifest.digest.as_str())
                .bind(target.as_str())
                .bind(is_manifest)
                .execute(&mut *tx)
                .await?;
            }
        }
        for tag in tags {
            sqlx::query(
                "INSERT INTO tags (repository_id, name, manifest_digest, updated_at) VALUES (?, ?, ?, ?)
                 ON CONFLICT (repository_id, name) DO UPDATE SET manifest_digest = excluded.manifest_digest, updated_at = excluded.updated_at",
            )
            .bind(repo_id)
            .bind(tag.as_str())
            .bind(manifest.digest.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn get_manifest(
        &self,
        repo: &RepoName,
        target: &Target,
    ) -> Result<Option<StoredManifest>, StorageError> {
        let row = match target {
            Target::Digest(d) => {
                sqlx::query(
                    "SELECT m.digest, m.media_type, m.content FROM manifests m
                       JOIN repositories r ON r.id = m.repository_id
                      WHERE r.name = ? AND m.digest = ?",
                )
                .bind(repo.as_str())
                .bind(d.as_str())
                .fetch_optional(&self.reader)
                .await?
            }
            Target::Tag(t) => {
                sqlx::query(
                    "SELECT m.digest, m.media_type, m.content FROM tags t
                       JOIN repositories r ON r.id = t.repository_id
                       JOIN manifests m ON m.repository_id = t.repository_id AND m.digest = t.manifest_digest
                      WHERE r.name = ? AND t.name = ?",
                )
                .bind(repo.as_str())
                .bind(t.as_str())
                .fetch_optional(&self.reader)
                .await?
            }
        };
        let Some(row) = row else { return Ok(None) };
        let digest: String = row.try_get("digest")?;
        Ok(Some(StoredManifest {
            digest: parse_digest(&digest)?,
            media_type: row.try_get("media_type")?,
            content: row.try_get("content")?,
        }))
    }

    async fn delete_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<bool, StorageError> {
        // Tags and reference rows go with it through ON DELETE CASCADE.
        let done = sqlx::query(
            "DELETE FROM manifests
              WHERE repository_id = (SELECT id FROM repositories WHERE name = ?) AND digest = ?",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn delete_tag(&self, repo: &RepoName, tag: &Tag) -> Result<bool, StorageError> {
        let done = sqlx::query(
            "DELETE FROM tags
              WHERE repository_id = (SELECT id FROM repositories WHERE name = ?) AND name = ?",
        )
        .bind(repo.as_str())
        .bind(tag.as_str())
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn list_tags(
        &self,
        repo: &RepoName,
        last: Option<&str>,
        limit: u32,
    ) -> Result<Option<Page>, StorageError> {
        let Some(repo_id) = repo_id(&self.reader, repo).await? else {
            return Ok(None);
        };
        let mut items: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM tags WHERE repository_id = ? AND name > ? ORDER BY name LIMIT ?",
        )
        .bind(repo_id)
        .bind(last.unwrap_or(""))
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.reader)
        .await?;
        let more = items.len() > limit as usize;
        items.truncate(limit as usize);
        Ok(Some(Page { items, more }))
    }

    async fn list_repositories(
        &self,
        last: Option<&str>,
        limit: u32,
    ) -> Result<Page, StorageError> {
        let mut items: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM repositories WHERE name > ? ORDER BY name LIMIT ?",
        )
        .bind(last.unwrap_or(""))
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.reader)
        .await?;
        let more = items.len() > limit as usize;
        items.truncate(limit as usize);
        Ok(Page { items, more })
    }

    async fn referrers(
        &self,
        repo: &RepoName,
        subject: &Digest,
        artifact_type: Option<&str>,
    ) -> Result<Vec<Descriptor>, StorageError> {
        let rows = sqlx::query(
            "SELECT m.digest, m.media_type, m.artifact_type, m.size, m.annotations FROM manifests m
               JOIN repositories r ON r.id = m.repository_id
              WHERE r.name = ? AND m.subject = ? AND (? IS NULL OR m.artifact_type = ?)
              ORDER BY m.created_at, m.digest",
        )
        .bind(repo.as_str())
        .bind(subject.as_str())
        .bind(artifact_type)
        .bind(artifact_type)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                let digest: String = row.try_get("digest")?;
                let annotations: Option<String> = row.try_get("annotations")?;
                let size: i64 = row.try_get("size")?;
                Ok(Descriptor {
                    media_type: row.try_get("media_type")?,
                    digest: parse_digest(&digest)?,
                    size: size as u64,
                    urls: None,
                    annotations: annotations.and_then(|a| serde_json::from_str(&a).ok()),
                    artifact_type: row.try_get("artifact_type")?,
                    data: None,
                    platform: None,
                })
            })
            .collect()
    }

    async fn link_present_blobs(
        &self,
        repo: &RepoName,
        digests: &[Digest],
    ) -> Result<Vec<Digest>, StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        let mut present = Vec::new();
        for digest in digests {
            let known: Option<i64> = sqlx::query_scalar("SELECT 1 FROM blobs WHERE digest = ?")
                .bind(digest.as_str())
                .fetch_optional(&mut *tx)
                .await?;
            if known.is_some() {
                sqlx::query("INSERT INTO repository_blobs (repository_id, digest, created_at) VALUES (?, ?, ?) ON CONFLICT DO NOTHING")
                    .bind(repo_id)
                    .bind(digest.as_str())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                present.push(digest.clone());
            }
        }
        tx.commit().await?;
        Ok(present)
    }

    async fn list_versions(
        &self,
        repo: &RepoName,
        artifact_type: &str,
    ) -> Result<Option<Vec<VersionRow>>, StorageError> {
        let Some(repo_id) = repo_id(&self.reader, repo).await? else {
            return Ok(None);
        };
        let rows = sqlx::query(
            "SELECT m.digest, m.created_at, m.annotations,
                    (SELECT group_concat(t.name, ' ') FROM tags t
                      WHERE t.repository_id = m.repository_id AND t.manifest_digest = m.digest) AS tags
               FROM manifests m
              WHERE m.repository_id = ? AND m.artifact_type = ?
              ORDER BY m.created_at DESC, m.digest",
        )
        .bind(repo_id)
        .bind(artifact_type)
        .fetch_all(&self.reader)
        .await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let digest: String = row.try_get("digest")?;
            let annotations: Option<String> = row.try_get("annotations")?;
            let tags: Option<String> = row.try_get("tags")?;
            let mut tags: Vec<String> = tags
                .map(|t| t.split(' ').map(str::to_owned).collect())
                .unwrap_or_default();
            tags.sort();
            out.push(VersionRow {
                digest: parse_digest(&digest)?,
                created_at: row.try_get("created_at")?,
                annotations: annotations.and_then(|a| serde_json::from_str(&a).ok()),
                tags,
            });
        }
        Ok(Some(out))
    }

    async fn ping(&self) -> Result<(), StorageError> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }
}

fn dedup(digests: &[Digest]) -> Vec<Digest> {
    let mut v = digests.to_vec();
    v.sort();
    v.dedup();
    v
}
