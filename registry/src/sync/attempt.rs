//! One attempt at a sync job: what it has recorded so far, saved as it goes, and the outcome of
//! committing what it copied.

use std::sync::{Arc, Mutex};

use vial_core::{Digest, RepoName};

use crate::service::publish::Publish;
use crate::service::Service;
use crate::storage::{CommitManifestError, Job, JobFile};

use super::spec::{SyncError, SyncProgress};

/// One attempt at a job, with what it has recorded so far.
///
/// Copies run concurrently and each records its own outcome: nothing waits on the database
/// outside the futures being polled, since a suspended future may hold the (SQLite: only) write
/// connection in the middle of a transaction.
pub(super) struct Run {
    pub(super) service: Arc<Service>,
    pub(super) job: Job,
    pub(super) progress: Mutex<SyncProgress>,
    pub(super) publish: Publish,
    /// The job's repository.
    pub(super) repo: RepoName,
}

impl Run {
    pub(super) fn repo(&self) -> &RepoName {
        &self.repo
    }

    pub(super) fn progress(&self) -> std::sync::MutexGuard<'_, SyncProgress> {
        // A panic while the lock was held leaves counters, not invariants, behind.
        self.progress
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn progress_json(&self) -> String {
        serde_json::to_string(&*self.progress()).unwrap_or_default()
    }

    pub(super) async fn save_progress(&self) -> Result<(), SyncError> {
        let held = self
            .service
            .job_rows()
            .save_job_progress(&self.job.id, self.job.attempts, &self.progress_json())
            .await?;
        if held {
            Ok(())
        } else {
            Err(SyncError::Lost)
        }
    }

    pub(super) async fn save_file(&self, file: &JobFile) -> Result<(), SyncError> {
        let held = self
            .service
            .job_rows()
            .save_job_file(&self.job.id, self.job.attempts, file, &self.progress_json())
            .await?;
        if held {
            Ok(())
        } else {
            Err(SyncError::Lost)
        }
    }
}

/// The outcome of committing `digest` with the job's tag. An immutable tag that already points at
/// `digest` is this job's own earlier attempt, not a conflict.
pub(super) fn published(
    result: Result<(), CommitManifestError>,
    digest: &Digest,
) -> Result<(), SyncError> {
    match result {
        Err(CommitManifestError::TagMoved {
            current: Some(current),
            ..
        }) if &current == digest => Ok(()),
        other => other.map_err(SyncError::from),
    }
}
