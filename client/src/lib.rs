//! vial's client library: talks to any OCI registry over the Distribution API (using vial's
//! extensions when the registry has them), and pushes, pulls and reads sealed volumes.
//!
//! Start at [`Registry`] for the HTTP side, [`push::push`] and [`pull::pull`] for the volume
//! operations. The `vial` CLI and the mount both build on this crate; neither speaks HTTP itself.

pub mod auth;
mod chunker;
pub mod copy;
mod error;
pub mod fds;
pub mod follow;
pub mod progress;
pub mod pull;
pub mod push;
mod registry;
mod scan;
pub mod volume;

pub use error::{ClientError, Expected};
pub use registry::{
    plan_runs, Arrived, ChunkRun, GcJob, LeaseInfo, Manifest, Mirror, Registry, RegistryOptions,
    RestoreReport, RunSize, SealStatus, SyncJob, SyncProgress, SyncRequest, TagEventInfo, Verified,
    VersionInfo, IDLE_CONNECTION,
};
