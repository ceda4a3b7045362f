-- A purge queues only the blobs it leaves unreferenced (docs/gc.md, "Cost"); the PostgreSQL
-- migration of the same number says why. The trigger fires for each removed reference, after the
-- row is gone, so the last reference to a blob to go queues it. SQLite runs one write
-- transaction at a time, so no other removal can interleave with the check.
DROP TRIGGER gc_lost_reference;
CREATE TRIGGER gc_lost_reference AFTER DELETE ON manifest_blobs
    WHEN NOT EXISTS (SELECT 1 FROM manifest_blobs WHERE blob_id = old.blob_id) BEGIN
    INSERT INTO gc_candidates (blob_id) VALUES (old.blob_id)
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
END;
