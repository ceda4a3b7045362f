//! `vial serve`: run the registry until SIGINT or SIGTERM.
//!
//! Settings come in layers: built-in defaults, then the config file (`--config`), then `VIAL_…`
//! environment variables, then flags. Reading the config has no side effects; storage is opened
//! only once every layer has been applied.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use serde::Deserialize;
use vial_registry::auth::AuthSettings;
use vial_registry::config::{SyncSource, TlsFiles, UpstreamConfig, DEFAULT_MAX_MANIFEST_SIZE};
use vial_registry::{BlobBackend, Config, MetadataBackend};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial serve                               # 127.0.0.1:5000, data in ./vial-data\n  vial serve --addr 0.0.0.0:5000 --data /srv/vial\n  vial serve --metadata-url postgres://vial:PASSWORD@db/vial --blob-url file:///srv/blobs\n  AWS_ACCESS_KEY_ID=… AWS_SECRET_ACCESS_KEY=… vial serve --blob-url 's3://models/vial?endpoint=http://minio:9000'\n  vial serve --htpasswd /etc/vial/htpasswd --token-key-file /etc/vial/token.key --tls-cert cert.pem --tls-key key.pem\n  vial serve --config /etc/vial/vial.toml  # every setting, auth rules too: see docs/vial.example.toml"
)]
pub struct ServeArgs {
    /// TOML config file; its settings are overridden by VIAL_… variables and flags.
    #[arg(long, env = "VIAL_CONFIG")]
    config: Option<PathBuf>,

    /// Address to listen on [default: 127.0.0.1:5000]. Port 0 picks a free port (printed).
    #[arg(long, env = "VIAL_ADDR")]
    addr: Option<SocketAddr>,

    /// Directory for the embedded metadata database and blob files [default: ./vial-data].
    #[arg(long, env = "VIAL_DATA")]
    data: Option<PathBuf>,

    /// Metadata store: sqlite://PATH (default: DATA/metadata.db) or postgres://USER:PASSWORD@HOST/DB.
    #[arg(long, env = "VIAL_METADATA_URL", hide_env_values = true)]
    metadata_url: Option<String>,

    /// Blob store: file://PATH (default: the data directory) or
    /// s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION&path-style=BOOL]. S3 credentials come from
    /// the standard AWS variables (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL, …) and
    /// ~/.aws files, never from the URL.
    #[arg(long, env = "VIAL_BLOB_URL")]
    blob_url: Option<String>,

    /// Answer blob downloads with a redirect to a presigned object-store URL (S3 only), so bytes
    /// flow from the bucket to the client without passing through the registry.
    #[arg(long, env = "VIAL_REDIRECT_BLOBS")]
    redirect_blobs: bool,

    /// Largest manifest accepted, in bytes [default: 16777216].
    #[arg(long, env = "VIAL_MAX_MANIFEST_SIZE")]
    max_manifest_size: Option<u64>,

    /// Discard upload sessions untouched for this long, e.g. 24h [default: 24h].
    #[arg(long, env = "VIAL_UPLOAD_TTL", value_parser = humantime::parse_duration)]
    upload_ttl: Option<Duration>,

    /// How often the janitor runs [default: 10m]: it discards stale upload sessions and abandoned
    /// multipart uploads, purges deleted versions past retention and removes expired tags.
    #[arg(long, env = "VIAL_JANITOR_INTERVAL", value_parser = humantime::parse_duration)]
    janitor_interval: Option<Duration>,

    /// Turn on token authentication with the users of this htpasswd file (bcrypt, `htpasswd -B`).
    /// Without `[auth] rules` in the config file, signed-in users may do everything and anonymous
    /// clients nothing.
    #[arg(long, env = "VIAL_HTPASSWD")]
    htpasswd: Option<PathBuf>,

    /// File with the key that signs tokens (32+ random bytes). Replicas must share it.
    #[arg(long, env = "VIAL_TOKEN_KEY_FILE")]
    token_key_file: Option<PathBuf>,

    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, env = "VIAL_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,

    /// The PEM private key of --tls-cert.
    #[arg(long, env = "VIAL_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,

    /// Seal file artifacts that other tools push (oras push, ModelPack, Docker model artifacts)
    /// into vial volumes in the background, so they mount lazily and dedup with vial pushes
    /// [default: true].
    #[arg(long, env = "VIAL_SEAL_ON_PUSH", value_name = "BOOL")]
    seal_on_push: Option<bool>,

    /// Run background jobs (seals, syncs) in this process [default: true]. With several
    /// replicas, some may serve HTTP only; jobs queued there run on the others.
    #[arg(long, env = "VIAL_RUN_JOBS", value_name = "BOOL")]
    run_jobs: Option<bool>,

    /// How long a job's claim lasts without renewal: a job whose replica crashed is taken over
    /// this long after [default: 30s].
    #[arg(long, env = "VIAL_JOB_LEASE", value_parser = humantime::parse_duration)]
    job_lease: Option<Duration>,

    /// Let sync jobs read sources under this prefix (repeatable), e.g. `hf://`, `s3://models`,
    /// `oci://ghcr.io/acme`, with the registry's own credentials. `[[sync-sources]]` in the
    /// config file also sets endpoints and credentials per source (docs/sync.md).
    #[arg(long, value_name = "PREFIX")]
    sync_source: Vec<String>,

    /// How long a deleted version can be restored (`vial restore`) before it is removed for
    /// good, e.g. 7d, 12h, 0s [default: 7d].
    #[arg(long, env = "VIAL_RETENTION", value_parser = humantime::parse_duration)]
    retention: Option<Duration>,

    /// How often garbage collection reclaims blobs nothing references, e.g. 1h; 0s turns the
    /// schedule off (`vial gc` still runs a pass) [default: 1h].
    #[arg(long, env = "VIAL_GC_INTERVAL", value_parser = humantime::parse_duration)]
    gc_interval: Option<Duration>,

    /// Blobs used this recently (uploaded, linked, or checked for by a push) are never collected
    /// [default: 1h]. See docs/gc.md.
    #[arg(long, env = "VIAL_GC_GRACE", value_parser = humantime::parse_duration)]
    gc_grace: Option<Duration>,

    /// Compaction: a pack whose dead bytes (chunks collected while others in it live) reach this
    /// share of it has its live chunks rewritten into a new pack by the next pass, and goes,
    /// e.g. 10%, 0.25 [default: 10%]. See docs/gc.md.
    #[arg(long, env = "VIAL_GC_COMPACT_THRESHOLD", value_parser = parse_share)]
    gc_compact_threshold: Option<f64>,

    /// The live bytes compaction rewrites in one pass at most, e.g. 8GiB; 0 turns compaction off
    /// [default: 8GiB].
    #[arg(long, env = "VIAL_GC_COMPACT_BYTES", value_parser = crate::mount::parse_size)]
    gc_compact_bytes: Option<u64>,

    /// The largest tree blob the web UI reads into memory to list a version's files or compare
    /// two, e.g. 256MiB; a version with a larger tree is shown from what its index says, and
    /// `vial inspect` and `vial diff` read it whole [default: 64MiB, about 800,000 entries].
    #[arg(long, env = "VIAL_UI_MAX_TREE", value_parser = crate::mount::parse_size)]
    ui_max_tree: Option<u64>,

    /// Another retention window for a namespace, e.g. `weights/prod=30d` (repeatable; the longest
    /// matching namespace wins).
    #[arg(long, value_name = "NAMESPACE=DURATION", value_parser = parse_namespace_retention)]
    namespace_retention: Vec<(String, Duration)>,

    /// The URL clients reach this registry at, e.g. https://registry.example.com (behind a load
    /// balancer or proxy). Authentication challenges send clients to its /token; without it they
    /// are sent to the host name each request was addressed to.
    #[arg(long, env = "VIAL_PUBLIC_URL", value_parser = parse_public_url)]
    public_url: Option<String>,

    /// Accept image indexes whose child manifests are not all in the repository, as partial
    /// multi-platform copies make [default: true]. A vial volume's index must always be complete.
    #[arg(long, env = "VIAL_SPARSE_INDEXES", value_name = "BOOL")]
    sparse_indexes: Option<bool>,

    /// Close a connection whose request headers take longer than this [default: 30s].
    #[arg(long, env = "VIAL_HEADER_TIMEOUT", value_parser = humantime::parse_duration)]
    header_timeout: Option<Duration>,

    /// Cut off a request body that sends nothing for this long; also the allowance before
    /// --min-body-rate applies [default: 60s].
    #[arg(long, env = "VIAL_BODY_TIMEOUT", value_parser = humantime::parse_duration)]
    body_timeout: Option<Duration>,

    /// Cut off a request body that arrives slower than this many bytes per second on average,
    /// once --body-timeout has passed; 0 turns the check off [default: 1024].
    #[arg(long, env = "VIAL_MIN_BODY_RATE", value_name = "BYTES")]
    min_body_rate: Option<u64>,

    /// Upload requests one client address may send at once; more are answered 429 with
    /// Retry-After. 0: no cap [default: 256].
    #[arg(long, env = "VIAL_MAX_UPLOADS_PER_CLIENT", value_name = "N")]
    max_uploads_per_client: Option<usize>,

    /// Serve as a read-only, pull-through cache of this registry (https://HOST[:PORT], or
    /// http:// for plain HTTP): manifests and blobs are fetched from it once, verified, kept on
    /// local disk and served from there. Credentials for it go in the config file's `[upstream]`
    /// table. See docs/cache.md.
    #[arg(long, env = "VIAL_UPSTREAM", value_name = "URL")]
    upstream: Option<String>,

    /// Speak plain HTTP to an --upstream given as a bare HOST[:PORT].
    #[arg(long, env = "VIAL_UPSTREAM_PLAIN_HTTP")]
    upstream_plain_http: bool,

    /// With --upstream: the most blob bytes to keep, e.g. 500GiB; least recently used blobs are
    /// evicted first [default: 10GiB].
    #[arg(long, env = "VIAL_UPSTREAM_CACHE_SIZE", value_parser = crate::mount::parse_size)]
    cache_size: Option<u64>,

    /// With --upstream: where cached blobs live [default: DATA/cache].
    #[arg(long, env = "VIAL_UPSTREAM_CACHE_DIR")]
    cache_dir: Option<PathBuf>,

    /// With --upstream: how long the upstream's answer for a tag is used before asking again;
    /// while the upstream is unreachable the last answer is served [default: 5s].
    #[arg(long, env = "VIAL_UPSTREAM_TAG_TTL", value_parser = humantime::parse_duration)]
    tag_ttl: Option<Duration>,

    /// With --upstream: every replica of this cache, this one included, as they reach each
    /// other (the same list on each), e.g. http://cache-0:5000,http://cache-1:5000. Each digest
    /// then has one owner that fetches it from the upstream; the others get it from the owner.
    #[arg(
        long,
        env = "VIAL_UPSTREAM_PEERS",
        value_delimiter = ',',
        value_name = "URL,URL"
    )]
    peers: Vec<String>,
}

/// `https://host[:port][/path]`, kept without a trailing `/`.
fn parse_public_url(s: &str) -> Result<String, String> {
    let rest = s
        .strip_prefix("https://")
        .or_else(|| s.strip_prefix("http://"))
        .ok_or_else(|| format!("{s:?} is not an http:// or https:// URL"))?;
    if rest.is_empty() || rest.contains(['?', '#', '"', ' ', '\\']) {
        return Err(format!(
            "{s:?}: expected scheme://host[:port][/path], without a query or quotes"
        ));
    }
    Ok(s.trim_end_matches('/').to_owned())
}

fn parse_namespace_retention(s: &str) -> Result<(String, Duration), String> {
    let (ns, d) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAMESPACE=DURATION, got {s:?}"))?;
    let d = humantime::parse_duration(d).map_err(|e| format!("{d:?}: {e}"))?;
    Ok((ns.trim_end_matches('/').to_owned(), d))
}

/// The config file: the same settings as the flags. Unknown keys are an error, so a typo never
/// silently falls back to a default.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    addr: Option<SocketAddr>,
    data: Option<PathBuf>,
    metadata_url: Option<String>,
    blob_url: Option<String>,
    redirect_blobs: Option<bool>,
    max_manifest_size: Option<u64>,
    #[serde(default, with = "humantime_serde_opt")]
    upload_ttl: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    janitor_interval: Option<Duration>,
    tls_cert: Option<PathBuf>,
    tls_key: Option<PathBuf>,
    seal_on_push: Option<bool>,
    run_jobs: Option<bool>,
    #[serde(default, with = "humantime_serde_opt")]
    job_lease: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    retention: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    gc_interval: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    gc_grace: Option<Duration>,
    gc_compact_threshold: Option<String>,
    gc_compact_bytes: Option<String>,
    ui_max_tree: Option<String>,
    /// `[namespace-retention]`: namespace = "duration".
    namespace_retention: Option<std::collections::BTreeMap<String, String>>,
    /// `[[tag-rules]]`: tag protection.
    #[serde(default)]
    tag_rules: Vec<vial_registry::config::TagRule>,
    /// `[[sync-sources]]`: what sync jobs may read, and how.
    #[serde(default)]
    sync_sources: Vec<vial_registry::config::SyncSource>,
    auth: Option<FileAuth>,
    public_url: Option<String>,
    sparse_indexes: Option<bool>,
    #[serde(default, with = "humantime_serde_opt")]
    header_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde_opt")]
    body_timeout: Option<Duration>,
    min_body_rate: Option<u64>,
    max_uploads_per_client: Option<usize>,
    /// `[upstream]`: serve as a cache of another registry.
    upstream: Option<FileUpstream>,
}

/// The `[upstream]` table.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileUpstream {
    url: Option<String>,
    plain_http: Option<bool>,
    username: Option<String>,
    /// As is, `env:NAME` or `file:PATH`.
    password: Option<vial_registry::config::Secret>,
    cache_size: Option<String>,
    cache_dir: Option<PathBuf>,
    #[serde(default, with = "humantime_serde_opt")]
    tag_ttl: Option<Duration>,
    #[serde(default)]
    peers: Vec<String>,
}

/// The `[auth]` table: present means authentication is on.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileAuth {
    service: Option<String>,
    realm: Option<String>,
    htpasswd: Option<PathBuf>,
    token_key_file: Option<PathBuf>,
    #[serde(default, with = "humantime_serde_opt")]
    token_ttl: Option<Duration>,
    #[serde(default)]
    users: Vec<vial_registry::auth::UserEntry>,
    #[serde(default)]
    rules: Vec<vial_registry::auth::Rule>,
}

/// `upload-ttl = "24h"` in the file.
mod humantime_serde_opt {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| humantime::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

impl FileConfig {
    pub fn load(path: &Path) -> anyhow::Result<FileConfig> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read config file {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
    }
}

/// The listen address and the registry configuration, every layer applied.
fn resolve(args: &ServeArgs, file: FileConfig) -> anyhow::Result<(SocketAddr, Config)> {
    let addr = args
        .addr
        .or(file.addr)
        .unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 5000)));
    let data = args
        .data
        .clone()
        .or(file.data)
        .unwrap_or_else(|| PathBuf::from("./vial-data"));
    let mut config = Config::embedded(&data);
    config.max_manifest_size = args
        .max_manifest_size
        .or(file.max_manifest_size)
        .unwrap_or(DEFAULT_MAX_MANIFEST_SIZE);
    if let Some(ttl) = args.upload_ttl.or(file.upload_ttl) {
        config.upload_ttl = ttl;
    }
    if let Some(every) = args.janitor_interval.or(file.janitor_interval) {
        anyhow::ensure!(
            !every.is_zero(),
            "--janitor-interval must be longer than 0s"
        );
        config.janitor_interval = every;
    }
    if let Some(url) = args.metadata_url.as_ref().or(file.metadata_url.as_ref()) {
        config.metadata = MetadataBackend::from_url(url)?;
    }
    if let Some(url) = args.blob_url.as_ref().or(file.blob_url.as_ref()) {
        config.blobs = BlobBackend::from_url(url)?;
    }
    config.redirect_blobs = args.redirect_blobs || file.redirect_blobs.unwrap_or(false);
    config.seal_on_push = args.seal_on_push.or(file.seal_on_push).unwrap_or(true);
    config.run_jobs = args.run_jobs.or(file.run_jobs).unwrap_or(true);
    if let Some(lease) = args.job_lease.or(file.job_lease) {
        anyhow::ensure!(
            lease >= Duration::from_secs(1),
            "--job-lease must be at least 1s"
        );
        config.job_lease = lease;
    }
    if let Some(r) = args.retention.or(file.retention) {
        config.retention = r;
    }
    if let Some(every) = args.gc_interval.or(file.gc_interval) {
        config.gc_interval = every;
    }
    if let Some(grace) = args.gc_grace.or(file.gc_grace) {
        config.gc_grace = grace;
    }
    match (args.gc_compact_threshold, &file.gc_compact_threshold) {
        (Some(share), _) => config.gc_compact_threshold = share,
        (None, Some(text)) => {
            config.gc_compact_threshold = parse_share(text)
                .map_err(anyhow::Error::msg)
                .context("gc-compact-threshold in the config file")?
        }
        (None, None) => {}
    }
    if let Some(bytes) = size_setting(args.ui_max_tree, &file.ui_max_tree, "ui-max-tree")? {
        config.ui_max_tree = bytes;
    }
    if let Some(bytes) = size_setting(
        args.gc_compact_bytes,
        &file.gc_compact_bytes,
        "gc-compact-bytes",
    )? {
        config.gc_compact_bytes = bytes;
    }
    for (ns, d) in file.namespace_retention.iter().flatten() {
        let d = humantime::parse_duration(d)
            .with_context(|| format!("namespace-retention for {ns:?}: {d:?}"))?;
        config
            .namespace_retention
            .push((ns.trim_end_matches('/').to_owned(), d));
    }
    config.tag_rules = file.tag_rules;
    config.sync_sources = file.sync_sources;
    for prefix in &args.sync_source {
        if config.sync_source_for(prefix).map(|s| &s.prefix) != Some(prefix) {
            config.sync_sources.push(SyncSource {
                prefix: prefix.clone(),
                ..SyncSource::default()
            });
        }
    }
    // Flags come last, so they win over the file for the same namespace.
    for (ns, d) in &args.namespace_retention {
        config.namespace_retention.retain(|(n, _)| n != ns);
        config.namespace_retention.push((ns.clone(), *d));
    }
    if let (Some(cert), Some(key)) = (
        args.tls_cert.clone().or(file.tls_cert),
        args.tls_key.clone().or(file.tls_key),
    ) {
        config.tls = Some(TlsFiles { cert, key });
    }
    if let Some(url) = args.public_url.as_ref().or(file.public_url.as_ref()) {
        config.public_url =
            Some(parse_public_url(url).map_err(|e| anyhow::anyhow!("public-url: {e}"))?);
    }
    config.sparse_indexes = args.sparse_indexes.or(file.sparse_indexes).unwrap_or(true);
    let limits = &mut config.limits;
    if let Some(t) = args.header_timeout.or(file.header_timeout) {
        anyhow::ensure!(!t.is_zero(), "--header-timeout must be longer than 0s");
        limits.header_timeout = t;
    }
    if let Some(t) = args.body_timeout.or(file.body_timeout) {
        anyhow::ensure!(!t.is_zero(), "--body-timeout must be longer than 0s");
        limits.body_idle_timeout = t;
    }
    if let Some(rate) = args.min_body_rate.or(file.min_body_rate) {
        limits.min_body_rate = rate;
    }
    if let Some(n) = args.max_uploads_per_client.or(file.max_uploads_per_client) {
        limits.max_uploads_per_client = n;
    }
    config.upstream = upstream(args, file.upstream, &data)?;
    if file.auth.is_some() || args.htpasswd.is_some() {
        let from_file = file.auth.unwrap_or_default();
        let defaults = AuthSettings::default();
        config.auth = Some(AuthSettings {
            service: from_file.service.unwrap_or(defaults.service),
            realm: from_file.realm,
            htpasswd: args.htpasswd.clone().or(from_file.htpasswd),
            users: from_file.users,
            rules: from_file.rules,
            token_key_file: args.token_key_file.clone().or(from_file.token_key_file),
            token_ttl: from_file.token_ttl.unwrap_or(defaults.token_ttl),
        });
    }
    Ok((addr, config))
}

/// The cache settings, when `--upstream` or `[upstream] url` is set.
fn upstream(
    args: &ServeArgs,
    file: Option<FileUpstream>,
    data: &Path,
) -> anyhow::Result<Option<UpstreamConfig>> {
    let file = file.unwrap_or_default();
    let Some(url) = args.upstream.clone().or(file.url) else {
        anyhow::ensure!(
            args.cache_size.is_none()
                && args.cache_dir.is_none()
                && args.tag_ttl.is_none()
                && args.peers.is_empty(),
            "--cache-size, --cache-dir, --tag-ttl and --peers go with --upstream"
        );
        return Ok(None);
    };
    let url = url.trim_end_matches('/').to_owned();
    anyhow::ensure!(
        !url.is_empty() && !url.contains(['?', '#', ' ']),
        "--upstream {url:?}: expected https://HOST[:PORT], http://HOST[:PORT] or HOST[:PORT]"
    );
    let size = match (args.cache_size, file.cache_size) {
        (Some(size), _) => size,
        (None, Some(text)) => crate::mount::parse_size(&text)
            .map_err(|e| anyhow::anyhow!("[upstream] cache-size: {e}"))?,
        (None, None) => 10 << 30,
    };
    Ok(Some(UpstreamConfig {
        url,
        plain_http: args.upstream_plain_http || file.plain_http.unwrap_or(false),
        username: file.username,
        password: file.password,
        dir: args
            .cache_dir
            .clone()
            .or(file.cache_dir)
            .unwrap_or_else(|| data.join("cache")),
        size,
        tag_ttl: args
            .tag_ttl
            .or(file.tag_ttl)
            .unwrap_or(Duration::from_secs(5)),
        peers: if args.peers.is_empty() {
            file.peers
        } else {
            args.peers.clone()
        }
        .into_iter()
        .map(|p| parse_public_url(&p).map_err(|e| anyhow::anyhow!("--peers: {e}")))
        .collect::<anyhow::Result<_>>()?,
    }))
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let file = match &args.config {
        Some(path) => FileConfig::load(path)?,
        None => FileConfig::default(),
    };
    let (addr, config) = resolve(&args, file)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("could not listen on {addr}"))?;
        let local = listener.local_addr().context("listener has no address")?;
        // One line on stdout with the bound address, so scripts and tests that pass port 0 can find
        // the server without polling.
        #[allow(clippy::print_stdout)]
        {
            let scheme = if config.tls.is_some() {
                "https"
            } else {
                "http"
            };
            println!("vial registry listening on {scheme}://{local}");
        }
        tracing::info!(metadata = ?config.metadata, blobs = ?config.blobs, "opening storage");
        vial_registry::serve(config, listener, shutdown_signal())
            .await
            .context("registry failed")
    })
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        () = term => tracing::info!("SIGTERM received, shutting down"),
    }
}

/// A size from the command line (or its environment variable), else from the config file's
/// `key`, else none.
fn size_setting(
    flag: Option<u64>,
    file: &Option<String>,
    key: &str,
) -> anyhow::Result<Option<u64>> {
    match (flag, file) {
        (Some(bytes), _) => Ok(Some(bytes)),
        (None, Some(text)) => crate::mount::parse_size(text)
            .map(Some)
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("{key} in the config file")),
        (None, None) => Ok(None),
    }
}

/// A share of a whole: `10%` or `0.1`, from 0 to 1.
fn parse_share(s: &str) -> Result<f64, String> {
    let t = s.trim();
    let share = match t.strip_suffix('%') {
        Some(percent) => percent.trim().parse::<f64>().map(|p| p / 100.0),
        None => t.parse::<f64>(),
    }
    .map_err(|_| format!("expected a share such as 10% or 0.1, not {s:?}"))?;
    if !(0.0..=1.0).contains(&share) {
        return Err(format!("{s:?} is not between 0% and 100%"));
    }
    Ok(share)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_comes_from_the_flag_then_the_config_file() {
        let text = Some("256MiB".to_owned());
        assert_eq!(size_setting(Some(7), &text, "k").unwrap(), Some(7));
        assert_eq!(size_setting(None, &text, "k").unwrap(), Some(256 << 20));
        assert_eq!(size_setting(None, &None, "k").unwrap(), None);
        let bad = size_setting(None, &Some("lots".to_owned()), "ui-max-tree").unwrap_err();
        assert!(
            format!("{bad:#}").contains("ui-max-tree in the config file"),
            "{bad:#}"
        );
    }

    #[test]
    fn a_share_is_a_percentage_or_a_fraction() {
        assert_eq!(parse_share("10%"), Ok(0.1));
        assert_eq!(parse_share("0.25"), Ok(0.25));
        assert_eq!(parse_share(" 100 % "), Ok(1.0));
        assert!(parse_share("150%").is_err());
        assert!(parse_share("-0.1").is_err());
        assert!(parse_share("ten").is_err());
    }
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        serve: ServeArgs,
    }

    #[test]
    fn the_documented_example_config_parses() {
        let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/vial.example.toml");
        let file = FileConfig::load(&example).unwrap();
        assert_eq!(file.addr, Some(SocketAddr::from(([0, 0, 0, 0], 5000))));
        assert_eq!(file.upload_ttl, Some(Duration::from_secs(12 * 3600)));
        assert!(file
            .metadata_url
            .as_deref()
            .is_some_and(|u| u.starts_with("postgres://")));
        let auth = file
            .auth
            .as_ref()
            .expect("the example shows authentication");
        assert!(!auth.rules.is_empty());
        let (_, config) = resolve(&Cli::parse_from(["x"]).serve, file).unwrap();
        assert!(matches!(config.blobs, BlobBackend::S3(_)));
        assert_eq!(config.sync_sources.len(), 3);
        assert!(config.sync_source_for("hf://Qwen/Qwen3-8B").is_some());
        assert!(config.sync_source_for("s3://elsewhere/x").is_none());
        assert_eq!(config.job_lease, Duration::from_secs(30));
        let auth = config.auth.expect("auth on");
        assert!(!format!("{auth:?}").contains("$2y$"), "hashes never print");
    }

    #[test]
    fn unknown_keys_are_refused() {
        let err = toml::from_str::<FileConfig>("adr = \"0.0.0.0:5000\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("adr"), "{err}");
    }

    #[test]
    fn flags_override_the_file_which_overrides_defaults() {
        let file: FileConfig = toml::from_str(
            "addr = \"0.0.0.0:6000\"\ndata = \"/srv/from-file\"\nmax-manifest-size = 1000",
        )
        .unwrap();
        let cli = Cli::parse_from(["x", "--addr", "127.0.0.1:7000"]);
        let (addr, config) = resolve(&cli.serve, file).unwrap();
        assert_eq!(addr.port(), 7000, "the flag wins");
        assert_eq!(
            config.max_manifest_size, 1000,
            "the file wins over the default"
        );
        assert_eq!(
            config.blobs,
            BlobBackend::Filesystem {
                root: PathBuf::from("/srv/from-file")
            }
        );
        let (addr, config) = resolve(&Cli::parse_from(["x"]).serve, FileConfig::default()).unwrap();
        assert_eq!(addr.port(), 5000);
        assert_eq!(config.max_manifest_size, DEFAULT_MAX_MANIFEST_SIZE);
    }
}
