//! Online garbage collection: removes blobs that no manifest (live, or deleted but still
//! restorable) and no range chunk references, while pushes, pulls and mounts go on. The safety
//! argument is in docs/gc.md; in short, a blob is removed only under its row lock, only if it is
//! still unreferenced and untouched for the grace period once that lock is held, and its bytes go
//! before its row; manifest commits hold the rows of the blobs they reference, and blob commits
//! check under their row lock that the bytes are still there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use vial_core::Digest;

use crate::error::error_chain;
use crate::storage::{now_millis, BytesDeletion, PackId, StorageError};
use crate::AppState;

/// Candidates looked at per batch.
const BATCH: u32 = 1000;

/// What a collection pass did, or would do.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    pub dry_run: bool,
    /// Deleted versions past their retention window, removed for good first.
    pub manifests_purged: u64,
    pub blobs: u64,
    /// Packs removed once no chunk lived in them (their bytes are counted in `bytes`; the
    /// chunks that lived in them are counted in `blobs` but not in `bytes`).
    pub packs: u64,
    pub bytes: u64,
    pub seconds: f64,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct GcMetrics {
    pub runs: AtomicU64,
    pub blobs: AtomicU64,
    pub bytes: AtomicU64,
}

/// One pass. Passes in one process take turns; passes on several replicas are safe together.
pub async fn collect(state: &AppState, dry_run: bool) -> Result<GcReport, StorageError> {
    let _turn = state.gc_turn.lock().await;
    let started = Instant::now();
    let mut report = GcReport {
        dry_run,
        ..GcReport::default()
    };
    if !dry_run {
        report.manifests_purged = crate::purge_deleted(state).await;
    }
    let cutoff = now_millis() - state.config.gc_grace.as_millis() as i64;
    if dry_run {
        let mut last_len = u32::MAX;
        let mut limit = BATCH;
        // Grow the window until it holds every candidate.
        loop {
            let found = state.meta.unreferenced_blobs(cutoff, limit).await?;
            if (found.len() as u32) < limit || found.len() as u32 == last_len {
                report.blobs = found.len() as u64;
                report.bytes = found.iter().filter(|c| c.2).map(|c| c.1).sum();
                break;
            }
            last_len = found.len() as u32;
            limit = limit.saturating_mul(4);
        }
    } else {
        let blobs = Arc::clone(&state.blobs);
        let delete = move |digest: Digest| -> BytesDeletion {
            let blobs = Arc::clone(&blobs);
            Box::pin(async move { blobs.delete(&digest).await.map(drop) })
        };
        loop {
            let found = state.meta.unreferenced_blobs(cutoff, BATCH).await?;
            let mut collected = 0;
            for (digest, _, has_bytes) in &found {
                match state.meta.collect_blob(digest, cutoff, &delete).await {
                    Ok(Some(size)) => {
                        collected += 1;
                        report.blobs += 1;
                        if *has_bytes {
                            report.bytes += size;
                        }
                        tracing::debug!(%digest, size, "blob collected");
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(%digest, error = %error_chain(&e), "could not collect a blob; the next pass tries again")
                    }
                }
            }
            if found.len() < BATCH as usize || collected == 0 {
                break;
            }
        }
        // Packs whose chunks have all been collected go last (a pack is kept while any chunk
        // in it lives: docs/gc.md).
        let blobs = Arc::clone(&state.blobs);
        let delete_pack = move |pack: PackId| -> BytesDeletion {
            let blobs = Arc::clone(&blobs);
            Box::pin(async move { blobs.delete_pack(&pack).await.map(drop) })
        };
        loop {
            let found = state.meta.unreferenced_packs(cutoff, BATCH).await?;
            let mut collected = 0;
            for (pack, _) in &found {
                match state.meta.collect_pack(pack, cutoff, &delete_pack).await {
                    Ok(Some(size)) => {
                        collected += 1;
                        report.packs += 1;
                        report.bytes += size;
                        tracing::debug!(%pack, size, "pack collected");
                    }
                    Ok(None) => {}
                    Err(e) => {
                        tracing::warn!(%pack, error = %error_chain(&e), "could not collect a pack; the next pass tries again")
                    }
                }
            }
            if found.len() < BATCH as usize || collected == 0 {
                break;
            }
        }
        let m = &state.gc_metrics;
        m.runs.fetch_add(1, Ordering::Relaxed);
        m.blobs.fetch_add(report.blobs, Ordering::Relaxed);
        m.bytes.fetch_add(report.bytes, Ordering::Relaxed);
    }
    report.seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        dry_run,
        manifests_purged = report.manifests_purged,
        blobs = report.blobs,
        bytes = report.bytes,
        seconds = report.seconds,
        "garbage collection pass"
    );
    Ok(report)
}

/// Runs a pass every `gc_interval`.
pub async fn schedule(state: Arc<AppState>) {
    let mut tick = tokio::time::interval(state.config.gc_interval);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = collect(&state, false).await {
            tracing::warn!(error = %error_chain(&e), "garbage collection pass failed");
        }
    }
}

impl GcMetrics {
    pub fn render(&self, out: &mut String) {
        use crate::metrics::write_counter;
        write_counter(
            out,
            "vial_gc_runs_total",
            "Garbage collection passes.",
            &self.runs,
        );
        write_counter(
            out,
            "vial_gc_reclaimed_blobs_total",
            "Blobs removed by garbage collection.",
            &self.blobs,
        );
        write_counter(
            out,
            "vial_gc_reclaimed_bytes_total",
            "Blob bytes removed by garbage collection.",
            &self.bytes,
        );
    }
}
