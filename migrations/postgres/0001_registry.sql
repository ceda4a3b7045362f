-- The registry's metadata in PostgreSQL: the same tables as migrations/sqlite, in Postgres types.
-- Names use the C collation so listings sort bytewise, as the distribution-spec's lexical order
-- expects, whatever the database's default collation.

CREATE TABLE repositories (
    id          BIGSERIAL PRIMARY KEY,
    name        TEXT COLLATE "C" NOT NULL UNIQUE,
    created_at  BIGINT NOT NULL
);

CREATE TABLE blobs (
    digest      TEXT PRIMARY KEY,
    size        BIGINT NOT NULL,
    created_at  BIGINT NOT NULL
);

CREATE TABLE repository_blobs (
    repository_id  BIGINT NOT NULL REFERENCES repositories(id),
    digest         TEXT NOT NULL REFERENCES blobs(digest),
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (repository_id, digest)
);

CREATE TABLE manifests (
    repository_id  BIGINT NOT NULL REFERENCES repositories(id),
    digest         TEXT NOT NULL,
    media_type     TEXT NOT NULL,
    artifact_type  TEXT,
    subject        TEXT,
    annotations    TEXT,
    size           BIGINT NOT NULL,
    content        BYTEA NOT NULL,
    created_at     BIGINT NOT NULL,
    PRIMARY KEY (repository_id, digest)
);
CREATE INDEX manifests_by_subject ON manifests (repository_id, subject) WHERE subject IS NOT NULL;

CREATE TABLE manifest_references (
    repository_id    BIGINT NOT NULL,
    manifest_digest  TEXT NOT NULL,
    target_digest    TEXT NOT NULL,
    is_manifest      BOOLEAN NOT NULL,
    PRIMARY KEY (repository_id, manifest_digest, target_digest, is_manifest),
    FOREIGN KEY (repository_id, manifest_digest) REFERENCES manifests (repository_id, digest) ON DELETE CASCADE
);

CREATE TABLE tags (
    repository_id    BIGINT NOT NULL REFERENCES repositories(id),
    name             TEXT COLLATE "C" NOT NULL,
    manifest_digest  TEXT NOT NULL,
    updated_at       BIGINT NOT NULL,
    PRIMARY KEY (repository_id, name),
    FOREIGN KEY (repository_id, manifest_digest) REFERENCES manifests (repository_id, digest) ON DELETE CASCADE
);

CREATE TABLE uploads (
    id          TEXT PRIMARY KEY,
    repository  TEXT NOT NULL,
    created_at  BIGINT NOT NULL,
    updated_at  BIGINT NOT NULL
);
CREATE INDEX uploads_by_age ON uploads (updated_at);
