//! The SQL metadata store, for SQLite (the embedded default) and PostgreSQL (production), through
//! sqlx's `Any` driver so both run the same queries.
//!
//! Queries use `$N` placeholders, which both drivers accept, and only SQL both dialects share; the
//! one aggregate that differs goes through [`Dialect`]. Every use case is one transaction. SQLite
//! writes go through a pool of one connection, so write transactions queue in the process instead
//! of failing with SQLITE_BUSY; PostgreSQL serialises conflicting writes itself, and the statements
//! that must not race (tag moves) are single conditional statements.

mod blobs;
mod compact;
mod dialect;
mod estimate;
mod gc;
mod jobs;
mod leases;
mod listener;
mod manifests;
mod migrate;
mod sealed;
mod tags;
mod uploads;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{Any, AnyPool, Transaction};
use vial_core::manifest::Descriptor;
use vial_core::{Digest, RepoName, Tag, Target};

use super::metadata::{
    BlobLocation, BlobMeta, BytesDeletion, CommitManifestError, Job, JobFile, JobMeta, JobOutcome,
    JobState, Lease, LeaseMeta, ManifestMeta, ManifestRecord, MetadataStore, PackedChunk, Page,
    Presence, RangeChunk, Restored, SealMeta, Source, StoredCheck, StoredManifest, TagEvent,
    TagMeta, TagMoved, TagPrecondition, UploadMeta, UploadSession, VersionRow, VersionTotals,
    Window,
};
pub use dialect::Dialect;
use listener::{Listener, TAG_MOVES_CHANNEL};

use super::{now_millis, PackId, StorageError};

/// Tag moves a slow watcher may fall behind by before it is told it lost some.
const MOVES_QUEUE: usize = 1024;

/// The size of a blob if `$1` (a repository name) holds `$2` (a digest).
const BLOB_SIZE_IN_REPO: &str = "SELECT b.size FROM repository_blobs rb
       JOIN repositories r ON r.id = rb.repository_id
       JOIN blobs b ON b.id = rb.blob_id
      WHERE r.name = $1 AND b.digest = $2";

/// Links blob `$2` (a digest whose row exists) into repository id `$1` at time `$3`; linking
/// twice is a no-op.
const LINK_BLOB: &str = "INSERT INTO repository_blobs (repository_id, blob_id, created_at)
     SELECT $1, id, $3 FROM blobs WHERE digest = $2 ON CONFLICT DO NOTHING";

/// Links the blobs whose digests are in the set `$2` (rows that exist) into repository id `$1`
/// at time `$3`, with [`Dialect::text_set`] filled in; linking twice is a no-op.
const LINK_BLOBS: &str = "INSERT INTO repository_blobs (repository_id, blob_id, created_at)
     SELECT $1, id, $3 FROM blobs WHERE digest IN (SELECT value FROM {set}) ON CONFLICT DO NOTHING";

/// Digests as the JSON array [`Dialect::text_set`] expands.
fn digest_set<'a>(digests: impl Iterator<Item = &'a Digest>) -> String {
    serde_json::to_string(&digests.map(Digest::as_str).collect::<Vec<_>>()).unwrap_or_default()
}

#[derive(Debug, Clone)]
pub struct SqlMetadataStore {
    reader: AnyPool,
    writer: AnyPool,
    dialect: Dialect,
    /// Milliseconds within which a blob's last touch is recent enough not to be written again.
    touch_slack: i64,
    /// Tag moves, for [`TagMeta::tag_moves`].
    moves: tokio::sync::broadcast::Sender<TagMoved>,
    /// PostgreSQL: the database URL and whether the task that hears other replicas' moves runs.
    listener: Option<std::sync::Arc<Listener>>,
}

impl SqlMetadataStore {
    /// Presence checks leave a blob's `touched_at` alone while it is less than `slack` old: a
    /// read-mostly registry then writes a hot blob's row once per `slack`, not once per check.
    /// Collection must add `slack` to its grace period ([`crate::service::gc::cutoff`]).
    pub fn with_touch_slack(mut self, slack: Duration) -> Self {
        self.touch_slack = slack.as_millis() as i64;
        self
    }

    /// Tells this process's watchers that tags moved, once the transaction that moved them has
    /// committed. PostgreSQL tells every replica itself ([`record_tag_event`]'s NOTIFY), this
    /// process included.
    fn announce<'a>(&self, repo: &RepoName, tags: impl IntoIterator<Item = &'a str>) {
        if self.dialect == Dialect::Sqlite {
            for tag in tags {
                // No receiver is no one watching: nothing to tell.
                let _ = self.moves.send(TagMoved::Tag(repo.clone(), tag.to_owned()));
            }
        }
    }

    /// The `touched_at` below which a touch is written.
    fn stale_touch(&self, now: i64) -> i64 {
        now - self.touch_slack
    }

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
        migrate::migrate(&writer, Dialect::Sqlite).await?;
        let reader = AnyPoolOptions::new()
            .max_connections(8)
            .acquire_timeout(Duration::from_secs(30))
            .connect(&url("ro"))
            .await?;
        Ok(SqlMetadataStore {
            reader,
            writer,
            dialect: Dialect::Sqlite,
            touch_slack: 0,
            moves: tokio::sync::broadcast::channel(MOVES_QUEUE).0,
            listener: None,
        })
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
        migrate::migrate(&writer, Dialect::Postgres).await?;
        let reader = pool(8).connect(url).await?;
        Ok(SqlMetadataStore {
            reader,
            writer,
            dialect: Dialect::Postgres,
            touch_slack: 0,
            moves: tokio::sync::broadcast::channel(MOVES_QUEUE).0,
            listener: Some(std::sync::Arc::new(Listener::new(url))),
        })
    }
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
/// Marks a blob as wanted now, so collection leaves it alone for the grace period; a touch newer
/// than `stale_before` stands (see [`SqlMetadataStore::with_touch_slack`]).
async fn touch(
    tx: &mut Transaction<'_, Any>,
    digest: &Digest,
    stale_before: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query("UPDATE blobs SET touched_at = $1 WHERE digest = $2 AND touched_at < $3")
        .bind(now_millis())
        .bind(digest.as_str())
        .bind(stale_before)
        .execute(&mut **tx)
        .await?;
    Ok(())
}

/// [`touch`] for the blobs of a [`digest_set`], in one statement.
async fn touch_all(
    tx: &mut Transaction<'_, Any>,
    set: &str,
    dialect: Dialect,
    stale_before: i64,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE blobs SET touched_at = $1 WHERE digest IN (SELECT value FROM {}) AND touched_at < $3",
        dialect.text_set("$2")
    ))
    .bind(now_millis())
    .bind(set)
    .bind(stale_before)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// Records a tag move in its history. On PostgreSQL it also notifies every replica's listener
/// ([`TAG_MOVES_CHANNEL`]), which the database delivers only if and when the transaction commits.
// One argument per column of the history row, besides the transaction and its dialect.
#[allow(clippy::too_many_arguments)]
async fn record_tag_event(
    tx: &mut Transaction<'_, Any>,
    dialect: Dialect,
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
    if dialect == Dialect::Postgres {
        sqlx::query(&format!(
            "SELECT pg_notify('{TAG_MOVES_CHANNEL}', name || ' ' || $2) FROM repositories WHERE id = $1"
        ))
        .bind(repo_id)
        .bind(tag)
        .execute(&mut **tx)
        .await?;
    }
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

#[async_trait]
impl MetadataStore for SqlMetadataStore {
    async fn ping(&self) -> Result<(), StorageError> {
        sqlx::query("SELECT 1").execute(&self.reader).await?;
        Ok(())
    }
}

/// A new, empty database on the PostgreSQL server `VIAL_TEST_POSTGRES_URL` names (scripts/test-all
/// runs the library tests with one), as a URL; `None` without a server: a skip, except under
/// `VIAL_TEST_REQUIRE_ALL=1` (CI), where a missing server fails the calling test.
#[cfg(test)]
pub(super) async fn test_postgres_database() -> Option<String> {
    let Ok(server) = std::env::var("VIAL_TEST_POSTGRES_URL") else {
        let required = std::env::var("VIAL_TEST_REQUIRE_ALL").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "VIAL_TEST_POSTGRES_URL is required (VIAL_TEST_REQUIRE_ALL=1) but not set: \
             the PostgreSQL store tests cannot run"
        );
        eprintln!("SKIP: VIAL_TEST_POSTGRES_URL is not set");
        return None;
    };
    sqlx::any::install_default_drivers();
    let name = format!("vial_unit_{}", uuid::Uuid::new_v4().simple());
    let admin = AnyPoolOptions::new()
        .max_connections(1)
        .connect(&format!("{server}/postgres"))
        .await
        .unwrap();
    sqlx::raw_sql(&format!("CREATE DATABASE {name}"))
        .execute(&admin)
        .await
        .unwrap();
    Some(format!("{server}/{name}"))
}
