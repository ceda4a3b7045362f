//! Copying the files of a bucket or a Hub repository: each chunked as `vial push` does, the
//! finished ones recorded so a later attempt skips them, then sealed into one version.

use std::collections::HashMap;

use futures_util::{StreamExt, TryStreamExt};
use vial_core::chunking::DEFAULT_PARAMS;
use vial_core::volume::{build_layout_for, validate_path, ChunkRef, ChunkingInfo, TreeBuilder};
use vial_core::Digest;

use crate::seal::{chunk_and_store, SealError};
use crate::service::publish::commit_layout;
use crate::storage::{JobFile, Presence, StorageError};

use super::attempt::{published, Run};
use super::remote::{self, RemoteFile};
use super::spec::{Filter, SyncError, SyncSpec};

/// Files of a bucket or Hub repository copied at once: chunking is CPU-bound and the machine that
/// runs the registry serves requests too.
const PARALLEL_FILES: usize = 2;
/// Small files copied at once: each is a request to the source and a durable write or two here,
/// time spent waiting, not chunking (20,000 files of 3 KB took 390 s two at a time).
const PARALLEL_SMALL_FILES: usize = 32;
/// Files up to this size count as small.
const SMALL_FILE: u64 = 1 << 20;

/// A file finished by this or an earlier attempt.
#[derive(serde::Serialize, serde::Deserialize)]
struct FileEntry {
    size: u64,
    chunks: Vec<ChunkRef>,
}

/// Copies the files of a bucket or Hub repository, chunking each as `vial push` does, and seals
/// them into a version.
pub(super) async fn sync_files(
    run: &Run,
    spec: &SyncSpec,
    remote: &remote::Remote,
) -> Result<Digest, SyncError> {
    let filter = Filter::new(&spec.include, &spec.exclude).map_err(SyncError::Invalid)?;
    let earlier = run.progress().pinned.clone();
    let (pinned, listing) = remote.list(earlier.as_deref()).await?;
    if earlier.is_none() {
        run.progress().pinned = pinned;
    }
    let mut files: Vec<RemoteFile> = listing
        .into_iter()
        .filter(|f| filter.wants(&f.path))
        .collect();
    files.sort_by(|a, b| a.path.cmp(&b.path));
    if files.is_empty() {
        return Err(SyncError::Invalid(format!(
            "{} holds no file to copy{}",
            spec.source,
            if spec.include.is_empty() && spec.exclude.is_empty() {
                ""
            } else {
                " that the filters let through"
            }
        )));
    }
    for f in &files {
        validate_path(&f.path).map_err(|e| {
            SyncError::Invalid(format!(
                "{}: {:?} cannot be a path in a volume: {e}",
                spec.source, f.path
            ))
        })?;
    }

    // What earlier attempts finished, if the file is still the same and its chunks still here.
    let mut finished: HashMap<String, JobFile> = run
        .service
        .job_rows()
        .job_files(&run.job.id)
        .await?
        .into_iter()
        .map(|f| (f.path.clone(), f))
        .collect();
    let mut done: HashMap<String, Vec<ChunkRef>> = HashMap::new();
    for f in &files {
        let Some(prior) = finished.remove(&f.path) else {
            continue;
        };
        let Ok(entry) = serde_json::from_str::<FileEntry>(&prior.entry) else {
            continue;
        };
        if prior.version != f.version || entry.size != f.size {
            continue;
        }
        if chunks_present(run, &entry.chunks).await? {
            done.insert(f.path.clone(), entry.chunks);
        }
    }
    {
        let mut p = run.progress();
        p.files_total = files.len() as u64;
        p.bytes_total = files.iter().map(|f| f.size).sum();
        p.files_done = done.len() as u64;
        p.bytes_done = files
            .iter()
            .filter(|f| done.contains_key(&f.path))
            .map(|f| f.size)
            .sum();
    }
    run.save_progress().await?;
    tracing::info!(
        job = %run.job.id,
        source = %spec.source,
        files = files.len(),
        bytes = run.progress().bytes_total,
        resumed_files = done.len(),
        "sync: copying files"
    );

    let todo: Vec<&RemoteFile> = files
        .iter()
        .filter(|f| !done.contains_key(&f.path))
        .collect();
    // The futures are built up front: a stream of closures that borrow would not be `Send` for
    // every lifetime, which the job runner's task needs.
    let copies: Vec<_> = todo
        .into_iter()
        .map(|f| {
            (f.size <= SMALL_FILE, async move {
                let reader = remote.open(f).await?;
                // A read that fails midway is most often the network: worth another attempt, which
                // keeps what this one finished.
                let chunks = chunk_and_store(&run.service, run.repo(), &f.path, f.size, reader)
                    .await
                    .map_err(|e| match e {
                        SealError::Content { message, .. } => SyncError::source(
                            format!("reading {} from {}: {message}", f.path, spec.source),
                            true,
                        ),
                        other => other.into(),
                    })?;
                {
                    let mut p = run.progress();
                    p.files_done += 1;
                    p.bytes_done += f.size;
                    p.bytes_read += f.size;
                }
                let entry = FileEntry {
                    size: f.size,
                    chunks,
                };
                run.save_file(&JobFile {
                    path: f.path.clone(),
                    version: f.version.clone(),
                    entry: serde_json::to_string(&entry).unwrap_or_default(),
                })
                .await?;
                Ok::<_, SyncError>((f, entry.chunks))
            })
        })
        .collect();
    let (small, large): (Vec<_>, Vec<_>) = copies.into_iter().partition(|(small, _)| *small);
    let small: Vec<_> = small.into_iter().map(|(_, copy)| copy).collect();
    let large: Vec<_> = large.into_iter().map(|(_, copy)| copy).collect();
    // Both at once: a small file the source is slow to send must not hold up the large ones.
    let mut copies = futures_util::stream::select(
        futures_util::stream::iter(small).buffer_unordered(PARALLEL_SMALL_FILES),
        futures_util::stream::iter(large).buffer_unordered(PARALLEL_FILES),
    );
    while let Some((f, chunks)) = copies.try_next().await? {
        done.insert(f.path.clone(), chunks);
    }
    drop(copies);

    let mut builder = TreeBuilder::new(ChunkingInfo::v1(DEFAULT_PARAMS));
    for f in &files {
        let chunks = done.remove(&f.path).unwrap_or_default();
        builder
            .add_file(&f.path, 0o644, chunks)
            .map_err(|e| SyncError::Invalid(format!("{}: {e}", f.path)))?;
    }
    let tree = builder
        .finish()
        .map_err(|e| SyncError::Invalid(format!("{}: {e}", spec.source)))?;
    let layout = build_layout_for(&tree, None);
    // A cancel (or a takeover) that came in meanwhile stops the job before it publishes.
    run.save_progress().await?;
    let digest = layout.index.digest.clone();
    published(
        commit_layout(&run.service, run.repo(), &layout, &run.publish).await,
        &digest,
    )?;
    Ok(digest)
}

/// Whether every chunk is still in the registry (and linked to the job's repository).
async fn chunks_present(run: &Run, chunks: &[ChunkRef]) -> Result<bool, StorageError> {
    let mut digests: Vec<Digest> = chunks.iter().map(|c| c.digest.clone()).collect();
    digests.sort();
    digests.dedup();
    for batch in digests.chunks(4096) {
        let present = run
            .service
            .blob_rows()
            .link_present_blobs(run.repo(), batch, Presence::LinkAcross)
            .await?;
        if present.len() != batch.len() {
            return Ok(false);
        }
    }
    Ok(true)
}
