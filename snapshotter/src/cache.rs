//! The node chunk cache: verified chunks on disk, content-addressed, shared by every mount on the
//! node and bounded in size with least-recently-used eviction.
//!
//! Layout: `<dir>/chunks/<algorithm>/<xx>/<hex>`, written as `<dir>/tmp/<random>` and renamed into
//! place only after the bytes matched the digest, so no process ever sees a partial chunk under a
//! chunk's name. Chunks are not fsynced one by one (that would bound a cold read by the disk's
//! synchronous write speed); instead each writing process leaves a marker in `<dir>/writers/` naming
//! the boot it runs in, and syncs and removes it when it stops cleanly. A process that crashes
//! leaves every chunk it renamed into place intact (written with O_DIRECT, or in the kernel's page
//! cache where O_DIRECT is not available); only a machine that went down can leave torn files. So
//! when a cache is opened and a marker from another boot is found, every chunk on disk is hashed
//! again before its first use, and a mismatch deletes it; otherwise chunk files are trusted as
//! written. Temporary files left by a crash are deleted when a cache is opened.
//!
//! Several processes may share one directory. Each keeps its own view of what is there and evicts
//! to its own bound; a chunk another process evicted is simply missing on open and fetched again.
//!
//! A disk that fills before the cache reaches its bound (a bound larger than the disk, or other
//! files on it) lowers the bound to what the cache holds, and the cache evicts to make room: reads
//! go on, and a full disk costs refetches, never a failed read.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vial_core::{Algorithm, Digest};
use vial_io::write_direct;

use crate::stats::Stats;

/// Writes a new chunk file. With O_DIRECT where the filesystem has it: the bytes go from memory to
/// the disk without being copied into the page cache, which on a cold read of a large volume costs
/// more CPU than hashing (the mount's own FUSE pages already hold what readers read). The length is
/// padded to the block size and the file then cut back. Small chunks (the files of a tokenizer,
/// an index of thousands of shards) are written through the page cache: a direct write waits for
/// the device, 0.5 ms a chunk on a cloud disk, which for a 2 KiB file is most of what reading it
/// costs. Elsewhere (tmpfs, some network filesystems) an ordinary write.
fn write_chunk_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if bytes.len() < DIRECT_MIN {
        return File::create_new(path)?.write_all(bytes);
    }
    let direct = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_DIRECT)
        .open(path);
    let mut f = match direct {
        Ok(f) => match write_direct(&f, bytes) {
            Ok(()) => return Ok(()),
            // The filesystem took the flag but not the write: fall back to an ordinary one.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                drop(f);
                File::create(path)?
            }
            Err(e) => return Err(e),
        },
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => File::create(path)?,
        Err(e) => return Err(e),
    };
    f.write_all(bytes)
}

/// Whether a write failed because the filesystem (or the user's quota on it) is full.
fn disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

/// Chunks at least this large are written with O_DIRECT.
const DIRECT_MIN: usize = 256 * 1024;

/// The smallest cache that still holds a few chunks of the largest size.
pub const MIN_CACHE_SIZE: u64 = 64 * 1024 * 1024;

#[derive(Debug)]
struct Entry {
    size: u64,
    last_used: u64,
    /// Whether this process has checked (or written) the bytes.
    verified: bool,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<Digest, Entry>,
    total: u64,
    tick: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error("cache i/o at {}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("chunk {digest} in the cache does not match its digest; removed")]
    Corrupt { digest: Digest },
    #[error("chunk {0} is not in the cache")]
    Missing(Digest),
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> CacheError + '_ {
    move |source| CacheError::Io {
        path: path.to_owned(),
        source,
    }
}

#[derive(Debug)]
pub struct ChunkCache {
    dir: PathBuf,
    /// The bound: as configured, until a full disk lowers it.
    limit: AtomicU64,
    state: Mutex<State>,
    tmp_counter: AtomicU64,
    stats: std::sync::Arc<Stats>,
    /// This boot's id, written into this process's writer marker.
    boot: String,
    marker_written: std::sync::atomic::AtomicBool,
}

/// The kernel's id of the current boot; empty where unavailable (then every crash looks like a
/// reboot, which only costs re-hashing).
fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Removes markers of processes that are gone. Returns whether any of them ran in another boot,
/// i.e. chunks may have been lost from the page cache before reaching the disk.
fn sweep_writer_markers(dir: &Path, boot: &str) -> bool {
    let mut suspect = false;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    for e in entries.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        let marker_boot = std::fs::read_to_string(e.path()).unwrap_or_default();
        let other_boot = boot.is_empty() || marker_boot.trim() != boot;
        let alive = !other_boot && Path::new("/proc").join(&pid).exists();
        if other_boot {
            suspect = true;
        }
        if !alive {
            let _ = std::fs::remove_file(e.path());
        }
    }
    suspect
}

impl ChunkCache {
    /// Opens (creating) the cache at `dir`, bounded to `limit` bytes, and indexes what is there.
    pub fn open(
        dir: &Path,
        limit: u64,
        stats: std::sync::Arc<Stats>,
    ) -> Result<ChunkCache, CacheError> {
        let limit = limit.max(MIN_CACHE_SIZE);
        for sub in ["chunks", "tmp", "writers"] {
            let d = dir.join(sub);
            std::fs::create_dir_all(&d).map_err(io(&d))?;
        }
        // Leftover temporary files are partial writes of a process that died.
        let tmp = dir.join("tmp");
        for e in std::fs::read_dir(&tmp).map_err(io(&tmp))?.flatten() {
            let _ = std::fs::remove_file(e.path());
        }
        let boot = boot_id();
        let suspect = sweep_writer_markers(&dir.join("writers"), &boot);
        if suspect {
            tracing::warn!(dir = %dir.display(), "the machine went down while chunks were being cached: every cached chunk is checked again before use");
        }
        let cache = ChunkCache {
            dir: dir.to_owned(),
            limit: AtomicU64::new(limit),
            state: Mutex::new(State::default()),
            tmp_counter: AtomicU64::new(0),
            stats,
            boot,
            marker_written: std::sync::atomic::AtomicBool::new(false),
        };
        cache.rescan(!suspect)?;
        Ok(cache)
    }

    pub fn limit(&self) -> u64 {
        self.limit.load(Ordering::Relaxed)
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.dir
            .join("chunks")
            .join(digest.algorithm().as_str())
            .join(&hex[..2])
            .join(hex)
    }

    /// Indexes the chunk files on disk, oldest modification first; `trusted` says whether they can
    /// be served as they are or must be hashed again first.
    fn rescan(&self, trusted: bool) -> Result<(), CacheError> {
        let mut found: Vec<(std::time::SystemTime, Digest, u64)> = Vec::new();
        let root = self.dir.join("chunks");
        for alg in Algorithm::ALL {
            let Ok(prefixes) = std::fs::read_dir(root.join(alg.as_str())) else {
                continue;
            };
            for p in prefixes.flatten() {
                let Ok(files) = std::fs::read_dir(p.path()) else {
                    continue;
                };
                for f in files.flatten() {
                    let name = f.file_name().to_string_lossy().into_owned();
                    let Ok(digest) = Digest::parse(&format!("{alg}:{name}")) else {
                        continue;
                    };
                    let Ok(meta) = f.metadata() else { continue };
                    found.push((
                        meta.modified().unwrap_or(std::time::UNIX_EPOCH),
                        digest,
                        meta.len(),
                    ));
                }
            }
        }
        found.sort_by_key(|(t, _, _)| *t);
        let mut state = self.lock();
        for (_, digest, size) in found {
            state.tick += 1;
            let tick = state.tick;
            if state
                .entries
                .insert(
                    digest,
                    Entry {
                        size,
                        last_used: tick,
                        verified: trusted,
                    },
                )
                .is_none()
            {
                state.total += size;
            }
        }
        drop(state);
        self.evict();
        Ok(())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the map inconsistent in a way that matters
        // (worst case a size is miscounted), so keep serving rather than poisoning every read.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether the chunk is present and verified by this process, marking it used.
    pub fn contains_verified(&self, digest: &Digest) -> bool {
        let mut state = self.lock();
        state.tick += 1;
        let tick = state.tick;
        match state.entries.get_mut(digest) {
            Some(e) if e.verified => {
                e.last_used = tick;
                true
            }
            _ => false,
        }
    }

    /// Looks for a chunk another process (another mount on the node) stored after this one
    /// indexed the directory. Chunk files are only ever created complete and verified, so finding
    /// one is enough. Returns whether the chunk is now known.
    pub fn adopt_existing(&self, digest: &Digest) -> Result<bool, CacheError> {
        if self.contains_verified(digest) {
            return Ok(true);
        }
        if self.lock().entries.contains_key(digest) {
            // Found on disk after an unclean shutdown of the machine: check it before any use.
            return match self.verify_existing(digest) {
                Ok(found) => Ok(found),
                Err(CacheError::Corrupt { .. }) => Ok(false),
                Err(e) => Err(e),
            };
        }
        let path = self.path(digest);
        let size = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(io(&path)(e)),
        };
        {
            let mut state = self.lock();
            state.tick += 1;
            let tick = state.tick;
            if state
                .entries
                .insert(
                    digest.clone(),
                    Entry {
                        size,
                        last_used: tick,
                        verified: true,
                    },
                )
                .is_none()
            {
                state.total += size;
            }
        }
        self.evict();
        Ok(true)
    }

    /// Checks a cached chunk's bytes against its digest, removing it if they do not match (a disk
    /// that corrupted it, or someone writing into the cache directory). For `vial mount --verify`
    /// style checks and tests; the read path trusts chunk files, which were verified when stored.
    pub fn verify_existing(&self, digest: &Digest) -> Result<bool, CacheError> {
        let path = self.path(digest);
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.forget(digest);
                return Ok(false);
            }
            Err(e) => return Err(io(&path)(e)),
        };
        if &digest.algorithm().digest_bytes(&bytes) != digest {
            tracing::error!(%digest, path = %path.display(), "cached chunk is corrupt; removing it");
            let _ = std::fs::remove_file(&path);
            self.forget(digest);
            return Err(CacheError::Corrupt {
                digest: digest.clone(),
            });
        }
        self.mark_verified(digest, bytes.len() as u64);
        Ok(true)
    }

    fn mark_verified(&self, digest: &Digest, size: u64) {
        {
            let mut state = self.lock();
            state.tick += 1;
            let tick = state.tick;
            match state.entries.get_mut(digest) {
                Some(e) => {
                    e.verified = true;
                    e.last_used = tick;
                }
                None => {
                    state.entries.insert(
                        digest.clone(),
                        Entry {
                            size,
                            last_used: tick,
                            verified: true,
                        },
                    );
                    state.total += size;
                }
            }
        }
        self.evict();
    }

    /// Flushes this process's chunks to disk and removes its writer marker: call on clean shutdown.
    pub fn close(&self) {
        if !self.marker_written.load(Ordering::Relaxed) {
            return;
        }
        match std::process::Command::new("sync")
            .arg("-f")
            .arg(&self.dir)
            .status()
        {
            Ok(s) if s.success() => {
                let _ = std::fs::remove_file(self.marker_path());
            }
            other => {
                tracing::warn!(result = ?other, "could not sync the chunk cache; it will be re-checked on next use")
            }
        }
    }

    fn marker_path(&self) -> PathBuf {
        self.dir
            .join("writers")
            .join(std::process::id().to_string())
    }

    fn forget(&self, digest: &Digest) {
        let mut state = self.lock();
        if let Some(e) = state.entries.remove(digest) {
            state.total -= e.size;
        }
    }

    /// Stores a chunk whose bytes the caller has verified against `digest`, then evicts down to the
    /// bound. The chunk just stored is the most recently used, so it survives this eviction.
    pub fn insert(&self, digest: &Digest, bytes: &[u8]) -> Result<(), CacheError> {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join("tmp")
            .join(format!("{}-{n}", std::process::id()));
        let dest = self.path(digest);
        if !self.marker_written.swap(true, Ordering::Relaxed) {
            let marker = self.marker_path();
            if let Err(e) = std::fs::write(&marker, &self.boot) {
                self.marker_written.store(false, Ordering::Relaxed);
                return Err(io(&marker)(e));
            }
        }
        let store = || -> std::io::Result<()> {
            write_chunk_file(&tmp, bytes)?;
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::rename(&tmp, &dest)
        };
        let result = loop {
            match store() {
                Err(e) if disk_full(&e) => {
                    let _ = std::fs::remove_file(&tmp);
                    if !self.make_room(bytes.len() as u64) {
                        break Err(e);
                    }
                }
                other => break other,
            }
        };
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(io(&dest)(e));
        }
        {
            let mut state = self.lock();
            state.tick += 1;
            let tick = state.tick;
            let size = bytes.len() as u64;
            match state.entries.insert(
                digest.clone(),
                Entry {
                    size,
                    last_used: tick,
                    verified: true,
                },
            ) {
                Some(old) => state.total = state.total - old.size + size,
                None => state.total += size,
            }
        }
        self.evict();
        Ok(())
    }

    /// Removes least recently used chunks until the cache is within its bound.
    fn evict(&self) {
        self.evict_to(self.limit());
    }

    /// Removes least recently used chunks (never the most recent) until the cache holds at most
    /// `bound` bytes. Returns how many it removed.
    fn evict_to(&self, bound: u64) -> usize {
        let victims: Vec<(Digest, u64)> = {
            let mut state = self.lock();
            if state.total <= bound {
                return 0;
            }
            let mut order: Vec<(u64, Digest, u64)> = state
                .entries
                .iter()
                .map(|(d, e)| (e.last_used, d.clone(), e.size))
                .collect();
            order.sort_by_key(|(t, _, _)| *t);
            let mut victims = Vec::new();
            let newest = order.last().map(|(_, d, _)| d.clone());
            for (_, d, size) in order {
                if state.total <= bound || Some(&d) == newest.as_ref() {
                    break;
                }
                state.entries.remove(&d);
                state.total -= size;
                victims.push((d, size));
            }
            victims
        };
        for (d, _) in &victims {
            // Readers holding the file open keep reading it; new opens miss and fetch again.
            let _ = std::fs::remove_file(self.path(d));
        }
        self.stats
            .evictions
            .fetch_add(victims.len() as u64, Ordering::Relaxed);
        victims.len()
    }

    /// The disk is full before the cache reached its bound: lowers the bound to what the cache
    /// holds less `need` bytes, and evicts down to it. Returns whether anything was freed, so a
    /// write can be tried again.
    fn make_room(&self, need: u64) -> bool {
        let held = self.total();
        let bound = held.saturating_sub(need);
        let before = self.limit.fetch_min(bound, Ordering::Relaxed);
        if bound < before {
            tracing::warn!(
                dir = %self.dir.display(),
                bound = bound,
                configured = before,
                "the chunk cache's disk is full: keeping the cache within what it holds now, evicting to make room"
            );
        }
        self.evict_to(bound) > 0
    }

    /// Deletes these chunks from the cache (a volume that is gone from the node), whether this
    /// process or another stored them. Returns how many chunk files and bytes were removed.
    pub fn discard<'a>(&self, digests: impl IntoIterator<Item = &'a Digest>) -> (u64, u64) {
        let (mut files, mut bytes) = (0, 0);
        for digest in digests {
            self.forget(digest);
            let path = self.path(digest);
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            if std::fs::remove_file(&path).is_ok() {
                files += 1;
                bytes += meta.len();
            }
        }
        (files, bytes)
    }

    /// How many of these chunks this process has in the cache, and their bytes.
    pub fn held<'a>(&self, digests: impl IntoIterator<Item = &'a Digest>) -> (u64, u64) {
        let state = self.lock();
        digests
            .into_iter()
            .filter_map(|d| state.entries.get(d))
            .fold((0, 0), |(n, bytes), e| (n + 1, bytes + e.size))
    }

    /// Asks the kernel to start reading cached chunks' files into the page cache, so a reader
    /// that reaches them does not wait for the disk one request at a time. Best effort: a chunk
    /// evicted meanwhile is skipped.
    // The one unsafe call in vial (the snapshotter is the crate allowed to hold one, STYLE.md):
    // std has no fadvise.
    #[allow(unsafe_code)]
    pub fn will_need(&self, digests: &[Digest]) {
        use std::os::fd::AsRawFd;
        for digest in digests {
            if let Ok(f) = File::open(self.path(digest)) {
                // SAFETY: the descriptor is open for the whole call, and posix_fadvise only takes
                // plain integers; it reads or writes no memory of ours.
                unsafe {
                    libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED);
                }
            }
        }
    }

    /// Reads `buf.len()` bytes at `offset` of a cached chunk.
    pub fn read_at(&self, digest: &Digest, offset: u64, buf: &mut [u8]) -> Result<(), CacheError> {
        let path = self.path(digest);
        let f = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.forget(digest);
                return Err(CacheError::Missing(digest.clone()));
            }
            Err(e) => return Err(io(&path)(e)),
        };
        f.read_exact_at(buf, offset).map_err(io(&path))
    }

    pub fn total(&self) -> u64 {
        self.lock().total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use vial_io::ALIGN;

    fn chunk(i: u8) -> (Digest, Vec<u8>) {
        let bytes = vec![i; 30 * 1024 * 1024];
        (Algorithm::Sha256.digest_bytes(&bytes), bytes)
    }

    #[test]
    fn chunk_files_hold_exactly_their_bytes_whatever_the_length_and_alignment() {
        let dir = tempfile::tempdir().unwrap();
        // One page-aligned source, read at an aligned and at a misaligned start.
        let mut source = vec![0u8; (3 << 20) + 3 * ALIGN];
        let aligned = source.as_ptr().align_offset(ALIGN);
        for (i, b) in source.iter_mut().enumerate() {
            *b = (i * 31 % 251) as u8;
        }
        for start in [aligned, aligned + 16] {
            for len in [0, 1, 4095, 4096, 4097, 3 << 20, (3 << 20) + 5] {
                let bytes = &source[start..start + len];
                let path = dir.path().join(format!("{start}-{len}"));
                write_chunk_file(&path, bytes).unwrap();
                assert_eq!(
                    std::fs::read(&path).unwrap(),
                    bytes,
                    "{len} bytes at {start}"
                );
            }
        }
        // A file that already exists is never overwritten (names are unique per write).
        let path = dir.path().join(format!("{aligned}-1"));
        assert!(write_chunk_file(&path, b"x").is_err());
    }

    #[test]
    fn eviction_keeps_the_cache_within_its_bound_and_drops_the_oldest() {
        let dir = tempfile::tempdir().unwrap();
        let cache =
            ChunkCache::open(dir.path(), MIN_CACHE_SIZE, Arc::new(Stats::default())).unwrap();
        let chunks: Vec<_> = (0..4).map(chunk).collect();
        for (d, b) in &chunks {
            cache.insert(d, b).unwrap();
            assert!(cache.total() <= MIN_CACHE_SIZE);
        }
        assert!(
            !cache.contains_verified(&chunks[0].0),
            "the oldest chunk is evicted first"
        );
        assert!(cache.contains_verified(&chunks[3].0));
        let mut buf = [0u8; 4];
        cache.read_at(&chunks[3].0, 100, &mut buf).unwrap();
        assert_eq!(buf, [3; 4]);
    }

    #[test]
    fn chunks_left_on_disk_are_reused_temp_files_removed_and_corruption_detectable() {
        let dir = tempfile::tempdir().unwrap();
        let (good, good_bytes) = chunk(1);
        let (bad, bad_bytes) = chunk(2);
        {
            let cache = ChunkCache::open(dir.path(), 1 << 30, Arc::new(Stats::default())).unwrap();
            cache.insert(&good, &good_bytes).unwrap();
            cache.insert(&bad, &bad_bytes).unwrap();
        }
        // Simulate a torn write that survived the machine going down under the chunk's name: the
        // writer's marker names another boot.
        std::fs::write(dir.path().join("writers/999999"), "another-boot").unwrap();
        std::fs::write(
            dir.path()
                .join("chunks/sha256")
                .join(&bad.hex()[..2])
                .join(bad.hex()),
            b"torn",
        )
        .unwrap();
        std::fs::write(dir.path().join("tmp/123-0"), b"partial").unwrap();
        let cache = ChunkCache::open(dir.path(), 1 << 30, Arc::new(Stats::default())).unwrap();
        assert!(
            !cache.contains_verified(&good),
            "found chunks start unverified"
        );
        assert!(cache.verify_existing(&good).unwrap());
        assert!(matches!(
            cache.verify_existing(&bad),
            Err(CacheError::Corrupt { .. })
        ));
        assert!(
            !cache.verify_existing(&bad).unwrap(),
            "the corrupt chunk is gone"
        );
        assert!(!dir.path().join("tmp/123-0").exists());
    }

    #[test]
    fn discarded_chunks_leave_the_disk_and_the_count_whoever_stored_them() {
        let dir = tempfile::tempdir().unwrap();
        let chunks: Vec<_> = (0..3).map(chunk).collect();
        let size = chunks[0].1.len() as u64;
        let cache = ChunkCache::open(dir.path(), 1 << 30, Arc::new(Stats::default())).unwrap();
        for (d, b) in &chunks[..2] {
            cache.insert(d, b).unwrap();
        }
        // The third is stored by another process sharing the directory.
        let other = ChunkCache::open(dir.path(), 1 << 30, Arc::new(Stats::default())).unwrap();
        other.insert(&chunks[2].0, &chunks[2].1).unwrap();
        let all: Vec<&Digest> = chunks.iter().map(|(d, _)| d).collect();
        assert_eq!(cache.held(all.iter().copied()), (2, 2 * size));

        assert_eq!(
            cache.discard([&chunks[0].0, &chunks[2].0]),
            (2, 2 * size),
            "one of its own and the other process's"
        );
        assert_eq!(cache.total(), size);
        assert_eq!(cache.held(all.iter().copied()), (1, size));
        let mut buf = [0u8; 4];
        assert!(matches!(
            cache.read_at(&chunks[0].0, 0, &mut buf),
            Err(CacheError::Missing(_))
        ));
        assert!(matches!(
            other.read_at(&chunks[2].0, 0, &mut buf),
            Err(CacheError::Missing(_))
        ));
        cache.read_at(&chunks[1].0, 0, &mut buf).unwrap();
        assert_eq!(buf, [1; 4]);
        assert_eq!(
            cache.discard([&chunks[0].0]),
            (0, 0),
            "nothing left to remove"
        );
    }
}

#[cfg(test)]
mod crash_tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn after_a_process_crash_in_the_same_boot_chunks_are_trusted() {
        let dir = tempfile::tempdir().unwrap();
        let bytes = vec![7u8; 1000];
        let digest = Algorithm::Sha256.digest_bytes(&bytes);
        {
            let cache = ChunkCache::open(dir.path(), 1 << 30, Arc::new(Stats::default())).unwrap();
            cache.insert(&digest, &bytes).unwrap();
            assert!(dir
                .path()
                .join("writers")
                .join(std::process::id().to_string())
                .exists());
            // No close(): the process "crashes". Its marker names this boot, so nothing is suspect.
            std::fs::rename(
                dir.path()
                    .join("writers")
                    .join(std::process::id().to_string()),
                dir.path().join("writers/999999"),
            )
            .unwrap();
            std::fs::write(dir.path().join("writers/999999"), boot_id()).unwrap();
        }
        let cache = ChunkCache::open(dir.path(), 1 << 30, Arc::new(Stats::default())).unwrap();
        assert!(cache.contains_verified(&digest));
        cache.close();
    }
}
