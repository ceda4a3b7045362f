//! vial on a node: lazy, read-only FUSE mounts of sealed volumes.
//!
//! A mount resolves its reference once, loads the version's tree (a constant number of registry
//! requests), and answers every metadata operation from memory. File reads fetch only the chunks
//! they touch, through a content-addressed chunk cache on disk that every mount on the node shares,
//! bounded in size with least-recently-used eviction. Every chunk is verified against its digest
//! before a byte of it is served; a chunk that cannot be fetched or verified is EIO, never wrong
//! bytes.
//!
//! Start at [`mount::run`]; the FUSE operations are in `fs.rs`, the cache in [`cache`].

pub mod cache;
pub mod containerd;
mod errno;
mod fetch;
pub mod follow;
mod fs;
mod inodes;
mod lease;
pub mod mount;
mod prefetch;
mod shared;
pub mod stats;
mod walk;

pub use mount::MountOptions;
pub use prefetch::Prefetch;

/// Name of the statistics file at the root of every mount.
pub fn stats_file_name() -> &'static str {
    inodes::STATS_NAME
}
