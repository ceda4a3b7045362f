//! Fetching chunks into the node cache: one download per chunk however many readers want it,
//! a bounded number in flight, every one verified before it is stored.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use vial_client::{ClientError, Registry};
use vial_core::{Digest, RepoName};

use crate::cache::{CacheError, ChunkCache};
use crate::stats::Stats;

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("fetching chunk {digest}")]
    Registry {
        digest: Digest,
        #[source]
        source: ClientError,
    },
    #[error("chunk {digest} did not arrive within {timeout:?}")]
    Timeout { digest: Digest, timeout: Duration },
    #[error("chunk {digest} arrived with digest {actual}: refusing to serve it")]
    Mismatch { digest: Digest, actual: Digest },
    #[error("chunk {digest} is {actual} bytes, the tree says {expected}")]
    Size {
        digest: Digest,
        expected: u64,
        actual: u64,
    },
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("background task failed: {0}")]
    Task(String),
}

#[derive(Debug)]
pub struct Fetcher {
    registry: Registry,
    repo: RepoName,
    cache: Arc<ChunkCache>,
    stats: Arc<Stats>,
    inflight: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
    network: Semaphore,
    timeout: Duration,
}

impl Fetcher {
    pub fn new(
        registry: Registry,
        repo: RepoName,
        cache: Arc<ChunkCache>,
        stats: Arc<Stats>,
        parallel: usize,
        timeout: Duration,
    ) -> Fetcher {
        Fetcher {
            registry,
            repo,
            cache,
            stats,
            inflight: Mutex::new(HashMap::new()),
            network: Semaphore::new(parallel.max(1)),
            timeout,
        }
    }

    pub fn cache(&self) -> &ChunkCache {
        &self.cache
    }

    /// Makes sure a verified copy of the chunk is in the cache.
    pub async fn ensure(&self, digest: &Digest, size: u64) -> Result<(), FetchError> {
        if self.cache.contains_verified(digest) {
            self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        let gate = {
            let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(map.entry(digest.clone()).or_default())
        };
        let result = {
            let _one_at_a_time = gate.lock().await;
            self.ensure_locked(digest, size).await
        };
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&gate) <= 2 {
            map.remove(digest);
        }
        result
    }

    async fn ensure_locked(&self, digest: &Digest, size: u64) -> Result<(), FetchError> {
        if self.cache.contains_verified(digest) {
            self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(());
        }
        // A copy left by an earlier process is checked once before use.
        let cache = Arc::clone(&self.cache);
        let d = digest.clone();
        match tokio::task::spawn_blocking(move || cache.verify_existing(&d))
            .await
            .map_err(|e| FetchError::Task(e.to_string()))?
        {
            Ok(true) => {
                self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(());
            }
            Ok(false) | Err(CacheError::Corrupt { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        self.stats.cache_misses.fetch_add(1, Ordering::Relaxed);
        let result = self.download(digest, size).await;
        if result.is_err() {
            self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn download(&self, digest: &Digest, size: u64) -> Result<(), FetchError> {
        let _permit = self
            .network
            .acquire()
            .await
            .map_err(|e| FetchError::Task(e.to_string()))?;
        let bytes = tokio::time::timeout(
            self.timeout,
            self.registry.get_blob_unverified(&self.repo, digest, None),
        )
        .await
        .map_err(|_| FetchError::Timeout {
            digest: digest.clone(),
            timeout: self.timeout,
        })?
        .map_err(|source| FetchError::Registry {
            digest: digest.clone(),
            source,
        })?;
        if bytes.len() as u64 != size {
            return Err(FetchError::Size {
                digest: digest.clone(),
                expected: size,
                actual: bytes.len() as u64,
            });
        }
        let len = bytes.len() as u64;
        let (cache, d) = (Arc::clone(&self.cache), digest.clone());
        tokio::task::spawn_blocking(move || {
            let actual = d.algorithm().digest_bytes(&bytes);
            if actual != d {
                return Err(FetchError::Mismatch { digest: d, actual });
            }
            cache.insert(&d, &bytes).map_err(FetchError::from)
        })
        .await
        .map_err(|e| FetchError::Task(e.to_string()))??;
        self.stats.chunks_fetched.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_fetched.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}
