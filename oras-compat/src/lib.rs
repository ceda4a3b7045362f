//! Model artifacts that other tools push, read as sets of files.
//!
//! Three shapes are common, all plain OCI image manifests with one layer per file (or per
//! directory archive):
//!
//! - **ORAS** (`oras push REF a.safetensors config.json`, the ORAS SDKs): each layer is named by
//!   `org.opencontainers.image.title`; a directory is pushed as one tar+gzip layer marked
//!   `io.deis.oras.content.unpack: "true"`, whose entries carry the directory's name.
//! - **CNCF ModelPack** (`modctl`, and its CloudNativeAI predecessor): layers named by
//!   `org.cncf.model.filepath` (`org.cnai.model.filepath`), with media types ending in `.raw`, `.tar`,
//!   `.tar+gzip` or `.tar+zstd` that say how the bytes are packed.
//! - **Docker model artifacts** (`docker model push`): config `application/vnd.docker.ai.model.config.*`,
//!   layers typed `application/vnd.docker.ai.gguf.v3`, `…safetensors`, `…license`, `…dir.tar` and so
//!   on, named by a filepath annotation when the packager wrote one and otherwise by their type.
//!
//! [`recognize`] maps a manifest to the files it holds, with paths checked to stay inside the
//! volume, without any I/O: what to fetch and how to unpack it is the caller's business. This is
//! the first half of sealing an artifact into a vial volume.

use std::collections::{BTreeMap, HashSet};

use vial_core::manifest::{Descriptor, ImageManifest};

/// The media type the ORAS Python SDK gives a directory it pushed as a tar+gzip archive.
pub const ORAS_SDK_DIRECTORY_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const ANNOTATION_TITLE: &str = "org.opencontainers.image.title";
pub const ANNOTATION_ORAS_UNPACK: &str = "io.deis.oras.content.unpack";
pub const ANNOTATION_MODELPACK_FILEPATH: &str = "org.cncf.model.filepath";
pub const ANNOTATION_CNAI_FILEPATH: &str = "org.cnai.model.filepath";

/// Which tool's conventions a manifest follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Oras,
    ModelPack,
    DockerModel,
}

/// How a layer's bytes hold its file(s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Packing {
    /// The layer is the file.
    Raw,
    /// A tar archive whose entries are the files, with their paths.
    Tar,
    TarGzip,
    TarZstd,
}

impl Packing {
    pub fn is_archive(self) -> bool {
        self != Packing::Raw
    }
}

/// One layer and where its content goes.
#[derive(Debug, Clone, PartialEq)]
pub struct FileLayer {
    /// A relative, normalised path: the file for a raw layer; for an archive, the name the
    /// packager gave it (its entries carry their own paths).
    pub path: String,
    pub packing: Packing,
    pub descriptor: Descriptor,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Artifact {
    pub kind: Kind,
    pub layers: Vec<FileLayer>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotAnArtifact {
    #[error("already a vial volume")]
    AlreadyAVolume,
    #[error("layer {0} has no file name (no title or filepath annotation): an image, not a file artifact")]
    UnnamedLayer(String),
    #[error("layer {digest} names the path {path:?}, which is absolute or leaves the volume")]
    UnsafePath { digest: String, path: String },
    #[error("two layers name the same path {0:?}")]
    DuplicatePath(String),
    #[error("the manifest has no layers")]
    Empty,
}

/// Normalises a path from an annotation: relative, `/`-separated, no `.`/`..`/empty components.
/// `None` for anything that could name a file outside the volume.
pub fn safe_path(path: &str) -> Option<String> {
    if path.starts_with('/') || path.contains('\\') || path.contains('\0') {
        return None;
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => continue,
            ".." => return None,
            p => parts.push(p),
        }
    }
    (!parts.is_empty()).then(|| parts.join("/"))
}

fn annotation<'a>(d: &'a Descriptor, key: &str) -> Option<&'a str> {
    d.annotations.as_ref()?.get(key).map(String::as_str)
}

/// How a layer is packed, from its media type's suffix.
fn packing_of(media_type: &str) -> Packing {
    let t = media_type.to_ascii_lowercase();
    if t.ends_with("+gzip") || t.ends_with(".gzip") || t.ends_with("tar.gz") {
        Packing::TarGzip
    } else if t.ends_with("+zstd") || t.ends_with(".zstd") {
        Packing::TarZstd
    } else if t.ends_with(".tar") || t.ends_with("+tar") {
        Packing::Tar
    } else {
        Packing::Raw
    }
}

/// A name for a Docker model layer that carries no path annotation, from its type.
fn docker_default_name(media_type: &str, n: usize) -> String {
    let kind = media_type
        .strip_prefix("application/vnd.docker.ai.")
        .unwrap_or("layer");
    let name = match kind {
        "gguf.v3" => "model.gguf",
        "safetensors" => "model.safetensors",
        "license" => "LICENSE",
        "mmproj" => "mmproj.gguf",
        "chat.template.jinja" => "template.jinja",
        _ => "",
    };
    if name.is_empty() {
        format!("layer-{n}")
    } else if n == 0 {
        name.to_owned()
    } else {
        // Several layers of one type: number all but the first.
        match name.rsplit_once('.') {
            Some((stem, ext)) => format!("{stem}-{n}.{ext}"),
            None => format!("{name}-{n}"),
        }
    }
}

/// Reads `manifest` as a file artifact, or says why it is not one.
pub fn recognize(manifest: &ImageManifest) -> Result<Artifact, NotAnArtifact> {
    if manifest.artifact_type.as_deref() == Some(vial_core::volume::VOLUME_ARTIFACT_TYPE)
        || manifest
            .artifact_type
            .as_deref()
            .is_some_and(|t| t.starts_with("application/vnd.vial."))
    {
        return Err(NotAnArtifact::AlreadyAVolume);
    }
    if manifest.layers.is_empty() {
        return Err(NotAnArtifact::Empty);
    }
    let config = manifest.config.media_type.as_str();
    fn filepath(d: &Descriptor) -> Option<&str> {
        annotation(d, ANNOTATION_MODELPACK_FILEPATH)
            .or_else(|| annotation(d, ANNOTATION_CNAI_FILEPATH))
    }
    let kind = if config.starts_with("application/vnd.docker.ai.model.config") {
        Kind::DockerModel
    } else if config.starts_with("application/vnd.cncf.model.config")
        || config.starts_with("application/vnd.cnai.model.config")
        || manifest.layers.iter().any(|d| filepath(d).is_some())
    {
        Kind::ModelPack
    } else {
        Kind::Oras
    };

    let mut layers = Vec::new();
    let mut seen = HashSet::new();
    let mut per_type: BTreeMap<&str, usize> = BTreeMap::new();
    for d in &manifest.layers {
        let named = filepath(d).or_else(|| annotation(d, ANNOTATION_TITLE));
        let (raw_path, packing) = match (kind, named) {
            (Kind::Oras, Some(title)) => {
                // The oras CLI marks directories for unpacking; the ORAS Python SDK marks them
                // only by the exact media type below, and extracts every layer of that type.
                let unpack = annotation(d, ANNOTATION_ORAS_UNPACK) == Some("true")
                    || d.media_type == ORAS_SDK_DIRECTORY_TYPE;
                let packing = if unpack {
                    match packing_of(&d.media_type) {
                        // ORAS marks directories for unpacking; its default type is tar+gzip.
                        Packing::Raw => Packing::TarGzip,
                        p => p,
                    }
                } else {
                    Packing::Raw
                };
                (title.to_owned(), packing)
            }
            (Kind::Oras, None) => return Err(NotAnArtifact::UnnamedLayer(d.digest.to_string())),
            (Kind::ModelPack, Some(path)) => (path.to_owned(), packing_of(&d.media_type)),
            (Kind::ModelPack, None) => {
                return Err(NotAnArtifact::UnnamedLayer(d.digest.to_string()))
            }
            (Kind::DockerModel, named) => {
                let packing = packing_of(&d.media_type);
                let path = match named {
                    Some(p) => p.to_owned(),
                    None => {
                        let n = per_type.entry(d.media_type.as_str()).or_insert(0);
                        let name = docker_default_name(&d.media_type, *n);
                        *n += 1;
                        name
                    }
                };
                (path, packing)
            }
        };
        let path = safe_path(&raw_path).ok_or_else(|| NotAnArtifact::UnsafePath {
            digest: d.digest.to_string(),
            path: raw_path.clone(),
        })?;
        if !seen.insert(path.clone()) {
            return Err(NotAnArtifact::DuplicatePath(path));
        }
        layers.push(FileLayer {
            path,
            packing,
            descriptor: d.clone(),
        });
    }
    Ok(Artifact { kind, layers })
}

#[cfg(test)]
mod tests;
