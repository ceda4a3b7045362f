//! Prefetch: stream every chunk of the volume (`--prefetch all`) or of the files that match
//! patterns (`--prefetch 'tokenizer/**'`) into the cache in tree order, as one stream of bulk
//! reads, so a model that reads all its weights or a loader that reads its whole index finds them
//! already local. Stops short of the cache bound so it never evicts what it just fetched.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use futures_util::StreamExt;
use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::fetch::Priority;
use crate::inodes::NodeKind;
use crate::shared::Shared;
use crate::stats::InFlight;

/// What to fetch before it is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prefetch {
    /// Only read-ahead behind sequential readers and programs walking the tree.
    None,
    /// Stream the whole volume into the cache in the background.
    All,
    /// Stream the files these patterns match (paths, directories, or globs with `*`, `?` and
    /// `**`), in tree order, into the cache in the background.
    Paths(Vec<String>),
}

impl Prefetch {
    /// From `--prefetch` values: `none`, `all`, or patterns (each value one pattern); a pattern
    /// that is not a glob is an error.
    pub fn from_args(values: &[String]) -> Result<Prefetch, String> {
        if values.iter().any(|v| v == "all") {
            return Ok(Prefetch::All);
        }
        let paths: Vec<String> = values.iter().filter(|v| *v != "none").cloned().collect();
        if paths.is_empty() {
            return Ok(Prefetch::None);
        }
        compile(&paths)?;
        Ok(Prefetch::Paths(paths))
    }
}

/// Bulk reads (runs of up to [`vial_client::RunSize::MOUNT`]) the prefetcher keeps in flight.
const PARALLEL: usize = 4;

/// Prefetches what `prefetch` names; nothing for [`Prefetch::None`].
pub async fn prefetch(shared: Arc<Shared>, prefetch: Prefetch) {
    let patterns = match &prefetch {
        Prefetch::None => return,
        Prefetch::All => None,
        // Checked when the mount was asked for (`Prefetch::from_args`).
        Prefetch::Paths(p) => match compile(p) {
            Ok(set) => Some(set),
            Err(e) => return tracing::error!(error = %e, "prefetch skipped"),
        },
    };
    let budget = shared.fetcher.cache().limit() / 10 * 9;
    let mut planned = 0u64;
    let mut seen = std::collections::HashSet::new();
    let mut order = Vec::new();
    let (mut files, mut skipped) = (0u64, 0u64);
    for (i, &ino) in shared.inodes.files.iter().enumerate() {
        if let Some(patterns) = &patterns {
            if !matches_or_below(patterns, &shared.inodes.paths[i]) {
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

/// The `--prefetch` patterns, compiled: `*` and `?` stay within a path segment, `**` spans any
/// number of them (the syntax of `vial sync --include`).
pub fn compile(patterns: &[String]) -> Result<GlobSet, String> {
    let mut set = GlobSetBuilder::new();
    for p in patterns {
        let glob = GlobBuilder::new(p.trim_matches('/'))
            .literal_separator(true)
            .build()
            .map_err(|e| format!("bad --prefetch pattern {p:?}: {e}"))?;
        set.add(glob);
    }
    set.build()
        .map_err(|e| format!("bad --prefetch patterns: {e}"))
}

/// Whether the patterns match the path or a directory it lies under (`tokenizer` names every
/// file in it, as `tokenizer/**` does).
fn matches_or_below(set: &GlobSet, path: &str) -> bool {
    set.is_match(path)
        || path
            .match_indices('/')
            .any(|(i, _)| set.is_match(&path[..i]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        matches_or_below(&compile(&[pattern.to_owned()]).unwrap(), path)
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
        assert!(compile(&["[".to_owned()]).is_err());
    }
}
