//! Walks a directory into a sorted list of entries, and keeps the local index that lets a re-push
//! skip reading files that have not changed (keyed by size, mtime, ctime and inode, as git does).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vial_core::volume::{validate_path, ChunkRef};

use crate::ClientError;

/// What `stat` says about a regular file: enough to tell that it has not changed since it was read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stamp {
    pub size: u64,
    pub mtime_ns: i128,
    pub ctime_ns: i128,
    pub ino: u64,
    pub dev: u64,
}

impl Stamp {
    fn of(m: &std::fs::Metadata) -> Stamp {
        Stamp {
            size: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
            ino: m.ino(),
            dev: m.dev(),
        }
    }
}

#[derive(Debug, Clone)]
pub enum Scanned {
    File {
        abs: PathBuf,
        mode: u32,
        stamp: Stamp,
    },
    Dir,
    Symlink {
        target: String,
    },
}

/// Entries of `root` by relative path, not following symlinks. Names must be UTF-8 and only regular
/// files, directories and symlinks are allowed: a volume has nothing else.
pub fn scan(root: &Path) -> Result<Vec<(String, Scanned)>, ClientError> {
    let meta = std::fs::metadata(root).map_err(|e| ClientError::io(root, e))?;
    if !meta.is_dir() {
        return Err(ClientError::NotPushable {
            path: root.to_path_buf(),
            why: "it is not a directory".into(),
        });
    }
    let mut out = Vec::new();
    let mut stack = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, rel)) = stack.pop() {
        let entries = std::fs::read_dir(&dir).map_err(|e| ClientError::io(&dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| ClientError::io(&dir, e))?;
            let abs = entry.path();
            let name = entry
                .file_name()
                .into_string()
                .map_err(|n| ClientError::NotPushable {
                    path: dir.join(&n),
                    why: format!("its name {n:?} is not UTF-8"),
                })?;
            let path = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            validate_path(&path).map_err(|e| ClientError::NotPushable {
                path: abs.clone(),
                why: e.to_string(),
            })?;
            let m = std::fs::symlink_metadata(&abs).map_err(|e| ClientError::io(&abs, e))?;
            let ft = m.file_type();
            let scanned = if ft.is_dir() {
                stack.push((abs.clone(), path.clone()));
                Scanned::Dir
            } else if ft.is_file() {
                Scanned::File {
                    mode: m.mode(),
                    stamp: Stamp::of(&m),
                    abs,
                }
            } else if ft.is_symlink() {
                let target = std::fs::read_link(&abs).map_err(|e| ClientError::io(&abs, e))?;
                let target = target.into_os_string().into_string().map_err(|t| {
                    ClientError::NotPushable {
                        path: abs.clone(),
                        why: format!("its symlink target {t:?} is not UTF-8"),
                    }
                })?;
                Scanned::Symlink { target }
            } else {
                return Err(ClientError::NotPushable {
                    path: abs,
                    why: "it is not a regular file, directory or symlink".into(),
                });
            };
            out.push((path, scanned));
        }
    }
    out.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    Ok(out)
}

/// Chunks computed for files on an earlier push, by relative path.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct LocalIndex {
    version: u32,
    chunking: String,
    /// When the index was written. An entry whose mtime is within a second of it is not trusted: the
    /// file may have been modified again within the same coarse clock tick, leaving every stamp
    /// field unchanged (git's "racily clean" entries). Such files are read again, and trusted on the
    /// push after.
    written_ns: i128,
    files: HashMap<String, IndexedFile>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct IndexedFile {
    stamp: Stamp,
    chunks: Vec<ChunkRef>,
}

const INDEX_VERSION: u32 = 1;
const RACY_NS: i128 = 1_000_000_000;

impl LocalIndex {
    /// Where the index of `root` lives: the user's cache directory, keyed by the absolute path.
    pub fn path_for(root: &Path) -> Option<PathBuf> {
        let base = std::env::var_os("XDG_CACHE_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
        let abs = std::fs::canonicalize(root).ok()?;
        let key = vial_core::Algorithm::Sha256.digest_bytes(abs.as_os_str().as_encoded_bytes());
        Some(
            base.join("vial/index")
                .join(format!("{}.json", &key.hex()[..32])),
        )
    }

    /// Loads an index; a missing, unreadable or outdated one is simply empty.
    pub fn load(path: &Path, chunking: &str) -> LocalIndex {
        let loaded: Option<LocalIndex> = std::fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        match loaded {
            Some(i) if i.version == INDEX_VERSION && i.chunking == chunking => i,
            _ => LocalIndex {
                version: INDEX_VERSION,
                chunking: chunking.to_owned(),
                ..LocalIndex::default()
            },
        }
    }

    /// The chunks of `path` if the file provably has not changed since they were computed.
    pub fn lookup(&self, path: &str, stamp: &Stamp) -> Option<&[ChunkRef]> {
        let f = self.files.get(path)?;
        let fresh = f.stamp == *stamp && stamp.mtime_ns + RACY_NS < self.written_ns;
        fresh.then_some(f.chunks.as_slice())
    }

    pub fn insert(&mut self, path: String, stamp: Stamp, chunks: Vec<ChunkRef>) {
        self.files.insert(path, IndexedFile { stamp, chunks });
    }

    pub fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        self.files.retain(|p, _| keep(p));
    }

    /// Writes the index atomically. Failing to write a cache is not an error worth failing a push.
    pub fn save(&mut self, path: &Path) {
        self.written_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i128)
            .unwrap_or(0);
        let result = (|| -> std::io::Result<()> {
            if let Some(dir) = path.parent() {
                std::fs::create_dir_all(dir)?;
            }
            let tmp = path.with_extension("tmp");
            std::fs::write(&tmp, serde_json::to_vec(self).unwrap_or_default())?;
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %e, "could not save the local index");
        }
    }
}
