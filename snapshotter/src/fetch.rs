//! Fetching chunks into the node cache: one download per chunk however many readers want it,
//! a bounded number in flight, every one verified before it is stored.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;
use vial_client::{Arrived, ClientError, Registry, RunSize, Verified};
use vial_core::{Digest, RepoName};
use vial_io::BufferPool;

use crate::cache::{CacheError, ChunkCache};
use crate::stats::{InFlight, Stats};

#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("fetching chunk {digest}")]
    Registry {
        digest: Digest,
        #[source]
        source: Box<ClientError>,
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

impl FetchError {
    /// What reading `digest` from the registry failed with: a chunk whose bytes do not match is
    /// told apart from a registry that could not send it.
    fn reading(digest: &Digest, e: ClientError) -> FetchError {
        match e {
            ClientError::DigestMismatch { actual, .. } => FetchError::Mismatch {
                digest: digest.clone(),
                actual,
            },
            ClientError::WrongSize {
                expected, actual, ..
            } => FetchError::Size {
                digest: digest.clone(),
                expected,
                actual,
            },
            source => FetchError::Registry {
                digest: digest.clone(),
                source: Box::new(source),
            },
        }
    }
}

/// Chunk buffers kept for reuse at most (a few tens of MiB).
const POOLED: usize = 16;
/// Memory for verified chunks waiting for their cache write, in KiB (the unit of its budget: a
/// thousand 2 KiB chunks of small files take 2 MiB of it, not a thousand MiB).
const PENDING_KIB: usize = 256 << 10;
/// Cache writes in flight at once (see [`Fetcher::writers`]).
const WRITERS: usize = 4;
/// Chunks smaller than this are hashed where they arrive, not on a blocking thread: handing a
/// 2 KiB chunk to another thread costs more than hashing it.
const HASH_INLINE: usize = 64 << 10;
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
    /// Bounds the memory held by chunks on their way into the cache, in KiB; when the disk falls
    /// behind, downloads wait.
    pending_budget: Arc<Semaphore>,
    /// Cache writes at once. A write is a file created in the cache's `tmp` directory and renamed
    /// into place: a thread per chunk of a thousand small ones spent most of a cold read's CPU
    /// spinning on those two directories' locks.
    writers: Arc<Semaphore>,
    /// Downloads for reads an application is waiting on.
    demand: Semaphore,
    /// Downloads nobody waits on yet (read-ahead, whole-volume prefetch): a separate pool, so they
    /// never queue in front of a read.
    background: Semaphore,
    timeout: Duration,
    /// Buffers of chunks that left memory, for the next ones a run fetch collects.
    buffers: BufferPool,
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
            pending_budget: Arc::new(Semaphore::new(PENDING_KIB)),
            writers: Arc::new(Semaphore::new(WRITERS)),
            demand: Semaphore::new(parallel.max(1)),
            background: Semaphore::new((parallel / 2).max(1)),
            timeout,
            buffers: BufferPool::new(POOLED),
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
        let _in_flight = InFlight::start(&self.stats);
        let _permit = self.slot(priority).await?;
        let arrived = tokio::time::timeout(
            self.timeout,
            self.registry.read_one(&self.repo, digest, size),
        )
        .await
        .map_err(|_| FetchError::Timeout {
            digest: digest.clone(),
            timeout: self.timeout,
        })?
        .map_err(|e| FetchError::reading(digest, e))?;
        drop(_permit);
        self.accept(arrived).await
    }

    /// A download slot from the pool of the given priority, held for the request.
    async fn slot(
        &self,
        priority: Priority,
    ) -> Result<tokio::sync::SemaphorePermit<'_>, FetchError> {
        let pool = match priority {
            Priority::Demand => &self.demand,
            Priority::Background => &self.background,
        };
        pool.acquire()
            .await
            .map_err(|e| FetchError::Task(e.to_string()))
    }

    /// Checks a downloaded chunk against its size and digest, then makes it readable from memory
    /// at once and starts its cache write (write-behind, bounded by [`PENDING_KIB`]).
    async fn accept(&self, arrived: Arrived) -> Result<(), FetchError> {
        let (digest, len) = (arrived.digest().clone(), arrived.size());
        let d = digest.clone();
        // The run gathered the chunk into one aligned buffer: it is handed over without a copy.
        let check = move || {
            arrived
                .verify()
                .map(Verified::into_bytes)
                .map_err(|e| FetchError::reading(&d, e))
        };
        let bytes = if len < HASH_INLINE as u64 {
            check()?
        } else {
            tokio::task::spawn_blocking(check)
                .await
                .map_err(|e| FetchError::Task(e.to_string()))??
        };
        let kib = (len.div_ceil(1 << 10) as u32).clamp(1, PENDING_KIB as u32);
        let budget = Arc::clone(&self.pending_budget)
            .acquire_many_owned(kib)
            .await
            .map_err(|e| FetchError::Task(e.to_string()))?;
        self.memory
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .chunks
            .insert(digest.clone(), bytes.clone());
        let (cache, memory) = (Arc::clone(&self.cache), Arc::clone(&self.memory));
        // Write-behind: the chunk is readable from memory now; its cache write waits its turn
        // without holding up the readers waiting for it.
        let writers = Arc::clone(&self.writers);
        tokio::spawn(async move {
            let Ok(_writer) = writers.acquire_owned().await else {
                return;
            };
            let stored = tokio::task::spawn_blocking(move || {
                let stored = cache.insert(&digest, &bytes);
                let mut held = memory.lock().unwrap_or_else(|p| p.into_inner());
                match stored {
                    Ok(()) => held.written(&digest),
                    Err(e) => {
                        tracing::warn!(digest = %digest, error = %vial_core::error_chain(&e), "cannot store chunk in the cache; it will be fetched again");
                        held.chunks.remove(&digest);
                    }
                }
                drop(held);
                drop(budget);
            });
            let _ = stored.await;
        });
        self.stats.chunks_fetched.fetch_add(1, Ordering::Relaxed);
        self.stats.bytes_fetched.fetch_add(len, Ordering::Relaxed);
        Ok(())
    }

    /// Makes sure verified copies of a run of chunks (read-ahead, prefetch) are in the cache,
    /// fetching the missing ones in one bulk read where the registry has them. Chunks another
    /// fetch already has in hand are left to it. A chunk is readable (and its waiting readers
    /// released) as soon as it has arrived and matched its digest; if the run fails, the chunks
    /// it did not deliver are released unfetched, and their readers fetch them one by one, so a
    /// failed read-ahead never fails a read. Returns how many chunks were downloaded.
    pub async fn ensure_run(
        self: &Arc<Self>,
        run: &[(Digest, u64)],
        priority: Priority,
    ) -> Result<usize, FetchError> {
        let mut claimed = Vec::new();
        for (digest, size) in run {
            if self.available(digest) {
                self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            let gate = {
                let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
                Arc::clone(map.entry(digest.clone()).or_default())
            };
            match Arc::clone(&gate).try_lock_owned() {
                Ok(guard) => claimed.push(Claim {
                    digest: digest.clone(),
                    size: *size,
                    gate,
                    guard: Some(guard),
                }),
                Err(_) => self.release_gate(digest, &gate),
            }
        }
        // Chunks another process on the node put in the cache meanwhile need no fetch.
        let cache = Arc::clone(&self.cache);
        let digests: Vec<Digest> = claimed.iter().map(|c| c.digest.clone()).collect();
        let found = tokio::task::spawn_blocking(move || {
            digests
                .iter()
                .map(|d| cache.adopt_existing(d).unwrap_or(false) || cache.contains_verified(d))
                .collect::<Vec<bool>>()
        })
        .await
        .map_err(|e| FetchError::Task(e.to_string()))?;
        let mut wanted = Vec::with_capacity(claimed.len());
        for (claim, found) in claimed.into_iter().zip(found) {
            if found {
                self.stats.cache_hits.fetch_add(1, Ordering::Relaxed);
                self.finish(claim);
            } else {
                wanted.push(claim);
            }
        }
        if wanted.is_empty() {
            return Ok(0);
        }
        self.stats
            .cache_misses
            .fetch_add(wanted.len() as u64, Ordering::Relaxed);
        let result = match wanted.pop() {
            Some(claim) if wanted.is_empty() => {
                let r = self.download(&claim.digest, claim.size, priority).await;
                self.finish(claim);
                r.map(|()| 1)
            }
            Some(claim) => {
                wanted.push(claim);
                self.download_run(wanted, priority).await
            }
            None => Ok(0),
        };
        if result.is_err() {
            self.stats.fetch_errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// One bulk read of the claimed chunks, each verified and made readable as it completes.
    async fn download_run(
        self: &Arc<Self>,
        claims: Vec<Claim>,
        priority: Priority,
    ) -> Result<usize, FetchError> {
        let _permit = self.slot(priority).await?;
        let Some(first) = claims.first().map(|c| c.digest.clone()) else {
            return Ok(0);
        };
        let chunks: Vec<(Digest, u64)> =
            claims.iter().map(|c| (c.digest.clone(), c.size)).collect();
        let timed_out = |digest: &Digest| FetchError::Timeout {
            digest: digest.clone(),
            timeout: self.timeout,
        };
        let mut run =
            tokio::time::timeout(self.timeout, self.registry.read_run(&self.repo, &chunks))
                .await
                .map_err(|_| timed_out(&first))?
                .map_err(|e| FetchError::reading(&first, e))?
                .gather_into(self.buffers.clone());
        let mut accepted = tokio::task::JoinSet::new();
        let mut claims = claims.into_iter().map(Some).collect::<Vec<_>>();
        let received: Result<(), FetchError> = async {
            loop {
                let waiting = run.waiting_for().unwrap_or(&first).clone();
                let next = tokio::time::timeout(self.timeout, run.next())
                    .await
                    .map_err(|_| timed_out(&waiting))?;
                let Some(arrived) = next else {
                    return Ok(());
                };
                let arrived = arrived.map_err(|e| FetchError::reading(&waiting, e))?;
                if let Some(claim) = claims.get_mut(arrived.index).and_then(Option::take) {
                    self.hand_over(&mut accepted, claim, arrived);
                }
            }
        }
        .await;
        drop(_permit);
        // Whatever the run did not deliver goes back to its readers.
        for claim in claims.into_iter().flatten() {
            self.finish(claim);
        }
        let mut fetched = 0;
        let mut failed = received.err();
        while let Some(done) = accepted.join_next().await {
            match done.map_err(|e| FetchError::Task(e.to_string()))? {
                Ok(()) => fetched += 1,
                Err(e) => failed = failed.or(Some(e)),
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(fetched),
        }
    }

    /// Verifies and keeps a chunk a run delivered, then releases it to its readers.
    fn hand_over(
        self: &Arc<Self>,
        accepted: &mut tokio::task::JoinSet<Result<(), FetchError>>,
        claim: Claim,
        arrived: Arrived,
    ) {
        let me = Arc::clone(self);
        accepted.spawn(async move {
            let r = me.accept(arrived).await;
            me.finish(claim);
            r
        });
    }

    /// Releases a claimed chunk to the readers waiting for it.
    fn finish(&self, mut claim: Claim) {
        drop(claim.guard.take());
        self.release_gate(&claim.digest, &claim.gate);
    }

    /// Forgets a chunk's gate once nobody else holds it.
    fn release_gate(&self, digest: &Digest, gate: &Arc<tokio::sync::Mutex<()>>) {
        let mut map = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        if Arc::strong_count(gate) <= 2 {
            map.remove(digest);
        }
    }
}

/// A chunk a run fetch has taken on: readers wanting it wait on its gate until it is released.
struct Claim {
    digest: Digest,
    size: u64,
    gate: Arc<tokio::sync::Mutex<()>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

/// Splits chunks, in reading order, into runs for [`Fetcher::ensure_run`].
pub fn runs(chunks: impl IntoIterator<Item = (Digest, u64)>) -> Vec<Vec<(Digest, u64)>> {
    vial_client::plan_runs(chunks, |(_, size)| *size, RunSize::MOUNT)
}
