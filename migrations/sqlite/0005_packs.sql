-- Packs: many new chunks uploaded in one request and stored as one object (docs/format.md,
-- "Packs"). A chunk that arrived in a pack has no object of its own: its row names the pack and the
-- offset that hold its bytes, and the registry serves it as that range. A pack is named by an id
-- the registry made up, not by a digest: every chunk in it is verified against its own digest, and
-- nothing outside the registry ever names a pack. The row is written before the bytes (committed
-- false) and committed with the pack's chunks, so the janitor finds the bytes of a request that died
-- in between from the rows, never by listing the store.
CREATE TABLE packs (
    id          TEXT PRIMARY KEY,
    size        INTEGER NOT NULL,
    created_at  INTEGER NOT NULL,
    committed   INTEGER NOT NULL
);
CREATE INDEX packs_uncommitted ON packs (created_at) WHERE NOT committed;
ALTER TABLE blobs ADD COLUMN pack_id TEXT REFERENCES packs(id);
-- Garbage collection asks whether any chunk still lives in a pack.
CREATE INDEX blobs_by_pack ON blobs (pack_id) WHERE pack_id IS NOT NULL;
