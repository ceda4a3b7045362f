//! Opening a sealed version: resolve a reference to its index, then fetch and validate its tree.

use vial_core::volume::{tree_from_manifest, Tree, VolumeIndex};
use vial_core::{media, Digest, RepoName, Target};

use crate::{ClientError, Registry};

/// A version ready to read: its digest, index and validated tree.
#[derive(Debug, Clone)]
pub struct Version {
    pub digest: Digest,
    pub index: VolumeIndex,
    pub tree: Tree,
}

/// Resolves `target` (a tag is resolved once, here) and loads the version's tree: two requests when
/// the index names its tree blob, three otherwise, whatever the volume's size.
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
    let tree_bytes = registry.get_blob(repo, &tree_digest, None).await?;
    let tree = Tree::from_json(&tree_bytes)
        .map_err(|e| ClientError::InvalidVolume(format!("{what}: {e}")))?;
    Ok(Version {
        digest: manifest.digest,
        index,
        tree,
    })
}
