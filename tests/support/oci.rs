//! Builds OCI image layouts on disk, the input format of `skopeo copy oci:…`.

use std::path::Path;

use serde_json::json;
use vial_core::{media, Algorithm, Digest};

/// A deterministic pseudo-random byte buffer (xorshift), so tests need no rand dependency.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn write_blob(layout: &Path, bytes: &[u8]) -> Digest {
    let digest = Algorithm::Sha256.digest_bytes(bytes);
    let dir = layout.join("blobs/sha256");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join(digest.hex()), bytes).unwrap();
    digest
}

/// Creates the layout's directory and its `oci-layout` marker.
fn start_layout(layout: &Path) {
    std::fs::create_dir_all(layout).unwrap();
    std::fs::write(
        layout.join("oci-layout"),
        r#"{"imageLayoutVersion":"1.0.0"}"#,
    )
    .unwrap();
}

/// Stores `manifest` and makes it the layout's one image, tagged `tag`; returns its digest.
fn tag_manifest(layout: &Path, tag: &str, manifest: &[u8]) -> Digest {
    let manifest_digest = write_blob(layout, manifest);
    let index = json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_INDEX,
        "manifests": [{
            "mediaType": media::OCI_MANIFEST,
            "digest": manifest_digest,
            "size": manifest.len(),
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&index).unwrap(),
    )
    .unwrap();
    manifest_digest
}

/// Writes an OCI layout with one image manifest tagged `tag`, whose layers have the given sizes.
/// Returns the manifest's digest.
pub fn write_layout(layout: &Path, tag: &str, layer_sizes: &[usize], seed: u64) -> Digest {
    start_layout(layout);
    let config =
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}"#;
    let config_digest = write_blob(layout, config);
    let layers: Vec<_> = layer_sizes
        .iter()
        .enumerate()
        .map(|(i, &size)| {
            let bytes = pseudo_random(size, seed + i as u64);
            let digest = write_blob(layout, &bytes);
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": digest, "size": size})
        })
        .collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "config": {"mediaType": media::OCI_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": layers,
    }))
    .unwrap();
    tag_manifest(layout, tag, &manifest)
}

/// Writes an OCI layout with one runnable image tagged `tag`: one uncompressed tar layer and a
/// config whose diff ID is the layer's digest. Returns the manifest's digest.
pub fn write_image_layout(layout: &Path, tag: &str, layer: &[u8]) -> Digest {
    write_image_layout_running(layout, tag, layer, &[])
}

/// [`write_image_layout`] whose config runs `entrypoint` when a container starts without a
/// command of its own (a pod sandbox image).
pub fn write_image_layout_running(
    layout: &Path,
    tag: &str,
    layer: &[u8],
    entrypoint: &[&str],
) -> Digest {
    start_layout(layout);
    let layer_digest = write_blob(layout, layer);
    let mut run = json!({"Env": ["PATH=/bin"]});
    if !entrypoint.is_empty() {
        run["Entrypoint"] = json!(entrypoint);
    }
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": run,
        "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
    }))
    .unwrap();
    let config_digest = write_blob(layout, &config);
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": media::OCI_MANIFEST,
        "config": {"mediaType": media::OCI_CONFIG, "digest": config_digest, "size": config.len()},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer_digest, "size": layer.len()}],
    }))
    .unwrap();
    tag_manifest(layout, tag, &manifest)
}
