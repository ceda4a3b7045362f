//! Fetching chunks into the node cache: one download per chunk however many readers want it,
//! a bounded number in flight, every one verified before it is stored.

use std::collections::{HashMap, VecDeque};
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

/// Memory for verified chunks waiting for their cache write.
const PENDING_MIB: usize = 256;
/// Memory for the most recently written verified chunks. Cache writes bypass the page cache, so
/// this is where a reader that read-ahead got ahead of finds its chunks.
const RECENT_BYTES: u64 = 128 << 20;

/// Verified chunks served from memory: those on their way into the cache, and the most recently
/// written ones.
#[derive(Debug, Default)]
struct InMemory {
    chunks: HashMap<Digest, bytes::Bytes>,
    /// Written chunks still held, oldest first, and their total size.
    recent: VecDeque<Digest>,
    recent_bytes: u64,
}

impl InMemory {
    /// A chunk's cache write finished: keep it among the recent ones, dropping the oldest beyond
    /// [`RECENT_BYTES`].
    fn written(&mut self, digest: &Digest) {
        let Some(size) = self.chunks.get(digest).map(|b| b.len() as u64) else {
            return;
        };
        self.recent.push_back(digest.clone());
        self.recent_bytes += size;
        while self.recent_bytes > RECENT_BYTES {
            let Some(old) = self.recent.pop_front() else {
                break;
            };
            if let Some(b) = self.chunks.remove(&old) {
                self.recent_bytes = self.recent_bytes.saturating_sub(b.len() as u64);
            }
        }
    }
}

#[derive(Debug)]
pub struct Fetcher {
    registry: Registry,
    repo: RepoName,
    cache: Arc<ChunkCache>,
    stats: Arc<Stats>,
    inflight: Mutex<HashMap<Digest, Arc<tokio::sync::Mutex<()>>>>,
    /// Verified chunks on their way into the cache, served from memory meanwhile (a read never
    /// waits for a disk write), and the most recently written ones.
    memory: Arc<Mutex<InMemory>>,
    /// Bounds the memory held by chunks on their way into the cache, in MiB; when the disk falls
    /// behind, downloads wait.
    pending_budget: Arc<Semaphore>,
    /// Downloads for reads an application is waiting on.
    demand: Semaphore,
    /// Downloads nobody waits on yet (read-ahead, whole-volume prefetch): a separate pool, so they
    /// never queue in front of a read.
    background: Semaphore,
    timeout: Duration,
}

/// Who is waiting for a chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    Demand,
    Background,
}

/// What `ensure` had to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    AlreadyCached,
    Downloaded,
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
            memory: Arc::new(Mutex::new(InMemory::default())),
            pending_budget: Arc::new(Semaphore::new(PENDING_MIB)),
            demand: Semaphore::new(parallel.max(1)),
            background: Semaphore::new((parallel / 2).max(1)),
            timeout,
        }
    }

    pub fn cache(&self) -> &ChunkCache {
        &self.cache
    }

    /// Whether the chunk can be read now without fetching it.
    pub fn available(&self, digest: &Digest) -> bool {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .contains_key(digest)
            || self.cache.contains_verified(digest)
    }

    /// The chunk's bytes if they are held in memory (on their way to the cache, or recent).
    pub fn in_memory(&self, digest: &Digest) -> Option<bytes::Bytes> {
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .get(digest)
            .cloned()
    }

    /// Reads from a chunk that is [`available`](Self::available): from memory while its cache write
    /// is under way and for a while after, from the cache file after that.
    pub fn read_at(&self, digest: &Digest, offset: u64, buf: &mut [u8]) -> Result<(), CacheError> {
        match self.in_memory(digest) {
            Some(bytes) => {
                let start = offset as usize;
                let slice = bytes
                    .get(start..start + buf.len())
                    .ok_or_else(|| CacheError::Missing(digest.clone()))?;
                buf.copy_from_slice(slice);
                Ok(())
            }
            None => self.cache.read_at(digest, offset, buf),
        }
    }

    /// Makes sure a verified copy of the chunk is in the cache.
    pub async fn ensure(
        &self,
        digest: &Digest,
        size: u64,
        priority: Priority,
    ) -> Result<Ensured, FetchError> {
        if self.available(digest) {
            self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Ensured::AlreadyCached);
        }
        let gate = {
            let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(map.entry(digest.clone()).or_default())
        };
        let result = {
            let _one_at_a_time = gate.lock().await;
            self.ensure_locked(digest, size, priority).await
        };
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(&gate) <= 2 {
            map.remove(digest);
        }
        result
    }

    async fn ensure_locked(
        &self,
        digest: &Digest,
        size: u64,
        priority: Priority,
    ) -> Result<Ensured, FetchError> {
        // Another reader may have fetched it while we waited (it may still be on its way to the
        // disk), or another mount on the node may have.
        if self.available(digest) {
            self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Ensured::AlreadyCached);
        }
        let cache = Arc::clone(&self.cache);
        let d = digest.clone();
        let found = tokio::task::spawn_blocking(move || cache.adopt_existing(&d))
            .await
            .map_err(|e| FetchError::Task(e.to_string()))??;
        if found {
            self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
            return Ok(Ensured::AlreadyCached);
        }
        self.stats.cache_misses.fetch_add(1, Ordering::Relaxed);
        let result = self.download(digest, size, priority).await;
        if result.is_err() {
            self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
        }
        result.map(|()| Ensured::Downloaded)
    }

    async fn download(
        &self,
        digest: &Digest,
        size: u64,
        priority: Priority,
    ) -> Result<(), FetchError> {
        let pool = match priority {
            Priority::Demand => &self.demand,
            Priority::Background => &self.background,
        };
        let _permit = pool
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
        drop(_permit);
        let len = bytes.len() as u64;
        let d = digest.clone();
        let bytes = tokio::task::spawn_blocking(move || {
            let actual = d.algorithm().digest_bytes(&bytes);
            if actual != d {
                return Err(FetchError::Mismatch { digest: d, actual });
            }
            Ok(bytes)
        })
        .await
        .map_err(|e| FetchError::Task(e.to_string()))??;
        // Write-behind: the chunk is readable from memory at once; the cache write follows.
        let mib = (len.div_ceil(1 << 20) as u32).clamp(1, PENDING_MIB as u32);
        let budget = Arc::clone(&self.pending_budget)
            .acquire_many_owned(mib)
            .await
            .map_err(|e| FetchError::Task(e.to_string()))?;
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .insert(digest.clone(), bytes.clone());
        let (cache, memory, d) = (
            Arc::clone(&self.cache),
            Arc::clone(&self.memory),
            digest.clone(),
        );
        tokio::task::spawn_blocking(move || {
            let stored = cache.insert(&d, &bytes);
            let mut held = memory.lock().unwrap_or_else(|p| p.into_inner());
            match stored {
                Ok(()) => held.written(&d),
                Err(e) => {
                    tracing::warn!(digest = %d, error = %vial_core::error_chain(&e), "cannot store chunk in the cache; it will be fetched again");
                    held.chunks.remove(&d);
                }
            }
            drop(held);
            drop(budget);
        });
        self.stats.chunks_fetched.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_fetched.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }
}
