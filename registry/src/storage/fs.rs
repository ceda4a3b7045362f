//! The filesystem blob store: one file per blob under `blobs/<algorithm>/<xx>/<hex>`, one per pack
//! under `packs/<xx>/<id>`, uploads under `uploads/<id>`, published by fsync and rename so a crash
//! leaves either nothing or the whole file.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use tokio_util::io::ReaderStream;
use vial_core::Digest;
use vial_io::{BufferPool, ALIGN};

use super::direct::UploadWriter;
use super::{BlobStore, ByteRange, ByteStream, PackId, StorageError, VerifyFuture};

/// Size of the reads that feed a blob GET. Large reads keep syscalls off the profile.
const READ_CHUNK: usize = 1024 * 1024;
/// Read-ahead of one blob GET, in `READ_CHUNK`s: enough to keep the socket busy, little memory.
const READ_QUEUE: usize = 4;
/// The buffers blob reads fill, given back once their bytes are sent. Reused, because a fresh MiB
/// costs 256 page faults and zeroing: a fifth of the registry's CPU serving a pull, before this
/// pool (docs/performance.md). At most 32 MiB wait here.
static READ_BUFFERS: std::sync::LazyLock<BufferPool> =
    std::sync::LazyLock::new(|| BufferPool::new(32));
/// Body frames buffered between the network and the writer thread of one upload: enough to ride
/// out the direct write of a MiB, which blocks the writer (with 4, a 4 GiB push took a tenth longer;
/// docs/performance.md). Where request bodies come in, the API layer bounds the bytes all uploads'
/// frames hold at once.
const WRITE_QUEUE: usize = 64;

/// Pack files held open between reads. Each bulk read of a pull reads a piece of a pack; with the
/// file opened afresh for each, the kernel took every piece's first read for a random one and
/// filled the page cache in single pages from there, where reading on through one open file lets
/// its read-ahead grow into large pages, as for a blob read whole (docs/performance.md). Each
/// costs a file descriptor while it is here.
const OPEN_PACKS: usize = 64;

#[derive(Debug, Clone)]
pub struct FsBlobStore {
    root: PathBuf,
    open_packs: Arc<Mutex<OpenPacks>>,
}

/// Open pack files by id, with when each was last read, for evicting the one read longest ago.
#[derive(Debug, Default)]
struct OpenPacks {
    files: HashMap<PackId, (Arc<File>, u64)>,
    clock: u64,
}

impl OpenPacks {
    fn get(&mut self, id: &PackId) -> Option<Arc<File>> {
        self.clock += 1;
        let clock = self.clock;
        self.files.get_mut(id).map(|(file, used)| {
            *used = clock;
            Arc::clone(file)
        })
    }

    /// Keeps `file` open under `id` (or returns the one another reader opened meanwhile).
    fn insert(&mut self, id: &PackId, file: File) -> Arc<File> {
        if let Some(open) = self.get(id) {
            return open;
        }
        if self.files.len() >= OPEN_PACKS {
            let oldest = self
                .files
                .iter()
                .min_by_key(|(_, (_, used))| *used)
                .map(|(id, _)| id.clone());
            if let Some(oldest) = oldest {
                self.files.remove(&oldest);
            }
        }
        let file = Arc::new(file);
        self.files
            .insert(id.clone(), (Arc::clone(&file), self.clock));
        file
    }
}

impl FsBlobStore {
    /// Opens (creating if needed) a store rooted at `root`.
    pub async fn open(root: impl Into<PathBuf>) -> Result<Self, StorageError> {
        let root = root.into();
        for dir in [root.join("blobs"), root.join("uploads"), root.join("packs")] {
            tokio::fs::create_dir_all(&dir)
                .await
                .map_err(|e| StorageError::io(&dir, e))?;
        }
        Ok(FsBlobStore {
            root,
            open_packs: Arc::default(),
        })
    }

    fn blob_path(&self, digest: &Digest) -> PathBuf {
        let hex = digest.hex();
        self.root
            .join("blobs")
            .join(digest.algorithm().as_str())
            .join(&hex[..2])
            .join(hex)
    }

    fn pack_path(&self, id: &PackId) -> PathBuf {
        let id = id.as_str();
        self.root.join("packs").join(&id[..2]).join(id)
    }

    /// The pack, open for reading: from [`OpenPacks`], or opened and kept there.
    fn open_pack(&self, id: &PackId) -> Result<Option<(Arc<File>, PathBuf)>, StorageError> {
        let path = self.pack_path(id);
        let lock = || self.open_packs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(file) = lock().get(id) {
            return Ok(Some((file, path)));
        }
        let Some(file) = not_found_is_none(File::open(&path), &path)? else {
            return Ok(None);
        };
        let file = lock().insert(id, file);
        Ok(Some((file, path)))
    }

    fn upload_path(&self, id: &str) -> Result<PathBuf, StorageError> {
        // The registry only hands out UUIDs; refuse anything else so an id can never name a path
        // outside the uploads directory.
        if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-') {
            return Err(StorageError::UploadMissing(id.to_owned()));
        }
        Ok(self.root.join("uploads").join(id))
    }
}

fn not_found_is_none<T>(r: std::io::Result<T>, path: &Path) -> Result<Option<T>, StorageError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::io(path, e)),
    }
}

#[async_trait]
impl BlobStore for FsBlobStore {
    async fn stat(&self, digest: &Digest) -> Result<Option<u64>, StorageError> {
        let path = self.blob_path(digest);
        Ok(not_found_is_none(tokio::fs::metadata(&path).await, &path)?.map(|m| m.len()))
    }

    async fn read(
        &self,
        digest: &Digest,
        range: Option<ByteRange>,
    ) -> Result<Option<ByteStream>, StorageError> {
        let path = self.blob_path(digest);
        let Some(file) = not_found_is_none(std::fs::File::open(&path), &path)? else {
            return Ok(None);
        };
        let (start, len) = match range {
            Some(r) => (r.start, r.len()),
            None => (
                0,
                file.metadata()
                    .map_err(|e| StorageError::io(&path, e))?
                    .len(),
            ),
        };
        Ok(Some(read_stream(Arc::new(file), path, start, len)))
    }

    async fn delete(&self, digest: &Digest) -> Result<bool, StorageError> {
        let path = self.blob_path(digest);
        Ok(not_found_is_none(tokio::fs::remove_file(&path).await, &path)?.is_some())
    }

    async fn put_pack(
        &self,
        id: &PackId,
        body: ByteStream,
        len: u64,
        verify: VerifyFuture,
    ) -> Result<bool, StorageError> {
        // Written as an upload, then published like a blob: one fsync and one rename for every
        // chunk of the pack, where chunks uploaded one by one cost one each.
        let upload = id.as_str().to_owned();
        self.create_upload(&upload).await?;
        let result = async {
            let size = self.append_upload(&upload, 0, body).await?;
            if size != len || !verify.await {
                return Ok(false);
            }
            let (from, to) = (self.upload_path(&upload)?, self.pack_path(id));
            tokio::task::spawn_blocking(move || publish(&upload, &from, &to))
                .await
                .map_err(|e| StorageError::io("pack", std::io::Error::other(e)))??;
            Ok(true)
        }
        .await;
        if !matches!(result, Ok(true)) {
            let _ = self.abort_upload(id.as_str()).await;
        }
        result
    }

    async fn read_pack(
        &self,
        id: &PackId,
        range: ByteRange,
    ) -> Result<Option<ByteStream>, StorageError> {
        let Some((file, path)) = self.open_pack(id)? else {
            return Ok(None);
        };
        Ok(Some(read_stream(file, path, range.start, range.len())))
    }

    async fn delete_pack(&self, id: &PackId) -> Result<bool, StorageError> {
        let path = self.pack_path(id);
        // Closed first, so no later read finds the file through the set.
        self.open_packs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .files
            .remove(id);
        Ok(not_found_is_none(tokio::fs::remove_file(&path).await, &path)?.is_some())
    }

    fn min_chunk_length(&self) -> u64 {
        // Files take appends of any size.
        1
    }

    async fn create_upload(&self, id: &str) -> Result<(), StorageError> {
        let path = self.upload_path(id)?;
        tokio::fs::File::create(&path)
            .await
            .map_err(|e| StorageError::io(&path, e))?;
        Ok(())
    }

    async fn upload_size(&self, id: &str) -> Result<Option<u64>, StorageError> {
        let path = self.upload_path(id)?;
        Ok(not_found_is_none(tokio::fs::metadata(&path).await, &path)?.map(|m| m.len()))
    }

    async fn append_upload(
        &self,
        id: &str,
        offset: u64,
        mut body: ByteStream,
    ) -> Result<u64, StorageError> {
        let path = self.upload_path(id)?;
        // Writes run on a blocking thread fed by a bounded queue, so the executor never blocks on
        // the disk and memory stays bounded by the queue whatever the blob size.
        let (tx, mut rx) = mpsc::channel::<Bytes>(WRITE_QUEUE);
        let writer_path = path.clone();
        let writer = tokio::task::spawn_blocking(move || -> Result<u64, StorageError> {
            let io = |e| StorageError::io(&writer_path, e);
            let (mut file, actual) = match UploadWriter::open(&writer_path, offset) {
                Ok(opened) => opened,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(StorageError::UploadMissing(id_of(&writer_path)));
                }
                Err(e) => return Err(io(e)),
            };
            if actual != offset {
                return Err(StorageError::OffsetMismatch {
                    id: id_of(&writer_path),
                    expected: offset,
                    actual,
                });
            }
            let rollback = |e| {
                if let Ok(f) = std::fs::OpenOptions::new().write(true).open(&writer_path) {
                    let _ = f.set_len(offset);
                }
                io(e)
            };
            while let Some(bytes) = rx.blocking_recv() {
                file.write(&bytes).map_err(rollback)?;
            }
            let written = file.finish().map_err(rollback)?;
            Ok(written)
        });

        let mut body_error = None;
        while let Some(item) = body.next().await {
            match item {
                Ok(bytes) => {
                    if tx.send(bytes).await.is_err() {
                        break; // The writer failed; its error is reported below.
                    }
                }
                Err(e) => {
                    body_error = Some(e);
                    break;
                }
            }
        }
        drop(tx);
        let written = writer
            .await
            .map_err(|e| StorageError::io(&path, std::io::Error::other(e)))??;
        if let Some(e) = body_error {
            // Put the session back where it was, so the client can resend the chunk.
            let rollback = path.clone();
            let _ = tokio::task::spawn_blocking(move || {
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&rollback)
                    .and_then(|f| f.set_len(offset))
            })
            .await;
            return Err(StorageError::BodyFailed(e));
        }
        Ok(written)
    }

    async fn read_upload(&self, id: &str) -> Result<ByteStream, StorageError> {
        let path = self.upload_path(id)?;
        match not_found_is_none(tokio::fs::File::open(&path).await, &path)? {
            Some(file) => Ok(Box::pin(ReaderStream::with_capacity(file, READ_CHUNK))),
            None => Err(StorageError::UploadMissing(id.to_owned())),
        }
    }

    async fn commit_upload(&self, id: &str, digest: &Digest) -> Result<u64, StorageError> {
        let from = self.upload_path(id)?;
        let to = self.blob_path(digest);
        let id = id.to_owned();
        tokio::task::spawn_blocking(move || publish(&id, &from, &to))
            .await
            .map_err(|e| StorageError::io("commit", std::io::Error::other(e)))?
    }

    async fn abort_upload(&self, id: &str) -> Result<(), StorageError> {
        let path = self.upload_path(id)?;
        not_found_is_none(tokio::fs::remove_file(&path).await, &path)?;
        Ok(())
    }
}

/// Streams `len` bytes of `file` from `start`, read by a blocking thread in large chunks: one thread
/// hop per MiB instead of one per small read, which is what makes large GETs fast.
///
/// Every read starts at a page-aligned offset of the file, into a page-aligned buffer, and the
/// bytes before `start` are cut from the first: a chunk's range in a pack starts anywhere, and a
/// copy out of the page cache whose source and destination are aligned differently ran at half
/// the speed (a warm 4 GiB `vial pull` spent 2.0 s of registry CPU against 1.4 s for the same
/// bytes read from offset 0).
fn read_stream(file: Arc<File>, path: PathBuf, start: u64, len: u64) -> ByteStream {
    use std::os::unix::fs::FileExt;
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(READ_QUEUE);
    tokio::task::spawn_blocking(move || {
        let end = start + len;
        // Nothing to read for an empty range, even one that starts mid-page.
        let mut offset = if len == 0 {
            end
        } else {
            start - start % ALIGN as u64
        };
        while offset < end {
            let n = READ_CHUNK.min((end - offset) as usize);
            // The bytes of this read that were asked for: all but the head of the first.
            let from = start.saturating_sub(offset) as usize;
            let mut buf = READ_BUFFERS.take(READ_CHUNK);
            let result = file
                .read_exact_at(&mut buf.bytes_mut()[..n], offset)
                .map(|()| READ_BUFFERS.freeze(buf, from..n))
                .map_err(|e| {
                    tracing::error!(path = %path.display(), error = %e, "blob read failed");
                    e
                });
            let failed = result.is_err();
            if tx.blocking_send(result).is_err() || failed {
                return; // The client went away, or the read failed and was reported.
            }
            offset += n as u64;
        }
    });
    Box::pin(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }))
}

fn id_of(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// fsync the upload, rename it into place and fsync the directory, so the blob survives a crash once
/// this returns and is never seen half-written before.
fn publish(id: &str, from: &Path, to: &Path) -> Result<u64, StorageError> {
    let file = match std::fs::File::open(from) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StorageError::UploadMissing(id.to_owned()))
        }
        Err(e) => return Err(StorageError::io(from, e)),
    };
    let size = file
        .metadata()
        .map_err(|e| StorageError::io(from, e))?
        .len();
    if let Ok(existing) = std::fs::metadata(to) {
        if existing.len() == size {
            // Same digest, same bytes: already published by an earlier upload.
            std::fs::remove_file(from).map_err(|e| StorageError::io(from, e))?;
            return Ok(size);
        }
    }
    file.sync_all().map_err(|e| StorageError::io(from, e))?;
    let dir = to.parent().ok_or_else(|| {
        StorageError::Corrupt(format!("blob path {} has no parent", to.display()))
    })?;
    let new_dir = !dir.exists();
    std::fs::create_dir_all(dir).map_err(|e| StorageError::io(dir, e))?;
    std::fs::rename(from, to).map_err(|e| StorageError::io(to, e))?;
    let sync_dir = |d: &Path| {
        std::fs::File::open(d)
            .and_then(|f| f.sync_all())
            .map_err(|e| StorageError::io(d, e))
    };
    sync_dir(dir)?;
    // A prefix directory created just now must itself be durable in its parent, or the blob
    // could vanish with it after a power loss.
    if new_dir {
        if let Some(parent) = dir.parent() {
            sync_dir(parent)?;
        }
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn collect(stream: ByteStream) -> Vec<u8> {
        let frames: Vec<std::io::Result<Bytes>> = stream.collect().await;
        frames
            .into_iter()
            .flat_map(|f| f.unwrap().to_vec())
            .collect()
    }

    /// A pack file of `len` bytes, each byte a function of its offset, written where the store
    /// keeps pack `id`.
    fn write_pack(store: &FsBlobStore, id: &PackId, len: usize) -> Vec<u8> {
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        let path = store.pack_path(id);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        bytes
    }

    #[tokio::test]
    async fn ranges_that_start_mid_page_read_exactly_their_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).await.unwrap();
        let id = PackId::random();
        let bytes = write_pack(&store, &id, 3 * READ_CHUNK + 12_345);
        let cases = [
            (0, bytes.len()),
            (1, 1),
            (4095, 2),
            (4096, 4096),
            (7_777, READ_CHUNK),
            (READ_CHUNK - 3, READ_CHUNK + 6),
            (2 * READ_CHUNK + 99, bytes.len() - 2 * READ_CHUNK - 99),
            (5_000, 0),
        ];
        for (start, len) in cases {
            let range = ByteRange {
                start: start as u64,
                end: (start + len) as u64,
            };
            let stream = store.read_pack(&id, range).await.unwrap().unwrap();
            let got = collect(stream).await;
            assert_eq!(got.len(), len, "length of {len} bytes from {start}");
            assert!(
                got == bytes[start..start + len],
                "bytes of {len} from {start}"
            );
        }
    }

    #[tokio::test]
    async fn a_deleted_pack_is_not_read_through_a_file_kept_open() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).await.unwrap();
        let id = PackId::random();
        write_pack(&store, &id, 10_000);
        let range = ByteRange { start: 10, end: 20 };
        assert!(store.read_pack(&id, range).await.unwrap().is_some());
        assert!(store.delete_pack(&id).await.unwrap());
        assert!(store.read_pack(&id, range).await.unwrap().is_none());
        assert!(!store.delete_pack(&id).await.unwrap());
    }

    #[tokio::test]
    async fn open_packs_stay_within_their_bound_and_keep_the_latest() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsBlobStore::open(dir.path()).await.unwrap();
        let ids: Vec<PackId> = (0..OPEN_PACKS + 8).map(|_| PackId::random()).collect();
        for id in &ids {
            write_pack(&store, id, 100);
            let stream = store
                .read_pack(id, ByteRange { start: 0, end: 100 })
                .await
                .unwrap()
                .unwrap();
            assert_eq!(collect(stream).await.len(), 100);
        }
        let open = store.open_packs.lock().unwrap();
        assert_eq!(open.files.len(), OPEN_PACKS);
        assert!(open.files.contains_key(ids.last().unwrap()));
        assert!(!open.files.contains_key(&ids[0]));
    }
}
