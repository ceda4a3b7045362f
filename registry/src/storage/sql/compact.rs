//! Compaction's reads and its one transaction (docs/gc.md, "Compaction"). `packs.live_bytes`
//! (migration 12) says how full each pack is without reading its chunks.

use async_trait::async_trait;
use sqlx::Row;

use super::blobs::parse_pack;
use super::gc::text_list;
use super::*;
use crate::storage::compact::{ChunkMove, CompactMeta, PackChunk, PackUse};

#[async_trait]
impl CompactMeta for SqlMetadataStore {
    async fn pack_totals(&self) -> Result<(u64, u64), StorageError> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) AS size,
                    CAST(COALESCE(SUM(live_bytes), 0) AS BIGINT) AS live
               FROM packs WHERE committed",
        )
        .fetch_one(&self.reader)
        .await?;
        let (size, live): (i64, i64) = (row.try_get("size")?, row.try_get("live")?);
        Ok((size.max(0) as u64, live.max(0) as u64))
    }

    async fn packs_with_dead_bytes(
        &self,
        before: i64,
        permille: u32,
        limit: u32,
    ) -> Result<Vec<PackUse>, StorageError> {
        let rows = sqlx::query(
            "SELECT id, size, live_bytes FROM packs
              WHERE committed AND live_bytes > 0 AND (size - live_bytes) * 1000 >= size * $2
                AND created_at < $1 AND (moved_at IS NULL OR moved_at <= $1)
              ORDER BY size - live_bytes DESC, id LIMIT $3",
        )
        .bind(before)
        .bind(i64::from(permille))
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                let (id, size, live): (String, i64, i64) = (
                    row.try_get("id")?,
                    row.try_get("size")?,
                    row.try_get("live_bytes")?,
                );
                Ok(PackUse {
                    id: parse_pack(&id)?,
                    size: size.max(0) as u64,
                    live: live.max(0) as u64,
                })
            })
            .collect()
    }

    async fn pack_chunks(&self, pack: &PackId) -> Result<Vec<PackChunk>, StorageError> {
        let rows = sqlx::query(
            "SELECT digest, size, source_offset FROM blobs WHERE pack_id = $1 ORDER BY source_offset",
        )
        .bind(pack.as_str())
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                let (digest, size, offset): (String, i64, i64) = (
                    row.try_get("digest")?,
                    row.try_get("size")?,
                    row.try_get("source_offset")?,
                );
                Ok(PackChunk {
                    digest: parse_digest(&digest)?,
                    size: size.max(0) as u64,
                    offset: offset.max(0) as u64,
                })
            })
            .collect()
    }

    async fn commit_compaction(
        &self,
        to: &PackId,
        size: u64,
        moves: &[ChunkMove],
    ) -> Result<(u64, u64), StorageError> {
        let now = now_millis();
        let mut sources: Vec<&str> = moves.iter().map(|m| m.from.as_str()).collect();
        sources.sort_unstable();
        sources.dedup();
        let mut tx = self.writer.begin().await?;
        // The lock order of every statement that changes chunk rows (migration 12): the chunks'
        // rows in digest order, then the candidate rows of their packs, then the packs' rows.
        let chunks = digest_set(moves.iter().map(|m| &m.digest));
        self.lock_rows(&mut tx, ("blobs", "digest"), &chunks)
            .await?;
        // The packs left behind may be empty now: the next pass looks at them.
        sqlx::query(&format!(
            "INSERT INTO gc_pack_candidates (pack_id)
             SELECT value FROM {} WHERE true ORDER BY value
             ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1",
            self.dialect.text_set("$1")
        ))
        .bind(text_list(sources.iter().copied()))
        .execute(&mut *tx)
        .await?;
        let mut packs = sources.clone();
        packs.push(to.as_str());
        packs.sort_unstable();
        self.lock_rows(&mut tx, ("packs", "id"), &text_list(packs))
            .await?;
        // Only a chunk still where it was copied from moves: one collected meanwhile, or
        // uploaded whole again, stays as it is, and its copy is dead bytes in the new pack.
        let rows: Vec<(&str, &str, i64, i64)> = moves
            .iter()
            .map(|m| {
                (
                    m.digest.as_str(),
                    m.from.as_str(),
                    m.from_offset as i64,
                    m.to_offset as i64,
                )
            })
            .collect();
        let rows =
            serde_json::to_string(&rows).map_err(|e| StorageError::Corrupt(e.to_string()))?;
        let moved = sqlx::query(&format!(
            "WITH m AS (SELECT {} AS digest, {} AS from_pack, {} AS from_offset, {} AS to_offset
                          FROM {})
             UPDATE blobs SET pack_id = $2, source_offset = m.to_offset
               FROM m
              WHERE blobs.digest = m.digest AND blobs.pack_id = m.from_pack
                AND blobs.source_offset = m.from_offset
             RETURNING blobs.size",
            self.dialect.json_field("value", 0, "TEXT"),
            self.dialect.json_field("value", 1, "TEXT"),
            self.dialect.json_field("value", 2, "BIGINT"),
            self.dialect.json_field("value", 3, "BIGINT"),
            self.dialect.json_rows("$1"),
        ))
        .bind(&rows)
        .bind(to.as_str())
        .fetch_all(&mut *tx)
        .await?;
        if moved.is_empty() {
            // Every chunk moved away or went while it was copied: nothing names the new pack.
            tx.rollback().await?;
            return Ok((0, 0));
        }
        let bytes = moved
            .iter()
            .map(|row| row.try_get::<i64, _>("size").map(|s| s.max(0) as u64))
            .sum::<Result<u64, _>>()?;
        let committed = sqlx::query(
            "UPDATE packs SET committed = $2 WHERE id = $1 AND size = $3 AND NOT committed",
        )
        .bind(to.as_str())
        .bind(true)
        .bind(size as i64)
        .execute(&mut *tx)
        .await?;
        if committed.rows_affected() != 1 {
            return Err(StorageError::Corrupt(format!(
                "pack {to} was not begun at {size} bytes, or is committed already"
            )));
        }
        sqlx::query(&format!(
            "UPDATE packs SET moved_at = $2 WHERE id IN (SELECT value FROM {})",
            self.dialect.text_set("$1")
        ))
        .bind(text_list(sources.iter().copied()))
        .bind(now)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok((moved.len() as u64, bytes))
    }
}
