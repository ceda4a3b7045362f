//! Whole-volume prefetch: stream every chunk into the cache in tree order, so a model that reads
//! all its weights finds them already local. Stops short of the cache bound so it never evicts what
//! it just fetched.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::StreamExt;

use crate::fetch::Priority;
use crate::fs::Shared;
use crate::inodes::NodeKind;
use crate::stats::InFlight;

/// Bulk reads (runs of up to [`crate::fetch::RUN_BYTES`]) the prefetcher keeps in flight.
const PARALLEL: usize = 4;

pub async fn prefetch_all(shared: Arc<Shared>) {
    let budget = shared.fetcher.cache().limit() / 10 * 9;
    let mut planned = 0u64;
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    for &ino in &shared.inodes.files {
        if let Some(NodeKind::File(f)) = shared.inodes.get(ino).map(|n| &n.kind) {
            for &c in &f.chunks {
                let size = shared.chunks[c as usize].size;
                if seen.insert(c) {
                    if planned + size > budget {
                        tracing::info!(
                            planned,
                            budget,
                            "volume is larger than the cache: prefetching only its start"
                        );
                        break;
                    }
                    planned += size;
                    order.push(c);
                }
            }
        }
    }
    let started = std::time::Instant::now();
    let runs = crate::fetch::runs(order.into_iter().map(|c| {
        let chunk = &shared.chunks[c as usize];
        (chunk.digest.clone(), chunk.size)
    }));
    let results = futures_util::stream::iter(runs)
        .map(|run| {
            let shared = Arc::clone(&shared);
            async move {
                let _in_flight = InFlight::start(&shared.stats);
                let r = shared.fetcher.ensure_run(&run, Priority::Background).await;
                if let Ok(n) = r {
                    shared
                        .stats
                        .prefetched_chunks
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                r
            }
        })
        .buffer_unordered(PARALLEL)
        .collect::<Vec<_>>()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    tracing::info!(
        bytes = planned,
        failed,
        seconds = started.elapsed().as_secs_f64(),
        "prefetch finished"
    );
}
