//! `vial push`: chunk a directory in parallel, upload only the chunks the registry lacks, seal.
//!
//! Three stages run at once: hashing threads read and chunk file segments; an async collector
//! batches new chunk digests and asks the registry which it already holds (one request per 4096
//! digests with vial's extension, HEADs elsewhere); upload tasks send the missing chunks, bounded in
//! number and in bytes held in memory. Nothing is published until every chunk is in: the version is
//! sealed by pushing its index last, so an interrupted push publishes nothing and the next push
//! finds the chunks already uploaded.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use vial_core::chunking::{Cutter, DEFAULT_PARAMS};
use vial_core::safetensors::Segment;
use vial_core::volume::{build_layout, ChunkRef, ChunkingInfo, Layout, Tree, TreeBuilder};
use vial_core::{media, Digest, RepoName};

use crate::chunker::{self, FileChunk, ReadBuffers};
use crate::progress::{Event, Progress};
use crate::scan::{self, LocalIndex, Scanned, Stamp};
use crate::{ClientError, Registry};
use vial_io::BufferPool;

/// Digests per existence check, the extension's limit.
const CHECK_BATCH: usize = crate::registry::PRESENT_BATCH;

#[derive(Debug, Clone)]
pub struct PushOptions {
    /// Threads that read and hash files.
    pub hash_threads: usize,
    /// Chunk uploads in flight at once.
    pub uploads: usize,
    /// Bytes of chunk data held for uploads at once.
    pub max_in_flight: u64,
    /// Read every file even if the local index says it is unchanged.
    pub rehash: bool,
    /// Where the local index lives; `None` disables it.
    pub index_path: Option<PathBuf>,
    /// Seal the version under this tag, in the same request (the index is sent once).
    pub seal_tag: Option<SealTag>,
}

/// The tag a version is sealed under, and the compare-and-swap condition for moving it (as in
/// [`tag_version`]).
#[derive(Debug, Clone)]
pub struct SealTag {
    pub tag: vial_core::Tag,
    pub expect: Option<Option<Digest>>,
}

impl PushOptions {
    pub fn for_dir(dir: &Path) -> Self {
        PushOptions {
            hash_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            uploads: 16,
            max_in_flight: 256 * 1024 * 1024,
            rehash: false,
            index_path: LocalIndex::path_for(dir),
            seal_tag: None,
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PushReport {
    pub digest: String,
    pub files: u64,
    pub bytes: u64,
    pub chunks: u64,
    pub chunks_uploaded: u64,
    pub bytes_uploaded: u64,
    pub chunks_reused: u64,
    pub bytes_reused: u64,
    pub files_unchanged: u64,
    pub bytes_read: u64,
    pub seconds: f64,
}

struct FileJob {
    path: String,
    abs: Arc<PathBuf>,
    mode: u32,
    stamp: Stamp,
    /// Chunks known from the local index; `None` means the file must be read.
    cached: Option<Vec<ChunkRef>>,
}

/// A chunk to check and perhaps upload, with where its bytes are.
#[derive(Clone)]
struct ChunkLoc {
    digest: Digest,
    abs: Arc<PathBuf>,
    offset: u64,
    len: u64,
    /// The bytes, as the hashers read them (`None` for files the local index vouched for: read
    /// again if they must be uploaded).
    bytes: Option<Bytes>,
}

/// What the hashers hand on: a file, a segment of it, and the next chunks cut from it.
type Hashed = (usize, usize, Vec<(FileChunk, Option<Bytes>)>);

/// Read buffers for the hashers: as many as the bytes a push may hold allow, but enough for the
/// hashers never to wait on each other (each holds two at most; a pack waiting to fill pins a
/// few).
fn read_buffers(max_in_flight: u64, cutter: &Cutter) -> usize {
    let one = chunker::ReadBuffers::capacity_bytes(1, cutter);
    ((max_in_flight / one) as usize).max(16)
}

#[derive(Default)]
struct Stats {
    uploaded: AtomicU64,
    bytes_uploaded: AtomicU64,
    reused: AtomicU64,
    bytes_reused: AtomicU64,
    bytes_read: AtomicU64,
}

/// What a push produced.
#[derive(Debug)]
pub struct Pushed {
    /// The sealed version: its index digest names it.
    pub layout: Layout,
    pub report: PushReport,
    /// What became of `options.seal_tag`: a tag the registry refused (moved meanwhile, protected)
    /// leaves the version sealed by digest and is reported here, not as a failed push. Other
    /// tags: see [`tag_version`].
    pub tag: Result<(), ClientError>,
}

/// Pushes `dir` as a new version of `repo`, in four stages: [`Plan::scan`] the directory,
/// hash its files on threads ([`hash_all`]), check and upload what the registry lacks as the
/// chunks arrive ([`Uploads`]), then build the tree ([`Plan::finish`]) and [`seal`] it.
pub async fn push(
    registry: &Registry,
    repo: &RepoName,
    dir: &Path,
    options: &PushOptions,
    progress: Arc<dyn Progress>,
) -> Result<Pushed, ClientError> {
    let started = Instant::now();
    let cutter = Cutter::new(DEFAULT_PARAMS);
    let (plan, files) = Plan::scan(dir, options).await?;
    let total_bytes: u64 = files.iter().map(|f| f.stamp.size).sum();
    progress.event(Event::Scanned {
        files: files.len() as u64,
        bytes: total_bytes,
    });
    let files = Arc::new(files);

    let buffers = ReadBuffers::new(&cutter, read_buffers(options.max_in_flight, &cutter));
    let starved = buffers.starved();
    let (tx, rx) = mpsc::channel::<Hashed>(1024);
    let stats = Arc::new(Stats::default());
    let hashing = {
        let files = Arc::clone(&files);
        let progress = Arc::clone(&progress);
        let stats = Arc::clone(&stats);
        let threads = options.hash_threads.max(1);
        tokio::task::spawn_blocking(move || {
            hash_all(&files, &cutter, threads, &buffers, &tx, &*progress, &stats)
        })
    };
    let mut uploads = Uploads::new(registry, repo, &files, options, &progress, &stats);
    uploads.collect(rx, &starved).await?;
    hashing.await.map_err(ClientError::task("hashing"))??;
    let per_file = uploads.finish().await?;

    let tree = plan.finish(&files, per_file, options)?;
    let layout = build_layout(&tree);
    let tag = seal(registry, repo, &layout, options.seal_tag.as_ref()).await?;
    let report = PushReport {
        digest: layout.index.digest.to_string(),
        files: files.len() as u64,
        bytes: tree.total_bytes(),
        chunks: tree.chunks.len() as u64,
        chunks_uploaded: stats.uploaded.load(Ordering::Relaxed),
        bytes_uploaded: stats.bytes_uploaded.load(Ordering::Relaxed),
        chunks_reused: stats.reused.load(Ordering::Relaxed),
        bytes_reused: stats.bytes_reused.load(Ordering::Relaxed),
        files_unchanged: files.iter().filter(|f| f.cached.is_some()).count() as u64,
        bytes_read: stats.bytes_read.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok(Pushed {
        layout,
        report,
        tag,
    })
}

/// The first stage: what the directory holds. Directories and symlinks go into the tree at once;
/// files wait for their chunks, those the local index vouches for with them already.
struct Plan {
    builder: TreeBuilder,
    index: LocalIndex,
}

impl Plan {
    async fn scan(dir: &Path, options: &PushOptions) -> Result<(Plan, Vec<FileJob>), ClientError> {
        let chunking = ChunkingInfo::v1(DEFAULT_PARAMS);
        let root = dir.to_path_buf();
        let entries = tokio::task::spawn_blocking(move || scan::scan(&root))
            .await
            .map_err(ClientError::task("scan"))??;
        let index = options
            .index_path
            .as_ref()
            .map(|p| LocalIndex::load(p, &chunking.algorithm))
            .unwrap_or_default();
        let mut builder = TreeBuilder::new(chunking);
        let mut files: Vec<FileJob> = Vec::new();
        for (path, scanned) in &entries {
            match scanned {
                Scanned::Dir => builder.add_dir(path)?,
                Scanned::Symlink { target } => builder.add_symlink(path, target)?,
                Scanned::File { abs, mode, stamp } => files.push(FileJob {
                    path: path.clone(),
                    abs: Arc::new(abs.clone()),
                    mode: *mode,
                    stamp: stamp.clone(),
                    cached: if options.rehash {
                        None
                    } else {
                        index.lookup(path, stamp).map(<[_]>::to_vec)
                    },
                }),
            }
        }
        Ok((Plan { builder, index }, files))
    }

    /// The last stage before the seal, once every chunk is in the registry: the tree, from the
    /// chunks each file was cut into (`per_file`, by segment), remembered in the local index.
    fn finish(
        mut self,
        files: &[FileJob],
        per_file: Vec<Vec<Vec<FileChunk>>>,
        options: &PushOptions,
    ) -> Result<Tree, ClientError> {
        for (f, segments) in files.iter().zip(per_file) {
            let chunks: Vec<ChunkRef> = match &f.cached {
                Some(c) => c.clone(),
                None => segments
                    .into_iter()
                    .flatten()
                    .map(|c| ChunkRef {
                        digest: c.digest,
                        size: c.len,
                    })
                    .collect(),
            };
            self.index
                .insert(f.path.clone(), f.stamp.clone(), chunks.clone());
            self.builder.add_file(&f.path, f.mode, chunks)?;
        }
        let tree = self.builder.finish()?;
        if let Some(path) = &options.index_path {
            let keep: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
            self.index.retain(|p| keep.contains(p));
            self.index.save(path);
        }
        Ok(tree)
    }
}

/// The third stage, running while the hashers do: takes the chunks they cut as they come, asks
/// the registry which it lacks a batch at a time, and sends those, bounded in number and in bytes
/// held. New chunks travel in packs of consecutive chunks (one request, one store write and one
/// metadata commit for many chunks), or one by one where the registry takes no packs.
struct Uploads<'a> {
    registry: &'a Registry,
    repo: &'a RepoName,
    files: &'a [FileJob],
    progress: &'a Arc<dyn Progress>,
    stats: &'a Arc<Stats>,
    /// Each file's chunks by segment, appended as the hashers hand them on.
    per_file: Vec<Vec<Vec<FileChunk>>>,
    seen: HashSet<Digest>,
    /// New chunks waiting for their existence check.
    pending: Vec<ChunkLoc>,
    /// Chunks the registry lacks, waiting to fill a pack.
    unsent: Vec<ChunkLoc>,
    sending: JoinSet<Result<(), ClientError>>,
    count_limit: Arc<Semaphore>,
    mib_limit: Arc<Semaphore>,
    pool: BufferPool,
}

impl<'a> Uploads<'a> {
    fn new(
        registry: &'a Registry,
        repo: &'a RepoName,
        files: &'a [FileJob],
        options: &PushOptions,
        progress: &'a Arc<dyn Progress>,
        stats: &'a Arc<Stats>,
    ) -> Self {
        Uploads {
            registry,
            repo,
            files,
            progress,
            stats,
            per_file: vec![Vec::new(); files.len()],
            seen: HashSet::new(),
            pending: Vec::new(),
            unsent: Vec::new(),
            sending: JoinSet::new(),
            count_limit: Arc::new(Semaphore::new(options.uploads.max(1))),
            mib_limit: Arc::new(Semaphore::new(
                ((options.max_in_flight >> 20).max(PACK_TARGET >> 20)) as usize,
            )),
            pool: BufferPool::new(POOLED),
        }
    }

    /// Takes what the hashers send until they are done, checking a batch whenever it is full or
    /// they pause (`starved`: they wait for read buffers that only sent chunks give back).
    async fn collect(
        &mut self,
        mut rx: mpsc::Receiver<Hashed>,
        starved: &tokio::sync::Notify,
    ) -> Result<(), ClientError> {
        let mut closed = false;
        while !closed {
            let mut stalled = false;
            // Take everything available, then flush a batch if it is full or the hashers paused.
            let msg = if self.pending.len() >= CHECK_BATCH {
                None
            } else if self.pending.is_empty() {
                tokio::select! {
                    m = rx.recv() => m.map(Some).unwrap_or_else(|| {
                        closed = true;
                        None
                    }),
                    () = starved.notified() => {
                        stalled = true;
                        None
                    }
                }
            } else {
                match rx.try_recv() {
                    Ok(m) => Some(m),
                    Err(mpsc::error::TryRecvError::Empty) => None,
                    Err(mpsc::error::TryRecvError::Disconnected) => {
                        closed = true;
                        None
                    }
                }
            };
            if let Some(hashed) = msg {
                self.take(hashed);
                if self.pending.len() < CHECK_BATCH {
                    continue;
                }
            }
            self.flush(closed, stalled).await?;
        }
        Ok(())
    }

    /// Records the chunks the hashers cut from a segment of a file, queuing new ones for a check.
    fn take(&mut self, (file, seg, chunks): Hashed) {
        let slots = &mut self.per_file[file];
        if slots.len() <= seg {
            slots.resize(seg + 1, Vec::new());
        }
        for (c, bytes) in chunks {
            if self.seen.insert(c.digest.clone()) {
                self.pending.push(ChunkLoc {
                    digest: c.digest.clone(),
                    abs: Arc::clone(&self.files[file].abs),
                    offset: c.offset,
                    len: c.len,
                    bytes,
                });
            }
            slots[seg].push(c);
        }
    }

    /// Checks the pending chunks and sends those the registry lacks. A pack that is not full
    /// waits for the next chunks until the hashers are done (`closed`), so packs stay full however
    /// their output is batched (16 per GiB: the S3 PUT budget), unless the hashers are `stalled`
    /// on the buffers it holds.
    async fn flush(&mut self, closed: bool, stalled: bool) -> Result<(), ClientError> {
        if !self.pending.is_empty() {
            let batch = std::mem::take(&mut self.pending);
            let missing = missing_chunks(self.registry, self.repo, batch, self.stats).await?;
            self.unsent.extend(missing);
        }
        let groups = if self.registry.packs_unsupported() {
            std::mem::take(&mut self.unsent)
                .into_iter()
                .map(|loc| vec![loc])
                .collect()
        } else {
            // The hashers wait for buffers, and no upload will give any back: the pack waiting
            // to fill holds them, so it goes now.
            let stuck = stalled && {
                self.reap()?;
                self.sending.is_empty()
            };
            let mut packs = into_packs(std::mem::take(&mut self.unsent));
            if stuck && !closed {
                tracing::debug!(
                    chunks = packs.last().map_or(0, Vec::len),
                    "sending a pack before it is full: the hashers wait for the buffers it holds"
                );
            } else if !closed {
                self.unsent = packs.pop().unwrap_or_default();
            }
            packs
        };
        for group in groups {
            self.send(group).await?;
            // Surface upload failures early instead of after the whole scan.
            self.reap()?;
        }
        Ok(())
    }

    /// Starts an upload of `group` once the limits let it.
    async fn send(&mut self, group: Vec<ChunkLoc>) -> Result<(), ClientError> {
        let len: u64 = group.iter().map(|c| c.len).sum();
        let mib = (len.div_ceil(1 << 20) as u32).max(1);
        let bytes_permit = Arc::clone(&self.mib_limit)
            .acquire_many_owned(mib)
            .await
            .map_err(|_| ClientError::Cancelled)?;
        let count_permit = Arc::clone(&self.count_limit)
            .acquire_owned()
            .await
            .map_err(|_| ClientError::Cancelled)?;
        let (registry, repo, stats, progress, pool) = (
            self.registry.clone(),
            self.repo.clone(),
            Arc::clone(self.stats),
            Arc::clone(self.progress),
            self.pool.clone(),
        );
        progress.event(Event::Needed(len));
        self.sending.spawn(async move {
            let _held = (bytes_permit, count_permit);
            upload_group(&registry, &repo, &group, &stats, &*progress, &pool).await
        });
        Ok(())
    }

    /// The first failure among the uploads that have finished, if any.
    fn reap(&mut self) -> Result<(), ClientError> {
        while let Some(done) = self.sending.try_join_next() {
            done.map_err(ClientError::task("upload"))??;
        }
        Ok(())
    }

    /// Waits for every upload; then each file's chunks, by segment.
    async fn finish(mut self) -> Result<Vec<Vec<Vec<FileChunk>>>, ClientError> {
        while let Some(done) = self.sending.join_next().await {
            done.map_err(ClientError::task("upload"))??;
        }
        Ok(self.per_file)
    }
}

/// Plans and chunks every file that the local index could not vouch for, on `threads` threads.
/// Files known from the index are announced whole, so their chunks are still checked.
///
/// A file is opened when a hasher takes it up and closed when its last segment is chunked: a
/// hasher takes up a new file only when no segment of an open one is waiting, so at most about
/// two files per thread are open, however many the directory holds.
fn hash_all(
    files: &[FileJob],
    cutter: &Cutter,
    threads: usize,
    buffers: &ReadBuffers,
    tx: &mpsc::Sender<Hashed>,
    progress: &dyn Progress,
    stats: &Stats,
) -> Result<(), ClientError> {
    let mut to_read = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let Some(cached) = &f.cached else {
            to_read.push(i);
            continue;
        };
        let mut offset = 0;
        let chunks = cached
            .iter()
            .map(|c| {
                let fc = FileChunk {
                    offset,
                    len: c.size,
                    digest: c.digest.clone(),
                };
                offset += c.size;
                (fc, None)
            })
            .collect();
        progress.event(Event::Hashed(f.stamp.size));
        tx.blocking_send((i, 0, chunks))
            .map_err(|_| ClientError::Cancelled)?;
    }
    let work = std::sync::Mutex::new(Work {
        next: 0,
        waiting: std::collections::VecDeque::new(),
    });
    let failed = std::sync::atomic::AtomicBool::new(false);
    let hasher = || -> Result<(), ClientError> {
        while !failed.load(Ordering::Relaxed) {
            let taken = {
                let mut w = work.lock().unwrap_or_else(|p| p.into_inner());
                match w.waiting.pop_front() {
                    Some(job) => Ok(job),
                    None if w.next < to_read.len() => {
                        w.next += 1;
                        Err(to_read[w.next - 1])
                    }
                    None => return Ok(()),
                }
            };
            let (open, seg, segment) = match taken {
                Ok(job) => job,
                Err(file) => {
                    let (open, mut segments) = open_file(file, &files[file])?;
                    let Some((seg, segment)) = segments.next() else {
                        open.finished(&files[file])?;
                        continue;
                    };
                    work.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .waiting
                        .extend(segments.map(|(seg, s)| (Arc::clone(&open), seg, s)));
                    (open, seg, segment)
                }
            };
            let f = &files[open.file];
            chunker::chunk_segment_owned(
                &f.abs,
                &open.reader,
                open.direct,
                &segment,
                cutter,
                buffers,
                &mut |cut| {
                    let n: u64 = cut.iter().map(|(c, _)| c.len).sum();
                    stats.bytes_read.fetch_add(n, Ordering::Relaxed);
                    progress.event(Event::Hashed(n));
                    let cut = cut.into_iter().map(|(c, b)| (c, Some(b))).collect();
                    tx.blocking_send((open.file, seg, cut))
                        .map_err(|_| ClientError::Cancelled)
                },
            )?;
            if open.left.fetch_sub(1, Ordering::AcqRel) == 1 {
                open.finished(f)?;
            }
        }
        Ok(())
    };
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let r = hasher();
                    if r.is_err() {
                        failed.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut result = Ok(());
        for w in workers {
            let r = w
                .join()
                .unwrap_or_else(|_| Err(ClientError::Panicked("hashing")));
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

/// What the hashers share: the next file to take up, and segments of open files nobody has
/// taken yet.
struct Work {
    next: usize,
    waiting: std::collections::VecDeque<(Arc<OpenFile>, usize, Segment)>,
}

/// A file being chunked, open while any of its segments is.
struct OpenFile {
    file: usize,
    reader: File,
    direct: bool,
    /// Segments not chunked yet.
    left: AtomicUsize,
}

impl OpenFile {
    /// Checks, once every segment is chunked, that the file still has the size the scan saw: a
    /// file that changed size would make a tree that lies about it.
    fn finished(&self, job: &FileJob) -> Result<(), ClientError> {
        let now = self
            .reader
            .metadata()
            .map_err(|e| ClientError::io(&*job.abs, e))?
            .len();
        if now != job.stamp.size {
            return Err(ClientError::ChangedDuringPush {
                paths: vec![job.abs.to_path_buf()],
                how: format!("{} bytes when scanned, {now} now", job.stamp.size),
            });
        }
        Ok(())
    }
}

/// Opens a file to chunk and plans its segments (a safetensors file's are its tensors).
fn open_file(
    file: usize,
    job: &FileJob,
) -> Result<(Arc<OpenFile>, impl Iterator<Item = (usize, Segment)>), ClientError> {
    let handle = File::open(&*job.abs).map_err(|e| ClientError::io(&*job.abs, e))?;
    let segments = chunker::plan_file(&job.abs, &handle, job.stamp.size)?;
    let (reader, direct) = chunker::reader_for(&job.abs, handle, job.stamp.size)?;
    let open = Arc::new(OpenFile {
        file,
        reader,
        direct,
        left: AtomicUsize::new(segments.len()),
    });
    Ok((open, segments.into_iter().enumerate()))
}

/// Of a batch of new chunks, those the repository does not hold yet.
async fn missing_chunks(
    registry: &Registry,
    repo: &RepoName,
    batch: Vec<ChunkLoc>,
    stats: &Stats,
) -> Result<Vec<ChunkLoc>, ClientError> {
    let digests: Vec<Digest> = batch.iter().map(|c| c.digest.clone()).collect();
    let present = registry.present_blobs(repo, &digests).await?;
    let mut missing = Vec::new();
    for loc in batch {
        if present.contains(&loc.digest) {
            stats.reused.fetch_add(1, Ordering::Relaxed);
            stats.bytes_reused.fetch_add(loc.len, Ordering::Relaxed);
        } else {
            missing.push(loc);
        }
    }
    Ok(missing)
}

/// Largest pack `vial push` sends: 16 packs per GiB of new data (one PUT each on S3).
const PACK_TARGET: u64 = 64 << 20;
/// Most chunks in one pack (the registry takes up to 8192).
const PACK_CHUNKS: usize = 4096;

/// New chunks, grouped into packs of up to [`PACK_TARGET`] bytes in the order they came, each
/// pack then laid out in file order.
///
/// The hashers hand on fills of neighbouring tensors as they finish them, so the chunks of one
/// file arrive interleaved with another's. Which chunks share a pack stays the arrival order's
/// (it decides which read buffers a pack waiting to fill holds); inside a pack, each file's chunks
/// are put back together, so that reading a file back asks the store for one range of the pack
/// where it would ask for several (one S3 GET instead of one for each fill).
fn into_packs(chunks: Vec<ChunkLoc>) -> Vec<Vec<ChunkLoc>> {
    let mut packs = cut_packs(chunks);
    for pack in &mut packs {
        pack.sort_by(|a, b| (&*a.abs, a.offset).cmp(&(&*b.abs, b.offset)));
    }
    packs
}

/// Consecutive chunks, cut into packs of up to [`PACK_TARGET`] bytes.
fn cut_packs(chunks: Vec<ChunkLoc>) -> Vec<Vec<ChunkLoc>> {
    let mut packs: Vec<Vec<ChunkLoc>> = Vec::new();
    let mut size = 0;
    for c in chunks {
        match packs.last_mut() {
            Some(pack) if size + c.len <= PACK_TARGET && pack.len() < PACK_CHUNKS => {
                size += c.len;
                pack.push(c);
            }
            _ => {
                size = c.len;
                packs.push(vec![c]);
            }
        }
    }
    packs
}

/// Uploads a group of new chunks: as one pack where the registry takes packs, else one by one.
async fn upload_group(
    registry: &Registry,
    repo: &RepoName,
    group: &[ChunkLoc],
    stats: &Stats,
    progress: &dyn Progress,
    pool: &BufferPool,
) -> Result<(), ClientError> {
    let sent = if group.len() > 1 {
        let held: Option<Vec<Bytes>> = group.iter().map(|c| c.bytes.clone()).collect();
        let parts = match held {
            Some(parts) => parts,
            None => read_chunks(group.to_vec(), pool).await?,
        };
        let list: Vec<(Digest, u64)> = group.iter().map(|c| (c.digest.clone(), c.len)).collect();
        match registry.push_pack(repo, &list, parts).await {
            Ok(sent) => sent,
            Err(ClientError::Registry { code, .. }) if code == "DIGEST_INVALID" => {
                return Err(ClientError::ChangedDuringPush {
                    paths: group
                        .iter()
                        .map(|c| c.abs.to_path_buf())
                        .collect::<std::collections::BTreeSet<_>>()
                        .into_iter()
                        .collect(),
                    how: "its bytes no longer match what was hashed".into(),
                })
            }
            Err(e) => return Err(e),
        }
    } else {
        false
    };
    if !sent {
        for loc in group {
            upload_chunk(registry, repo, loc).await?;
        }
    }
    let len: u64 = group.iter().map(|c| c.len).sum();
    stats
        .uploaded
        .fetch_add(group.len() as u64, Ordering::Relaxed);
    stats.bytes_uploaded.fetch_add(len, Ordering::Relaxed);
    progress.event(Event::Transferred(len));
    Ok(())
}

/// The bytes of `chunks` as one buffer from `pool` (and each chunk's slice of it), read on a
/// blocking thread: each file opened once, each run of adjacent chunks read with one call.
async fn read_chunks(chunks: Vec<ChunkLoc>, pool: &BufferPool) -> Result<Vec<Bytes>, ClientError> {
    let pool = pool.clone();
    tokio::task::spawn_blocking(move || -> Result<Vec<Bytes>, ClientError> {
        let total: u64 = chunks.iter().map(|c| c.len).sum();
        // Every pack fits a buffer of the target size, so a pooled buffer never grows twice.
        let mut page = pool.take((total as usize).max(PACK_TARGET as usize));
        let buf = page.bytes_mut();
        let mut open: Option<(Arc<PathBuf>, File)> = None;
        let mut at = 0usize;
        let mut i = 0;
        while i < chunks.len() {
            // The run of chunks from `i` that sit end to end in the same file.
            let first = &chunks[i];
            let mut end = i + 1;
            let mut len = first.len;
            while let Some(c) = chunks.get(end) {
                if !Arc::ptr_eq(&c.abs, &first.abs) || c.offset != first.offset + len {
                    break;
                }
                len += c.len;
                end += 1;
            }
            let file = match &open {
                Some((path, file)) if Arc::ptr_eq(path, &first.abs) => file,
                _ => {
                    let file =
                        File::open(&*first.abs).map_err(|e| ClientError::io(&*first.abs, e))?;
                    &open.insert((Arc::clone(&first.abs), file)).1
                }
            };
            file.read_exact_at(&mut buf[at..at + len as usize], first.offset)
                .map_err(|e| ClientError::io(&*first.abs, e))?;
            at += len as usize;
            i = end;
        }
        let whole = pool.freeze(page, 0..total as usize);
        let mut parts = Vec::with_capacity(chunks.len());
        let mut at = 0usize;
        for c in &chunks {
            parts.push(whole.slice(at..at + c.len as usize));
            at += c.len as usize;
        }
        Ok(parts)
    })
    .await
    .map_err(ClientError::task("read"))?
}

/// Pack buffers kept for reuse at most; more than the in-flight bound ever needs at once. A first
/// push reads every new byte into a pack body, so those bodies reuse the few buffers the bound
/// allows (see [`crate::aligned`] on what fresh memory costs).
const POOLED: usize = 8;

async fn upload_chunk(
    registry: &Registry,
    repo: &RepoName,
    loc: &ChunkLoc,
) -> Result<(), ClientError> {
    let abs = Arc::clone(&loc.abs);
    let (offset, len) = (loc.offset, loc.len);
    let bytes = match &loc.bytes {
        Some(bytes) => bytes.clone(),
        None => tokio::task::spawn_blocking(move || -> Result<Bytes, ClientError> {
            let file = File::open(&*abs).map_err(|e| ClientError::io(&*abs, e))?;
            let mut buf = vec![0u8; len as usize];
            file.read_exact_at(&mut buf, offset)
                .map_err(|e| ClientError::io(&*abs, e))?;
            Ok(Bytes::from(buf))
        })
        .await
        .map_err(ClientError::task("read"))??,
    };
    match registry.push_blob(repo, &loc.digest, bytes).await {
        Err(ClientError::Registry { code, .. }) if code == "DIGEST_INVALID" => {
            Err(ClientError::ChangedDuringPush {
                paths: vec![loc.abs.to_path_buf()],
                how: format!("bytes at offset {offset} no longer match"),
            })
        }
        other => other,
    }
}

/// Uploads the tree blob and manifests, index last: the index push is the moment of sealing. With
/// `tag`, the index is pushed under the tag, which seals the version and moves the tag in one
/// request; if the registry refuses the tag, the index is pushed by digest instead and the refusal
/// is returned as the tag's outcome.
async fn seal(
    registry: &Registry,
    repo: &RepoName,
    layout: &Layout,
    tag: Option<&SealTag>,
) -> Result<Result<(), ClientError>, ClientError> {
    // The empty descriptor's blob (media::OCI_EMPTY_DIGEST names it).
    let empty = vial_core::Algorithm::Sha256.digest_bytes(b"{}");
    let mut blobs = vec![(&empty, Bytes::from_static(b"{}"))];
    blobs.extend(
        layout
            .blobs()
            .map(|b| (&b.digest, Bytes::from(b.bytes.clone()))),
    );
    let digests: Vec<Digest> = blobs.iter().map(|(d, _)| (*d).clone()).collect();
    let present = registry.present_blobs(repo, &digests).await?;
    for (digest, bytes) in blobs {
        if !present.contains(digest) {
            registry.push_blob(repo, digest, bytes).await?;
        }
    }
    let parts = futures_util::stream::iter(layout.parts.iter())
        .map(|part| async move {
            if !registry.manifest_exists(repo, &part.digest).await? {
                registry
                    .put_manifest(
                        repo,
                        part.digest.as_str(),
                        media::OCI_MANIFEST,
                        Bytes::from(part.bytes.clone()),
                        None,
                    )
                    .await?;
            }
            Ok::<_, ClientError>(())
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for p in parts {
        p?;
    }
    for manifest in std::iter::once(&layout.tree_manifest).chain(&layout.images) {
        registry
            .put_manifest(
                repo,
                manifest.digest.as_str(),
                media::OCI_MANIFEST,
                Bytes::from(manifest.bytes.clone()),
                None,
            )
            .await?;
    }
    let index = Bytes::from(layout.index.bytes.clone());
    let tagged = match tag {
        None => Ok(()),
        Some(t) => {
            let expect = t.expect.as_ref().map(Option::as_ref);
            let pushed = put_tagged(
                registry,
                repo,
                media::OCI_INDEX,
                index.clone(),
                &t.tag,
                expect,
                None,
            );
            match pushed.await {
                Ok(()) => return Ok(Ok(())),
                Err(e) if is_refusal(&e) => Err(e),
                Err(e) => return Err(e),
            }
        }
    };
    registry
        .put_manifest(
            repo,
            layout.index.digest.as_str(),
            media::OCI_INDEX,
            index,
            None,
        )
        .await?;
    Ok(tagged)
}

/// Whether the registry answered a tag push with a refusal of the tag itself (so the manifest
/// can still be pushed by digest), rather than failing the request.
fn is_refusal(e: &ClientError) -> bool {
    match e {
        ClientError::TagMoved { .. } | ClientError::Denied(_) => true,
        ClientError::Registry { status, .. } => matches!(status, 400 | 403 | 409 | 412),
        _ => false,
    }
}

/// Pushes a version's manifest bytes under `tag`, naming the tag in a compare-and-swap failure.
async fn put_tagged(
    registry: &Registry,
    repo: &RepoName,
    media_type: &str,
    bytes: Bytes,
    tag: &vial_core::Tag,
    expect: Option<Option<&Digest>>,
    expires_at: Option<&str>,
) -> Result<(), ClientError> {
    registry
        .put_manifest_expiring(repo, tag.as_str(), media_type, bytes, expect, expires_at)
        .await
        .map_err(|e| match e {
            ClientError::TagMoved {
                current, expected, ..
            } => ClientError::TagMoved {
                tag: tag.to_string(),
                current,
                expected,
            },
            e => e,
        })?;
    Ok(())
}

/// Points `tag` at an existing version by pushing its index bytes under the tag, optionally only if
/// the tag currently points at `expect` (`Some(None)`: only if the tag does not exist).
pub async fn tag_version(
    registry: &Registry,
    repo: &RepoName,
    version: &Digest,
    tag: &vial_core::Tag,
    expect: Option<Option<&Digest>>,
    expires_at: Option<&str>,
) -> Result<(), ClientError> {
    let manifest = registry
        .get_manifest(repo, &vial_core::Target::Digest(version.clone()))
        .await?
        .ok_or_else(|| ClientError::NotFound(format!("{}/{repo}@{version}", registry.host())))?;
    put_tagged(
        registry,
        repo,
        &manifest.media_type,
        manifest.bytes,
        tag,
        expect,
        expires_at,
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loc(file: &Arc<PathBuf>, offset: u64, len: u64) -> ChunkLoc {
        ChunkLoc {
            digest: vial_core::Algorithm::Sha256
                .digest_bytes(format!("{}:{offset}", file.display()).as_bytes()),
            abs: Arc::clone(file),
            offset,
            len,
            bytes: None,
        }
    }

    /// Fills of two files arrive interleaved; each pack keeps the chunks it would have held in
    /// arrival order, laid out file by file, offsets rising.
    #[test]
    fn packs_hold_the_arrival_orders_chunks_in_file_order() {
        let (a, b) = (
            Arc::new(PathBuf::from("/ckpt/a.safetensors")),
            Arc::new(PathBuf::from("/ckpt/b.safetensors")),
        );
        let mib = 1 << 20;
        let mut arrived = Vec::new();
        for fill in 0..40u64 {
            // Four 2 MiB chunks per fill, b's fills and a's taking turns.
            let file = if fill % 2 == 0 { &b } else { &a };
            for i in 0..4 {
                arrived.push(loc(file, (fill / 2 * 4 + i) * 2 * mib, 2 * mib));
            }
        }
        let as_cut = cut_packs(arrived.clone());
        let packs = into_packs(arrived);
        assert_eq!(packs.len(), as_cut.len());
        assert!(packs.len() > 1);
        for (pack, cut) in packs.iter().zip(&as_cut) {
            let set = |p: &[ChunkLoc]| p.iter().map(|c| c.digest.clone()).collect::<HashSet<_>>();
            assert_eq!(set(pack), set(cut));
            let order: Vec<(&Path, u64)> =
                pack.iter().map(|c| (c.abs.as_path(), c.offset)).collect();
            let mut sorted = order.clone();
            sorted.sort();
            assert_eq!(order, sorted);
            // Each file's chunks are one run of adjacent bytes within the pack.
            for file in [&a, &b] {
                let mine: Vec<&ChunkLoc> = pack.iter().filter(|c| c.abs == *file).collect();
                for w in mine.windows(2) {
                    assert_eq!(w[0].offset + w[0].len, w[1].offset);
                }
            }
        }
    }
}
