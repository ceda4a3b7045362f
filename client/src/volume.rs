//! Opening a sealed version: resolve a reference to its index, then fetch and validate its tree.

use futures_util::StreamExt;
use vial_core::volume::{chunks_from_part, tree_from_manifest, Tree, VolumeIndex};
use vial_core::{media, Digest, RepoName, Target};

use crate::{ClientError, Registry};

/// A version ready to read: its digest, index and validated tree.
#[derive(Debug, Clone)]
pub struct Version {
    pub digest: Digest,
    pub index: VolumeIndex,
    pub tree: Tree,
}

/// Resolves `target` (a tag is resolved once, here) and loads the version's tree and chunk table:
/// the index, then the tree blob and the part manifests in one parallel wave (plus the tree
/// manifest first when the index does not name the tree blob), whatever the volume's size.
pub async fn open(
    registry: &Registry,
    repo: &RepoName,
    target: &Target,
) -> Result<Version, ClientError> {
    let what = match target {
        Target::Tag(t) => format!("{}/{repo}:{t}", registry.host()),
        Target::Digest(d) => format!("{}/{repo}@{d}", registry.host()),
    };
    let manifest = registry
        .get_manifest(repo, target)
        .await?
        .ok_or_else(|| ClientError::NotFound(what.clone()))?;
    if manifest.media_type != media::OCI_INDEX {
        return Err(ClientError::NotAVolume(
            what,
            format!("its manifest is {}, not an OCI index", manifest.media_type),
        ));
    }
    let index = VolumeIndex::parse(&manifest.bytes)
        .map_err(|e| ClientError::NotAVolume(what.clone(), e.to_string()))?;
    let tree_digest = match &index.tree {
        Some(d) => d.clone(),
        None => {
            let tm = registry
                .get_manifest(repo, &Target::Digest(index.tree_manifest.digest.clone()))
                .await?
                .ok_or_else(|| {
                    ClientError::InvalidVolume(format!("{what}: tree manifest is missing"))
                })?;
            tree_from_manifest(&tm.bytes).map_err(|e| ClientError::InvalidVolume(e.to_string()))?
        }
    };
    // The tree blob and the part manifests (the chunk table) in one parallel wave.
    let tree_fetch = registry.get_blob(repo, &tree_digest, None);
    let part_fetches = futures_util::stream::iter(index.parts.iter())
        .map(|p| async move {
            let m = registry
                .get_manifest(repo, &Target::Digest(p.digest.clone()))
                .await?
                .ok_or_else(|| {
                    ClientError::InvalidVolume(format!("part manifest {} is missing", p.digest))
                })?;
            chunks_from_part(&m.bytes).map_err(|e| ClientError::InvalidVolume(e.to_string()))
        })
        .buffered(16)
        .collect::<Vec<_>>();
    let (tree_bytes, parts) = futures_util::future::join(tree_fetch, part_fetches).await;
    let tree_bytes = tree_bytes?;
    let mut chunks = Vec::new();
    for part in parts {
        chunks.extend(part?);
    }
    let tree = Tree::from_parts(&tree_bytes, chunks)
        .map_err(|e| ClientError::InvalidVolume(format!("{what}: {e}")))?;
    Ok(Version {
        digest: manifest.digest,
        index,
        tree,
    })
}
