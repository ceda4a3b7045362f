//! What a garbage collection pass reports, and the counters `/metrics` shows of the passes.

use std::fmt::Write as _;
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
    /// Packs whose live chunks compaction rewrote into new packs (or would), the live bytes it
    /// wrote, and the dead bytes those packs held, which go with them once the grace period
    /// since the move has passed (docs/gc.md, "Compaction").
    pub packs_compacted: u64,
    pub rewritten_bytes: u64,
    pub compacted_dead_bytes: u64,
    /// Of `seconds`, the time compaction took.
    pub compact_seconds: f64,
    /// Candidates (blobs and packs) the pass looked at: new ones and ones that may have lost
    /// their last reference since the last pass, never every blob.
    pub examined: u64,
    pub seconds: f64,
    /// Of `seconds`, the time removing expired deleted versions took.
    pub purge_seconds: f64,
    /// Dry runs only: bytes in packs, and of them the bytes of chunks nothing references, which
    /// a pack keeps until its last chunk goes or compaction rewrites it; now, and once the pass
    /// has run and the packs it compacts are gone.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_dead_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_bytes_after: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pack_dead_bytes_after: Option<u64>,
}

/// What compaction would do, or did: the packs it rewrites, their live bytes (written again)
/// and their dead bytes (which go with them).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub packs: u64,
    pub live: u64,
    pub dead: u64,
}

/// The packs as they are: their bytes, the dead bytes among them, and what compaction would do
/// with them now (before collecting anything more), for /metrics and the storage page.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PackState {
    pub bytes: u64,
    pub dead: u64,
    pub compactable: Plan,
}

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct GcMetrics {
    /// When the last pass that collected ended (Unix milliseconds), and what it did.
    pub(crate) last: std::sync::Mutex<Option<(i64, GcReport)>>,
    pub runs: AtomicU64,
    pub blobs: AtomicU64,
    pub bytes: AtomicU64,
    pub packs_compacted: AtomicU64,
    pub rewritten_bytes: AtomicU64,
}

impl GcMetrics {
    /// The last pass that collected (not a dry run) in this process: when it ended, what it did.
    pub fn last(&self) -> Option<(i64, GcReport)> {
        self.last.lock().ok().and_then(|l| l.clone())
    }

    /// The counters, and the packs' state as gauges when it could be read.
    pub fn render(&self, out: &mut String, packs: Option<PackState>) {
        use crate::metrics::write_counter;
        if let Some(p) = packs {
            for (name, help, value) in [
                ("vial_pack_bytes", "Bytes of the committed packs.", p.bytes),
                (
                    "vial_pack_dead_bytes",
                    "Bytes in packs of chunks nothing references any more.",
                    p.dead,
                ),
                (
                    "vial_gc_compactable_packs",
                    "Packs the next pass would compact (their dead share is over the threshold).",
                    p.compactable.packs,
                ),
                (
                    "vial_gc_compactable_live_bytes",
                    "Live bytes the next pass would rewrite compacting them.",
                    p.compactable.live,
                ),
                (
                    "vial_gc_compactable_dead_bytes",
                    "Dead bytes the next pass would free compacting them.",
                    p.compactable.dead,
                ),
            ] {
                let _ = writeln!(
                    out,
                    "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
                );
            }
        }
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
        write_counter(
            out,
            "vial_gc_compacted_packs_total",
            "Packs whose live chunks compaction rewrote into new packs.",
            &self.packs_compacted,
        );
        write_counter(
            out,
            "vial_gc_rewritten_bytes_total",
            "Live chunk bytes compaction wrote into new packs.",
            &self.rewritten_bytes,
        );
    }
}
