//! Test data and setup steps: random blobs, repository names, manifests built from vial-core's
//! types, and the plain upload and push sequences that checks use to prepare a repository.

use std::collections::BTreeMap;

use reqwest::header::CONTENT_TYPE;
use reqwest::Method;
use sha2::{Digest as _, Sha256};
use vial_core::manifest::{Descriptor, ImageIndex, ImageManifest};
use vial_core::media::{OCI_EMPTY, OCI_INDEX, OCI_MANIFEST};
use vial_core::{Algorithm, Digest};

use crate::check::{fail, Problem};
use crate::client::{add_query, Client};
use crate::config::{suffix, Config};
use crate::expect;

/// The media type given to the random layers the suite uploads.
pub(crate) const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar";

/// The content of the OCI empty descriptor.
pub(crate) const EMPTY_JSON: &[u8] = b"{}";

/// What every check gets: the HTTP client and the configuration.
#[derive(Debug)]
pub(crate) struct Ctx<'a> {
    pub client: Client,
    pub config: &'a Config,
}

impl Ctx<'_> {
    /// A fresh repository name under the configured namespace, e.g. `conformance/x1/push-3fa2c9d1`.
    pub(crate) fn repo(&self, area: &str) -> String {
        join_repo(&self.config.namespace, area)
    }

    /// A fresh repository name under the cross-mount namespace (or the namespace if none is set).
    pub(crate) fn mount_source_repo(&self, area: &str) -> String {
        let ns = self
            .config
            .cross_mount_namespace
            .as_deref()
            .unwrap_or(&self.config.namespace);
        join_repo(ns, area)
    }
}

fn join_repo(namespace: &str, area: &str) -> String {
    let ns = namespace.trim_matches('/');
    if ns.is_empty() {
        format!("{area}-{}", suffix())
    } else {
        format!("{ns}/{area}-{}", suffix())
    }
}

/// `len` unpredictable bytes: SHA-256 in counter mode over a random seed.
pub(crate) fn random_bytes(len: usize) -> Vec<u8> {
    let seed = uuid::Uuid::new_v4();
    let mut out = Vec::with_capacity(len + 32);
    let mut counter: u64 = 0;
    while out.len() < len {
        let mut h = Sha256::new();
        h.update(seed.as_bytes());
        h.update(counter.to_le_bytes());
        out.extend_from_slice(&h.finalize());
        counter += 1;
    }
    out.truncate(len);
    out
}

/// A blob held in memory with its digest.
#[derive(Debug, Clone)]
pub(crate) struct Blob {
    pub bytes: Vec<u8>,
    pub digest: Digest,
}

impl Blob {
    pub(crate) fn new(bytes: Vec<u8>) -> Self {
        Blob::with_algorithm(bytes, Algorithm::Sha256)
    }

    pub(crate) fn with_algorithm(bytes: Vec<u8>, algorithm: Algorithm) -> Self {
        let digest = algorithm.digest_bytes(&bytes);
        Blob { bytes, digest }
    }

    pub(crate) fn random(len: usize) -> Self {
        Blob::new(random_bytes(len))
    }

    pub(crate) fn len(&self) -> usize {
        self.bytes.len()
    }

    /// A descriptor for this blob with the given media type.
    pub(crate) fn descriptor(&self, media_type: &str) -> Descriptor {
        descriptor(media_type, self.digest.clone(), self.bytes.len() as u64)
    }
}

/// A descriptor with only the required fields set.
pub(crate) fn descriptor(media_type: &str, digest: Digest, size: u64) -> Descriptor {
    Descriptor {
        media_type: media_type.to_owned(),
        digest,
        size,
        urls: None,
        annotations: None,
        artifact_type: None,
        data: None,
        platform: None,
    }
}

/// The OCI empty descriptor (`{}`), used as the config of every image the suite pushes.
pub(crate) fn empty_config() -> Descriptor {
    Blob::new(EMPTY_JSON.to_vec()).descriptor(OCI_EMPTY)
}

/// A digest that names nothing any registry holds: the sha256 of fresh random bytes.
pub(crate) fn unknown_digest() -> Digest {
    Algorithm::Sha256.digest_bytes(&random_bytes(64))
}

/// A manifest's exact bytes, digest and media type.
#[derive(Debug, Clone)]
pub(crate) struct Manifest {
    pub bytes: Vec<u8>,
    pub digest: Digest,
    pub media_type: String,
}

impl Manifest {
    pub(crate) fn from_bytes(media_type: &str, bytes: Vec<u8>) -> Self {
        let digest = Algorithm::Sha256.digest_bytes(&bytes);
        Manifest {
            bytes,
            digest,
            media_type: media_type.to_owned(),
        }
    }

    fn from_json<T: serde::Serialize>(media_type: &str, value: &T) -> Result<Self, Problem> {
        match serde_json::to_vec(value) {
            Ok(bytes) => Ok(Manifest::from_bytes(media_type, bytes)),
            Err(e) => fail(format!("cannot serialise a manifest: {e}")),
        }
    }

    /// A descriptor for this manifest.
    pub(crate) fn descriptor(&self) -> Descriptor {
        descriptor(
            &self.media_type,
            self.digest.clone(),
            self.bytes.len() as u64,
        )
    }
}

/// The optional parts of an image manifest.
#[derive(Debug, Clone, Default)]
pub(crate) struct ImageParts {
    pub artifact_type: Option<String>,
    pub subject: Option<Descriptor>,
    pub annotations: BTreeMap<String, String>,
}

/// An OCI image manifest over the given config and layers.
pub(crate) fn image_manifest(
    config: Descriptor,
    layers: Vec<Descriptor>,
    parts: ImageParts,
) -> Result<Manifest, Problem> {
    let manifest = ImageManifest {
        schema_version: 2,
        media_type: Some(OCI_MANIFEST.to_owned()),
        artifact_type: parts.artifact_type,
        config,
        layers,
        subject: parts.subject,
        annotations: if parts.annotations.is_empty() {
            None
        } else {
            Some(parts.annotations)
        },
    };
    Manifest::from_json(OCI_MANIFEST, &manifest)
}

/// An OCI image index over the given manifests.
pub(crate) fn image_index(
    manifests: Vec<Descriptor>,
    annotations: BTreeMap<String, String>,
) -> Result<Manifest, Problem> {
    let index = ImageIndex {
        schema_version: 2,
        media_type: Some(OCI_INDEX.to_owned()),
        artifact_type: None,
        manifests,
        subject: None,
        annotations: if annotations.is_empty() {
            None
        } else {
            Some(annotations)
        },
    };
    Manifest::from_json(OCI_INDEX, &index)
}

/// An annotation map with one entry that makes a manifest unique.
pub(crate) fn unique_annotations() -> BTreeMap<String, String> {
    let mut map = BTreeMap::new();
    map.insert(
        "org.vial.conformance.nonce".to_owned(),
        uuid::Uuid::new_v4().to_string(),
    );
    map
}

/// Uploads a blob by `POST` then `PUT`, the sequence every registry must support. Returns the
/// `PUT` response (201 already checked).
pub(crate) async fn upload(
    client: &Client,
    repo: &str,
    blob: &Blob,
) -> Result<crate::client::Response, Problem> {
    let started = client.post_upload(repo, &[]).await?;
    expect::status(&started, 202)?;
    let mut url = client.resolve(expect::location(&started)?)?;
    add_query(&mut url, &[("digest", blob.digest.as_str())]);
    let done = client
        .send(
            client
                .request(Method::PUT, url)
                .header(CONTENT_TYPE, "application/octet-stream")
                .body(blob.bytes.clone()),
        )
        .await?;
    expect::status(&done, 201)?;
    Ok(done)
}

/// Uploads the empty config blob, unless the repository already holds it.
pub(crate) async fn ensure_empty_config(client: &Client, repo: &str) -> Result<(), Problem> {
    let config = Blob::new(EMPTY_JSON.to_vec());
    let head = client
        .blob(Method::HEAD, repo, config.digest.as_str(), None)
        .await?;
    if head.status == 200 {
        return Ok(());
    }
    upload(client, repo, &config).await.map(|_| ())
}

/// Pushes a manifest and requires `201 Created`.
pub(crate) async fn push(
    client: &Client,
    repo: &str,
    reference: &str,
    manifest: &Manifest,
) -> Result<crate::client::Response, Problem> {
    let resp = client
        .put_manifest(
            repo,
            reference,
            &manifest.media_type,
            manifest.bytes.clone(),
            &[],
        )
        .await?;
    expect::status(&resp, 201)?;
    Ok(resp)
}

/// An image pushed by [`push_image`].
#[derive(Debug, Clone)]
pub(crate) struct Image {
    pub manifest: Manifest,
}

/// Builds an image (empty config, one random layer of `layer_len` bytes, a unique annotation),
/// uploads its blobs and pushes it under `reference` (a tag, or `None` to push by digest).
pub(crate) async fn push_image(
    client: &Client,
    repo: &str,
    reference: Option<&str>,
    layer_len: usize,
) -> Result<Image, Problem> {
    ensure_empty_config(client, repo).await?;
    let layer = Blob::random(layer_len);
    upload(client, repo, &layer).await?;
    let manifest = image_manifest(
        empty_config(),
        vec![layer.descriptor(LAYER_MEDIA_TYPE)],
        ImageParts {
            annotations: unique_annotations(),
            ..ImageParts::default()
        },
    )?;
    let reference = reference.map_or_else(|| manifest.digest.to_string(), str::to_owned);
    push(client, repo, &reference, &manifest).await?;
    Ok(Image { manifest })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_bytes_have_the_asked_length_and_differ() {
        for len in [0, 1, 31, 32, 33, 1000] {
            assert_eq!(random_bytes(len).len(), len);
        }
        assert_ne!(random_bytes(64), random_bytes(64));
    }

    #[test]
    fn empty_config_matches_the_well_known_digest() {
        let d = empty_config();
        assert_eq!(d.digest.as_str(), vial_core::media::OCI_EMPTY_DIGEST);
        assert_eq!(d.size, 2);
        assert_eq!(d.media_type, OCI_EMPTY);
    }

    #[test]
    fn manifests_serialise_with_media_type_and_digest() {
        let layer = Blob::new(b"abc".to_vec());
        let m = image_manifest(
            empty_config(),
            vec![layer.descriptor(LAYER_MEDIA_TYPE)],
            ImageParts::default(),
        )
        .unwrap_or_else(|_| Manifest::from_bytes(OCI_MANIFEST, Vec::new()));
        let v: serde_json::Value = serde_json::from_slice(&m.bytes).unwrap_or_default();
        assert_eq!(v["schemaVersion"], 2);
        assert_eq!(v["mediaType"], OCI_MANIFEST);
        assert_eq!(v["layers"][0]["size"], 3);
        assert!(v.get("annotations").is_none());
        assert_eq!(m.digest, Algorithm::Sha256.digest_bytes(&m.bytes));
    }

    #[test]
    fn repo_names_are_fresh_and_under_the_namespace() {
        let a = join_repo("conformance/run1/", "push");
        let b = join_repo("conformance/run1", "push");
        assert!(a.starts_with("conformance/run1/push-"));
        assert_ne!(a, b);
        assert!(join_repo("", "x").starts_with("x-"));
    }
}
