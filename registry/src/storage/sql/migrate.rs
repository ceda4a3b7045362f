//! The schema: migrations per dialect, applied in order at start-up and recorded in
//! `vial_migrations`; PostgreSQL replicas starting together take turns under an advisory lock.

use sqlx::AnyPool;

use super::Dialect;
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
