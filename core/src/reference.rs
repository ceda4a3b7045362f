//! Full references to a volume version: `host[:port]/name[:tag][@digest]`.

use std::fmt;
use std::str::FromStr;

use crate::{Digest, DigestError, NameError, RepoName, Tag};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("reference {0:?} has no registry host: write it as host[:port]/name[:tag][@digest], e.g. localhost:5000/weights/my-model:prod")]
    MissingHost(String),
    #[error("invalid registry host {0:?}")]
    InvalidHost(String),
    #[error("invalid repository in reference {reference:?}")]
    Name {
        reference: String,
        #[source]
        source: NameError,
    },
    #[error("invalid tag in reference {reference:?}")]
    Tag {
        reference: String,
        #[source]
        source: NameError,
    },
    #[error("invalid digest in reference {reference:?}")]
    Digest {
        reference: String,
        #[source]
        source: DigestError,
    },
}

/// A registry, a repository and optionally a tag and/or a digest.
///
/// Unlike Docker's references there is no default registry: vial volumes live on registries the user
/// names, so the first component is always the host.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Reference {
    registry: String,
    repo: RepoName,
    tag: Option<Tag>,
    digest: Option<Digest>,
}

/// What a reference points at, once the registry and repository are known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tag(Tag),
    Digest(Digest),
}

impl Reference {
    pub fn new(registry: &str, repo: RepoName, tag: Option<Tag>, digest: Option<Digest>) -> Self {
        Reference {
            registry: registry.to_owned(),
            repo,
            tag,
            digest,
        }
    }

    pub fn parse(s: &str) -> Result<Self, ReferenceError> {
        let (registry, rest) = s
            .split_once('/')
            .ok_or_else(|| ReferenceError::MissingHost(s.to_owned()))?;
        if !is_host(registry) {
            return Err(if registry.contains('.') || registry.contains(':') {
                ReferenceError::InvalidHost(registry.to_owned())
            } else {
                ReferenceError::MissingHost(s.to_owned())
            });
        }
        let (rest, digest) = match rest.split_once('@') {
            Some((r, d)) => (
                r,
                Some(Digest::parse(d).map_err(|source| ReferenceError::Digest {
                    reference: s.to_owned(),
                    source,
                })?),
            ),
            None => (rest, None),
        };
        // A colon after the last slash separates the tag; the host's port colon was split off above.
        let (name, tag) = match rest.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (
                n,
                Some(Tag::parse(t).map_err(|source| ReferenceError::Tag {
                    reference: s.to_owned(),
                    source,
                })?),
            ),
            _ => (rest, None),
        };
        let repo = RepoName::parse(name).map_err(|source| ReferenceError::Name {
            reference: s.to_owned(),
            source,
        })?;
        Ok(Reference {
            registry: registry.to_owned(),
            repo,
            tag,
            digest,
        })
    }

    pub fn registry(&self) -> &str {
        &self.registry
    }

    pub fn repo(&self) -> &RepoName {
        &self.repo
    }

    pub fn tag(&self) -> Option<&Tag> {
        self.tag.as_ref()
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// What to ask the registry for: the digest when pinned, else the tag, else `latest`.
    pub fn target(&self) -> Target {
        match (&self.digest, &self.tag) {
            (Some(d), _) => Target::Digest(d.clone()),
            (None, Some(t)) => Target::Tag(t.clone()),
            (None, None) => Target::Tag(Tag::parse("latest").unwrap_or_else(|_| unreachable!())),
        }
    }

    /// The same repository pinned at `digest`, without a tag: the form deployments should record.
    pub fn pinned(&self, digest: Digest) -> Reference {
        Reference {
            registry: self.registry.clone(),
            repo: self.repo.clone(),
            tag: None,
            digest: Some(digest),
        }
    }

    pub fn with_tag(&self, tag: Tag) -> Reference {
        Reference {
            registry: self.registry.clone(),
            repo: self.repo.clone(),
            tag: Some(tag),
            digest: None,
        }
    }
}

fn is_host(h: &str) -> bool {
    let (host, port) = match h.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (h, None),
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()));
    let host_ok = !host.is_empty()
        && host.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        });
    // Without a dot or port the first component is only a host if it is `localhost`, as in Docker;
    // otherwise `weights/x` would silently treat `weights` as a registry.
    let looks_like_host = host.contains('.') || port.is_some() || host == "localhost";
    port_ok && host_ok && looks_like_host
}

impl fmt::Display for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.registry, self.repo)?;
        if let Some(tag) = &self.tag {
            write!(f, ":{tag}")?;
        }
        if let Some(digest) = &self.digest {
            write!(f, "@{digest}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Reference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reference({self})")
    }
}

impl FromStr for Reference {
    type Err = ReferenceError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Reference::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parses_host_port_name_tag_and_digest() {
        let r = Reference::parse(&format!("localhost:5000/weights/qwen3-8b:prod@{D}")).unwrap();
        assert_eq!(r.registry(), "localhost:5000");
        assert_eq!(r.repo().as_str(), "weights/qwen3-8b");
        assert_eq!(r.tag().unwrap().as_str(), "prod");
        assert_eq!(r.digest().unwrap().as_str(), D);
        assert_eq!(
            r.to_string(),
            format!("localhost:5000/weights/qwen3-8b:prod@{D}")
        );
    }

    #[test]
    fn untagged_reference_targets_latest() {
        let r = Reference::parse("registry.example.com/a/b").unwrap();
        assert_eq!(r.target(), Target::Tag(Tag::parse("latest").unwrap()));
        let pinned = r.pinned(Digest::parse(D).unwrap());
        assert_eq!(pinned.to_string(), format!("registry.example.com/a/b@{D}"));
    }

    #[test]
    fn reference_without_a_host_is_refused_with_a_hint() {
        assert!(matches!(
            Reference::parse("weights/model:prod"),
            Err(ReferenceError::MissingHost(_))
        ));
        assert!(matches!(
            Reference::parse("model"),
            Err(ReferenceError::MissingHost(_))
        ));
    }

    #[test]
    fn bad_parts_are_named() {
        assert!(matches!(
            Reference::parse("localhost:5000/Bad/Name"),
            Err(ReferenceError::Name { .. })
        ));
        assert!(matches!(
            Reference::parse("localhost:5000/a:.bad"),
            Err(ReferenceError::Tag { .. })
        ));
        assert!(matches!(
            Reference::parse("localhost:5000/a@sha256:nothex"),
            Err(ReferenceError::Digest { .. })
        ));
        assert!(matches!(
            Reference::parse("local:host:5000/a"),
            Err(ReferenceError::InvalidHost(_))
        ));
    }
}
