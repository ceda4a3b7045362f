//! What the `tree` benchmark records: a row per operation and client, a run per volume and
//! backend, and the names the rows use.

use serde::Serialize;

use super::measure::Run;
use crate::report::Goal;

// Clients, as the rows name them.
pub(super) const VIAL: &str = "vial";
pub(super) const TARBALL: &str = "tarball";
pub(super) const PER_FILE: &str = "layer per file";
pub(super) const MOUNT: &str = "vial mount";
pub(super) const PULL_READ: &str = "vial pull + read";
pub(super) const LS: &str = "ls -lR";
// Operations.
pub(super) const PUSH: &str = "push";
pub(super) const PULL: &str = "pull";
pub(super) const READ: &str = "read every file";
pub(super) const MOUNT_OP: &str = "mount";
pub(super) const LS_OP: &str = "ls -lR";

/// One operation by one client. `vial` marks the row the others of its operation are compared to.
#[derive(Debug, Default, Serialize)]
pub(super) struct Row {
    pub(super) op: &'static str,
    pub(super) client: &'static str,
    pub(super) vial: bool,
    pub(super) seconds: Option<f64>,
    pub(super) cpu: Option<f64>,
    pub(super) rss_mib: Option<f64>,
    pub(super) fds: Option<usize>,
    pub(super) emfile: bool,
    /// Why there is no figure ("skipped: …", an error), or what is wrong with it.
    pub(super) note: Option<String>,
}

impl Row {
    pub(super) fn new(op: &'static str, client: &'static str, vial: bool) -> Row {
        Row {
            op,
            client,
            vial,
            ..Row::default()
        }
    }

    pub(super) fn fill(&mut self, run: Run) {
        self.seconds = Some(run.seconds);
        self.cpu = Some(run.cpu);
        self.rss_mib = Some(run.rss_mib);
        self.fds = Some(run.fds);
        self.emfile = run.emfile;
    }

    pub(super) fn skipped(mut self, why: &str) -> Row {
        self.note = Some(format!("skipped: {why}"));
        self
    }
}

/// One volume on one backend.
#[derive(Debug, Serialize)]
pub(super) struct VolumeRun {
    pub(super) volume: String,
    pub(super) backend: String,
    pub(super) files: usize,
    pub(super) bytes: u64,
    pub(super) rows: Vec<Row>,
    /// The registry's VmHWM after every client ran against it, MiB.
    pub(super) registry_rss_mib: Option<f64>,
}

#[derive(Debug, Default, Serialize)]
pub(super) struct Results {
    pub(super) machine: crate::report::Machine,
    pub(super) vial_version: String,
    pub(super) nofile: usize,
    pub(super) runs: Vec<VolumeRun>,
    pub(super) goals: Vec<Goal>,
}
