-- Metadata at fleet scale (docs/gc.md, "Cost").
--
-- Collection deletes a blob's repository links by digest: without this index each deletion (and
-- the foreign key check of deleting the blob row) scans the whole table, which made a pass
-- quadratic in the number of blobs. On a large registry, build it without blocking writes before
-- upgrading (docs/gc.md, "Upgrading a large registry"):
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS repository_blobs_by_digest ON repository_blobs (digest);
-- and this statement finds it there. Collection refuses to run while it is missing or invalid.
CREATE INDEX IF NOT EXISTS repository_blobs_by_digest ON repository_blobs (digest);

-- The blobs and packs a collection pass looks at: every new one, and every one that may just have
-- lost its last reference. A pass reads these instead of every blob, so it costs in proportion to
-- what changed since the last pass, not to the size of the registry. Triggers keep the tables
-- complete whatever statement removes a reference, so no code path can forget one.
CREATE TABLE gc_candidates (digest TEXT PRIMARY KEY);
CREATE TABLE gc_pack_candidates (pack_id TEXT PRIMARY KEY);
INSERT INTO gc_candidates (digest) SELECT digest FROM blobs;
INSERT INTO gc_pack_candidates (pack_id) SELECT id FROM packs;

CREATE FUNCTION vial_gc_new_blob() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_candidates (digest) VALUES (NEW.digest) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER gc_new_blob AFTER INSERT ON blobs FOR EACH ROW EXECUTE FUNCTION vial_gc_new_blob();

CREATE FUNCTION vial_gc_new_pack() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_pack_candidates (pack_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER gc_new_pack AFTER INSERT ON packs FOR EACH ROW EXECUTE FUNCTION vial_gc_new_pack();

-- A manifest's blob references go when it is purged (ON DELETE CASCADE fires this too). Once per
-- statement, over all the rows it removed: a purge removes thousands at once.
CREATE FUNCTION vial_gc_lost_references() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_candidates (digest)
        SELECT DISTINCT target_digest FROM gone WHERE NOT is_manifest
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER gc_lost_reference AFTER DELETE ON manifest_references
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION vial_gc_lost_references();

-- A range chunk that goes frees its source blob or pack; collection removes a batch at once.
CREATE FUNCTION vial_gc_lost_ranges() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_candidates (digest)
        SELECT DISTINCT source_digest FROM gone WHERE source_digest IS NOT NULL
        ON CONFLICT DO NOTHING;
    INSERT INTO gc_pack_candidates (pack_id)
        SELECT DISTINCT pack_id FROM gone WHERE pack_id IS NOT NULL
        ON CONFLICT DO NOTHING;
    RETURN NULL;
END $$;
CREATE TRIGGER gc_lost_range AFTER DELETE ON blobs
    REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION vial_gc_lost_ranges();

-- A range chunk that moves to bytes of its own frees them too (a row at a time: such moves are
-- single uploads, and a statement trigger on every UPDATE would also fire for every touch).
CREATE FUNCTION vial_gc_moved_range() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.source_digest IS NOT NULL AND OLD.source_digest IS DISTINCT FROM NEW.source_digest THEN
        INSERT INTO gc_candidates (digest) VALUES (OLD.source_digest) ON CONFLICT DO NOTHING;
    END IF;
    IF OLD.pack_id IS NOT NULL AND OLD.pack_id IS DISTINCT FROM NEW.pack_id THEN
        INSERT INTO gc_pack_candidates (pack_id) VALUES (OLD.pack_id) ON CONFLICT DO NOTHING;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER gc_moved_range AFTER UPDATE OF source_digest, pack_id ON blobs
    FOR EACH ROW EXECUTE FUNCTION vial_gc_moved_range();
