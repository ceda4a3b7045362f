//! What a run of the suite takes: the registry, the namespace its repositories live under, and
//! the checks to leave out.

/// What to test and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The registry's base URL, e.g. `http://127.0.0.1:5000` (the suite appends `/v2/...`).
    pub base_url: String,
    /// Repository prefix every repository the suite creates lives under, e.g.
    /// `conformance/3fa2c9d1`, so that runs never collide. Each area adds a fresh random name.
    pub namespace: String,
    /// Namespace for the source repository of the cross-repository mount checks; the
    /// [`namespace`](Config::namespace) when `None`.
    pub cross_mount_namespace: Option<String>,
    /// Checks to leave out: exact ids (`push.single-post`), dot-separated prefixes (`discovery`,
    /// `push.chunked`) or globs ending in `*` (`discovery.ref*`).
    pub skip: Vec<String>,
}

impl Config {
    /// A configuration for `base_url` with a fresh random namespace and nothing skipped.
    pub fn new(base_url: impl Into<String>) -> Self {
        Config {
            base_url: base_url.into(),
            namespace: default_namespace(),
            cross_mount_namespace: None,
            skip: Vec::new(),
        }
    }
}

/// `conformance/<random>`: a namespace no earlier run used.
pub fn default_namespace() -> String {
    format!("conformance/{}{}", suffix(), suffix())
}

/// Eight random lowercase hex characters.
pub(crate) fn suffix() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id.chars().take(8).collect()
}
