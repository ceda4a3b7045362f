//! What a garbage collection pass reports, and the counters `/metrics` shows of the passes.

use std::sync::atomic::AtomicU64;

use serde::Serialize;

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
    /// Candidates (blobs and packs) the pass looked at: new ones and ones that may have lost
    /// their last reference since the last pass, never every blob.
    pub examined: u64,
    pub seconds: f64,
    /// Of `seconds`, the time removing expired deleted versions took.
    pub purge_seconds: f64,
    /// Dry runs only: bytes in packs, and of them the bytes of chunks nothing references, which
    /// a pack keeps until its last chunk goes; now, and once the pass has run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_dead_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_bytes_after: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_dead_bytes_after: Option<u64>,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct GcMetrics {
    /// When the last pass that collected ended (Unix milliseconds), and what it did.
    pub(crate) last: std::sync::Mutex<Option<(i64, GcReport)>>,
    pub runs: AtomicU64,
    pub blobs: AtomicU64,
    pub bytes: AtomicU64,
}

impl GcMetrics {
    /// The last pass that collected (not a dry run) in this process: when it ended, what it did.
    pub fn last(&self) -> Option<(i64, GcReport)> {
        self.last.lock().ok().and_then(|l| l.clone())
    }

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
