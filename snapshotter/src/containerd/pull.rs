//! `vial containerd pull`: pull a volume (or any image) into containerd through a snapshotter,
//! passing the remote-snapshot labels `ctr` 1.6 cannot pass, as stargz's `ctr-remote image rpull`
//! does. The client does what containerd's own Go client does for a pull with unpack: manifests
//! and config into the content store, an image record, then each layer prepared on the
//! snapshotter by chain ID. A volume's one layer is answered "already exists" by vial's
//! snapshotter, which mounts it lazily; nothing of the volume is downloaded. An ordinary layer is
//! downloaded into the content store and applied by containerd's differ.

// containerd's API errors are tonic's (large) `Status`; they are passed through as they are.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime};

use containerd_client::services::v1::snapshots::{
    CommitSnapshotRequest, PrepareSnapshotRequest, RemoveSnapshotRequest, StatSnapshotRequest,
};
use containerd_client::services::v1::{
    ApplyRequest, CreateImageRequest, CreateRequest as CreateLeaseRequest,
    DeleteRequest as DeleteLeaseRequest, Image, Info as ContentInfo, UpdateImageRequest,
    UpdateRequest as UpdateContentRequest, WriteAction, WriteContentRequest,
};
use containerd_client::tonic::metadata::MetadataValue;
use containerd_client::tonic::{Code, Request};
use containerd_client::types::Descriptor as CdDescriptor;
use containerd_client::Client;
use futures_util::StreamExt;
use sha2::{Digest as _, Sha256};
use vial_client::{ClientError, Registry};
use vial_core::manifest::{Descriptor, ImageIndex, ImageManifest};
use vial_core::volume::{is_tree_layer, VolumeIndex};
use vial_core::{media, Digest, Reference, Target};

use super::labels;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("registry")]
    Registry(#[from] ClientError),
    #[error("cannot reach containerd at {0}")]
    Connect(String, #[source] containerd_client::tonic::transport::Error),
    #[error("containerd: {what}: {}", .status.message())]
    Containerd {
        what: String,
        status: containerd_client::tonic::Status,
    },
    #[error("{0}")]
    Invalid(String),
}

fn cd(what: impl Into<String>) -> impl FnOnce(containerd_client::tonic::Status) -> PullError {
    let what = what.into();
    move |status| PullError::Containerd { what, status }
}

/// Where to pull into.
#[derive(Debug, Clone)]
pub struct PullOptions<'a> {
    pub address: &'a Path,
    pub namespace: &'a str,
    pub snapshotter: &'a str,
    /// `amd64`, `arm64`: which manifest of an index to take.
    pub architecture: &'a str,
}

/// What a pull did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PullReport {
    /// The image name in containerd.
    pub image: String,
    /// The digest the image record points at (a volume's index).
    pub digest: String,
    /// The chain ID of the top layer: the snapshot a container's rootfs is made from.
    pub chain_id: String,
    /// Whether the image is a vial volume, mounted lazily.
    pub volume: bool,
    /// Where the volume is mounted on the node, for bind mounts into containers.
    pub mountpoint: Option<String>,
    /// Layers downloaded and unpacked (none for a volume).
    pub layers_unpacked: usize,
    pub seconds: f64,
}

/// The architecture names OCI platforms use for this machine's.
pub fn host_architecture() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// A request to containerd in `namespace`, under `lease` if any.
fn request<T>(message: T, namespace: &str, lease: Option<&str>) -> Request<T> {
    let mut r = Request::new(message);
    if let Ok(v) = MetadataValue::try_from(namespace) {
        r.metadata_mut().insert("containerd-namespace", v);
    }
    if let Some(lease) = lease.and_then(|l| MetadataValue::try_from(l).ok()) {
        r.metadata_mut().insert("containerd-lease", lease);
    }
    r
}

fn descriptor(d: &Descriptor) -> CdDescriptor {
    CdDescriptor {
        media_type: d.media_type.clone(),
        digest: d.digest.to_string(),
        size: d.size as i64,
        annotations: HashMap::new(),
    }
}

/// The chain IDs of layers with these diff IDs: the first is its diff ID, each next one the
/// SHA-256 of "<previous chain ID> <diff ID>".
pub fn chain_ids(diff_ids: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.clone(),
            Some(prev) => format!(
                "sha256:{}",
                hex::encode(Sha256::digest(format!("{prev} {diff}").as_bytes()))
            ),
        };
        out.push(next);
    }
    out
}

/// Writes `bytes` into containerd's content store under `digest`, with `labels`.
async fn write_content(
    client: &Client,
    options: &PullOptions<'_>,
    lease: &str,
    digest: &Digest,
    bytes: Vec<u8>,
    labels: HashMap<String, String>,
) -> Result<(), PullError> {
    let total = bytes.len() as i64;
    let reference = format!("vial-{digest}");
    // Stat, then the data with a commit: one streamed request, as containerd's client writes.
    let mut messages = vec![WriteContentRequest {
        action: WriteAction::Stat as i32,
        r#ref: reference.clone(),
        ..Default::default()
    }];
    let chunks: Vec<&[u8]> = bytes.chunks(1 << 20).collect();
    let mut offset = 0i64;
    for (i, chunk) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        messages.push(WriteContentRequest {
            action: if last {
                WriteAction::Commit
            } else {
                WriteAction::Write
            } as i32,
            r#ref: reference.clone(),
            total,
            expected: if last {
                digest.to_string()
            } else {
                String::new()
            },
            offset,
            data: chunk.to_vec(),
            labels: if last { labels.clone() } else { HashMap::new() },
        });
        offset += chunk.len() as i64;
    }
    if chunks.is_empty() {
        messages.push(WriteContentRequest {
            action: WriteAction::Commit as i32,
            r#ref: reference,
            total,
            expected: digest.to_string(),
            labels,
            ..Default::default()
        });
    }
    let stream = futures_util::stream::iter(messages);
    let result = client
        .content()
        .write(request(stream, options.namespace, Some(lease)))
        .await;
    match result {
        Ok(response) => {
            let mut responses = response.into_inner();
            while let Some(r) = responses.next().await {
                match r {
                    Ok(_) => {}
                    Err(s) if s.code() == Code::AlreadyExists => return Ok(()),
                    Err(s) => return Err(cd(format!("writing {digest}"))(s)),
                }
            }
            Ok(())
        }
        Err(s) if s.code() == Code::AlreadyExists => Ok(()),
        Err(s) => Err(cd(format!("writing {digest}"))(s)),
    }
}

/// Removes a snapshot this pull prepared and will not commit; failing that, containerd's garbage
/// collection removes it with the lease.
async fn remove_snapshot(client: &Client, options: &PullOptions<'_>, key: String) {
    let _ = client
        .snapshots()
        .remove(request(
            RemoveSnapshotRequest {
                snapshotter: options.snapshotter.into(),
                key,
            },
            options.namespace,
            None,
        ))
        .await;
}

/// Pulls `reference` into containerd and unpacks it on `options.snapshotter`.
pub async fn pull(
    registry: &Registry,
    reference: &Reference,
    options: &PullOptions<'_>,
) -> Result<PullReport, PullError> {
    let started = std::time::Instant::now();
    let repo = reference.repo();
    let root = registry
        .get_manifest(repo, &reference.target())
        .await?
        .ok_or_else(|| ClientError::NotFound(reference.to_string()))?;
    let is_index =
        root.media_type == media::OCI_INDEX || root.media_type == media::DOCKER_MANIFEST_LIST;
    let volume = is_index && VolumeIndex::parse(&root.bytes).is_ok();
    let manifest_desc: Option<Descriptor> = if is_index {
        let index: ImageIndex = serde_json::from_slice(&root.bytes)
            .map_err(|e| PullError::Invalid(format!("{reference}: invalid index: {e}")))?;
        let wanted = |d: &&Descriptor| {
            d.platform.as_ref().is_some_and(|p| {
                p.get("os").and_then(|v| v.as_str()) == Some("linux")
                    && p.get("architecture").and_then(|v| v.as_str()) == Some(options.architecture)
            })
        };
        let chosen = index.manifests.iter().find(wanted).cloned().ok_or_else(|| {
            PullError::Invalid(if volume {
                format!("{reference} is a vial volume without an image manifest for linux/{}: push it again with this vial to add one (docs/format.md)", options.architecture)
            } else {
                format!("{reference} has no manifest for linux/{}", options.architecture)
            })
        })?;
        Some(chosen)
    } else {
        None
    };
    let manifest = match &manifest_desc {
        Some(d) => registry
            .get_manifest(repo, &Target::Digest(d.digest.clone()))
            .await?
            .ok_or_else(|| {
                ClientError::NotFound(format!("manifest {} of {reference}", d.digest))
            })?,
        None => root.clone(),
    };
    let image: ImageManifest = serde_json::from_slice(&manifest.bytes)
        .map_err(|e| PullError::Invalid(format!("{reference}: invalid manifest: {e}")))?;
    let config = registry.get_blob(repo, &image.config.digest, None).await?;
    #[derive(serde::Deserialize)]
    struct Rootfs {
        diff_ids: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    struct Config {
        rootfs: Rootfs,
    }
    let parsed: Config = serde_json::from_slice(&config).map_err(|e| {
        PullError::Invalid(format!(
            "{reference}: its config is not an image config: {e}"
        ))
    })?;
    if parsed.rootfs.diff_ids.len() != image.layers.len() {
        return Err(PullError::Invalid(format!(
            "{reference}: the config lists {} layers, the manifest {}",
            parsed.rootfs.diff_ids.len(),
            image.layers.len()
        )));
    }
    let chains = chain_ids(&parsed.rootfs.diff_ids);
    let pinned = reference.pinned(root.digest.clone());

    let channel = containerd_client::connect(options.address)
        .await
        .map_err(|e| PullError::Connect(options.address.display().to_string(), e))?;
    let client = Client::from(channel);

    // A lease keeps what this pull writes from containerd's garbage collection until the image
    // record holds it; it expires by itself if the pull dies.
    let lease_id = format!("vial-pull-{}", uuid_like());
    let expire = humantime::format_rfc3339_seconds(SystemTime::now() + Duration::from_secs(3600));
    client
        .leases()
        .create(request(
            CreateLeaseRequest {
                id: lease_id.clone(),
                labels: HashMap::from([("containerd.io/gc.expire".to_owned(), expire.to_string())]),
            },
            options.namespace,
            None,
        ))
        .await
        .map_err(cd("creating a lease"))?;
    let outcome = async {
        // Layers of an ordinary image go into the content store first, as containerd pulls them.
        let mut unpacked = 0;
        let mut layer_labels = HashMap::new();
        for (i, layer) in image.layers.iter().enumerate() {
            if !(volume && is_tree_layer(&layer.media_type)) {
                layer_labels.insert(format!("containerd.io/gc.ref.content.l.{i}"), layer.digest.to_string());
            }
        }
        let mut manifest_labels = layer_labels;
        manifest_labels.insert("containerd.io/gc.ref.content.config".into(), image.config.digest.to_string());
        write_content(&client, options, &lease_id, &image.config.digest, config.to_vec(), HashMap::new()).await?;
        write_content(&client, options, &lease_id, &manifest.digest, manifest.bytes.to_vec(), manifest_labels).await?;
        if manifest_desc.is_some() {
            let labels = HashMap::from([("containerd.io/gc.ref.content.m.0".to_owned(), manifest.digest.to_string())]);
            write_content(&client, options, &lease_id, &root.digest, root.bytes.to_vec(), labels).await?;
        }

        let mut parent = String::new();
        let mut mountpoint = None;
        for (i, (layer, chain)) in image.layers.iter().zip(&chains).enumerate() {
            let stat = client
                .snapshots()
                .stat(request(
                    StatSnapshotRequest { snapshotter: options.snapshotter.into(), key: chain.clone() },
                    options.namespace,
                    None,
                ))
                .await;
            if let Ok(info) = &stat {
                if let Some(info) = &info.get_ref().info {
                    mountpoint = info.labels.get(labels::MOUNTPOINT).cloned().or(mountpoint);
                }
                parent = chain.clone();
                continue;
            }
            let remote = volume && is_tree_layer(&layer.media_type);
            let mut snap_labels = HashMap::from([(labels::SNAPSHOT_REF.to_owned(), chain.clone())]);
            if remote {
                snap_labels.insert(labels::VIAL_REFERENCE.into(), pinned.to_string());
                snap_labels.insert(labels::VIAL_LAYER.into(), layer.digest.to_string());
            }
            let key = format!("extract-{}-{i} {chain}", uuid_like());
            let prepared = client
                .snapshots()
                .prepare(request(
                    PrepareSnapshotRequest {
                        snapshotter: options.snapshotter.into(),
                        key: key.clone(),
                        parent: parent.clone(),
                        labels: snap_labels,
                    },
                    options.namespace,
                    Some(&lease_id),
                ))
                .await;
            match prepared {
                Err(s) if s.code() == Code::AlreadyExists => {
                    let info = client
                        .snapshots()
                        .stat(request(
                            StatSnapshotRequest { snapshotter: options.snapshotter.into(), key: chain.clone() },
                            options.namespace,
                            None,
                        ))
                        .await
                        .map_err(cd(format!("the snapshot of layer {} after the snapshotter took it", layer.digest)))?;
                    if let Some(info) = &info.get_ref().info {
                        mountpoint = info.labels.get(labels::MOUNTPOINT).cloned();
                    }
                }
                Err(s) => return Err(cd(format!("preparing layer {}", layer.digest))(s)),
                Ok(response) if remote => {
                    drop(response);
                    remove_snapshot(&client, options, key).await;
                    return Err(PullError::Invalid(format!(
                        "snapshotter {:?} did not mount the volume layer itself: volumes need vial's snapshotter (vial snapshotter, and --snapshotter NAME as containerd knows it)",
                        options.snapshotter
                    )));
                }
                Ok(response) => {
                    let mounts = response.into_inner().mounts;
                    let blob = registry.get_blob(repo, &layer.digest, None).await?;
                    write_content(&client, options, &lease_id, &layer.digest, blob.to_vec(), HashMap::new()).await?;
                    let applied = client
                        .diff()
                        .apply(request(
                            ApplyRequest { diff: Some(descriptor(layer)), mounts, payloads: HashMap::new() },
                            options.namespace,
                            Some(&lease_id),
                        ))
                        .await;
                    // What was applied must be the layer the config names, or the snapshot would
                    // be committed under another layer's chain ID.
                    let applied = applied.and_then(|r| {
                        let got = r.into_inner().applied.map(|d| d.digest).unwrap_or_default();
                        if got == parsed.rootfs.diff_ids[i] {
                            Ok(())
                        } else {
                            Err(containerd_client::tonic::Status::data_loss(format!(
                                "layer {} unpacks to {got}, not the diff ID {} its config names",
                                layer.digest, parsed.rootfs.diff_ids[i]
                            )))
                        }
                    });
                    let committed = match applied {
                        Ok(()) => client
                            .snapshots()
                            .commit(request(
                                CommitSnapshotRequest {
                                    snapshotter: options.snapshotter.into(),
                                    name: chain.clone(),
                                    key: key.clone(),
                                    labels: HashMap::from([(labels::SNAPSHOT_REF.to_owned(), chain.clone())]),
                                },
                                options.namespace,
                                Some(&lease_id),
                            ))
                            .await
                            .map(drop),
                        Err(e) => Err(e),
                    };
                    if let Err(s) = committed {
                        remove_snapshot(&client, options, key).await;
                        return Err(cd(format!("unpacking layer {}", layer.digest))(s));
                    }
                    unpacked += 1;
                }
            }
            parent = chain.clone();
        }
        let top = chains.last().cloned().unwrap_or_default();

        // The config holds the top snapshot against garbage collection, as containerd's unpack does.
        let gc_label = format!("containerd.io/gc.ref.snapshot.{}", options.snapshotter);
        client
            .content()
            .update(request(
                UpdateContentRequest {
                    info: Some(ContentInfo {
                        digest: image.config.digest.to_string(),
                        labels: HashMap::from([(gc_label.clone(), top.clone())]),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask { paths: vec![format!("labels.{gc_label}")] }),
                },
                options.namespace,
                None,
            ))
            .await
            .map_err(cd("labelling the image config"))?;

        let record = Image {
            name: reference.to_string(),
            labels: HashMap::new(),
            target: Some(CdDescriptor {
                media_type: root.media_type.clone(),
                digest: root.digest.to_string(),
                size: root.bytes.len() as i64,
                annotations: HashMap::new(),
            }),
            created_at: None,
            updated_at: None,
        };
        let created = client
            .images()
            .create(request(CreateImageRequest { image: Some(record.clone()) }, options.namespace, None))
            .await;
        match created {
            Ok(_) => {}
            Err(s) if s.code() == Code::AlreadyExists => {
                client
                    .images()
                    .update(request(
                        UpdateImageRequest {
                            image: Some(record),
                            update_mask: Some(prost_types::FieldMask { paths: vec!["target".into()] }),
                        },
                        options.namespace,
                        None,
                    ))
                    .await
                    .map_err(cd("updating the image record"))?;
            }
            Err(s) => return Err(cd("creating the image record")(s)),
        }
        Ok(PullReport {
            image: reference.to_string(),
            digest: root.digest.to_string(),
            chain_id: top,
            volume,
            mountpoint,
            layers_unpacked: unpacked,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
    .await;
    let _ = client
        .leases()
        .delete(request(
            DeleteLeaseRequest {
                id: lease_id,
                sync: false,
            },
            options.namespace,
            None,
        ))
        .await;
    outcome
}

/// A unique enough suffix for keys and lease ids.
fn uuid_like() -> String {
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{nanos:x}-{:x}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_ids_follow_the_image_spec() {
        let a =
            "sha256:a3ed95caeb02ffe68cdd9fd84406680ae93d633cb16422d00e8a7c22955b46d4".to_owned();
        let b =
            "sha256:ec4b8955958665577945c89419d1af06b5f7636b4ac3da7f12184802ad867736".to_owned();
        let chains = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chains[0], a);
        // printf '%s' "$A $B" | sha256sum
        assert_eq!(
            chains[1],
            "sha256:7fda1ed1e9125802a30dad916a1053375d201232e09cdb5e687ecc61ac17525e"
        );
    }
}
