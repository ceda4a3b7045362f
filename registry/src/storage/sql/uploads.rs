//! Upload session rows.

use async_trait::async_trait;
use sqlx::Row;
use vial_core::RepoName;

use super::*;

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
impl UploadMeta for SqlMetadataStore {
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
}
