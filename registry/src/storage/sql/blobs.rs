//! Blob rows and their links to repositories; garbage collection candidates and removal.

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::any::AnyRow;
use sqlx::Row;
use vial_core::{Digest, RepoName};

use super::*;

/// The columns [`location_from_row`] reads, of a `blobs` row `b`.
const LOCATION: &str = "b.size, b.source_digest, b.pack_id, b.source_offset";

fn location_from_row(row: &AnyRow) -> Result<BlobLocation, StorageError> {
    let size: i64 = row.try_get("size")?;
    let blob: Option<String> = row.try_get("source_digest")?;
    let pack: Option<String> = row.try_get("pack_id")?;
    let offset: Option<i64> = row.try_get("source_offset")?;
    let source = match (blob, pack, offset) {
        (Some(d), None, Some(o)) => Some((Source::Blob(parse_digest(&d)?), o as u64)),
        (None, Some(p), Some(o)) => Some((Source::Pack(parse_pack(&p)?), o as u64)),
        (None, None, _) => None,
        _ => {
            return Err(StorageError::Corrupt(
                "a blob row names both a source blob and a pack, or no offset".into(),
            ))
        }
    };
    Ok(BlobLocation {
        size: size as u64,
        source,
    })
}

pub(super) fn parse_pack(s: &str) -> Result<PackId, StorageError> {
    PackId::parse(s).ok_or_else(|| StorageError::Corrupt(format!("stored pack id {s:?}")))
}

#[async_trait]
impl BlobMeta for SqlMetadataStore {
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
                SET source_digest = NULL, source_offset = NULL, pack_id = NULL,
                    touched_at = excluded.touched_at",
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
        touch(&mut tx, digest, self.stale_touch(now_millis())).await?;
        tx.commit().await?;
        Ok(Some(size as u64))
    }

    async fn unlink_blob(&self, repo: &RepoName, digest: &Digest) -> Result<bool, StorageError> {
        self.delete_one("repository_blobs", "digest", repo, digest.as_str())
            .await
    }

    async fn link_present_blobs(
        &self,
        repo: &RepoName,
        digests: &[Digest],
        presence: Presence,
    ) -> Result<Vec<Digest>, StorageError> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let set = self.dialect.text_set("$2");
        let asked = digest_set(digests.iter());
        if presence != Presence::LinkAcross {
            let rows: Vec<String> = sqlx::query_scalar(&format!(
                "SELECT rb.digest FROM repository_blobs rb JOIN repositories r ON r.id = rb.repository_id
                  WHERE r.name = $1 AND rb.digest IN (SELECT value FROM {set})"
            ))
            .bind(repo.as_str())
            .bind(&asked)
            .fetch_all(&self.reader)
            .await?;
            let present = rows
                .iter()
                .map(|d| parse_digest(d))
                .collect::<Result<Vec<_>, _>>()?;
            // A pusher that learns a blob is here will reference it soon: keep it out of the
            // next collection's reach for the grace period.
            if presence == Presence::Touch && !present.is_empty() {
                let mut tx = self.writer.begin().await?;
                touch_all(
                    &mut tx,
                    &digest_set(present.iter()),
                    self.dialect,
                    self.stale_touch(now_millis()),
                )
                .await?;
                tx.commit().await?;
            }
            return Ok(present);
        }
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        // Held until the links commit, so a collection cannot remove a blob in between.
        let known: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT digest FROM blobs WHERE digest IN (SELECT value FROM {}) ORDER BY digest{}",
            self.dialect.text_set("$1"),
            if self.dialect == Dialect::Postgres {
                " FOR SHARE"
            } else {
                ""
            }
        ))
        .bind(&asked)
        .fetch_all(&mut *tx)
        .await?;
        if !known.is_empty() {
            let known_set =
                serde_json::to_string(&known).map_err(|e| StorageError::Corrupt(e.to_string()))?;
            sqlx::query(&format!(
                "INSERT INTO repository_blobs (repository_id, digest, created_at)
                 SELECT $1, value, $3 FROM {set} WHERE true ON CONFLICT DO NOTHING"
            ))
            .bind(repo_id)
            .bind(&known_set)
            .bind(now_millis())
            .execute(&mut *tx)
            .await?;
            touch_all(
                &mut tx,
                &known_set,
                self.dialect,
                self.stale_touch(now_millis()),
            )
            .await?;
        }
        tx.commit().await?;
        known.iter().map(|d| parse_digest(d)).collect()
    }

    async fn blob_location(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<BlobLocation>, StorageError> {
        let row = sqlx::query(&format!(
            "SELECT {LOCATION} FROM repository_blobs rb
               JOIN repositories r ON r.id = rb.repository_id
               JOIN blobs b ON b.digest = rb.digest
              WHERE r.name = $1 AND rb.digest = $2"
        ))
        .bind(repo.as_str())
        .bind(digest.as_str())
        .fetch_optional(&self.reader)
        .await?;
        row.as_ref().map(location_from_row).transpose()
    }

    async fn stored_totals(&self) -> Result<(u64, u64), StorageError> {
        let row = sqlx::query(
            "SELECT COUNT(*) AS n, CAST(COALESCE(SUM(size), 0) AS BIGINT) AS bytes FROM blobs",
        )
        .fetch_one(&self.reader)
        .await?;
        let (n, bytes): (i64, i64) = (row.try_get("n")?, row.try_get("bytes")?);
        Ok((n.max(0) as u64, bytes.max(0) as u64))
    }

    async fn blob_locations(
        &self,
        repo: &RepoName,
        digests: &[Digest],
    ) -> Result<HashMap<Digest, BlobLocation>, StorageError> {
        if digests.is_empty() {
            return Ok(HashMap::new());
        }
        let rows = sqlx::query(&format!(
            "SELECT b.digest, {LOCATION} FROM repository_blobs rb
               JOIN repositories r ON r.id = rb.repository_id
               JOIN blobs b ON b.digest = rb.digest
              WHERE r.name = $1 AND rb.digest IN (SELECT value FROM {})",
            self.dialect.text_set("$2")
        ))
        .bind(repo.as_str())
        .bind(digest_set(digests.iter()))
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                let digest: String = row.try_get("digest")?;
                Ok((parse_digest(&digest)?, location_from_row(row)?))
            })
            .collect()
    }

    async fn commit_pack(
        &self,
        repo: &RepoName,
        pack: &PackId,
        size: u64,
        chunks: &[PackedChunk],
    ) -> Result<(), StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        let begun = sqlx::query(
            "UPDATE packs SET committed = $2 WHERE id = $1 AND size = $3 AND NOT committed",
        )
        .bind(pack.as_str())
        .bind(true)
        .bind(size as i64)
        .execute(&mut *tx)
        .await?;
        if begun.rows_affected() != 1 {
            return Err(StorageError::Corrupt(format!(
                "pack {pack} was not begun at {size} bytes, or is committed already"
            )));
        }
        // One statement for all the chunks, whatever their number: a JSON array of
        // [digest, size, offset] rows. A chunk the registry holds already keeps its home (it
        // is live: collection removes a row and its bytes together, under the row's lock).
        // In digest order: rows are locked in the order they are written, and collection locks
        // its batches in digest order too, so neither can deadlock the other.
        let mut sorted: Vec<_> = chunks
            .iter()
            .map(|c| (c.digest.as_str(), c.size, c.offset))
            .collect();
        sorted.sort_unstable();
        let rows =
            serde_json::to_string(&sorted).map_err(|e| StorageError::Corrupt(e.to_string()))?;
        sqlx::query(&format!(
            "INSERT INTO blobs (digest, size, created_at, touched_at, pack_id, source_offset)
             SELECT {}, {}, $2, $2, $3, {} FROM {} WHERE true
             ON CONFLICT (digest) DO UPDATE SET touched_at = excluded.touched_at
                WHERE blobs.touched_at < $4",
            self.dialect.json_field("value", 0, "TEXT"),
            self.dialect.json_field("value", 1, "BIGINT"),
            self.dialect.json_field("value", 2, "BIGINT"),
            self.dialect.json_rows("$1"),
        ))
        .bind(&rows)
        .bind(now)
        .bind(pack.as_str())
        .bind(self.stale_touch(now))
        .execute(&mut *tx)
        .await?;
        let set = digest_set(chunks.iter().map(|c| &c.digest));
        sqlx::query(&format!(
            "INSERT INTO repository_blobs (repository_id, digest, created_at)
             SELECT $1, value, $3 FROM {} WHERE true ON CONFLICT DO NOTHING",
            self.dialect.text_set("$2")
        ))
        .bind(repo_id)
        .bind(&set)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    async fn begin_pack(&self, pack: &PackId, size: u64) -> Result<(), StorageError> {
        sqlx::query("INSERT INTO packs (id, size, created_at, committed) VALUES ($1, $2, $3, $4)")
            .bind(pack.as_str())
            .bind(size as i64)
            .bind(now_millis())
            .bind(false)
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn stale_packs(
        &self,
        created_before: i64,
        limit: u32,
    ) -> Result<Vec<PackId>, StorageError> {
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT id FROM packs WHERE NOT committed AND created_at < $1 ORDER BY created_at LIMIT $2",
        )
        .bind(created_before)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        ids.iter().map(|id| parse_pack(id)).collect()
    }

    async fn drop_pack(&self, pack: &PackId) -> Result<(), StorageError> {
        sqlx::query("DELETE FROM packs WHERE id = $1 AND NOT committed")
            .bind(pack.as_str())
            .execute(&self.writer)
            .await?;
        Ok(())
    }

    async fn commit_range_chunks(
        &self,
        repo: &RepoName,
        chunks: &[RangeChunk],
    ) -> Result<(), StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;
        // In digest order, as collection locks rows (see `commit_pack`).
        let mut chunks: Vec<&RangeChunk> = chunks.iter().collect();
        chunks.sort_unstable_by(|a, b| a.digest.as_str().cmp(b.digest.as_str()));
        for c in chunks {
            let (blob, pack) = match &c.source {
                Source::Blob(d) => (Some(d.as_str()), None),
                Source::Pack(p) => (None, Some(p.as_str())),
            };
            sqlx::query(
                "INSERT INTO blobs (digest, size, created_at, touched_at, source_digest, pack_id, source_offset)
                 VALUES ($1, $2, $3, $3, $4, $5, $6)
                 ON CONFLICT (digest) DO UPDATE SET touched_at = excluded.touched_at
                    WHERE blobs.touched_at < $7",
            )
            .bind(c.digest.as_str())
            .bind(c.size as i64)
            .bind(now)
            .bind(blob)
            .bind(pack)
            .bind(c.offset as i64)
            .bind(self.stale_touch(now))
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
}
