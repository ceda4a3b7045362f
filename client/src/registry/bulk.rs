//! Chunks in bulk (vial's pack extension, docs/format.md "Packs"): many new chunks uploaded in one
//! request, and many chunks read back in one. Registries without it answer 404 or 405, and the
//! callers fall back to one blob request per chunk.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::StatusCode;
use vial_core::{Digest, RepoName};

use super::{Registry, EXTENSION_NO, EXTENSION_YES};
use crate::error::ClientError;

/// The bytes of a bulk read, as they arrive.
pub type ChunkStream =
    std::pin::Pin<Box<dyn futures_util::Stream<Item = Result<Bytes, ClientError>> + Send>>;

impl Registry {
    /// Whether the registry is known not to take packs, so callers need not build one.
    pub fn packs_unsupported(&self) -> bool {
        self.inner.packs.load(Ordering::Relaxed) == EXTENSION_NO
    }

    /// Uploads `chunks` (digest and size, in order) whose bytes are `parts` end to end, as one
    /// pack. `Ok(false)` when the registry does not take packs: upload them one by one instead.
    pub async fn push_pack(
        &self,
        repo: &RepoName,
        chunks: &[(Digest, u64)],
        parts: Vec<Bytes>,
    ) -> Result<bool, ClientError> {
        if self.packs_unsupported() {
            return Ok(false);
        }
        let mut list = serde_json::to_vec(&serde_json::json!({ "chunks": chunks }))?;
        list.push(b'\n');
        let list = Bytes::from(list);
        let length = list.len() as u64 + parts.iter().map(|p| p.len() as u64).sum::<u64>();
        let url = self.url(&format!("/v2/{repo}/_vial/packs"));
        let action = format!("upload of a pack of {} chunks", chunks.len());
        let scope = Self::scope(repo, true);
        self.sign_in_before_body(&scope).await?;
        let r = self
            .send(&scope, &action, |c| {
                let body: Vec<Bytes> = std::iter::once(list.clone())
                    .chain(parts.iter().cloned())
                    .collect();
                c.post(&url)
                    .header("content-type", "application/vnd.vial.pack.v1")
                    .header("content-length", length)
                    .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
                        body.into_iter().map(Ok::<_, std::io::Error>),
                    )))
            })
            .await?;
        match r.status() {
            StatusCode::CREATED => {
                self.inner.packs.store(EXTENSION_YES, Ordering::Relaxed);
                Ok(true)
            }
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {
                self.inner.packs.store(EXTENSION_NO, Ordering::Relaxed);
                Ok(false)
            }
            _ => Err(self.error(r, &action).await),
        }
    }

    /// Makes sure a request about to carry a large body goes with credentials. A registry that
    /// lets anonymous clients read a repository answers the existence checks before a push
    /// without a challenge, so no token is held yet; a pack sent without one is refused with 401
    /// before it is read, and the connection closes under the body (a broken pipe, not a
    /// challenge to answer). Asking the API root, which wants a signed-in client, gets the token.
    async fn sign_in_before_body(&self, scope: &str) -> Result<(), ClientError> {
        let signed_in = self.inner.basic.load(Ordering::Relaxed) == 1
            || self
                .inner
                .tokens
                .lock()
                .is_ok_and(|t| t.contains_key(scope));
        if self.inner.credentials.is_none() || signed_in {
            return Ok(());
        }
        let url = self.url("/v2/");
        self.send_once(scope, &|c: &reqwest::Client| c.get(&url))
            .await
            .map(drop)
    }

    /// The bytes of `digests`, end to end in that order, in one response, unchecked. `Ok(None)`
    /// when the registry does not have the extension. For a proxy that passes the bytes on as they
    /// come (the registry's cache tier, which checks each chunk as it keeps it); a reader of
    /// chunks reads them in runs ([`Registry::read_run`]), which will not give a byte unverified.
    pub async fn read_chunks(
        &self,
        repo: &RepoName,
        digests: &[Digest],
    ) -> Result<Option<ChunkStream>, ClientError> {
        if self.inner.bulk_reads.load(Ordering::Relaxed) == EXTENSION_NO {
            return Ok(None);
        }
        let url = self.url(&format!("/v2/{repo}/_vial/chunks"));
        let body = Bytes::from(serde_json::to_vec(
            &serde_json::json!({ "digests": digests }),
        )?);
        let action = format!("read of {} chunks", digests.len());
        let r = self
            .send(&Self::scope(repo, false), &action, |c| {
                c.post(&url)
                    .header("content-type", "application/json")
                    .body(body.clone())
            })
            .await?;
        match r.status() {
            StatusCode::OK => {
                self.inner
                    .bulk_reads
                    .store(EXTENSION_YES, Ordering::Relaxed);
                let this = self.clone();
                Ok(Some(Box::pin(
                    r.bytes_stream()
                        .map(move |b| b.map_err(|e| this.transport(e))),
                )))
            }
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {
                let err = self.error(r, &action).await;
                match &err {
                    // The extension is there; a chunk is not.
                    ClientError::Registry { code, .. } if code == "BLOB_UNKNOWN" => Err(err),
                    _ => {
                        self.inner.bulk_reads.store(EXTENSION_NO, Ordering::Relaxed);
                        Ok(None)
                    }
                }
            }
            _ => Err(self.error(r, &action).await),
        }
    }
}
