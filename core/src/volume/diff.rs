//! What changed between two versions: files added, removed and changed, the chunk bytes a holder
//! of the first must fetch for the second, and, inside safetensors files, which tensors changed.

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::{EntryKind, Tree};
use crate::safetensors::TensorSpan;
use crate::Digest;

/// What changes between two trees, file by file, and what a node holding `a` must fetch for `b`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TreeDiff {
    pub added: Vec<String>,
    pub removed: Vec<String>,
    pub changed: Vec<String>,
    pub bytes_to_fetch: u64,
    pub chunks_to_fetch: usize,
}

/// Compares two trees: an entry changed if its kind, mode, target or chunks (by digest) differ.
/// Both trees' entries are sorted by path (a reader refuses a tree that is not), so one walk over
/// both in step finds every difference, in path order, without a copy of either.
pub fn diff_trees(a: &Tree, b: &Tree) -> TreeDiff {
    let (mut added, mut removed, mut changed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < a.entries.len() || j < b.entries.len() {
        let (x, y) = (a.entries.get(i), b.entries.get(j));
        match (x, y) {
            (Some(x), Some(y)) if x.path == y.path => {
                if !same_entry(a, &x.kind, b, &y.kind) {
                    changed.push(y.path.clone());
                }
                i += 1;
                j += 1;
            }
            (Some(x), Some(y)) if x.path < y.path => {
                removed.push(x.path.clone());
                i += 1;
            }
            (Some(x), None) => {
                removed.push(x.path.clone());
                i += 1;
            }
            (_, Some(y)) => {
                added.push(y.path.clone());
                j += 1;
            }
            (None, None) => break,
        }
    }
    let have: HashSet<&Digest> = a.chunks.iter().map(|c| &c.digest).collect();
    let fetch: Vec<_> = b
        .chunks
        .iter()
        .filter(|c| !have.contains(&c.digest))
        .collect();
    TreeDiff {
        added,
        removed,
        changed,
        bytes_to_fetch: fetch.iter().map(|c| c.size).sum(),
        chunks_to_fetch: fetch.len(),
    }
}

/// Whether entry `x` of tree `a` and entry `y` of tree `b` hold the same thing: the same kind
/// and mode, and a file the same chunks (compared by digest: each tree numbers its own chunks)
/// or a symlink the same target.
fn same_entry(a: &Tree, x: &EntryKind, b: &Tree, y: &EntryKind) -> bool {
    match (x, y) {
        (
            EntryKind::File {
                mode: m, chunks: c, ..
            },
            EntryKind::File {
                mode: n, chunks: d, ..
            },
        ) => {
            m == n
                && c.len() == d.len()
                && c.iter()
                    .zip(d)
                    .all(|(&c, &d)| a.chunks[c as usize].digest == b.chunks[d as usize].digest)
        }
        (EntryKind::Dir { mode: m }, EntryKind::Dir { mode: n }) => m == n,
        (EntryKind::Symlink { target: s }, EntryKind::Symlink { target: t }) => s == t,
        _ => false,
    }
}

/// A file's chunks as byte ranges: `(offset in the file, size, digest)`, in order.
pub fn file_chunks<'a>(tree: &'a Tree, path: &str) -> Option<Vec<(u64, u64, &'a Digest)>> {
    let entry = tree.entry(path)?;
    let EntryKind::File { chunks, .. } = &entry.kind else {
        return None;
    };
    let mut offset = 0;
    Some(
        chunks
            .iter()
            .map(|&c| {
                let chunk = &tree.chunks[c as usize];
                let at = offset;
                offset += chunk.size;
                (at, chunk.size, &chunk.digest)
            })
            .collect(),
    )
}

/// How a tensor differs between two versions of a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TensorChange {
    Added,
    Removed,
    /// Its bytes changed, or it moved, or it shares a chunk with a tensor that did (small tensors
    /// are grouped into chunks up to the minimum chunk size).
    Changed,
}

/// One tensor that differs, with its size in the newer version (the older, if removed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TensorDiff {
    pub name: String,
    pub change: TensorChange,
    pub bytes: u64,
}

/// The chunks covering `[start, end)` of a file, each as its digest and its offset from `start`.
fn covering<'a>(chunks: &[(u64, u64, &'a Digest)], start: u64, end: u64) -> Vec<(i64, &'a Digest)> {
    chunks
        .iter()
        .filter(|(at, size, _)| *at < end.max(start + 1) && at + size > start)
        .map(|(at, _, d)| (*at as i64 - start as i64, *d))
        .collect()
}

/// Which tensors differ between two versions of a safetensors file, from each version's header
/// (tensor names and byte ranges) and chunk list: a tensor is unchanged when it has the same size
/// in both and the chunks covering it are the same chunks at the same distance from its start,
/// so no byte of it needs reading. Vial cuts chunks at tensor boundaries, so a changed tensor
/// touches only its own chunks, and those of small neighbours grouped with it.
pub fn tensor_changes(
    old_tensors: &[TensorSpan],
    old_chunks: &[(u64, u64, &Digest)],
    new_tensors: &[TensorSpan],
    new_chunks: &[(u64, u64, &Digest)],
) -> Vec<TensorDiff> {
    let old: HashMap<&str, &TensorSpan> =
        old_tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let new_names: HashSet<&str> = new_tensors.iter().map(|t| t.name.as_str()).collect();
    let mut out = Vec::new();
    for t in new_tensors {
        let bytes = t.end - t.start;
        let change = match old.get(t.name.as_str()) {
            None => Some(TensorChange::Added),
            Some(o) if o.end - o.start != bytes => Some(TensorChange::Changed),
            Some(o) => (covering(old_chunks, o.start, o.end)
                != covering(new_chunks, t.start, t.end))
            .then_some(TensorChange::Changed),
        };
        if let Some(change) = change {
            out.push(TensorDiff {
                name: t.name.clone(),
                change,
                bytes,
            });
        }
    }
    for t in old_tensors {
        if !new_names.contains(t.name.as_str()) {
            out.push(TensorDiff {
                name: t.name.clone(),
                change: TensorChange::Removed,
                bytes: t.end - t.start,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::{ChunkRef, ChunkingInfo, TreeBuilder};
    use crate::Algorithm;

    fn span(name: &str, start: u64, end: u64) -> TensorSpan {
        TensorSpan {
            name: name.into(),
            start,
            end,
        }
    }

    fn chunk(name: &str, size: u64) -> ChunkRef {
        ChunkRef {
            digest: Algorithm::Sha256.digest_bytes(name.as_bytes()),
            size,
        }
    }

    /// Builds a tree from (path, what): `f:c1,c2` a file of those chunks, `x:…` the same but
    /// executable, `d` a directory, `l:target` a symlink.
    fn tree(entries: &[(&str, &str)]) -> Tree {
        let mut b = TreeBuilder::new(ChunkingInfo::v1(crate::chunking::DEFAULT_PARAMS));
        for (path, what) in entries {
            match what.split_once(':') {
                Some(("f" | "x", chunks)) => {
                    let mode = if what.starts_with('x') { 0o755 } else { 0o644 };
                    let chunks = chunks
                        .split(',')
                        .filter(|c| !c.is_empty())
                        .map(|c| chunk(c, c.len() as u64 * 10))
                        .collect();
                    b.add_file(path, mode, chunks).unwrap();
                }
                Some(("l", target)) => b.add_symlink(path, target).unwrap(),
                _ => b.add_dir(path).unwrap(),
            }
        }
        b.finish().unwrap()
    }

    #[test]
    fn trees_differ_by_path_kind_mode_target_and_chunk_digests_not_chunk_numbers() {
        let old = tree(&[
            ("a/first", "f:one,two"),
            ("a/same", "f:three"),
            ("a/gone", "f:four"),
            ("b", "d"),
            ("link", "l:a/first"),
            ("mode", "f:five"),
            ("was-file", "f:six"),
            ("z-empty", "f:"),
        ]);
        let new = tree(&[
            // A new first file renumbers every chunk after it: "same" keeps its content.
            ("0-new", "f:seven,eight"),
            ("a/first", "f:one,nine"),
            ("a/same", "f:three"),
            ("b", "d"),
            ("b/inside", "f:two"),
            ("link", "l:a/same"),
            ("mode", "x:five"),
            ("was-file", "d"),
            ("z-empty", "f:"),
        ]);
        let d = diff_trees(&old, &new);
        assert_eq!(d.added, ["0-new", "b/inside"]);
        assert_eq!(d.removed, ["a/gone"]);
        assert_eq!(d.changed, ["a/first", "link", "mode", "was-file"]);
        // seven, eight and nine are new; two moved to b/inside and is had.
        assert_eq!(d.chunks_to_fetch, 3);
        assert_eq!(d.bytes_to_fetch, 50 + 50 + 40);
        let back = diff_trees(&new, &old);
        assert_eq!(back.added, d.removed);
        assert_eq!(back.removed, d.added);
        assert_eq!(back.changed, d.changed);
        let same = diff_trees(&new, &new);
        assert!(same.added.is_empty() && same.removed.is_empty() && same.changed.is_empty());
        assert_eq!(same.chunks_to_fetch, 0);
    }

    #[test]
    fn an_entry_is_found_by_path_among_many() {
        let names: Vec<String> = (0..1000).map(|i| format!("d{}/f{i:04}", i % 7)).collect();
        let entries: Vec<(&str, &str)> = names.iter().map(|n| (n.as_str(), "f:")).collect();
        let t = tree(&entries);
        for n in &names {
            assert_eq!(t.entry(n).map(|e| e.path.as_str()), Some(n.as_str()));
        }
        assert!(t
            .entry("d0")
            .is_some_and(|e| matches!(e.kind, EntryKind::Dir { .. })));
        assert!(t.entry("d0/f0001").is_none());
        assert!(t.entry("").is_none());
    }

    #[test]
    fn tensors_whose_chunks_are_unchanged_are_unchanged_even_if_they_moved_with_their_chunks() {
        let d = |s: &str| Algorithm::Sha256.digest_bytes(s.as_bytes());
        let (h1, h2, a, b, b2, c) = (d("h1"), d("h2"), d("a"), d("b"), d("b2"), d("c"));
        // Old: header 0..100, a 100..300, b 300..400 (grouped with c in one chunk), c 400..450.
        let old_t = [
            span("a", 100, 300),
            span("b", 300, 400),
            span("c", 400, 450),
        ];
        let old_c = [(0, 100, &h1), (100, 200, &a), (300, 150, &b)];
        // New: a longer header shifts everything by 10; b rewritten (its group chunk changes);
        // d added.
        let new_t = [
            span("a", 110, 310),
            span("b", 310, 410),
            span("c", 410, 460),
            span("d", 460, 470),
        ];
        let new_c = [
            (0, 110, &h2),
            (110, 200, &a),
            (310, 150, &b2),
            (460, 10, &c),
        ];
        let changes = tensor_changes(&old_t, &old_c, &new_t, &new_c);
        let names: Vec<(&str, TensorChange)> = changes
            .iter()
            .map(|c| (c.name.as_str(), c.change))
            .collect();
        assert_eq!(
            names,
            [
                ("b", TensorChange::Changed),
                // c shares b's chunk: reported with it.
                ("c", TensorChange::Changed),
                ("d", TensorChange::Added),
            ]
        );
        let gone = tensor_changes(&new_t, &new_c, &old_t, &old_c);
        assert!(gone
            .iter()
            .any(|c| c.name == "d" && c.change == TensorChange::Removed));
    }
}
