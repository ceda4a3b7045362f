//! Durable job rows, their per-file progress, and sealed-layer records.

use async_trait::async_trait;
use sqlx::Row;
use vial_core::RepoName;

use super::*;

const JOB_COLUMNS: &str = "id, kind, repository, target, state, result, error, attempts, created_at, updated_at, spec, progress";

fn job_from_row(row: &AnyRow) -> Result<Job, StorageError> {
    let repo: String = row.try_get("repository")?;
    let state: String = row.try_get("state")?;
    Ok(Job {
        id: row.try_get("id")?,
        kind: row.try_get("kind")?,
        // Jobs over the whole registry are stored with an empty repository.
        repository: (!repo.is_empty()).then(|| parse_repo(&repo)).transpose()?,
        target: row.try_get("target")?,
        state: JobState::parse(&state)
            .ok_or_else(|| StorageError::Corrupt(format!("stored job state {state:?}")))?,
        result: row.try_get("result")?,
        error: row.try_get("error")?,
        attempts: row.try_get("attempts")?,
        created_at: row.try_get("created_at")?,
        updated_at: row.try_get("updated_at")?,
        spec: row.try_get("spec")?,
        progress: row.try_get("progress")?,
    })
}

/// Records a running job's progress if the attempt `attempts` still holds it.
async fn set_job_progress<'e>(
    executor: impl sqlx::Executor<'e, Database = Any>,
    id: &str,
    attempts: i64,
    progress: &str,
) -> Result<bool, sqlx::Error> {
    let held = sqlx::query(
        "UPDATE jobs SET progress = $3, updated_at = $4
          WHERE id = $1 AND attempts = $2 AND state = 'running'",
    )
    .bind(id)
    .bind(attempts)
    .bind(progress)
    .bind(now_millis())
    .execute(executor)
    .await?;
    Ok(held.rows_affected() > 0)
}

#[async_trait]
impl JobMeta for SqlMetadataStore {
    async fn enqueue_job(
        &self,
        kind: &str,
        repo: &RepoName,
        target: &str,
        retry_failed: bool,
    ) -> Result<Job, StorageError> {
        let now = now_millis();
        let mut tx = self.writer.begin().await?;
        sqlx::query(
            "INSERT INTO jobs (id, kind, repository, target, state, created_at, updated_at)
             VALUES ($1, $2, $3, $4, 'queued', $5, $5)
             ON CONFLICT (kind, repository, target) DO NOTHING",
        )
        .bind(uuid::Uuid::new_v4().to_string())
        .bind(kind)
        .bind(repo.as_str())
        .bind(target)
        .bind(now)
        .execute(&mut *tx)
        .await?;
        if retry_failed {
            sqlx::query(
                "UPDATE jobs SET state = 'queued', lease_until = 0, updated_at = $4
                  WHERE kind = $1 AND repository = $2 AND target = $3 AND state = 'failed'",
            )
            .bind(kind)
            .bind(repo.as_str())
            .bind(target)
            .bind(now)
            .execute(&mut *tx)
            .await?;
        }
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE kind = $1 AND repository = $2 AND target = $3"
        ))
        .bind(kind)
        .bind(repo.as_str())
        .bind(target)
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        job_from_row(&row)
    }

    async fn get_job(
        &self,
        kind: &str,
        repo: &RepoName,
        target: &str,
    ) -> Result<Option<Job>, StorageError> {
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE kind = $1 AND repository = $2 AND target = $3"
        ))
        .bind(kind)
        .bind(repo.as_str())
        .bind(target)
        .fetch_optional(&self.writer)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn claim_job(&self, lease_millis: i64) -> Result<Option<Job>, StorageError> {
        let now = now_millis();
        // The condition is checked again by the UPDATE itself: of two replicas that picked the
        // same job, PostgreSQL makes the second re-evaluate it against the first's claim.
        let due = "((state = 'queued' AND lease_until <= $1) OR (state = 'running' AND lease_until < $1))";
        let row = sqlx::query(&format!(
            "UPDATE jobs SET state = 'running', attempts = attempts + 1, lease_until = $2, updated_at = $1
              WHERE id = (SELECT id FROM jobs WHERE {due} ORDER BY created_at, id LIMIT 1) AND {due}
              RETURNING {JOB_COLUMNS}"
        ))
        .bind(now)
        .bind(now + lease_millis)
        .fetch_optional(&self.writer)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn renew_job(
        &self,
        id: &str,
        attempts: i64,
        lease_millis: i64,
    ) -> Result<bool, StorageError> {
        let now = now_millis();
        let done = sqlx::query(
            "UPDATE jobs SET lease_until = $3, updated_at = $4
              WHERE id = $1 AND attempts = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(attempts)
        .bind(now + lease_millis)
        .bind(now)
        .execute(&self.writer)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    async fn create_job(
        &self,
        kind: &str,
        repo: Option<&RepoName>,
        spec: &str,
    ) -> Result<Job, StorageError> {
        let id = uuid::Uuid::new_v4().to_string();
        let row = sqlx::query(&format!(
            "INSERT INTO jobs (id, kind, repository, target, state, spec, created_at, updated_at)
             VALUES ($1, $2, $3, $1, 'queued', $4, $5, $5)
             RETURNING {JOB_COLUMNS}"
        ))
        .bind(&id)
        .bind(kind)
        .bind(repo.map_or("", RepoName::as_str))
        .bind(spec)
        .bind(now_millis())
        .fetch_one(&self.writer)
        .await?;
        job_from_row(&row)
    }

    async fn unfinished_registry_job(&self, kind: &str) -> Result<Option<Job>, StorageError> {
        let row = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs
              WHERE kind = $1 AND repository = '' AND state IN ('queued', 'running')
              ORDER BY created_at, id LIMIT 1"
        ))
        .bind(kind)
        .fetch_optional(&self.writer)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn job_by_id(&self, id: &str) -> Result<Option<Job>, StorageError> {
        let row = sqlx::query(&format!("SELECT {JOB_COLUMNS} FROM jobs WHERE id = $1"))
            .bind(id)
            .fetch_optional(&self.writer)
            .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    async fn recent_jobs(&self, limit: u32) -> Result<Vec<Job>, StorageError> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs ORDER BY updated_at DESC, id LIMIT $1"
        ))
        .bind(i64::from(limit))
        .fetch_all(&self.reader)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn list_jobs(
        &self,
        kind: &str,
        repo: &RepoName,
        limit: u32,
    ) -> Result<Vec<Job>, StorageError> {
        let rows = sqlx::query(&format!(
            "SELECT {JOB_COLUMNS} FROM jobs WHERE kind = $1 AND repository = $2
              ORDER BY created_at DESC, id LIMIT $3"
        ))
        .bind(kind)
        .bind(repo.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.writer)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    async fn cancel_job(&self, id: &str, reason: &str) -> Result<Option<Job>, StorageError> {
        sqlx::query(
            "UPDATE jobs SET state = 'failed', error = $2, lease_until = 0, updated_at = $3
              WHERE id = $1 AND state IN ('queued', 'running')",
        )
        .bind(id)
        .bind(reason)
        .bind(now_millis())
        .execute(&self.writer)
        .await?;
        sqlx::query("DELETE FROM job_files WHERE job_id = $1")
            .bind(id)
            .execute(&self.writer)
            .await?;
        self.job_by_id(id).await
    }

    async fn save_job_file(
        &self,
        id: &str,
        attempts: i64,
        file: &JobFile,
        progress: &str,
    ) -> Result<bool, StorageError> {
        let mut tx = self.writer.begin().await?;
        // The fence first: an attempt that lost the job records nothing.
        if !set_job_progress(&mut *tx, id, attempts, progress).await? {
            return Ok(false);
        }
        sqlx::query(
            "INSERT INTO job_files (job_id, path, version, entry) VALUES ($1, $2, $3, $4)
             ON CONFLICT (job_id, path) DO UPDATE SET version = excluded.version, entry = excluded.entry",
        )
        .bind(id)
        .bind(&file.path)
        .bind(&file.version)
        .bind(&file.entry)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(true)
    }

    async fn save_job_progress(
        &self,
        id: &str,
        attempts: i64,
        progress: &str,
    ) -> Result<bool, StorageError> {
        Ok(set_job_progress(&self.writer, id, attempts, progress).await?)
    }

    async fn job_files(&self, id: &str) -> Result<Vec<JobFile>, StorageError> {
        let rows = sqlx::query("SELECT path, version, entry FROM job_files WHERE job_id = $1")
            .bind(id)
            .fetch_all(&self.writer)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(JobFile {
                    path: r.try_get("path")?,
                    version: r.try_get("version")?,
                    entry: r.try_get("entry")?,
                })
            })
            .collect()
    }

    async fn finish_job(
        &self,
        id: &str,
        attempts: i64,
        outcome: &JobOutcome,
    ) -> Result<bool, StorageError> {
        let (state, result, error, not_before) = match outcome {
            JobOutcome::Done(r) => (JobState::Done, Some(r.as_str()), None, 0),
            JobOutcome::Failed(e) => (JobState::Failed, None, Some(e.as_str()), 0),
            JobOutcome::Retry { error, not_before } => {
                (JobState::Queued, None, Some(error.as_str()), *not_before)
            }
        };
        let done = sqlx::query(
            "UPDATE jobs SET state = $3, result = $4, error = $5, lease_until = $6, updated_at = $7
              WHERE id = $1 AND attempts = $2 AND state = 'running'",
        )
        .bind(id)
        .bind(attempts)
        .bind(state.as_str())
        .bind(result)
        .bind(error)
        .bind(not_before)
        .bind(now_millis())
        .execute(&self.writer)
        .await?;
        let recorded = done.rows_affected() > 0;
        if recorded && !matches!(outcome, JobOutcome::Retry { .. }) {
            // What a finished job kept for resuming is of no more use.
            sqlx::query("DELETE FROM job_files WHERE job_id = $1")
                .bind(id)
                .execute(&self.writer)
                .await?;
        }
        Ok(recorded)
    }
}
