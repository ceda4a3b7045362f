//! Garbage collection's reads and removals (docs/gc.md): the candidate tables the triggers of
//! migration 6 fill, collection in batches under row locks, and the dry run's estimate.

use std::collections::{HashMap, HashSet};

use async_trait::async_trait;
use futures_util::StreamExt;
use sqlx::any::AnyRow;
use sqlx::Row;
use vial_core::{Digest, RepoName};

use super::blobs::parse_pack;
use super::*;
use crate::storage::metadata::{Candidates, Garbage, GcEstimate, GcMeta};

/// The range chunks that live in a blob row `b`. (`IS NOT NULL`, implied by the equality, lets
/// PostgreSQL's planner read the partial index `blobs_by_source` instead of hashing every row of
/// `blobs`.)
macro_rules! range_chunks_of_b {
    () => {
        "SELECT 1 FROM blobs a WHERE a.source_digest = b.digest AND a.source_digest IS NOT NULL"
    };
}

/// [`range_chunks_of_b`] as a constant, for the dry run's statements (estimate.rs).
pub(super) const RANGE_CHUNKS_OF_B: &str = range_chunks_of_b!();

/// A blob row `b` that no manifest references, that no range chunk lives in, and that nobody
/// touched since `$1`.
const UNREFERENCED: &str = concat!(
    "b.touched_at < $1
    AND NOT EXISTS (SELECT 1 FROM manifest_blobs r WHERE r.blob_id = b.id)
    AND NOT EXISTS (",
    range_chunks_of_b!(),
    ")"
);

/// A committed pack (`p`) no chunk lives in, created (and last compacted) before `$1`.
const UNUSED_PACK: &str = "p.committed AND p.created_at < $1
    AND (p.moved_at IS NULL OR p.moved_at <= $1)
    AND NOT EXISTS (SELECT 1 FROM blobs b WHERE b.pack_id = p.id)";

/// The columns [`garbage_from_row`] reads, of a `blobs` row `b`.
pub(super) const GARBAGE: &str = "b.digest, b.size, b.source_digest, b.pack_id";

/// Byte deletions in flight at once while a batch's rows are held.
const DELETIONS_AT_ONCE: usize = 16;

/// The index collection needs on PostgreSQL (migration 11). A migration builds it, but an index
/// dropped by hand or left invalid by a failed concurrent rebuild would make every pass scan
/// `repository_blobs` once per blob.
const BLOB_INDEX: &str = "repository_blobs_by_blob";

pub(super) fn garbage_from_row(row: &AnyRow) -> Result<Garbage, StorageError> {
    let digest: String = row.try_get("digest")?;
    let size: i64 = row.try_get("size")?;
    let source: Option<String> = row.try_get("source_digest")?;
    let pack: Option<String> = row.try_get("pack_id")?;
    Ok(Garbage {
        digest: parse_digest(&digest)?,
        size: size as u64,
        own_bytes: source.is_none() && pack.is_none(),
        pack: pack.as_deref().map(parse_pack).transpose()?,
    })
}

/// Strings as the JSON array [`Dialect::text_set`] expands.
pub(super) fn text_list<'a>(items: impl IntoIterator<Item = &'a str>) -> String {
    serde_json::to_string(&items.into_iter().collect::<Vec<_>>()).unwrap_or_default()
}

/// The SQL type of a candidate table's key column.
fn key_type(column: &str) -> &'static str {
    if column == "blob_id" {
        "BIGINT"
    } else {
        "TEXT"
    }
}

/// `$1` as a candidate table's key.
fn key_param(column: &str) -> String {
    format!("CAST($1 AS {})", key_type(column))
}

/// Where paging a candidate table's keys starts: before every blob id, before every pack id.
pub(super) fn first_key(column: &str) -> &'static str {
    if column == "blob_id" {
        "0"
    } else {
        ""
    }
}

impl SqlMetadataStore {
    /// The next `limit` keys of `table`'s candidates after `after` (`column` order), and where
    /// the batch after them starts (`None`: this is the last).
    pub(super) async fn candidate_batch(
        &self,
        table: &str,
        column: &str,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<String>, Option<String>), StorageError> {
        // Ordered by the column itself: PostgreSQL names `CAST(blob_id AS TEXT)` `blob_id` too,
        // and an unqualified `ORDER BY blob_id` would sort the text ("10000" before "9999"),
        // so that a page boundary across a digit skipped ids and read others twice.
        let batch: Vec<String> = sqlx::query_scalar(&format!(
            "SELECT CAST(c.{column} AS TEXT) AS page_key FROM {table} c
              WHERE c.{column} > {} ORDER BY c.{column} LIMIT $2",
            key_param(column)
        ))
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        let next = (batch.len() as u32 == limit)
            .then(|| batch.last().cloned())
            .flatten();
        Ok((batch, next))
    }

    /// Drops from `table` the candidates of `settled` (their key and the `queued` generation the
    /// pass read them at) that were not queued again since: a reference removed meanwhile bumped
    /// `queued`, so that candidate stays for the next pass.
    async fn drop_settled(
        &self,
        table: &str,
        column: &str,
        settled: &[(String, i64)],
    ) -> Result<(), StorageError> {
        if settled.is_empty() {
            return Ok(());
        }
        let d = self.dialect;
        sqlx::query(&format!(
            "DELETE FROM {table} WHERE ({column}, queued) IN {}",
            d.json_pairs("$1", key_type(column), "BIGINT"),
        ))
        .bind(serde_json::to_string(settled).unwrap_or_default())
        .execute(&self.writer)
        .await?;
        Ok(())
    }

    /// Takes the rows of `table` whose `column` is in the JSON array `set` `FOR UPDATE`, in
    /// `column` order, on PostgreSQL; SQLite runs every write transaction alone.
    pub(super) async fn lock_rows(
        &self,
        tx: &mut Transaction<'_, Any>,
        (table, column): (&str, &str),
        set: &str,
    ) -> Result<(), StorageError> {
        if self.dialect == Dialect::Postgres {
            sqlx::query(&format!(
                "SELECT {column} FROM {table} WHERE {column} IN
                   (SELECT value FROM json_array_elements_text(CAST($1 AS json)))
                  ORDER BY {column} FOR UPDATE"
            ))
            .bind(set)
            .execute(&mut **tx)
            .await?;
        }
        Ok(())
    }

    /// Runs `delete` for every item at once (a few at a time) and splits the items into those
    /// whose bytes are gone and those whose deletion failed (logged; their rows stay).
    async fn delete_all<T: Clone + std::fmt::Display + Send + Sync>(
        items: Vec<T>,
        delete: impl Fn(T) -> BytesDeletion + Sync,
    ) -> Vec<T> {
        let results: Vec<(T, Result<(), StorageError>)> = futures_util::stream::iter(items)
            .map(|item| {
                let deletion = delete(item.clone());
                async move { (item, deletion.await) }
            })
            .buffer_unordered(DELETIONS_AT_ONCE)
            .collect()
            .await;
        results
            .into_iter()
            .filter_map(|(item, r)| match r {
                Ok(()) => Some(item),
                Err(e) => {
                    tracing::warn!(%item, error = %vial_core::error_chain(&e), "could not delete bytes; the next collection pass tries again");
                    None
                }
            })
            .collect()
    }

    /// The ids of the manifests purging `purged` removes: those, and recursively the children no
    /// remaining manifest lists and no tag names (what `purge_manifests` does). A few statements
    /// per level of the tree, however many manifests go.
    pub(super) async fn doomed_manifests(
        &self,
        purged: &[(RepoName, Digest)],
    ) -> Result<Vec<i64>, StorageError> {
        let d = self.dialect;
        let pairs = |ty: &str| d.json_pairs("$1", ty, "TEXT");
        let named: Vec<(&str, &str)> = purged
            .iter()
            .map(|(r, m)| (r.as_str(), m.as_str()))
            .collect();
        let mut conn = self.reader.acquire().await?;
        let rows = sqlx::query(&format!(
            "SELECT m.repository_id, m.digest, m.id FROM manifests m
               JOIN repositories r ON r.id = m.repository_id WHERE (r.name, m.digest) IN {}",
            pairs("TEXT")
        ))
        .bind(serde_json::to_string(&named).unwrap_or_default())
        .fetch_all(&mut *conn)
        .await?;
        type Key = (i64, String);
        let key = |row: &AnyRow, column: &str| -> Result<Key, StorageError> {
            Ok((row.try_get("repository_id")?, row.try_get(column)?))
        };
        let mut doomed: HashMap<Key, i64> = HashMap::new();
        for row in &rows {
            doomed.insert(key(row, "digest")?, row.try_get("id")?);
        }
        let mut pending: Vec<Key> = doomed.keys().cloned().collect();
        // Children of doomed manifests, round by round: a child is doomed once every manifest
        // listing it is and no tag names it.
        let mut waiting: std::collections::BTreeSet<Key> = Default::default();
        while !pending.is_empty() {
            let children = sqlx::query(&format!(
                "SELECT repository_id, target_digest FROM manifest_references
                  WHERE (repository_id, manifest_digest) IN {} AND is_manifest = $2",
                pairs("BIGINT")
            ))
            .bind(serde_json::to_string(&pending).unwrap_or_default())
            .bind(true)
            .fetch_all(&mut *conn)
            .await?;
            pending.clear();
            for row in &children {
                let child = key(row, "target_digest")?;
                if !doomed.contains_key(&child) {
                    waiting.insert(child);
                }
            }
            if waiting.is_empty() {
                break;
            }
            let set = serde_json::to_string(&waiting).unwrap_or_default();
            let parents = sqlx::query(&format!(
                "SELECT repository_id, target_digest, manifest_digest FROM manifest_references
                  WHERE (repository_id, target_digest) IN {} AND is_manifest = $2",
                pairs("BIGINT")
            ))
            .bind(&set)
            .bind(true)
            .fetch_all(&mut *conn)
            .await?;
            let tagged = sqlx::query(&format!(
                "SELECT repository_id, manifest_digest FROM tags
                  WHERE (repository_id, manifest_digest) IN {}",
                pairs("BIGINT")
            ))
            .bind(&set)
            .fetch_all(&mut *conn)
            .await?;
            let ids = sqlx::query(&format!(
                "SELECT repository_id, digest, id FROM manifests WHERE (repository_id, digest) IN {}",
                pairs("BIGINT")
            ))
            .bind(&set)
            .fetch_all(&mut *conn)
            .await?;
            let mut held: HashSet<Key> = HashSet::new();
            for row in &tagged {
                held.insert(key(row, "manifest_digest")?);
            }
            for row in &parents {
                let (repo, parent): Key = key(row, "manifest_digest")?;
                if !doomed.contains_key(&(repo, parent)) {
                    held.insert(key(row, "target_digest")?);
                }
            }
            for row in &ids {
                let child = key(row, "digest")?;
                if !held.contains(&child) && waiting.remove(&child) {
                    doomed.insert(child.clone(), row.try_get("id")?);
                    pending.push(child);
                }
            }
        }
        Ok(doomed.into_values().collect())
    }
}

#[async_trait]
impl GcMeta for SqlMetadataStore {
    async fn gc_blocker(&self) -> Result<Option<String>, StorageError> {
        if self.dialect != Dialect::Postgres {
            return Ok(None);
        }
        let valid: Option<bool> = sqlx::query_scalar(
            "SELECT i.indisvalid FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              WHERE c.relname = $1 AND pg_table_is_visible(c.oid)",
        )
        .bind(BLOB_INDEX)
        .fetch_optional(&self.reader)
        .await?;
        Ok(match valid {
            Some(true) => None,
            Some(false) => Some(format!(
                "the index {BLOB_INDEX} is invalid (a CREATE INDEX CONCURRENTLY that failed): \
                 rebuild it with `REINDEX INDEX CONCURRENTLY {BLOB_INDEX};` (docs/gc.md)"
            )),
            None => Some(format!(
                "the index {BLOB_INDEX} is missing, and without it a collection pass takes time \
                 quadratic in the number of blobs: build it with `CREATE INDEX CONCURRENTLY \
                 {BLOB_INDEX} ON repository_blobs (blob_id);` (docs/gc.md)"
            )),
        })
    }

    async fn blob_candidates(
        &self,
        after: Option<&str>,
        touched_before: i64,
        limit: u32,
    ) -> Result<Candidates<Garbage>, StorageError> {
        // One read decides the whole batch: a candidate some manifest lists or some range chunk
        // lives in is settled, and so is one whose blob is gone. No lock is needed: dropping a
        // settled candidate checks that `queued` has not moved since this read.
        //
        // On PostgreSQL each candidate's row is looked up by its id: a plain join let the planner
        // scan the whole `blobs` table for a thousand rows, and the range-chunk check without
        // `IS NOT NULL` hashed the whole table again (together 62 ms a batch at 1e5 blobs,
        // against 8). `OFFSET 0` keeps the lateral subquery from being turned back into a join.
        let blob = match self.dialect {
            Dialect::Postgres => {
                "LEFT JOIN LATERAL (SELECT * FROM blobs b WHERE b.id = c.blob_id OFFSET 0) b ON true"
            }
            Dialect::Sqlite => "LEFT JOIN blobs b ON b.id = c.blob_id",
        };
        let rows = sqlx::query(&format!(
            "SELECT CAST(c.blob_id AS TEXT) AS blob_id, c.queued, {GARBAGE}, b.touched_at,
                    CAST(CASE WHEN b.id IS NULL
                                OR EXISTS (SELECT 1 FROM manifest_blobs r WHERE r.blob_id = c.blob_id)
                                OR EXISTS ({})
                              THEN 1 ELSE 0 END AS BIGINT) AS settled
               FROM (SELECT blob_id, queued FROM gc_candidates WHERE blob_id > CAST($1 AS BIGINT)
                      ORDER BY blob_id LIMIT $2) c
               {blob}
              ORDER BY c.blob_id",
            range_chunks_of_b!()
        ))
        .bind(after.unwrap_or(first_key("blob_id")))
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        let mut settled = Vec::new();
        let mut ready = Vec::new();
        for row in &rows {
            let id: String = row.try_get("blob_id")?;
            if row.try_get::<i64, _>("settled")? == 1 {
                settled.push((id, row.try_get("queued")?));
            } else if row.try_get::<i64, _>("touched_at")? < touched_before {
                ready.push(garbage_from_row(row)?);
            }
        }
        self.drop_settled("gc_candidates", "blob_id", &settled)
            .await?;
        let next = (rows.len() as u32 == limit)
            .then(|| rows.last().and_then(|r| r.try_get("blob_id").ok()))
            .flatten();
        Ok(Candidates {
            examined: rows.len() as u64,
            ready,
            next,
        })
    }

    async fn collect_blobs(
        &self,
        digests: &[Digest],
        touched_before: i64,
        delete_bytes: &(dyn Fn(Digest) -> BytesDeletion + Send + Sync),
    ) -> Result<Vec<Garbage>, StorageError> {
        if digests.is_empty() {
            return Ok(Vec::new());
        }
        let set = digest_set(digests.iter());
        let mut tx = self.writer.begin().await?;
        // Waits for manifest commits that hold these blobs (FOR SHARE, in the same digest order,
        // so neither side deadlocks) and holds off new ones.
        self.lock_rows(&mut tx, ("blobs", "digest"), &set).await?;
        // Checked again now that the rows are held: a new statement sees every commit so far.
        let rows = sqlx::query(&format!(
            "SELECT {GARBAGE}, b.id FROM blobs b WHERE b.digest IN (SELECT value FROM {}) AND {UNREFERENCED}",
            self.dialect.text_set("$2")
        ))
        .bind(touched_before)
        .bind(&set)
        .fetch_all(&mut *tx)
        .await?;
        let garbage = rows
            .iter()
            .map(garbage_from_row)
            .collect::<Result<Vec<_>, _>>()?;
        let mut ids = HashMap::new();
        for (row, g) in rows.iter().zip(&garbage) {
            ids.insert(g.digest.clone(), row.try_get::<i64, _>("id")?.to_string());
        }
        // Bytes first, under the locks; a blob whose bytes could not go keeps its row.
        let own: Vec<Digest> = garbage
            .iter()
            .filter(|g| g.own_bytes)
            .map(|g| g.digest.clone())
            .collect();
        let own_count = own.len();
        let deleted: HashSet<Digest> = Self::delete_all(own, delete_bytes)
            .await
            .into_iter()
            .collect();
        let gone: Vec<Garbage> = if deleted.len() == own_count {
            garbage
        } else {
            garbage
                .into_iter()
                .filter(|g| !g.own_bytes || deleted.contains(&g.digest))
                .collect()
        };
        let gone_ids = text_list(
            gone.iter()
                .filter_map(|g| ids.get(&g.digest))
                .map(String::as_str),
        );
        // By id: the rows of blobs pushed together sit together in these tables and their
        // indexes, where their digests are scattered through the digest indexes.
        for (table, column) in [
            ("gc_candidates", "blob_id"),
            ("repository_blobs", "blob_id"),
            ("blobs", "id"),
        ] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE {column} {}",
                self.dialect.in_ids("$1")
            ))
            .bind(&gone_ids)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(gone)
    }

    async fn pack_candidates(
        &self,
        after: Option<&str>,
        created_before: i64,
        limit: u32,
    ) -> Result<Candidates<(PackId, u64)>, StorageError> {
        // As for blobs: a pack some chunk lives in, or that is gone, is settled.
        let rows = sqlx::query(
            "SELECT c.pack_id, c.queued, p.size,
                    CAST(CASE WHEN p.id IS NULL
                                OR EXISTS (SELECT 1 FROM blobs b WHERE b.pack_id = c.pack_id)
                              THEN 1 ELSE 0 END AS BIGINT) AS settled,
                    CAST(CASE WHEN p.committed AND p.created_at < $3
                                   AND (p.moved_at IS NULL OR p.moved_at <= $3)
                              THEN 1 ELSE 0 END AS BIGINT) AS ripe
               FROM (SELECT pack_id, queued FROM gc_pack_candidates WHERE pack_id > $1
                      ORDER BY pack_id LIMIT $2) c
               LEFT JOIN packs p ON p.id = c.pack_id
              ORDER BY c.pack_id",
        )
        .bind(after.unwrap_or(first_key("pack_id")))
        .bind(i64::from(limit))
        .bind(created_before)
        .fetch_all(&self.reader)
        .await?;
        let mut settled = Vec::new();
        let mut ready = Vec::new();
        for row in &rows {
            let id: String = row.try_get("pack_id")?;
            if row.try_get::<i64, _>("settled")? == 1 {
                settled.push((id, row.try_get("queued")?));
            } else if row.try_get::<i64, _>("ripe")? == 1 {
                let size: i64 = row.try_get("size")?;
                ready.push((parse_pack(&id)?, size as u64));
            }
        }
        self.drop_settled("gc_pack_candidates", "pack_id", &settled)
            .await?;
        let next = (rows.len() as u32 == limit)
            .then(|| rows.last().and_then(|r| r.try_get("pack_id").ok()))
            .flatten();
        Ok(Candidates {
            examined: rows.len() as u64,
            ready,
            next,
        })
    }

    async fn collect_packs(
        &self,
        packs: &[PackId],
        created_before: i64,
        delete_bytes: &(dyn Fn(PackId) -> BytesDeletion + Send + Sync),
    ) -> Result<Vec<(PackId, u64)>, StorageError> {
        if packs.is_empty() {
            return Ok(Vec::new());
        }
        let set = text_list(packs.iter().map(PackId::as_str));
        let mut tx = self.writer.begin().await?;
        self.lock_rows(&mut tx, ("packs", "id"), &set).await?;
        // Only the commit that created a pack ever makes a chunk live in it, so once no chunk
        // does, none ever will again: checking under the row locks is enough.
        let rows = sqlx::query(&format!(
            "SELECT p.id, p.size FROM packs p WHERE p.id IN (SELECT value FROM {}) AND {UNUSED_PACK}",
            self.dialect.text_set("$2")
        ))
        .bind(created_before)
        .bind(&set)
        .fetch_all(&mut *tx)
        .await?;
        let mut sizes = HashMap::new();
        for row in &rows {
            let id: String = row.try_get("id")?;
            let size: i64 = row.try_get("size")?;
            sizes.insert(parse_pack(&id)?, size as u64);
        }
        let gone = Self::delete_all(sizes.keys().cloned().collect(), delete_bytes).await;
        let set = text_list(gone.iter().map(PackId::as_str));
        for (table, column) in [("packs", "id"), ("gc_pack_candidates", "pack_id")] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE {column} IN (SELECT value FROM {})",
                self.dialect.text_set("$1")
            ))
            .bind(&set)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(gone
            .into_iter()
            .map(|p| {
                let size = sizes.get(&p).copied().unwrap_or(0);
                (p, size)
            })
            .collect())
    }

    async fn gc_estimate(
        &self,
        purged: &[(RepoName, Digest)],
        touched_before: i64,
        created_before: i64,
    ) -> Result<GcEstimate, StorageError> {
        self.estimate(purged, touched_before, created_before).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BLOB: &str = "sha256:7777777777777777777777777777777777777777777777777777777777777777";

    /// A candidate a pass read while a manifest still listed it, and whose last reference went
    /// before the pass dropped it, stays a candidate: the removal bumped its generation. Dropped
    /// at the generation it has now, it goes.
    async fn a_candidate_queued_again_is_not_dropped(store: &SqlMetadataStore) {
        let db = &store.writer;
        let run = |sql: &'static str| sqlx::query(sql);
        manifest_listing(db, &BLOB.replace('7', "8"), &[BLOB]).await;
        let generation = || async {
            sqlx::query_as::<_, (String, i64)>(
                "SELECT CAST(blob_id AS TEXT), queued FROM gc_candidates",
            )
            .fetch_all(db)
            .await
            .unwrap()
        };
        // What a pass reads: the new blob queued once, and listed.
        let read = generation().await;
        assert_eq!(read.len(), 1);
        // The manifest goes before the pass drops the candidate it saw held.
        run("DELETE FROM manifests").execute(db).await.unwrap();
        store
            .drop_settled("gc_candidates", "blob_id", &read)
            .await
            .unwrap();
        let now = generation().await;
        assert_eq!(now.len(), 1, "the candidate was lost");
        assert_eq!(
            now[0].1,
            read[0].1 + 1,
            "the removal did not bump its generation"
        );
        // The next batch finds it unreferenced, and ready.
        let batch = store.blob_candidates(None, i64::MAX, 10).await.unwrap();
        let ready: Vec<&str> = batch.ready.iter().map(|g| g.digest.as_str()).collect();
        assert_eq!(ready, [BLOB]);
        store
            .drop_settled("gc_candidates", "blob_id", &now)
            .await
            .unwrap();
        assert!(generation().await.is_empty());
    }

    const SHARED: &str = "sha256:5555555555555555555555555555555555555555555555555555555555555555";

    /// Inserts the manifest `digest` of `a/b` (made if missing) listing `blobs` (made if missing).
    async fn manifest_listing(db: &AnyPool, digest: &str, blobs: &[&str]) {
        sqlx::query(
            "INSERT INTO repositories (name, created_at) VALUES ('a/b', 0) ON CONFLICT DO NOTHING",
        )
        .execute(db)
        .await
        .unwrap();
        sqlx::query("INSERT INTO manifests (repository_id, digest, media_type, size, content, created_at)
             SELECT id, $1, 'application/vnd.oci.image.manifest.v1+json', 2, $2, 0 FROM repositories")
        .bind(digest)
        .bind(b"{}".to_vec())
        .execute(db)
        .await
        .unwrap();
        for blob in blobs {
            sqlx::query("INSERT INTO blobs (digest, size, created_at, touched_at) VALUES ($1, 1, 0, 0) ON CONFLICT DO NOTHING")
                .bind(*blob)
                .execute(db)
                .await
                .unwrap();
            sqlx::query(
                "INSERT INTO manifest_blobs (manifest_id, blob_id)
                 SELECT m.id, b.id FROM manifests m, blobs b WHERE m.digest = $1 AND b.digest = $2",
            )
            .bind(digest)
            .bind(*blob)
            .execute(db)
            .await
            .unwrap();
        }
    }

    /// The digests of the queued candidates, in order.
    async fn queued(db: &AnyPool) -> Vec<String> {
        sqlx::query_scalar(
            "SELECT b.digest FROM gc_candidates c JOIN blobs b ON b.id = c.blob_id ORDER BY b.digest",
        )
        .fetch_all(db)
        .await
        .unwrap()
    }

    /// Removing a manifest queues the blobs it was the last to list, and none that another
    /// manifest still lists (migration 10): the pass no longer reads and drops those.
    async fn a_removal_queues_only_what_it_leaves_unreferenced(store: &SqlMetadataStore) {
        let db = &store.writer;
        let (first, second) = (BLOB.replace('7', "1"), BLOB.replace('7', "2"));
        manifest_listing(db, &first, &[SHARED, BLOB]).await;
        manifest_listing(db, &second, &[SHARED]).await;
        sqlx::query("DELETE FROM gc_candidates")
            .execute(db)
            .await
            .unwrap();
        sqlx::query("DELETE FROM manifests WHERE digest = $1")
            .bind(&first)
            .execute(db)
            .await
            .unwrap();
        assert_eq!(
            queued(db).await,
            [BLOB],
            "only the blob no manifest lists any more"
        );
        sqlx::query("DELETE FROM manifests WHERE digest = $1")
            .bind(&second)
            .execute(db)
            .await
            .unwrap();
        assert_eq!(queued(db).await, [SHARED, BLOB]);
    }

    #[tokio::test]
    async fn a_removal_queues_only_what_it_leaves_unreferenced_on_sqlite() {
        sqlx::any::install_default_drivers();
        let dir = tempfile::tempdir().unwrap();
        let store = SqlMetadataStore::open_sqlite(&dir.path().join("m.db"))
            .await
            .unwrap();
        a_removal_queues_only_what_it_leaves_unreferenced(&store).await;
    }

    #[tokio::test]
    async fn a_removal_queues_only_what_it_leaves_unreferenced_on_postgres() {
        let Some(url) = super::super::test_postgres_database().await else {
            return;
        };
        let store = SqlMetadataStore::open_postgres(&url).await.unwrap();
        a_removal_queues_only_what_it_leaves_unreferenced(&store).await;
    }

    /// Two transactions that remove the last two references to a blob at the same time: each
    /// alone would see the other's reference still there. The trigger's lock makes the second
    /// check wait for the first transaction to commit, so the blob is queued.
    #[tokio::test]
    async fn concurrent_removals_of_the_last_references_queue_the_blob_on_postgres() {
        let Some(url) = super::super::test_postgres_database().await else {
            return;
        };
        let store = SqlMetadataStore::open_postgres(&url).await.unwrap();
        let db = &store.writer;
        let (first, second) = (BLOB.replace('7', "1"), BLOB.replace('7', "2"));
        manifest_listing(db, &first, &[SHARED]).await;
        manifest_listing(db, &second, &[SHARED]).await;
        sqlx::query("DELETE FROM gc_candidates")
            .execute(db)
            .await
            .unwrap();
        let mut one = db.begin().await.unwrap();
        sqlx::query("DELETE FROM manifests WHERE digest = $1")
            .bind(&first)
            .execute(&mut *one)
            .await
            .unwrap();
        let other = {
            let db = db.clone();
            tokio::spawn(async move {
                let mut two = db.begin().await.unwrap();
                sqlx::query("DELETE FROM manifests WHERE digest = $1")
                    .bind(&second)
                    .execute(&mut *two)
                    .await
                    .unwrap();
                two.commit().await.unwrap();
            })
        };
        // The second removal has deleted its row and waits in its trigger (or, without the
        // lock, has already committed having queued nothing).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted",
            )
            .fetch_one(&store.reader)
            .await
            .unwrap();
            if waiting > 0 || other.is_finished() {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the second removal neither waited nor ended"
            );
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        one.commit().await.unwrap();
        other.await.unwrap();
        assert_eq!(
            queued(db).await,
            [SHARED],
            "the blob that lost its last reference was not queued"
        );
    }

    #[tokio::test]
    async fn a_candidate_queued_again_is_not_dropped_on_sqlite() {
        sqlx::any::install_default_drivers();
        let dir = tempfile::tempdir().unwrap();
        let store = SqlMetadataStore::open_sqlite(&dir.path().join("m.db"))
            .await
            .unwrap();
        a_candidate_queued_again_is_not_dropped(&store).await;
    }

    #[tokio::test]
    async fn a_candidate_queued_again_is_not_dropped_on_postgres() {
        let Some(url) = super::super::test_postgres_database().await else {
            return;
        };
        let store = SqlMetadataStore::open_postgres(&url).await.unwrap();
        a_candidate_queued_again_is_not_dropped(&store).await;
    }
}
