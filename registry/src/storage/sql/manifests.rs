//! Manifest commits, reads, soft deletion, restore and purge, and the listings built on them.

use async_trait::async_trait;
use sqlx::Row;
use vial_core::manifest::Referenced;
use vial_core::{Digest, RepoName};

use super::*;

/// The advisory lock (PostgreSQL) under which a removal of blob references checks which blobs it
/// left unreferenced (migration 10 has the same number): "vialrefs" in ASCII.
const REFERENCE_LOCK: i64 = 0x7669_616c_7265_6673;

#[async_trait]
impl ManifestMeta for SqlMetadataStore {
    async fn deleted_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<(i64, Option<String>)>, StorageError> {
        let row = sqlx::query(
            "SELECT m.deleted_at, m.deleted_by FROM manifests m
               JOIN repositories r ON r.id = m.repository_id
              WHERE r.name = $1 AND m.digest = $2 AND m.deleted_at IS NOT NULL",
        )
        .bind(repo.as_str())
        .bind(digest.as_str())
        .fetch_optional(&self.reader)
        .await?;
        row.map(|row| Ok((row.try_get("deleted_at")?, row.try_get("deleted_by")?)))
            .transpose()
    }

    async fn commit_manifest(
        &self,
        repo: &RepoName,
        manifest: &ManifestRecord,
        tags: &[Tag],
        precondition: &TagPrecondition,
    ) -> Result<(), CommitManifestError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        let repo_id = repo_id_for_write(&mut tx, repo).await?;

        check_references(
            &mut tx,
            Held::Blob,
            repo_id,
            &manifest.blobs,
            false,
            self.dialect,
        )
        .await?;
        check_references(
            &mut tx,
            Held::Manifest,
            repo_id,
            &manifest.children,
            manifest.sparse,
            self.dialect,
        )
        .await?;

        let annotations = manifest
            .annotations
            .as_ref()
            .map(|a| serde_json::to_string(a).unwrap_or_default());
        let inserted = sqlx::query(
            "INSERT INTO manifests (repository_id, digest, media_type, artifact_type, subject, annotations, size, content, created_at)
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
             ON CONFLICT (repository_id, digest) DO UPDATE
                SET deleted_at = NULL, deleted_tags = NULL, deleted_by = NULL
              WHERE manifests.deleted_at IS NOT NULL",
        )
        .bind(repo_id)
        .bind(manifest.digest.as_str())
        .bind(&manifest.media_type)
        .bind(&manifest.artifact_type)
        .bind(manifest.subject.as_ref().map(Digest::as_str))
        .bind(annotations)
        .bind(manifest.content.len() as i64)
        .bind(&manifest.content)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        // A new version is a push; a tag pointed at a version the repository already held (`vial
        // tag set`, `crane tag`, `oras tag`) is a tag move.
        let reason = if inserted.rows_affected() > 0 {
            "push"
        } else {
            "tag"
        };
        if inserted.rows_affected() > 0 {
            // One statement per kind of reference, however many the manifest lists. Blobs by
            // their ids (every one has a row: checked above, and held until this commits).
            if !manifest.blobs.is_empty() {
                sqlx::query(&format!(
                    "INSERT INTO manifest_blobs (manifest_id, blob_id)
                     SELECT m.id, b.id FROM manifests m, blobs b
                      WHERE m.repository_id = $1 AND m.digest = $3
                        AND b.digest IN (SELECT value FROM {})
                     ON CONFLICT DO NOTHING",
                    self.dialect.text_set("$2")
                ))
                .bind(repo_id)
                .bind(digest_set(manifest.blobs.iter().map(|r| &r.digest)))
                .bind(manifest.digest.as_str())
                .execute(&mut *tx)
                .await?;
            }
            if !manifest.children.is_empty() {
                sqlx::query(&format!(
                    "INSERT INTO manifest_references (repository_id, manifest_digest, target_digest, is_manifest)
                     SELECT $1, $3, value, $4 FROM {} WHERE true ON CONFLICT DO NOTHING",
                    self.dialect.text_set("$2")
                ))
                .bind(repo_id)
                .bind(digest_set(manifest.children.iter().map(|r| &r.digest)))
                .bind(manifest.digest.as_str())
                .bind(true)
                .execute(&mut *tx)
                .await?;
            }
        }
        for tag in tags {
            let before: Option<String> = sqlx::query_scalar(
                "SELECT manifest_digest FROM tags WHERE repository_id = $1 AND name = $2",
            )
            .bind(repo_id)
            .bind(tag.as_str())
            .fetch_optional(&mut *tx)
            .await?;
            // Each move is one conditional statement, so concurrent moves on any number of
            // replicas cannot both pass the same precondition.
            let moved = match precondition {
                TagPrecondition::None => sqlx::query(
                    "INSERT INTO tags (repository_id, name, manifest_digest, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (repository_id, name) DO UPDATE SET manifest_digest = excluded.manifest_digest, updated_at = excluded.updated_at, expires_at = excluded.expires_at",
                )
                .bind(repo_id)
                .bind(tag.as_str())
                .bind(manifest.digest.as_str())
                .bind(now)
                .bind(manifest.tags_expire_at)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
                TagPrecondition::Absent => sqlx::query(
                    "INSERT INTO tags (repository_id, name, manifest_digest, updated_at, expires_at) VALUES ($1, $2, $3, $4, $5)
                     ON CONFLICT (repository_id, name) DO NOTHING",
                )
                .bind(repo_id)
                .bind(tag.as_str())
                .bind(manifest.digest.as_str())
                .bind(now)
                .bind(manifest.tags_expire_at)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
                TagPrecondition::At(expected) => sqlx::query(
                    "UPDATE tags SET manifest_digest = $1, updated_at = $2, expires_at = $6
                      WHERE repository_id = $3 AND name = $4 AND manifest_digest = $5",
                )
                .bind(manifest.digest.as_str())
                .bind(now)
                .bind(repo_id)
                .bind(tag.as_str())
                .bind(expected.as_str())
                .bind(manifest.tags_expire_at)
                .execute(&mut *tx)
                .await?
                .rows_affected(),
            };
            if moved > 0 && before.as_deref() != Some(manifest.digest.as_str()) {
                record_tag_event(
                    &mut tx,
                    self.dialect,
                    repo_id,
                    tag.as_str(),
                    before.as_deref(),
                    Some(manifest.digest.as_str()),
                    manifest.pushed_by.as_deref(),
                    reason,
                )
                .await?;
            }
            if moved == 0 {
                let current: Option<String> = sqlx::query_scalar(
                    "SELECT manifest_digest FROM tags WHERE repository_id = $1 AND name = $2",
                )
                .bind(repo_id)
                .bind(tag.as_str())
                .fetch_optional(&mut *tx)
                .await?;
                return Err(CommitManifestError::TagMoved {
                    tag: tag.to_string(),
                    current: current.as_deref().map(parse_digest).transpose()?,
                    expected: precondition.clone(),
                });
            }
        }
        tx.commit().await?;
        self.announce(repo, tags.iter().map(Tag::as_str));
        Ok(())
    }

    async fn get_manifest(
        &self,
        repo: &RepoName,
        target: &Target,
    ) -> Result<Option<StoredManifest>, StorageError> {
        let row = match target {
            Target::Digest(d) => {
                sqlx::query(
                    "SELECT m.digest, m.media_type, m.content FROM manifests m
                       JOIN repositories r ON r.id = m.repository_id
                      WHERE r.name = $1 AND m.digest = $2 AND m.deleted_at IS NULL",
                )
                .bind(repo.as_str())
                .bind(d.as_str())
                .fetch_optional(&self.reader)
                .await?
            }
            Target::Tag(t) => {
                sqlx::query(
                    "SELECT m.digest, m.media_type, m.content FROM tags t
                       JOIN repositories r ON r.id = t.repository_id
                       JOIN manifests m ON m.repository_id = t.repository_id AND m.digest = t.manifest_digest
                      WHERE r.name = $1 AND t.name = $2 AND m.deleted_at IS NULL
                        AND (t.expires_at IS NULL OR t.expires_at > $3)",
                )
                .bind(repo.as_str())
                .bind(t.as_str())
                .bind(now_millis())
                .fetch_optional(&self.reader)
                .await?
            }
        };
        let Some(row) = row else { return Ok(None) };
        let digest: String = row.try_get("digest")?;
        Ok(Some(StoredManifest {
            digest: parse_digest(&digest)?,
            media_type: row.try_get("media_type")?,
            content: row.try_get("content")?,
        }))
    }

    async fn delete_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
        by: Option<&str>,
    ) -> Result<bool, StorageError> {
        let mut tx = self.writer.begin().await?;
        let Some(repo_id) = repo_id_in(&mut tx, repo).await? else {
            return Ok(false);
        };
        let mut tags: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM tags WHERE repository_id = $1 AND manifest_digest = $2",
        )
        .bind(repo_id)
        .bind(digest.as_str())
        .fetch_all(&mut *tx)
        .await?;
        tags.sort();
        let hidden = sqlx::query(
            "UPDATE manifests SET deleted_at = $3, deleted_tags = $4, deleted_by = $5
              WHERE repository_id = $1 AND digest = $2 AND deleted_at IS NULL",
        )
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(now_millis())
        .bind(serde_json::to_string(&tags).unwrap_or_default())
        .bind(by)
        .execute(&mut *tx)
        .await?;
        if hidden.rows_affected() == 0 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM tags WHERE repository_id = $1 AND manifest_digest = $2")
            .bind(repo_id)
            .bind(digest.as_str())
            .execute(&mut *tx)
            .await?;
        for tag in &tags {
            record_tag_event(
                &mut tx,
                self.dialect,
                repo_id,
                tag,
                Some(digest.as_str()),
                None,
                by,
                "version-deleted",
            )
            .await?;
        }
        tx.commit().await?;
        self.announce(repo, tags.iter().map(String::as_str));
        Ok(true)
    }

    async fn restore_manifest(
        &self,
        repo: &RepoName,
        digest: &Digest,
        deleted_since: i64,
        with_tags: bool,
    ) -> Result<Option<Restored>, StorageError> {
        let mut tx = self.writer.begin().await?;
        let Some(repo_id) = repo_id_in(&mut tx, repo).await? else {
            return Ok(None);
        };
        let condition =
            "repository_id = $1 AND digest = $2 AND deleted_at IS NOT NULL AND deleted_at >= $3";
        let remembered: Option<Option<String>> = sqlx::query_scalar(&format!(
            "SELECT deleted_tags FROM manifests WHERE {condition}"
        ))
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(deleted_since)
        .fetch_optional(&mut *tx)
        .await?;
        let Some(remembered) = remembered else {
            return Ok(None);
        };
        // The condition again: of two concurrent restores, PostgreSQL lets only one through.
        let restored_row = sqlx::query(&format!(
            "UPDATE manifests SET deleted_at = NULL, deleted_tags = NULL, deleted_by = NULL WHERE {condition}"
        ))
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(deleted_since)
        .execute(&mut *tx)
        .await?;
        if restored_row.rows_affected() == 0 {
            return Ok(None);
        }
        let mut restored = Restored::default();
        if with_tags {
            let tags: Vec<String> = remembered
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            for tag in tags {
                let taken = sqlx::query(
                    "INSERT INTO tags (repository_id, name, manifest_digest, updated_at) VALUES ($1, $2, $3, $4)
                     ON CONFLICT (repository_id, name) DO NOTHING",
                )
                .bind(repo_id)
                .bind(&tag)
                .bind(digest.as_str())
                .bind(now_millis())
                .execute(&mut *tx)
                .await?;
                if taken.rows_affected() > 0 {
                    record_tag_event(
                        &mut tx,
                        self.dialect,
                        repo_id,
                        &tag,
                        None,
                        Some(digest.as_str()),
                        None,
                        "restore",
                    )
                    .await?;
                    restored.tags.push(tag);
                } else {
                    restored.tags_moved_on.push(tag);
                }
            }
        }
        tx.commit().await?;
        self.announce(repo, restored.tags.iter().map(String::as_str));
        Ok(Some(restored))
    }

    async fn deleted_before(
        &self,
        since: i64,
        before: i64,
        limit: u32,
    ) -> Result<Vec<(RepoName, Digest, i64)>, StorageError> {
        let rows = sqlx::query(
            "SELECT r.name, m.digest, m.deleted_at FROM manifests m
               JOIN repositories r ON r.id = m.repository_id
              WHERE m.deleted_at IS NOT NULL AND m.deleted_at >= $3 AND m.deleted_at < $1
              ORDER BY m.deleted_at LIMIT $2",
        )
        .bind(before)
        .bind(i64::from(limit))
        .bind(since)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                let name: String = row.try_get("name")?;
                let digest: String = row.try_get("digest")?;
                Ok((
                    parse_repo(&name)?,
                    parse_digest(&digest)?,
                    row.try_get("deleted_at")?,
                ))
            })
            .collect()
    }

    async fn purge_manifests(
        &self,
        versions: &[(RepoName, Digest)],
    ) -> Result<Vec<(RepoName, Digest)>, StorageError> {
        if versions.is_empty() {
            return Ok(Vec::new());
        }
        let d = self.dialect;
        let lock = if d == Dialect::Postgres {
            " FOR UPDATE OF m"
        } else {
            ""
        };
        let named: Vec<(&str, &str)> = versions
            .iter()
            .map(|(r, m)| (r.as_str(), m.as_str()))
            .collect();
        let mut tx = self.writer.begin().await?;
        if d == Dialect::Postgres {
            // The lock under which the trigger that queues collection candidates checks which
            // blobs lost their last reference (migration 10), taken before any row lock so that
            // two purges wait for each other here rather than deadlock in the trigger.
            sqlx::query("SELECT pg_advisory_xact_lock($1)")
                .bind(REFERENCE_LOCK)
                .execute(&mut *tx)
                .await?;
        }
        // The ones still deleted, held (a restore racing this waits, then finds them gone).
        let rows = sqlx::query(&format!(
            "SELECT m.repository_id, m.digest, r.name FROM manifests m
               JOIN repositories r ON r.id = m.repository_id
              WHERE (r.name, m.digest) IN {} AND m.deleted_at IS NOT NULL
              ORDER BY m.repository_id, m.digest{lock}",
            d.json_pairs("$1", "TEXT", "TEXT"),
        ))
        .bind(serde_json::to_string(&named).unwrap_or_default())
        .fetch_all(&mut *tx)
        .await?;
        let mut purged = Vec::new();
        let mut doomed: Vec<(i64, String)> = Vec::new();
        for row in &rows {
            let name: String = row.try_get("name")?;
            let digest: String = row.try_get("digest")?;
            purged.push((parse_repo(&name)?, parse_digest(&digest)?));
            doomed.push((row.try_get("repository_id")?, digest));
        }
        // Round by round: the doomed manifests go (tags and references through ON DELETE
        // CASCADE), then those of their children that no manifest lists and no tag names any
        // more, then theirs. A round is a few statements, however many manifests it removes.
        let mut first = true;
        while !doomed.is_empty() {
            let set = serde_json::to_string(&doomed).unwrap_or_default();
            let pairs = d.json_pairs("$1", "BIGINT", "TEXT");
            if !first && d == Dialect::Postgres {
                // Holds off concurrent pushes that rely on these children (they take FOR SHARE).
                sqlx::query(&format!(
                    "SELECT m.digest FROM manifests m WHERE (m.repository_id, m.digest) IN {pairs}
                      ORDER BY m.repository_id, m.digest{lock}"
                ))
                .bind(&set)
                .execute(&mut *tx)
                .await?;
            }
            let children = sqlx::query(&format!(
                "SELECT repository_id, manifest_digest, target_digest FROM manifest_references
                  WHERE (repository_id, manifest_digest) IN {pairs} AND is_manifest = $2"
            ))
            .bind(&set)
            .bind(true)
            .fetch_all(&mut *tx)
            .await?;
            let condition = if first {
                "deleted_at IS NOT NULL".to_owned()
            } else {
                "NOT EXISTS (SELECT 1 FROM manifest_references r
                              WHERE r.repository_id = manifests.repository_id
                                AND r.target_digest = manifests.digest AND r.is_manifest = $2)
                 AND NOT EXISTS (SELECT 1 FROM tags t
                                  WHERE t.repository_id = manifests.repository_id
                                    AND t.manifest_digest = manifests.digest)"
                    .to_owned()
            };
            let gone = sqlx::query(&format!(
                "DELETE FROM manifests WHERE (repository_id, digest) IN {pairs} AND {condition}
                 RETURNING repository_id, digest"
            ))
            .bind(&set)
            .bind(true)
            .fetch_all(&mut *tx)
            .await?;
            let mut removed = std::collections::HashSet::new();
            for row in &gone {
                removed.insert((
                    row.try_get::<i64, _>("repository_id")?,
                    row.try_get::<String, _>("digest")?,
                ));
            }
            let mut next = std::collections::BTreeSet::new();
            for row in &children {
                let repo: i64 = row.try_get("repository_id")?;
                let parent: String = row.try_get("manifest_digest")?;
                if removed.contains(&(repo, parent)) {
                    next.insert((repo, row.try_get::<String, _>("target_digest")?));
                }
            }
            doomed = next.into_iter().collect();
            first = false;
        }
        tx.commit().await?;
        Ok(purged)
    }

    async fn referrers(
        &self,
        repo: &RepoName,
        subject: &Digest,
        artifact_type: Option<&str>,
    ) -> Result<Vec<Descriptor>, StorageError> {
        let rows = sqlx::query(
            "SELECT m.digest, m.media_type, m.artifact_type, m.size, m.annotations FROM manifests m
               JOIN repositories r ON r.id = m.repository_id
              WHERE r.name = $1 AND m.subject = $2 AND m.deleted_at IS NULL
                AND (CAST($3 AS TEXT) IS NULL OR m.artifact_type = $4)
              ORDER BY m.created_at, m.digest",
        )
        .bind(repo.as_str())
        .bind(subject.as_str())
        .bind(artifact_type)
        .bind(artifact_type)
        .fetch_all(&self.reader)
        .await?;
        rows.iter()
            .map(|row| {
                let digest: String = row.try_get("digest")?;
                let annotations: Option<String> = row.try_get("annotations")?;
                let size: i64 = row.try_get("size")?;
                Ok(Descriptor {
                    media_type: row.try_get("media_type")?,
                    digest: parse_digest(&digest)?,
                    size: size as u64,
                    urls: None,
                    annotations: annotations.and_then(|a| serde_json::from_str(&a).ok()),
                    artifact_type: row.try_get("artifact_type")?,
                    data: None,
                    platform: None,
                })
            })
            .collect()
    }

    async fn list_versions(
        &self,
        repo: &RepoName,
        artifact_type: &str,
        deleted: bool,
        window: Window,
    ) -> Result<Option<Vec<VersionRow>>, StorageError> {
        let Some(repo_id) = repo_id(&self.reader, repo).await? else {
            return Ok(None);
        };
        // The window is cut first (an index walk: manifests_live_versions), so the tags are looked
        // up for the rows shown only, however many versions the repository holds.
        let sql = if deleted {
            "SELECT m.digest, m.created_at, m.annotations, CAST(NULL AS TEXT) AS tags, m.deleted_tags,
                    m.deleted_at, m.deleted_by
               FROM manifests m
              WHERE m.repository_id = $1 AND m.artifact_type = $2 AND m.deleted_at IS NOT NULL
              ORDER BY m.deleted_at DESC, m.digest
              LIMIT $3 OFFSET $4"
                .to_owned()
        } else {
            format!(
                "SELECT m.digest, m.created_at, m.annotations,
                    (SELECT {} FROM tags t
                      WHERE t.repository_id = m.repository_id AND t.manifest_digest = m.digest
                        AND (t.expires_at IS NULL OR t.expires_at > $5)) AS tags,
                    CAST(NULL AS TEXT) AS deleted_tags, CAST(NULL AS BIGINT) AS deleted_at,
                    CAST(NULL AS TEXT) AS deleted_by
               FROM (SELECT repository_id, digest, created_at, annotations FROM manifests
                      WHERE repository_id = $1 AND artifact_type = $2 AND deleted_at IS NULL
                      ORDER BY created_at DESC, digest
                      LIMIT $3 OFFSET $4) m
              ORDER BY m.created_at DESC, m.digest",
                self.dialect.string_agg()
            )
        };
        let mut query = sqlx::query(&sql)
            .bind(repo_id)
            .bind(artifact_type)
            .bind(i64::from(window.limit))
            .bind(i64::try_from(window.offset).unwrap_or(i64::MAX));
        if !deleted {
            query = query.bind(now_millis());
        }
        let rows = query.fetch_all(&self.reader).await?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let digest: String = row.try_get("digest")?;
            let annotations: Option<String> = row.try_get("annotations")?;
            let tags: Option<String> = row.try_get("tags")?;
            let deleted_tags: Option<String> = row.try_get("deleted_tags")?;
            let mut tags: Vec<String> = match deleted_tags {
                Some(json) => serde_json::from_str(&json).unwrap_or_default(),
                None => tags
                    .map(|t| t.split(' ').map(str::to_owned).collect())
                    .unwrap_or_default(),
            };
            tags.sort();
            out.push(VersionRow {
                digest: parse_digest(&digest)?,
                created_at: row.try_get("created_at")?,
                annotations: annotations.and_then(|a| serde_json::from_str(&a).ok()),
                tags,
                deleted_at: row.try_get("deleted_at")?,
                deleted_by: row.try_get("deleted_by")?,
            });
        }
        Ok(Some(out))
    }

    async fn version_totals(
        &self,
        repo: Option<&RepoName>,
        artifact_type: &str,
    ) -> Result<VersionTotals, StorageError> {
        let repo_id = match repo {
            Some(repo) => match repo_id(&self.reader, repo).await? {
                Some(id) => Some(id),
                None => return Ok(VersionTotals::default()),
            },
            None => None,
        };
        let sql = format!(
            "SELECT COUNT(*) AS n, CAST(COALESCE(SUM({}), 0) AS BIGINT) AS bytes
               FROM manifests m
              WHERE m.artifact_type = $1 AND m.deleted_at IS NULL {}",
            self.dialect
                .annotation_bigint("m.annotations", vial_core::volume::ANNOTATION_BYTES),
            if repo_id.is_some() {
                "AND m.repository_id = $2"
            } else {
                ""
            }
        );
        let mut query = sqlx::query(&sql).bind(artifact_type);
        if let Some(id) = repo_id {
            query = query.bind(id);
        }
        let row = query.fetch_one(&self.reader).await?;
        let (n, bytes): (i64, i64) = (row.try_get("n")?, row.try_get("bytes")?);
        Ok(VersionTotals {
            versions: n.max(0) as u64,
            bytes: bytes.max(0) as u64,
        })
    }

    async fn version_before(
        &self,
        repo: &RepoName,
        artifact_type: &str,
        digest: &Digest,
    ) -> Result<Option<(i64, Option<Digest>)>, StorageError> {
        let Some(repo_id) = repo_id(&self.reader, repo).await? else {
            return Ok(None);
        };
        let created: Option<i64> = sqlx::query_scalar(
            "SELECT created_at FROM manifests
              WHERE repository_id = $1 AND digest = $2 AND artifact_type = $3 AND deleted_at IS NULL",
        )
        .bind(repo_id)
        .bind(digest.as_str())
        .bind(artifact_type)
        .fetch_optional(&self.reader)
        .await?;
        let Some(created) = created else {
            return Ok(None);
        };
        let before: Option<String> = sqlx::query_scalar(
            "SELECT digest FROM manifests
              WHERE repository_id = $1 AND artifact_type = $2 AND deleted_at IS NULL
                AND (created_at < $3 OR (created_at = $3 AND digest > $4))
              ORDER BY created_at DESC, digest
              LIMIT 1",
        )
        .bind(repo_id)
        .bind(artifact_type)
        .bind(created)
        .bind(digest.as_str())
        .fetch_optional(&self.reader)
        .await?;
        Ok(Some((
            created,
            before.as_deref().map(parse_digest).transpose()?,
        )))
    }

    async fn list_repositories(
        &self,
        last: Option<&str>,
        limit: u32,
    ) -> Result<Page, StorageError> {
        let mut items: Vec<String> = sqlx::query_scalar(
            "SELECT name FROM repositories WHERE name > $1 ORDER BY name LIMIT $2",
        )
        .bind(last.unwrap_or(""))
        .bind(i64::from(limit) + 1)
        .fetch_all(&self.reader)
        .await?;
        let more = items.len() > limit as usize;
        items.truncate(limit as usize);
        Ok(Page { items, more })
    }
}

/// What a manifest may reference.
#[derive(Clone, Copy)]
enum Held {
    Blob,
    Manifest,
}

/// Checks that the repository holds every reference (as a blob or as a live manifest) at the
/// size the manifest declares for it, in one statement. With `sparse`, references it does not
/// hold are allowed (a sparse index); one it holds at another size never is.
async fn check_references(
    tx: &mut Transaction<'_, Any>,
    held: Held,
    repo_id: i64,
    references: &[Referenced],
    sparse: bool,
    dialect: Dialect,
) -> Result<(), CommitManifestError> {
    if references.is_empty() {
        return Ok(());
    }
    let set = dialect.text_set("$2");
    let query = match (held, dialect) {
        // The blob rows stay held until the manifest commits, so a collection cannot remove a
        // blob between this check and the commit (docs/gc.md). SQLite's single writer gives the
        // same guarantee.
        (Held::Blob, Dialect::Postgres) => format!(
            "SELECT b.digest, b.size FROM repository_blobs rb JOIN blobs b ON b.id = rb.blob_id
              WHERE rb.repository_id = $1 AND b.digest IN (SELECT value FROM {set})
              ORDER BY b.digest FOR SHARE OF b"
        ),
        (Held::Blob, Dialect::Sqlite) => dialect.held_in("$2", "b.size", "$1"),
        (Held::Manifest, _) => format!(
            "SELECT digest, size FROM manifests
              WHERE repository_id = $1 AND deleted_at IS NULL AND digest IN (SELECT value FROM {set}){}",
            if dialect == Dialect::Postgres { " FOR SHARE" } else { "" }
        ),
    };
    let rows = sqlx::query(&query)
        .bind(repo_id)
        .bind(digest_set(references.iter().map(|r| &r.digest)))
        .fetch_all(&mut **tx)
        .await?;
    let mut held_sizes = std::collections::HashMap::with_capacity(rows.len());
    for row in &rows {
        let digest: String = row.try_get(0)?;
        let size: i64 = row.try_get(1)?;
        held_sizes.insert(digest, size as u64);
    }
    let mut missing = Vec::new();
    for r in references {
        match held_sizes.get(r.digest.as_str()) {
            Some(&actual) if actual != r.size => {
                return Err(CommitManifestError::SizeMismatch {
                    digest: r.digest.clone(),
                    declared: r.size,
                    actual,
                })
            }
            Some(_) => {}
            None => missing.push(r.digest.clone()),
        }
    }
    missing.sort();
    missing.dedup();
    match held {
        _ if missing.is_empty() || sparse => Ok(()),
        Held::Blob => Err(CommitManifestError::MissingBlobs(missing)),
        Held::Manifest => Err(CommitManifestError::MissingManifests(missing)),
    }
}
