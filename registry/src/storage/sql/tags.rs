//! Tag reads, removal, history, expiry and the notices of tag moves.

use async_trait::async_trait;
use sqlx::Row;
use tokio::sync::broadcast;
use vial_core::{Digest, RepoName};

use super::*;

#[async_trait]
impl TagMeta for SqlMetadataStore {
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
            self.dialect,
            repo_id,
            tag.as_str(),
            Some(&before),
            None,
            by,
            "delete",
        )
        .await?;
        tx.commit().await?;
        self.announce(repo, [tag.as_str()]);
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
                self.dialect,
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
        for (repo, tag) in &expired {
            self.announce(repo, [tag.as_str()]);
        }
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

    fn tag_moves(&self) -> broadcast::Receiver<TagMoved> {
        let receiver = self.moves.subscribe();
        if let Some(listener) = &self.listener {
            listener.start(self.moves.clone());
        }
        receiver
    }
}
