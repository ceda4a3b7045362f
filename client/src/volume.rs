//! Opening a sealed version: resolve a reference to its index, then fetch and validate its tree.

use std::time::Duration;

use futures_util::StreamExt;
use vial_core::manifest::ImageManifest;
use vial_core::volume::{chunks_from_part, tree_from_manifest, Tree, VolumeIndex};
use vial_core::{media, Digest, RepoName, Target};

use crate::{ClientError, Registry};

/// A version ready to read: its digest, index and validated tree.
#[derive(Debug, Clone)]
pub struct Version {
    pub digest: Digest,
    pub index: VolumeIndex,
    pub tree: Tree,
    /// The artifact this volume was sealed from, when the reference named one (an `oras push`).
    pub sealed_from: Option<Digest>,
}

/// How long to wait between looks at a seal in progress, at most, when the registry answers
/// at once.
const SEAL_POLL_MAX: Duration = Duration::from_secs(2);
/// How long the registry may hold a seal status request until the seal finishes.
const SEAL_WAIT: Duration = Duration::from_secs(20);

/// Resolves `target` (a tag is resolved once, here) and loads the version's tree and chunk table:
/// the index, then the tree blob and the part manifests in one parallel wave (plus the tree
/// manifest first when the index does not name the tree blob), whatever the volume's size.
///
/// A reference to a file artifact pushed by another tool (`oras push`) opens the volume the
/// registry sealed from it, asking for the seal and waiting for it if need be.
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
    if manifest.media_type == media::OCI_MANIFEST || manifest.media_type == media::DOCKER_MANIFEST {
        let artifact: ImageManifest = serde_json::from_slice(&manifest.bytes)
            .map_err(|e| ClientError::NotAVolume(what.clone(), e.to_string()))?;
        vial_oras_compat::recognize(&artifact).map_err(|e| {
            ClientError::NotAVolume(what.clone(), format!("not a file artifact either: {e}"))
        })?;
        let volume = sealed_volume(registry, repo, &manifest.digest, &what).await?;
        let mut version = Box::pin(open(registry, repo, &Target::Digest(volume))).await?;
        if version.index.index.subject.as_ref().map(|s| &s.digest) != Some(&manifest.digest) {
            return Err(ClientError::InvalidVolume(format!(
                "the registry's seal of {what} is not attached to it"
            )));
        }
        version.sealed_from = Some(manifest.digest);
        return Ok(version);
    }
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
    // The futures are built up front: a stream of borrowing closures would not be `Send` for
    // every lifetime, which callers that spawn this (the snapshotter's gRPC service) need.
    let part_futures: Vec<_> = index
        .parts
        .iter()
        .map(|p| async move {
            let m = registry
                .get_manifest(repo, &Target::Digest(p.digest.clone()))
                .await?
                .ok_or_else(|| {
                    ClientError::InvalidVolume(format!("part manifest {} is missing", p.digest))
                })?;
            // Parsed off the runtime, so parts parse on every core while the tree downloads.
            tokio::task::spawn_blocking(move || chunks_from_part(&m.bytes))
                .await
                .map_err(ClientError::task("parse a part manifest"))?
                .map_err(|e| ClientError::InvalidVolume(e.to_string()))
        })
        .collect();
    let part_fetches = futures_util::stream::iter(part_futures)
        .buffered(16)
        .collect::<Vec<_>>();
    let (tree_bytes, parts) = futures_util::future::join(tree_fetch, part_fetches).await;
    let tree_bytes = tree_bytes?;
    let mut chunks = Vec::new();
    for part in parts {
        chunks.extend(part?);
    }
    // Off the runtime too: `vial diff` parses two trees at once.
    let tree = tokio::task::spawn_blocking(move || Tree::from_parts(&tree_bytes, chunks))
        .await
        .map_err(ClientError::task("parse the tree"))?
        .map_err(|e| ClientError::InvalidVolume(format!("{what}: {e}")))?;
    Ok(Version {
        digest: manifest.digest,
        index,
        tree,
        sealed_from: None,
    })
}

/// The volume the registry sealed from the artifact `digest`: the registry's own record of the
/// seal, never just any referrer, since anyone who may push could attach a volume to an artifact.
/// Asks for the seal when there is none (or it failed) and waits while it runs.
pub async fn sealed_volume(
    registry: &Registry,
    repo: &RepoName,
    digest: &Digest,
    what: &str,
) -> Result<Digest, ClientError> {
    let mut status = registry.seal(repo, digest, false, Duration::ZERO).await?;
    if status
        .as_ref()
        .is_none_or(|s| s.state == "failed" || (s.state == "done" && s.volume.is_none()))
    {
        status = registry.seal(repo, digest, true, Duration::ZERO).await?;
    }
    let mut wait = Duration::from_millis(100);
    let mut announced = false;
    loop {
        let Some(s) = status else {
            return Err(ClientError::NotAVolume(
                what.to_owned(),
                "it is a file artifact, and this registry cannot seal it into a volume (a vial registry can)".into(),
            ));
        };
        match (s.state.as_str(), s.volume) {
            ("done", Some(volume)) => return Ok(volume),
            ("failed", _) => {
                return Err(ClientError::Invalid(format!(
                    "the registry could not seal {what} into a volume: {}",
                    s.error.as_deref().unwrap_or("no reason given")
                )))
            }
            _ => {}
        }
        if !announced {
            tracing::info!("waiting for the registry to seal {what} into a volume");
            announced = true;
        }
        // The registry holds the request until the seal finishes; one that answers at once (an
        // older registry, or a wait cut short) is asked again after a growing pause.
        let asked = std::time::Instant::now();
        status = registry.seal(repo, digest, false, SEAL_WAIT).await?;
        if asked.elapsed() < SEAL_WAIT / 2
            && status
                .as_ref()
                .is_some_and(|s| s.state != "done" && s.state != "failed")
        {
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(SEAL_POLL_MAX);
        }
    }
}
