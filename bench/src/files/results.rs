//! What the `files` benchmark records: a row per operation and client, a run per size and
//! backend, and the concurrent pushes.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::report::Goal;

pub(super) const GIB: f64 = (1u64 << 30) as f64;

/// The client of `hashing_push`: the file-per-layer push that must hash its files first.
pub(super) const HASHING: &str = "file-per-layer, hashing";

/// One timed operation by one client.
#[derive(Debug, Default, Clone, Serialize)]
pub(super) struct Row {
    pub(super) op: String,
    pub(super) client: String,
    pub(super) seconds: Option<f64>,
    /// The client's user + system CPU seconds.
    pub(super) client_cpu: Option<f64>,
    /// The registry's CPU seconds during the operation.
    pub(super) registry_cpu: Option<f64>,
    /// The client's peak RSS, MiB.
    pub(super) rss_mib: Option<f64>,
    /// Object-store requests the registry sent, by HTTP method (S3 backend).
    pub(super) s3: BTreeMap<String, u64>,
    pub(super) error: Option<String>,
    /// Wall seconds of every run this row is the median of (one per round).
    pub(super) samples: Vec<f64>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct SizeRun {
    pub(super) backend: String,
    pub(super) gib: f64,
    pub(super) bytes: u64,
    pub(super) rows: Vec<Row>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct Results {
    pub(super) machine: crate::report::Machine,
    pub(super) runs: Vec<SizeRun>,
    pub(super) concurrent: Option<Concurrent>,
    pub(super) goals: Vec<Goal>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct Concurrent {
    pub(super) pushes: usize,
    pub(super) seconds: f64,
    pub(super) registry_peak_rss_mib: f64,
}
