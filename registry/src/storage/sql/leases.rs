//! Lease rows: nodes that have a version mounted.

use async_trait::async_trait;
use sqlx::Row;
use vial_core::{Digest, RepoName};

use super::*;

#[async_trait]
impl LeaseMeta for SqlMetadataStore {
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
}
