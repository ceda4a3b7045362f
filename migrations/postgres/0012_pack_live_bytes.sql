-- Compaction (docs/gc.md, "Compaction"): a pack keeps the bytes of its dead chunks until its live
-- ones are rewritten into a new pack. `live_bytes` is the bytes of the chunks that live in a pack,
-- kept by the triggers below whatever statement adds, removes or moves a chunk, so the packs worth
-- compacting, the dry run and /metrics read one row per pack rather than every chunk.
-- `moved_at` is when compaction last moved chunks out of the pack: a pack emptied that way is
-- removed only after the grace period counted from then, so that a read that found a chunk there
-- just before the move still finds the bytes.
--
-- Lock order: every statement that changes chunk rows takes them first (in digest order), then
-- the candidate rows of their packs (the gc_* triggers, named to fire first), then the packs'
-- rows, in id order. Compaction takes the same three in the same order (storage/sql/compact.rs).
ALTER TABLE packs ADD COLUMN live_bytes BIGINT NOT NULL DEFAULT 0;
ALTER TABLE packs ADD COLUMN moved_at BIGINT;
UPDATE packs p SET live_bytes = s.bytes
  FROM (SELECT pack_id, SUM(size) AS bytes FROM blobs WHERE pack_id IS NOT NULL GROUP BY pack_id) s
 WHERE p.id = s.pack_id;

-- A new chunk lives in its own new pack, which no other transaction writes: a row at a time.
CREATE FUNCTION vial_pack_live_new() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE packs SET live_bytes = live_bytes + NEW.size WHERE id = NEW.pack_id;
    RETURN NULL;
END $$;
CREATE TRIGGER pack_live_new AFTER INSERT ON blobs
    FOR EACH ROW WHEN (NEW.pack_id IS NOT NULL) EXECUTE FUNCTION vial_pack_live_new();

-- Collection removes a batch of chunks at once, two batches side by side that may share packs:
-- one update per pack, in pack order, so neither waits on the other in a cycle.
CREATE FUNCTION vial_pack_live_gone() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    r RECORD;
BEGIN
    FOR r IN SELECT pack_id, SUM(size) AS bytes FROM gone WHERE pack_id IS NOT NULL
              GROUP BY pack_id ORDER BY pack_id LOOP
        UPDATE packs SET live_bytes = live_bytes - r.bytes WHERE id = r.pack_id;
    END LOOP;
    RETURN NULL;
END $$;
CREATE TRIGGER pack_live_gone AFTER DELETE ON blobs
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION vial_pack_live_gone();

-- A chunk moves out of a pack when it is uploaded whole (a row at a time) or compacted (whose
-- transaction holds both packs' rows already).
CREATE FUNCTION vial_pack_live_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE packs SET live_bytes = live_bytes - OLD.size WHERE id = OLD.pack_id;
    UPDATE packs SET live_bytes = live_bytes + NEW.size WHERE id = NEW.pack_id;
    RETURN NULL;
END $$;
CREATE TRIGGER pack_live_moved AFTER UPDATE OF pack_id ON blobs
    FOR EACH ROW WHEN (OLD.pack_id IS DISTINCT FROM NEW.pack_id)
    EXECUTE FUNCTION vial_pack_live_moved();
