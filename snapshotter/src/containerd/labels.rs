//! The snapshot labels vial reads and writes. containerd forwards to a proxy snapshotter only
//! `containerd.io/snapshot.ref` and labels under `containerd.io/snapshot/`, so vial's own live
//! there too.

use std::collections::HashMap;

/// The chain ID a prepared layer is to be committed as (set by containerd's unpacker).
pub const SNAPSHOT_REF: &str = "containerd.io/snapshot.ref";
/// The volume a layer belongs to, pinned: `host/name@sha256:…` (set by `vial containerd pull`).
pub const VIAL_REFERENCE: &str = "containerd.io/snapshot/vial.reference";
/// The layer's digest: the volume's tree blob (set by `vial containerd pull`).
pub const VIAL_LAYER: &str = "containerd.io/snapshot/vial.layer";
/// What containerd's CRI plugin sets when `disable_snapshot_annotations = false`, as for other
/// remote snapshotters: the image reference and the layer digest.
pub const CRI_IMAGE_REF: &str = "containerd.io/snapshot/cri.image-ref";
pub const CRI_LAYER_DIGEST: &str = "containerd.io/snapshot/cri.layer-digest";
/// Marks a snapshot the snapshotter serves from a remote volume.
pub const REMOTE: &str = "containerd.io/snapshot/remote";
/// Where a volume snapshot is mounted on the node (for bind-mounting it into containers).
pub const MOUNTPOINT: &str = "containerd.io/snapshot/vial.mountpoint";

/// A layer containerd asks the snapshotter to provide from a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteLayer {
    /// The chain ID to commit it as.
    pub target: String,
    pub reference: String,
    pub layer: String,
    /// Named by vial's own labels, so it must be a volume; CRI's labels name every layer of every
    /// image, and a layer that turns out not to be a volume's is unpacked as usual.
    pub explicit: bool,
}

impl RemoteLayer {
    /// The remote layer these labels describe, if they describe one: vial's labels, or the CRI
    /// plugin's for a layer whose media type containerd does not pass (a volume's tree).
    pub fn from_labels(labels: &HashMap<String, String>) -> Option<RemoteLayer> {
        let target = labels.get(SNAPSHOT_REF)?.clone();
        let (reference, layer, explicit) =
            match (labels.get(VIAL_REFERENCE), labels.get(VIAL_LAYER)) {
                (Some(r), Some(l)) => (r.clone(), l.clone(), true),
                _ => (
                    labels.get(CRI_IMAGE_REF)?.clone(),
                    labels.get(CRI_LAYER_DIGEST)?.clone(),
                    false,
                ),
            };
        Some(RemoteLayer {
            target,
            reference,
            layer,
            explicit,
        })
    }
}
