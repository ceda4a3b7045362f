//! The in-cluster cache tier: `vial serve --upstream URL` is a pull-through cache of another
//! registry, an ordinary read-only registry to its own clients.
//!
//! Manifests and blobs are fetched from the upstream the first time they are asked for, verified
//! against their digests, kept on local disk ([`store`]) and served from there; concurrent
//! requests for one digest share one fetch ([`flight`]). Tags are asked of the upstream at most
//! once per `tag-ttl`, and the last answer is served while the upstream is unreachable. A blob is
//! served under a repository only once the upstream has shown that the repository holds it: a
//! manifest of that repository fetched through the cache lists it, or the upstream answered a
//! HEAD for it there. What the cache learned is kept in `<dir>/journal` so it survives restarts.

pub(crate) mod api;
mod flight;
mod metrics;
pub(crate) mod peers;
mod store;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use vial_client::{ClientError, Registry, RegistryOptions};
use vial_core::manifest::summarize;
use vial_core::{Digest, RepoName, Target};

use crate::config::UpstreamConfig;
use crate::error::{ApiError, ErrorCode};
pub(crate) use flight::{read_stored, Flight};
use flight::{Failure, Feed, Pending};
pub(crate) use metrics::CacheMetrics;
use store::Store;

#[derive(Debug)]
pub struct Cache {
    upstream: Registry,
    /// The upstream as configured, for messages.
    pub(crate) upstream_url: String,
    store: Arc<Store>,
    flights: Mutex<HashMap<Digest, Arc<Flight>>>,
    known: Mutex<Known>,
    tags: Mutex<HashMap<(RepoName, String), TagAnswer>>,
    journal: Mutex<std::fs::File>,
    tag_ttl: Duration,
    pub(crate) metrics: CacheMetrics,
    /// Requests that would ask the upstream the same question (a manifest, a tag, a blob's
    /// presence) take turns: the first asks, the others then find the answer.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// The other replicas of this cache, if any.
    pub(crate) peers: peers::Peers,
}

/// A turn at asking the upstream one question; the next waiter's when dropped.
struct Turn<'a> {
    cache: &'a Cache,
    key: String,
    lock: Arc<tokio::sync::Mutex<()>>,
    _held: tokio::sync::OwnedMutexGuard<()>,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        let mut turns = self.cache.turns.lock().unwrap_or_else(|e| e.into_inner());
        // Nobody else holds or waits for it (only the map and this turn do): forget it.
        if Arc::strong_count(&self.lock) == 2 {
            turns.remove(&self.key);
        }
    }
}

/// What the upstream has shown the cache.
#[derive(Debug, Default)]
struct Known {
    /// Per repository: the blobs and manifests it holds, with their sizes.
    held: HashMap<RepoName, HashMap<Digest, u64>>,
    /// The media type of every manifest seen.
    media_types: HashMap<Digest, String>,
}

#[derive(Debug, Clone)]
struct TagAnswer {
    digest: Digest,
    asked: Instant,
}

/// One line of the journal.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
enum Entry {
    /// A manifest the repository holds, with its media type.
    Manifest {
        repo: String,
        digest: Digest,
        media_type: String,
    },
    /// A blob the upstream confirmed in the repository, with its size.
    Blob {
        repo: String,
        digest: Digest,
        size: u64,
    },
    /// The last answer for a tag.
    Tag {
        repo: String,
        tag: String,
        digest: Digest,
    },
}

/// A blob's bytes as the cache can hand them out.
pub(crate) enum Claim {
    Stored(store::Stored),
    Follow(Arc<Flight>),
}

impl Cache {
    /// Opens the cache directory and replays its journal.
    pub fn open(config: &UpstreamConfig) -> Result<Cache, String> {
        let credentials = match (&config.username, &config.password) {
            (Some(username), Some(password)) => Some(vial_client::auth::Credentials {
                username: username.clone(),
                password: password
                    .reveal()
                    .map_err(|e| format!("[upstream] password: {e}"))?,
            }),
            (None, None) => None,
            _ => return Err("[upstream] names only one of username and password".into()),
        };
        let (host, plain_http) = config.host();
        let upstream = Registry::new(
            &host,
            &RegistryOptions {
                plain_http,
                attempts: 2,
                // A large layer from a slow upstream takes its time; a dead one fails to connect.
                timeout: Duration::from_secs(6 * 3600),
                credentials,
                mirrors: Vec::new(),
            },
        )
        .map_err(|e| format!("upstream {}: {e}", config.url))?;
        let store = Store::open(&config.dir, config.size)
            .map_err(|e| format!("cache directory {}: {e}", config.dir.display()))?;
        let journal_path = config.dir.join("journal");
        let replay = std::fs::read_to_string(&journal_path).unwrap_or_default();
        let journal = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&journal_path)
            .map_err(|e| format!("{}: {e}", journal_path.display()))?;
        let cache = Cache {
            upstream,
            upstream_url: config.url.clone(),
            store: Arc::new(store),
            flights: Mutex::default(),
            known: Mutex::default(),
            tags: Mutex::default(),
            journal: Mutex::new(journal),
            tag_ttl: config.tag_ttl,
            metrics: CacheMetrics::default(),
            turns: Mutex::default(),
            peers: peers::Peers::new(&config.peers)?,
        };
        cache.replay(&replay);
        Ok(cache)
    }

    fn replay(&self, journal: &str) {
        // Long ago is fresh enough for a stale answer, and never for a fresh one.
        let long_ago = Instant::now()
            .checked_sub(self.tag_ttl + Duration::from_secs(1))
            .unwrap_or_else(Instant::now);
        for line in journal.lines() {
            let Ok(entry) = serde_json::from_str::<Entry>(line) else {
                continue; // a line torn by a crash
            };
            match entry {
                Entry::Manifest {
                    repo,
                    digest,
                    media_type,
                } => {
                    let Ok(repo) = RepoName::parse(&repo) else {
                        continue;
                    };
                    match self.read_manifest(&digest) {
                        Some(bytes) => self.learn_manifest(&repo, &digest, &media_type, &bytes),
                        None => {
                            // Evicted: the repository still holds it, its blobs are unknown.
                            let mut known = self.lock_known();
                            known.media_types.insert(digest.clone(), media_type);
                            known
                                .held
                                .entry(repo)
                                .or_default()
                                .entry(digest)
                                .or_insert(0);
                        }
                    }
                }
                Entry::Blob { repo, digest, size } => {
                    if let Ok(repo) = RepoName::parse(&repo) {
                        self.learn_blob(&repo, &digest, size);
                    }
                }
                Entry::Tag { repo, tag, digest } => {
                    if let Ok(repo) = RepoName::parse(&repo) {
                        self.lock_tags().insert(
                            (repo, tag),
                            TagAnswer {
                                digest,
                                asked: long_ago,
                            },
                        );
                    }
                }
            }
        }
    }

    fn lock_known(&self) -> std::sync::MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_tags(&self) -> std::sync::MutexGuard<'_, HashMap<(RepoName, String), TagAnswer>> {
        self.tags.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_flights(&self) -> std::sync::MutexGuard<'_, HashMap<Digest, Arc<Flight>>> {
        self.flights.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for this request's turn at `key`.
    async fn turn(&self, key: String) -> Turn<'_> {
        let lock = {
            let mut turns = self.turns.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(turns.entry(key.clone()).or_default())
        };
        let held = Arc::clone(&lock).lock_owned().await;
        Turn {
            cache: self,
            key,
            lock,
            _held: held,
        }
    }

    fn record(&self, entry: &Entry) {
        let Ok(mut line) = serde_json::to_vec(entry) else {
            return;
        };
        line.push(b'\n');
        let mut journal = self.journal.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = journal.write_all(&line) {
            tracing::warn!(error = %e, "could not write the cache journal");
        }
    }

    /// The size of `digest` in `repo`, if the upstream has shown that the repository holds it.
    fn held(&self, repo: &RepoName, digest: &Digest) -> Option<u64> {
        self.lock_known()
            .held
            .get(repo)
            .and_then(|h| h.get(digest))
            .copied()
    }

    fn learn_blob(&self, repo: &RepoName, digest: &Digest, size: u64) {
        self.lock_known()
            .held
            .entry(repo.clone())
            .or_default()
            .insert(digest.clone(), size);
    }

    /// Records a manifest of `repo` and everything it references as held there.
    fn learn_manifest(&self, repo: &RepoName, digest: &Digest, media_type: &str, bytes: &[u8]) {
        let summary = summarize(Some(media_type), bytes).ok();
        let mut known = self.lock_known();
        known
            .media_types
            .insert(digest.clone(), media_type.to_owned());
        let held = known.held.entry(repo.clone()).or_default();
        held.insert(digest.clone(), bytes.len() as u64);
        for r in summary
            .iter()
            .flat_map(|s| s.blobs.iter().chain(&s.children).chain(&s.subject))
        {
            held.entry(r.digest.clone()).or_insert(r.size);
        }
    }

    /// A stored manifest's bytes. Blocking (small files).
    fn read_manifest(&self, digest: &Digest) -> Option<Bytes> {
        use std::io::Read;
        let mut stored = self.store.open_blob(digest)?;
        let mut bytes = Vec::with_capacity(stored.size as usize);
        stored.file.read_to_end(&mut bytes).ok()?;
        Some(Bytes::from(bytes))
    }

    fn write_manifest(&self, digest: &Digest, bytes: &[u8]) -> std::io::Result<()> {
        if self.store.size(digest).is_some() {
            return Ok(());
        }
        let (tmp, mut file) = self.store.temp_file()?;
        file.write_all(bytes)?;
        drop(file);
        self.store.commit(&tmp, digest, bytes.len() as u64, false)
    }

    /// A manifest of `repo` by tag or digest: its bytes, media type and digest.
    pub(crate) async fn manifest(
        self: &Arc<Self>,
        repo: &RepoName,
        target: &Target,
    ) -> Result<(Bytes, String, Digest), ApiError> {
        let digest = match target {
            Target::Digest(d) => d.clone(),
            Target::Tag(tag) => match self.resolve_tag(repo, tag.as_str()).await? {
                Resolved::Fetched(bytes, media_type, digest) => {
                    return Ok((bytes, media_type, digest))
                }
                Resolved::Digest(d) => d,
            },
        };
        let _turn = self.turn(format!("manifest {repo}@{digest}")).await;
        if self.held(repo, &digest).is_some() {
            let media_type = self.lock_known().media_types.get(&digest).cloned();
            if let Some(media_type) = media_type {
                let this = Arc::clone(self);
                let d = digest.clone();
                let stored = tokio::task::spawn_blocking(move || this.read_manifest(&d))
                    .await
                    .ok()
                    .flatten();
                if let Some(bytes) = stored {
                    self.metrics.hit();
                    return Ok((bytes, media_type, digest));
                }
            }
        }
        let target = Target::Digest(digest.clone());
        match self.upstream.get_manifest(repo, &target).await {
            Ok(Some(m)) => {
                self.metrics.miss();
                self.keep_manifest(repo, &m).await;
                Ok((m.bytes, m.media_type, m.digest))
            }
            Ok(None) => Err(manifest_unknown(repo, &target)),
            Err(e) => Err(self.upstream_error(e, &format!("manifest {digest} of {repo}"))),
        }
    }

    /// Stores a manifest fetched from the upstream and learns what it references.
    async fn keep_manifest(self: &Arc<Self>, repo: &RepoName, m: &vial_client::Manifest) {
        self.metrics.add_upstream_bytes(m.bytes.len() as u64);
        let first = self.held(repo, &m.digest).is_none()
            || !self.lock_known().media_types.contains_key(&m.digest);
        self.learn_manifest(repo, &m.digest, &m.media_type, &m.bytes);
        if first {
            self.record(&Entry::Manifest {
                repo: repo.to_string(),
                digest: m.digest.clone(),
                media_type: m.media_type.clone(),
            });
        }
        let this = Arc::clone(self);
        let (digest, bytes) = (m.digest.clone(), m.bytes.clone());
        let written = tokio::task::spawn_blocking(move || this.write_manifest(&digest, &bytes))
            .await
            .map_err(std::io::Error::other)
            .and_then(|r| r);
        if let Err(e) = written {
            tracing::warn!(digest = %m.digest, error = %e, "could not keep a manifest in the cache");
        }
    }

    /// What `tag` names now: asked of the upstream at most once per tag TTL; while the upstream
    /// is unreachable, the last answer.
    async fn resolve_tag(
        self: &Arc<Self>,
        repo: &RepoName,
        tag: &str,
    ) -> Result<Resolved, ApiError> {
        let _turn = self.turn(format!("tag {repo}:{tag}")).await;
        let key = (repo.clone(), tag.to_owned());
        let last = self.lock_tags().get(&key).cloned();
        if let Some(answer) = last.as_ref().filter(|a| a.asked.elapsed() < self.tag_ttl) {
            return Ok(Resolved::Digest(answer.digest.clone()));
        }
        let target = Target::Tag(
            vial_core::Tag::parse(tag)
                .map_err(|e| ApiError::bad_request(ErrorCode::TagInvalid, e.to_string()))?,
        );
        match self.upstream.get_manifest(repo, &target).await {
            Ok(Some(m)) => {
                self.metrics.miss();
                if last.as_ref().map(|a| &a.digest) != Some(&m.digest) {
                    self.record(&Entry::Tag {
                        repo: repo.to_string(),
                        tag: tag.to_owned(),
                        digest: m.digest.clone(),
                    });
                }
                self.lock_tags().insert(
                    key,
                    TagAnswer {
                        digest: m.digest.clone(),
                        asked: Instant::now(),
                    },
                );
                self.keep_manifest(repo, &m).await;
                Ok(Resolved::Fetched(m.bytes, m.media_type, m.digest))
            }
            Ok(None) => {
                self.lock_tags().remove(&key);
                Err(manifest_unknown(repo, &target))
            }
            Err(e) if e.is_transient() => match last {
                Some(answer) => {
                    self.metrics.stale();
                    tracing::warn!(%repo, tag, digest = %answer.digest, error = %vial_core::error_chain(&e), "upstream unreachable: serving the last known answer for the tag");
                    Ok(Resolved::Digest(answer.digest))
                }
                None => Err(self.upstream_error(e, &format!("tag {tag} of {repo}"))),
            },
            Err(e) => Err(self.upstream_error(e, &format!("tag {tag} of {repo}"))),
        }
    }

    /// The size of `digest` in `repo`: known from a manifest, or confirmed by the upstream now.
    /// `None` when the upstream says the repository does not hold it.
    pub(crate) async fn blob_size(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, ApiError> {
        if let Some(size) = self.held(repo, digest).filter(|s| *s > 0) {
            return Ok(Some(size));
        }
        let _turn = self.turn(format!("blob {repo}@{digest}")).await;
        if let Some(size) = self.held(repo, digest).filter(|s| *s > 0) {
            return Ok(Some(size));
        }
        match self.upstream.blob_size(repo, digest).await {
            Ok(Some(size)) => {
                self.learn_blob(repo, digest, size);
                self.record(&Entry::Blob {
                    repo: repo.to_string(),
                    digest: digest.clone(),
                    size,
                });
                Ok(Some(size))
            }
            Ok(None) => Ok(None),
            Err(e) => Err(self.upstream_error(e, &format!("blob {digest} in {repo}"))),
        }
    }

    /// Hands out each of `wanted` (digest, size) from the disk or from a fill in progress, and
    /// starts fetches for all the others, in order: one from each owning peer for what it owns,
    /// one from the upstream for the rest.
    pub(crate) async fn claim(
        self: &Arc<Self>,
        repo: &RepoName,
        wanted: Vec<(Digest, u64)>,
        via: &Via,
    ) -> Result<Vec<Claim>, ApiError> {
        let this = Arc::clone(self);
        let (claims, leads) = tokio::task::spawn_blocking(move || this.claim_blocking(&wanted))
            .await
            .map_err(|e| ApiError::internal(e.to_string()))?
            .map_err(|e| ApiError::internal(format!("cache disk: {e}")))?;
        if leads.is_empty() {
            return Ok(claims);
        }
        if via.hop || self.peers.is_empty() {
            self.fetch(repo.clone(), leads, Vec::new(), None);
            return Ok(claims);
        }
        // Grouped by the peers to ask first, in the order asked.
        let mut groups: Vec<(Vec<usize>, Vec<Pending>)> = Vec::new();
        for lead in leads {
            let route = self.peers.route(&lead.digest);
            match groups.iter_mut().find(|(r, _)| r.first() == route.first()) {
                Some((_, group)) => group.push(lead),
                None => groups.push((route, vec![lead])),
            }
        }
        for (route, group) in groups {
            self.fetch(repo.clone(), group, route, via.authorization.clone());
        }
        Ok(claims)
    }

    fn claim_blocking(
        &self,
        wanted: &[(Digest, u64)],
    ) -> std::io::Result<(Vec<Claim>, Vec<Pending>)> {
        let mut claims = Vec::with_capacity(wanted.len());
        let mut leads = Vec::new();
        // Holding the flights while looking at the disk: a fill moves its blob into the store
        // before it leaves the flights, so a blob is always found in one or the other.
        let mut flights = self.lock_flights();
        for (digest, size) in wanted {
            if let Some(flight) = flights.get(digest) {
                self.metrics.join();
                claims.push(Claim::Follow(Arc::clone(flight)));
            } else if let Some(stored) = self.store.open_blob(digest) {
                self.metrics.hit();
                claims.push(Claim::Stored(stored));
            } else {
                self.metrics.miss();
                let pending = Pending::new(&self.store, digest.clone(), Some(*size))?;
                flights.insert(digest.clone(), Arc::clone(&pending.flight));
                claims.push(Claim::Follow(Arc::clone(&pending.flight)));
                leads.push(pending);
            }
        }
        Ok((claims, leads))
    }

    /// Fetches `leads` on a task of its own, so a fill finishes for the others even if the
    /// request that started it goes away: from the first peer of `route` that answers, else from
    /// the upstream. Blobs that came from a peer are kept as the first to evict (their owner
    /// keeps them).
    fn fetch(
        self: &Arc<Self>,
        repo: RepoName,
        leads: Vec<Pending>,
        route: Vec<usize>,
        authorization: Option<String>,
    ) {
        let digests: Vec<Digest> = leads.iter().map(|p| p.digest.clone()).collect();
        let weak = Arc::downgrade(self);
        let settled: flight::Settled = Box::new(move |digest, _| {
            if let Some(cache) = weak.upgrade() {
                cache.lock_flights().remove(digest);
            }
        });
        let cold = !route.is_empty();
        let feed = flight::spawn_writer(Arc::clone(&self.store), leads, cold, settled);
        let this = Arc::clone(self);
        tokio::spawn(async move {
            let outcome = this
                .pump(&repo, &digests, &feed, &route, authorization.as_deref())
                .await;
            let last = match outcome {
                Ok(()) => Feed::End,
                Err(f) => {
                    tracing::warn!(%repo, blobs = digests.len(), error = %f.message, "cache fill failed");
                    Feed::Abort(f)
                }
            };
            let _ = feed.send(last).await;
        });
    }

    /// Sends the bytes of `digests`, in order, to the writer: from the first peer of `route`
    /// that answers, else from the upstream.
    async fn pump(
        &self,
        repo: &RepoName,
        digests: &[Digest],
        feed: &tokio::sync::mpsc::Sender<Feed>,
        route: &[usize],
        authorization: Option<&str>,
    ) -> Result<(), Failure> {
        for &peer in route {
            match self.peers.fetch(peer, repo, digests, authorization).await {
                Ok(stream) => {
                    let stream = stream.map(|b| {
                        b.inspect(|b| self.metrics.add_peer_bytes(b.len() as u64))
                            .map_err(|e| Failure {
                                message: format!("peer cache: {e}").into(),
                                not_found: false,
                            })
                    });
                    return self.forward_into(Box::pin(stream), feed).await;
                }
                Err(peers::PeerError::Myself) => {
                    self.peers.is_me(peer);
                    break;
                }
                Err(peers::PeerError::Unreachable(why)) => {
                    tracing::warn!(peer = %self.peers.url(peer), %why, "peer cache did not answer; asking the next");
                }
            }
        }
        let upstream = |e: ClientError| failure_of(&e);
        if digests.len() > 1 {
            if let Some(stream) = self
                .upstream
                .read_chunks(repo, digests)
                .await
                .map_err(upstream)?
            {
                return self
                    .forward_into(counted(&self.metrics, stream), feed)
                    .await;
            }
        }
        // One blob, or an upstream without bulk reads: one download after the other.
        for digest in digests {
            let stream = self
                .upstream
                .get_blob_stream(repo, digest)
                .await
                .map_err(upstream)?;
            self.forward_into(counted(&self.metrics, Box::pin(stream)), feed)
                .await?;
        }
        Ok(())
    }

    async fn forward_into(
        &self,
        mut stream: impl futures_util::Stream<Item = Result<Bytes, Failure>> + Unpin,
        feed: &tokio::sync::mpsc::Sender<Feed>,
    ) -> Result<(), Failure> {
        while let Some(bytes) = stream.next().await {
            if feed.send(Feed::Bytes(bytes?)).await.is_err() {
                break; // the writer gave up; it has told the followers why
            }
        }
        Ok(())
    }

    /// A read request passed to the upstream as is.
    pub(crate) async fn forward(
        &self,
        method: reqwest::Method,
        path_and_query: &str,
        scope: &str,
        content_type: Option<&str>,
        body: Bytes,
    ) -> Result<reqwest::Response, ApiError> {
        self.upstream
            .forward(method, path_and_query, scope, content_type, body)
            .await
            .map_err(|e| self.upstream_error(e, "forwarded request"))
    }

    /// Flushes the cache's files; called when the server stops.
    pub fn close(&self) {
        if let Err(e) = self.journal.lock().map(|j| j.sync_all()) {
            tracing::warn!(error = %e, "could not sync the cache journal");
        }
        self.store.close();
    }

    pub(crate) fn render_metrics(&self, out: &mut String) {
        self.metrics
            .render(out, self.store.usage(), self.store.limit());
    }

    /// An upstream failure as the cache's client sees it.
    fn upstream_error(&self, e: ClientError, what: &str) -> ApiError {
        match e {
            ClientError::NotFound(_) => ApiError::not_found(
                ErrorCode::BlobUnknown,
                format!("{what} is not at the upstream"),
            ),
            ClientError::RepositoryNotFound(_) => ApiError::not_found(
                ErrorCode::NameUnknown,
                format!(
                    "{what}: the upstream {} has no such repository",
                    self.upstream_url
                ),
            ),
            e if e.is_transient() => ApiError::new(
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                format!(
                    "the upstream {} is unreachable and the cache does not hold {what}: {}",
                    self.upstream_url,
                    vial_core::error_chain(&e)
                ),
            ),
            e => ApiError::new(
                axum::http::StatusCode::BAD_GATEWAY,
                ErrorCode::Unavailable,
                format!(
                    "the upstream {} refused {what}: {}",
                    self.upstream_url,
                    vial_core::error_chain(&e)
                ),
            ),
        }
    }
}

/// Bytes from the upstream, counted.
fn counted<'a>(
    metrics: &'a CacheMetrics,
    stream: impl futures_util::Stream<Item = Result<Bytes, ClientError>> + Unpin + 'a,
) -> impl futures_util::Stream<Item = Result<Bytes, Failure>> + Unpin + 'a {
    stream.map(move |b| {
        b.inspect(|b| metrics.add_upstream_bytes(b.len() as u64))
            .map_err(|e| failure_of(&e))
    })
}

/// How a request reached the cache: for the peers it is sent on to.
#[derive(Debug, Default)]
pub(crate) struct Via {
    /// The client's credentials, passed to the owning peer.
    pub authorization: Option<String>,
    /// Sent on by another replica: served from here or the upstream, never sent on again.
    pub hop: bool,
}

enum Resolved {
    /// The tag was just asked of the upstream: here is its manifest.
    Fetched(Bytes, String, Digest),
    /// A recent (or, with the upstream unreachable, the last) answer.
    Digest(Digest),
}

fn manifest_unknown(repo: &RepoName, target: &Target) -> ApiError {
    let reference = match target {
        Target::Tag(t) => t.as_str(),
        Target::Digest(d) => d.as_str(),
    };
    ApiError::not_found(
        ErrorCode::ManifestUnknown,
        format!("{repo} has no manifest {reference} at the upstream"),
    )
}

fn failure_of(e: &ClientError) -> Failure {
    Failure {
        message: vial_core::error_chain(e).into(),
        not_found: matches!(
            e,
            ClientError::NotFound(_) | ClientError::RepositoryNotFound(_)
        ),
    }
}
