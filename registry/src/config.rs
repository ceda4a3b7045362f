//! Server configuration: where metadata and blobs live, and the limits the server enforces.

use std::path::PathBuf;
use std::time::Duration;

/// Where the registry keeps its metadata.
#[derive(Clone, PartialEq, Eq)]
pub enum MetadataBackend {
    /// An SQLite database file, created if missing.
    Sqlite { path: PathBuf },
    /// A PostgreSQL database, `postgres://user:password@host:port/db`.
    Postgres { url: String },
}

impl std::fmt::Debug for MetadataBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MetadataBackend::Sqlite { path } => {
                f.debug_struct("Sqlite").field("path", path).finish()
            }
            MetadataBackend::Postgres { url } => f
                .debug_struct("Postgres")
                .field("url", &redact_url(url))
                .finish(),
        }
    }
}

/// A URL with any password replaced, for logs and Debug output.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split(':').next().unwrap_or("");
            format!("{scheme}://{user}:***@{host}")
        }
        None => url.to_owned(),
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("unsupported metadata URL {0:?}: use sqlite://PATH or postgres://USER:PASSWORD@HOST:PORT/DB")]
    MetadataUrl(String),
    #[error("unsupported blob URL {0:?}: use file://PATH")]
    BlobUrl(String),
}

impl MetadataBackend {
    /// Picks the backend from the URL scheme.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            return Ok(MetadataBackend::Sqlite {
                path: PathBuf::from(path),
            });
        }
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            return Ok(MetadataBackend::Postgres {
                url: url.to_owned(),
            });
        }
        Err(ConfigError::MetadataUrl(redact_url(url)))
    }
}

impl BlobBackend {
    /// Picks the backend from the URL scheme.
    pub fn from_url(url: &str) -> Result<Self, ConfigError> {
        match url.strip_prefix("file://") {
            Some(path) => Ok(BlobBackend::Filesystem {
                root: PathBuf::from(path),
            }),
            None => Err(ConfigError::BlobUrl(redact_url(url))),
        }
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_are_picked_from_the_url_scheme_and_passwords_never_print() {
        let pg = MetadataBackend::from_url("postgres://vial:s3cret@db:5432/vial").unwrap();
        assert!(!format!("{pg:?}").contains("s3cret"));
        assert!(matches!(
            MetadataBackend::from_url("sqlite://./x.db"),
            Ok(MetadataBackend::Sqlite { .. })
        ));
        assert!(MetadataBackend::from_url("mysql://x").is_err());
        assert_eq!(
            BlobBackend::from_url("file:///srv/vial"),
            Ok(BlobBackend::Filesystem {
                root: PathBuf::from("/srv/vial")
            })
        );
        let err = MetadataBackend::from_url("mongodb://u:hunter2@h/db")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }
}
