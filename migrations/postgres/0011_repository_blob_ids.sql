-- Repository links by blob id (docs/gc.md, "Cost"). `repository_blobs` named each blob by its
-- 71-character digest, in its primary key and again in the index collection needs: at 10 million
-- blobs the table and its indexes took 3.8 GB, and a collected blob's link was found through a
-- digest index whose pages are visited in random order, so once that index outgrew the buffer
-- cache each link cost a page read and a dirty page written back (52 us a blob, against 10 at a
-- million). Linked by the integer id `blobs` got in migration 8, the links of blobs pushed
-- together sit together, in the table and in both indexes, and collecting them touches few pages.
--
-- The migration copies every link into a new table, so on a large registry it holds writes for as
-- long as that takes: plan a maintenance window (docs/gc.md, "Upgrading a large registry").
--
-- The keys and foreign keys come after the copy: built and checked for the whole table at once,
-- they cost about a quarter of what they cost row by row (3.7-4.0 s against 16.8 s, all told,
-- for 963,800 links in the scale benchmark's store).
CREATE TABLE repository_blob_ids (
    repository_id  BIGINT NOT NULL,
    blob_id        BIGINT NOT NULL,
    created_at     BIGINT NOT NULL
);
INSERT INTO repository_blob_ids (repository_id, blob_id, created_at)
    SELECT rb.repository_id, b.id, rb.created_at
      FROM repository_blobs rb JOIN blobs b ON b.digest = rb.digest
     ORDER BY rb.repository_id, b.id;
ALTER TABLE repository_blob_ids ADD PRIMARY KEY (repository_id, blob_id);
-- Collection removes a blob's links and the foreign key checks them; without this index each
-- would scan the table (docs/gc.md).
CREATE INDEX repository_blobs_by_blob ON repository_blob_ids (blob_id);
ALTER TABLE repository_blob_ids
    ADD CONSTRAINT repository_blobs_repository_id_fkey FOREIGN KEY (repository_id) REFERENCES repositories (id),
    ADD CONSTRAINT repository_blobs_blob_id_fkey FOREIGN KEY (blob_id) REFERENCES blobs (id);
DROP TABLE repository_blobs;
ALTER TABLE repository_blob_ids RENAME TO repository_blobs;
ALTER INDEX repository_blob_ids_pkey RENAME TO repository_blobs_pkey;
