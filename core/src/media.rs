//! Media types vial reads and writes. They are `&str` constants rather than oci-spec's
//! `MediaType` because `match` arms and header values need constants; each OCI one equals
//! oci-spec's (a test in `manifest.rs` holds them to it).

pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_EMPTY: &str = "application/vnd.oci.empty.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Layer media types that the image-spec marks non-distributable; registries need not hold them.
pub const NON_DISTRIBUTABLE_PREFIXES: [&str; 2] = [
    "application/vnd.oci.image.layer.nondistributable.",
    "application/vnd.docker.image.rootfs.foreign.",
];

/// The digest of the OCI empty descriptor's content, `{}`.
pub const OCI_EMPTY_DIGEST: &str =
    "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";
