//! OCI manifest and index types, and the summary a registry needs to store and check one.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{media, Digest};

/// A content descriptor as defined by the image-spec.
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
    pub subject: Option<Descriptor>,
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

/// Parses a manifest pushed with the given `Content-Type` (if any) and summarises it.
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
    let malformed = |e: serde_json::Error| ManifestError::Malformed {
        media_type: media_type.clone(),
        reason: e.to_string(),
    };
    match media_type.as_str() {
        media::OCI_MANIFEST | media::DOCKER_MANIFEST => {
            let m: ImageManifest = serde_json::from_slice(bytes).map_err(malformed)?;
            if m.schema_version != 2 {
                return Err(ManifestError::SchemaVersion(m.schema_version));
            }
            let mut blobs = vec![Referenced::from(&m.config)];
            blobs.extend(
                m.layers
                    .iter()
                    .filter(|l| is_distributable(l))
                    .map(Referenced::from),
            );
            let artifact_type = m
                .artifact_type
                .clone()
                .or_else(|| Some(m.config.media_type.clone()));
            Ok(ManifestSummary {
                kind: ManifestKind::Image,
                media_type,
                artifact_type,
                subject: m.subject,
                blobs,
                children: Vec::new(),
                annotations: m.annotations,
            })
        }
        media::OCI_INDEX | media::DOCKER_MANIFEST_LIST => {
            let i: ImageIndex = serde_json::from_slice(bytes).map_err(malformed)?;
            if i.schema_version != 2 {
                return Err(ManifestError::SchemaVersion(i.schema_version));
            }
            Ok(ManifestSummary {
                kind: ManifestKind::Index,
                media_type,
                artifact_type: i.artifact_type,
                subject: i.subject,
                blobs: Vec::new(),
                children: i.manifests.iter().map(Referenced::from).collect(),
                annotations: i.annotations,
            })
        }
        other => Err(ManifestError::UnsupportedMediaType(other.to_owned())),
    }
}

/// Layers with external URLs or a non-distributable media type need not be in the registry.
fn is_distributable(d: &Descriptor) -> bool {
    d.urls.as_ref().is_none_or(|u| u.is_empty())
        && !media::NON_DISTRIBUTABLE_PREFIXES
            .iter()
            .any(|p| d.media_type.starts_with(p))
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
