//! What the UI reads from storage: a version's tree (index, part manifests and tree blob, as a
//! mount reads them, but from the stores directly), and byte ranges of a version's files.

use futures_util::StreamExt;
use vial_core::safetensors::{self, TensorSpan};
use vial_core::volume::{
    chunks_from_part, tree_from_manifest, Tree, VolumeIndex, ANNOTATION_BYTES, ANNOTATION_CHUNKS,
    ANNOTATION_FILES,
};
use vial_core::{Digest, RepoName, Target};

use crate::error::{ApiError, ErrorCode};
use crate::service::Service;
use crate::storage::StoredManifest;

/// The largest file header the UI reads into memory (trees: `ui_max_tree`).
const MAX_READ: u64 = 64 << 20;

/// A manifest as the UI shows it: a sealed volume with its tree, a volume whose tree is larger
/// than the UI reads (`ui_max_tree`: what its index says of it), or any other manifest.
pub(super) enum Opened {
    Volume { tree: Box<Tree> },
    Large(LargeVolume),
    Other(StoredManifest),
}

/// A volume whose tree blob is larger than the UI reads into memory: what its index says.
pub(super) struct LargeVolume {
    pub tree_bytes: u64,
    pub files: Option<u64>,
    pub bytes: Option<u64>,
    pub chunks: Option<u64>,
}

impl LargeVolume {
    fn new(index: &VolumeIndex, tree_bytes: u64) -> LargeVolume {
        let said = |key: &str| {
            index
                .index
                .annotations
                .as_ref()
                .and_then(|a| a.get(key))
                .and_then(|v| v.parse().ok())
        };
        LargeVolume {
            tree_bytes,
            files: said(ANNOTATION_FILES),
            bytes: said(ANNOTATION_BYTES),
            chunks: said(ANNOTATION_CHUNKS),
        }
    }
}

fn not_found(what: String) -> ApiError {
    ApiError::not_found(ErrorCode::ManifestUnknown, what)
}

/// Reads a blob of `repo`, or a range of it, of at most `limit` bytes.
async fn read_blob(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
    range: Option<(u64, u64)>,
    limit: u64,
) -> Result<Vec<u8>, ApiError> {
    let location = state
        .blob_rows()
        .blob_location(repo, digest)
        .await?
        .ok_or_else(|| ApiError::blob_unknown(digest))?;
    let (start, end) = range.unwrap_or((0, location.size));
    if end.saturating_sub(start) > limit {
        return Err(ApiError::bad_request(
            ErrorCode::Unsupported,
            format!("{digest} is too large to show"),
        ));
    }
    let range = crate::storage::ByteRange { start, end };
    let mut stream = state
        .read_blob(repo, digest, &location, Some(range))
        .await?
        .ok_or_else(|| ApiError::blob_unknown(digest))?;
    let mut out = Vec::with_capacity((end - start) as usize);
    while let Some(frame) = stream.next().await {
        out.extend_from_slice(&frame.map_err(|e| ApiError::internal(e.to_string()))?);
    }
    Ok(out)
}

/// Opens the manifest `digest` of `repo`, and, if it is a volume, its tree.
pub(super) async fn open(
    state: &Service,
    repo: &RepoName,
    digest: &Digest,
) -> Result<Opened, ApiError> {
    let manifest = state
        .manifests()
        .get_manifest(repo, &Target::Digest(digest.clone()))
        .await?
        .ok_or_else(|| not_found(format!("{digest} is not in {repo}")))?;
    let Ok(index) = VolumeIndex::parse(&manifest.content) else {
        return Ok(Opened::Other(manifest));
    };
    let invalid = |e: String| ApiError::internal(format!("volume {digest} of {repo}: {e}"));
    let tree_digest = match &index.tree {
        Some(d) => d.clone(),
        None => {
            let tm = state
                .manifests()
                .get_manifest(repo, &Target::Digest(index.tree_manifest.digest.clone()))
                .await?
                .ok_or_else(|| invalid("the tree manifest is missing".into()))?;
            tree_from_manifest(&tm.content).map_err(|e| invalid(e.to_string()))?
        }
    };
    // A tree over the limit is not read, nor are the parts: the page says what the index says.
    let tree_bytes = state
        .blob_rows()
        .blob_location(repo, &tree_digest)
        .await?
        .ok_or_else(|| ApiError::blob_unknown(&tree_digest))?
        .size;
    if tree_bytes > state.config.ui_max_tree {
        return Ok(Opened::Large(LargeVolume::new(&index, tree_bytes)));
    }
    let mut chunks = Vec::new();
    for part in &index.parts {
        let m = state
            .manifests()
            .get_manifest(repo, &Target::Digest(part.digest.clone()))
            .await?
            .ok_or_else(|| invalid(format!("part {} is missing", part.digest)))?;
        chunks.extend(chunks_from_part(&m.content).map_err(|e| invalid(e.to_string()))?);
    }
    let bytes = read_blob(state, repo, &tree_digest, None, state.config.ui_max_tree).await?;
    let tree = Tree::from_parts(&bytes, chunks).map_err(|e| invalid(e.to_string()))?;
    Ok(Opened::Volume {
        tree: Box::new(tree),
    })
}

/// Bytes `[start, end)` of the file `path` of a version, read from its chunks.
async fn read_file_range(
    state: &Service,
    repo: &RepoName,
    tree: &Tree,
    path: &str,
    start: u64,
    end: u64,
) -> Result<Vec<u8>, ApiError> {
    let chunks = vial_core::volume::diff::file_chunks(tree, path).unwrap_or_default();
    let mut out = Vec::new();
    for (at, size, digest) in chunks {
        let (from, to) = (start.max(at), end.min(at + size));
        if from >= to {
            continue;
        }
        out.extend(read_blob(state, repo, digest, Some((from - at, to - at)), MAX_READ).await?);
    }
    Ok(out)
}

/// The tensors of a safetensors file of a version; `None` for a file that is not one.
pub(super) async fn tensors(
    state: &Service,
    repo: &RepoName,
    tree: &Tree,
    path: &str,
    size: u64,
) -> Result<Option<Vec<TensorSpan>>, ApiError> {
    if size < 8 {
        return Ok(None);
    }
    let first8 = read_file_range(state, repo, tree, path, 0, 8).await?;
    let Ok(n) = safetensors::header_len(&first8, size) else {
        return Ok(None);
    };
    if n > MAX_READ {
        return Ok(None);
    }
    let json = read_file_range(state, repo, tree, path, 8, 8 + n).await?;
    Ok(safetensors::parse_header(&json, size).ok())
}
