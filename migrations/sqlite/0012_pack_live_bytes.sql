-- Compaction (docs/gc.md, "Compaction"): a pack keeps the bytes of its dead chunks until its live
-- ones are rewritten into a new pack. `live_bytes` is the bytes of the chunks that live in a pack,
-- kept by the triggers below whatever statement adds, removes or moves a chunk, so the packs worth
-- compacting, the dry run and /metrics read one row per pack rather than every chunk.
-- `moved_at` is when compaction last moved chunks out of the pack: a pack emptied that way is
-- removed only after the grace period counted from then, so that a read that found a chunk there
-- just before the move still finds the bytes.
ALTER TABLE packs ADD COLUMN live_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE packs ADD COLUMN moved_at INTEGER;
UPDATE packs SET live_bytes = COALESCE((SELECT SUM(b.size) FROM blobs b WHERE b.pack_id = packs.id), 0);

CREATE TRIGGER pack_live_new AFTER INSERT ON blobs WHEN new.pack_id IS NOT NULL BEGIN
    UPDATE packs SET live_bytes = live_bytes + new.size WHERE id = new.pack_id;
END;
CREATE TRIGGER pack_live_gone AFTER DELETE ON blobs WHEN old.pack_id IS NOT NULL BEGIN
    UPDATE packs SET live_bytes = live_bytes - old.size WHERE id = old.pack_id;
END;
CREATE TRIGGER pack_live_moved AFTER UPDATE OF pack_id ON blobs
    WHEN old.pack_id IS NOT new.pack_id BEGIN
    UPDATE packs SET live_bytes = live_bytes - old.size WHERE id = old.pack_id;
    UPDATE packs SET live_bytes = live_bytes + new.size WHERE id = new.pack_id;
END;
