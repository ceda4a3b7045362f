-- Sealing other tools' artifacts into vial volumes.
--
-- A chunk cut from a blob that is stored whole (a file layer pushed by oras, or a file inside an
-- uncompressed tar layer) is not copied: its row names the blob and offset that hold its bytes,
-- and the registry serves it as that range. A chunk uploaded on its own has no source.
ALTER TABLE blobs ADD COLUMN source_digest TEXT;
ALTER TABLE blobs ADD COLUMN source_offset BIGINT;

-- Durable background work (sealing today). A job is claimed by setting a lease; a replica that
-- dies mid-job lets its lease lapse and another replica takes the job over. `attempts` counts
-- claims and fences a worker whose lease lapsed from finishing a job someone else now holds.
CREATE TABLE jobs (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    repository   TEXT NOT NULL,
    target       TEXT NOT NULL,
    state        TEXT NOT NULL,
    result       TEXT,
    error        TEXT,
    attempts     BIGINT NOT NULL DEFAULT 0,
    lease_until  BIGINT NOT NULL DEFAULT 0,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
CREATE UNIQUE INDEX jobs_by_target ON jobs (kind, repository, target);
CREATE INDEX jobs_ready ON jobs (state, lease_until);

-- What sealing read from a layer blob, so sealing the next version of an artifact reads only the
-- layers that changed. `reading` names how the blob was read (packing, chunker, and for a file
-- layer whether its name made it a safetensors file); `files` is JSON.
CREATE TABLE sealed_layers (
    layer_digest  TEXT NOT NULL,
    reading       TEXT NOT NULL,
    files         TEXT NOT NULL,
    created_at    BIGINT NOT NULL,
    PRIMARY KEY (layer_digest, reading)
);
