//! The FUSE filesystem: metadata from the inode table, file reads through the chunk cache.
//!
//! FUSE threads never wait on the network. A read whose chunks are all in the cache is answered on
//! the FUSE thread; any other read hands its reply to the async runtime, which fetches the missing
//! chunks and answers when they are verified and stored.

use std::ffi::OsStr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, KernelConfig,
    LockOwner, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData,
    ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    Request, WriteFlags,
};

use crate::errno;
use crate::follow::{self, Following, Resolved, Slot};
use crate::inodes::{NodeKind, ROOT, STATS_NAME};
use crate::shared::{Shared, MAX_IO};

/// Attributes never change: the kernel may cache them for as long as it likes.
const TTL: Duration = Duration::from_secs(24 * 3600);
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
