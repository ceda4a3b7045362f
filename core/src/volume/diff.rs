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

/// Compares two trees: an entry changed if its kind, mode, target or chunks differ.
pub fn diff_trees(a: &Tree, b: &Tree) -> TreeDiff {
    let key = |t: &Tree| -> HashMap<String, String> {
        t.entries
            .iter()
            .map(|e| {
                let k = match &e.kind {
                    EntryKind::File { mode, chunks, .. } => {
                        let digests: Vec<&str> = chunks
                            .iter()
                            .map(|&c| t.chunks[c as usize].digest.as_str())
                            .collect();
                        format!("file {mode:o} {}", digests.join(","))
                    }
                    EntryKind::Dir { mode } => format!("dir {mode:o}"),
                    EntryKind::Symlink { target } => format!("symlink {target}"),
                };
                (e.path.clone(), k)
            })
            .collect()
    };
    let (ka, kb) = (key(a), key(b));
    let mut added: Vec<String> = kb
        .keys()
        .filter(|p| !ka.contains_key(*p))
        .cloned()
        .collect();
    let mut removed: Vec<String> = ka
        .keys()
        .filter(|p| !kb.contains_key(*p))
        .cloned()
        .collect();
    let mut changed: Vec<String> = kb
        .iter()
        .filter(|(p, k)| ka.get(*p).is_some_and(|old| old != *k))
        .map(|(p, _)| p.clone())
        .collect();
    added.sort();
    removed.sort();
    changed.sort();
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

/// A file's chunks as byte ranges: `(offset in the file, size, digest)`, in order.
pub fn file_chunks<'a>(tree: &'a Tree, path: &str) -> Option<Vec<(u64, u64, &'a Digest)>> {
    let entry = tree.entries.iter().find(|e| e.path == path)?;
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
    use crate::Algorithm;

    fn span(name: &str, start: u64, end: u64) -> TensorSpan {
        TensorSpan {
            name: name.into(),
            start,
            end,
        }
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
