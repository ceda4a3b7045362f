-- Metadata at fleet scale (docs/gc.md, "Cost").
--
-- Collection deletes a blob's repository links by digest: without this index each deletion (and
-- the foreign key check of deleting the blob row) scans the whole table, which made a pass
-- quadratic in the number of blobs.
CREATE INDEX IF NOT EXISTS repository_blobs_by_digest ON repository_blobs (digest);

-- The blobs and packs a collection pass looks at: every new one, and every one that may just have
-- lost its last reference. A pass reads these instead of every blob, so it costs in proportion to
-- what changed since the last pass, not to the size of the registry. Triggers keep the tables
-- complete whatever statement removes a reference, so no code path can forget one.
CREATE TABLE gc_candidates (digest TEXT PRIMARY KEY);
CREATE TABLE gc_pack_candidates (pack_id TEXT PRIMARY KEY);
INSERT INTO gc_candidates (digest) SELECT digest FROM blobs;
INSERT INTO gc_pack_candidates (pack_id) SELECT id FROM packs;

CREATE TRIGGER gc_new_blob AFTER INSERT ON blobs BEGIN
    INSERT OR IGNORE INTO gc_candidates (digest) VALUES (new.digest);
END;
CREATE TRIGGER gc_new_pack AFTER INSERT ON packs BEGIN
    INSERT OR IGNORE INTO gc_pack_candidates (pack_id) VALUES (new.id);
END;
-- A manifest's blob references go when it is purged (ON DELETE CASCADE fires this too).
CREATE TRIGGER gc_lost_reference AFTER DELETE ON manifest_references WHEN NOT old.is_manifest BEGIN
    INSERT OR IGNORE INTO gc_candidates (digest) VALUES (old.target_digest);
END;
-- A range chunk that goes, or moves to bytes of its own, frees its source blob or pack.
CREATE TRIGGER gc_lost_range AFTER DELETE ON blobs BEGIN
    INSERT OR IGNORE INTO gc_candidates (digest) SELECT old.source_digest WHERE old.source_digest IS NOT NULL;
    INSERT OR IGNORE INTO gc_pack_candidates (pack_id) SELECT old.pack_id WHERE old.pack_id IS NOT NULL;
END;
CREATE TRIGGER gc_moved_range AFTER UPDATE OF source_digest, pack_id ON blobs BEGIN
    INSERT OR IGNORE INTO gc_candidates (digest) SELECT old.source_digest
     WHERE old.source_digest IS NOT NULL AND old.source_digest IS NOT new.source_digest;
    INSERT OR IGNORE INTO gc_pack_candidates (pack_id) SELECT old.pack_id
     WHERE old.pack_id IS NOT NULL AND old.pack_id IS NOT new.pack_id;
END;
