-- Collection candidates by blob id, with a generation (docs/gc.md, "Cost"); the PostgreSQL
-- migration of the same number says why. `queued` counts how often a candidate was queued again
-- while it waited: a pass drops a candidate it found still held only if `queued` has not moved.
-- The triggers that name the old table go first: SQLite checks them when a table is renamed.
DROP TRIGGER gc_new_blob;
DROP TRIGGER blobs_numbered;
DROP TRIGGER gc_new_pack;
DROP TRIGGER gc_lost_reference;
DROP TRIGGER gc_lost_range;
DROP TRIGGER gc_moved_range;
CREATE TABLE gc_blob_candidates (
    blob_id  INTEGER PRIMARY KEY,
    queued   INTEGER NOT NULL DEFAULT 0
);
INSERT OR IGNORE INTO gc_blob_candidates (blob_id)
    SELECT b.id FROM gc_candidates c JOIN blobs b ON b.digest = c.digest;
DROP TABLE gc_candidates;
ALTER TABLE gc_blob_candidates RENAME TO gc_candidates;
ALTER TABLE gc_pack_candidates ADD COLUMN queued INTEGER NOT NULL DEFAULT 0;

-- A new blob's id is given by the trigger that numbers it, so it is queued there. (SQLite's
-- upsert needs a WHERE on its SELECT.)
CREATE TRIGGER blobs_numbered AFTER INSERT ON blobs WHEN new.id IS NULL BEGIN
    UPDATE blobs SET id = (SELECT COALESCE(MAX(id), 0) + 1 FROM blobs) WHERE rowid = new.rowid;
    INSERT INTO gc_candidates (blob_id) SELECT id FROM blobs WHERE rowid = new.rowid
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
END;
CREATE TRIGGER gc_new_blob AFTER INSERT ON blobs WHEN new.id IS NOT NULL BEGIN
    INSERT INTO gc_candidates (blob_id) VALUES (new.id)
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
END;
CREATE TRIGGER gc_new_pack AFTER INSERT ON packs BEGIN
    INSERT INTO gc_pack_candidates (pack_id) VALUES (new.id)
        ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1;
END;
CREATE TRIGGER gc_lost_reference AFTER DELETE ON manifest_blobs BEGIN
    INSERT INTO gc_candidates (blob_id) VALUES (old.blob_id)
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
END;
CREATE TRIGGER gc_lost_range AFTER DELETE ON blobs BEGIN
    INSERT INTO gc_candidates (blob_id) SELECT id FROM blobs WHERE digest = old.source_digest
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    INSERT INTO gc_pack_candidates (pack_id) SELECT old.pack_id WHERE old.pack_id IS NOT NULL
        ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1;
END;
CREATE TRIGGER gc_moved_range AFTER UPDATE OF source_digest, pack_id ON blobs BEGIN
    INSERT INTO gc_candidates (blob_id) SELECT id FROM blobs
     WHERE old.source_digest IS NOT NULL AND old.source_digest IS NOT new.source_digest
       AND digest = old.source_digest
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    INSERT INTO gc_pack_candidates (pack_id) SELECT old.pack_id
     WHERE old.pack_id IS NOT NULL AND old.pack_id IS NOT new.pack_id
        ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1;
END;
