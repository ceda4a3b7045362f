//! OCI manifest and index types, and the summary a registry needs to store and check one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use oci_spec::image as oci;

use crate::{media, Digest};

// Reading a pushed manifest goes through oci-spec's types (`summarize`). Writing one does not:
// oci-spec keeps annotations in a `HashMap`, which serializes in no fixed order, and a vial
// version's digest must come out the same on every machine; its descriptors' platforms are also
// closed types where vial passes through whatever a source registry wrote. So the types vial writes
// manifests with are these small local ones, with `BTreeMap` annotations.

/// A content descriptor as defined by the image-spec./// A content descriptor as defined by the image-spec.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: Digest,
    pub size: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub urls: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<serde_json::Value>,
}

/// An image manifest (OCI or Docker schema 2; the shapes are the same).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageManifest {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

/// An image index (OCI or Docker manifest list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageIndex {
    pub schema_version: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub media_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_type: Option<String>,
    pub manifests: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<Descriptor>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("unsupported manifest media type {0:?}")]
    UnsupportedMediaType(String),
    #[error("manifest is not valid JSON for {media_type}: {reason}")]
    Malformed { media_type: String, reason: String },
    #[error("manifest mediaType {body:?} does not match Content-Type {header:?}")]
    MediaTypeMismatch { header: String, body: String },
    #[error("manifest schemaVersion is {0}, expected 2")]
    SchemaVersion(u32),
    #[error("manifest has no media type in its Content-Type or body")]
    MissingMediaType,
}

/// The kind of manifest, which decides what it references.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestKind {
    Image,
    Index,
}

/// Something a manifest points at: its digest and the size the manifest declares for it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Referenced {
    pub digest: Digest,
    pub size: u64,
}

impl From<&Descriptor> for Referenced {
    fn from(d: &Descriptor) -> Self {
        Referenced {
            digest: d.digest.clone(),
            size: d.size,
        }
    }
}

/// What a registry must know about a manifest to store it, check its references and answer the
/// referrers API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestSummary {
    pub kind: ManifestKind,
    pub media_type: String,
    /// `artifactType`, or for an image manifest without one, its config media type (the referrers
    /// API's rule).
    pub artifact_type: Option<String>,
    pub subject: Option<Referenced>,
    /// Blobs the registry must hold: config and distributable layers.
    pub blobs: Vec<Referenced>,
    /// Manifests an index points at.
    pub children: Vec<Referenced>,
    pub annotations: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Probe {
    #[serde(default)]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde::de::IgnoredAny>,
    #[serde(default)]
    config: Option<serde::de::IgnoredAny>,
}

/// Parses a manifest pushed with the given `Content-Type` (if any) and summarises it. The bytes
/// stay the truth: this only reads them (with oci-spec's types) for what a registry must check
/// and index, and unknown fields are neither refused nor lost.
pub fn summarize(
    content_type: Option<&str>,
    bytes: &[u8],
) -> Result<ManifestSummary, ManifestError> {
    let header = content_type
        .map(|ct| ct.split(';').next().unwrap_or("").trim())
        .filter(|ct| {
            !ct.is_empty() && *ct != "application/json" && *ct != "application/octet-stream"
        });
    let probe: Probe = serde_json::from_slice(bytes).map_err(|e| ManifestError::Malformed {
        media_type: header.unwrap_or("manifest").to_owned(),
        reason: e.to_string(),
    })?;
    if let (Some(h), Some(b)) = (header, probe.media_type.as_deref()) {
        if h != b {
            return Err(ManifestError::MediaTypeMismatch {
                header: h.to_owned(),
                body: b.to_owned(),
            });
        }
    }
    let media_type = match (header, probe.media_type.as_deref()) {
        (Some(h), _) => h.to_owned(),
        (None, Some(b)) => b.to_owned(),
        // Neither says: infer from the shape, as lenient registries do.
        (None, None) if probe.manifests.is_some() => media::OCI_INDEX.to_owned(),
        (None, None) if probe.config.is_some() => media::OCI_MANIFEST.to_owned(),
        (None, None) => return Err(ManifestError::MissingMediaType),
    };
    let malformed = |reason: String| ManifestError::Malformed {
        media_type: media_type.clone(),
        reason,
    };
    match media_type.as_str() {
        media::OCI_MANIFEST | media::DOCKER_MANIFEST => {
            let m: oci::ImageManifest =
                serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
            if m.schema_version() != 2 {
                return Err(ManifestError::SchemaVersion(m.schema_version()));
            }
            let mut blobs = vec![referenced(m.config()).map_err(malformed)?];
            for layer in m.layers().iter().filter(|l| is_distributable(l)) {
                blobs.push(referenced(layer).map_err(malformed)?);
            }
            let artifact_type = m
                .artifact_type()
                .as_ref()
                .unwrap_or(m.config().media_type())
                .to_string();
            let subject = m
                .subject()
                .as_ref()
                .map(referenced)
                .transpose()
                .map_err(malformed)?;
            Ok(ManifestSummary {
                kind: ManifestKind::Image,
                media_type: media_type.clone(),
                artifact_type: Some(artifact_type),
                subject,
                blobs,
                children: Vec::new(),
                annotations: sorted(m.annotations()),
            })
        }
        media::OCI_INDEX | media::DOCKER_MANIFEST_LIST => {
            let i: oci::ImageIndex =
                serde_json::from_slice(bytes).map_err(|e| malformed(e.to_string()))?;
            if i.schema_version() != 2 {
                return Err(ManifestError::SchemaVersion(i.schema_version()));
            }
            let subject = i
                .subject()
                .as_ref()
                .map(referenced)
                .transpose()
                .map_err(malformed)?;
            let children = i
                .manifests()
                .iter()
                .map(referenced)
                .collect::<Result<_, _>>()
                .map_err(malformed)?;
            Ok(ManifestSummary {
                kind: ManifestKind::Index,
                media_type: media_type.clone(),
                artifact_type: i.artifact_type().as_ref().map(ToString::to_string),
                subject,
                blobs: Vec::new(),
                children,
                annotations: sorted(i.annotations()),
            })
        }
        other => Err(ManifestError::UnsupportedMediaType(other.to_owned())),
    }
}

/// What a descriptor points at, with its digest held to the algorithms vial accepts.
fn referenced(d: &oci::Descriptor) -> Result<Referenced, String> {
    let digest = Digest::parse(d.digest().as_ref())
        .map_err(|e| format!("descriptor digest {}: {e}", d.digest()))?;
    Ok(Referenced {
        digest,
        size: d.size(),
    })
}

fn sorted(
    annotations: &Option<std::collections::HashMap<String, String>>,
) -> Option<BTreeMap<String, String>> {
    annotations
        .as_ref()
        .map(|a| a.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// Layers with external URLs or a non-distributable media type need not be in the registry.
fn is_distributable(d: &oci::Descriptor) -> bool {
    let media_type = d.media_type().to_string();
    d.urls().as_ref().is_none_or(|u| u.is_empty())
        && !media::NON_DISTRIBUTABLE_PREFIXES
            .iter()
            .any(|p| media_type.starts_with(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest_json(extra: &str) -> String {
        format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","config":{{"mediaType":"application/vnd.vial.test","digest":"{}","size":2}},"layers":[{{"mediaType":"application/octet-stream","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000001","size":5}}]{extra}}}"#,
            media::OCI_MANIFEST,
            media::OCI_EMPTY_DIGEST
        )
    }

    #[test]
    fn image_manifest_lists_config_and_layers() {
        let s = summarize(Some(media::OCI_MANIFEST), manifest_json("").as_bytes()).unwrap();
        assert_eq!(s.kind, ManifestKind::Image);
        assert_eq!(s.blobs.len(), 2);
        assert_eq!(
            s.artifact_type.as_deref(),
            Some("application/vnd.vial.test")
        );
        assert!(s.subject.is_none());
    }

    #[test]
    fn media_type_constants_are_oci_specs() {
        use oci_spec::image::MediaType;
        assert_eq!(MediaType::ImageManifest.to_string(), media::OCI_MANIFEST);
        assert_eq!(MediaType::ImageIndex.to_string(), media::OCI_INDEX);
        assert_eq!(MediaType::EmptyJSON.to_string(), media::OCI_EMPTY);
        assert_eq!(MediaType::ImageConfig.to_string(), media::OCI_CONFIG);
    }

    #[test]
    fn sizes_subjects_and_unknown_fields_are_read_without_loss() {
        let body = format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","config":{{"mediaType":"application/vnd.vial.test","digest":"{}","size":2,"data":"e30="}},"layers":[{{"mediaType":"application/vnd.oci.image.layer.nondistributable.v1.tar","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000002","size":9}},{{"mediaType":"x","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000003","size":7,"x-custom":[1,2]}}],"subject":{{"mediaType":"{}","digest":"{}","size":3}},"annotations":{{"b":"2","a":"1"}},"vendor":{{"any":"thing"}}}}"#,
            media::OCI_MANIFEST,
            media::OCI_EMPTY_DIGEST,
            media::OCI_MANIFEST,
            media::OCI_EMPTY_DIGEST
        );
        let s = summarize(None, body.as_bytes()).unwrap();
        // The non-distributable layer need not be in the registry; the others must, at their sizes.
        let sizes: Vec<u64> = s.blobs.iter().map(|b| b.size).collect();
        assert_eq!(sizes, [2, 7]);
        assert_eq!(s.subject.map(|r| r.size), Some(3));
        let keys: Vec<&String> = s.annotations.as_ref().unwrap().keys().collect();
        assert_eq!(keys, ["a", "b"], "annotations come back in a fixed order");
        // An algorithm vial does not accept is refused, not passed on.
        let md5 = body.replace(
            media::OCI_EMPTY_DIGEST,
            "md5:d41d8cd98f00b204e9800998ecf8427e",
        );
        assert!(summarize(None, md5.as_bytes()).is_err());
    }

    #[test]
    fn content_type_and_body_must_agree() {
        assert!(matches!(
            summarize(Some(media::OCI_INDEX), manifest_json("").as_bytes()),
            Err(ManifestError::MediaTypeMismatch { .. })
        ));
    }

    #[test]
    fn garbage_and_unknown_types_are_errors_not_panics() {
        assert!(summarize(Some(media::OCI_MANIFEST), b"{not json").is_err());
        assert!(summarize(Some(media::OCI_MANIFEST), b"{}").is_err());
        assert!(summarize(Some("text/plain"), b"{}").is_err());
        assert!(summarize(None, b"[]").is_err());
        assert!(summarize(None, b"{}").is_err());
    }

    #[test]
    fn index_lists_children_and_subject() {
        let body = format!(
            r#"{{"schemaVersion":2,"mediaType":"{}","artifactType":"application/x","manifests":[{{"mediaType":"{}","digest":"{}","size":2}}],"subject":{{"mediaType":"{}","digest":"{}","size":2}}}}"#,
            media::OCI_INDEX,
            media::OCI_MANIFEST,
            media::OCI_EMPTY_DIGEST,
            media::OCI_MANIFEST,
            media::OCI_EMPTY_DIGEST
        );
        let s = summarize(None, body.as_bytes()).unwrap();
        assert_eq!(s.kind, ManifestKind::Index);
        assert_eq!(s.children.len(), 1);
        assert!(s.subject.is_some());
        assert_eq!(s.artifact_type.as_deref(), Some("application/x"));
    }
}
