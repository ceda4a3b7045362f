//! containerd integration: `vial snapshotter`, a proxy snapshotter whose volume layers are lazy
//! vial mounts, and `vial containerd pull`, which pulls a volume (or any image) through it with
//! the remote-snapshot labels.

pub mod config;
pub mod labels;
pub mod pull;
mod service;
mod store;

pub use service::{serve, SnapshotterOptions, VialSnapshotter};
