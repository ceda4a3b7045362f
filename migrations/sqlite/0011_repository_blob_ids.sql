-- Repository links by blob id (docs/gc.md, "Cost"): the integer id `blobs` got in migration 8
-- instead of the 71-character digest, so the links of blobs pushed together sit together and
-- collecting them touches few pages. The same change as on PostgreSQL.
CREATE TABLE repository_blob_ids (
    repository_id  INTEGER NOT NULL REFERENCES repositories(id),
    blob_id        INTEGER NOT NULL REFERENCES blobs(id),
    created_at     INTEGER NOT NULL,
    PRIMARY KEY (repository_id, blob_id)
) WITHOUT ROWID;
INSERT INTO repository_blob_ids (repository_id, blob_id, created_at)
    SELECT rb.repository_id, b.id, rb.created_at
      FROM repository_blobs rb JOIN blobs b ON b.digest = rb.digest;
DROP TABLE repository_blobs;
ALTER TABLE repository_blob_ids RENAME TO repository_blobs;
CREATE INDEX repository_blobs_by_blob ON repository_blobs (blob_id);
