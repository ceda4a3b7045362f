//! Online garbage collection: removes blobs that no manifest (live, or deleted but still
//! restorable) and no range chunk references, while pushes, pulls and mounts go on. The safety
//! argument is in docs/gc.md; in short, a blob is removed only under its row lock, only if it is
//! still unreferenced and untouched for the grace period once that lock is held, and its bytes go
//! before its row; manifest commits hold the rows of the blobs they reference, and blob commits
//! check under their row lock that the bytes are still there.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use vial_core::Digest;

pub(crate) mod compact;
pub(crate) mod report;
pub use report::{GcMetrics, GcReport, PackState, Plan};

use super::Service;
use crate::storage::{now_millis, BytesDeletion, Garbage, Job, PackId, StorageError};
use vial_core::error_chain;

/// Candidates looked at per batch, and blobs removed per transaction.
const BATCH: u32 = 1000;

/// Batches of blobs collected at once, each on its own database connection.
const COLLECTIONS: usize = 2;

/// The kind of job a pass asked for over HTTP runs as.
pub const GC_JOB: &str = "gc";

/// How often a pass that runs as a job records how far it has come.
const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// The last moment a blob may have been touched (or a pack created) for a pass to remove it: the
/// grace period, plus the slack within which a touch is not written again (docs/gc.md).
pub fn cutoff(config: &crate::config::Config) -> i64 {
    now_millis() - (config.gc_grace + config.touch_slack()).as_millis() as i64
}

/// Where a pass records its progress: the job it runs as, if any, at most every
/// [`PROGRESS_EVERY`].
struct Progress<'a> {
    service: &'a Service,
    job: Option<&'a Job>,
    started: Instant,
    last: Instant,
}

impl Progress<'_> {
    async fn record(&mut self, report: &GcReport) {
        let Some(job) = self.job else { return };
        if self.last.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last = Instant::now();
        let so_far = GcReport {
            seconds: self.started.elapsed().as_secs_f64(),
            ..report.clone()
        };
        let json = serde_json::to_string(&so_far).unwrap_or_default();
        if let Err(e) = self
            .service
            .meta
            .save_job_progress(&job.id, job.attempts, &json)
            .await
        {
            tracing::debug!(job = %job.id, error = %error_chain(&e), "could not record a collection's progress");
        }
    }
}

/// Queues a pass as a job (or finds the one already queued or running), for `POST
/// /v2/_vial/gc`: it runs to the end whoever waits for it, on whichever replica runs jobs. A pass
/// that could not run ([`crate::storage::GcMeta::gc_blocker`]) is refused at once, not queued to
/// fail.
pub async fn start(service: &Service) -> Result<Job, StorageError> {
    if let Some(why) = service.meta.gc_blocker().await? {
        return Err(StorageError::NotReady(why));
    }
    if let Some(job) = service.meta.unfinished_registry_job(GC_JOB).await? {
        return Ok(job);
    }
    let job = service.meta.create_job(GC_JOB, None, "{}").await?;
    tracing::info!(job = %job.id, "garbage collection pass queued");
    service.jobs.wake();
    Ok(job)
}

/// One pass, recording its progress in `job` when it runs as one. Passes in one process take
/// turns; passes on several replicas are safe together.
pub async fn collect(
    service: &Service,
    dry_run: bool,
    job: Option<&Job>,
) -> Result<GcReport, StorageError> {
    let _turn = service.gc_turn.lock().await;
    if let Some(why) = service.meta.gc_blocker().await? {
        return Err(StorageError::NotReady(why));
    }
    let started = Instant::now();
    let mut report = GcReport {
        dry_run,
        ..GcReport::default()
    };
    let mut progress = Progress {
        service,
        job,
        started,
        last: started,
    };
    if dry_run {
        let expired = super::upkeep::expired_deleted(service).await?;
        report.manifests_purged = expired.len() as u64;
        let cutoff = cutoff(&service.config);
        let estimate = service.meta.gc_estimate(&expired, cutoff, cutoff).await?;
        report.blobs = estimate.blobs;
        report.packs = estimate.packs;
        report.bytes = estimate.bytes;
        report.pack_bytes = Some(estimate.pack_bytes);
        report.pack_dead_bytes = Some(estimate.pack_dead_bytes);
        report.pack_bytes_after = Some(estimate.pack_bytes_after);
        let plan = compact::estimate(service, cutoff, &estimate.pack_freed).await?;
        report.packs_compacted = plan.packs;
        report.rewritten_bytes = plan.live;
        report.compacted_dead_bytes = plan.dead;
        // Compacted packs go with their dead bytes, once the grace period since the move has
        // passed (in this pass when it is zero); the new packs hold their live bytes.
        report.pack_bytes_after = Some(estimate.pack_bytes_after.saturating_sub(plan.dead));
        report.pack_dead_bytes_after =
            Some(estimate.pack_dead_bytes_after.saturating_sub(plan.dead));
    } else {
        report.manifests_purged = super::upkeep::purge_deleted(service).await;
        report.purge_seconds = started.elapsed().as_secs_f64();
        let cutoff = cutoff(&service.config);
        collect_blobs(service, cutoff, &mut report, &mut progress).await?;
        // Then the packs whose dead bytes pass the threshold have their live chunks rewritten.
        compact_packs(service, cutoff, &mut report, &mut progress).await?;
        // Packs no chunk lives in go last (a pack is kept while any chunk in it lives:
        // docs/gc.md), those emptied by compaction once the grace period since has passed: the
        // cutoff as of now, which with no grace period includes the moves just made.
        collect_packs(
            service,
            self::cutoff(&service.config),
            &mut report,
            &mut progress,
        )
        .await?;
        let m = &service.gc_metrics;
        m.runs.fetch_add(1, Ordering::Relaxed);
        m.blobs.fetch_add(report.blobs, Ordering::Relaxed);
        m.bytes.fetch_add(report.bytes, Ordering::Relaxed);
        m.packs_compacted
            .fetch_add(report.packs_compacted, Ordering::Relaxed);
        m.rewritten_bytes
            .fetch_add(report.rewritten_bytes, Ordering::Relaxed);
    }
    report.seconds = started.elapsed().as_secs_f64();
    if !dry_run {
        if let Ok(mut last) = service.gc_metrics.last.lock() {
            *last = Some((now_millis(), report.clone()));
        }
    }
    tracing::info!(
        dry_run,
        manifests_purged = report.manifests_purged,
        blobs = report.blobs,
        packs = report.packs,
        bytes = report.bytes,
        packs_compacted = report.packs_compacted,
        rewritten_bytes = report.rewritten_bytes,
        examined = report.examined,
        seconds = report.seconds,
        "garbage collection pass"
    );
    Ok(report)
}

/// Goes through the blob candidates once, removing the garbage among them a batch at a time.
///
/// Up to [`COLLECTIONS`] batches are collected at once, each in its own transaction, while the
/// candidates after them are read: the batches hold disjoint blob rows, which every statement
/// takes in digest order, and the read takes no lock (a candidate it finds settled is dropped only
/// if nothing queued it again since, so one a collection beside it makes garbage stays).
async fn collect_blobs(
    service: &Service,
    cutoff: i64,
    report: &mut GcReport,
    progress: &mut Progress<'_>,
) -> Result<(), StorageError> {
    type Outcome = (Vec<Digest>, Result<Vec<Garbage>, StorageError>);
    type Collection = tokio::task::JoinHandle<Outcome>;
    let blobs = Arc::clone(&service.blobs);
    let delete: Arc<dyn Fn(Digest) -> BytesDeletion + Send + Sync> =
        Arc::new(move |digest: Digest| -> BytesDeletion {
            let blobs = Arc::clone(&blobs);
            Box::pin(async move { blobs.delete(&digest).await.map(drop) })
        });
    let collect = |digests: Vec<Digest>| -> Collection {
        let (meta, delete) = (Arc::clone(&service.meta), Arc::clone(&delete));
        tokio::spawn(async move {
            let gone = meta.collect_blobs(&digests, cutoff, &*delete).await;
            (digests, gone)
        })
    };
    // Batches whose collection failed (a deadlock PostgreSQL broke, say) go again at the end,
    // one at a time.
    let mut failed: Vec<Vec<Digest>> = Vec::new();
    let mut settle = |joined: Result<Outcome, tokio::task::JoinError>, report: &mut GcReport| {
        match joined {
            Ok((_, Ok(gone))) => count_collected(report, &gone),
            Ok((digests, Err(e))) => {
                tracing::debug!(blobs = digests.len(), error = %error_chain(&e), "a batch of blobs goes again once the others are collected");
                failed.push(digests);
            }
            Err(e) => {
                tracing::warn!(error = %e, "a collection task failed; the next pass tries again")
            }
        }
    };
    let mut collecting: std::collections::VecDeque<Collection> = Default::default();
    let mut after: Option<String> = None;
    loop {
        let batch = match service
            .meta
            .blob_candidates(after.as_deref(), cutoff, BATCH)
            .await
        {
            Ok(batch) => batch,
            // Read alongside collections whose transactions held rows the read's cleanup
            // needed (PostgreSQL may end such a wait as a deadlock): read it again, alone.
            Err(e) => {
                tracing::debug!(error = %error_chain(&e), "reading the next candidates again");
                while let Some(c) = collecting.pop_front() {
                    settle(c.await, report);
                }
                service
                    .meta
                    .blob_candidates(after.as_deref(), cutoff, BATCH)
                    .await?
            }
        };
        report.examined += batch.examined;
        if !batch.ready.is_empty() {
            while collecting.len() >= COLLECTIONS {
                if let Some(c) = collecting.pop_front() {
                    settle(c.await, report);
                }
            }
            collecting.push_back(collect(batch.ready.into_iter().map(|g| g.digest).collect()));
        }
        progress.record(report).await;
        match batch.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    while let Some(c) = collecting.pop_front() {
        settle(c.await, report);
    }
    for digests in failed {
        match service.meta.collect_blobs(&digests, cutoff, &*delete).await {
            Ok(gone) => count_collected(report, &gone),
            Err(e) => {
                tracing::warn!(blobs = digests.len(), error = %error_chain(&e), "could not collect a batch of blobs; the next pass tries again")
            }
        }
    }
    progress.record(report).await;
    Ok(())
}

/// Adds what one batch removed to `report`.
fn count_collected(report: &mut GcReport, gone: &[Garbage]) {
    for g in gone {
        tracing::debug!(digest = %g.digest, size = g.size, "blob collected");
    }
    report.blobs += gone.len() as u64;
    report.bytes += gone
        .iter()
        .filter(|g| g.own_bytes)
        .map(|g| g.size)
        .sum::<u64>();
}

/// [`collect_blobs`] for packs.
async fn collect_packs(
    service: &Service,
    cutoff: i64,
    report: &mut GcReport,
    progress: &mut Progress<'_>,
) -> Result<(), StorageError> {
    let blobs = Arc::clone(&service.blobs);
    let delete = move |pack: PackId| -> BytesDeletion {
        let blobs = Arc::clone(&blobs);
        Box::pin(async move { blobs.delete_pack(&pack).await.map(drop) })
    };
    let mut after: Option<String> = None;
    loop {
        let batch = service
            .meta
            .pack_candidates(after.as_deref(), cutoff, BATCH)
            .await?;
        report.examined += batch.examined;
        let packs: Vec<PackId> = batch.ready.iter().map(|(p, _)| p.clone()).collect();
        match service.meta.collect_packs(&packs, cutoff, &delete).await {
            Ok(gone) => {
                for (pack, size) in &gone {
                    tracing::debug!(%pack, size, "pack collected");
                }
                report.packs += gone.len() as u64;
                report.bytes += gone.iter().map(|(_, s)| s).sum::<u64>();
            }
            Err(e) => {
                tracing::warn!(packs = packs.len(), error = %error_chain(&e), "could not collect a batch of packs; the next pass tries again")
            }
        }
        progress.record(report).await;
        match batch.next {
            Some(next) => after = Some(next),
            None => return Ok(()),
        }
    }
}

/// Compacts the packs whose dead share passed the threshold, a group into each new pack
/// (docs/gc.md, "Compaction"), adding what it did to `report`. A group that fails is logged and
/// left as it was: the next pass tries again.
async fn compact_packs(
    service: &Service,
    before: i64,
    report: &mut GcReport,
    progress: &mut Progress<'_>,
) -> Result<(), StorageError> {
    let started = Instant::now();
    for group in compact::groups(compact::chosen(service, before).await?) {
        match compact::compact_group(service, &group).await {
            Ok(Some((to, chunks, moved, written))) => {
                tracing::info!(pack = %to, from = group.len(), chunks, moved, written, "packs compacted");
                report.packs_compacted += group.len() as u64;
                report.rewritten_bytes += written;
                report.compacted_dead_bytes += group.iter().map(|p| p.dead()).sum::<u64>();
            }
            Ok(None) => {}
            Err(e) => {
                let ids: Vec<&str> = group.iter().map(|p| p.id.as_str()).collect();
                tracing::warn!(packs = ?ids, error = %error_chain(&e), "could not compact packs; the next pass tries again");
            }
        }
        report.compact_seconds = started.elapsed().as_secs_f64();
        progress.record(report).await;
    }
    Ok(())
}

impl Service {
    /// [`PackState`]: one row per pack read, and one per pack over the threshold.
    pub(crate) async fn pack_state(&self) -> Result<PackState, StorageError> {
        let (bytes, live) = self.meta.pack_totals().await?;
        let compactable = compact::sum(&compact::chosen(self, cutoff(&self.config)).await?);
        Ok(PackState {
            bytes,
            dead: bytes.saturating_sub(live),
            compactable,
        })
    }
}

/// Runs a pass every `gc_interval`.
pub async fn schedule(service: Arc<Service>) {
    let mut tick = tokio::time::interval(service.config.gc_interval);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = collect(&service, false, None).await {
            tracing::warn!(error = %error_chain(&e), "garbage collection pass failed");
        }
    }
}
