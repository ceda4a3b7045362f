//! Reading ahead across files: a program that reads a tree of small files (a tokenizer's
//! directory, an index of thousands of shards, `cat` over a glob, Python's `os.walk`) opens them in
//! the order the directories list them, which is the tree's order. Each small file alone is one
//! chunk and one round trip; once the mount sees files read in that order, it fetches the files
//! that follow in bulk reads, so the next ones are in the cache before they are opened.
//!
//! Only a walk triggers it: a file read at its start right after one of the files just before it
//! (a few places of slack, for programs that read with several threads). The window starts at
//! 1 MiB and doubles with each file read in order, to [`WINDOW_MAX`], and is extended in steps
//! once less than half of it is still ahead of the reader, as within a file.

use std::collections::HashSet;

use vial_core::volume::ChunkRef;
use vial_core::Digest;

use crate::inodes::{Inodes, NodeKind};

/// Files read in order before the mount reads ahead of them.
const WALK_START: u32 = 2;
/// How far out of order a file may be read and still count as part of a walk.
const SLACK: usize = 8;
/// The furthest ahead of a walking reader that files are fetched, in bytes.
const WINDOW_MAX: u64 = 32 << 20;
const WINDOW_MIN: u64 = 1 << 20;
/// Most files one step of read-ahead covers.
const STEP_FILES: usize = 4096;

/// Where a walk through the tree has got to.
#[derive(Debug, Default)]
pub struct Walk {
    /// The furthest file (by tree position) read at its start.
    last: Option<usize>,
    /// Files read in order so far.
    run: u32,
    /// Files below this position have had their fetch started.
    mark: usize,
}

impl Walk {
    /// Notes that the file at `position` was read at its start; says which files to fetch ahead
    /// (a range of tree positions), if any. `ends` are the files' cumulative sizes in tree order.
    pub(crate) fn step(
        &mut self,
        position: usize,
        ends: &[u64],
    ) -> Option<(std::ops::Range<usize>, u64)> {
        match self.last {
            Some(last) if position > last && position - last <= SLACK => {
                self.run += 1;
                self.last = Some(position);
            }
            // A file a little behind the furthest: another thread of the same walk.
            Some(last) if position <= last && last - position <= SLACK => {}
            _ => {
                self.run = 0;
                self.last = Some(position);
                self.mark = position + 1;
            }
        }
        if self.run < WALK_START {
            return None;
        }
        let window = (WINDOW_MIN << self.run.min(16)).min(WINDOW_MAX);
        let upto = |p: usize| if p == 0 { 0 } else { ends[p - 1] };
        let from = self.mark.max(position + 1);
        // Extend once less than half the window is on its way.
        if upto(from) - upto(position + 1) > window / 2 || from >= ends.len() {
            return None;
        }
        let target = upto(position + 1) + window;
        // Every file whose bytes start inside the window, at least one.
        let end = ends
            .partition_point(|&e| e < target)
            .saturating_add(1)
            .clamp(from + 1, ends.len())
            .min(from + STEP_FILES);
        self.mark = end;
        Some((from..end, window))
    }
}

/// The chunks not yet local of the files at tree positions `range`, whole files in order while
/// they fit in `window` bytes: a walk is a walk of small files, and a file larger than what is
/// left of the window gets the read-ahead of its own reader when it is read (fetching it here
/// would push out of a small cache what was just read).
pub(crate) fn missing(
    inodes: &Inodes,
    chunks: &[ChunkRef],
    range: std::ops::Range<usize>,
    window: u64,
    available: impl Fn(&Digest) -> bool,
) -> Vec<(Digest, u64)> {
    let mut seen = HashSet::new();
    let mut missing = Vec::new();
    let mut budget = window;
    for &ino in &inodes.files[range] {
        let Some(NodeKind::File(f)) = inodes.get(ino).map(|n| &n.kind) else {
            continue;
        };
        if f.size > budget {
            break;
        }
        budget -= f.size;
        for &c in &f.chunks {
            let chunk = &chunks[c as usize];
            if seen.insert(c) && !available(&chunk.digest) {
                missing.push((chunk.digest.clone(), chunk.size));
            }
        }
    }
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` files of `size` bytes each, as cumulative ends.
    fn ends(n: usize, size: u64) -> Vec<u64> {
        (1..=n as u64).map(|i| i * size).collect()
    }

    #[test]
    fn a_walk_in_tree_order_reads_ahead_in_growing_steps() {
        let ends = ends(10_000, 4096);
        let mut walk = Walk::default();
        assert_eq!(walk.step(0, &ends), None);
        assert_eq!(walk.step(1, &ends), None);
        // The third file in order starts it: 4 MiB (1 MiB doubled twice) of 4 KiB files.
        let (first, window) = walk.step(2, &ends).unwrap();
        assert_eq!(window, 4 << 20);
        assert_eq!(first.start, 3);
        assert_eq!(first.len(), 1024);
        // Walking on, each step starts where the last ended: every file ahead is fetched once,
        // never more than the window's bytes (and a file) ahead of the reader, and the steps
        // grow with the window.
        let mut next = first.end;
        let mut steps = vec![first.len()];
        for p in 3..ends.len() {
            if let Some((r, _)) = walk.step(p, &ends) {
                assert_eq!(r.start, next);
                assert!(r.len() <= STEP_FILES);
                next = r.end;
                steps.push(r.len());
            }
            let ahead = ends[next - 1] - ends[p];
            assert!(ahead <= WINDOW_MAX + 4096, "{ahead} bytes ahead at {p}");
        }
        assert_eq!(next, ends.len(), "the walk reached the end of the tree");
        assert!(steps.iter().max() > steps.first());
    }

    #[test]
    fn threads_of_one_walk_keep_it_going_and_a_jump_starts_over() {
        let ends = ends(1000, 100);
        let mut walk = Walk::default();
        for p in [0, 2, 1, 3] {
            walk.step(p, &ends);
        }
        assert_eq!(walk.run, 2);
        // A jump far ahead (or back) is a new start: nothing is fetched for it.
        assert_eq!(walk.step(500, &ends), None);
        assert_eq!(walk.run, 0);
        assert_eq!(walk.step(100, &ends), None);
        assert_eq!(walk.step(101, &ends), None);
        let (r, _) = walk.step(102, &ends).unwrap();
        assert_eq!(r.start, 103);
        // The end of the tree bounds it.
        assert!(r.end <= 1000);
    }

    #[test]
    fn a_large_file_ahead_ends_the_step_at_it() {
        // Three small files, then a 1 GiB shard, then more small files.
        let mut sizes = vec![100u64; 8];
        sizes[5] = 1 << 30;
        let mut ends = Vec::new();
        for s in sizes {
            ends.push(ends.last().copied().unwrap_or(0) + s);
        }
        let mut walk = Walk::default();
        walk.step(0, &ends);
        walk.step(1, &ends);
        let (r, _) = walk.step(2, &ends).unwrap();
        assert_eq!(
            r,
            3..6,
            "up to and including the shard, whose start is in the window"
        );
    }
}
