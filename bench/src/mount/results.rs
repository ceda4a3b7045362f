//! What the `mount` benchmark records, per volume size: mount times, the first tensor, a row per
//! way of reading every byte, the mount's memory; and the keys its rows go by.

use serde::Serialize;

use crate::checkpoint::Shape;
use crate::mounted::{MountStats, TensorRead};
use crate::pushers::PushRun;
use crate::report::{self, Goal, Machine};

pub(super) const GIB: f64 = (1u64 << 30) as f64;
pub(super) const MIB: f64 = (1u64 << 20) as f64;
pub(super) const REPO: &str = "bench/mount";
pub(super) const SKOPEO_REPO: &str = "bench/skopeo";
pub(super) const TAG: &str = "v1";

// Row keys of the read tables.
pub(super) const MOUNT_NONE: &str = "mount-none";
pub(super) const MOUNT_ALL: &str = "mount-all";
pub(super) const PULL: &str = "pull";
pub(super) const SKOPEO: &str = "skopeo";
pub(super) const LOCAL_COLD: &str = "local-cold";
pub(super) const PAGE_CACHE: &str = "mount-page-cache";
pub(super) const DAEMON: &str = "mount-daemon";
pub(super) const NODE_CACHE: &str = "mount-node-cache";
pub(super) const NODE_CACHE_DROPPED: &str = "mount-node-cache-dropped";
pub(super) const LOCAL_WARM: &str = "local-warm";

#[derive(Debug, Default, Serialize)]
pub struct Versions {
    pub vial: String,
    pub skopeo: String,
    pub fusermount3: String,
}

/// Whether the page cache could be dropped, with /proc/meminfo's `Cached:` around the first drop.
#[derive(Debug, Default, Serialize)]
pub struct DropCaches {
    pub permitted: bool,
    pub error: Option<String>,
    pub cached_kib_before: Option<u64>,
    pub cached_kib_after: Option<u64>,
}

/// One timed `vial mount` (fresh, empty cache) followed by `ls -lR`.
#[derive(Debug, Serialize)]
pub struct MountTime {
    /// `vial mount` process start to exit (the mount is ready).
    pub mount_ms: f64,
    /// `vial mount` start to `ls -lR MOUNTPOINT` exit.
    pub mount_ls_ms: f64,
    /// VmRSS of the mount process right after `ls -lR`.
    pub rss_kib: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct FirstTensor {
    pub mount_ms: f64,
    #[serde(flatten)]
    pub read: TensorRead,
    /// `vial mount` start to the tensor's last byte.
    pub mount_to_tensor_ms: f64,
    pub stats: Option<MountStats>,
    /// Delta of the registry's `vial_bytes_sent_total`.
    pub registry_bytes_sent: Option<u64>,
    pub page_cache_dropped: bool,
}

/// One way of getting every byte of the volume.
#[derive(Debug, Default, Serialize)]
pub struct ReadRow {
    pub key: String,
    pub label: String,
    /// The figure compared: for cold mounts `vial mount` start to the last byte read; for the
    /// other mount rows the read alone; for pull and skopeo the process's wall time.
    pub seconds: Option<f64>,
    /// Volume bytes / seconds, 10^6 bytes per second.
    pub mb_s: Option<f64>,
    pub read_seconds: Option<f64>,
    pub mount_seconds: Option<f64>,
    pub bytes_read: Option<u64>,
    /// Bytes the mount fetched (from `.vial-stats`, during this row) or pull downloaded.
    pub fetched: Option<u64>,
    /// Bytes the kernel asked the mount process for (delta of `.vial-stats` bytes_read).
    pub daemon_bytes_read: Option<u64>,
    /// User + system CPU time of the mount process during the read.
    pub mount_cpu_seconds: Option<f64>,
    /// Delta of the registry's `vial_bytes_sent_total` around the row.
    pub registry_bytes_sent: Option<u64>,
    pub stats: Option<MountStats>,
    pub page_cache_dropped: bool,
    pub report: Option<serde_json::Value>,
    pub error: Option<String>,
}

/// Memory of one mount process during one phase.
#[derive(Debug, Serialize)]
pub struct RssRow {
    pub phase: String,
    /// VmRSS right after the mount was ready.
    pub after_mount_kib: Option<u64>,
    /// Highest VmRSS sampled every 50 ms during the phase's reads.
    pub peak_kib: Option<u64>,
    /// VmHWM at the end of the phase.
    pub hwm_kib: Option<u64>,
}

#[derive(Debug, Default, Serialize)]
pub struct SizeRun {
    pub size_gib: f64,
    pub shards: usize,
    pub model: Option<Shape>,
    pub files: usize,
    /// Bytes of all files (tensors, headers and JSON).
    pub bytes: u64,
    pub generate_seconds: f64,
    pub push: Option<PushRun>,
    pub skopeo_push: Option<PushRun>,
    pub reference: String,
    pub pinned: Option<String>,
    /// What `vial mount` printed (the tag resolved at mount).
    pub mounted_reference: Option<String>,
    pub mounts: Vec<MountTime>,
    pub mount_ms_median: Option<f64>,
    pub mount_ls_ms_median: Option<f64>,
    /// The kernel's readahead on the mount (`/sys/class/bdi/…/read_ahead_kb`).
    pub read_ahead_kb: Option<u64>,
    /// `vial mount` over a node cache that already holds the whole volume.
    pub mount_warm_cache_ms: Option<f64>,
    pub first_tensor: Option<FirstTensor>,
    pub reads: Vec<ReadRow>,
    pub rss: Vec<RssRow>,
    pub errors: Vec<String>,
}

#[derive(Debug, Default, Serialize)]
pub struct MountResults {
    pub machine: Machine,
    pub versions: Versions,
    pub quick: bool,
    pub workdir: String,
    pub workdir_fs: String,
    pub drop_caches: DropCaches,
    pub readers: usize,
    pub read_buf_bytes: usize,
    pub cache_size: String,
    pub sizes: Vec<SizeRun>,
    pub notes: Vec<String>,
    pub goals: Vec<Goal>,
}

pub(super) fn median(v: &[f64]) -> Option<f64> {
    report::median(v)
}

pub(super) fn size_label(gib: f64) -> String {
    format!("{gib} GiB")
}
