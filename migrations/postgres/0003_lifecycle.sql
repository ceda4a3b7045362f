-- Soft delete: a deleted manifest stays, hidden, for the retention window, with the tags that
-- pointed at it remembered so a restore can put them back. The janitor removes it for good after.
ALTER TABLE manifests ADD COLUMN deleted_at BIGINT;
ALTER TABLE manifests ADD COLUMN deleted_tags TEXT;
ALTER TABLE manifests ADD COLUMN deleted_by TEXT;
CREATE INDEX manifests_deleted ON manifests (deleted_at) WHERE deleted_at IS NOT NULL;

-- Nodes that have a version mounted say so, for a while they keep renewing, so that deleting it
-- warns first.
CREATE TABLE leases (
    repository  TEXT NOT NULL,
    digest      TEXT NOT NULL,
    holder      TEXT NOT NULL,
    expires_at  BIGINT NOT NULL,
    PRIMARY KEY (repository, digest, holder)
);

-- Every tag move: from which digest to which (NULL when the tag was created or removed), when, by
-- whom and why (push, delete, version-deleted, restore, expired).
CREATE TABLE tag_events (
    repository_id  BIGINT NOT NULL REFERENCES repositories(id),
    tag            TEXT NOT NULL,
    from_digest    TEXT,
    to_digest      TEXT,
    at             BIGINT NOT NULL,
    actor          TEXT,
    reason         TEXT NOT NULL
);
CREATE INDEX tag_events_by_tag ON tag_events (repository_id, tag, at);

-- A tag may expire: after expires_at it no longer resolves and the janitor removes it.
ALTER TABLE tags ADD COLUMN expires_at BIGINT;
CREATE INDEX tags_expiring ON tags (expires_at) WHERE expires_at IS NOT NULL;

-- Garbage collection (docs/gc.md): a blob's last sign of life (upload, link, existence check),
-- and the indexes that find blobs nothing references.
ALTER TABLE blobs ADD COLUMN touched_at BIGINT;
UPDATE blobs SET touched_at = created_at;
CREATE INDEX blobs_by_touch ON blobs (touched_at);
CREATE INDEX blobs_by_source ON blobs (source_digest) WHERE source_digest IS NOT NULL;
CREATE INDEX manifest_references_by_target ON manifest_references (target_digest);
