-- A purge queues only the blobs it leaves unreferenced (docs/gc.md, "Cost").
--
-- Purging a version removes a reference to every chunk it lists, and most of those chunks are
-- still listed by the versions after it: the scale benchmark queued five candidates for every blob
-- a pass then collected, and the pass read and dropped the other four. The trigger now checks,
-- once per statement and for all the rows it removed, which blobs have no reference left, and
-- queues those alone.
--
-- Two transactions removing the last two references to one blob would each see the other's
-- reference still there and queue nothing. So the check runs under a transaction-scoped advisory
-- lock (the constant is `REFERENCE_LOCK` in registry/src/storage/sql/manifests.rs, which purges
-- also take first): the second check waits until the first transaction has committed, and then
-- sees its references gone.
CREATE OR REPLACE FUNCTION vial_gc_lost_references() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(8532458087433725555);
    INSERT INTO gc_candidates (blob_id)
        SELECT g.blob_id FROM (SELECT DISTINCT blob_id FROM gone) g
         WHERE NOT EXISTS (SELECT 1 FROM manifest_blobs r WHERE r.blob_id = g.blob_id)
         ORDER BY g.blob_id
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    RETURN NULL;
END $$;

-- Collections run two batches at once (registry/src/gc.rs), and two batches may remove chunks of
-- the same packs: both transactions then queue those packs, taking their candidate rows. Taken
-- in pack order, neither waits on the other in a cycle.
CREATE OR REPLACE FUNCTION vial_gc_lost_ranges() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO gc_candidates (blob_id)
        SELECT DISTINCT s.id FROM gone g JOIN blobs s ON s.digest = g.source_digest ORDER BY s.id
        ON CONFLICT (blob_id) DO UPDATE SET queued = gc_candidates.queued + 1;
    INSERT INTO gc_pack_candidates (pack_id)
        SELECT DISTINCT pack_id FROM gone WHERE pack_id IS NOT NULL ORDER BY pack_id
        ON CONFLICT (pack_id) DO UPDATE SET queued = gc_pack_candidates.queued + 1;
    RETURN NULL;
END $$;
