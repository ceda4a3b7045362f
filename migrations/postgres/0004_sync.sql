-- Sync jobs: copying a remote source (a bucket, another registry, the Hugging Face Hub) into a
-- sealed version. A job's `spec` is what was asked (JSON: source, tag, filters, who asked);
-- `progress` is what it has done so far (JSON: counts, and the source revision it pinned).
ALTER TABLE jobs ADD COLUMN spec TEXT;
ALTER TABLE jobs ADD COLUMN progress TEXT;

-- Files a sync job has finished, so an attempt after a restart copies only the rest. `version`
-- says which copy of the file was read (an ETag, a commit); `entry` is the file's chunks (JSON).
CREATE TABLE job_files (
    job_id   TEXT NOT NULL,
    path     TEXT NOT NULL,
    version  TEXT NOT NULL,
    entry    TEXT NOT NULL,
    PRIMARY KEY (job_id, path)
);
