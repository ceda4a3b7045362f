//! The dry run's estimate (docs/gc.md): what a pass would remove, read page by page from the
//! candidate tables without changing anything.

use std::collections::{HashMap, HashSet};

use sqlx::Row;
use vial_core::{Digest, RepoName};

use super::blobs::parse_pack;
use super::gc::{first_key, garbage_from_row, text_list, GARBAGE, RANGE_CHUNKS_OF_B};
use super::*;
use crate::storage::compact::CompactMeta;
use crate::storage::metadata::GcEstimate;

/// Candidates the dry run reads at once.
const ESTIMATE_BATCH: u32 = 1000;

/// Doomed manifests whose blobs the dry run reads at once.
const PURGE_ESTIMATE_BATCH: usize = 100;

impl SqlMetadataStore {
    /// Adds to `estimate` the blobs of `batch` (ids) that are garbage once the `doomed` manifests (a
    /// [`text_list`] of their ids) are gone, counting in `freed` the chunks of each
    /// pack that go.
    async fn estimate_blobs(
        &self,
        batch: &[String],
        touched_before: i64,
        doomed: &str,
        estimate: &mut GcEstimate,
        freed: &mut HashMap<String, (u64, u64)>,
    ) -> Result<(), StorageError> {
        if batch.is_empty() {
            return Ok(());
        }
        // Unreferenced once the doomed manifests are gone: every reference is from one.
        let rows = sqlx::query(&format!(
            "SELECT {GARBAGE} FROM blobs b
              WHERE b.id IN (SELECT CAST(value AS BIGINT) FROM {}) AND b.touched_at < $2
                AND NOT EXISTS (SELECT 1 FROM manifest_blobs r
                                 WHERE r.blob_id = b.id
                                   AND NOT r.manifest_id IN (SELECT CAST(value AS BIGINT) FROM {}))
                AND NOT EXISTS ({})",
            self.dialect.text_set("$1"),
            self.dialect.text_set("$3"),
            RANGE_CHUNKS_OF_B,
        ))
        .bind(text_list(batch.iter().map(String::as_str)))
        .bind(touched_before)
        .bind(doomed)
        .fetch_all(&self.reader)
        .await?;
        for row in &rows {
            let g = garbage_from_row(row)?;
            estimate.blobs += 1;
            if g.own_bytes {
                estimate.bytes += g.size;
            }
            if let Some(pack) = g.pack {
                let (chunks, bytes) = freed.entry(pack.as_str().to_owned()).or_default();
                *chunks += 1;
                *bytes += g.size;
            }
        }
        Ok(())
    }

    /// Adds to `estimate` the packs of `batch` old enough to collect whose every chunk is among
    /// those `freed` (chunks, bytes per pack); returns their bytes.
    async fn estimate_packs(
        &self,
        batch: &[String],
        created_before: i64,
        freed: &HashMap<String, (u64, u64)>,
        estimate: &mut GcEstimate,
    ) -> Result<u64, StorageError> {
        if batch.is_empty() {
            return Ok(0);
        }
        let rows = sqlx::query(&format!(
            "SELECT p.id, p.size, (SELECT COUNT(*) FROM blobs b WHERE b.pack_id = p.id) AS live
               FROM packs p WHERE p.id IN (SELECT value FROM {}) AND p.committed AND p.created_at < $2
                AND (p.moved_at IS NULL OR p.moved_at <= $2)",
            self.dialect.text_set("$1")
        ))
        .bind(text_list(batch.iter().map(String::as_str)))
        .bind(created_before)
        .fetch_all(&self.reader)
        .await?;
        let mut collected = 0;
        for row in &rows {
            let id: String = row.try_get("id")?;
            let size: i64 = row.try_get("size")?;
            let live: i64 = row.try_get("live")?;
            if live as u64 <= freed.get(&id).map_or(0, |f| f.0) {
                estimate.packs += 1;
                estimate.bytes += size as u64;
                collected += size as u64;
            }
        }
        Ok(collected)
    }

    /// [`GcMeta::gc_estimate`]: what a pass would remove after purging `purged`, changing
    /// nothing.
    pub(super) async fn estimate(
        &self,
        purged: &[(RepoName, Digest)],
        touched_before: i64,
        created_before: i64,
    ) -> Result<GcEstimate, StorageError> {
        // The manifests that go, by id, and the blobs they reference that are not queued yet
        // (their rows go, and the trigger queues them, during the pass).
        let doomed_ids: Vec<String> = self
            .doomed_manifests(purged)
            .await?
            .iter()
            .map(i64::to_string)
            .collect();
        let mut unqueued: HashSet<String> = HashSet::new();
        for batch in doomed_ids.chunks(PURGE_ESTIMATE_BATCH) {
            let targets: Vec<String> = sqlx::query_scalar(&format!(
                "SELECT DISTINCT CAST(r.blob_id AS TEXT) FROM manifest_blobs r
                  WHERE r.manifest_id {}
                    AND NOT EXISTS (SELECT 1 FROM gc_candidates c WHERE c.blob_id = r.blob_id)",
                self.dialect.in_ids("$1")
            ))
            .bind(text_list(batch.iter().map(String::as_str)))
            .fetch_all(&self.reader)
            .await?;
            unqueued.extend(targets);
        }
        let doomed_set = text_list(doomed_ids.iter().map(String::as_str));
        let mut estimate = GcEstimate::default();
        // Before the candidates are read: a push meanwhile can only add live bytes.
        let (stored, live) = self.pack_totals().await?;
        let mut freed: HashMap<String, (u64, u64)> = HashMap::new();
        // The candidates a pass would look at: the queued ones, a page at a time...
        let mut after = first_key("blob_id").to_owned();
        loop {
            let (batch, next) = self
                .candidate_batch("gc_candidates", "blob_id", &after, ESTIMATE_BATCH)
                .await?;
            // A purge running beside this read (the janitor's) queues blobs read as unqueued
            // above; each is counted once, here.
            for id in &batch {
                unqueued.remove(id);
            }
            self.estimate_blobs(
                &batch,
                touched_before,
                &doomed_set,
                &mut estimate,
                &mut freed,
            )
            .await?;
            match next {
                Some(next) => after = next,
                None => break,
            }
        }
        // ...and the unqueued ones.
        let unqueued: Vec<String> = unqueued.into_iter().collect();
        for batch in unqueued.chunks(ESTIMATE_BATCH as usize) {
            self.estimate_blobs(
                batch,
                touched_before,
                &doomed_set,
                &mut estimate,
                &mut freed,
            )
            .await?;
        }
        // Packs every chunk of which goes, then the queued ones no chunk lives in.
        let freeing: Vec<String> = freed.keys().cloned().collect();
        let mut collected = 0;
        for batch in freeing.chunks(ESTIMATE_BATCH as usize) {
            collected += self
                .estimate_packs(batch, created_before, &freed, &mut estimate)
                .await?;
        }
        let mut after = first_key("pack_id").to_owned();
        loop {
            let (batch, next) = self
                .candidate_batch("gc_pack_candidates", "pack_id", &after, ESTIMATE_BATCH)
                .await?;
            let batch: Vec<String> = batch
                .into_iter()
                .filter(|p| !freed.contains_key(p))
                .collect();
            collected += self
                .estimate_packs(&batch, created_before, &freed, &mut estimate)
                .await?;
            match next {
                Some(next) => after = next,
                None => break,
            }
        }
        // A pack the pass removes takes its dead bytes with it; the chunks it collects in the
        // others leave theirs behind (docs/gc.md: a pack keeps its bytes while a chunk lives).
        let dead = stored.saturating_sub(live);
        let freed_bytes: u64 = freed.values().map(|f| f.1).sum();
        estimate.pack_bytes = stored;
        estimate.pack_dead_bytes = dead;
        estimate.pack_bytes_after = stored.saturating_sub(collected);
        estimate.pack_dead_bytes_after = (dead + freed_bytes).saturating_sub(collected);
        estimate.pack_freed = freed
            .into_iter()
            .map(|(id, (_, bytes))| Ok((parse_pack(&id)?, bytes)))
            .collect::<Result<_, StorageError>>()?;
        Ok(estimate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The dry run pages through the candidates by id: pages that cross from one number of
    /// digits to the next hold every candidate once, in numeric order.
    async fn candidate_pages_follow_the_ids_in_numeric_order(store: &SqlMetadataStore) {
        let db = &store.writer;
        sqlx::query("DELETE FROM gc_candidates")
            .execute(db)
            .await
            .unwrap();
        for id in [7i64, 8, 9, 10, 11, 100, 101] {
            sqlx::query("INSERT INTO gc_candidates (blob_id) VALUES ($1)")
                .bind(id)
                .execute(db)
                .await
                .unwrap();
        }
        let mut seen = Vec::new();
        let mut after = first_key("blob_id").to_owned();
        loop {
            let (batch, next) = store
                .candidate_batch("gc_candidates", "blob_id", &after, 2)
                .await
                .unwrap();
            seen.extend(batch);
            match next {
                Some(next) => after = next,
                None => break,
            }
        }
        assert_eq!(seen, ["7", "8", "9", "10", "11", "100", "101"]);
    }

    #[tokio::test]
    async fn candidate_pages_follow_the_ids_in_numeric_order_on_sqlite() {
        sqlx::any::install_default_drivers();
        let dir = tempfile::tempdir().unwrap();
        let store = SqlMetadataStore::open_sqlite(&dir.path().join("m.db"))
            .await
            .unwrap();
        candidate_pages_follow_the_ids_in_numeric_order(&store).await;
    }

    #[tokio::test]
    async fn candidate_pages_follow_the_ids_in_numeric_order_on_postgres() {
        let Some(url) = super::super::test_postgres_database().await else {
            return;
        };
        let store = SqlMetadataStore::open_postgres(&url).await.unwrap();
        candidate_pages_follow_the_ids_in_numeric_order(&store).await;
    }
}
