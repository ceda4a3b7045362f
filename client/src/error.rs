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
    #[error("{what} was deleted at {deleted_at}; `vial restore` brings it back until {restorable_until}")]
    Deleted {
        what: String,
        deleted_at: String,
        restorable_until: String,
        /// The deleted version's digest, when the registry names it.
        version: Option<String>,
    },
    #[error("authentication required by {registry}: run `vial login {registry}` or add credentials to ~/.docker/config.json")]
    Unauthorized { registry: String },
    #[error("permission denied: {0}")]
    Denied(String),
    #[error("{}", tag_moved(tag, current, expected))]
    TagMoved {
        tag: String,
        /// Where the tag points now, or "nothing".
        current: String,
        expected: Expected,
    },
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: Digest,
        actual: Digest,
    },
    #[error("chunk {digest} arrived as {actual} bytes, not the {expected} the volume lists")]
    WrongSize {
        digest: Digest,
        expected: u64,
        actual: u64,
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
    /// A local file or directory that cannot be part of a volume.
    #[error("{} cannot be pushed: {why}", .path.display())]
    NotPushable { path: PathBuf, why: String },
    /// Something other than what a pull would put there holds one of its paths.
    #[error("{} is in the way: {why}", .path.display())]
    InTheWay { path: PathBuf, why: &'static str },
    /// A registry's answer that no registry following the protocol gives.
    #[error("{registry} broke the protocol: {what}")]
    Protocol { registry: String, what: String },
    /// A registry without one of vial's extensions a command needs.
    #[error("{registry} does not offer {what} (not a vial registry?)")]
    NotVial {
        registry: String,
        what: &'static str,
    },
    /// Docker's credential configuration cannot be read or written as it is.
    #[error("{0}")]
    Credentials(String),
    #[error("cannot encode a request")]
    Encode(#[from] serde_json::Error),
    /// A file that changed under a push: what was hashed is not what would be sent.
    #[error("{} changed while it was being pushed ({how})", listed(paths))]
    ChangedDuringPush { paths: Vec<PathBuf>, how: String },
    /// A background task of the client's that ended without finishing its work.
    #[error("the {what} task failed")]
    Task {
        what: &'static str,
        #[source]
        source: tokio::task::JoinError,
    },
    #[error("a {0} thread panicked")]
    Panicked(&'static str),
    /// The work was given up (its receiver or its limits were dropped): another error says why.
    #[error("the transfer was cancelled")]
    Cancelled,
    /// What was scanned cannot form a volume (a path the format refuses, two entries at one).
    #[error(transparent)]
    Tree(#[from] vial_core::volume::TreeError),
    #[error("{0}")]
    Invalid(String),
}

/// What a compare-and-swap tag move expected of the tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expected {
    /// Not known where the refusal was read.
    Unknown,
    /// That it did not exist (`--expect none`).
    Absent,
    /// That it pointed at this digest.
    At(String),
}

/// Paths one after the other, as a message names them.
fn listed(paths: &[PathBuf]) -> String {
    let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    names.join(", ")
}

fn tag_moved(tag: &str, current: &str, expected: &Expected) -> String {
    let now = if current == "nothing" {
        "it does not exist".to_owned()
    } else {
        format!("it points at {current}")
    };
    match expected {
        Expected::Absent => format!(
            "tag {tag} already exists ({now}), but --expect none moves only a tag that does not"
        ),
        Expected::At(d) => format!("tag {tag} moved: {now}, not at the expected {d}"),
        Expected::Unknown => format!("tag {tag} is not where the move expected it: {now}"),
    }
}

impl ClientError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::StorageFull {
            return ClientError::DiskFull(path);
        }
        ClientError::Io { path, source }
    }

    /// How a background task's failure reads: `what` is the task.
    pub(crate) fn task(what: &'static str) -> impl Fn(tokio::task::JoinError) -> ClientError {
        move |source| ClientError::Task { what, source }
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
