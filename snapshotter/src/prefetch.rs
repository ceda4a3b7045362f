//! Prefetch: stream every chunk of the volume (`--prefetch all`) or of the files that match
//! patterns (`--prefetch 'tokenizer/**'`) into the cache in tree order, as one stream of bulk
//! reads, so a model that reads all its weights or a loader that reads its whole index finds them
//! already local. Stops short of the cache bound so it never evicts what it just fetched.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::StreamExt;

use crate::fetch::Priority;
use crate::fs::Shared;
use crate::inodes::NodeKind;
use crate::mount::Prefetch;
use crate::stats::InFlight;

/// Bulk reads (runs of up to [`crate::fetch::RUN_BYTES`]) the prefetcher keeps in flight.
const PARALLEL: usize = 4;

/// Prefetches what `prefetch` names; nothing for [`Prefetch::None`].
pub async fn prefetch(shared: Arc<Shared>, prefetch: Prefetch) {
    let patterns: Option<Vec<Vec<&str>>> = match &prefetch {
        Prefetch::None => return,
        Prefetch::All => None,
        Prefetch::Paths(p) => Some(p.iter().map(|p| segments(p)).collect()),
    };
    let budget = shared.fetcher.cache().limit() / 10 * 9;
    let mut planned = 0u64;
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    let (mut files, mut skipped) = (0u64, 0u64);
    for (i, &ino) in shared.inodes.files.iter().enumerate() {
        if let Some(patterns) = &patterns {
            let path = segments(&shared.inodes.paths[i]);
            if !patterns.iter().any(|p| matches_or_below(p, &path)) {
                skipped += 1;
                continue;
            }
        }
        files += 1;
        if let Some(NodeKind::File(f)) = shared.inodes.get(ino).map(|n| &n.kind) {
            for &c in &f.chunks {
                let size = shared.chunks[c as usize].size;
                if seen.insert(c) {
                    if planned + size > budget {
                        tracing::info!(
                            planned,
                            budget,
                            "volume is larger than the cache: prefetching only its start"
                        );
                        break;
                    }
                    planned += size;
                    order.push(c);
                }
            }
        }
    }
    let started = std::time::Instant::now();
    let runs = crate::fetch::runs(order.into_iter().map(|c| {
        let chunk = &shared.chunks[c as usize];
        (chunk.digest.clone(), chunk.size)
    }));
    let results = futures_util::stream::iter(runs)
        .map(|run| {
            let shared = Arc::clone(&shared);
            async move {
                let _in_flight = InFlight::start(&shared.stats);
                let r = shared.fetcher.ensure_run(&run, Priority::Background).await;
                if let Ok(n) = r {
                    shared
                        .stats
                        .prefetched_chunks
                        .fetch_add(n as u64, Ordering::Relaxed);
                }
                r
            }
        })
        .buffer_unordered(PARALLEL)
        .collect::<Vec<_>>()
        .await;
    let failed = results.iter().filter(|r| r.is_err()).count();
    tracing::info!(
        files,
        skipped,
        bytes = planned,
        failed,
        seconds = started.elapsed().as_secs_f64(),
        "prefetch finished"
    );
}

fn segments(path: &str) -> Vec<&str> {
    path.split('/').filter(|s| !s.is_empty()).collect()
}

/// Whether a pattern matches the path or a directory it lies under (`tokenizer` names every file
/// in it, as `tokenizer/**` does).
fn matches_or_below(pattern: &[&str], path: &[&str]) -> bool {
    (1..=path.len()).any(|n| matches(pattern, &path[..n]))
}

/// Glob matching by path segment: `**` is any number of segments (none too), `*` any run of
/// characters within one, `?` one character.
fn matches(pattern: &[&str], path: &[&str]) -> bool {
    match pattern.split_first() {
        None => path.is_empty(),
        Some((&"**", rest)) => (0..=path.len()).any(|skip| matches(rest, &path[skip..])),
        Some((first, rest)) => path
            .split_first()
            .is_some_and(|(seg, tail)| matches_segment(first, seg) && matches(rest, tail)),
    }
}

fn matches_segment(pattern: &str, name: &str) -> bool {
    let (p, n): (Vec<char>, Vec<char>) = (pattern.chars().collect(), name.chars().collect());
    // Classic two-pointer wildcard match, backtracking to the last `*`.
    let (mut i, mut j) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while j < n.len() {
        match p.get(i) {
            Some('*') => {
                star = Some((i, j));
                i += 1;
            }
            Some(&c) if c == '?' || c == n[j] => {
                i += 1;
                j += 1;
            }
            _ => match star {
                Some((si, sj)) => {
                    i = si + 1;
                    j = sj + 1;
                    star = Some((si, sj + 1));
                }
                None => return false,
            },
        }
    }
    p[i..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        matches_or_below(&segments(pattern), &segments(path))
    }

    #[test]
    fn patterns_match_by_segment_and_name_whole_directories() {
        assert!(m("tokenizer", "tokenizer/vocab.json"));
        assert!(m("tokenizer/", "tokenizer/merges/a.txt"));
        assert!(!m("tokenizer", "tokenizer2/vocab.json"));
        assert!(m("*.json", "config.json"));
        assert!(!m("*.json", "sub/config.json"));
        assert!(m("**/*.json", "sub/deeper/config.json"));
        assert!(m("**/*.json", "config.json"));
        assert!(m("index/shard-0?.bin", "index/shard-07.bin"));
        assert!(!m("index/shard-0?.bin", "index/shard-107.bin"));
        assert!(m("index/*", "index/a/b/c"));
        assert!(m("a*b*c", "aXbYc"));
        assert!(!m("a*b*c", "aXbY"));
        assert!(m("**", "anything/at/all"));
        assert!(!m("model.safetensors", "model-00001.safetensors"));
    }
}
