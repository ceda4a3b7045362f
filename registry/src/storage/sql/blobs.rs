//! Blob rows and their links to repositories; garbage collection candidates and removal.

use std::collections::HashMap;

use async_trait::async_trait;
use sqlx::any::AnyRow;
use sqlx::Row;
use vial_core::{Digest, RepoName};

use super::*;

/// A set of digests read at once is split into at most this many parts, read side by side
/// ([`SqlMetadataStore::held_blobs`]).
const READ_PARTS: usize = 4;
/// Digests below which a set is read in one part.
const READ_PART_MIN: usize = 512;

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

impl SqlMetadataStore {
    /// [`Self::held_blobs`]'s statement: `$1` the repository's name, `$2` the digests.
    fn held_query(&self, columns: &str) -> String {
        self.dialect.held_in(
            "$2",
            columns,
            "(SELECT id FROM repositories WHERE name = $1)",
        )
    }

    /// The rows (`b.digest` and `columns` of `blobs b`) of those of `digests` the repository
    /// holds. A large set is read in parts on several reader connections at once: each digest
    /// costs a few random index probes, so one statement for 4,096 digests is bound by one
    /// database backend's CPU, and the parts run side by side on a server with more than one
    /// core. The read takes no lock, so parts read from different snapshots answer as one would.
    async fn held_blobs(
        &self,
        repo: &RepoName,
        digests: &[Digest],
        columns: &str,
    ) -> Result<Vec<AnyRow>, StorageError> {
        let query = self.held_query(columns);
        let part = digests.len().div_ceil(READ_PARTS).max(READ_PART_MIN);
        let reads = digests.chunks(part).map(|part| {
            sqlx::query(&query)
                .bind(repo.as_str())
                .bind(digest_set(part.iter()))
                .fetch_all(&self.reader)
        });
        let parts = futures_util::future::try_join_all(reads).await?;
        Ok(parts.into_iter().flatten().collect())
    }
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
        let done = sqlx::query(
            "DELETE FROM repository_blobs
              WHERE repository_id = (SELECT id FROM repositories WHERE name = $1)
                AND blob_id = (SELECT id FROM blobs WHERE digest = $2)",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() > 0)
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
        // What the repository holds already, read without a lock or a transaction: the common
        // answer (a re-push finds most of its chunks here) then costs one indexed read.
        let rows = self.held_blobs(repo, digests, "b.touched_at").await?;
        let stale_before = self.stale_touch(now_millis());
        let mut present = Vec::with_capacity(rows.len());
        let mut stale = Vec::new();
        for row in &rows {
            let digest: String = row.try_get("digest")?;
            let touched: Option<i64> = row.try_get("touched_at")?;
            if presence != Presence::Answer && touched.is_some_and(|t| t < stale_before) {
                stale.push(digest);
            } else {
                present.push(parse_digest(&digest)?);
            }
        }
        // A pusher that learns a blob is here will reference it soon: keep it out of the next
        // collection's reach for the grace period. A touch within the slack is recent enough (a
        // pass adds the slack to the grace period); an older one is written, and a blob a
        // collection removed since the read above is not there to touch, so it is not reported.
        if !stale.is_empty() {
            // On PostgreSQL the rows are taken in digest order, as a collection takes them, so
            // neither waits on the other in a cycle.
            let rows = match self.dialect {
                Dialect::Postgres => format!(
                    "SELECT digest FROM blobs WHERE digest IN (SELECT value FROM {})
                      ORDER BY digest FOR UPDATE",
                    self.dialect.text_set("$2")
                ),
                Dialect::Sqlite => format!("SELECT value FROM {}", self.dialect.text_set("$2")),
            };
            let touched: Vec<String> = sqlx::query_scalar(&format!(
                "UPDATE blobs SET touched_at = $1 WHERE digest IN ({rows}) RETURNING digest"
            ))
            .bind(now_millis())
            .bind(serde_json::to_string(&stale).map_err(|e| StorageError::Corrupt(e.to_string()))?)
            .fetch_all(&self.writer)
            .await?;
            for digest in &touched {
                present.push(parse_digest(digest)?);
            }
        }
        if presence != Presence::LinkAcross {
            return Ok(present);
        }
        let held: std::collections::HashSet<&Digest> = present.iter().collect();
        let elsewhere: Vec<&Digest> = digests.iter().filter(|d| !held.contains(d)).collect();
        if elsewhere.is_empty() {
            return Ok(present);
        }
        let asked = digest_set(elsewhere.into_iter());
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
            sqlx::query(&LINK_BLOBS.replace("{set}", &self.dialect.text_set("$2")))
                .bind(repo_id)
                .bind(&known_set)
                .bind(now_millis())
                .execute(&mut *tx)
                .await?;
            touch_all(&mut tx, &known_set, self.dialect, stale_before).await?;
        }
        tx.commit().await?;
        for digest in &known {
            present.push(parse_digest(digest)?);
        }
        Ok(present)
    }

    async fn blob_location(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<BlobLocation>, StorageError> {
        let row = sqlx::query(&format!(
            "SELECT {LOCATION} FROM repository_blobs rb
               JOIN repositories r ON r.id = rb.repository_id
               JOIN blobs b ON b.id = rb.blob_id
              WHERE r.name = $1 AND b.digest = $2"
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
        let rows = self.held_blobs(repo, digests, LOCATION).await?;
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
        sqlx::query(&LINK_BLOBS.replace("{set}", &self.dialect.text_set("$2")))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn blob(c: char) -> Digest {
        parse_digest(&format!("sha256:{}", c.to_string().repeat(64))).unwrap()
    }

    /// The presence check answers what the repository holds, writes a touch only for a blob whose
    /// last one is older than the slack (a minute here), and links what other repositories hold
    /// only when asked.
    async fn presence_touches_only_stale_blobs_and_links_only_across(store: &SqlMetadataStore) {
        let db = &store.writer;
        let (stale, fresh, elsewhere, unknown) = (blob('1'), blob('2'), blob('3'), blob('4'));
        let recent = now_millis() - 1000;
        for (name, id) in [("a/b", 1), ("c/d", 2)] {
            sqlx::query("INSERT INTO repositories (id, name, created_at) VALUES ($1, $2, 0)")
                .bind(id)
                .bind(name)
                .execute(db)
                .await
                .unwrap();
        }
        for (digest, touched, repo) in [(&stale, 0, 1), (&fresh, recent, 1), (&elsewhere, 0, 2)] {
            sqlx::query(
                "INSERT INTO blobs (digest, size, created_at, touched_at) VALUES ($1, 1, 0, $2)",
            )
            .bind(digest.as_str())
            .bind(touched)
            .execute(db)
            .await
            .unwrap();
            sqlx::query(LINK_BLOB)
                .bind(repo)
                .bind(digest.as_str())
                .bind(0_i64)
                .execute(db)
                .await
                .unwrap();
        }
        let touched = |d: &Digest| {
            sqlx::query_scalar::<_, i64>("SELECT touched_at FROM blobs WHERE digest = $1")
                .bind(d.as_str().to_owned())
                .fetch_one(db)
        };
        let repo: RepoName = "a/b".parse().unwrap();
        let asked = [
            stale.clone(),
            fresh.clone(),
            elsewhere.clone(),
            unknown.clone(),
        ];
        let check = |presence| store.link_present_blobs(&repo, &asked, presence);
        let sorted = |mut v: Vec<Digest>| {
            v.sort_by(|a, b| a.as_str().cmp(b.as_str()));
            v
        };

        assert_eq!(
            sorted(check(Presence::Answer).await.unwrap()),
            [stale.clone(), fresh.clone()]
        );
        assert_eq!(
            touched(&stale).await.unwrap(),
            0,
            "an answer alone wrote a touch"
        );

        assert_eq!(
            sorted(check(Presence::Touch).await.unwrap()),
            [stale.clone(), fresh.clone()]
        );
        assert!(
            touched(&stale).await.unwrap() > recent,
            "a stale touch was not renewed"
        );
        assert_eq!(
            touched(&fresh).await.unwrap(),
            recent,
            "a fresh touch was rewritten"
        );
        assert_eq!(
            touched(&elsewhere).await.unwrap(),
            0,
            "another repository's blob was touched"
        );

        assert_eq!(
            sorted(check(Presence::LinkAcross).await.unwrap()),
            [stale.clone(), fresh.clone(), elsewhere.clone()]
        );
        assert!(
            touched(&elsewhere).await.unwrap() > recent,
            "a blob linked across was not touched"
        );
        assert_eq!(
            sorted(check(Presence::Answer).await.unwrap()),
            [stale, fresh, elsewhere],
            "the blob linked across is not in the repository"
        );
    }

    /// The plan of a read of five of the 4,096 blobs a repository holds, one line per step.
    async fn plan_of_a_small_read(store: &SqlMetadataStore) -> Vec<String> {
        let db = &store.writer;
        sqlx::query("INSERT INTO repositories (id, name, created_at) VALUES (1, 'a/b', 0)")
            .execute(db)
            .await
            .unwrap();
        let all: Vec<String> = (0..4096).map(|i| format!("sha256:{i:064x}")).collect();
        let all = serde_json::to_string(&all).unwrap();
        sqlx::query(&format!(
            "INSERT INTO blobs (digest, size, created_at, touched_at) SELECT value, 1, 0, 0 FROM {}",
            store.dialect.text_set("$1")
        ))
        .bind(&all)
        .execute(db)
        .await
        .unwrap();
        sqlx::query(&LINK_BLOBS.replace("{set}", &store.dialect.text_set("$2")))
            .bind(1_i64)
            .bind(&all)
            .bind(0_i64)
            .execute(db)
            .await
            .unwrap();
        // As a registry's database is: PostgreSQL's autovacuum gathers statistics (with them,
        // the planner scans the table for a set it takes for 100 rows), SQLite's are never taken.
        if store.dialect == Dialect::Postgres {
            sqlx::query("ANALYZE").execute(db).await.unwrap();
        }
        let five: Vec<String> = (100..105).map(|i| format!("sha256:{i:064x}")).collect();
        let (explain, column) = match store.dialect {
            Dialect::Sqlite => ("EXPLAIN QUERY PLAN", "detail"),
            Dialect::Postgres => ("EXPLAIN", "QUERY PLAN"),
        };
        let query = format!("{explain} {}", store.held_query("b.size"));
        let rows = sqlx::query(&query)
            .bind("a/b")
            .bind(serde_json::to_string(&five).unwrap())
            .fetch_all(db)
            .await
            .unwrap();
        rows.iter().map(|r| r.try_get(column).unwrap()).collect()
    }

    /// A read of a few blobs costs a few index probes, however many the repository holds: the
    /// plan looks each digest up, and never walks the repository's links or the blobs table.
    #[tokio::test]
    async fn a_small_read_looks_up_only_what_it_asks_for_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlMetadataStore::open_sqlite(&dir.path().join("m.db"))
            .await
            .unwrap();
        let plan = plan_of_a_small_read(&store).await;
        let step = |table: &str| {
            plan.iter()
                .find(|l| {
                    l.starts_with(&format!("SEARCH {table} "))
                        || l.starts_with(&format!("SCAN {table}"))
                })
                .cloned()
                .unwrap_or_default()
        };
        assert!(step("b").contains("(digest=?)"), "{plan:#?}");
        assert!(step("rb").contains("blob_id=?"), "{plan:#?}");
    }

    #[tokio::test]
    async fn a_small_read_looks_up_only_what_it_asks_for_on_postgres() {
        let Some(url) = super::super::test_postgres_database().await else {
            return;
        };
        let store = SqlMetadataStore::open_postgres(&url).await.unwrap();
        let plan = plan_of_a_small_read(&store).await.join("\n");
        assert!(!plan.contains("Seq Scan on blobs"), "{plan}");
        assert!(!plan.contains("Seq Scan on repository_blobs"), "{plan}");
        assert!(plan.contains("Index"), "{plan}");
    }

    #[tokio::test]
    async fn presence_touches_only_stale_blobs_and_links_only_across_on_sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlMetadataStore::open_sqlite(&dir.path().join("m.db"))
            .await
            .unwrap()
            .with_touch_slack(std::time::Duration::from_secs(60));
        presence_touches_only_stale_blobs_and_links_only_across(&store).await;
    }

    #[tokio::test]
    async fn presence_touches_only_stale_blobs_and_links_only_across_on_postgres() {
        let Some(url) = super::super::test_postgres_database().await else {
            return;
        };
        let store = SqlMetadataStore::open_postgres(&url)
            .await
            .unwrap()
            .with_touch_slack(std::time::Duration::from_secs(60));
        presence_touches_only_stale_blobs_and_links_only_across(&store).await;
    }
}
