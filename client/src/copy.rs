//! `vial copy`: copies a version (or any OCI manifest, index or artifact) between repositories and
//! registries, with its digest unchanged, sending only the blobs the destination lacks.
//!
//! The source is walked from its root manifest down (indexes to their manifests, manifests to their
//! config and layers), one level at a time with the fetches of a level in parallel. The
//! destination is asked once which blobs it already holds (vial's bulk check, or a HEAD per blob
//! elsewhere); within one registry the rest are mounted across repositories, between registries
//! they are downloaded, verified and uploaded. Manifests are then pushed children first, by digest,
//! so the destination never holds a manifest whose references are missing, and the root last:
//! an interrupted copy publishes nothing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use futures_util::{StreamExt, TryStreamExt};
use tokio::sync::Semaphore;
use vial_core::manifest::summarize;
use vial_core::{Digest, RepoName, Tag, Target};

use crate::progress::{Event, Progress};
use crate::{plan_runs, ClientError, Manifest, Registry, RunSize};

/// Bytes of blobs held in memory at once while they pass from one registry to the other.
const IN_FLIGHT_BYTES: u64 = 512 << 20;
/// Requests in flight at once, per kind.
const PARALLEL: usize = 16;

#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct CopyReport {
    pub digest: String,
    pub manifests: u64,
    pub blobs: u64,
    /// Blobs the destination already held.
    pub blobs_present: u64,
    /// Blobs mounted from the source repository (same registry).
    pub blobs_mounted: u64,
    pub blobs_copied: u64,
    pub bytes_copied: u64,
    pub seconds: f64,
}

/// Where a copy reads and writes.
#[derive(Debug, Clone, Copy)]
pub struct Endpoints<'a> {
    pub src: &'a Registry,
    pub src_repo: &'a RepoName,
    pub dst: &'a Registry,
    pub dst_repo: &'a RepoName,
}

/// Copies `target` and everything it references, then points `tags` at it. Returns the report;
/// its digest is the source's, which the destination confirmed.
pub async fn copy(
    at: Endpoints<'_>,
    target: &Target,
    tags: &[Tag],
    progress: &dyn Progress,
) -> Result<CopyReport, ClientError> {
    let started = Instant::now();
    let Endpoints {
        src,
        src_repo,
        dst,
        dst_repo,
    } = at;
    let root = src.get_manifest(src_repo, target).await?.ok_or_else(|| {
        ClientError::NotFound(match target {
            Target::Tag(t) => format!("{src_repo}:{t}"),
            Target::Digest(d) => format!("{src_repo}@{d}"),
        })
    })?;

    let Graph {
        levels,
        blobs,
        sizes,
    } = walk(src, src_repo, root.clone()).await?;

    // Which blobs the destination lacks.
    let present = dst.present_blobs(dst_repo, &blobs).await?;
    let missing: Vec<Digest> = blobs
        .iter()
        .filter(|d| !present.contains(*d))
        .cloned()
        .collect();

    // The first bar: the whole version, checked against the destination; the second: what travels.
    let total: u64 = blobs
        .iter()
        .map(|d| sizes.get(d).copied().unwrap_or(0))
        .sum();
    progress.event(Event::Scanned {
        files: blobs.len() as u64,
        bytes: total,
    });
    progress.event(Event::Hashed(total));
    progress.event(Event::Needed(
        missing
            .iter()
            .map(|d| sizes.get(d).copied().unwrap_or(0))
            .sum(),
    ));
    let same_registry = src.host() == dst.host();
    let mounted = AtomicU64::new(0);
    let copied = AtomicU64::new(0);
    let bytes = AtomicU64::new(0);
    // Between two vial registries, small blobs (a volume's chunks: thousands of them for a tree
    // of small files) travel in bulk: one read of many from the source, one pack to the
    // destination. What either side cannot take in bulk goes one by one below.
    let missing = if same_registry || dst.packs_unsupported() {
        missing
    } else {
        let (small, mut single): (Vec<Digest>, Vec<Digest>) = missing
            .into_iter()
            .partition(|d| sizes.get(d).is_some_and(|&n| n <= BULK_BLOB_MAX));
        let left: Vec<Vec<Digest>> = futures_util::stream::iter(plan_runs(
            small,
            |d| sizes.get(d).copied().unwrap_or(0),
            RunSize::COPY,
        ))
        .map(|run| {
            let (copied, bytes, sizes) = (&copied, &bytes, &sizes);
            async move {
                let Some(moved) = copy_run(at, &run, sizes).await? else {
                    return Ok::<_, ClientError>(run);
                };
                copied.fetch_add(run.len() as u64, Ordering::Relaxed);
                bytes.fetch_add(moved, Ordering::Relaxed);
                progress.event(Event::Transferred(moved));
                Ok(Vec::new())
            }
        })
        .buffer_unordered(RUNS_IN_FLIGHT)
        .try_collect()
        .await?;
        single.extend(left.into_iter().flatten());
        single
    };
    let budget = Arc::new(Semaphore::new(IN_FLIGHT_BYTES as usize));
    futures_util::stream::iter(missing)
        .map(|d| {
            let (budget, mounted, copied, bytes, sizes) =
                (&budget, &mounted, &copied, &bytes, &sizes);
            async move {
                if same_registry && dst.mount_blob(dst_repo, &d, src_repo).await? {
                    mounted.fetch_add(1, Ordering::Relaxed);
                    progress.event(Event::Transferred(sizes.get(&d).copied().unwrap_or(0)));
                    return Ok(());
                }
                // Hold a share of the memory budget for the blob while it is in memory. The size
                // is only known once it is here, so take a chunk's worth first and the rest after.
                let first = budget
                    .acquire_many(8 << 20)
                    .await
                    .map_err(|_| ClientError::Cancelled)?;
                let data = src.get_blob(src_repo, &d, None).await?;
                // Capped so that one waiter can always be served while every task holds its
                // first share: no deadlock, whatever the blob sizes.
                let cap = IN_FLIGHT_BYTES - (PARALLEL as u64 / 2) * (8 << 20);
                let extra = (data.len() as u64).saturating_sub(8 << 20).min(cap);
                let _rest = budget
                    .acquire_many(extra as u32)
                    .await
                    .map_err(|_| ClientError::Cancelled)?;
                let len = data.len() as u64;
                dst.push_blob(dst_repo, &d, data).await?;
                drop(first);
                progress.event(Event::Transferred(len));
                copied.fetch_add(1, Ordering::Relaxed);
                bytes.fetch_add(len, Ordering::Relaxed);
                Ok::<(), ClientError>(())
            }
        })
        .buffer_unordered(PARALLEL / 2)
        .try_collect::<Vec<()>>()
        .await?;

    // Manifests, deepest first; siblings in parallel. The root goes by digest, then the tags.
    let manifests: u64 = levels.iter().map(|l| l.len() as u64).sum();
    let mut by_digest: HashMap<Digest, Digest> = HashMap::new();
    for level in levels.iter().rev() {
        let pushed: Vec<(Digest, Digest)> = futures_util::stream::iter(level.iter())
            .map(|m| async move {
                let got = dst
                    .put_manifest(
                        dst_repo,
                        m.digest.as_str(),
                        &m.media_type,
                        m.bytes.clone(),
                        None,
                    )
                    .await?;
                Ok::<_, ClientError>((m.digest.clone(), got))
            })
            .buffer_unordered(PARALLEL)
            .try_collect()
            .await?;
        by_digest.extend(pushed);
    }
    for (sent, got) in &by_digest {
        if sent != got {
            return Err(ClientError::DigestMismatch {
                what: format!("manifest copied to {dst_repo}"),
                expected: sent.clone(),
                actual: got.clone(),
            });
        }
    }
    for tag in tags {
        dst.put_manifest(
            dst_repo,
            tag.as_str(),
            &root.media_type,
            root.bytes.clone(),
            None,
        )
        .await?;
    }
    Ok(CopyReport {
        digest: root.digest.to_string(),
        manifests,
        blobs: blobs.len() as u64,
        blobs_present: present.len() as u64,
        blobs_mounted: mounted.into_inner(),
        blobs_copied: copied.into_inner(),
        bytes_copied: bytes.into_inner(),
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// Blobs at most this large travel in bulk between vial registries (a chunk is at most 8 MiB).
const BULK_BLOB_MAX: u64 = 8 << 20;
/// Bulk copies in flight at once.
const RUNS_IN_FLIGHT: usize = 4;

/// Copies a run of blobs in one bulk read from the source and one pack to the destination, each
/// blob checked against its digest on the way. `None` when the source has no bulk reads (the
/// caller copies the run one by one); a destination without packs gets the blobs one by one here.
/// Returns the bytes moved.
async fn copy_run(
    at: Endpoints<'_>,
    run: &[Digest],
    sizes: &HashMap<Digest, u64>,
) -> Result<Option<u64>, ClientError> {
    let list: Vec<(Digest, u64)> = run
        .iter()
        .map(|d| (d.clone(), sizes.get(d).copied().unwrap_or(0)))
        .collect();
    let Some(mut blobs) = at.src.read_run_in_bulk(at.src_repo, &list).await? else {
        return Ok(None);
    };
    let total: u64 = list.iter().map(|(_, n)| n).sum();
    let mut parts = Vec::with_capacity(list.len());
    while let Some(blob) = blobs.next().await {
        parts.push(blob?.verify()?.into_bytes());
    }
    if !at.dst.push_pack(at.dst_repo, &list, parts.clone()).await? {
        for ((digest, _), part) in list.iter().zip(parts) {
            at.dst.push_blob(at.dst_repo, digest, part).await?;
        }
    }
    Ok(Some(total))
}

/// A manifest and everything it references, as [`walk`] finds them.
#[derive(Debug)]
pub struct Graph {
    /// `levels[i]` holds the manifests first reached at depth i; `levels[0]` is the root.
    pub levels: Vec<Vec<Manifest>>,
    /// Every blob (configs and layers), each once, in the order first reached.
    pub blobs: Vec<Digest>,
    /// The sizes the descriptors give for the blobs.
    pub sizes: HashMap<Digest, u64>,
}

/// Fetches everything `root` references, a level at a time with the fetches of a level in
/// parallel.
pub async fn walk(src: &Registry, repo: &RepoName, root: Manifest) -> Result<Graph, ClientError> {
    let mut levels: Vec<Vec<Manifest>> = Vec::new();
    let mut seen: HashSet<Digest> = HashSet::from([root.digest.clone()]);
    let mut blobs: Vec<Digest> = Vec::new();
    let mut blob_seen: HashSet<Digest> = HashSet::new();
    let mut sizes: HashMap<Digest, u64> = HashMap::new();
    let mut level = vec![root];
    while !level.is_empty() {
        let mut children = Vec::new();
        for m in &level {
            let summary = summarize(Some(&m.media_type), &m.bytes).map_err(|e| {
                ClientError::InvalidVolume(format!("manifest {} cannot be read: {e}", m.digest))
            })?;
            for b in summary.blobs {
                sizes.insert(b.digest.clone(), b.size);
                if blob_seen.insert(b.digest.clone()) {
                    blobs.push(b.digest);
                }
            }
            for c in summary.children {
                if seen.insert(c.digest.clone()) {
                    children.push(c.digest);
                }
            }
        }
        levels.push(level);
        level = futures_util::stream::iter(children)
            .map(|d| async move {
                src.get_manifest(repo, &Target::Digest(d.clone()))
                    .await?
                    .ok_or_else(|| ClientError::NotFound(format!("manifest {d} in {repo}")))
            })
            .buffer_unordered(PARALLEL)
            .try_collect()
            .await?;
    }

    Ok(Graph {
        levels,
        blobs,
        sizes,
    })
}
