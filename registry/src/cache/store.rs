//! The cache tier's disk: verified blobs (chunks, layers and manifests alike) under their digests,
//! bounded in size with least-recently-used eviction.
//!
//! Layout: `<dir>/blobs/<algorithm>/<xx>/<hex>`, written as `<dir>/tmp/<n>` and renamed into place
//! only after the bytes matched their digest, so nothing is ever found under a digest that is not
//! all of it. Files are not synced one by one (that would bound a fill by the disk's synchronous
//! write speed): while the cache runs, `<dir>/writing` names the boot it runs in; a clean stop
//! syncs the filesystem and removes it. Found at start from another boot, the machine went down
//! with writes possibly unflushed, so every file is hashed again before it is first served (a
//! mismatch deletes it). A crashed process alone loses nothing the kernel already has.
//!
//! Eviction unlinks a file; a request already streaming it holds it open and finishes, so a blob
//! being served is never cut off. One process uses a directory at a time.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use vial_core::{Algorithm, Digest};

/// What the cache knows of one stored blob.
#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    /// Position in the recency order: larger is more recent.
    tick: u64,
    /// Whether the file is known to hold the digest's bytes (false after a machine crash, until
    /// hashed again).
    verified: bool,
}

#[derive(Debug, Default)]
struct Index {
    entries: HashMap<Digest, Entry>,
    /// Recency order: tick to digest.
    order: BTreeMap<u64, Digest>,
    next_tick: u64,
    /// Ticks handed to blobs stored "cold" (kept for others, evicted first) count down from here.
    cold_tick: u64,
    total: u64,
}

impl Index {
    fn touch(&mut self, digest: &Digest) -> Option<Entry> {
        let entry = self.entries.get_mut(digest)?;
        self.order.remove(&entry.tick);
        self.next_tick += 1;
        entry.tick = self.next_tick;
        self.order.insert(entry.tick, digest.clone());
        Some(*entry)
    }

    fn remove(&mut self, digest: &Digest) -> Option<Entry> {
        let entry = self.entries.remove(digest)?;
        self.order.remove(&entry.tick);
        self.total -= entry.size;
        Some(entry)
    }
}

/// A stored blob, open for reading.
#[derive(Debug)]
pub struct Stored {
    pub file: File,
    pub size: u64,
}

#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    limit: u64,
    index: Mutex<Index>,
    tmp_counter: AtomicU64,
    evictions: AtomicU64,
    /// Blobs stored since the cache opened, not yet synced to the disk.
    written: Mutex<Vec<Digest>>,
}

/// Ticks of cold entries start here and count down; warm ones start above it.
const COLD_BASE: u64 = 1 << 40;

impl Store {
    /// Opens (creating) the cache at `dir`, bounded to `limit` bytes, and indexes what is there,
    /// oldest modification first in the recency order.
    pub fn open(dir: &Path, limit: u64) -> std::io::Result<Store> {
        std::fs::create_dir_all(dir.join("blobs"))?;
        let tmp = dir.join("tmp");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp)?;
        let boot = boot_id();
        let marker = dir.join("writing");
        let suspect = match std::fs::read_to_string(&marker) {
            Ok(previous) => previous.trim() != boot,
            Err(_) => false,
        };
        if suspect {
            tracing::warn!(dir = %dir.display(), "the machine went down while this cache was running: every cached blob is hashed again before it is served");
        }
        let mut found = Vec::new();
        for algorithm in std::fs::read_dir(dir.join("blobs"))? {
            let algorithm = algorithm?;
            let name = algorithm.file_name().to_string_lossy().into_owned();
            for fan in std::fs::read_dir(algorithm.path())? {
                for file in std::fs::read_dir(fan?.path())? {
                    let file = file?;
                    let hex = file.file_name().to_string_lossy().into_owned();
                    let Ok(digest) = Digest::parse(&format!("{name}:{hex}")) else {
                        let _ = std::fs::remove_file(file.path());
                        continue;
                    };
                    let meta = file.metadata()?;
                    found.push((meta.modified().ok(), digest, meta.len()));
                }
            }
        }
        found.sort_by_key(|(modified, ..)| *modified);
        let mut index = Index {
            next_tick: COLD_BASE,
            cold_tick: COLD_BASE,
            ..Index::default()
        };
        for (_, digest, size) in found {
            index.next_tick += 1;
            index.order.insert(index.next_tick, digest.clone());
            index.total += size;
            let entry = Entry {
                size,
                tick: index.next_tick,
                verified: !suspect,
            };
            index.entries.insert(digest, entry);
        }
        std::fs::write(&marker, &boot)?;
        let store = Store {
            dir: dir.to_owned(),
            limit,
            index: Mutex::new(index),
            tmp_counter: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            written: Mutex::default(),
        };
        store.evict();
        Ok(store)
    }

    fn path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.dir
            .join("blobs")
            .join(digest.algorithm().as_str())
            .join(&hex[..2])
            .join(hex)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The size of a stored blob, without counting as a use.
    pub fn size(&self, digest: &Digest) -> Option<u64> {
        self.lock().entries.get(digest).map(|e| e.size)
    }

    /// Opens a stored blob for reading and counts it as used. A blob whose file cannot be trusted
    /// (after a machine crash) is hashed first and dropped if it does not match. Blocking.
    pub fn open_blob(&self, digest: &Digest) -> Option<Stored> {
        let entry = self.lock().touch(digest)?;
        let file = match File::open(self.path(digest)) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(%digest, error = %e, "a cached blob's file is gone; fetching it again");
                self.lock().remove(digest);
                return None;
            }
        };
        if !entry.verified {
            let matches = hash_file(&file, digest.algorithm()).ok().as_ref() == Some(digest);
            if !matches {
                tracing::warn!(%digest, "a cached blob did not match its digest after a machine crash: dropped");
                self.drop_blob(digest);
                return None;
            }
            if let Some(e) = self.lock().entries.get_mut(digest) {
                e.verified = true;
            }
            // Hashing moved the file position: hand out a fresh handle.
            return File::open(self.path(digest)).ok().map(|file| Stored {
                file,
                size: entry.size,
            });
        }
        Some(Stored {
            file,
            size: entry.size,
        })
    }

    /// A new temporary file for a blob on its way in.
    pub fn temp_file(&self) -> std::io::Result<(PathBuf, File)> {
        let n = self.tmp_counter.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join("tmp").join(n.to_string());
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        Ok((path, file))
    }

    /// Moves a verified temporary file into place under `digest` and evicts down to the bound.
    /// `cold` blobs (kept for a peer's sake) go to the old end of the recency order.
    pub fn commit(
        &self,
        tmp: &Path,
        digest: &Digest,
        size: u64,
        cold: bool,
    ) -> std::io::Result<()> {
        let path = self.path(digest);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::rename(tmp, &path)?;
        self.lock_written().push(digest.clone());
        {
            let mut index = self.lock();
            index.remove(digest);
            let tick = if cold {
                index.cold_tick -= 1;
                index.cold_tick
            } else {
                index.next_tick += 1;
                index.next_tick
            };
            index.order.insert(tick, digest.clone());
            index.total += size;
            index.entries.insert(
                digest.clone(),
                Entry {
                    size,
                    tick,
                    verified: true,
                },
            );
        }
        self.evict();
        Ok(())
    }

    /// Removes a blob from the cache.
    pub fn drop_blob(&self, digest: &Digest) {
        self.lock().remove(digest);
        let _ = std::fs::remove_file(self.path(digest));
    }

    /// Evicts least recently used blobs until the total fits the bound.
    fn evict(&self) {
        loop {
            let victim = {
                let mut index = self.lock();
                if index.total <= self.limit {
                    return;
                }
                let Some((_, digest)) = index.order.iter().next().map(|(t, d)| (*t, d.clone()))
                else {
                    return;
                };
                index.remove(&digest);
                digest
            };
            self.evictions.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(digest = %victim, "evicted from the cache");
            if let Err(e) = std::fs::remove_file(self.path(&victim)) {
                tracing::warn!(digest = %victim, error = %e, "could not remove an evicted blob");
            }
        }
    }

    /// Bytes and blobs stored, and evictions so far.
    pub fn usage(&self) -> (u64, u64, u64) {
        let index = self.lock();
        (
            index.total,
            index.entries.len() as u64,
            self.evictions.load(Ordering::Relaxed),
        )
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Flushes everything written since the cache opened to the disk and marks the cache as
    /// cleanly stopped.
    pub fn close(&self) {
        let written: Vec<Digest> = std::mem::take(&mut *self.lock_written());
        let mut failed = 0;
        for digest in written {
            if self.size(&digest).is_none() {
                continue;
            }
            if let Err(e) = File::open(self.path(&digest)).and_then(|f| f.sync_all()) {
                if e.kind() != std::io::ErrorKind::NotFound {
                    failed += 1;
                }
            }
        }
        let synced = failed == 0 && File::open(&self.dir).and_then(|d| d.sync_all()).is_ok();
        if synced {
            let _ = std::fs::remove_file(self.dir.join("writing"));
        } else {
            tracing::warn!(
                failed,
                "could not sync every cached blob; they are checked again at start"
            );
        }
    }

    fn lock_written(&self) -> std::sync::MutexGuard<'_, Vec<Digest>> {
        self.written.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

fn hash_file(mut file: &File, algorithm: Algorithm) -> std::io::Result<Digest> {
    let mut hasher = algorithm.hasher();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            return Ok(hasher.finish());
        }
        hasher.update(&buf[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(store: &Store, bytes: &[u8]) -> Digest {
        let digest = Algorithm::Sha256.digest_bytes(bytes);
        let (tmp, _) = store.temp_file().unwrap();
        std::fs::write(&tmp, bytes).unwrap();
        store
            .commit(&tmp, &digest, bytes.len() as u64, false)
            .unwrap();
        digest
    }

    #[test]
    fn least_recently_used_blobs_go_first_and_open_ones_stay_readable() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 300).unwrap();
        let a = put(&store, &[1; 100]);
        let b = put(&store, &[2; 100]);
        let c = put(&store, &[3; 100]);
        let mut held = store.open_blob(&a).unwrap(); // a is now the most recent
        let _d = put(&store, &[4; 100]);
        assert!(store.size(&b).is_none(), "b was the least recently used");
        assert!(store.size(&a).is_some() && store.size(&c).is_some());
        let _e = put(&store, &[5; 100]);
        let _f = put(&store, &[6; 100]);
        assert!(store.size(&a).is_none(), "a is evicted in its turn");
        let mut bytes = Vec::new();
        held.file.read_to_end(&mut bytes).unwrap();
        assert_eq!(
            bytes, [1; 100],
            "a reader that had it open reads it to the end"
        );
        assert_eq!(store.usage().0, 300);
    }

    #[test]
    fn a_reopened_cache_keeps_its_blobs_and_checks_them_after_a_machine_crash() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        let good = put(&store, b"good bytes");
        let torn = put(&store, b"bytes that will be torn");
        drop(store);
        // The machine went down: the marker names another boot, and one file lost its tail.
        std::fs::write(dir.path().join("writing"), "another-boot").unwrap();
        let hex = torn.hex();
        let path = dir.path().join("blobs/sha256").join(&hex[..2]).join(hex);
        std::fs::write(&path, b"bytes that").unwrap();
        let store = Store::open(dir.path(), 1 << 20).unwrap();
        assert!(store.open_blob(&good).is_some());
        assert!(
            store.open_blob(&torn).is_none(),
            "a torn file is never served"
        );
        assert!(!path.exists());
        store.close();
        assert!(!dir.path().join("writing").exists());
    }
}
