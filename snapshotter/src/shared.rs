//! What every reader of one mounted version shares: its inode table and chunk list, the fetcher
//! and node cache, and what the mount has learned of its readers (sequential runs, walks through
//! the tree, safetensors headers). Reads are assembled here from memory or the node cache, and
//! read-ahead is started here; the FUSE side ([`crate::fs`]) only answers the kernel.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use fuser::{Errno, FileAttr, FileType, INodeNo};
use vial_core::volume::ChunkRef;

use crate::cache::CacheError;
use crate::errno;
use crate::fetch::{self, Fetcher, Priority};
use crate::inodes::{FileNode, Inodes, NodeKind, Piece};
use crate::stats::{InFlight, Stats};

/// Largest read the kernel sends us, and how far it reads ahead.
pub(crate) const MAX_IO: u32 = 1024 * 1024;
/// The furthest ahead of a sequential reader that chunks are fetched.
const READAHEAD_MAX: u64 = 64 * 1024 * 1024;
/// Read-ahead starts once a reader has read this much in sequence: a typical tensor read (a few
/// MiB) fetches nothing beyond the tensor, a model streaming a multi-GiB shard soon runs 64 MiB ahead.
const READAHEAD_START: u64 = 8 * 1024 * 1024;

/// The kernel's page size: reads through the page cache start on a page boundary.
const PAGE: u64 = 4096;

/// The byte ranges of a safetensors file's tensors, sorted; `None` for a file that is not one.
type TensorSpans = Option<Arc<Vec<(u64, u64)>>>;

#[derive(Debug)]
pub struct Shared {
    pub inodes: Inodes,
    pub chunks: Vec<ChunkRef>,
    pub fetcher: Arc<Fetcher>,
    pub stats: Arc<Stats>,
    pub runtime: tokio::runtime::Handle,
    pub reference: String,
    pub uid: u32,
    pub gid: u32,
    pub time: SystemTime,
    /// Per file, the reader's sequential run and how far readahead has been started.
    pub readahead: Mutex<HashMap<u64, ReadAhead>>,
    /// How far a program walking the tree's files in order has got (see [`crate::walk`]).
    pub walk: Mutex<crate::walk::Walk>,
    /// Per file, its tensors once its safetensors header has been read through the mount.
    pub tensors: Mutex<HashMap<u64, TensorSpans>>,
    /// The statistics file as each open of it saw them, by file handle: a reader that reads it in
    /// several calls gets one consistent document, not the start of one and the end of the next.
    pub stats_opens: StatsOpens,
}

/// Snapshots of the statistics file per open handle.
#[derive(Debug, Default)]
pub struct StatsOpens {
    next: std::sync::atomic::AtomicU64,
    open: Mutex<HashMap<u64, Arc<Vec<u8>>>>,
}

impl StatsOpens {
    pub(crate) fn open(&self, json: Vec<u8>) -> u64 {
        // Handle 0 is every other file's; statistics handles start at 1.
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(mut open) = self.open.lock() {
            open.insert(fh, Arc::new(json));
        }
        fh
    }

    pub(crate) fn get(&self, fh: u64) -> Option<Arc<Vec<u8>>> {
        self.open.lock().ok()?.get(&fh).cloned()
    }

    pub(crate) fn close(&self, fh: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.remove(&fh);
        }
    }
}

/// Sequential-read detection for one file.
#[derive(Debug, Default)]
pub struct ReadAhead {
    /// Where the last read ended.
    last_end: u64,
    /// Bytes read sequentially up to `last_end`.
    run: u64,
    /// Chunks below this index have had a fetch started.
    mark: usize,
}

impl Shared {
    pub(crate) fn attr(&self, ino: u64) -> Option<FileAttr> {
        let node = self.inodes.get(ino)?;
        let (kind, perm, size, nlink) = match &node.kind {
            NodeKind::Dir { mode, .. } => (FileType::Directory, *mode, 0, 2),
            NodeKind::File(f) => (FileType::RegularFile, f.mode, f.size, 1),
            NodeKind::Symlink { target } => (FileType::Symlink, 0o777, target.len() as u64, 1),
            NodeKind::Stats => (
                FileType::RegularFile,
                0o444,
                self.stats_json().len() as u64,
                1,
            ),
        };
        Some(FileAttr {
            ino: INodeNo(ino),
            size,
            blocks: size.div_ceil(512),
            atime: self.time,
            mtime: self.time,
            ctime: self.time,
            crtime: self.time,
            kind,
            perm: perm as u16,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: MAX_IO,
            flags: 0,
        })
    }

    pub(crate) fn stats_json(&self) -> Vec<u8> {
        let cache = self.fetcher.cache();
        let snapshot = self
            .stats
            .snapshot(&self.reference, cache.total(), cache.limit());
        let mut v = serde_json::to_vec_pretty(&snapshot).unwrap_or_default();
        v.push(b'\n');
        v
    }

    /// The bytes of the pieces, from memory or the cache. A read within one chunk held in memory
    /// (most reads of a cold mount) is a slice of it, not a copy. `Err(None)` means a chunk is not
    /// (or no longer) there.
    pub(crate) fn assemble(&self, pieces: &[Piece]) -> Result<bytes::Bytes, Option<CacheError>> {
        if let [p] = pieces {
            let digest = &self.chunks[p.chunk as usize].digest;
            if let Some(chunk) = self.fetcher.in_memory(digest) {
                let (start, end) = (p.offset as usize, (p.offset + p.len) as usize);
                if end <= chunk.len() {
                    return Ok(chunk.slice(start..end));
                }
            }
        }
        let total: u64 = pieces.iter().map(|p| p.len).sum();
        // Pieces still in memory are appended as they are; only those read from the cache files
        // need room made (zeroed) for them first.
        let mut buf = Vec::with_capacity(total as usize);
        for p in pieces {
            let digest = &self.chunks[p.chunk as usize].digest;
            let (start, end) = (p.offset as usize, (p.offset + p.len) as usize);
            if let Some(chunk) = self.fetcher.in_memory(digest) {
                if let Some(slice) = chunk.get(start..end) {
                    buf.extend_from_slice(slice);
                    continue;
                }
            }
            let pos = buf.len();
            buf.resize(pos + (end - start), 0);
            match self.fetcher.read_at(digest, p.offset, &mut buf[pos..]) {
                Ok(()) => {}
                Err(CacheError::Missing(_)) => return Err(None),
                Err(e) => return Err(Some(e)),
            }
        }
        Ok(buf.into())
    }

    /// Fetches what is missing, then reads. Runs on the async runtime.
    pub(crate) async fn read_async(
        self: Arc<Self>,
        pieces: Vec<Piece>,
    ) -> Result<bytes::Bytes, Errno> {
        // A chunk can be evicted between being fetched and being read when the cache is tiny
        // compared with the readers' working set; try a few times before giving up.
        for _ in 0..4 {
            let fetches = pieces.iter().map(|p| {
                let c = &self.chunks[p.chunk as usize];
                self.fetcher.ensure(&c.digest, c.size, Priority::Demand)
            });
            for result in futures_util::future::join_all(fetches).await {
                if let Err(e) = result {
                    tracing::error!(error = %vial_core::error_chain(&e), reference = %self.reference, "read failed: chunk unavailable");
                    return Err(errno::from_fetch(&e));
                }
            }
            let me = Arc::clone(&self);
            let p = pieces.clone();
            match tokio::task::spawn_blocking(move || me.assemble(&p)).await {
                Ok(Ok(buf)) => return Ok(buf),
                Ok(Err(None)) => continue,
                Ok(Err(Some(e))) => return Err(errno::from_cache(&e)),
                Err(_) => return Err(Errno::EIO),
            }
        }
        Err(Errno::EIO)
    }

    /// Whether every chunk the pieces touch can be read without fetching it.
    pub(crate) fn all_available(&self, pieces: &[Piece]) -> bool {
        pieces.iter().all(|p| {
            self.fetcher
                .available(&self.chunks[p.chunk as usize].digest)
        })
    }

    /// The bytes `[start, end)` of a file if every chunk holding them is in the cache.
    pub(crate) fn read_cached(
        &self,
        file: &FileNode,
        start: u64,
        end: u64,
    ) -> Option<bytes::Bytes> {
        let pieces = file.pieces(start, end);
        if !self.all_available(&pieces) {
            return None;
        }
        self.assemble(&pieces).ok()
    }

    /// The tensors of a safetensors file, parsed from its header once the reader has read the
    /// header through the mount (every loader does, first). Any file whose first bytes parse as a
    /// safetensors header counts, whatever its name; a file whose do not is remembered as not one.
    pub(crate) fn tensor_spans(&self, ino: u64, file: &FileNode) -> TensorSpans {
        if let Some(known) = self
            .tensors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ino)
        {
            return known.clone();
        }
        if file.size < 8 {
            return None;
        }
        let first8 = self.read_cached(file, 0, 8)?;
        let spans = match vial_core::safetensors::header_len(&first8, file.size) {
            Err(_) => None,
            Ok(n) => {
                let json = self.read_cached(file, 8, 8 + n)?;
                vial_core::safetensors::parse_header(&json, file.size)
                    .ok()
                    .map(|t| Arc::new(t.iter().map(|t| (t.start, t.end)).collect()))
            }
        };
        self.tensors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(ino, spans.clone());
        spans
    }

    /// Where the tensor holding byte `offset` ends, if the file is a safetensors file whose header
    /// has been read.
    pub(crate) fn tensor_end(&self, ino: u64, file: &FileNode, offset: u64) -> Option<u64> {
        let spans = self.tensor_spans(ino, file)?;
        let i = spans.partition_point(|&(_, end)| end <= offset);
        let &(start, end) = spans.get(i)?;
        (start <= offset).then_some(end)
    }

    /// Fetches chunks a reader will ask for next, one bulk read per run, on the demand slots.
    /// A failed run costs nothing but speed: its chunks are fetched as they are read.
    pub(crate) fn fetch_ahead(self: &Arc<Self>, missing: Vec<(vial_core::Digest, u64)>) {
        for run in fetch::runs(missing) {
            let me = Arc::clone(self);
            let in_flight = InFlight::start(&self.stats);
            self.runtime.spawn(async move {
                let _in_flight = in_flight;
                match me.fetcher.ensure_run(&run, Priority::Demand).await {
                    Ok(n) => {
                        me.stats
                            .prefetched_chunks
                            .fetch_add(n as u64, Ordering::Relaxed);
                    }
                    Err(e) => {
                        tracing::warn!(error = %vial_core::error_chain(&e), "read-ahead failed; readers fetch chunk by chunk")
                    }
                }
            });
        }
    }

    /// Starts fetching chunks ahead of a reader, so they arrive in parallel rather than one read
    /// request at a time:
    /// - when a read jumps into a safetensors tensor, the rest of the tensor (up to 64 MiB ahead):
    ///   loaders read tensors whole, and the chunks stop at the tensor's end, so nothing else is
    ///   fetched;
    /// - after a sequential run, a window that grows with the run (up to 64 MiB), so a random read
    ///   fetches little beyond itself while a model streaming its weights keeps many chunks in
    ///   flight.
    ///
    /// Only a jump says where a program chose to read. Requests that continue the previous one are
    /// often the kernel's own read-ahead running past what was asked (a header read runs into the
    /// embedding table, a tensor read into the next tensor); they must not pull in whole tensors.
    pub(crate) fn read_ahead(self: &Arc<Self>, ino: u64, file: &FileNode, offset: u64, end: u64) {
        let continues = |ra: &ReadAhead| offset == ra.last_end && offset != 0;
        let jump = !self
            .readahead
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ino)
            .is_some_and(continues);
        // The kernel reads whole pages: the program's read starts within the request's first page,
        // which may begin in the tail of the tensor before.
        let tensor_end = jump
            .then(|| {
                let first_page_end = (offset | (PAGE - 1)).min(end.saturating_sub(1));
                self.tensor_end(ino, file, first_page_end.max(offset))
            })
            .flatten()
            .filter(|&e| e > end)
            .map(|e| e.min(end + READAHEAD_MAX));
        let (start, last) = {
            let mut map = self.readahead.lock().unwrap_or_else(|p| p.into_inner());
            let ra = map.entry(ino).or_default();
            if continues(ra) {
                ra.run += end - offset;
            } else {
                // A jump: what was started ahead of the old position says nothing about this one.
                ra.run = end - offset;
                ra.mark = 0;
            }
            ra.last_end = end;
            let sequential = (ra.run >= READAHEAD_START).then(|| end + ra.run.min(READAHEAD_MAX));
            let Some(until) = sequential.max(tensor_end).map(|u| u.min(file.size)) else {
                return;
            };
            if until <= end {
                return;
            }
            let first = file.chunk_at(end);
            let last = file.chunk_at(until - 1);
            let start = first.max(ra.mark);
            if last < start {
                return;
            }
            // Extend in large steps, once less than half the window is already on its way: a
            // step is a few bulk reads, not a request per chunk.
            let halfway = file.chunk_at(end + (until - end) / 2);
            if ra.mark > halfway {
                return;
            }
            ra.mark = last + 1;
            tracing::trace!(
                ino,
                offset,
                end,
                ?tensor_end,
                ?sequential,
                start,
                last,
                "read-ahead"
            );
            (start, last)
        };
        let mut cached = Vec::new();
        let mut missing = Vec::new();
        for i in start..=last {
            let c = &self.chunks[file.chunks[i] as usize];
            if self.fetcher.available(&c.digest) {
                cached.push(c.digest.clone());
            } else {
                missing.push((c.digest.clone(), c.size));
            }
        }
        // A sequential reader asks for these next, in this order: they share the demand slots
        // with its reads, so whole-volume prefetch (background) can never hold them up.
        self.fetch_ahead(missing);
        // Chunks already in the node cache are read ahead too, from its disk.
        if !cached.is_empty() {
            let me = Arc::clone(self);
            self.runtime
                .spawn_blocking(move || me.fetcher.cache().will_need(&cached));
        }
    }

    /// Called when the file at tree `position` is read at its start: fetches ahead of a walk
    /// (see [`crate::walk`]).
    pub(crate) fn walk_ahead(self: &Arc<Self>, position: usize) {
        let range = {
            let mut walk = self.walk.lock().unwrap_or_else(|p| p.into_inner());
            walk.step(position, &self.inodes.file_ends)
        };
        let Some((range, window)) = range else { return };
        let missing = crate::walk::missing(&self.inodes, &self.chunks, range, window, |d| {
            self.fetcher.available(d)
        });
        tracing::trace!(position, chunks = missing.len(), "walk read-ahead");
        // The walker asks for these next: they share the demand slots with its reads.
        self.fetch_ahead(missing);
    }
}
