//! The SQL metadata store, for SQLite (the embedded default) and PostgreSQL (production), through
//! sqlx's `Any` driver so both run the same queries.
//!
//! Queries use `$N` placeholders, which both drivers accept, and only SQL both dialects share; the
//! one aggregate that differs goes through [`Dialect`]. Every use case is one transaction. SQLite
//! writes go through a pool of one connection, so write transactions queue in the process instead
//! of failing with SQLITE_BUSY; PostgreSQL serialises conflicting writes itself, and the statements
//! that must not race (tag moves) are single conditional statements.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Row, Transaction};
use vial_core::manifest::Descriptor;
use vial_core::{Digest, RepoName, Tag, Target};

use super::metadata::{
    BlobLocation, BytesDeletion, CommitManifestError, Job, JobFile, JobOutcome, JobState, Lease,
    ManifestRecord, MetadataStore, Page, RangeChunk, Restored, StoredCheck, StoredManifest,
    TagEvent, TagPrecondition, UploadSession, VersionRow,
};
use super::{now_millis, StorageError};

/// The schema, in order, per dialect. A database records which of these it has applied.
const SQLITE_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "registry",
        include_str!("../../../migrations/sqlite/0001_registry.sql"),
    ),
    (
        2,
        "seals",
        include_str!("../../../migrations/sqlite/0002_seals.sql"),
    ),
    (
        3,
        "lifecycle",
        include_str!("../../../migrations/sqlite/0003_lifecycle.sql"),
    ),
    (
        4,
        "sync",
        include_str!("../../../migrations/sqlite/0004_sync.sql"),
    ),
];
const POSTGRES_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "registry",
        include_str!("../../../migrations/postgres/0001_registry.sql"),
    ),
    (
        2,
        "seals",
        include_str!("../../../migrations/postgres/0002_seals.sql"),
    ),
    (
        3,
        "lifecycle",
        include_str!("../../../migrations/postgres/0003_lifecycle.sql"),
    ),
    (
        4,
        "sync",
        include_str!("../../../migrations/postgres/0004_sync.sql"),
    ),
];

/// The size of a blob if `$1` (a repository name) holds `$2` (a digest).
const BLOB_SIZE_IN_REPO: &str = "SELECT b.size FROM repository_blobs rb
       JOIN repositories r ON r.id = rb.repository_id
       JOIN blobs b ON b.digest = rb.digest
      WHERE r.name = $1 AND rb.digest = $2";

/// A blob row `b` that no manifest references (`$2` = false, the `is_manifest` of blob
/// references), that no range chunk lives in, and that nobody touched since `$1`.
const UNREFERENCED: &str = "b.touched_at < $1
    AND NOT EXISTS (SELECT 1 FROM manifest_references r
                     WHERE r.target_digest = b.digest AND r.is_manifest = $2)
    AND NOT EXISTS (SELECT 1 FROM blobs a WHERE a.source_digest = b.digest)";

/// Links blob `$2` into repository id `$1` at time `$3`; linking twice is a no-op.
const LINK_BLOB: &str = "INSERT INTO repository_blobs (repository_id, digest, created_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING";

/// An arbitrary constant: the advisory lock that serialises migrations of replicas starting at once.
const MIGRATION_LOCK: i64 = 0x7669_616c_6d69_6772;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
}

impl Dialect {
    fn string_agg(self) -> &'static str {
        match self {
            Dialect::Sqlite => "group_concat(t.name, ' ')",
            Dialect::Postgres => "string_agg(t.name, ' ')",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SqlMetadataStore {
    reader: AnyPool,
    writer: AnyPool,
    dialect: Dialect,
}

impl SqlMetadataStore {
    /// Opens (creating if needed) the SQLite database at `path` and brings its schema up to date.
    pub async fn open_sqlite(path: &Path) -> Result<Self, StorageError> {
        sqlx::any::install_default_drivers();
        let path = path.to_str().ok_or_else(|| {
            StorageError::Corrupt(format!("database path {} is not UTF-8", path.display()))
        })?;
        let url = |mode: &str| format!("sqlite://{path}?mode={mode}");
        let writer = AnyPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url("rwc"))
            .await?;
        migrate(&writer, Dialect::Sqlite).await?;
        let reader = AnyPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url("ro"))
            .await?;
        Ok(SqlMetadataStore {
            reader,
            writer,
            dialect: Dialect::Sqlite,
        })
    }

    /// Deletes the row of `table` in `repo` whose `column` is `key`; says whether there was one.
    /// Table and column names are always literals from this file, never input.
    async fn delete_one(
        &self,
        table: &str,
        column: &str,
        repo: &RepoName,
        key: &str,
    ) -> Result<bool, StorageError> {
        let sql = format!(
            "DELETE FROM {table} WHERE repository_id = (SELECT id FROM repositories WHERE name = $1) AND {column} = $2"
        );
        let done = sqlx::query(&sql)
            .bind(repo.as_str())
            .bind(key)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Connects to PostgreSQL and brings the schema up to date; replicas starting at once take turns.
    pub async fn open_postgres(url: &str) -> Result<Self, StorageError> {
        sqlx::any::install_default_drivers();
        // Reads get their own connections: a burst of commits waiting on the database's fsync must
        // not make a manifest GET queue for a connection.
        let pool = |n| {
            AnyPoolOptions::new()
                .max_connections(n)
                .acquire_timeout(Duration::from_secs(5))
        };
        let writer = pool(8).connect(url).await?;
        migrate(&writer, Dialect::Postgres).await?;
        let reader = pool(8).connect(url).await?;
        Ok(SqlMetadataStore {
            reader,
            writer,
            dialect: Dialect::Postgres,
        })
    }
}

async fn migrate(pool: &AnyPool, dialect: Dialect) -> Result<(), StorageError> {
    let mut conn = pool.acquire().await?;
    if dialect == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_lock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
    }
    if dialect == Dialect::Sqlite {
        // WAL lets readers work while a write commits; the setting is stored in the database file.
        // sqlx's SQLite defaults already give full fsync, foreign keys and a busy timeout.
        sqlx::query("PRAGMA journal_mode = WAL")
            .execute(&mut *conn)
            .await?;
    }
    let result = apply_migrations(&mut conn, dialect).await;
    if dialect == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
    }
    result
}

async fn apply_migrations(
    conn: &mut sqlx::AnyConnection,
    dialect: Dialect,
) -> Result<(), StorageError> {
    let migrations = match dialect {
        Dialect::Sqlite => SQLITE_MIGRATIONS,
        Dialect::Postgres => POSTGRES_MIGRATIONS,
    };
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS vial_migrations (version BIGINT PRIMARY KEY, name TEXT NOT NULL, applied_at BIGINT NOT NULL)",
    )
    .execute(&mut *conn)
    .await?;
    for (version, name, sql) in migrations {
        let mut tx = sqlx::Connection::begin(&mut *conn).await?;
        let applied: Option<i64> =
            sqlx::query_scalar("SELECT version FROM vial_migrations WHERE version = $1")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
        if applied.is_none() {
            tracing::info!(version, name, "applying metadata migration");
            sqlx::raw_sql(sql).execute(&mut *tx).await?;
            sqlx::query(
                "INSERT INTO vial_migrations (version, name, applied_at) VALUES ($1, $2, $3)",
            )
            .bind(version)
            .bind(*name)
            .bind(now_millis())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
    }
    Ok(())
}

async fn repo_id_for_write(
    tx: &mut Transaction<'_, Any>,
    repo: &RepoName,
) -> Result<i64, sqlx::Error> {
    sqlx::query(
        "INSERT INTO repositories (name, created_at) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
    )
    .bind(repo.as_str())
    .bind(now_millis())
    .execute(&mut **tx)
    .await?;
    sqlx::query_scalar("SELECT id FROM repositories WHERE name = $1")
        .bind(repo.as_str())
        .fetch_one(&mut **tx)
        .await
}

/// Marks a blob as just used, so collections within the grace period leave it alone.
async fn touch(tx: &mut Transaction<'_, Any>, digest: &Digest) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE blobs SET touched_at = $1 WHERE digest = $2")
        .bind(now_millis())
        .bind(digest.as_str())
        .execute(&mut **tx)
        .await?;
    Ok(())
}

async fn record_tag_event(
    tx: &mut Transaction<'_, Any>,
    repo_id: i64,
    tag: &str,
    from: Option<&str>,
    to: Option<&str>,
    actor: Option<&str>,
    reason: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "INSERT INTO tag_events (repository_id, tag, from_digest, to_digest, at, actor, reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
    )
    .bind(repo_id)
    .bind(tag)
    .bind(from)
    .bind(to)
    .bind(now_millis())
    .bind(actor)
    .bind(reason)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

async fn repo_id_in(
    tx: &mut Transaction<'_, Any>,
    repo: &RepoName,
) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM repositories WHERE name = $1")
        .bind(repo.as_str())
        .fetch_optional(&mut **tx)
        .await
}

async fn repo_id(pool: &AnyPool, repo: &RepoName) -> Result<Option<i64>, sqlx::Error> {
    sqlx::query_scalar("SELECT id FROM repositories WHERE name = $1")
        .bind(repo.as_str())
        .fetch_optional(pool)
        .await
}

fn parse_digest(s: &str) -> Result<Digest, StorageError> {
    Digest::parse(s).map_err(|e| StorageError::Corrupt(format!("stored digest {s:?}: {e}")))
}

fn parse_repo(s: &str) -> Result<RepoName, StorageError> {
    RepoName::parse(s).map_err(|e| StorageError::Corrupt(format!("stored repository {s:?}: {e}")))
}

const JOB_COLUMNS: &str = "id, kind, repository, target, state, result, error, attempts, created_at, updated_at, spec, progress";

fn job_from_row(row: &AnyRow) -> Result<Job, StorageError> {
    let repo: String = row.try_get("repository")?;
    let state: String = row.try_get("state")?;
    Ok(Job {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        repository: parse_repo(&repo)?,
        target: row.try_get("target")?,
        state: JobState::parse(&state)
            .ok_or_else(|| StorageError::Corrupt(format!("stored job state {state:?}")))?,
        result: row.try_get("result")?,
        error: row.try_get("error")?,
        attempts: row.try_get("attempts")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        spec: row.try_get("spec")?,
        progress: row.try_get("progress")?,
    })
}

/// Records a running job's progress if the attempt `attempts` still holds it.
async fn set_job_progress<'e>(
    executor: impl sqlx::Executor<'e, Database = Any>,
    id: &str,
    attempts: i64,
    progress: &str,
) -> Result<bool, sqlx::Error> {
    let held = sqlx::query(
        "UPDATE jobs SET progress = $3, updated_at = $4
          WHERE id = $1 AND attempts = $2 AND state = 'running'",
    )
    .bind(id)
    .bind(attempts)
    .bind(progress)
    .bind(now_millis())
    .execute(executor)
    .await?;
    Ok(held.rows_affected() > 0)
}

fn upload_from_row(row: &AnyRow) -> Result<UploadSession, StorageError> {
    let repo: String = row.try_get("repository")?;
    Ok(UploadSession {
        id: row.try_get("id")?,
        repository: parse_repo(&repo)?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
    })
}

#[async_trait]
impl MetadataStore for SqlMetadataStore {
    async fn blob_in_repo(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, StorageError> {
        let size: Option<i64> = sqlx::query_scalar(BLOB_SIZE_IN_REPO)
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
        stored: StoredCheck,
    ) -> Result<(), StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        // Bytes uploaded whole replace a range of another blob as the chunk's home. The upsert
        // holds the row (PostgreSQL) or the database (SQLite) until commit, so a collection of
        // this blob either finished before (and the check below sees its bytes gone) or waits.
        sqlx::query(
            "INSERT INTO blobs (digest, size, created_at, touched_at) VALUES ($1, $2, $3, $3)
             ON CONFLICT (digest) DO UPDATE
                SET source_digest = NULL, source_offset = NULL, touched_at = excluded.touched_at",
        )
        .bind(digest.as_str())
        .bind(size as i64)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        sqlx::query(LINK_BLOB)
            .bind(repo_id)
            .bind(digest.as_str())
            .bind(now)
            .execute(&mut *tx)
            .await?;
        if !stored.await? {
            return Err(StorageError::Corrupt(format!(
                "the bytes of {digest} vanished before it was recorded (a garbage collection removed them at the same moment); upload it again"
            )));
        }
        tx.commit().await?;
        Ok(())
    }

    async fn unreferenced_blobs(
        &self,
        touched_before: i64,
        limit: u32,
    ) -> Result<Vec<(Digest, u64, bool)>, StorageError> {
        let rows = sqlx::query(&format!(
            "SELECT b.digest, b.size, b.source_digest FROM blobs b WHERE {UNREFERENCED}
              ORDER BY b.touched_at LIMIT $3"
        ))
        .bind(touched_before)
        .bind(false)
        .bind(i64::from(limit))
        .fetch_all(&self.writer)
        .await?;
        rows.iter()
            .map(|row| {
                let digest: String = row.try_get("digest")?;
                let size: i64 = row.try_get("size")?;
                let source: Option<String> = row.try_get("source_digest")?;
                Ok((parse_digest(&digest)?, size as u64, source.is_none()))
            })
            .collect()
    }

    async fn collect_blob(
        &self,
        digest: &Digest,
        touched_before: i64,
        delete_bytes: &(dyn Fn(Digest) -> BytesDeletion + Send + Sync),
    ) -> Result<Option<u64>, StorageError> {
        let mut tx = self.writer.begin().await?;
        if self.dialect == Dialect::Postgres {
            // Waits for manifest commits that hold this blob (FOR SHARE) and holds off new ones.
            sqlx::query("SELECT digest FROM blobs WHERE digest = $1 FOR UPDATE")
                .bind(digest.as_str())
                .execute(&mut *tx)
                .await?;
        }
        // Checked again now that the row is held: a new statement sees every commit so far.
        let row = sqlx::query(&format!(
            "SELECT b.size, b.source_digest FROM blobs b WHERE b.digest = $3 AND {UNREFERENCED}"
        ))
        .bind(touched_before)
        .bind(false)
        .bind(digest.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(row) = row else {
            return Ok(None);
        };
        let size: i64 = row.try_get("size")?;
        let source: Option<String> = row.try_get("source_digest")?;
        if source.is_none() {
            delete_bytes(digest.clone()).await?;
        }
        sqlx::query("DELETE FROM repository_blobs WHERE digest = $1")
            .bind(digest.as_str())
            .execute(&mut *tx)
            .await?;
        sqlx::query("DELETE FROM blobs WHERE digest = $1")
            .bind(digest.as_str())
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(Some(size as u64))
    }

    async fn mount_blob(
        &self,
        from: &RepoName,
        to: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, StorageError> {
        let mut tx = self.writer.begin().await?;
        // Held until the link commits, so a collection cannot remove the blob in between.
        let held = match self.dialect {
            Dialect::Postgres => format!("{BLOB_SIZE_IN_REPO} FOR SHARE OF b"),
            Dialect::Sqlite => BLOB_SIZE_IN_REPO.to_owned(),
        };
        let size: Option<i64> = sqlx::query_scalar(&held)
            .bind(from.as_str())
            .bind(digest.as_str())
            .fetch_optional(&mut *tx)
            .await?;
        let Some(size) = size else {
            return Ok(None);
        };
        let repo_id = repo_id_for_write(&mut tx, to).await?;
        sqlx::query(LINK_BLOB)
            .bind(repo_id)
            .bind(digest.as_str())
            .bind(now_millis())
            .execute(&mut *tx)
            .await?;
        touch(&mut tx, digest).await?;
        tx.commit().await?;
        Ok(Some(size as u64))
    }

    async fn unlink_blob(&self, repo: &RepoName, digest: &Digest) -> Result<bool, StorageError> {
        self.delete_one("repository_blobs", "digest", repo, digest.as_str())
            .await
    }

    async fn create_upload(&self, session: &UploadSession) -> Result<(), StorageError> {
        sqlx::query(
            "INSERT INTO uploads (id, repository, created_at, updated_at) VALUES ($1, $2, $3, $4)",
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
        let row = sqlx::query("SELECT * FROM uploads WHERE id = $1 AND repository = $2")
            .bind(id)
            .bind(repo.as_str())
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(upload_from_row).transpose()
    }

    async fn touch_upload(&self, id: &str) -> Result<(), StorageError> {
        sqlx::query("UPDATE uploads SET updated_at = $1 WHERE id = $2")
            .bind(now_millis())
            .bind(id)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn delete_upload(&self, id: &str) -> Result<(), StorageError> {
        sqlx::query("DELETE FROM uploads WHERE id = $1")
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
            sqlx::query("SELECT * FROM uploads WHERE updated_at < $1 ORDER BY updated_at LIMIT $2")
                .bind(before_millis)
                .bind(i64::from(limit))
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

        let missing_blobs =
            missing(&mut tx, Held::Blob, repo_id, &manifest.blobs, self.dialect).await?;
        if !missing_blobs.is_empty() {
            return Err(CommitManifestError::MissingBlobs(missing_blobs));
        }
        let missing_manifests = missing(
            &mut tx,
            Held::Manifest,
            repo_id,
            &manifest.children,
            self.dialect,
        )
        .await?;
        if !missing_manifests.is_empty() {
            return Err(CommitManifestError::MissingManifests(missing_manifests));
        }

        let annotations = manifest
            .annotations
            .as_ref()
            .map(|a| serde_json::to_string(a).unwrap_or_default());
        let inserted = sqlx::query(
            "INSERT INTO manifests (repository_id, digest, media_type, artifact_type, subject, annotations, size, content, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (repository_id, digest) DO UPDATE
                SET deleted_at = NULL, deleted_tags = NULL, deleted_by = NULL
              WHERE manifests.deleted_at IS NOT NULL",
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
                     VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
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
            let before: Option<String> = sqlx::query_scalar(
                "SELECT manifest_digest FROM tags WHERE repository_id = $1 AND name = $2",
            )
            .bind(repo_id)
            .bind(tag.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            // Each move is one conditional statement, so concurrent moves on any number of
            // replicas cannot both pass the same precondition.
            let moved = match precondition {
                TagPrecondition::None => sqlx::query(
                    "INSERT INTO tags (repository_id, name, manifest_digest, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (repository_id, name) DO UPDATE SET manifest_digest = excluded.manifest_digest, updated_at = excluded.updated_at, expires_at = excluded.expires_at",
                )
                .bind(repo_id)
                .bind(tag.as_str())
                .bind(manifest.digest.as_str())
                .bind(now)
                .bind(manifest.tags_expire_at)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
                TagPrecondition::Absent => sqlx::query(
                    "INSERT INTO tags (repository_id, name, manifest_digest, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (repository_id, name) DO NOTHING",
                )
                .bind(repo_id)
                .bind(tag.as_str())
                .bind(manifest.digest.as_str())
                .bind(now)
                .bind(manifest.tags_expire_at)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
                TagPrecondition::At(expected) => sqlx::query(
                    "UPDATE tags SET manifest_digest = $1, updated_at = $2, expires_at = $6
                      WHERE repository_id = $3 AND name = $4 AND manifest_digest = $5",
                )
                .bind(manifest.digest.as_str())
                .bind(now)
                .bind(repo_id)
                .bind(tag.as_str())
                .bind(expected.as_str())
                .bind(manifest.tags_expire_at)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
            };
            if moved > 0 && before.as_deref() != Some(manifest.digest.as_str()) {
                record_tag_event(
                    &mut tx,
                    repo_id,
                    tag.as_str(),
                    before.as_deref(),
                    Some(manifest.digest.as_str()),
                    manifest.pushed_by.as_deref(),
                    "push",
                )
                .await?;
            }
            if moved == 0 {
                let current: Option<String> = sqlx::query_scalar(
                    "SELECT manifest_digest FROM tags WHERE repository_id = $1 AND name = $2",
                )
                .bind(repo_id)
                .bind(tag.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                return Err(CommitManifestError::TagMoved {
                    tag: tag.to_string(),
                    current: current.as_deref().map(parse_digest).transpose()?,
                    expected: precondition.clone(),
                });
            }
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
                      WHERE r.name = $1 AND m.digest = $2 AND m.deleted_at IS NULL",
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
                      WHERE r.name = $1 AND t.name = $2 AND m.deleted_at IS NULL
                        AND (t.expires_at IS NULL OR t.expires_at > $3)",
                )
                .bind(repo.as_str())
                .bind(t.as_str())
                .bind(now_millis())
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
        by: Option<&str>,
    ) -> Result<bool, StorageError> {
        let mut tx = self.writer.begin().await?;
        let Some(repo_id) = repo_id_in(&mut tx, repo).await? else {
            return Ok(false);
        };
        let mut tags: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM tags WHERE repository_id = $1 AND manifest_digest = $2",
        )
        .bind(repo_id)
        .bind(digest.as_str())
        .fetch_all(&mut *tx)
        .await?;
        tags.sort();
        let hidden = sqlx::query(
            "UPDATE manifests SET deleted_at = $3, deleted_tags = $4, deleted_by = $5
              WHERE repository_id = $1 AND digest = $2 AND deleted_at IS NULL",
        )
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(now_millis())
        .bind(serde_json::to_string(&tags).unwrap_or_default())
        .bind(by)
        .execute(&mut *tx)
        .await?;
        if hidden.rows_affected() == 0 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM tags WHERE repository_id = $1 AND manifest_digest = $2")
            .bind(repo_id)
            .bind(digest.as_str())
            .execute(&mut *tx)
            .await?;
        for tag in &tags {
            record_tag_event(
                &mut tx,
                repo_id,
                tag,
                Some(digest.as_str()),
                None,
                by,
                "version-deleted",
            )
            .await?;
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn restore_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
        deleted_since: i64,
        with_tags: bool,
    ) -> Result<Option<Restored>, StorageError> {
        let mut tx = self.writer.begin().await?;
        let Some(repo_id) = repo_id_in(&mut tx, repo).await? else {
            return Ok(None);
        };
        let condition =
            "repository_id = $1 AND digest = $2 AND deleted_at IS NOT NULL AND deleted_at >= $3";
        let remembered: Option<Option<String>> = sqlx::query_scalar(&format!(
            "SELECT deleted_tags FROM manifests WHERE {condition}"
        ))
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(deleted_since)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(remembered) = remembered else {
            return Ok(None);
        };
        // The condition again: of two concurrent restores, PostgreSQL lets only one through.
        let restored_row = sqlx::query(&format!(
            "UPDATE manifests SET deleted_at = NULL, deleted_tags = NULL, deleted_by = NULL WHERE {condition}"
        ))
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(deleted_since)
        .execute(&mut *tx)
        .await?;
        if restored_row.rows_affected() == 0 {
            return Ok(None);
        }
        let mut restored = Restored::default();
        if with_tags {
            let tags: Vec<String> = remembered
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            for tag in tags {
                let taken = sqlx::query(
                    "INSERT INTO tags (repository_id, name, manifest_digest, updated_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (repository_id, name) DO NOTHING",
                )
                .bind(repo_id)
                .bind(&tag)
                .bind(digest.as_str())
                .bind(now_millis())
                .execute(&mut *tx)
                .await?;
                if taken.rows_affected() > 0 {
                    record_tag_event(
                        &mut tx,
                        repo_id,
                        &tag,
                        None,
                        Some(digest.as_str()),
                        None,
                        "restore",
                    )
                    .await?;
                    restored.tags.push(tag);
                } else {
                    restored.tags_moved_on.push(tag);
                }
            }
        }
        tx.commit().await?;
        Ok(Some(restored))
    }

    async fn deleted_before(
        &self,
        before: i64,
        limit: u32,
    ) -> Result<Vec<(RepoName, Digest, i64)>, StorageError> {
        let rows = sqlx::query(
            "SELECT r.name, m.digest, m.deleted_at FROM manifests m
               JOIN repositories r ON r.id = m.repository_id
              WHERE m.deleted_at IS NOT NULL AND m.deleted_at < $1
              ORDER BY m.deleted_at LIMIT $2",
        )
        .bind(before)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get("name")?;
                let digest: String = row.try_get("digest")?;
                Ok((
                    parse_repo(&name)?,
                    parse_digest(&digest)?,
                    row.try_get("deleted_at")?,
                ))
            })
            .collect()
    }

    async fn purge_manifest(&self, repo: &RepoName, digest: &Digest) -> Result<bool, StorageError> {
        let mut tx = self.writer.begin().await?;
        let Some(repo_id) = repo_id_in(&mut tx, repo).await? else {
            return Ok(false);
        };
        let children: Vec<String> = sqlx::query_scalar(
            "SELECT target_digest FROM manifest_references
              WHERE repository_id = $1 AND manifest_digest = $2 AND is_manifest = $3",
        )
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(true)
        .fetch_all(&mut *tx)
        .await?;
        // Tags and reference rows go with it through ON DELETE CASCADE.
        let done = sqlx::query(
            "DELETE FROM manifests WHERE repository_id = $1 AND digest = $2 AND deleted_at IS NOT NULL",
        )
        .bind(repo_id)
        .bind(digest.as_str())
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        // Its children (a volume's tree and part manifests) go too, unless another manifest
        // still lists them or a tag names them; their children in turn.
        let mut queue = children;
        while let Some(child) = queue.pop() {
            if self.dialect == Dialect::Postgres {
                // Holds off a concurrent push that relies on this child (it takes FOR SHARE).
                sqlx::query(
                    "SELECT digest FROM manifests WHERE repository_id = $1 AND digest = $2 FOR UPDATE",
                )
                .bind(repo_id)
                .bind(&child)
                .execute(&mut *tx)
                .await?;
            }
            let grandchildren: Vec<String> = sqlx::query_scalar(
                "SELECT target_digest FROM manifest_references
                  WHERE repository_id = $1 AND manifest_digest = $2 AND is_manifest = $3",
            )
            .bind(repo_id)
            .bind(&child)
            .bind(true)
            .fetch_all(&mut *tx)
            .await?;
            let gone = sqlx::query(
                "DELETE FROM manifests WHERE repository_id = $1 AND digest = $2
                   AND NOT EXISTS (SELECT 1 FROM manifest_references r
                                    WHERE r.repository_id = $1 AND r.target_digest = $2 AND r.is_manifest = $3)
                   AND NOT EXISTS (SELECT 1 FROM tags t WHERE t.repository_id = $1 AND t.manifest_digest = $2)",
            )
            .bind(repo_id)
            .bind(&child)
            .bind(true)
            .execute(&mut *tx)
            .await?;
            if gone.rows_affected() > 0 {
                queue.extend(grandchildren);
            }
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn put_lease(
        &self,
        repo: &RepoName,
        digest: &Digest,
        holder: &str,
        expires_at: i64,
    ) -> Result<(), StorageError> {
        sqlx::query(
            "INSERT INTO leases (repository, digest, holder, expires_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (repository, digest, holder) DO UPDATE SET expires_at = excluded.expires_at",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .bind(holder)
        .bind(expires_at)
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn drop_lease(
        &self,
        repo: &RepoName,
        digest: &Digest,
        holder: &str,
    ) -> Result<bool, StorageError> {
        let done =
            sqlx::query("DELETE FROM leases WHERE repository = $1 AND digest = $2 AND holder = $3")
                .bind(repo.as_str())
                .bind(digest.as_str())
                .bind(holder)
                .execute(&self.writer)
                .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn drop_expired_leases(&self, before: i64) -> Result<u64, StorageError> {
        let done = sqlx::query("DELETE FROM leases WHERE expires_at < $1")
            .bind(before)
            .execute(&self.writer)
            .await?;
        Ok(done.rows_affected())
    }

    async fn leases(
        &self,
        repo: &RepoName,
        digest: &Digest,
        now: i64,
    ) -> Result<Vec<Lease>, StorageError> {
        let rows = sqlx::query(
            "SELECT holder, expires_at FROM leases
              WHERE repository = $1 AND digest = $2 AND expires_at > $3 ORDER BY holder",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .bind(now)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Lease {
                    holder: row.try_get("holder")?,
                    expires_at: row.try_get("expires_at")?,
                })
            })
            .collect()
    }

    async fn delete_tag(
        &self,
        repo: &RepoName,
        tag: &Tag,
        by: Option<&str>,
    ) -> Result<bool, StorageError> {
        let mut tx = self.writer.begin().await?;
        let Some(repo_id) = repo_id_in(&mut tx, repo).await? else {
            return Ok(false);
        };
        let before: Option<String> = sqlx::query_scalar(
            "DELETE FROM tags WHERE repository_id = $1 AND name = $2 RETURNING manifest_digest",
        )
        .bind(repo_id)
        .bind(tag.as_str())
        .fetch_optional(&mut *tx)
        .await?;
        let Some(before) = before else {
            return Ok(false);
        };
        record_tag_event(
            &mut tx,
            repo_id,
            tag.as_str(),
            Some(&before),
            None,
            by,
            "delete",
        )
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn tag_history(
        &self,
        repo: &RepoName,
        tag: &Tag,
    ) -> Result<Option<Vec<TagEvent>>, StorageError> {
        let Some(repo_id) = repo_id(&self.reader, repo).await? else {
            return Ok(None);
        };
        let rows = sqlx::query(
            "SELECT from_digest, to_digest, at, actor, reason FROM tag_events
              WHERE repository_id = $1 AND tag = $2 ORDER BY at",
        )
        .bind(repo_id)
        .bind(tag.as_str())
        .fetch_all(&self.reader)
        .await?;
        let digest = |v: Option<String>| v.as_deref().map(parse_digest).transpose();
        rows.iter()
            .map(|row| {
                Ok(TagEvent {
                    from: digest(row.try_get("from_digest")?)?,
                    to: digest(row.try_get("to_digest")?)?,
                    at: row.try_get("at")?,
                    actor: row.try_get("actor")?,
                    reason: row.try_get("reason")?,
                })
            })
            .collect::<Result<Vec<_>, StorageError>>()
            .map(Some)
    }

    async fn expire_tags(&self, now: i64) -> Result<Vec<(RepoName, String)>, StorageError> {
        let mut tx = self.writer.begin().await?;
        let rows = sqlx::query(
            "SELECT t.repository_id, r.name AS repo, t.name, t.manifest_digest FROM tags t
               JOIN repositories r ON r.id = t.repository_id
              WHERE t.expires_at IS NOT NULL AND t.expires_at <= $1",
        )
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        let mut expired = Vec::new();
        for row in rows {
            let repo_id: i64 = row.try_get("repository_id")?;
            let repo: String = row.try_get("repo")?;
            let name: String = row.try_get("name")?;
            let digest: String = row.try_get("manifest_digest")?;
            sqlx::query("DELETE FROM tags WHERE repository_id = $1 AND name = $2")
                .bind(repo_id)
                .bind(&name)
                .execute(&mut *tx)
                .await?;
            record_tag_event(
                &mut tx,
                repo_id,
                &name,
                Some(&digest),
                None,
                None,
                "expired",
            )
            .await?;
            let repo = parse_repo(&repo)?;
            expired.push((repo, name));
        }
        tx.commit().await?;
        Ok(expired)
    }

    async fn manifest_tags(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Vec<String>, StorageError> {
        Ok(sqlx::query_scalar(
            "SELECT t.name FROM tags t JOIN repositories r ON r.id = t.repository_id
              WHERE r.name = $1 AND t.manifest_digest = $2 ORDER BY t.name",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .fetch_all(&self.reader)
        .await?)
    }

    async fn tag_target(&self, repo: &RepoName, tag: &Tag) -> Result<Option<Digest>, StorageError> {
        let d: Option<String> = sqlx::query_scalar(
            "SELECT t.manifest_digest FROM tags t JOIN repositories r ON r.id = t.repository_id
              WHERE r.name = $1 AND t.name = $2 AND (t.expires_at IS NULL OR t.expires_at > $3)",
        )
        .bind(repo.as_str())
        .bind(tag.as_str())
        .bind(now_millis())
        .fetch_optional(&self.reader)
        .await?;
        d.as_deref().map(parse_digest).transpose()
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
            "SELECT name FROM tags WHERE repository_id = $1 AND name > $2
               AND (expires_at IS NULL OR expires_at > $4) ORDER BY name LIMIT $3",
        )
        .bind(repo_id)
        .bind(last.unwrap_or(""))
        .bind(i64::from(limit) + 1)
        .bind(now_millis())
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
            "SELECT name FROM repositories WHERE name > $1 ORDER BY name LIMIT $2",
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
              WHERE r.name = $1 AND m.subject = $2 AND m.deleted_at IS NULL
                AND (CAST($3 AS TEXT) IS NULL OR m.artifact_type = $4)
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
        across_repositories: bool,
    ) -> Result<Vec<Digest>, StorageError> {
        if !across_repositories {
            let mut present = Vec::new();
            for digest in digests {
                let size: Option<i64> = sqlx::query_scalar(BLOB_SIZE_IN_REPO)
                    .bind(repo.as_str())
                    .bind(digest.as_str())
                    .fetch_optional(&self.reader)
                    .await?;
                if size.is_some() {
                    present.push(digest.clone());
                }
            }
            // A client that learns a blob is here will reference it soon: keep it out of the
            // next collection's reach for the grace period.
            if !present.is_empty() {
                let mut tx = self.writer.begin().await?;
                for digest in &present {
                    touch(&mut tx, digest).await?;
                }
                tx.commit().await?;
            }
            return Ok(present);
        }
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        let mut present = Vec::new();
        for digest in digests {
            // Held until the links commit, so a collection cannot remove the blob in between.
            let known: Option<String> = sqlx::query_scalar(match self.dialect {
                Dialect::Postgres => "SELECT digest FROM blobs WHERE digest = $1 FOR SHARE",
                Dialect::Sqlite => "SELECT digest FROM blobs WHERE digest = $1",
            })
            .bind(digest.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            if known.is_some() {
                sqlx::query(LINK_BLOB)
                    .bind(repo_id)
                    .bind(digest.as_str())
                    .bind(now)
                    .execute(&mut *tx)
                    .await?;
                touch(&mut tx, digest).await?;
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
        deleted: bool,
    ) -> Result<Option<Vec<VersionRow>>, StorageError> {
        let Some(repo_id) = repo_id(&self.reader, repo).await? else {
            return Ok(None);
        };
        let sql = if deleted {
            "SELECT m.digest, m.created_at, m.annotations, CAST(NULL AS TEXT) AS tags, m.deleted_tags,
                    m.deleted_at, m.deleted_by
               FROM manifests m
              WHERE m.repository_id = $1 AND m.artifact_type = $2 AND m.deleted_at IS NOT NULL
              ORDER BY m.deleted_at DESC, m.digest"
                .to_owned()
        } else {
            format!(
                "SELECT m.digest, m.created_at, m.annotations,
                    (SELECT {} FROM tags t
                      WHERE t.repository_id = m.repository_id AND t.manifest_digest = m.digest
                        AND (t.expires_at IS NULL OR t.expires_at > $3)) AS tags,
                    CAST(NULL AS TEXT) AS deleted_tags, CAST(NULL AS BIGINT) AS deleted_at,
                    CAST(NULL AS TEXT) AS deleted_by
               FROM manifests m
              WHERE m.repository_id = $1 AND m.artifact_type = $2 AND m.deleted_at IS NULL
              ORDER BY m.created_at DESC, m.digest",
                self.dialect.string_agg()
            )
        };
        let mut query = sqlx::query(&sql).bind(repo_id).bind(artifact_type);
        if !deleted {
            query = query.bind(now_millis());
        }
        let rows = query.fetch_all(&self.reader).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let digest: String = row.try_get("digest")?;
            let annotations: Option<String> = row.try_get("annotations")?;
            let tags: Option<String> = row.try_get("tags")?;
            let deleted_tags: Option<String> = row.try_get("deleted_tags")?;
            let mut tags: Vec<String> = match deleted_tags {
                Some(json) => serde_json::from_str(&json).unwrap_or_default(),
                None => tags
                    .map(|t| t.split(' ').map(str::to_owned).collect())
                    .unwrap_or_default(),
            };
            tags.sort();
            out.push(VersionRow {
                digest: parse_digest(&digest)?,
                created_at: row.try_get("created_at")?,
                annotations: annotations.and_then(|a| serde_json::from_str(&a).ok()),
                tags,
                deleted_at: row.try_get("deleted_at")?,
                deleted_by: row.try_get("deleted_by")?,
            });
        }
        Ok(Some(out))
    }

    async fn blob_location(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<BlobLocation>, StorageError> {
        let row = sqlx::query(
            "SELECT b.size, b.source_digest, b.source_offset FROM repository_blobs rb
               JOIN repositories r ON r.id = rb.repository_id
               JOIN blobs b ON b.digest = rb.digest
              WHERE r.name = $1 AND rb.digest = $2",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .fetch_optional(&self.reader)
        .await?;
        let Some(row) = row else { return Ok(None) };
        let size: i64 = row.try_get("size")?;
        let source: Option<String> = row.try_get("source_digest")?;
        let offset: Option<i64> = row.try_get("source_offset")?;
        let source = match (source, offset) {
            (Some(d), Some(o)) => Some((parse_digest(&d)?, o as u64)),
            _ => None,
        };
        Ok(Some(BlobLocation {
            size: size as u64,
            source,
        }))
    }

    async fn commit_range_chunks(
        &self,
        repo: &RepoName,
        chunks: &[RangeChunk],
    ) -> Result<(), StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        for c in chunks {
            sqlx::query(
                "INSERT INTO blobs (digest, size, created_at, touched_at, source_digest, source_offset)
                 VALUES ($1, $2, $3, $3, $4, $5) ON CONFLICT (digest) DO UPDATE SET touched_at = excluded.touched_at",
            )
            .bind(c.digest.as_str())
            .bind(c.size as i64)
            .bind(now)
            .bind(c.source.as_str())
            .bind(c.offset as i64)
            .execute(&mut *tx)
            .await?;
            sqlx::query(LINK_BLOB)
                .bind(repo_id)
                .bind(c.digest.as_str())
                .bind(now)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn enqueue_job(
        &self,
        kind: &str,
        repo: &RepoName,
        target: &str,
        retry_failed: bool,
    ) -> Result<Job, StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        sqlx::query(
            "INSERT INTO jobs (id, kind, repository, target, state, created_at, updated_at)
             VALUES ($1, $2, $3, $4, 'queued', $5, $5)
             ON CONFLICT (kind, repository, target) DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(kind)
        .bind(repo.as_str())
        .bind(target)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if retry_failed {
            sqlx::query(
                "UPDATE jobs SET state = 'queued', lease_until = 0, updated_at = $4
                  WHERE kind = $1 AND repository = $2 AND target = $3 AND state = 'failed'",
            )
            .bind(kind)
            .bind(repo.as_str())
            .bind(target)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE kind = $1 AND repository = $2 AND target = $3"
        ))
        .bind(kind)
        .bind(repo.as_str())
        .bind(target)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        job_from_row(&row)
    }

    async fn get_job(
        &self,
        kind: &str,
        repo: &RepoName,
        target: &str,
    ) -> Result<Option<Job>, StorageError> {
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE kind = $1 AND repository = $2 AND target = $3"
        ))
        .bind(kind)
        .bind(repo.as_str())
        .bind(target)
        .fetch_optional(&self.writer)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn claim_job(&self, lease_millis: i64) -> Result<Option<Job>, StorageError> {
        let now = now_millis();
        // The condition is checked again by the UPDATE itself: of two replicas that picked the
        // same job, PostgreSQL makes the second re-evaluate it against the first's claim.
        let due = "((state = 'queued' AND lease_until <= $1) OR (state = 'running' AND lease_until < $1))";
        let row = sqlx::query(&format!(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_until = $2, updated_at = $1
              WHERE id = (SELECT id FROM jobs WHERE {due} ORDER BY created_at, id LIMIT 1) AND {due}
              RETURNING {JOB_COLUMNS}"
        ))
        .bind(now)
        .bind(now + lease_millis)
        .fetch_optional(&self.writer)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn renew_job(
        &self,
        id: &str,
        attempts: i64,
        lease_millis: i64,
    ) -> Result<bool, StorageError> {
        let now = now_millis();
        let done = sqlx::query(
            "UPDATE jobs SET lease_until = $3, updated_at = $4
              WHERE id = $1 AND attempts = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(attempts)
        .bind(now + lease_millis)
        .bind(now)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn create_job(
        &self,
        kind: &str,
        repo: &RepoName,
        spec: &str,
    ) -> Result<Job, StorageError> {
        let id = uuid::Uuid::new_v4().to_string();
        let row = sqlx::query(&format!(
            "INSERT INTO jobs (id, kind, repository, target, state, spec, created_at, updated_at)
             VALUES ($1, $2, $3, $1, 'queued', $4, $5, $5)
             RETURNING {JOB_COLUMNS}"
        ))
        .bind(&id)
        .bind(kind)
        .bind(repo.as_str())
        .bind(spec)
        .bind(now_millis())
        .fetch_one(&self.writer)
        .await?;
        job_from_row(&row)
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<Job>, StorageError> {
        let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.writer)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn list_jobs(
        &self,
        kind: &str,
        repo: &RepoName,
        limit: u32,
    ) -> Result<Vec<Job>, StorageError> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE kind = $1 AND repository = $2
              ORDER BY created_at DESC, id LIMIT $3"
        ))
        .bind(kind)
        .bind(repo.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.writer)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn cancel_job(&self, id: &str, reason: &str) -> Result<Option<Job>, StorageError> {
        sqlx::query(
            "UPDATE jobs SET state = 'failed', error = $2, lease_until = 0, updated_at = $3
              WHERE id = $1 AND state IN ('queued', 'running')",
        )
        .bind(id)
        .bind(reason)
        .bind(now_millis())
        .execute(&self.writer)
        .await?;
        sqlx::query("DELETE FROM job_files WHERE job_id = $1")
            .bind(id)
            .execute(&self.writer)
            .await?;
        self.job_by_id(id).await
    }

    async fn save_job_file(
        &self,
        id: &str,
        attempts: i64,
        file: &JobFile,
        progress: &str,
    ) -> Result<bool, StorageError> {
        let mut tx = self.writer.begin().await?;
        // The fence first: an attempt that lost the job records nothing.
        if !set_job_progress(&mut *tx, id, attempts, progress).await? {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO job_files (job_id, path, version, entry) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job_id, path) DO UPDATE SET version = excluded.version, entry = excluded.entry",
        )
        .bind(id)
        .bind(&file.path)
        .bind(&file.version)
        .bind(&file.entry)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn save_job_progress(
        &self,
        id: &str,
        attempts: i64,
        progress: &str,
    ) -> Result<bool, StorageError> {
        Ok(set_job_progress(&self.writer, id, attempts, progress).await?)
    }

    async fn job_files(&self, id: &str) -> Result<Vec<JobFile>, StorageError> {
        let rows = sqlx::query("SELECT path, version, entry FROM job_files WHERE job_id = $1")
            .bind(id)
            .fetch_all(&self.writer)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(JobFile {
                    path: r.try_get("path")?,
                    version: r.try_get("version")?,
                    entry: r.try_get("entry")?,
                })
            })
            .collect()
    }

    async fn finish_job(
        &self,
        id: &str,
        attempts: i64,
        outcome: &JobOutcome,
    ) -> Result<bool, StorageError> {
        let (state, result, error, not_before) = match outcome {
            JobOutcome::Done(r) => (JobState::Done, Some(r.as_str()), None, 0),
            JobOutcome::Failed(e) => (JobState::Failed, None, Some(e.as_str()), 0),
            JobOutcome::Retry { error, not_before } => {
                (JobState::Queued, None, Some(error.as_str()), *not_before)
            }
        };
        let done = sqlx::query(
            "UPDATE jobs SET state = $3, result = $4, error = $5, lease_until = $6, updated_at = $7
              WHERE id = $1 AND attempts = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(attempts)
        .bind(state.as_str())
        .bind(result)
        .bind(error)
        .bind(not_before)
        .bind(now_millis())
        .execute(&self.writer)
        .await?;
        let recorded = done.rows_affected() > 0;
        if recorded && !matches!(outcome, JobOutcome::Retry { .. }) {
            // What a finished job kept for resuming is of no more use.
            sqlx::query("DELETE FROM job_files WHERE job_id = $1")
                .bind(id)
                .execute(&self.writer)
                .await?;
        }
        Ok(recorded)
    }

    async fn sealed_layer(
        &self,
        layer: &Digest,
        reading: &str,
    ) -> Result<Option<String>, StorageError> {
        Ok(sqlx::query_scalar(
            "SELECT files FROM sealed_layers WHERE layer_digest = $1 AND reading = $2",
        )
        .bind(layer.as_str())
        .bind(reading)
        .fetch_optional(&self.reader)
        .await?)
    }

    async fn record_sealed_layer(
        &self,
        layer: &Digest,
        reading: &str,
        files: &str,
    ) -> Result<(), StorageError> {
        sqlx::query(
            "INSERT INTO sealed_layers (layer_digest, reading, files, created_at) VALUES ($1, $2, $3, $4)
             ON CONFLICT (layer_digest, reading) DO NOTHING",
        )
        .bind(layer.as_str())
        .bind(reading)
        .bind(files)
        .bind(now_millis())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    async fn ping(&self) -> Result<(), StorageError> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }
}

/// What a manifest may reference.
#[derive(Clone, Copy)]
enum Held {
    Blob,
    Manifest,
}

/// Of `digests`, those the repository does not hold (as blobs or as manifests), in sorted order.
async fn missing(
    tx: &mut Transaction<'_, Any>,
    held: Held,
    repo_id: i64,
    digests: &[Digest],
    dialect: Dialect,
) -> Result<Vec<Digest>, sqlx::Error> {
    let query = match (held, dialect) {
        // The blob rows stay held until the manifest commits, so a collection cannot remove a
        // blob between this check and the commit (docs/gc.md). SQLite's single writer gives the
        // same guarantee.
        (Held::Blob, Dialect::Postgres) => {
            "SELECT rb.digest FROM repository_blobs rb JOIN blobs b ON b.digest = rb.digest
              WHERE rb.repository_id = $1 AND rb.digest = $2 FOR SHARE OF b"
        }
        (Held::Blob, Dialect::Sqlite) => {
            "SELECT digest FROM repository_blobs WHERE repository_id = $1 AND digest = $2"
        }
        (Held::Manifest, Dialect::Postgres) => "SELECT digest FROM manifests WHERE repository_id = $1 AND digest = $2 AND deleted_at IS NULL FOR SHARE",
        (Held::Manifest, Dialect::Sqlite) => "SELECT digest FROM manifests WHERE repository_id = $1 AND digest = $2 AND deleted_at IS NULL",
    };
    let mut out = Vec::new();
    for digest in dedup(digests) {
        let found: Option<String> = sqlx::query_scalar(query)
            .bind(repo_id)
            .bind(digest.as_str())
            .fetch_optional(&mut **tx)
            .await?;
        if found.is_none() {
            out.push(digest);
        }
    }
    Ok(out)
}

fn dedup(digests: &[Digest]) -> Vec<Digest> {
    let mut v = digests.to_vec();
    v.sort();
    v.dedup();
    v
}
