//! The FUSE filesystem: metadata from the inode table, file reads through the chunk cache.
//!
//! FUSE threads never wait on the network. A read whose chunks are all in the cache is answered on
//! the FUSE thread; any other read hands its reply to the async runtime, which fetches the missing
//! chunks and answers when they are verified and stored.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, WriteFlags,
};
use vial_core::volume::ChunkRef;

use crate::cache::CacheError;
use crate::errno;
use crate::fetch::{self, Fetcher, Priority};
use crate::follow::{self, Following, Resolved, Slot};
use crate::inodes::{FileNode, Inodes, NodeKind, Piece, ROOT, STATS_NAME};
use crate::stats::{InFlight, Stats};

/// Attributes never change: the kernel may cache them for as long as it likes.
const TTL: Duration = Duration::from_secs(24 * 3600);
/// Largest read the kernel sends us, and how far it reads ahead.
const MAX_IO: u32 = 1024 * 1024;
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
    fn open(&self, json: Vec<u8>) -> u64 {
        // Handle 0 is every other file's; statistics handles start at 1.
        let fh = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        if let Ok(mut open) = self.open.lock() {
            open.insert(fh, Arc::new(json));
        }
        fh
    }

    fn get(&self, fh: u64) -> Option<Arc<Vec<u8>>> {
        self.open.lock().ok()?.get(&fh).cloned()
    }

    fn close(&self, fh: u64) {
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

/// What a mount shows: one version, or the versions a followed tag has pointed at.
#[derive(Debug)]
pub enum View {
    One(Arc<Shared>),
    Following(Arc<Following>),
}

#[derive(Debug)]
pub struct VialFs {
    pub view: View,
}

impl Shared {
    fn attr(&self, ino: u64) -> Option<FileAttr> {
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

    fn stats_json(&self) -> Vec<u8> {
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
    fn assemble(&self, pieces: &[Piece]) -> Result<bytes::Bytes, Option<CacheError>> {
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
    async fn read_async(self: Arc<Self>, pieces: Vec<Piece>) -> Result<bytes::Bytes, Errno> {
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
    fn all_available(&self, pieces: &[Piece]) -> bool {
        pieces.iter().all(|p| {
            self.fetcher
                .available(&self.chunks[p.chunk as usize].digest)
        })
    }

    /// The bytes `[start, end)` of a file if every chunk holding them is in the cache.
    fn read_cached(&self, file: &FileNode, start: u64, end: u64) -> Option<bytes::Bytes> {
        let pieces = file.pieces(start, end);
        if !self.all_available(&pieces) {
            return None;
        }
        self.assemble(&pieces).ok()
    }

    /// The tensors of a safetensors file, parsed from its header once the reader has read the
    /// header through the mount (every loader does, first). Any file whose first bytes parse as a
    /// safetensors header counts, whatever its name; a file whose do not is remembered as not one.
    fn tensor_spans(&self, ino: u64, file: &FileNode) -> TensorSpans {
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
    fn tensor_end(&self, ino: u64, file: &FileNode, offset: u64) -> Option<u64> {
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
    fn read_ahead(self: &Arc<Self>, ino: u64, file: &FileNode, offset: u64, end: u64) {
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
}

/// What a kernel inode number names.
enum Node {
    /// Inode `local` of a version's table, known to the kernel as `base | local` (base 0 in a
    /// mount of one version).
    In {
        shared: Arc<Shared>,
        local: u64,
        base: u64,
        /// The following mount's record of the version, to count its open files.
        slot: Option<Arc<Slot>>,
    },
    /// The root of a following mount.
    FollowRoot,
    /// `current` in a following mount.
    Current,
}

impl VialFs {
    fn resolve(&self, ino: u64) -> Option<Node> {
        match &self.view {
            View::One(shared) => Some(Node::In {
                shared: Arc::clone(shared),
                local: ino,
                base: 0,
                slot: None,
            }),
            View::Following(f) => Some(match f.resolve(ino)? {
                Resolved::Root => Node::FollowRoot,
                Resolved::Current => Node::Current,
                Resolved::In { slot, local, base } => Node::In {
                    shared: Arc::clone(&slot.shared),
                    local,
                    base,
                    slot: Some(slot),
                },
            }),
        }
    }

    fn following(&self) -> Option<&Arc<Following>> {
        match &self.view {
            View::Following(f) => Some(f),
            View::One(_) => None,
        }
    }

    /// A node's attributes as the kernel sees them, and how long it may keep them.
    fn attr_of(&self, ino: u64) -> Option<(FileAttr, Duration)> {
        match self.resolve(ino) {
            Some(Node::In {
                shared,
                local,
                base,
                ..
            }) => Self::version_attr(&shared, local, base),
            Some(Node::FollowRoot | Node::Current) => {
                self.follow_attr(ino).map(|a| (a, Duration::ZERO))
            }
            None => None,
        }
    }

    /// A directory's entries, "." and ".." first: (inode, type, name).
    fn dir_entries(&self, ino: u64) -> Result<Vec<(u64, FileType, String)>, Errno> {
        let mut entries: Vec<(u64, FileType, String)> = vec![
            (ino, FileType::Directory, ".".into()),
            (ino, FileType::Directory, "..".into()),
        ];
        match self.resolve(ino) {
            Some(Node::In {
                shared,
                local,
                base,
                ..
            }) => {
                let Some(NodeKind::Dir { children, .. }) =
                    shared.inodes.get(local).map(|n| &n.kind)
                else {
                    return Err(Errno::ENOTDIR);
                };
                for (name, child) in children {
                    let kind = match shared.inodes.get(*child).map(|n| &n.kind) {
                        Some(NodeKind::Dir { .. }) => FileType::Directory,
                        Some(NodeKind::Symlink { .. }) => FileType::Symlink,
                        _ => FileType::RegularFile,
                    };
                    entries.push((base | child, kind, name.clone()));
                }
            }
            Some(Node::FollowRoot) => {
                entries.push((follow::CURRENT, FileType::Symlink, "current".into()));
                for (slot, base) in self.following().map(|f| f.versions()).unwrap_or_default() {
                    entries.push((base | ROOT, FileType::Directory, slot.name.clone()));
                }
            }
            Some(Node::Current) => return Err(Errno::ENOTDIR),
            None => return Err(Errno::ENOENT),
        }
        Ok(entries)
    }

    /// Attributes of a following mount's root or `current`: both change as the tag moves, so the
    /// kernel keeps them for no time at all.
    fn follow_attr(&self, ino: u64) -> Option<FileAttr> {
        let f = self.following()?;
        let current = f.current()?;
        let mut attr = current.shared.attr(ROOT)?;
        attr.ino = INodeNo(ino);
        if ino == follow::CURRENT {
            attr.kind = FileType::Symlink;
            attr.perm = 0o777;
            attr.size = current.name.len() as u64;
            attr.blocks = 1;
            attr.nlink = 1;
        } else {
            attr.nlink = 2 + f.versions().len() as u32;
        }
        Some(attr)
    }

    /// A version's node as the kernel sees it: its attributes under its kernel inode number, and
    /// how long they may be kept (no time for the statistics file, which changes).
    fn version_attr(shared: &Shared, local: u64, base: u64) -> Option<(FileAttr, Duration)> {
        let mut attr = shared.attr(local)?;
        attr.ino = INodeNo(base | local);
        let ttl = match shared.inodes.get(local).map(|n| &n.kind) {
            Some(NodeKind::Stats) => Duration::ZERO,
            _ => TTL,
        };
        Some((attr, ttl))
    }
}

impl Filesystem for VialFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Large requests: the kernel's default of 128 KiB costs a round trip per 128 KiB.
        let _ = config.set_max_readahead(MAX_IO);
        let _ = config.set_max_write(MAX_IO);
        // Listings come with attributes (see `readdirplus`); kernels without it list plainly.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_DO_READDIRPLUS);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let Some(name) = name.to_str() else {
            return reply.error(Errno::ENOENT);
        };
        let found = match self.resolve(parent.0) {
            Some(Node::In {
                shared,
                local,
                base,
                ..
            }) => shared
                .inodes
                .lookup(local, name)
                .and_then(|child| Self::version_attr(&shared, child, base)),
            Some(Node::FollowRoot) => {
                let f = self.following();
                match name {
                    "current" => self
                        .follow_attr(follow::CURRENT)
                        .map(|a| (a, Duration::ZERO)),
                    STATS_NAME => f.and_then(|f| f.current()).and_then(|c| {
                        let base = f?.by_digest(&c.digest)?.1;
                        let local = c.shared.inodes.lookup(ROOT, STATS_NAME)?;
                        Self::version_attr(&c.shared, local, base)
                    }),
                    _ => f
                        .and_then(|f| f.by_name(name))
                        .and_then(|(slot, base)| Self::version_attr(&slot.shared, ROOT, base)),
                }
            }
            Some(Node::Current) => None,
            None => None,
        };
        match found {
            Some((attr, ttl)) => reply.entry(&ttl, &attr, fuser::Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr_of(ino.0) {
            Some((attr, ttl)) => reply.attr(&ttl, &attr),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        match self.resolve(ino.0) {
            Some(Node::Current) => match self.following().and_then(|f| f.current()) {
                Some(current) => reply.data(current.name.as_bytes()),
                None => reply.error(Errno::ENOENT),
            },
            Some(Node::In { shared, local, .. }) => {
                match shared.inodes.get(local).map(|n| &n.kind) {
                    Some(NodeKind::Symlink { target }) => reply.data(target.as_bytes()),
                    Some(_) => reply.error(Errno::EINVAL),
                    None => reply.error(Errno::ENOENT),
                }
            }
            Some(Node::FollowRoot) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY {
            return reply.error(Errno::EROFS);
        }
        let Some(Node::In {
            shared,
            local,
            slot,
            ..
        }) = self.resolve(ino.0)
        else {
            return reply.error(Errno::EISDIR);
        };
        match shared.inodes.get(local).map(|n| &n.kind) {
            // Content is immutable: keep the kernel's page cache across opens.
            Some(NodeKind::File(_)) => {
                if let Some(slot) = slot {
                    slot.opens.fetch_add(1, Ordering::SeqCst);
                }
                reply.opened(
                    FileHandle(0),
                    FopenFlags::FOPEN_KEEP_CACHE | FopenFlags::FOPEN_NOFLUSH,
                )
            }
            // Statistics change: bypass the page cache, and read the document as of this open.
            Some(NodeKind::Stats) => {
                let fh = shared.stats_opens.open(shared.stats_json());
                reply.opened(
                    FileHandle(fh),
                    FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_NOFLUSH,
                )
            }
            Some(NodeKind::Dir { .. }) => reply.error(Errno::EISDIR),
            Some(NodeKind::Symlink { .. }) => reply.error(Errno::EINVAL),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        if let Some(Node::In { shared, slot, .. }) = self.resolve(ino.0) {
            if fh.0 != 0 {
                shared.stats_opens.close(fh.0);
            } else if let Some(slot) = slot {
                // Saturating: a version added while a file was open elsewhere never goes below 0.
                let _ = slot
                    .opens
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            }
        }
        reply.ok();
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(Node::In {
            shared, local: ino, ..
        }) = self.resolve(ino.0)
        else {
            return reply.error(Errno::EISDIR);
        };
        let file = match shared.inodes.get(ino).map(|n| &n.kind) {
            Some(NodeKind::File(f)) => f,
            Some(NodeKind::Stats) => {
                let json = shared
                    .stats_opens
                    .get(fh.0)
                    .unwrap_or_else(|| Arc::new(shared.stats_json()));
                let start = (offset as usize).min(json.len());
                let end = (start + size as usize).min(json.len());
                return reply.data(&json[start..end]);
            }
            Some(NodeKind::Dir { .. }) => return reply.error(Errno::EISDIR),
            _ => return reply.error(Errno::EINVAL),
        };
        let end = offset.saturating_add(u64::from(size)).min(file.size);
        let pieces = file.pieces(offset, end);
        shared
            .stats
            .bytes_read
            .fetch_add(end.saturating_sub(offset), Ordering::Relaxed);
        shared.read_ahead(ino, file, offset, end);
        if offset == 0 {
            shared.walk_ahead(file.position);
        }
        if shared.all_available(&pieces) {
            match shared.assemble(&pieces) {
                Ok(buf) => return reply.data(&buf),
                Err(Some(e)) => return reply.error(errno::from_cache(&e)),
                Err(None) => {} // Evicted meanwhile: fetch again below.
            }
        }
        let shared = Arc::clone(&shared);
        shared.runtime.clone().spawn(async move {
            match shared.read_async(pieces).await {
                Ok(buf) => reply.data(&buf),
                Err(e) => reply.error(e),
            }
        });
    }

    // Nothing is ever written, so closing a file has nothing to flush (opens ask the kernel not
    // to send flushes at all: a round trip saved on every close).
    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let entries = match self.dir_entries(ino.0) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        for (i, (child, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), (i + 1) as u64, kind, &name) {
                break;
            }
        }
        reply.ok();
    }

    /// A directory's entries with their attributes, so that a program walking the tree (`ls -l`,
    /// `find`, `os.walk`, then opening files) needs no lookup per entry: one request per
    /// directory listed instead of one per file.
    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let entries = match self.dir_entries(ino.0) {
            Ok(entries) => entries,
            Err(e) => return reply.error(e),
        };
        for (i, (child, _, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            // "." and ".." are not linked by the kernel; the directory's own attributes do.
            let attr_ino = if i < 2 { ino.0 } else { child };
            let Some((mut attr, ttl)) = self.attr_of(attr_ino) else {
                continue;
            };
            attr.ino = INodeNo(child);
            if reply.add(
                INodeNo(child),
                (i + 1) as u64,
                &name,
                &ttl,
                &attr,
                fuser::Generation(0),
            ) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let shared = match &self.view {
            View::One(shared) => Some(Arc::clone(shared)),
            View::Following(f) => f.current().map(|c| Arc::clone(&c.shared)),
        };
        let (blocks, files) = shared.map_or((0, 0), |s| {
            (
                s.chunks.iter().map(|c| c.size).sum::<u64>().div_ceil(512),
                s.inodes.len() as u64,
            )
        });
        reply.statfs(blocks, 0, 0, files, 0, 512, 255, MAX_IO);
    }

    // Everything that would change the filesystem is refused: a version is immutable.
    fn setattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        _size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mknod(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn mkdir(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn unlink(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn rmdir(&self, _req: &Request, _parent: INodeNo, _name: &OsStr, reply: ReplyEmpty) {
        reply.error(Errno::EROFS);
    }

    fn symlink(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _target: &Path,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn rename(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _newparent: INodeNo,
        _newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EROFS);
    }

    fn link(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _newparent: INodeNo,
        _newname: &OsStr,
        reply: ReplyEntry,
    ) {
        reply.error(Errno::EROFS);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        reply.error(Errno::EROFS);
    }

    fn create(
        &self,
        _req: &Request,
        _parent: INodeNo,
        _name: &OsStr,
        _mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        reply.error(Errno::EROFS);
    }
}
