//! Counters that show an operator that a mount is lazy: what was fetched, hit, missed and evicted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use serde::Serialize;

#[derive(Debug, Default)]
pub struct Stats {
    pub chunks_fetched: AtomicU64,
    pub bytes_fetched: AtomicU64,
    pub cache_hits: AtomicU64,
    pub cache_misses: AtomicU64,
    pub evictions: AtomicU64,
    pub fetch_errors: AtomicU64,
    pub bytes_read: AtomicU64,
    pub prefetched_chunks: AtomicU64,
    /// Downloads under way: a demand fetch from the moment it waits for a slot, a read-ahead run
    /// from the moment a read decides on it, a prefetch run once started. Zero after a read has
    /// returned means nothing that read set off is still coming.
    pub fetches_in_flight: AtomicU64,
}

/// One download counted in [`Stats::fetches_in_flight`] for as long as it lives.
#[derive(Debug)]
pub struct InFlight(Arc<Stats>);

impl InFlight {
    pub fn start(stats: &Arc<Stats>) -> InFlight {
        stats.fetches_in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(Arc::clone(stats))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.fetches_in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A point-in-time copy, as served in the mount's `.vial-stats` file.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Snapshot {
    pub reference: String,
    pub chunks_fetched: u64,
    pub bytes_fetched: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub evictions: u64,
    pub fetch_errors: u64,
    pub bytes_read: u64,
    pub prefetched_chunks: u64,
    /// Absent in statistics written before it was counted.
    #[serde(default)]
    pub fetches_in_flight: u64,
    pub cache_bytes: u64,
    pub cache_limit: u64,
}

impl Stats {
    pub fn snapshot(&self, reference: &str, cache_bytes: u64, cache_limit: u64) -> Snapshot {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Snapshot {
            reference: reference.to_owned(),
            chunks_fetched: g(&self.chunks_fetched),
            bytes_fetched: g(&self.bytes_fetched),
            cache_hits: g(&self.cache_hits),
            cache_misses: g(&self.cache_misses),
            evictions: g(&self.evictions),
            fetch_errors: g(&self.fetch_errors),
            bytes_read: g(&self.bytes_read),
            prefetched_chunks: g(&self.prefetched_chunks),
            fetches_in_flight: g(&self.fetches_in_flight),
            cache_bytes,
            cache_limit,
        }
    }
}
