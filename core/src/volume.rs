//! The volume format: a deterministic tree of files over content-defined chunks, and its OCI layout.
//!
//! A sealed version is an OCI image index (the version's digest is this index's digest) whose entries
//! are one *tree manifest*, with the tree blob as its only layer, and *part manifests* whose layers
//! are the volume's chunks, a few thousand each, so no manifest nears the 4 MiB registry limit however
//! large the volume. docs/format.md is the normative description.

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use crate::chunking::ChunkParams;
use crate::manifest::{Descriptor, ImageIndex, ImageManifest};
use crate::{media, Algorithm, Digest};
use raw::{RawEntry, RawKind, Span};

/// The format this code writes.
pub const FORMAT_VERSION: u32 = 4;
/// The formats this code reads: format 2 differs only in how a file lists its chunks (one index
/// per chunk instead of runs), format 3 only in its image-shaped manifests' layer media type, so
/// their versions keep their digests and stay readable.
pub const READABLE_FORMATS: [u32; 3] = [2, 3, 4];
/// Most chunk references the files of one tree may make in total (a run of `n` chunks counts `n`):
/// about 32 TiB of 2 MiB chunks. It bounds what a reader expands a hostile tree blob into.
pub const MAX_CHUNK_REFS: usize = 1 << 24;
pub const VOLUME_ARTIFACT_TYPE: &str = "application/vnd.vial.volume.v1";
pub const TREE_ARTIFACT_TYPE: &str = "application/vnd.vial.tree.v1";
pub const TREE_MEDIA_TYPE: &str = "application/vnd.vial.tree.v1+json";
/// The media type of the tree blob as the layer of a volume's image-shaped manifests, from format
/// 4 on: a layer type to containerd (it begins `application/vnd.oci.image.layer.`, so containerd
/// 1.7 and later count it as a layer when unpacking and CRI passes it to the snapshotter), but no
/// compression or archive any differ knows, so a snapshotter that does not know volumes refuses it
/// before reading a byte. Formats 2 and 3 used [`TREE_MEDIA_TYPE`] there.
pub const IMAGE_LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.vial.tree.v1+json";

/// The media type of the tree layer in the image-shaped manifests of a `format` version.
pub fn image_layer_media_type(format: u32) -> &'static str {
    if format >= 4 {
        IMAGE_LAYER_MEDIA_TYPE
    } else {
        TREE_MEDIA_TYPE
    }
}

/// Whether an image-shaped manifest's layer of this media type is a volume's tree (any format).
pub fn is_tree_layer(media_type: &str) -> bool {
    media_type == IMAGE_LAYER_MEDIA_TYPE || media_type == TREE_MEDIA_TYPE
}
pub const CHUNKS_ARTIFACT_TYPE: &str = "application/vnd.vial.chunks.v1";
pub const CHUNK_MEDIA_TYPE: &str = "application/vnd.vial.chunk.v1";
/// The artifactType an index gives its image-shaped manifests: the volume as containerd sees it.
pub const IMAGE_ARTIFACT_TYPE: &str = "application/vnd.vial.image.v1";
/// The platforms a volume's image-shaped manifests are listed for (the files are the same).
pub const IMAGE_PLATFORMS: [&str; 2] = ["amd64", "arm64"];

pub const ANNOTATION_FORMAT: &str = "dev.vial.volume.format";
pub const ANNOTATION_FILES: &str = "dev.vial.volume.files";
pub const ANNOTATION_BYTES: &str = "dev.vial.volume.bytes";
pub const ANNOTATION_CHUNKS: &str = "dev.vial.volume.chunks";
pub const ANNOTATION_TREE: &str = "dev.vial.volume.tree";

/// A part manifest may end after this many chunks, at a content-defined point.
pub const PART_MIN: usize = 8;
/// A part manifest always ends after this many chunks (~250 kB of JSON).
pub const PART_MAX: usize = 2048;
/// Longest path accepted, in bytes.
pub const MAX_PATH: usize = 4096;

/// A chunk as the tree refers to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    pub digest: Digest,
    pub size: u64,
}

/// How the chunks were cut, recorded so a reader can tell which chunker wrote a volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkingInfo {
    pub algorithm: String,
    pub min: u64,
    pub avg: u64,
    pub max: u64,
}

impl ChunkingInfo {
    pub fn v1(params: ChunkParams) -> Self {
        ChunkingInfo {
            algorithm: "fastcdc2020+safetensors-v1".to_owned(),
            min: params.min as u64,
            avg: params.avg as u64,
            max: params.max as u64,
        }
    }
}

/// One entry of the tree. Files list their chunks as indexes into [`Tree::chunks`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryKind {
    File {
        mode: u32,
        size: u64,
        /// Written as runs (`[first, count]`, or a bare index for a run of one) by
        /// [`Tree::to_json`] (format 3); expanded here.
        chunks: Vec<u32>,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub path: String,
    pub kind: EntryKind,
}

/// The whole file tree of a version: what a mount needs before it can list a single directory.
///
/// The chunk table is not part of the tree blob: it is the concatenation of the part manifests'
/// layers, so a new version re-sends only the parts that changed, and the tree blob stays a few
/// dozen bytes per file whatever the file sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    pub format: u32,
    pub chunking: ChunkingInfo,
    /// Distinct chunks in order of first use; stored as the layers of the part manifests.
    pub chunks: Vec<ChunkRef>,
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TreeError {
    #[error("unsupported volume format {0}")]
    Format(u32),
    #[error("invalid path {path:?}: {reason}")]
    Path { path: String, reason: &'static str },
    #[error("path {0:?} appears twice")]
    Duplicate(String),
    #[error("entries are not in sorted order at {0:?}")]
    Order(String),
    #[error("parent directory of {0:?} is not in the tree")]
    MissingParent(String),
    #[error("file {path:?} has size {size} but its chunks add up to {sum}")]
    SizeMismatch { path: String, size: u64, sum: u64 },
    #[error("file {0:?} refers to a chunk that is not in the chunk table")]
    ChunkIndex(String),
    #[error("chunk {0} appears twice in the chunk table")]
    DuplicateChunk(Digest),
    #[error("symlink {0:?} has an empty or invalid target")]
    SymlinkTarget(String),
    #[error("tree blob is not valid JSON: {0}")]
    Json(String),
    #[error("file {0:?} lists its chunks as runs, which format 2 does not allow")]
    Runs(String),
    #[error("the files refer to more than {MAX_CHUNK_REFS} chunks in total")]
    TooManyChunkRefs,
}

/// The tree blob as it is parsed: files' chunk lists are still runs, expanded only once they are
/// known to stay within the chunk table and [`MAX_CHUNK_REFS`].
#[derive(Deserialize)]
struct RawTree {
    format: u32,
    chunking: ChunkingInfo,
    entries: Vec<RawEntry>,
}

/// The tree blob as it is written: [`Tree`]'s fields without the chunk table, each file's chunks
/// as runs (format 3) or one index per element (format 2).
#[derive(Serialize)]
struct TreeOut<'a> {
    format: u32,
    chunking: &'a ChunkingInfo,
    entries: Vec<EntryOut<'a>>,
}

#[derive(Serialize)]
struct EntryOut<'a> {
    path: &'a str,
    #[serde(flatten)]
    kind: KindOut<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum KindOut<'a> {
    File {
        mode: u32,
        size: u64,
        chunks: ChunkList<'a>,
    },
    Dir {
        mode: u32,
    },
    Symlink {
        target: &'a str,
    },
}

/// A file's chunk indexes, written as runs of consecutive indexes or one by one.
struct ChunkList<'a> {
    ids: &'a [u32],
    runs: bool,
}

impl Serialize for ChunkList<'_> {
    /// Runs: chunks are numbered in order of first use, so a file whose chunks appear nowhere
    /// earlier is one run whatever its size.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        if !self.runs {
            return self.ids.serialize(s);
        }
        let ids = self.ids;
        let mut seq = s.serialize_seq(None)?;
        let mut i = 0;
        while i < ids.len() {
            let first = ids[i];
            let mut count = 1;
            while i + count < ids.len() && ids[i + count] == first.wrapping_add(count as u32) {
                count += 1;
            }
            if count == 1 {
                seq.serialize_element(&first)?;
            } else {
                seq.serialize_element(&[first, count as u32])?;
            }
            i += count;
        }
        seq.end()
    }
}

/// Checks one path: relative, `/`-separated, no empty, `.` or `..` components, no NUL.
pub fn validate_path(path: &str) -> Result<(), TreeError> {
    let bad = |reason| {
        Err(TreeError::Path {
            path: path.to_owned(),
            reason,
        })
    };
    if path.is_empty() {
        return bad("empty");
    }
    if path.len() > MAX_PATH {
        return bad("too long");
    }
    if path.starts_with('/') {
        return bad("absolute");
    }
    if path.contains('\0') {
        return bad("contains NUL");
    }
    for component in path.split('/') {
        match component {
            "" => return bad("empty component"),
            "." | ".." => return bad("dot component"),
            c if c.len() > 255 => return bad("component longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

fn parent(path: &str) -> Option<&str> {
    path.rsplit_once('/').map(|(p, _)| p)
}

impl Tree {
    /// Checks every structural rule; readers call this on any tree they did not build themselves.
    pub fn validate(&self) -> Result<(), TreeError> {
        if !READABLE_FORMATS.contains(&self.format) {
            return Err(TreeError::Format(self.format));
        }
        let refs: usize = self
            .entries
            .iter()
            .map(|e| match &e.kind {
                EntryKind::File { chunks, .. } => chunks.len(),
                _ => 0,
            })
            .sum();
        if refs > MAX_CHUNK_REFS {
            return Err(TreeError::TooManyChunkRefs);
        }
        let mut seen_chunks = std::collections::HashSet::with_capacity(self.chunks.len());
        for c in &self.chunks {
            if !seen_chunks.insert(&c.digest) {
                return Err(TreeError::DuplicateChunk(c.digest.clone()));
            }
        }
        let mut dirs: std::collections::HashSet<&str> = std::collections::HashSet::new();
        let mut previous: Option<&str> = None;
        for e in &self.entries {
            validate_path(&e.path)?;
            if let Some(prev) = previous {
                match prev.as_bytes().cmp(e.path.as_bytes()) {
                    std::cmp::Ordering::Less => {}
                    std::cmp::Ordering::Equal => return Err(TreeError::Duplicate(e.path.clone())),
                    std::cmp::Ordering::Greater => return Err(TreeError::Order(e.path.clone())),
                }
            }
            previous = Some(&e.path);
            // Parents must be directories listed earlier: nothing can be written through a symlink.
            if let Some(p) = parent(&e.path) {
                if !dirs.contains(p) {
                    return Err(TreeError::MissingParent(e.path.clone()));
                }
            }
            match &e.kind {
                EntryKind::Dir { .. } => {
                    dirs.insert(&e.path);
                }
                EntryKind::File { size, chunks, .. } => {
                    let mut sum = 0u64;
                    for &i in chunks {
                        let c = self
                            .chunks
                            .get(i as usize)
                            .ok_or_else(|| TreeError::ChunkIndex(e.path.clone()))?;
                        sum = sum.saturating_add(c.size);
                    }
                    if sum != *size {
                        return Err(TreeError::SizeMismatch {
                            path: e.path.clone(),
                            size: *size,
                            sum,
                        });
                    }
                }
                EntryKind::Symlink { target } => {
                    if target.is_empty() || target.contains('\0') || target.len() > MAX_PATH {
                        return Err(TreeError::SymlinkTarget(e.path.clone()));
                    }
                }
            }
        }
        Ok(())
    }

    /// Parses a tree blob, joins it with the chunk table read from the part manifests, and
    /// validates the whole.
    pub fn from_parts(bytes: &[u8], chunks: Vec<ChunkRef>) -> Result<Tree, TreeError> {
        let raw: RawTree =
            serde_json::from_slice(bytes).map_err(|e| TreeError::Json(e.to_string()))?;
        if !READABLE_FORMATS.contains(&raw.format) {
            return Err(TreeError::Format(raw.format));
        }
        // Runs are checked against the table and the reference budget before anything is
        // expanded, so a hostile `[0, 4294967295]` costs nothing.
        let mut budget = MAX_CHUNK_REFS;
        let mut entries = Vec::with_capacity(raw.entries.len());
        for mut e in raw.entries {
            let kind = match e.kind().map_err(TreeError::Json)? {
                RawKind::Dir { mode } => EntryKind::Dir { mode },
                RawKind::Symlink { target } => EntryKind::Symlink { target },
                RawKind::File {
                    mode,
                    size,
                    chunks: spans,
                } => {
                    let mut ids = Vec::with_capacity(spans.len().min(budget));
                    for span in spans {
                        let (first, count) = match span {
                            Span::One(i) => (i, 1),
                            Span::Run(..) if raw.format == 2 => {
                                return Err(TreeError::Runs(e.path))
                            }
                            Span::Run(first, count) => (first, count),
                        };
                        let end = first as u64 + count as u64;
                        if count == 0 || end > chunks.len() as u64 {
                            return Err(TreeError::ChunkIndex(e.path));
                        }
                        budget = budget
                            .checked_sub(count as usize)
                            .ok_or(TreeError::TooManyChunkRefs)?;
                        ids.extend(first..first + count);
                    }
                    EntryKind::File {
                        mode,
                        size,
                        chunks: ids,
                    }
                }
            };
            entries.push(Entry { path: e.path, kind });
        }
        let tree = Tree {
            format: raw.format,
            chunking: raw.chunking,
            chunks,
            entries,
        };
        tree.validate()?;
        Ok(tree)
    }

    /// The canonical serialisation of the tree blob: compact JSON, fields in declaration order,
    /// without the chunk table (which the part manifests hold). A tree keeps the format it was
    /// read in, so re-serialising a version gives back its bytes.
    pub fn to_json(&self) -> Vec<u8> {
        let runs = self.format != 2;
        let entries = self
            .entries
            .iter()
            .map(|e| EntryOut {
                path: &e.path,
                kind: match &e.kind {
                    EntryKind::File { mode, size, chunks } => KindOut::File {
                        mode: *mode,
                        size: *size,
                        chunks: ChunkList { ids: chunks, runs },
                    },
                    EntryKind::Dir { mode } => KindOut::Dir { mode: *mode },
                    EntryKind::Symlink { target } => KindOut::Symlink { target },
                },
            })
            .collect();
        let out = TreeOut {
            format: self.format,
            chunking: &self.chunking,
            entries,
        };
        serde_json::to_vec(&out).unwrap_or_default()
    }

    /// The entry at `path`. Entries are sorted by path (the builder writes them so, and a reader
    /// refuses a tree that is not), so this is a binary search.
    pub fn entry(&self, path: &str) -> Option<&Entry> {
        let at = self
            .entries
            .binary_search_by(|e| e.path.as_str().cmp(path))
            .ok()?;
        self.entries.get(at)
    }

    pub fn file_count(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::File { .. }))
            .count()
    }

    pub fn total_bytes(&self) -> u64 {
        self.entries
            .iter()
            .map(|e| match e.kind {
                EntryKind::File { size, .. } => size,
                _ => 0,
            })
            .sum()
    }
}

/// Collects entries in any order and produces the canonical [`Tree`].
#[derive(Debug)]
pub struct TreeBuilder {
    chunking: ChunkingInfo,
    entries: BTreeMap<String, BuilderEntry>,
}

#[derive(Debug)]
enum BuilderEntry {
    File { mode: u32, chunks: Vec<ChunkRef> },
    Dir { mode: u32 },
    Symlink { target: String },
}

/// Modes are normalised so a version does not depend on the pusher's umask: executables 0755,
/// other files 0644, directories 0755.
pub fn normalize_file_mode(mode: u32) -> u32 {
    if mode & 0o111 != 0 {
        0o755
    } else {
        0o644
    }
}

pub const DIR_MODE: u32 = 0o755;

impl TreeBuilder {
    pub fn new(chunking: ChunkingInfo) -> Self {
        TreeBuilder {
            chunking,
            entries: BTreeMap::new(),
        }
    }

    pub fn add_dir(&mut self, path: &str) -> Result<(), TreeError> {
        validate_path(path)?;
        self.insert(path, BuilderEntry::Dir { mode: DIR_MODE })
    }

    pub fn add_symlink(&mut self, path: &str, target: &str) -> Result<(), TreeError> {
        validate_path(path)?;
        if target.is_empty() || target.contains('\0') || target.len() > MAX_PATH {
            return Err(TreeError::SymlinkTarget(path.to_owned()));
        }
        self.insert(
            path,
            BuilderEntry::Symlink {
                target: target.to_owned(),
            },
        )
    }

    pub fn add_file(
        &mut self,
        path: &str,
        mode: u32,
        chunks: Vec<ChunkRef>,
    ) -> Result<(), TreeError> {
        validate_path(path)?;
        self.insert(
            path,
            BuilderEntry::File {
                mode: normalize_file_mode(mode),
                chunks,
            },
        )
    }

    fn insert(&mut self, path: &str, entry: BuilderEntry) -> Result<(), TreeError> {
        if self.entries.insert(path.to_owned(), entry).is_some() {
            return Err(TreeError::Duplicate(path.to_owned()));
        }
        Ok(())
    }

    /// Adds missing parent directories, orders entries by path bytes, and numbers chunks in order of
    /// first use.
    pub fn finish(mut self) -> Result<Tree, TreeError> {
        let paths: Vec<String> = self.entries.keys().cloned().collect();
        for path in paths {
            let mut p = path.as_str();
            while let Some(parent) = parent(p) {
                self.entries
                    .entry(parent.to_owned())
                    .or_insert(BuilderEntry::Dir { mode: DIR_MODE });
                p = parent;
            }
        }
        let mut sorted: Vec<(String, BuilderEntry)> = self.entries.into_iter().collect();
        sorted.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let mut table: Vec<ChunkRef> = Vec::new();
        let mut index: HashMap<Digest, u32> = HashMap::new();
        let mut entries = Vec::with_capacity(sorted.len());
        for (path, e) in sorted {
            let kind = match e {
                BuilderEntry::Dir { mode } => EntryKind::Dir { mode },
                BuilderEntry::Symlink { target } => EntryKind::Symlink { target },
                BuilderEntry::File { mode, chunks } => {
                    let size = chunks.iter().map(|c| c.size).sum();
                    let ids = chunks
                        .into_iter()
                        .map(|c| {
                            *index.entry(c.digest.clone()).or_insert_with(|| {
                                table.push(c);
                                (table.len() - 1) as u32
                            })
                        })
                        .collect();
                    EntryKind::File {
                        mode,
                        size,
                        chunks: ids,
                    }
                }
            };
            entries.push(Entry { path, kind });
        }
        let tree = Tree {
            format: FORMAT_VERSION,
            chunking: self.chunking,
            chunks: table,
            entries,
        };
        tree.validate()?;
        Ok(tree)
    }
}

/// A serialised manifest and its digest.
#[derive(Debug, Clone)]
pub struct Blob {
    pub digest: Digest,
    pub bytes: Vec<u8>,
}

impl Blob {
    fn new(bytes: Vec<u8>) -> Self {
        Blob {
            digest: Algorithm::Sha256.digest_bytes(&bytes),
            bytes,
        }
    }
}

/// Everything a registry must hold for one version, besides the chunks themselves.
#[derive(Debug, Clone)]
pub struct Layout {
    pub tree: Blob,
    pub tree_manifest: Blob,
    pub parts: Vec<Blob>,
    /// The volume as an image, one per platform of [`IMAGE_PLATFORMS`]: an image config whose
    /// one layer is the tree blob, and the manifest naming both (for containerd's snapshotter).
    pub image_configs: Vec<Blob>,
    pub images: Vec<Blob>,
    /// The top-level index: its digest is the version's digest.
    pub index: Blob,
}

impl Layout {
    /// The blobs besides chunks and the empty config: the tree and the image configs.
    pub fn blobs(&self) -> impl Iterator<Item = &Blob> {
        std::iter::once(&self.tree).chain(&self.image_configs)
    }

    /// The manifests the index names, parts first.
    pub fn child_manifests(&self) -> impl Iterator<Item = &Blob> {
        self.parts
            .iter()
            .chain(std::iter::once(&self.tree_manifest))
            .chain(&self.images)
    }
}

/// The image config of a volume's image-shaped manifest: one layer, whose uncompressed content is
/// the tree blob itself, so its diff ID (and the snapshot's chain ID) is the tree's digest.
fn image_config(architecture: &str, tree: &Blob) -> Blob {
    // Written out rather than through a JSON map, so the bytes (and so the digests) do not depend
    // on a map's key order. `architecture` is one of IMAGE_PLATFORMS, a digest is hex.
    let config = format!(
        r#"{{"architecture":"{architecture}","os":"linux","config":{{}},"rootfs":{{"type":"layers","diff_ids":["{}"]}}}}"#,
        tree.digest
    );
    Blob::new(config.into_bytes())
}

fn empty_config() -> Descriptor {
    Descriptor {
        media_type: media::OCI_EMPTY.to_owned(),
        digest: Digest::parse(media::OCI_EMPTY_DIGEST).unwrap_or_else(|_| unreachable!()),
        size: 2,
        urls: None,
        annotations: None,
        artifact_type: None,
        data: Some("e30=".to_owned()),
        platform: None,
    }
}

fn descriptor(media_type: &str, blob: &Blob, artifact_type: Option<&str>) -> Descriptor {
    Descriptor {
        media_type: media_type.to_owned(),
        digest: blob.digest.clone(),
        size: blob.bytes.len() as u64,
        urls: None,
        annotations: None,
        artifact_type: artifact_type.map(str::to_owned),
        data: None,
        platform: None,
    }
}

fn image_manifest(artifact_type: &str, layers: Vec<Descriptor>) -> Blob {
    let m = ImageManifest {
        schema_version: 2,
        media_type: Some(media::OCI_MANIFEST.to_owned()),
        artifact_type: Some(artifact_type.to_owned()),
        config: empty_config(),
        layers,
        subject: None,
        annotations: None,
    };
    Blob::new(serde_json::to_vec(&m).unwrap_or_default())
}

/// How many leading zero bits of a chunk's digest end a part, for a table of `chunks` chunks:
/// half the table size's bit length, between 4 and 10.
///
/// A change re-sends the index (one descriptor per part, ~200 bytes) and the parts around it (~125
/// bytes per chunk), so the cheapest part size grows as the square root of the table: parts
/// average about 24 chunks in a 2 GiB volume, 40 in 4 GiB and about 520 in 1 TiB, whose index
/// stays near 250 kB. A version whose table crosses a power of four re-sends every part once.
pub fn part_boundary_bits(chunks: usize) -> u32 {
    (chunks.max(1).ilog2() / 2).clamp(4, 10)
}

/// Whether a part may end after this chunk: its digest starts with `bits` zero bits.
fn is_part_boundary(digest: &Digest, bits: u32) -> bool {
    let hex = digest.hex();
    let lead = u16::from_str_radix(hex.get(..4).unwrap_or("ffff"), 16).unwrap_or(u16::MAX);
    lead >> (16 - bits) == 0
}

/// Splits the chunk table into part-manifest-sized runs at content-defined points, so a new version
/// that shares most chunks also shares most part manifests.
pub fn split_parts(chunks: &[ChunkRef]) -> Vec<&[ChunkRef]> {
    let bits = part_boundary_bits(chunks.len());
    let mut parts = Vec::new();
    let mut start = 0;
    for (i, c) in chunks.iter().enumerate() {
        let len = i + 1 - start;
        if len >= PART_MAX || (len >= PART_MIN && is_part_boundary(&c.digest, bits)) {
            parts.push(&chunks[start..=i]);
            start = i + 1;
        }
    }
    if start < chunks.len() {
        parts.push(&chunks[start..]);
    }
    parts
}

/// Builds the OCI objects of a version from its tree.
pub fn build_layout(tree: &Tree) -> Layout {
    build_layout_for(tree, None)
}

/// Builds the OCI objects of a version whose index names `subject` (the artifact it was sealed
/// from), so the version is listed among that artifact's referrers.
pub fn build_layout_for(tree: &Tree, subject: Option<Descriptor>) -> Layout {
    let tree_blob = Blob::new(tree.to_json());
    let tree_manifest = image_manifest(
        TREE_ARTIFACT_TYPE,
        vec![descriptor(TREE_MEDIA_TYPE, &tree_blob, None)],
    );
    let parts: Vec<Blob> = split_parts(&tree.chunks)
        .into_iter()
        .map(|part| {
            let layers = part
                .iter()
                .map(|c| Descriptor {
                    media_type: CHUNK_MEDIA_TYPE.to_owned(),
                    digest: c.digest.clone(),
                    size: c.size,
                    urls: None,
                    annotations: None,
                    artifact_type: None,
                    data: None,
                    platform: None,
                })
                .collect();
            image_manifest(CHUNKS_ARTIFACT_TYPE, layers)
        })
        .collect();
    let image_configs: Vec<Blob> = IMAGE_PLATFORMS
        .iter()
        .map(|arch| image_config(arch, &tree_blob))
        .collect();
    let images: Vec<Blob> = image_configs
        .iter()
        .map(|config| {
            let m = ImageManifest {
                schema_version: 2,
                media_type: Some(media::OCI_MANIFEST.to_owned()),
                artifact_type: None,
                config: descriptor(media::OCI_CONFIG, config, None),
                layers: vec![descriptor(
                    image_layer_media_type(tree.format),
                    &tree_blob,
                    None,
                )],
                subject: None,
                annotations: None,
            };
            Blob::new(serde_json::to_vec(&m).unwrap_or_default())
        })
        .collect();
    // The tree and the parts carry a platform no machine has, as attestation manifests do: a
    // client that pulls one platform of an index (containerd's transfer service, nerdctl) skips
    // them, where it would fetch every entry without a platform, and with them every chunk
    // (docs/format.md, "The volume as an image").
    let no_platform = |mut d: Descriptor| {
        d.platform = Some(serde_json::json!({ "architecture": "unknown", "os": "unknown" }));
        d
    };
    let mut manifests = vec![no_platform(descriptor(
        media::OCI_MANIFEST,
        &tree_manifest,
        Some(TREE_ARTIFACT_TYPE),
    ))];
    manifests.extend(parts.iter().map(|p| {
        no_platform(descriptor(
            media::OCI_MANIFEST,
            p,
            Some(CHUNKS_ARTIFACT_TYPE),
        ))
    }));
    // Last, the image-shaped manifests, each for its platform: containerd picks the one for its
    // own and takes only that.
    manifests.extend(IMAGE_PLATFORMS.iter().zip(&images).map(|(arch, image)| {
        let mut d = descriptor(media::OCI_MANIFEST, image, Some(IMAGE_ARTIFACT_TYPE));
        d.platform = Some(serde_json::json!({ "architecture": arch, "os": "linux" }));
        d
    }));
    let annotations = BTreeMap::from([
        (ANNOTATION_FORMAT.to_owned(), tree.format.to_string()),
        (ANNOTATION_FILES.to_owned(), tree.file_count().to_string()),
        (ANNOTATION_BYTES.to_owned(), tree.total_bytes().to_string()),
        (ANNOTATION_CHUNKS.to_owned(), tree.chunks.len().to_string()),
        (ANNOTATION_TREE.to_owned(), tree_blob.digest.to_string()),
    ]);
    let index = ImageIndex {
        schema_version: 2,
        media_type: Some(media::OCI_INDEX.to_owned()),
        artifact_type: Some(VOLUME_ARTIFACT_TYPE.to_owned()),
        manifests,
        subject,
        annotations: Some(annotations),
    };
    Layout {
        tree: tree_blob,
        tree_manifest,
        parts,
        image_configs,
        images,
        index: Blob::new(serde_json::to_vec(&index).unwrap_or_default()),
    }
}

/// What a reader needs from a version's top-level index.
#[derive(Debug, Clone)]
pub struct VolumeIndex {
    pub index: ImageIndex,
    /// The part manifests, in order: their layers, concatenated, are the chunk table.
    pub parts: Vec<Descriptor>,
    /// The tree blob, if the index names it (saves one round trip).
    pub tree: Option<Digest>,
    /// The tree manifest's descriptor.
    pub tree_manifest: Descriptor,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeError {
    #[error("not a vial volume: {0}")]
    NotAVolume(String),
    #[error("volume index is not valid JSON: {0}")]
    Json(String),
}

impl VolumeIndex {
    pub fn parse(bytes: &[u8]) -> Result<VolumeIndex, VolumeError> {
        let index: ImageIndex =
            serde_json::from_slice(bytes).map_err(|e| VolumeError::Json(e.to_string()))?;
        if index.artifact_type.as_deref() != Some(VOLUME_ARTIFACT_TYPE) {
            return Err(VolumeError::NotAVolume(format!(
                "artifactType is {:?}, expected {VOLUME_ARTIFACT_TYPE}",
                index.artifact_type
            )));
        }
        let tree_manifest = index
            .manifests
            .iter()
            .find(|m| m.artifact_type.as_deref() == Some(TREE_ARTIFACT_TYPE))
            .cloned()
            .ok_or_else(|| VolumeError::NotAVolume("the index has no tree manifest".into()))?;
        let tree = index
            .annotations
            .as_ref()
            .and_then(|a| a.get(ANNOTATION_TREE))
            .and_then(|d| Digest::parse(d).ok());
        let parts = index
            .manifests
            .iter()
            .filter(|m| m.artifact_type.as_deref() == Some(CHUNKS_ARTIFACT_TYPE))
            .cloned()
            .collect();
        Ok(VolumeIndex {
            index,
            parts,
            tree,
            tree_manifest,
        })
    }

    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.index
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    }
}

/// The chunks a part manifest lists, in order.
pub fn chunks_from_part(bytes: &[u8]) -> Result<Vec<ChunkRef>, VolumeError> {
    /// Only what a part manifest's reader takes: a volume has hundreds of thousands of chunks,
    /// and the media type of each is only compared.
    #[derive(Deserialize)]
    struct Part<'a> {
        #[serde(borrow)]
        layers: Vec<PartLayer<'a>>,
    }
    #[derive(Deserialize)]
    struct PartLayer<'a> {
        #[serde(rename = "mediaType", borrow)]
        media_type: std::borrow::Cow<'a, str>,
        digest: Digest,
        size: u64,
    }
    let m: Part<'_> =
        serde_json::from_slice(bytes).map_err(|e| VolumeError::Json(e.to_string()))?;
    m.layers
        .into_iter()
        .map(|l| {
            if l.media_type == CHUNK_MEDIA_TYPE {
                Ok(ChunkRef {
                    digest: l.digest,
                    size: l.size,
                })
            } else {
                Err(VolumeError::NotAVolume(format!(
                    "part manifest has a {} layer",
                    l.media_type
                )))
            }
        })
        .collect()
}

/// The tree blob's digest from a tree manifest.
pub fn tree_from_manifest(bytes: &[u8]) -> Result<Digest, VolumeError> {
    let m: ImageManifest =
        serde_json::from_slice(bytes).map_err(|e| VolumeError::Json(e.to_string()))?;
    m.layers
        .iter()
        .find(|l| l.media_type == TREE_MEDIA_TYPE)
        .map(|l| l.digest.clone())
        .ok_or_else(|| VolumeError::NotAVolume("tree manifest has no tree layer".into()))
}

pub mod diff;
mod raw;

#[cfg(test)]
mod tests;
