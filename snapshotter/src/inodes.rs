//! The inode table of a mounted version, built once from its tree: every lookup, getattr and
//! readdir is answered from here without touching the network.

use std::collections::HashMap;

use vial_core::volume::{EntryKind, Tree};

/// Root directory's inode, as FUSE requires.
pub const ROOT: u64 = 1;
/// A virtual file at the root with the mount's statistics, unless the volume has such a path.
pub const STATS_NAME: &str = ".vial-stats";

#[derive(Debug)]
pub enum NodeKind {
    Dir {
        mode: u32,
        children: Vec<(String, u64)>,
    },
    File(FileNode),
    Symlink {
        target: String,
    },
    Stats,
}

#[derive(Debug)]
pub struct FileNode {
    pub size: u64,
    pub mode: u32,
    /// Chunk indexes into the tree's chunk table.
    pub chunks: Vec<u32>,
    /// End offset of each chunk within the file.
    pub ends: Vec<u64>,
    /// Where the file comes in tree order (its index in [`Inodes::files`]).
    pub position: usize,
}

/// A piece of a read: `len` bytes at `offset` within chunk `chunk` (an index into the tree's table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    pub chunk: u32,
    pub offset: u64,
    pub len: u64,
}

impl FileNode {
    /// The chunk pieces that hold bytes `[start, end)` of the file.
    pub fn pieces(&self, start: u64, end: u64) -> Vec<Piece> {
        let end = end.min(self.size);
        let mut out = Vec::new();
        if start >= end {
            return out;
        }
        let mut i = self.ends.partition_point(|&e| e <= start);
        let mut pos = start;
        while pos < end && i < self.chunks.len() {
            let chunk_start = if i == 0 { 0 } else { self.ends[i - 1] };
            let chunk_end = self.ends[i];
            let take_end = end.min(chunk_end);
            out.push(Piece {
                chunk: self.chunks[i],
                offset: pos - chunk_start,
                len: take_end - pos,
            });
            pos = take_end;
            i += 1;
        }
        out
    }

    /// Index (within this file) of the chunk holding byte `offset`.
    pub fn chunk_at(&self, offset: u64) -> usize {
        self.ends.partition_point(|&e| e <= offset)
    }
}

#[derive(Debug)]
pub struct Node {
    pub kind: NodeKind,
}

#[derive(Debug)]
pub struct Inodes {
    nodes: Vec<Node>,
    names: HashMap<(u64, String), u64>,
    /// Files in tree order, by inode, for whole-volume prefetch and for reading ahead of a
    /// program that walks the tree.
    pub files: Vec<u64>,
    /// Each file's path, in the same order (for `--prefetch` patterns).
    pub paths: Vec<Box<str>>,
    /// Bytes of the files in tree order up to and including each one.
    pub file_ends: Vec<u64>,
}

impl Inodes {
    pub fn build(tree: &Tree) -> Inodes {
        let mut nodes = vec![Node {
            kind: NodeKind::Dir {
                mode: 0o755,
                children: Vec::new(),
            },
        }];
        let mut names = HashMap::new();
        let mut by_path: HashMap<&str, u64> = HashMap::new();
        let mut files = Vec::new();
        let mut paths = Vec::new();
        let mut file_ends = Vec::new();
        for e in &tree.entries {
            let ino = nodes.len() as u64 + 1;
            let (parent_path, name) = match e.path.rsplit_once('/') {
                Some((p, n)) => (Some(p), n),
                None => (None, e.path.as_str()),
            };
            // The tree was validated: every parent is a directory listed earlier.
            let parent = parent_path
                .and_then(|p| by_path.get(p).copied())
                .unwrap_or(ROOT);
            let kind = match &e.kind {
                EntryKind::Dir { mode } => NodeKind::Dir {
                    mode: *mode,
                    children: Vec::new(),
                },
                EntryKind::Symlink { target } => NodeKind::Symlink {
                    target: target.clone(),
                },
                EntryKind::File { mode, size, chunks } => {
                    let mut end = 0;
                    let ends = chunks
                        .iter()
                        .map(|&c| {
                            end += tree.chunks[c as usize].size;
                            end
                        })
                        .collect();
                    files.push(ino);
                    paths.push(e.path.as_str().into());
                    file_ends.push(file_ends.last().copied().unwrap_or(0) + size);
                    NodeKind::File(FileNode {
                        size: *size,
                        mode: *mode,
                        chunks: chunks.clone(),
                        ends,
                        position: files.len() - 1,
                    })
                }
            };
            nodes.push(Node { kind });
            by_path.insert(&e.path, ino);
            names.insert((parent, name.to_owned()), ino);
            if let NodeKind::Dir { children, .. } = &mut nodes[(parent - 1) as usize].kind {
                children.push((name.to_owned(), ino));
            }
        }
        if let std::collections::hash_map::Entry::Vacant(slot) =
            names.entry((ROOT, STATS_NAME.to_owned()))
        {
            slot.insert(nodes.len() as u64 + 1);
            nodes.push(Node {
                kind: NodeKind::Stats,
            });
        }
        Inodes {
            nodes,
            names,
            files,
            paths,
            file_ends,
        }
    }

    pub fn get(&self, ino: u64) -> Option<&Node> {
        ino.checked_sub(1).and_then(|i| self.nodes.get(i as usize))
    }

    pub fn lookup(&self, parent: u64, name: &str) -> Option<u64> {
        self.names.get(&(parent, name.to_owned())).copied()
    }

    pub fn len(&self) -> usize {
        self.nodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(ends: &[u64]) -> FileNode {
        FileNode {
            size: *ends.last().unwrap_or(&0),
            mode: 0o644,
            chunks: (0..ends.len() as u32).collect(),
            ends: ends.to_vec(),
            position: 0,
        }
    }

    #[test]
    fn reads_map_onto_chunk_pieces() {
        let f = file(&[10, 25, 40]);
        assert_eq!(
            f.pieces(0, 10),
            vec![Piece {
                chunk: 0,
                offset: 0,
                len: 10
            }]
        );
        assert_eq!(
            f.pieces(5, 30),
            vec![
                Piece {
                    chunk: 0,
                    offset: 5,
                    len: 5
                },
                Piece {
                    chunk: 1,
                    offset: 0,
                    len: 15
                },
                Piece {
                    chunk: 2,
                    offset: 0,
                    len: 5
                }
            ]
        );
        assert_eq!(
            f.pieces(39, 100),
            vec![Piece {
                chunk: 2,
                offset: 14,
                len: 1
            }]
        );
        assert!(f.pieces(40, 50).is_empty());
        assert_eq!(f.chunk_at(10), 1);
    }
}
