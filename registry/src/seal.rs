//! Sealing: turning a file artifact that another tool pushed (ORAS files or a tarred directory,
//! CNCF ModelPack, Docker model artifacts) into a vial volume attached to it as a referrer.
//!
//! The registry reads each layer once, cuts every file with the same chunker as `vial push`
//! ([`vial_core::chunker`]), and commits a volume whose index names the artifact as its `subject`.
//! The artifact itself is untouched, so its digest and signatures stay valid.
//!
//! Where a file's bytes sit uncompressed in a stored blob (a file layer, or a file inside a plain
//! tar layer), its chunks are not copied: each is recorded as a byte range of that blob
//! ([`RangeChunk`]) and served from it. Files inside compressed layers are stored chunk by chunk.
//! Either way every chunk digest is computed here from the bytes themselves, so a mount verifies
//! each chunk it reads exactly as it does for a volume `vial push` wrote.

use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::io::{StreamReader, SyncIoBridge};
use vial_core::chunker::{self, is_safetensors_name, Sequential, SequentialError, Window};
use vial_core::chunking::{Cutter, DEFAULT_PARAMS};
use vial_core::manifest::{Descriptor, ImageManifest};
use vial_core::volume::{build_layout_for, ChunkRef, ChunkingInfo, TreeBuilder};
use vial_core::{media, Digest, RepoName, Target};
use vial_oras_compat::{recognize, safe_path, Packing};

use crate::service::blocking::abandonable;
use crate::service::publish::{commit_layout, Publish};
use crate::service::Service;
use crate::storage::{Presence, RangeChunk, Source, StorageError};

/// The job kind under which seals run.
pub const SEAL_JOB: &str = "seal";

/// Chunks of compressed layers waiting to be stored: bounds the memory a seal holds.
const STORE_QUEUE: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum SealError {
    /// The artifact cannot become a volume; trying again will not help.
    #[error("{0}")]
    NotSealable(String),
    /// A layer's (or a source file's) content is not what it should be (a broken archive, a file
    /// that is not the size it claimed).
    #[error("{}{message}", .layer.as_ref().map(|l| format!("layer {l}: ")).unwrap_or_default())]
    Content {
        layer: Option<Digest>,
        message: String,
    },
    #[error("storage")]
    Storage(#[from] StorageError),
}

impl SealError {
    /// Whether a later attempt may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, SealError::Storage(_))
    }
}

/// What reading one layer produced. Recorded per layer blob, so the next seal of an artifact that
/// shares the blob does not read it again.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct LayerFiles {
    entries: Vec<SealedEntry>,
    ranges: Vec<RangeChunk>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum SealedEntry {
    File {
        path: String,
        mode: u32,
        chunks: Vec<ChunkRef>,
    },
    Dir {
        path: String,
    },
    Symlink {
        path: String,
        target: String,
    },
}

/// Seals the artifact `subject` of `repo` and returns the volume's digest.
pub async fn seal(
    service: &Arc<Service>,
    repo: &RepoName,
    subject: &Digest,
) -> Result<Digest, SealError> {
    let stored = service
        .manifests()
        .get_manifest(repo, &Target::Digest(subject.clone()))
        .await?
        .ok_or_else(|| {
            SealError::NotSealable(format!("{repo} has no manifest {subject} to seal"))
        })?;
    if stored.media_type != media::OCI_MANIFEST && stored.media_type != media::DOCKER_MANIFEST {
        return Err(SealError::NotSealable(format!(
            "{subject} is a {}, not an image manifest with file layers",
            stored.media_type
        )));
    }
    let manifest: ImageManifest = serde_json::from_slice(&stored.content)
        .map_err(|e| SealError::NotSealable(format!("manifest {subject} is not valid: {e}")))?;
    let artifact = recognize(&manifest).map_err(|e| {
        SealError::NotSealable(format!("{repo}@{subject} is not a file artifact: {e}"))
    })?;

    let started = std::time::Instant::now();
    let mut builder = TreeBuilder::new(ChunkingInfo::v1(DEFAULT_PARAMS));
    let mut dirs = HashSet::new();
    let mut ranges = Vec::new();
    for layer in &artifact.layers {
        let files =
            read_layer(service, repo, &layer.descriptor, &layer.path, layer.packing).await?;
        ranges.extend(files.ranges);
        for entry in files.entries {
            let added = match entry {
                SealedEntry::File { path, mode, chunks } => builder.add_file(&path, mode, chunks),
                SealedEntry::Symlink { path, target } => builder.add_symlink(&path, &target),
                // Several archives may each carry the directories they share.
                SealedEntry::Dir { path } if dirs.insert(path.clone()) => builder.add_dir(&path),
                SealedEntry::Dir { .. } => Ok(()),
            };
            added.map_err(|e| SealError::NotSealable(format!("{repo}@{subject}: {e}")))?;
        }
    }
    let tree = builder
        .finish()
        .map_err(|e| SealError::NotSealable(format!("{repo}@{subject}: {e}")))?;

    let subject_descriptor = Descriptor {
        media_type: stored.media_type.clone(),
        digest: subject.clone(),
        size: stored.content.len() as u64,
        urls: None,
        annotations: None,
        artifact_type: manifest.artifact_type.clone(),
        data: None,
        platform: None,
    };
    let layout = build_layout_for(&tree, Some(subject_descriptor));

    // Range chunks first: the volume's manifests name them.
    service
        .blob_rows()
        .commit_range_chunks(repo, &ranges)
        .await?;
    commit_layout(service, repo, &layout, &Publish::default())
        .await
        .map_err(|e| match e {
            crate::storage::CommitManifestError::Storage(s) => SealError::Storage(s),
            other => SealError::NotSealable(format!("committing the sealed volume: {other}")),
        })?;
    tracing::info!(
        %repo,
        %subject,
        volume = %layout.index.digest,
        files = tree.file_count(),
        bytes = tree.total_bytes(),
        chunks = tree.chunks.len(),
        ranged_chunks = ranges.len(),
        seconds = started.elapsed().as_secs_f64(),
        "sealed artifact into a volume"
    );
    Ok(layout.index.digest.clone())
}

/// Stores the chunks [`LayerReader`] sends, linking each to `repo`.
async fn store_chunks(
    service: Arc<Service>,
    repo: RepoName,
    mut rx: mpsc::Receiver<(ChunkRef, Bytes)>,
) -> Result<(), StorageError> {
    while let Some((chunk, bytes)) = rx.recv().await {
        let known = service
            .blob_rows()
            .link_present_blobs(
                &repo,
                std::slice::from_ref(&chunk.digest),
                Presence::LinkAcross,
            )
            .await?;
        if known.is_empty() {
            service.ensure_blob(&repo, &chunk.digest, bytes).await?;
        }
    }
    Ok(())
}

/// Chunks one file read from `reader` (`size` bytes, named `path` for the chunker's
/// safetensors rule) and stores its chunks in `repo`, on a blocking thread.
pub(crate) async fn chunk_and_store(
    service: &Arc<Service>,
    repo: &RepoName,
    path: &str,
    size: u64,
    reader: impl tokio::io::AsyncRead + Send + Unpin + 'static,
) -> Result<Vec<ChunkRef>, SealError> {
    let (tx, rx) = mpsc::channel::<(ChunkRef, Bytes)>(STORE_QUEUE);
    let storer = store_chunks(Arc::clone(service), repo.clone(), rx);
    let name = path.to_owned();
    // Stops the blocking read if this future is dropped (a shutdown hands the job back).
    let (reader, _abandon) = abandonable(&service.jobs.readers, SyncIoBridge::new(reader));
    let reader = tokio::task::spawn_blocking(move || {
        let mut r = LayerReader {
            cutter: Cutter::new(DEFAULT_PARAMS),
            window: None,
            base: Source::Blob(
                Digest::parse(media::OCI_EMPTY_DIGEST).map_err(std::io::Error::other)?,
            ),
            base_offset: 0,
            store: Some(tx),
            out: LayerFiles::default(),
        };
        r.file(&name, 0o644, size, 0, reader)?;
        match r.out.entries.pop() {
            Some(SealedEntry::File { chunks, .. }) => Ok(chunks),
            _ => Err(std::io::Error::other("the chunker produced no file")),
        }
    });
    let (read, stored) = tokio::join!(reader, storer);
    stored?;
    read.map_err(|e| SealError::NotSealable(format!("reading {path}: {e}")))?
        .map_err(|e| SealError::Content {
            layer: None,
            message: format!("{path}: {e}"),
        })
}

/// Reads one layer into files, on a blocking thread, storing the chunks of compressed layers as
/// they are cut.
async fn read_layer(
    service: &Arc<Service>,
    repo: &RepoName,
    layer: &Descriptor,
    path: &str,
    packing: Packing,
) -> Result<LayerFiles, SealError> {
    let digest = layer.digest.clone();
    let location = service
        .blob_rows()
        .blob_location(repo, &digest)
        .await?
        .ok_or_else(|| SealError::NotSealable(format!("layer {digest} is not in {repo}")))?;
    // Ranges are recorded against the blob that really holds the bytes.
    let (base, base_offset) = location
        .source
        .clone()
        .unwrap_or_else(|| (Source::Blob(digest.clone()), 0));
    let size = location.size;
    // How the blob is read decides what it yields: its packing, the chunker, and for a file layer
    // whether its name makes it a safetensors file.
    let chunking = ChunkingInfo::v1(DEFAULT_PARAMS);
    let reading = format!(
        "{packing:?}/{}-{}-{}-{}{}",
        chunking.algorithm,
        chunking.min,
        chunking.avg,
        chunking.max,
        if packing == Packing::Raw && is_safetensors_name(path) {
            "/safetensors"
        } else {
            ""
        }
    );
    if let Some(files) = reuse_layer(service, repo, &digest, &reading, path, packing).await? {
        service.metrics.record_seal_layer(true, size);
        return Ok(files);
    }
    service.metrics.record_seal_layer(false, size);
    let stream = service
        .read_blob(repo, &digest, &location, None)
        .await?
        .ok_or_else(|| {
            StorageError::Corrupt(format!(
                "layer {digest} is linked but its bytes are missing"
            ))
        })?;

    let (tx, rx) = mpsc::channel::<(ChunkRef, Bytes)>(STORE_QUEUE);
    let storer = store_chunks(Arc::clone(service), repo.clone(), rx);
    let path = path.to_owned();
    let layer_digest = digest.clone();
    // Stops the blocking read if this future is dropped (a shutdown hands the job back).
    let (reader, _abandon) = abandonable(
        &service.jobs.readers,
        SyncIoBridge::new(StreamReader::new(stream)),
    );
    let reader = tokio::task::spawn_blocking(move || {
        let mut r = LayerReader {
            cutter: Cutter::new(DEFAULT_PARAMS),
            window: None,
            base,
            base_offset,
            store: (packing != Packing::Raw && packing != Packing::Tar).then_some(tx),
            out: LayerFiles::default(),
        };
        let result = match packing {
            Packing::Raw => r.file(&path, 0o644, size, 0, reader),
            Packing::Tar => r.archive(reader),
            Packing::TarGzip => r.archive(flate2::read::GzDecoder::new(reader)),
            Packing::TarZstd => match ruzstd::decoding::StreamingDecoder::new(reader) {
                Ok(d) => r.archive(d),
                Err(e) => Err(std::io::Error::other(e.to_string())),
            },
        };
        result.map(|()| r.out)
    });
    let (read, stored) = tokio::join!(reader, storer);
    stored?;
    let files = read
        .map_err(|e| SealError::NotSealable(format!("reading layer {layer_digest}: {e}")))?
        .map_err(|e| SealError::Content {
            layer: Some(layer_digest.clone()),
            message: e.to_string(),
        })?;
    match serde_json::to_string(&files) {
        Ok(json) => {
            service
                .seal_cache()
                .record_sealed_layer(&layer_digest, &reading, &json)
                .await?
        }
        Err(e) => {
            tracing::warn!(layer = %layer_digest, error = %e, "could not record a sealed layer")
        }
    }
    Ok(files)
}

/// What an earlier seal read from this layer blob, if it is usable here: a file layer takes this
/// artifact's path for it, and chunks stored on their own must all still be in the registry.
async fn reuse_layer(
    service: &Arc<Service>,
    repo: &RepoName,
    layer: &Digest,
    reading: &str,
    path: &str,
    packing: Packing,
) -> Result<Option<LayerFiles>, SealError> {
    let Some(json) = service.seal_cache().sealed_layer(layer, reading).await? else {
        return Ok(None);
    };
    let Ok(mut files) = serde_json::from_str::<LayerFiles>(&json) else {
        tracing::warn!(%layer, "unreadable sealed-layer record; reading the layer again");
        return Ok(None);
    };
    if packing == Packing::Raw {
        for entry in &mut files.entries {
            if let SealedEntry::File { path: p, .. } = entry {
                path.clone_into(p);
            }
        }
    }
    if packing != Packing::Raw && packing != Packing::Tar {
        let mut stored: Vec<Digest> = files
            .entries
            .iter()
            .filter_map(|e| match e {
                SealedEntry::File { chunks, .. } => Some(chunks.iter().map(|c| c.digest.clone())),
                _ => None,
            })
            .flatten()
            .collect();
        stored.sort();
        stored.dedup();
        for batch in stored.chunks(4096) {
            let present = service
                .blob_rows()
                .link_present_blobs(repo, batch, Presence::LinkAcross)
                .await?;
            if present.len() != batch.len() {
                return Ok(None);
            }
        }
    }
    tracing::debug!(%layer, "layer sealed before; reusing what was read from it");
    Ok(Some(files))
}

/// The blocking half of reading a layer.
struct LayerReader {
    cutter: Cutter,
    window: Option<Window>,
    /// The blob holding the layer's bytes, and where they start in it.
    base: Source,
    base_offset: u64,
    /// Where chunks go to be stored; `None` when they are recorded as ranges of `base`.
    store: Option<mpsc::Sender<(ChunkRef, Bytes)>>,
    out: LayerFiles,
}

impl LayerReader {
    /// Chunks one file of `size` bytes whose first byte is at `offset` in the layer.
    fn file(
        &mut self,
        path: &str,
        mode: u32,
        size: u64,
        offset: u64,
        reader: impl Read,
    ) -> std::io::Result<()> {
        let window = self
            .window
            .get_or_insert_with(|| Window::for_cutter(&self.cutter));
        let mut source = Sequential::new(reader);
        let store = self.store.clone();
        let chunks = chunker::chunk_file(
            path,
            &mut source,
            size,
            &self.cutter,
            window,
            &mut |chunk, bytes| {
                if let Some(store) = &store {
                    let r = ChunkRef {
                        digest: chunk.digest.clone(),
                        size: chunk.len,
                    };
                    store
                        .blocking_send((r, Bytes::copy_from_slice(bytes)))
                        .map_err(|_| {
                            SequentialError::Io(std::io::Error::other("storing chunks failed"))
                        })?;
                }
                Ok(())
            },
        )
        .map_err(|e| match e {
            SequentialError::Io(e) => e,
            other => std::io::Error::other(other.to_string()),
        })?;
        // The file must end where its size says: a longer one would be silently cut short.
        let mut probe = [0u8; 1];
        if source.into_inner().read(&mut probe)? != 0 {
            return Err(std::io::Error::other(format!(
                "{path} holds more than its {size} bytes"
            )));
        }
        if self.store.is_none() {
            self.out.ranges.extend(chunks.iter().map(|c| RangeChunk {
                digest: c.digest.clone(),
                size: c.len,
                source: self.base.clone(),
                offset: self.base_offset + offset + c.offset,
            }));
        }
        self.out.entries.push(SealedEntry::File {
            path: path.to_owned(),
            mode,
            chunks: chunks
                .into_iter()
                .map(|c| ChunkRef {
                    digest: c.digest,
                    size: c.len,
                })
                .collect(),
        });
        Ok(())
    }

    /// Reads a tar archive's entries. Paths are checked as strictly as the tree checks them: one
    /// that is absolute or climbs out with `..` fails the whole seal.
    fn archive(&mut self, reader: impl Read) -> std::io::Result<()> {
        let mut archive = tar::Archive::new(reader);
        let mut files: HashMap<String, (u32, Vec<ChunkRef>)> = HashMap::new();
        for entry in archive.entries()? {
            let mut entry = entry?;
            let raw = entry.path()?.to_string_lossy().into_owned();
            let Some(path) = safe_path(&raw) else {
                if raw.trim_start_matches("./").trim_matches('/').is_empty() || raw == "." {
                    continue; // the archive's root directory
                }
                return Err(std::io::Error::other(format!(
                    "archive entry {raw:?} is absolute or leaves the volume"
                )));
            };
            let header = entry.header();
            let mode = header.mode().unwrap_or(0o644);
            match header.entry_type() {
                tar::EntryType::Regular | tar::EntryType::Continuous => {
                    let size = entry.size();
                    let offset = entry.raw_file_position();
                    self.file(&path, mode, size, offset, &mut entry)?;
                    if let Some(SealedEntry::File { chunks, .. }) = self.out.entries.last() {
                        files.insert(path, (mode, chunks.clone()));
                    }
                }
                tar::EntryType::Directory => self.out.entries.push(SealedEntry::Dir { path }),
                tar::EntryType::Symlink => {
                    let target = entry
                        .link_name()?
                        .map(|t| t.to_string_lossy().into_owned())
                        .unwrap_or_default();
                    self.out.entries.push(SealedEntry::Symlink { path, target });
                }
                tar::EntryType::Link => {
                    // A hard link: the same bytes under a second name.
                    let target = entry
                        .link_name()?
                        .map(|t| t.to_string_lossy().into_owned())
                        .and_then(|t| safe_path(&t))
                        .and_then(|t| files.get(&t).cloned());
                    let Some((mode, chunks)) = target else {
                        return Err(std::io::Error::other(format!(
                            "hard link {path:?} names a file that is not earlier in the archive"
                        )));
                    };
                    self.out
                        .entries
                        .push(SealedEntry::File { path, mode, chunks });
                }
                other => {
                    tracing::warn!(path, kind = ?other, "skipping an archive entry that is not a file, directory or link");
                }
            }
        }
        Ok(())
    }
}
