-- Collection candidates by blob id, with a generation (docs/gc.md, "Cost").
--
-- Queuing a candidate by its text digest cost a random insert into a text index, and purging one
-- version queues a thousand: that was most of a pass's time. Candidates are now blob ids, which
-- the references being removed already hold.
--
-- `queued` counts how often a candidate was queued again while it waited. A pass reads it with
-- the candidate, and drops a candidate it found still held only if `queued` has not moved since:
-- a reference removed meanwhile bumps it (and holds its row until that commits), so the pass
-- keeps the candidate instead of losing it. Before this, the pass locked one row holding each
-- candidate FOR SHARE, a write to every page of references it looked at.
CREATE TABLE gc_blob_candidates (
    blob_id  BIGINT PRIMARY KEY,
    queued   BIGINT NOT NULL DEFAULT 0
);
INSERT INTO gc_blob_candidates (blob_id)
    SELECT b.id FROM gc_candidates c JOIN blobs b ON b.digest = c.digest
    ON CONFLICT DO NOTHING;
DROP TABLE gc_candidates;
ALTER TABLE gc_blob_candidates RENAME TO gc_candidates;
ALTER INDEX gc_blob_candidates_pkey RENAME TO gc_candidates_pkey;
ALTER TABLE gc_pack_candidates ADD COLUMN queued BIGINT NOT NULL DEFAULT 0;

CREATE OR REPLACE FUNCTION vial_gc_new_blob() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_candidates (blob_id) VALUES (NEW.id)
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION vial_gc_new_pack() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_pack_candidates (pack_id) VALUES (NEW.id)
        ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION vial_gc_lost_references() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_candidates (blob_id) SELECT DISTINCT blob_id FROM gone
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION vial_gc_lost_ranges() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_candidates (blob_id)
        SELECT DISTINCT s.id FROM gone g JOIN blobs s ON s.digest = g.source_digest
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    INSERT INTO gc_pack_candidates (pack_id)
        SELECT DISTINCT pack_id FROM gone WHERE pack_id IS NOT NULL
        ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION vial_gc_moved_range() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF OLD.source_digest IS NOT NULL AND OLD.source_digest IS DISTINCT FROM NEW.source_digest THEN
        INSERT INTO gc_candidates (blob_id) SELECT id FROM blobs WHERE digest = OLD.source_digest
            ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    END IF;
    IF OLD.pack_id IS NOT NULL AND OLD.pack_id IS DISTINCT FROM NEW.pack_id THEN
        INSERT INTO gc_pack_candidates (pack_id) VALUES (OLD.pack_id)
            ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1;
    END IF;
    RETURN NULL;
END $$;
