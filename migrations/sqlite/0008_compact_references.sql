-- Compact blob references (docs/gc.md, "Cost"). A version lists every chunk it is made of, so
-- manifests' blob references outnumber blobs many times over: stored as two text digests per row,
-- indexed twice, they took about 8 KB per blob on PostgreSQL. They now go in `manifest_blobs` as
-- two integer ids (a new `id` on `blobs` and `manifests`); `manifest_references` keeps only the
-- child manifests of an index, which are few.
--
-- SQLite cannot number a column that is not the primary key, so a trigger gives each new row the
-- next id. (The rowid itself would not do: VACUUM may renumber it.)
ALTER TABLE blobs ADD COLUMN id INTEGER;
UPDATE blobs SET id = rowid;
CREATE UNIQUE INDEX blobs_by_id ON blobs (id);
CREATE TRIGGER blobs_numbered AFTER INSERT ON blobs WHEN new.id IS NULL BEGIN
    UPDATE blobs SET id = (SELECT COALESCE(MAX(id), 0) + 1 FROM blobs) WHERE rowid = new.rowid;
END;
ALTER TABLE manifests ADD COLUMN id INTEGER;
UPDATE manifests SET id = rowid;
CREATE UNIQUE INDEX manifests_by_id ON manifests (id);
CREATE TRIGGER manifests_numbered AFTER INSERT ON manifests WHEN new.id IS NULL BEGIN
    UPDATE manifests SET id = (SELECT COALESCE(MAX(id), 0) + 1 FROM manifests) WHERE rowid = new.rowid;
END;

-- A blob a manifest lists. The foreign key to `blobs` means a referenced blob's row cannot go:
-- the database itself keeps the first half of docs/gc.md's invariant.
CREATE TABLE manifest_blobs (
    manifest_id  INTEGER NOT NULL REFERENCES manifests (id) ON DELETE CASCADE,
    blob_id      INTEGER NOT NULL REFERENCES blobs (id),
    PRIMARY KEY (manifest_id, blob_id)
) WITHOUT ROWID;
INSERT INTO manifest_blobs (manifest_id, blob_id)
    SELECT m.id, b.id FROM manifest_references r
      JOIN manifests m ON m.repository_id = r.repository_id AND m.digest = r.manifest_digest
      JOIN blobs b ON b.digest = r.target_digest
     WHERE NOT r.is_manifest
    ON CONFLICT DO NOTHING;
CREATE INDEX manifest_blobs_by_blob ON manifest_blobs (blob_id);

DROP TRIGGER gc_lost_reference;
DELETE FROM manifest_references WHERE NOT is_manifest;

-- A manifest's blob references go when it is purged (ON DELETE CASCADE fires this too); the
-- blob's row is still there (the foreign key above), so its digest can be looked up.
CREATE TRIGGER gc_lost_reference AFTER DELETE ON manifest_blobs BEGIN
    INSERT OR IGNORE INTO gc_candidates (digest) SELECT digest FROM blobs WHERE id = old.blob_id;
END;
