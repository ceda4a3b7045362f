//! Parse, then handle: a request path becomes a typed [`Endpoint`] before any handler runs.
//!
//! Repository names may have any number of `/` components, so paths are matched from the right: the
//! trailing segments name the resource and everything between `/v2/` and them is the repository.

use vial_core::{Digest, RepoName, Tag, Target};

use crate::error::{ApiError, ErrorCode};

/// A Distribution API endpoint with its path parameters parsed and validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v2/`
    Base,
    /// `/v2/_catalog`
    Catalog,
    /// `/v2/_vial/gc`: a garbage collection pass now (extension, administrators only).
    Gc,
    /// `/v2/_vial/gc/<id>`: a garbage collection pass that runs as a job (extension,
    /// administrators only).
    GcJob(String),
    /// `/v2/<name>/manifests/<reference>`
    Manifest(RepoName, Target),
    /// `/v2/<name>/manifests/<reference>` where the reference is neither a tag nor a digest: it
    /// names no manifest (404 on GET and HEAD), and cannot name a new one (400 on PUT).
    BadManifestReference(RepoName, String),
    /// `/v2/<name>/blobs/<digest>`
    Blob(RepoName, Digest),
    /// `/v2/<name>/blobs/uploads/`
    UploadStart(RepoName),
    /// `/v2/<name>/blobs/uploads/<id>`
    Upload(RepoName, String),
    /// `/v2/<name>/tags/list`
    TagsList(RepoName),
    /// `/v2/<name>/referrers/<digest>`
    Referrers(RepoName, Digest),
    /// `/v2/<name>/_vial/blobs/present`: vial's bulk existence check (extension).
    BlobsPresent(RepoName),
    /// `/v2/<name>/_vial/packs`: many chunks uploaded as one pack (extension).
    Packs(RepoName),
    /// `/v2/<name>/_vial/chunks`: many chunks read in one request (extension).
    Chunks(RepoName),
    /// `/v2/<name>/_vial/versions`: sealed volume versions (extension).
    Versions(RepoName),
    /// `/v2/<name>/_vial/seal/<digest>`: sealing an artifact into a volume (extension).
    Seal(RepoName, Digest),
    /// `/v2/<name>/_vial/restore/<digest>`: bringing back a deleted version (extension).
    Restore(RepoName, Digest),
    /// `/v2/<name>/_vial/leases/<digest>`: nodes that have a version mounted (extension).
    Leases(RepoName, Digest),
    /// `/v2/<name>/_vial/tags/<tag>/history`: every move of a tag (extension).
    TagHistory(RepoName, Tag),
    /// `/v2/<name>/_vial/tags/<tag>`: where a tag points, answered once it moves (extension).
    TagWatch(RepoName, Tag),
    /// `/v2/<name>/_vial/sync`: sync jobs into the repository (extension).
    Syncs(RepoName),
    /// `/v2/<name>/_vial/sync/<id>`: one sync job (extension).
    Sync(RepoName, String),
}

impl Endpoint {
    /// A short, low-cardinality label for metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Endpoint::Base => "base",
            Endpoint::Catalog => "catalog",
            Endpoint::Gc | Endpoint::GcJob(..) => "vial_gc",
            Endpoint::Manifest(..) | Endpoint::BadManifestReference(..) => "manifest",
            Endpoint::Blob(..) => "blob",
            Endpoint::UploadStart(..) => "upload_start",
            Endpoint::Upload(..) => "upload",
            Endpoint::TagsList(..) => "tags",
            Endpoint::Referrers(..) => "referrers",
            Endpoint::BlobsPresent(..) => "vial_blobs_present",
            Endpoint::Packs(..) => "vial_packs",
            Endpoint::Chunks(..) => "vial_chunks",
            Endpoint::Versions(..) => "vial_versions",
            Endpoint::Seal(..) => "vial_seal",
            Endpoint::Restore(..) => "vial_restore",
            Endpoint::Leases(..) => "vial_leases",
            Endpoint::TagHistory(..) => "vial_tag_history",
            Endpoint::TagWatch(..) => "vial_tag_watch",
            Endpoint::Syncs(..) | Endpoint::Sync(..) => "vial_sync",
        }
    }
}

/// Parses a request path. `None` means the path is not part of the API at all.
pub fn parse(path: &str) -> Option<Result<Endpoint, ApiError>> {
    let rest = path.strip_prefix("/v2")?;
    if rest.is_empty() || rest == "/" {
        return Some(Ok(Endpoint::Base));
    }
    let rest = rest.strip_prefix('/')?;
    if rest == "_catalog" {
        return Some(Ok(Endpoint::Catalog));
    }
    if rest == "_vial/gc" {
        return Some(Ok(Endpoint::Gc));
    }
    if let Some(id) = rest.strip_prefix("_vial/gc/") {
        if !id.is_empty() && !id.contains('/') {
            return Some(Ok(Endpoint::GcJob(id.to_owned())));
        }
    }
    let segments: Vec<&str> = rest.split('/').collect();
    let parsed = match segments.as_slice() {
        [name @ .., "tags", "list"] if !name.is_empty() => repo(name).map(Endpoint::TagsList),
        // `_vial` cannot be a repository component (components start with a letter or digit), so
        // these extension paths never shadow a repository.
        [name @ .., "_vial", "blobs", "present"] if !name.is_empty() => {
            repo(name).map(Endpoint::BlobsPresent)
        }
        [name @ .., "_vial", "versions"] if !name.is_empty() => repo(name).map(Endpoint::Versions),
        [name @ .., "_vial", "packs"] if !name.is_empty() => repo(name).map(Endpoint::Packs),
        [name @ .., "_vial", "chunks"] if !name.is_empty() => repo(name).map(Endpoint::Chunks),
        [name @ .., "_vial", "seal", digest] if !name.is_empty() => {
            repo(name).and_then(|r| Ok(Endpoint::Seal(r, parse_digest(digest)?)))
        }
        [name @ .., "_vial", "restore", digest] if !name.is_empty() => {
            repo(name).and_then(|r| Ok(Endpoint::Restore(r, parse_digest(digest)?)))
        }
        [name @ .., "_vial", "tags", tag, "history"] if !name.is_empty() => {
            repo(name).and_then(|r| {
                let t = Tag::parse(tag)
                    .map_err(|e| ApiError::bad_request(ErrorCode::TagInvalid, e.to_string()))?;
                Ok(Endpoint::TagHistory(r, t))
            })
        }
        [name @ .., "_vial", "tags", tag] if !name.is_empty() => repo(name).and_then(|r| {
            let t = Tag::parse(tag)
                .map_err(|e| ApiError::bad_request(ErrorCode::TagInvalid, e.to_string()))?;
            Ok(Endpoint::TagWatch(r, t))
        }),
        [name @ .., "_vial", "sync"] if !name.is_empty() => repo(name).map(Endpoint::Syncs),
        [name @ .., "_vial", "sync", id] if !name.is_empty() => {
            repo(name).map(|r| Endpoint::Sync(r, (*id).to_owned()))
        }
        [name @ .., "_vial", "leases", digest] if !name.is_empty() => {
            repo(name).and_then(|r| Ok(Endpoint::Leases(r, parse_digest(digest)?)))
        }
        [name @ .., "blobs", "uploads"] | [name @ .., "blobs", "uploads", ""]
            if !name.is_empty() =>
        {
            repo(name).map(Endpoint::UploadStart)
        }
        [name @ .., "blobs", "uploads", id] if !name.is_empty() => {
            repo(name).map(|r| Endpoint::Upload(r, (*id).to_owned()))
        }
        [name @ .., "blobs", digest] if !name.is_empty() => {
            repo(name).and_then(|r| Ok(Endpoint::Blob(r, parse_digest(digest)?)))
        }
        [name @ .., "manifests", reference] if !name.is_empty() => {
            repo(name).map(|r| match parse_target(reference) {
                Ok(target) => Endpoint::Manifest(r, target),
                Err(_) => Endpoint::BadManifestReference(r, (*reference).to_owned()),
            })
        }
        [name @ .., "referrers", digest] if !name.is_empty() => {
            repo(name).and_then(|r| Ok(Endpoint::Referrers(r, parse_digest(digest)?)))
        }
        _ => return None,
    };
    Some(parsed)
}

fn repo(components: &[&str]) -> Result<RepoName, ApiError> {
    let name = components.join("/");
    RepoName::parse(&name).map_err(|e| ApiError::bad_request(ErrorCode::NameInvalid, e.to_string()))
}

pub fn parse_digest(s: &str) -> Result<Digest, ApiError> {
    Digest::parse(s).map_err(|e| ApiError::bad_request(ErrorCode::DigestInvalid, e.to_string()))
}

/// A manifest reference is a digest if it contains a colon (tags cannot), else a tag.
pub fn parse_target(s: &str) -> Result<Target, ApiError> {
    if s.contains(':') {
        parse_digest(s).map(Target::Digest)
    } else {
        Tag::parse(s)
            .map(Target::Tag)
            .map_err(|e| ApiError::bad_request(ErrorCode::TagInvalid, e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    fn ok(path: &str) -> Endpoint {
        parse(path).unwrap().unwrap()
    }

    fn name(s: &str) -> RepoName {
        RepoName::parse(s).unwrap()
    }

    #[test]
    fn names_with_many_components_route_to_the_right_resource() {
        assert_eq!(ok("/v2/"), Endpoint::Base);
        assert_eq!(ok("/v2"), Endpoint::Base);
        assert_eq!(ok("/v2/_catalog"), Endpoint::Catalog);
        assert_eq!(ok("/v2/a/b/c/tags/list"), Endpoint::TagsList(name("a/b/c")));
        assert_eq!(
            ok(&format!("/v2/a/blobs/b/blobs/{D}")),
            Endpoint::Blob(name("a/blobs/b"), Digest::parse(D).unwrap())
        );
        assert_eq!(
            ok("/v2/x/manifests/y/blobs/uploads/"),
            Endpoint::UploadStart(name("x/manifests/y"))
        );
        assert_eq!(
            ok("/v2/w/blobs/uploads/1234-ab"),
            Endpoint::Upload(name("w"), "1234-ab".into())
        );
        assert_eq!(
            ok("/v2/tags/list/manifests/latest"),
            Endpoint::Manifest(
                name("tags/list"),
                Target::Tag(Tag::parse("latest").unwrap())
            )
        );
        assert_eq!(
            ok(&format!("/v2/r/referrers/{D}")),
            Endpoint::Referrers(name("r"), Digest::parse(D).unwrap())
        );
    }

    #[test]
    fn extension_paths_route_to_extensions() {
        assert_eq!(
            ok("/v2/w/m/_vial/blobs/present"),
            Endpoint::BlobsPresent(name("w/m"))
        );
        assert_eq!(
            ok("/v2/w/m/_vial/versions"),
            Endpoint::Versions(name("w/m"))
        );
        assert_eq!(ok("/v2/w/m/_vial/sync"), Endpoint::Syncs(name("w/m")));
        assert_eq!(
            ok("/v2/w/m/_vial/sync/0b5e"),
            Endpoint::Sync(name("w/m"), "0b5e".into())
        );
    }

    #[test]
    fn bad_parameters_are_typed_errors() {
        let err = |p: &str| parse(p).unwrap().unwrap_err().code;
        assert_eq!(err("/v2/UPPER/tags/list"), ErrorCode::NameInvalid);
        assert_eq!(err("/v2/a/blobs/sha256:xyz"), ErrorCode::DigestInvalid);
        for reference in [".bad", "md5:abc", ".INVALID_MANIFEST_NAME"] {
            assert_eq!(
                ok(&format!("/v2/a/manifests/{reference}")),
                Endpoint::BadManifestReference(name("a"), reference.into())
            );
        }
    }

    #[test]
    fn unrelated_paths_are_not_endpoints() {
        assert!(parse("/metrics").is_none());
        assert!(parse("/v2/a").is_none());
        assert!(parse("/v2/manifests/x").is_none());
        assert!(parse("/v2x/").is_none());
    }
}
