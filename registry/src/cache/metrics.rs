//! The cache tier's counters, rendered into `/metrics`.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug, Default)]
pub struct CacheMetrics {
    hits: AtomicU64,
    misses: AtomicU64,
    joins: AtomicU64,
    stale: AtomicU64,
    upstream_bytes: AtomicU64,
    peer_bytes: AtomicU64,
}

impl CacheMetrics {
    /// A blob or manifest served from the disk.
    pub fn hit(&self) {
        self.hits.fetch_add(1, Ordering::Relaxed);
    }

    /// A blob or manifest fetched.
    pub fn miss(&self) {
        self.misses.fetch_add(1, Ordering::Relaxed);
    }

    /// A request that followed a fill another request had started.
    pub fn join(&self) {
        self.joins.fetch_add(1, Ordering::Relaxed);
    }

    /// A tag answered from the last known answer because the upstream was unreachable.
    pub fn stale(&self) {
        self.stale.fetch_add(1, Ordering::Relaxed);
    }

    pub fn add_upstream_bytes(&self, n: u64) {
        self.upstream_bytes.fetch_add(n, Ordering::Relaxed);
    }

    pub fn add_peer_bytes(&self, n: u64) {
        self.peer_bytes.fetch_add(n, Ordering::Relaxed);
    }

    /// `usage` is (bytes stored, blobs stored, evictions).
    pub fn render(&self, out: &mut String, usage: (u64, u64, u64), limit: u64) {
        let counters = [
            (
                "hits",
                "Blobs and manifests served from the cache's disk.",
                &self.hits,
            ),
            (
                "misses",
                "Blobs and manifests fetched from the upstream or a peer.",
                &self.misses,
            ),
            (
                "single_flight_joins",
                "Requests that followed a fetch another request had started.",
                &self.joins,
            ),
            (
                "stale_answers",
                "Tags answered from the last known answer while the upstream was unreachable.",
                &self.stale,
            ),
            (
                "upstream_bytes",
                "Bytes fetched from the upstream.",
                &self.upstream_bytes,
            ),
            (
                "peer_bytes",
                "Bytes fetched from peer cache replicas.",
                &self.peer_bytes,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP vial_cache_{name}_total {help}");
            let _ = writeln!(out, "# TYPE vial_cache_{name}_total counter");
            let _ = writeln!(
                out,
                "vial_cache_{name}_total {}",
                value.load(Ordering::Relaxed)
            );
        }
        let (bytes, blobs, evictions) = usage;
        let _ = writeln!(
            out,
            "# HELP vial_cache_evictions_total Blobs evicted to stay within the cache size."
        );
        let _ = writeln!(out, "# TYPE vial_cache_evictions_total counter");
        let _ = writeln!(out, "vial_cache_evictions_total {evictions}");
        for (name, help, value) in [
            ("bytes", "Bytes the cache holds.", bytes),
            ("blobs", "Blobs and manifests the cache holds.", blobs),
            ("limit_bytes", "The cache size bound.", limit),
        ] {
            let _ = writeln!(out, "# HELP vial_cache_{name} {help}");
            let _ = writeln!(out, "# TYPE vial_cache_{name} gauge");
            let _ = writeln!(out, "vial_cache_{name} {value}");
        }
    }
}
