//! Watching a tag: vial's tag watch (`GET /v2/<name>/_vial/tags/<tag>?since=…&wait=…`, answered
//! the moment the tag moves), and for any other registry the plain-OCI fallback of asking for the
//! manifest's digest with `HEAD` at an interval.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde::Deserialize;
use vial_core::{Digest, RepoName, Tag};

use super::{ErrorEnvelope, Registry};
use crate::error::ClientError;

/// Where a tag points: `None` when it does not exist.
pub type TagState = Option<Digest>;

impl Registry {
    /// Where `tag` points. With `since`, a vial registry holds the answer while the tag still
    /// points there (`Some(None)`: while it does not exist), up to `wait`, and answers the moment
    /// it moves. `Ok(None)` when the registry has no tag watch: use [`Registry::tag_digest`].
    pub async fn watch_tag(
        &self,
        repo: &RepoName,
        tag: &Tag,
        since: Option<&TagState>,
        wait: Duration,
    ) -> Result<Option<TagState>, ClientError> {
        let mut url = self.url(&format!("/v2/{repo}/_vial/tags/{tag}"));
        if let Some(since) = since {
            let since = since.as_ref().map_or("absent", Digest::as_str);
            url.push_str(&format!("?since={since}&wait={}", wait.as_secs_f64()));
        }
        let r = self
            .send(&Self::scope(repo, false), "tag watch", |c| c.get(&url))
            .await?;
        match r.status() {
            StatusCode::OK => {
                #[derive(Deserialize)]
                struct Answer {
                    digest: Digest,
                }
                let answer: Answer = r.json().await.map_err(|e| self.transport(e))?;
                Ok(Some(Some(answer.digest)))
            }
            StatusCode::NOT_FOUND => {
                // A missing tag is MANIFEST_UNKNOWN; a registry without the watch answers
                // something else (NAME_UNKNOWN for a path it reads as a repository, a plain 404).
                let body = r.bytes().await.unwrap_or_default();
                let code = serde_json::from_slice::<ErrorEnvelope>(&body)
                    .ok()
                    .and_then(|e| e.errors.into_iter().next())
                    .map(|e| e.code);
                Ok((code.as_deref() == Some("MANIFEST_UNKNOWN")).then_some(None))
            }
            StatusCode::METHOD_NOT_ALLOWED | StatusCode::BAD_REQUEST => Ok(None),
            _ => Err(self.error(r, &format!("tag watch of {repo}:{tag}")).await),
        }
    }

    /// Where `tag` points, from a `HEAD` of its manifest (any OCI registry).
    pub async fn tag_digest(&self, repo: &RepoName, tag: &Tag) -> Result<TagState, ClientError> {
        let url = self.url(&format!("/v2/{repo}/manifests/{tag}"));
        let accept = [
            vial_core::media::OCI_INDEX,
            vial_core::media::OCI_MANIFEST,
            vial_core::media::DOCKER_MANIFEST,
            vial_core::media::DOCKER_MANIFEST_LIST,
        ]
        .join(", ");
        let r = self
            .send(&Self::scope(repo, false), "tag lookup", |c| {
                c.request(Method::HEAD, &url).header("accept", &accept)
            })
            .await?;
        match r.status() {
            s if s.is_success() => {
                let digest = r
                    .headers()
                    .get("docker-content-digest")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|d| Digest::parse(d).ok());
                match digest {
                    Some(d) => Ok(Some(d)),
                    // No digest header: the manifest's own bytes say.
                    None => Ok(self
                        .get_manifest(repo, &vial_core::Target::Tag(tag.clone()))
                        .await?
                        .map(|m| m.digest)),
                }
            }
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.error(r, &format!("tag {tag} of {repo}")).await),
        }
    }
}
