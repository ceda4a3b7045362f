//! Errors of the client, worded for the person at the terminal.

use std::path::PathBuf;

use vial_core::Digest;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("registry {registry} is unreachable")]
    Unreachable {
        registry: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("repository {0} does not exist on this registry")]
    RepositoryNotFound(String),
    #[error("{0} not found")]
    NotFound(String),
    #[error("authentication required by {registry}: run `vial login {registry}` or add credentials to ~/.docker/config.json")]
    Unauthorized { registry: String },
    #[error("permission denied: {0}")]
    Denied(String),
    #[error("tag {tag} moved: it points at {current}, not at the expected {expected}")]
    TagMoved {
        tag: String,
        current: String,
        expected: String,
    },
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("registry answered {status} to {action}: {code} {message}")]
    Registry {
        action: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("{0} is not a vial volume: {1}")]
    NotAVolume(String, String),
    #[error("invalid volume content: {0}")]
    InvalidVolume(String),
    #[error("disk full while writing {}", .0.display())]
    DiskFull(PathBuf),
    #[error("{}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

impl ClientError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::StorageFull {
            return ClientError::DiskFull(path);
        }
        ClientError::Io { path, source }
    }

    /// Whether trying the same request again may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Unreachable { .. } => true,
            ClientError::Registry { status, .. } => *status >= 500 || *status == 429,
            _ => false,
        }
    }
}
