-- The registry's metadata: repositories, blob links, manifests, tags and upload sessions.
-- Blob bytes live in the blob store; a blob is visible to clients only once a row here links it to a
-- repository, which is what makes publishing atomic.

CREATE TABLE repositories (
    id          INTEGER PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL
);

CREATE TABLE blobs (
    digest      TEXT PRIMARY KEY,
    size        INTEGER NOT NULL,
    created_at  INTEGER NOT NULL
);

CREATE TABLE repository_blobs (
    repository_id  INTEGER NOT NULL REFERENCES repositories(id),
    digest         TEXT NOT NULL REFERENCES blobs(digest),
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (repository_id, digest)
);

CREATE TABLE manifests (
    repository_id  INTEGER NOT NULL REFERENCES repositories(id),
    digest         TEXT NOT NULL,
    media_type     TEXT NOT NULL,
    artifact_type  TEXT,
    subject        TEXT,
    annotations    TEXT,
    size           INTEGER NOT NULL,
    content        BLOB NOT NULL,
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (repository_id, digest)
);
CREATE INDEX manifests_by_subject ON manifests (repository_id, subject) WHERE subject IS NOT NULL;

-- What each manifest points at: blobs (config, layers) and child manifests (of an index). Garbage
-- collection and deletion checks read this instead of re-parsing manifests.
CREATE TABLE manifest_references (
    repository_id    INTEGER NOT NULL,
    manifest_digest  TEXT NOT NULL,
    target_digest    TEXT NOT NULL,
    is_manifest      INTEGER NOT NULL,
    PRIMARY KEY (repository_id, manifest_digest, target_digest, is_manifest),
    FOREIGN KEY (repository_id, manifest_digest) REFERENCES manifests (repository_id, digest) ON DELETE CASCADE
);

CREATE TABLE tags (
    repository_id    INTEGER NOT NULL REFERENCES repositories(id),
    name             TEXT NOT NULL,
    manifest_digest  TEXT NOT NULL,
    updated_at       INTEGER NOT NULL,
    PRIMARY KEY (repository_id, name),
    FOREIGN KEY (repository_id, manifest_digest) REFERENCES manifests (repository_id, digest) ON DELETE CASCADE
);

CREATE TABLE uploads (
    id          TEXT PRIMARY KEY,
    repository  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL
);
CREATE INDEX uploads_by_age ON uploads (updated_at);
