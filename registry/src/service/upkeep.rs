//! The janitor: background upkeep of a registry that stores (a cache has none). Every so often
//! it removes deleted versions past their repository's retention window, expired uploads, leases
//! and tags, and packs whose upload never committed. Garbage collection purges the same deleted
//! versions first in each pass ([`purge_deleted`]).

use std::sync::Arc;

use vial_core::{Digest, RepoName};

use super::Service;
use crate::storage;

/// Deleted manifests past their repository's retention window: what [`purge_deleted`] removes.
pub(crate) async fn expired_deleted(
    service: &Service,
) -> Result<Vec<(RepoName, Digest)>, storage::StorageError> {
    const PAGE: u32 = 1000;
    let now = storage::now_millis();
    let cutoff = now - service.config.shortest_retention().as_millis() as i64;
    let mut expired = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut since = i64::MIN;
    loop {
        let page = service.meta.deleted_before(since, cutoff, PAGE).await?;
        let full = page.len() == PAGE as usize;
        let last = page.last().map(|(_, _, at)| *at);
        let mut new = 0;
        for (repo, digest, deleted_at) in page {
            if !seen.insert((repo.clone(), digest.clone())) {
                continue;
            }
            new += 1;
            let retention = service.config.retention_for(repo.as_str());
            if deleted_at + retention.as_millis() as i64 <= now {
                expired.push((repo, digest));
            }
        }
        match last {
            // Pages overlap on the last millisecond; one that brings nothing new moves past it.
            Some(at) if full => since = if new == 0 { at + 1 } else { at },
            _ => break,
        }
    }
    Ok(expired)
}

/// Expired deleted versions removed in one transaction: the references they drop are queued as
/// candidates once per batch, not once per version.
const PURGE_BATCH: usize = 100;

/// Removes every deleted manifest past its retention window for good. Returns how many went.
pub(crate) async fn purge_deleted(service: &Service) -> u64 {
    let expired = match expired_deleted(service).await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!(error = %vial_core::error_chain(&e), "janitor could not list deleted manifests");
            return 0;
        }
    };
    let mut purged = 0;
    for batch in expired.chunks(PURGE_BATCH) {
        match service.meta.purge_manifests(batch).await {
            Ok(gone) => {
                for (repo, digest) in &gone {
                    tracing::info!(%repo, %digest, "deleted manifest removed for good after its retention window");
                }
                purged += gone.len() as u64;
            }
            Err(e) => {
                tracing::warn!(versions = batch.len(), error = %vial_core::error_chain(&e), "could not remove a batch of expired deleted manifests; the next pass tries again")
            }
        }
    }
    purged
}

/// Removes the bytes of packs begun before `cutoff` (the upload TTL) and never committed: a
/// request that died between storing its pack and committing it. A pack on its way to being
/// committed is younger than that.
async fn sweep_uncommitted_packs(service: &Service, cutoff: i64) {
    let stale = match service.meta.stale_packs(cutoff, 1000).await {
        Ok(stale) => stale,
        Err(e) => {
            tracing::warn!(error = %vial_core::error_chain(&e), "janitor could not list uncommitted packs");
            return;
        }
    };
    for pack in stale {
        match service.remove_pack(&pack).await {
            Ok(()) => tracing::info!(%pack, "janitor removed a pack that was never committed"),
            Err(e) => {
                tracing::warn!(%pack, error = %vial_core::error_chain(&e), "could not remove an uncommitted pack")
            }
        }
    }
}

/// Discards upload sessions that nobody has touched for the configured time, with their data.
pub(crate) async fn run(service: Arc<Service>) {
    let mut tick = tokio::time::interval(service.config.janitor_interval);
    loop {
        tick.tick().await;
        let cutoff = storage::now_millis() - service.config.upload_ttl.as_millis() as i64;
        match service.meta.stale_uploads(cutoff, 1000).await {
            Ok(stale) => {
                for session in stale {
                    let lock = service.sessions.get(&session.id);
                    let _held = lock.lock().await;
                    match service.discard_upload(&session.id).await {
                        Ok(()) => {
                            tracing::info!(upload = %session.id, repo = %session.repository, "discarded stale upload session")
                        }
                        Err(e) => {
                            tracing::warn!(upload = %session.id, error = %vial_core::error_chain(&e), "could not discard stale upload")
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!(error = %vial_core::error_chain(&e), "janitor could not list stale uploads")
            }
        }
        purge_deleted(&service).await;
        if let Err(e) = service
            .meta
            .drop_expired_leases(storage::now_millis())
            .await
        {
            tracing::warn!(error = %vial_core::error_chain(&e), "janitor could not drop expired leases");
        }
        match service.meta.expire_tags(storage::now_millis()).await {
            Ok(expired) => {
                for (repo, tag) in expired {
                    tracing::info!(%repo, tag, "tag expired and was removed");
                }
            }
            Err(e) => {
                tracing::warn!(error = %vial_core::error_chain(&e), "janitor could not expire tags")
            }
        }
        let cutoff = std::time::SystemTime::now() - service.config.upload_ttl;
        match service.blobs.sweep(cutoff).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(removed = n, "janitor removed abandoned upload data"),
            Err(e) => {
                tracing::warn!(error = %vial_core::error_chain(&e), "janitor could not sweep the blob store")
            }
        }
        let pack_cutoff = storage::now_millis() - service.config.upload_ttl.as_millis() as i64;
        sweep_uncommitted_packs(&service, pack_cutoff).await;
    }
}
