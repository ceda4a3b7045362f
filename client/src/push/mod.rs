//! `vial push`: chunk a directory in parallel, upload only the chunks the registry lacks, seal.
//!
//! Four stages, the middle two at once: [`Plan::scan`] reads the directory and the local index
//! (here); hashing threads read and chunk file segments (`hash.rs`); a collector batches new chunk
//! digests, asks the registry which it already holds (one request per 4096 digests with vial's
//! extension, HEADs elsewhere) and starts uploads of the missing ones, bounded in number and in
//! bytes held in memory (`upload.rs`); then [`Plan::finish`] builds the tree and [`seal`] publishes
//! it. Nothing is published until every chunk is in: the version is sealed by pushing its index
//! last, so an interrupted push publishes nothing and the next push finds the chunks already
//! uploaded.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use futures_util::StreamExt;
use tokio::sync::mpsc;
use vial_core::chunking::{Cutter, DEFAULT_PARAMS};
use vial_core::volume::{build_layout, ChunkRef, ChunkingInfo, Layout, Tree, TreeBuilder};
use vial_core::{media, Digest, RepoName};

use crate::chunker::{self, FileChunk, ReadBuffers};
use crate::progress::{Event, Progress};
use crate::scan::{self, LocalIndex, Scanned};
use crate::{ClientError, Registry};

mod hash;
mod upload;
mod work;

use hash::hash_all;
use upload::Uploads;
use work::{FileJob, Hashed, Stats};

#[derive(Debug, Clone)]
pub struct PushOptions {
    /// Threads that read and hash files.
    pub hash_threads: usize,
    /// Chunk uploads in flight at once.
    pub uploads: usize,
    /// Bytes of chunk data held for uploads at once.
    pub max_in_flight: u64,
    /// Read every file even if the local index says it is unchanged.
    pub rehash: bool,
    /// Where the local index lives; `None` disables it.
    pub index_path: Option<PathBuf>,
    /// Seal the version under this tag, in the same request (the index is sent once).
    pub seal_tag: Option<SealTag>,
}

/// The tag a version is sealed under, and the compare-and-swap condition for moving it (as in
/// [`tag_version`]).
#[derive(Debug, Clone)]
pub struct SealTag {
    pub tag: vial_core::Tag,
    pub expect: Option<Option<Digest>>,
}

impl PushOptions {
    pub fn for_dir(dir: &Path) -> Self {
        PushOptions {
            hash_threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
            uploads: 16,
            max_in_flight: 256 * 1024 * 1024,
            rehash: false,
            index_path: LocalIndex::path_for(dir),
            seal_tag: None,
        }
    }
}

/// What a push did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PushReport {
    pub digest: String,
    pub files: u64,
    pub bytes: u64,
    pub chunks: u64,
    pub chunks_uploaded: u64,
    pub bytes_uploaded: u64,
    pub chunks_reused: u64,
    pub bytes_reused: u64,
    pub files_unchanged: u64,
    pub bytes_read: u64,
    pub seconds: f64,
}

/// Read buffers for the hashers: as many as the bytes a push may hold allow, but enough for the
/// hashers never to wait on each other (each holds two at most; a pack waiting to fill pins a
/// few).
fn read_buffers(max_in_flight: u64, cutter: &Cutter) -> usize {
    let one = chunker::ReadBuffers::capacity_bytes(1, cutter);
    ((max_in_flight / one) as usize).max(16)
}

/// What a push produced.
#[derive(Debug)]
pub struct Pushed {
    /// The sealed version: its index digest names it.
    pub layout: Layout,
    pub report: PushReport,
    /// What became of `options.seal_tag`: a tag the registry refused (moved meanwhile, protected)
    /// leaves the version sealed by digest and is reported here, not as a failed push. Other
    /// tags: see [`tag_version`].
    pub tag: Result<(), ClientError>,
}

/// Pushes `dir` as a new version of `repo`, in four stages: [`Plan::scan`] the directory,
/// hash its files on threads ([`hash_all`]), check and upload what the registry lacks as the
/// chunks arrive ([`Uploads`]), then build the tree ([`Plan::finish`]) and [`seal`] it.
pub async fn push(
    registry: &Registry,
    repo: &RepoName,
    dir: &Path,
    options: &PushOptions,
    progress: Arc<dyn Progress>,
) -> Result<Pushed, ClientError> {
    let started = Instant::now();
    let cutter = Cutter::new(DEFAULT_PARAMS);
    let (plan, files) = Plan::scan(dir, options).await?;
    let total_bytes: u64 = files.iter().map(|f| f.stamp.size).sum();
    progress.event(Event::Scanned {
        files: files.len() as u64,
        bytes: total_bytes,
    });
    let files = Arc::new(files);

    let buffers = ReadBuffers::new(&cutter, read_buffers(options.max_in_flight, &cutter));
    let starved = buffers.starved();
    let (tx, rx) = mpsc::channel::<Hashed>(1024);
    let stats = Arc::new(Stats::default());
    let hashing = {
        let files = Arc::clone(&files);
        let progress = Arc::clone(&progress);
        let stats = Arc::clone(&stats);
        let threads = options.hash_threads.max(1);
        tokio::task::spawn_blocking(move || {
            hash_all(&files, &cutter, threads, &buffers, &tx, &*progress, &stats)
        })
    };
    let mut uploads = Uploads::new(
        registry,
        repo,
        &files,
        options.uploads,
        options.max_in_flight,
        &progress,
        &stats,
    );
    uploads.collect(rx, &starved).await?;
    hashing.await.map_err(ClientError::task("hashing"))??;
    let per_file = uploads.finish().await?;

    let tree = plan.finish(&files, per_file, options)?;
    let layout = build_layout(&tree);
    let tag = seal(registry, repo, &layout, options.seal_tag.as_ref()).await?;
    let report = PushReport {
        digest: layout.index.digest.to_string(),
        files: files.len() as u64,
        bytes: tree.total_bytes(),
        chunks: tree.chunks.len() as u64,
        chunks_uploaded: stats.uploaded.load(Ordering::Relaxed),
        bytes_uploaded: stats.bytes_uploaded.load(Ordering::Relaxed),
        chunks_reused: stats.reused.load(Ordering::Relaxed),
        bytes_reused: stats.bytes_reused.load(Ordering::Relaxed),
        files_unchanged: files.iter().filter(|f| f.cached.is_some()).count() as u64,
        bytes_read: stats.bytes_read.load(Ordering::Relaxed),
        seconds: started.elapsed().as_secs_f64(),
    };
    Ok(Pushed {
        layout,
        report,
        tag,
    })
}

/// The first stage: what the directory holds. Directories and symlinks go into the tree at once;
/// files wait for their chunks, those the local index vouches for with them already.
struct Plan {
    builder: TreeBuilder,
    index: LocalIndex,
}

impl Plan {
    async fn scan(dir: &Path, options: &PushOptions) -> Result<(Plan, Vec<FileJob>), ClientError> {
        let chunking = ChunkingInfo::v1(DEFAULT_PARAMS);
        let root = dir.to_path_buf();
        let entries = tokio::task::spawn_blocking(move || scan::scan(&root))
            .await
            .map_err(ClientError::task("scan"))??;
        let index = options
            .index_path
            .as_ref()
            .map(|p| LocalIndex::load(p, &chunking.algorithm))
            .unwrap_or_default();
        let mut builder = TreeBuilder::new(chunking);
        let mut files: Vec<FileJob> = Vec::new();
        for (path, scanned) in &entries {
            match scanned {
                Scanned::Dir => builder.add_dir(path)?,
                Scanned::Symlink { target } => builder.add_symlink(path, target)?,
                Scanned::File { abs, mode, stamp } => files.push(FileJob {
                    path: path.clone(),
                    abs: Arc::new(abs.clone()),
                    mode: *mode,
                    stamp: stamp.clone(),
                    cached: if options.rehash {
                        None
                    } else {
                        index.lookup(path, stamp).map(<[_]>::to_vec)
                    },
                }),
            }
        }
        Ok((Plan { builder, index }, files))
    }

    /// The last stage before the seal, once every chunk is in the registry: the tree, from the
    /// chunks each file was cut into (`per_file`, by segment), remembered in the local index.
    fn finish(
        mut self,
        files: &[FileJob],
        per_file: Vec<Vec<Vec<FileChunk>>>,
        options: &PushOptions,
    ) -> Result<Tree, ClientError> {
        for (f, segments) in files.iter().zip(per_file) {
            let chunks: Vec<ChunkRef> = match &f.cached {
                Some(c) => c.clone(),
                None => segments
                    .into_iter()
                    .flatten()
                    .map(|c| ChunkRef {
                        digest: c.digest,
                        size: c.len,
                    })
                    .collect(),
            };
            self.index
                .insert(f.path.clone(), f.stamp.clone(), chunks.clone());
            self.builder.add_file(&f.path, f.mode, chunks)?;
        }
        let tree = self.builder.finish()?;
        if let Some(path) = &options.index_path {
            let keep: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
            self.index.retain(|p| keep.contains(p));
            self.index.save(path);
        }
        Ok(tree)
    }
}

/// Uploads the tree blob and manifests, index last: the index push is the moment of sealing. With
/// `tag`, the index is pushed under the tag, which seals the version and moves the tag in one
/// request; if the registry refuses the tag, the index is pushed by digest instead and the refusal
/// is returned as the tag's outcome.
async fn seal(
    registry: &Registry,
    repo: &RepoName,
    layout: &Layout,
    tag: Option<&SealTag>,
) -> Result<Result<(), ClientError>, ClientError> {
    // The empty descriptor's blob (media::OCI_EMPTY_DIGEST names it).
    let empty = vial_core::Algorithm::Sha256.digest_bytes(b"{}");
    let mut blobs = vec![(&empty, Bytes::from_static(b"{}"))];
    blobs.extend(
        layout
            .blobs()
            .map(|b| (&b.digest, Bytes::from(b.bytes.clone()))),
    );
    let digests: Vec<Digest> = blobs.iter().map(|(d, _)| (*d).clone()).collect();
    let present = registry.present_blobs(repo, &digests).await?;
    for (digest, bytes) in blobs {
        if !present.contains(digest) {
            registry.push_blob(repo, digest, bytes).await?;
        }
    }
    let parts = futures_util::stream::iter(layout.parts.iter())
        .map(|part| async move {
            if !registry.manifest_exists(repo, &part.digest).await? {
                registry
                    .put_manifest(
                        repo,
                        part.digest.as_str(),
                        media::OCI_MANIFEST,
                        Bytes::from(part.bytes.clone()),
                        None,
                    )
                    .await?;
            }
            Ok::<_, ClientError>(())
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    for p in parts {
        p?;
    }
    for manifest in std::iter::once(&layout.tree_manifest).chain(&layout.images) {
        registry
            .put_manifest(
                repo,
                manifest.digest.as_str(),
                media::OCI_MANIFEST,
                Bytes::from(manifest.bytes.clone()),
                None,
            )
            .await?;
    }
    let index = Bytes::from(layout.index.bytes.clone());
    let tagged = match tag {
        None => Ok(()),
        Some(t) => {
            let expect = t.expect.as_ref().map(Option::as_ref);
            let pushed = put_tagged(
                registry,
                repo,
                media::OCI_INDEX,
                index.clone(),
                &t.tag,
                expect,
                None,
            );
            match pushed.await {
                Ok(()) => return Ok(Ok(())),
                Err(e) if is_refusal(&e) => Err(e),
                Err(e) => return Err(e),
            }
        }
    };
    registry
        .put_manifest(
            repo,
            layout.index.digest.as_str(),
            media::OCI_INDEX,
            index,
            None,
        )
        .await?;
    Ok(tagged)
}

/// Whether the registry answered a tag push with a refusal of the tag itself (so the manifest
/// can still be pushed by digest), rather than failing the request.
fn is_refusal(e: &ClientError) -> bool {
    match e {
        ClientError::TagMoved { .. } | ClientError::Denied(_) => true,
        ClientError::Registry { status, .. } => matches!(status, 400 | 403 | 409 | 412),
        _ => false,
    }
}

/// Pushes a version's manifest bytes under `tag`, naming the tag in a compare-and-swap failure.
async fn put_tagged(
    registry: &Registry,
    repo: &RepoName,
    media_type: &str,
    bytes: Bytes,
    tag: &vial_core::Tag,
    expect: Option<Option<&Digest>>,
    expires_at: Option<&str>,
) -> Result<(), ClientError> {
    registry
        .put_manifest_expiring(repo, tag.as_str(), media_type, bytes, expect, expires_at)
        .await
        .map_err(|e| match e {
            ClientError::TagMoved {
                current, expected, ..
            } => ClientError::TagMoved {
                tag: tag.to_string(),
                current,
                expected,
            },
            e => e,
        })?;
    Ok(())
}

/// Points `tag` at an existing version by pushing its index bytes under the tag, optionally only if
/// the tag currently points at `expect` (`Some(None)`: only if the tag does not exist).
pub async fn tag_version(
    registry: &Registry,
    repo: &RepoName,
    version: &Digest,
    tag: &vial_core::Tag,
    expect: Option<Option<&Digest>>,
    expires_at: Option<&str>,
) -> Result<(), ClientError> {
    let manifest = registry
        .get_manifest(repo, &vial_core::Target::Digest(version.clone()))
        .await?
        .ok_or_else(|| ClientError::NotFound(format!("{}/{repo}@{version}", registry.host())))?;
    put_tagged(
        registry,
        repo,
        &manifest.media_type,
        manifest.bytes,
        tag,
        expect,
        expires_at,
    )
    .await
}
