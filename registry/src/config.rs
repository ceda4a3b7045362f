//! Server configuration: where metadata and blobs live, the limits the server enforces, and who
//! may do what (the authentication settings, which `auth.rs` enforces).

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

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
    #[error("unsupported blob URL {0:?}: use file://PATH or s3://BUCKET[/PREFIX][?endpoint=URL&region=R&path-style=true|false]")]
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
        if let Some(path) = url.strip_prefix("file://") {
            return Ok(BlobBackend::Filesystem {
                root: PathBuf::from(path),
            });
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            return S3Location::parse(rest)
                .map(BlobBackend::S3)
                .ok_or_else(|| ConfigError::BlobUrl(redact_url(url)));
        }
        Err(ConfigError::BlobUrl(redact_url(url)))
    }
}

/// Where the registry keeps blob bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlobBackend {
    /// A directory on the local filesystem.
    Filesystem { root: PathBuf },
    /// A bucket (and key prefix) in an S3-compatible object store.
    S3(S3Location),
}

/// `s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION&path-style=true|false]`. Credentials never go
/// in the URL: they come from the standard AWS environment variables and files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    pub prefix: String,
    /// A custom endpoint (MinIO, Garage, R2, …); `AWS_ENDPOINT_URL` works too.
    pub endpoint: Option<String>,
    pub region: Option<String>,
    /// Path-style addressing; by default on exactly when a custom endpoint is set.
    pub path_style: Option<bool>,
}

impl S3Location {
    fn parse(rest: &str) -> Option<Self> {
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
        if bucket.is_empty() || bucket.contains('@') {
            return None;
        }
        let mut location = S3Location {
            bucket: bucket.to_owned(),
            prefix: prefix.trim_matches('/').to_owned(),
            endpoint: None,
            region: None,
            path_style: None,
        };
        for (key, value) in form_urlencoded::parse(query.as_bytes()) {
            match &*key {
                "endpoint" => location.endpoint = Some(value.into_owned()),
                "region" => location.region = Some(value.into_owned()),
                "path-style" => location.path_style = Some(value.parse().ok()?),
                _ => return None,
            }
        }
        Some(location)
    }
}

/// The dead share of a pack at which compaction rewrites it (docs/performance.md, "Compaction",
/// has the measurement behind it).
pub const DEFAULT_COMPACT_THRESHOLD: f64 = 0.1;

/// The live bytes one pass of compaction rewrites at most.
pub const DEFAULT_COMPACT_BYTES: u64 = 8 << 30;

/// The largest tree blob the web UI reads (about 800,000 entries of short paths).
pub const DEFAULT_UI_MAX_TREE: u64 = 64 << 20;

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
    /// Answer blob GETs with a redirect to a presigned URL of the object store, when it has them.
    pub redirect_blobs: bool,
    /// Token authentication; `None` serves everyone everything (the embedded default on loopback).
    pub auth: Option<AuthSettings>,
    /// Serve HTTPS with this certificate chain and key (PEM files).
    pub tls: Option<TlsFiles>,
    /// Queue a seal for every file artifact pushed by other tools (ORAS, ModelPack, Docker model).
    pub seal_on_push: bool,
    /// Run background jobs (seals, syncs) in this process. Replicas that only serve HTTP turn
    /// it off.
    pub run_jobs: bool,
    /// How long a job's claim lasts without renewal (a crashed replica's job waits this long).
    pub job_lease: Duration,
    /// How long a deleted version can be restored before it is removed for good.
    pub retention: Duration,
    /// Other retention windows for namespaces (a repository prefix, matched on `/` boundaries;
    /// the longest match wins).
    pub namespace_retention: Vec<(String, Duration)>,
    /// Protection rules for tags.
    pub tag_rules: Vec<TagRule>,
    /// How often garbage collection runs; zero turns the schedule off (`vial gc` still works).
    pub gc_interval: Duration,
    /// Blobs used (uploaded, linked, checked for) this recently are never collected, so a push
    /// in flight keeps what it relies on (docs/gc.md).
    pub gc_grace: Duration,
    /// Compaction (docs/gc.md): a pack whose dead bytes reach this share of it has its live
    /// chunks rewritten into a new pack, and goes.
    pub gc_compact_threshold: f64,
    /// The live bytes compaction rewrites in one pass at most (it stops after the pack that
    /// reaches it); zero turns compaction off.
    pub gc_compact_bytes: u64,
    /// The largest tree blob the web UI reads into memory to list a version's files or compare
    /// two; a version whose tree is larger is shown from what its index says (docs/ui.md).
    pub ui_max_tree: u64,
    /// The sources sync jobs may read, with where they are and the credentials to read them.
    /// Empty: sync is off.
    pub sync_sources: Vec<SyncSource>,
    /// Accept image indexes whose child manifests are not all in the repository (partial
    /// multi-platform copies). A vial volume's index must be complete whatever this says.
    pub sparse_indexes: bool,
    /// The base URL clients reach this registry at (`https://registry.example.com`), for the
    /// token realm in authentication challenges; without it the realm is built from the
    /// request's `Host` header, when that is a plain host name.
    pub public_url: Option<String>,
    /// Bounds on what one client may hold of the server: slow requests, concurrent uploads.
    pub limits: Limits,
    /// Set: this server is a read-through cache of another registry (`vial serve --upstream`).
    pub upstream: Option<UpstreamConfig>,
}

/// How long a client may take to send a request, and how many uploads it may send at once. A
/// client that opens many requests and trickles them a byte at a time would otherwise hold
/// connections, upload sessions and their buffers for ever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// The longest a client may take to send a request's headers (HTTP/1).
    pub header_timeout: Duration,
    /// The longest a request body may go without sending a byte.
    pub body_idle_timeout: Duration,
    /// The slowest a request body may arrive, averaged from its start: after a 10 s allowance
    /// every further second must bring this many bytes more. Zero turns the check off.
    pub min_body_rate: u64,
    /// Upload requests (POST with a body, PATCH, PUT) one client address may have in flight at
    /// once; more are answered 429 with `Retry-After`. Zero: no cap.
    pub max_uploads_per_client: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            header_timeout: Duration::from_secs(30),
            body_idle_timeout: Duration::from_secs(60),
            min_body_rate: 1024,
            max_uploads_per_client: 256,
        }
    }
}

/// A family of sources sync jobs may read (`[[sync-sources]]` in the config file), and how to
/// reach them. A job names only what to copy; where it is served from and the credentials to read
/// it come from here, so no secret passes through a job's arguments and no job can send the
/// registry's credentials to a server of its choosing.
#[derive(Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct SyncSource {
    /// The sources covered: a prefix of the source URL, matched on `/` boundaries
    /// (`s3://models`, `oci://ghcr.io/acme`, `hf://`). The longest match wins.
    pub prefix: String,
    /// S3: the endpoint of an S3-compatible server. hf: the Hub or a mirror
    /// (default `https://huggingface.co`).
    pub endpoint: Option<String>,
    /// S3: the region.
    pub region: Option<String>,
    /// S3: path-style addressing; by default on exactly when an endpoint is set.
    pub path_style: Option<bool>,
    /// S3 credentials; without them the registry's own AWS environment is used.
    pub access_key_id: Option<Secret>,
    pub secret_access_key: Option<Secret>,
    /// hf: the access token.
    pub token: Option<Secret>,
    /// oci: registry credentials.
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// oci: reach these registries over plain HTTP (the only way a job's `--source-plain-http`
    /// gets credentials sent without TLS).
    #[serde(default)]
    pub plain_http: bool,
}

impl std::fmt::Debug for SyncSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SyncSource")
            .field("prefix", &self.prefix)
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field(
                "has_credentials",
                &(self.secret_access_key.is_some()
                    || self.token.is_some()
                    || self.password.is_some()),
            )
            .finish_non_exhaustive()
    }
}

impl SyncSource {
    /// Whether this entry covers `source`.
    pub fn covers(&self, source: &str) -> bool {
        let prefix = self.prefix.as_str();
        source == prefix.trim_end_matches('/')
            || source.strip_prefix(prefix).is_some_and(|rest| {
                prefix.ends_with('/')
                    || rest.starts_with('/')
                    || rest.starts_with(':')
                    || rest.starts_with('@')
            })
    }
}

/// A secret in the config file: written as is, or as `env:NAME` (an environment variable of the
/// registry) or `file:PATH` (a file's content, trimmed), so the file itself can hold none.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The secret's value, read now (a rotated file is picked up by the next job).
    pub fn reveal(&self) -> Result<String, String> {
        if let Some(name) = self.0.strip_prefix("env:") {
            return std::env::var(name)
                .map_err(|_| format!("environment variable {name} is not set"));
        }
        if let Some(path) = self.0.strip_prefix("file:") {
            return std::fs::read_to_string(path)
                .map(|s| s.trim().to_owned())
                .map_err(|e| format!("cannot read {path}: {e}"));
        }
        Ok(self.0.clone())
    }
}

/// How some tags of a namespace may move. Every rule that matches a tag applies.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TagRule {
    /// Repositories under this prefix (matched on `/` boundaries); empty for all.
    #[serde(default)]
    pub namespace: String,
    /// Tag names; a trailing `*` matches any suffix (`v*`, `*`).
    pub tags: Vec<String>,
    /// Once set, the tag never moves and cannot be removed.
    #[serde(default)]
    pub immutable: bool,
    /// Moves must say where the tag points now (`vial tag set --expect`, HTTP `If-Match`).
    #[serde(default)]
    pub require_expect: bool,
    /// Only these users may move or remove the tag.
    #[serde(default)]
    pub users: Option<Vec<String>>,
}

impl TagRule {
    pub fn matches(&self, repo: &str, tag: &str) -> bool {
        let ns = self.namespace.trim_end_matches('/');
        let in_ns = ns.is_empty()
            || repo == ns
            || repo.strip_prefix(ns).is_some_and(|r| r.starts_with('/'));
        in_ns
            && self.tags.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => tag.starts_with(prefix),
                None => tag == p,
            })
    }
}

/// A cache of another registry: where it is, how to sign in there, and how much to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamConfig {
    /// `https://host[:port]`, `http://host[:port]` or a bare `host[:port]`.
    pub url: String,
    /// Speak plain HTTP to a bare `host[:port]`.
    pub plain_http: bool,
    pub username: Option<String>,
    pub password: Option<Secret>,
    /// Where cached blobs live.
    pub dir: PathBuf,
    /// Bytes of blobs kept at most.
    pub size: u64,
    /// How long a tag's answer from the upstream is used before asking again.
    pub tag_ttl: Duration,
    /// Every replica of this cache (this one included), as its peers reach it; empty alone.
    pub peers: Vec<String>,
}

impl UpstreamConfig {
    /// The upstream's `host[:port]`, and whether it speaks plain HTTP.
    pub fn host(&self) -> (String, bool) {
        let url = self.url.trim_end_matches('/');
        if let Some(host) = url.strip_prefix("http://") {
            (host.to_owned(), true)
        } else if let Some(host) = url.strip_prefix("https://") {
            (host.to_owned(), false)
        } else {
            (url.to_owned(), self.plain_http)
        }
    }
}

/// The default retention window for deleted versions.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
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
            redirect_blobs: false,
            auth: None,
            tls: None,
            seal_on_push: true,
            run_jobs: true,
            job_lease: Duration::from_secs(30),
            retention: DEFAULT_RETENTION,
            namespace_retention: Vec::new(),
            tag_rules: Vec::new(),
            gc_interval: Duration::from_secs(3600),
            gc_grace: Duration::from_secs(3600),
            gc_compact_threshold: DEFAULT_COMPACT_THRESHOLD,
            gc_compact_bytes: DEFAULT_COMPACT_BYTES,
            ui_max_tree: DEFAULT_UI_MAX_TREE,
            sync_sources: Vec::new(),
            sparse_indexes: true,
            public_url: None,
            limits: Limits::default(),
            upstream: None,
        }
    }
}

impl Config {
    /// The retention window of deleted versions in `repo`.
    pub fn retention_for(&self, repo: &str) -> Duration {
        self.namespace_retention
            .iter()
            .filter(|(ns, _)| {
                let ns = ns.trim_end_matches('/');
                repo == ns || repo.strip_prefix(ns).is_some_and(|r| r.starts_with('/'))
            })
            .max_by_key(|(ns, _)| ns.trim_end_matches('/').len())
            .map_or(self.retention, |(_, d)| *d)
    }

    /// The protection rules that apply to `tag` in `repo`.
    pub fn tag_rules_for<'a>(
        &'a self,
        repo: &'a str,
        tag: &'a str,
    ) -> impl Iterator<Item = &'a TagRule> {
        self.tag_rules.iter().filter(move |r| r.matches(repo, tag))
    }

    /// The entry that covers a sync source: the longest matching prefix.
    pub fn sync_source_for(&self, source: &str) -> Option<&SyncSource> {
        self.sync_sources
            .iter()
            .filter(|s| s.covers(source))
            .max_by_key(|s| s.prefix.len())
    }

    /// How recent a blob's last touch may be for a presence check not to write it again: an
    /// eighth of the grace period, at most five minutes. Collection adds it to the grace period,
    /// so a blob is still kept for the whole grace period after any presence check.
    pub fn touch_slack(&self) -> Duration {
        (self.gc_grace / 8).min(Duration::from_secs(300))
    }

    /// The shortest retention window of any namespace.
    pub fn shortest_retention(&self) -> Duration {
        self.namespace_retention
            .iter()
            .map(|(_, d)| *d)
            .fold(self.retention, Duration::min)
    }
}

/// What a request may do to a repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Pull,
    Push,
    Delete,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Pull => "pull",
            Action::Push => "push",
            Action::Delete => "delete",
        }
    }

    pub(crate) fn parse(s: &str) -> Option<Action> {
        match s {
            "pull" => Some(Action::Pull),
            "push" => Some(Action::Push),
            "delete" => Some(Action::Delete),
            _ => None,
        }
    }
}

/// One access rule: `users` may do `actions` in repositories matching `repositories`, a pattern in
/// which `*` stands for any run of characters (`weights/*` covers `weights/a/b`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub repositories: String,
    /// User names, `*` for any signed-in user, `anonymous` for requests without credentials.
    pub users: Vec<String>,
    pub actions: Vec<Action>,
}

/// A user defined in the config file, with a bcrypt password hash (as `htpasswd -B` makes).
#[derive(Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct UserEntry {
    pub name: String,
    pub password_hash: String,
}

impl std::fmt::Debug for UserEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserEntry")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How the registry authenticates clients, as configured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthSettings {
    /// The `service` of the token flow: tokens name it as their audience.
    pub service: String,
    /// The token endpoint clients are sent to; by default this server's `/token`.
    pub realm: Option<String>,
    pub htpasswd: Option<PathBuf>,
    pub users: Vec<UserEntry>,
    pub rules: Vec<Rule>,
    /// A file holding the token signing key (at least 32 bytes). Replicas must share it; without
    /// it each process makes up its own and tokens only work on the replica that issued them.
    pub token_key_file: Option<PathBuf>,
    pub token_ttl: Duration,
}

impl Default for AuthSettings {
    fn default() -> Self {
        AuthSettings {
            service: "vial".into(),
            realm: None,
            htpasswd: None,
            users: Vec::new(),
            // Without rules, signed-in users may do everything and anonymous clients nothing.
            rules: Vec::new(),
            token_key_file: None,
            token_ttl: Duration::from_secs(300),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_is_the_longest_matching_namespace_s() {
        let mut c = Config::embedded("/tmp/x");
        c.namespace_retention = vec![
            ("weights".into(), Duration::from_secs(30)),
            ("weights/prod/".into(), Duration::from_secs(90)),
            ("scratch".into(), Duration::ZERO),
        ];
        assert_eq!(c.retention_for("weights/a"), Duration::from_secs(30));
        assert_eq!(
            c.retention_for("weights/prod/llama"),
            Duration::from_secs(90)
        );
        assert_eq!(
            c.retention_for("weights/production"),
            Duration::from_secs(30)
        );
        assert_eq!(c.retention_for("weightsx/a"), DEFAULT_RETENTION);
        assert_eq!(c.retention_for("scratch/tmp"), Duration::ZERO);
        assert_eq!(c.shortest_retention(), Duration::ZERO);
    }

    #[test]
    fn sync_sources_match_on_boundaries_and_the_longest_wins() {
        let mut c = Config::embedded("/tmp/x");
        let entry = |prefix: &str| SyncSource {
            prefix: prefix.into(),
            ..SyncSource::default()
        };
        c.sync_sources = vec![
            entry("s3://models"),
            entry("s3://models/prod/"),
            entry("hf://"),
            entry("oci://ghcr.io/acme"),
        ];
        let prefix = |s: &str| c.sync_source_for(s).map(|e| e.prefix.clone());
        assert_eq!(prefix("s3://models").as_deref(), Some("s3://models"));
        assert_eq!(prefix("s3://models/x").as_deref(), Some("s3://models"));
        assert_eq!(
            prefix("s3://models/prod/llama").as_deref(),
            Some("s3://models/prod/")
        );
        assert_eq!(prefix("s3://models2/x"), None);
        assert_eq!(prefix("hf://org/repo@main").as_deref(), Some("hf://"));
        assert_eq!(
            prefix("oci://ghcr.io/acme:v1").as_deref(),
            Some("oci://ghcr.io/acme")
        );
        assert_eq!(
            prefix("oci://ghcr.io/acme/w:v1").as_deref(),
            Some("oci://ghcr.io/acme")
        );
        assert_eq!(prefix("oci://ghcr.io/acmex:v1"), None);
        assert_eq!(prefix("oci://evil.example/x:v1"), None);
    }

    #[test]
    fn secrets_never_print_and_come_from_where_they_say() {
        std::env::set_var("VIAL_TEST_SECRET_X", "from-env");
        assert_eq!(
            Secret::new("env:VIAL_TEST_SECRET_X").reveal().unwrap(),
            "from-env"
        );
        assert_eq!(Secret::new("plain").reveal().unwrap(), "plain");
        assert!(Secret::new("env:VIAL_TEST_SECRET_MISSING")
            .reveal()
            .is_err());
        let s = SyncSource {
            prefix: "s3://b".into(),
            secret_access_key: Some(Secret::new("hunter2")),
            ..SyncSource::default()
        };
        assert!(!format!("{s:?}").contains("hunter2"));
    }

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
        assert_eq!(
            BlobBackend::from_url(
                "s3://models/vial/prod?endpoint=http://127.0.0.1:9000&path-style=false"
            ),
            Ok(BlobBackend::S3(S3Location {
                bucket: "models".into(),
                prefix: "vial/prod".into(),
                endpoint: Some("http://127.0.0.1:9000".into()),
                region: None,
                path_style: Some(false),
            }))
        );
        assert!(BlobBackend::from_url("s3://").is_err());
        assert!(
            BlobBackend::from_url("s3://b?secret=x").is_err(),
            "unknown options are refused"
        );
        let err = MetadataBackend::from_url("mongodb://u:hunter2@h/db")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("hunter2"), "{err}");
    }
}
