//! The schema: migrations per dialect, applied in order at start-up and recorded in
//! `vial_migrations`; PostgreSQL replicas starting together take turns under an advisory lock.

use sqlx::AnyPool;

use super::dialect::Dialect;
use crate::storage::{now_millis, StorageError};

/// The schema, in order, per dialect. A database records which of these it has applied.
const SQLITE_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "registry",
        include_str!("../../../../migrations/sqlite/0001_registry.sql"),
    ),
    (
        2,
        "seals",
        include_str!("../../../../migrations/sqlite/0002_seals.sql"),
    ),
    (
        3,
        "lifecycle",
        include_str!("../../../../migrations/sqlite/0003_lifecycle.sql"),
    ),
    (
        4,
        "sync",
        include_str!("../../../../migrations/sqlite/0004_sync.sql"),
    ),
    (
        5,
        "packs",
        include_str!("../../../../migrations/sqlite/0005_packs.sql"),
    ),
    (
        6,
        "gc candidates",
        include_str!("../../../../migrations/sqlite/0006_gc_candidates.sql"),
    ),
    (
        7,
        "version listing",
        include_str!("../../../../migrations/sqlite/0007_version_listing.sql"),
    ),
    (
        8,
        "compact references",
        include_str!("../../../../migrations/sqlite/0008_compact_references.sql"),
    ),
    (
        9,
        "candidates by id",
        include_str!("../../../../migrations/sqlite/0009_candidates_by_id.sql"),
    ),
    (
        10,
        "queue unreferenced",
        include_str!("../../../../migrations/sqlite/0010_queue_unreferenced.sql"),
    ),
    (
        11,
        "repository blob ids",
        include_str!("../../../../migrations/sqlite/0011_repository_blob_ids.sql"),
    ),
    (
        12,
        "pack live bytes",
        include_str!("../../../../migrations/sqlite/0012_pack_live_bytes.sql"),
    ),
];
const POSTGRES_MIGRATIONS: &[(i64, &str, &str)] = &[
    (
        1,
        "registry",
        include_str!("../../../../migrations/postgres/0001_registry.sql"),
    ),
    (
        2,
        "seals",
        include_str!("../../../../migrations/postgres/0002_seals.sql"),
    ),
    (
        3,
        "lifecycle",
        include_str!("../../../../migrations/postgres/0003_lifecycle.sql"),
    ),
    (
        4,
        "sync",
        include_str!("../../../../migrations/postgres/0004_sync.sql"),
    ),
    (
        5,
        "packs",
        include_str!("../../../../migrations/postgres/0005_packs.sql"),
    ),
    (
        6,
        "gc candidates",
        include_str!("../../../../migrations/postgres/0006_gc_candidates.sql"),
    ),
    (
        7,
        "version listing",
        include_str!("../../../../migrations/postgres/0007_version_listing.sql"),
    ),
    (
        8,
        "compact references",
        include_str!("../../../../migrations/postgres/0008_compact_references.sql"),
    ),
    (
        9,
        "candidates by id",
        include_str!("../../../../migrations/postgres/0009_candidates_by_id.sql"),
    ),
    (
        10,
        "queue unreferenced",
        include_str!("../../../../migrations/postgres/0010_queue_unreferenced.sql"),
    ),
    (
        11,
        "repository blob ids",
        include_str!("../../../../migrations/postgres/0011_repository_blob_ids.sql"),
    ),
    (
        12,
        "pack live bytes",
        include_str!("../../../../migrations/postgres/0012_pack_live_bytes.sql"),
    ),
];

/// An arbitrary constant: the advisory lock that serialises migrations of replicas starting at once.
const MIGRATION_LOCK: i64 = 0x7669_616c_6d69_6772;

pub(super) async fn migrate(pool: &AnyPool, dialect: Dialect) -> Result<(), StorageError> {
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
    let result = apply_migrations(&mut conn, dialect, i64::MAX).await;
    if dialect == Dialect::Postgres {
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(MIGRATION_LOCK)
            .execute(&mut *conn)
            .await?;
    }
    result
}

/// Applies every migration up to version `through` that is not applied yet.
async fn apply_migrations(
    conn: &mut sqlx::AnyConnection,
    dialect: Dialect,
    through: i64,
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
    for (version, name, sql) in migrations.iter().filter(|(v, ..)| *v <= through) {
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

#[cfg(test)]
mod tests {
    use super::super::SqlMetadataStore;
    use super::*;
    use crate::storage::metadata::BlobMeta;
    use sqlx::any::AnyPoolOptions;
    use vial_core::RepoName;

    const INDEX: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    const CHILD: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
    const LISTED: [&str; 2] = [
        "sha256:3333333333333333333333333333333333333333333333333333333333333333",
        "sha256:4444444444444444444444444444444444444444444444444444444444444444",
    ];
    const LOOSE: &str = "sha256:5555555555555555555555555555555555555555555555555555555555555555";

    /// Rows as vial wrote them before migration 8: a manifest listing two blobs and a child
    /// manifest, and a blob nothing lists; the listed blobs linked into the repository by digest.
    async fn seed_version_7(url: &str, dialect: Dialect) {
        let pool = AnyPoolOptions::new()
            .max_connections(1)
            .connect(url)
            .await
            .unwrap();
        let mut conn = pool.acquire().await.unwrap();
        apply_migrations(&mut conn, dialect, 7).await.unwrap();
        let run = |sql: &'static str| sqlx::query(sql);
        run("INSERT INTO repositories (id, name, created_at) VALUES (1, 'a/b', 0)")
            .execute(&mut *conn)
            .await
            .unwrap();
        for digest in LISTED.iter().chain([&LOOSE]) {
            run("INSERT INTO blobs (digest, size, created_at, touched_at) VALUES ($1, 10, 0, 0)")
                .bind(*digest)
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        for digest in [INDEX, CHILD] {
            run("INSERT INTO manifests (repository_id, digest, media_type, size, content, created_at)
                 VALUES (1, $1, 'application/vnd.oci.image.manifest.v1+json', 2, $2, 0)")
            .bind(digest)
            .bind(b"{}".to_vec())
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        for digest in LISTED {
            run("INSERT INTO repository_blobs (repository_id, digest, created_at) VALUES (1, $1, 7)")
                .bind(digest)
                .execute(&mut *conn)
                .await
                .unwrap();
        }
        let references = LISTED.iter().map(|d| (*d, false)).chain([(CHILD, true)]);
        for (target, is_manifest) in references {
            run("INSERT INTO manifest_references (repository_id, manifest_digest, target_digest, is_manifest)
                 VALUES (1, $1, $2, $3)")
            .bind(INDEX)
            .bind(target)
            .bind(is_manifest)
            .execute(&mut *conn)
            .await
            .unwrap();
        }
        // One candidate waiting when the upgrade starts.
        run("DELETE FROM gc_candidates")
            .execute(&mut *conn)
            .await
            .unwrap();
        run("INSERT INTO gc_candidates (digest) VALUES ($1)")
            .bind(LOOSE)
            .execute(&mut *conn)
            .await
            .unwrap();
    }

    /// After the migrations since (8 and 11 above all) the same references and repository links
    /// are there, as ids, and behave as before.
    async fn check_upgraded(store: &SqlMetadataStore) {
        let db = &store.writer;
        let count = |sql: &'static str| async move {
            sqlx::query_scalar::<_, i64>(sql)
                .fetch_one(db)
                .await
                .unwrap()
        };
        // The blobs queued as collection candidates, by digest.
        let queued = || async move {
            sqlx::query_scalar::<_, String>(
                "SELECT b.digest FROM gc_candidates c JOIN blobs b ON b.id = c.blob_id ORDER BY b.digest",
            )
            .fetch_all(db)
            .await
            .unwrap()
        };
        assert_eq!(count("SELECT count(*) FROM manifest_blobs").await, 2);
        assert_eq!(
            count("SELECT count(*) FROM manifest_blobs r JOIN blobs b ON b.id = r.blob_id
                    JOIN manifests m ON m.id = r.manifest_id
                   WHERE b.digest <> 'sha256:5555555555555555555555555555555555555555555555555555555555555555'
                     AND m.digest = 'sha256:1111111111111111111111111111111111111111111111111111111111111111'")
            .await,
            2,
            "the references name the listed blobs and the manifest that lists them"
        );
        assert_eq!(
            count("SELECT count(*) FROM manifest_references").await,
            1,
            "only the child manifest stays as a text reference"
        );
        // The repository holds the blobs it was linked to, and only those.
        let repo: RepoName = "a/b".parse().unwrap();
        for (digest, held) in LISTED.iter().map(|d| (*d, Some(10))).chain([(LOOSE, None)]) {
            let digest: vial_core::Digest = digest.parse().unwrap();
            assert_eq!(store.blob_in_repo(&repo, &digest).await.unwrap(), held);
        }
        assert_eq!(
            count("SELECT count(*) FROM repository_blobs WHERE created_at = 7").await,
            2
        );
        // The waiting candidate is still queued, by its blob's id.
        assert_eq!(queued().await, [LOOSE]);
        // Every row has an id; a new one gets a fresh one, and is queued.
        sqlx::query(
            "INSERT INTO blobs (digest, size, created_at, touched_at) VALUES ($1, 1, 0, 0)",
        )
        .bind("sha256:6666666666666666666666666666666666666666666666666666666666666666")
        .execute(db)
        .await
        .unwrap();
        assert_eq!(count("SELECT count(DISTINCT id) FROM blobs").await, 4);
        assert_eq!(
            count("SELECT count(*) FROM gc_candidates c JOIN blobs b ON b.id = c.blob_id
                    WHERE b.digest = 'sha256:6666666666666666666666666666666666666666666666666666666666666666'")
            .await,
            1,
            "a new blob is a candidate"
        );
        assert_eq!(
            count("SELECT count(*) FROM blobs WHERE id IS NULL").await,
            0
        );
        // A listed blob's row cannot go while the manifest lists it.
        let refused = sqlx::query("DELETE FROM blobs WHERE digest = $1")
            .bind(LISTED[0])
            .execute(db)
            .await;
        assert!(refused.is_err(), "a referenced blob row was deleted");
        // Removing the manifest removes its references and queues what they listed.
        sqlx::query("DELETE FROM gc_candidates")
            .execute(db)
            .await
            .unwrap();
        sqlx::query("DELETE FROM manifests WHERE digest = $1")
            .bind(INDEX)
            .execute(db)
            .await
            .unwrap();
        assert_eq!(count("SELECT count(*) FROM manifest_blobs").await, 0);
        assert_eq!(queued().await, LISTED);
    }

    #[tokio::test]
    async fn upgrade_from_version_7_keeps_references_and_candidates_on_sqlite() {
        sqlx::any::install_default_drivers();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.db");
        seed_version_7(
            &format!("sqlite://{}?mode=rwc", path.display()),
            Dialect::Sqlite,
        )
        .await;
        let store = SqlMetadataStore::open_sqlite(&path).await.unwrap();
        check_upgraded(&store).await;
    }

    /// On the PostgreSQL server `VIAL_TEST_POSTGRES_URL` names, in a database of its own
    /// (scripts/test-all runs it so); without one, there is nothing to run it on.
    #[tokio::test]
    async fn upgrade_from_version_7_keeps_references_and_candidates_on_postgres() {
        let Some(url) = super::super::test_postgres_database().await else {
            return;
        };
        seed_version_7(&url, Dialect::Postgres).await;
        let store = SqlMetadataStore::open_postgres(&url).await.unwrap();
        check_upgraded(&store).await;
    }
}
