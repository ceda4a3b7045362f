//! The background job runner: claims durable jobs from the metadata store and runs them, one at a
//! time per process, holding a lease it renews while the job runs.
//!
//! Jobs live in the database, not in memory, so they survive restarts and any replica can run any
//! job. A replica that dies mid-job stops renewing its lease and another replica (or the same one,
//! restarted) takes the job over once the lease lapses. A graceful shutdown hands the job back at
//! once. A job's attempt number fences its worker: an attempt whose lease lapsed cannot record an
//! outcome over the attempt that replaced it.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use vial_core::Digest;

use crate::seal::{seal, SEAL_JOB};
use crate::service::gc::GC_JOB;
use crate::service::Service;
use crate::storage::{now_millis, Job, JobOutcome};
use crate::sync::SYNC_JOB;
use vial_core::error_chain;

/// How often an idle runner looks for jobs queued by other replicas or left by dead ones.
const POLL: Duration = Duration::from_secs(5);
/// Jobs one process runs at once.
const PARALLEL_JOBS: usize = 2;
/// Attempts before a job that keeps failing transiently is given up.
const MAX_ATTEMPTS: i64 = 5;

/// How long a shutdown waits for the blocking reads of the jobs it handed back: each stops at its
/// next read, which takes no longer than one network read.
const READERS_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Runs jobs until `stop` turns true; a job running then is handed back for another attempt.
/// Up to [`PARALLEL_JOBS`] run at once, so a long sync does not hold up the seals queued behind it.
pub async fn run(service: Arc<Service>, mut stop: watch::Receiver<bool>) {
    tracing::info!("background job runner started");
    let slots = Arc::new(tokio::sync::Semaphore::new(PARALLEL_JOBS));
    let mut running = tokio::task::JoinSet::new();
    while !*stop.borrow() {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let job = match service
            .job_rows()
            .claim_job(service.config.job_lease.as_millis() as i64)
            .await
        {
            Ok(job) => job,
            Err(e) => {
                tracing::warn!(error = %error_chain(&e), "could not look for jobs");
                None
            }
        };
        let Some(job) = job else {
            drop(slot);
            tokio::select! {
                () = service.jobs.wake.notified() => {}
                () = tokio::time::sleep(POLL) => {}
                _ = stop.changed() => {}
            }
            continue;
        };
        let (service, mut stop) = (Arc::clone(&service), stop.clone());
        running.spawn(async move {
            run_one(&service, job, &mut stop).await;
            drop(slot);
        });
        // Reap finished tasks so the set does not grow.
        while running.try_join_next().is_some() {}
    }
    // Every running job sees the stop too and hands itself back. A read it ran on a blocking
    // thread fails at its next call; wait for those, so none is left reading while the runtime
    // shuts down.
    while running.join_next().await.is_some() {}
    let readers = &service.jobs.readers;
    if !readers.done(READERS_GRACE).await {
        tracing::warn!(
            readers = readers.live(),
            "blocking reads of handed-back jobs still under way at shutdown"
        );
    }
}

async fn run_one(service: &Arc<Service>, job: Job, stop: &mut watch::Receiver<bool>) {
    tracing::info!(job = %job.id, kind = %job.kind, repo = job.scope(), target = %job.target, attempt = job.attempts, "job started");
    let outcome = if job.attempts > MAX_ATTEMPTS {
        JobOutcome::Failed(format!(
            "gave up after {MAX_ATTEMPTS} attempts; last error: {}",
            job.error.as_deref().unwrap_or("none recorded")
        ))
    } else {
        let work = execute(service, &job);
        let renew = async {
            loop {
                tokio::time::sleep(service.config.job_lease / 3).await;
                match service
                    .job_rows()
                    .renew_job(
                        &job.id,
                        job.attempts,
                        service.config.job_lease.as_millis() as i64,
                    )
                    .await
                {
                    Ok(true) => {}
                    Ok(false) => return,
                    // A database hiccup: the lease still has two thirds of its time to go.
                    Err(e) => {
                        tracing::warn!(job = %job.id, error = %error_chain(&e), "could not renew job lease")
                    }
                }
            }
        };
        tokio::select! {
            outcome = work => outcome,
            () = renew => {
                tracing::warn!(job = %job.id, "job lease was lost to another runner; abandoning this attempt");
                return;
            }
            _ = stop.changed() => JobOutcome::Retry {
                error: "interrupted by a registry shutdown".into(),
                not_before: 0,
            },
        }
    };
    match &outcome {
        JobOutcome::Done(result) => {
            tracing::info!(job = %job.id, kind = %job.kind, repo = job.scope(), target = %job.target, result, "job done")
        }
        JobOutcome::Failed(error) => {
            tracing::warn!(job = %job.id, kind = %job.kind, repo = job.scope(), target = %job.target, error, "job failed")
        }
        JobOutcome::Retry { error, .. } => {
            tracing::warn!(job = %job.id, kind = %job.kind, repo = job.scope(), target = %job.target, error, "job will be retried")
        }
    }
    let recorded = service
        .job_rows()
        .finish_job(&job.id, job.attempts, &outcome)
        .await;
    service.jobs.finished.notify_waiters();
    match recorded {
        Ok(true) => {}
        Ok(false) => {
            tracing::warn!(job = %job.id, "job was taken over before it finished; outcome dropped")
        }
        Err(e) => {
            tracing::warn!(job = %job.id, error = %error_chain(&e), "could not record job outcome; it will run again")
        }
    }
}

async fn execute(service: &Arc<Service>, job: &Job) -> JobOutcome {
    match job.kind.as_str() {
        SEAL_JOB => {
            let (Some(repo), Ok(subject)) = (&job.repository, Digest::parse(&job.target)) else {
                return JobOutcome::Failed(format!(
                    "{:?} in {:?} is not an artifact to seal",
                    job.target,
                    job.scope()
                ));
            };
            match seal(service, repo, &subject).await {
                Ok(volume) => JobOutcome::Done(volume.to_string()),
                Err(e) if e.is_transient() => JobOutcome::Retry {
                    error: error_chain(&e),
                    // Back off 2, 4, 8, 16 seconds.
                    not_before: now_millis() + 1000 * (1 << job.attempts.clamp(1, 4)),
                },
                Err(e) => JobOutcome::Failed(error_chain(&e)),
            }
        }
        SYNC_JOB => match crate::sync::run(service, job).await {
            Ok(version) => JobOutcome::Done(version.to_string()),
            Err(e) if e.is_transient() => JobOutcome::Retry {
                error: error_chain(&e),
                not_before: now_millis() + 1000 * (1 << job.attempts.clamp(1, 4)),
            },
            Err(e) => JobOutcome::Failed(error_chain(&e)),
        },
        // A pass that fails is not tried again here: the next one, scheduled or asked for,
        // starts from whatever this one left.
        GC_JOB => match crate::service::gc::collect(service, false, Some(job)).await {
            Ok(report) => JobOutcome::Done(serde_json::to_string(&report).unwrap_or_default()),
            Err(e) => JobOutcome::Failed(error_chain(&e)),
        },
        other => JobOutcome::Failed(format!("unknown job kind {other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::storage::{JobMeta, JobState, SqlMetadataStore};
    use vial_core::RepoName;

    #[tokio::test]
    async fn a_lapsed_lease_passes_the_job_on_and_fences_the_old_attempt() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SqlMetadataStore::open_sqlite(&dir.path().join("m.db"))
            .await
            .unwrap();
        let repo = RepoName::parse("a/b").unwrap();
        let queued = meta
            .enqueue_job(SEAL_JOB, &repo, "t1", false)
            .await
            .unwrap();
        assert_eq!(queued.state, JobState::Queued);
        // Queuing the same work again is the same job.
        let again = meta
            .enqueue_job(SEAL_JOB, &repo, "t1", false)
            .await
            .unwrap();
        assert_eq!(again.id, queued.id);

        let first = meta.claim_job(100).await.unwrap().expect("a queued job");
        assert_eq!((first.id.as_str(), first.attempts), (queued.id.as_str(), 1));
        assert!(
            meta.claim_job(100).await.unwrap().is_none(),
            "held under a lease"
        );
        assert!(meta.renew_job(&first.id, 1, 100).await.unwrap());

        tokio::time::sleep(Duration::from_millis(150)).await;
        let second = meta.claim_job(60_000).await.unwrap().expect("lease lapsed");
        assert_eq!(
            (second.id.as_str(), second.attempts),
            (queued.id.as_str(), 2)
        );
        // The first attempt can neither renew nor finish over the second.
        assert!(!meta.renew_job(&first.id, 1, 100).await.unwrap());
        let late = JobOutcome::Done("from the first attempt".into());
        assert!(!meta.finish_job(&first.id, 1, &late).await.unwrap());
        let done = JobOutcome::Done("sha256:volume".into());
        assert!(meta.finish_job(&second.id, 2, &done).await.unwrap());
        let job = meta.get_job(SEAL_JOB, &repo, "t1").await.unwrap().unwrap();
        assert_eq!(job.state, JobState::Done);
        assert_eq!(job.result.as_deref(), Some("sha256:volume"));
        assert!(
            meta.claim_job(100).await.unwrap().is_none(),
            "done jobs stay done"
        );
    }

    #[tokio::test]
    async fn retries_wait_their_turn_and_failed_jobs_queue_again_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let meta = SqlMetadataStore::open_sqlite(&dir.path().join("m.db"))
            .await
            .unwrap();
        let repo = RepoName::parse("a/b").unwrap();
        meta.enqueue_job(SEAL_JOB, &repo, "t", false).await.unwrap();
        let job = meta.claim_job(60_000).await.unwrap().unwrap();
        let retry = JobOutcome::Retry {
            error: "store unavailable".into(),
            not_before: now_millis() + 60_000,
        };
        assert!(meta
            .finish_job(&job.id, job.attempts, &retry)
            .await
            .unwrap());
        assert!(
            meta.claim_job(100).await.unwrap().is_none(),
            "not before its time"
        );

        let other = meta.enqueue_job(SEAL_JOB, &repo, "u", false).await.unwrap();
        let claimed = meta.claim_job(60_000).await.unwrap().unwrap();
        assert_eq!(claimed.id, other.id);
        let failed = JobOutcome::Failed("not an artifact".into());
        assert!(meta.finish_job(&claimed.id, 1, &failed).await.unwrap());
        let kept = meta.enqueue_job(SEAL_JOB, &repo, "u", false).await.unwrap();
        assert_eq!(kept.state, JobState::Failed);
        assert_eq!(kept.error.as_deref(), Some("not an artifact"));
        let requeued = meta.enqueue_job(SEAL_JOB, &repo, "u", true).await.unwrap();
        assert_eq!(requeued.state, JobState::Queued);
    }
}
