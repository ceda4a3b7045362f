-- A repository's live versions in listing order (newest first), so a page of them, a count and
-- "the version before this one" are index walks, not a sort of every version (docs/ui.md).
-- Manifests are few next to blobs (one per version and part), so building it is quick; on a very
-- large PostgreSQL registry it can still be built beforehand without blocking writes with
--   CREATE INDEX CONCURRENTLY IF NOT EXISTS manifests_live_versions ON manifests
--     (repository_id, artifact_type, created_at DESC, digest) WHERE deleted_at IS NULL;
CREATE INDEX IF NOT EXISTS manifests_live_versions ON manifests
    (repository_id, artifact_type, created_at DESC, digest) WHERE deleted_at IS NULL;
