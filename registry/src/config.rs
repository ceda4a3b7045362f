//! Server configuration: where metadata and blobs live, and the limits the server enforces.

use std::path::PathBuf;
use std::time::Duration;

/// Where the registry keeps its metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetadataBackend {
    /// An SQLite database file, created if missing.
    Sqlite { path: PathBuf },
}

/// Where the registry keeps blob bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobBackend {
    /// A directory on the local filesystem.
    Filesystem { root: PathBuf },
}

#[derive(Debug, Clone)]
pub struct Config {
    pub metadata: MetadataBackend,
    pub blobs: BlobBackend,
    /// Manifests larger than this are refused with 413.
    pub max_manifest_size: u64,
    /// Upload sessions untouched for this long are discarded with their data.
    pub upload_ttl: Duration,
    /// How often the janitor looks for stale upload sessions.
    pub janitor_interval: Duration,
}

/// 16 MiB: four times the 4 MiB limit common registries enforce, so large volume indexes fit.
pub const DEFAULT_MAX_MANIFEST_SIZE: u64 = 16 * 1024 * 1024;

impl Config {
    /// The embedded default: SQLite and blob files under one data directory.
    pub fn embedded(data_dir: impl Into<PathBuf>) -> Self {
        let data_dir = data_dir.into();
        Config {
            metadata: MetadataBackend::Sqlite {
                path: data_dir.join("metadata.db"),
            },
            blobs: BlobBackend::Filesystem { root: data_dir },
            max_manifest_size: DEFAULT_MAX_MANIFEST_SIZE,
            upload_ttl: Duration::from_secs(24 * 3600),
            janitor_interval: Duration::from_secs(600),
        }
    }
}
