//! The third stage of a push: existence checks in batches, and uploads of what the registry
//! lacks, in packs where it takes them.

use std::collections::HashSet;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;
use vial_core::{Digest, RepoName};
use vial_io::BufferPool;

use super::work::{ChunkLoc, FileJob, Hashed, Stats};
use crate::chunker::FileChunk;
use crate::progress::{Event, Progress};
use crate::{ClientError, Registry};

/// The third stage, running while the hashers do: takes the chunks they cut as they come, asks
/// the registry which it lacks a batch at a time, and sends those, bounded in number and in bytes
/// held. New chunks travel in packs of consecutive chunks (one request, one store write and one
/// metadata commit for many chunks), or one by one where the registry takes no packs.
/// Digests per existence check, the extension's limit.
const CHECK_BATCH: usize = crate::registry::PRESENT_BATCH;

pub(super) struct Uploads<'a> {
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
    pub(super) fn new(
        registry: &'a Registry,
        repo: &'a RepoName,
        files: &'a [FileJob],
        uploads: usize,
        max_in_flight: u64,
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
            count_limit: Arc::new(Semaphore::new(uploads.max(1))),
            mib_limit: Arc::new(Semaphore::new(
                ((max_in_flight >> 20).max(PACK_TARGET >> 20)) as usize,
            )),
            pool: BufferPool::new(POOLED),
        }
    }

    /// Takes what the hashers send until they are done, checking a batch whenever it is full or
    /// they pause (`starved`: they wait for read buffers that only sent chunks give back).
    pub(super) async fn collect(
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
    pub(super) async fn finish(mut self) -> Result<Vec<Vec<Vec<FileChunk>>>, ClientError> {
        while let Some(done) = self.sending.join_next().await {
            done.map_err(ClientError::task("upload"))??;
        }
        Ok(self.per_file)
    }
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
pub(super) const PACK_TARGET: u64 = 64 << 20;
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

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
