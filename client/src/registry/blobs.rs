//! The Distribution API's blob endpoints: existence and size, uploads (monolithic where the
//! registry takes them, a session otherwise), cross-repository mounts and downloads.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::{Method, StatusCode};
use vial_core::{Digest, RepoName};

use super::{Registry, MONOLITHIC_NO, MONOLITHIC_YES};
use crate::error::ClientError;

impl Registry {
    /// HEAD of a blob in `repo`.
    pub async fn blob_exists(&self, repo: &RepoName, digest: &Digest) -> Result<bool, ClientError> {
        let url = self.url(&format!("/v2/{repo}/blobs/{digest}"));
        let r = self
            .send(&Self::scope(repo, false), "blob check", |c| c.head(&url))
            .await?;
        match r.status() {
            s if s.is_success() => Ok(true),
            StatusCode::NOT_FOUND => Ok(false),
            _ => Err(self.error(r, &format!("HEAD blob {digest}")).await),
        }
    }

    /// Cross-repository mount. Returns whether the blob is now in `repo`.
    pub async fn mount_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        from: &RepoName,
    ) -> Result<bool, ClientError> {
        let url = self.url(&format!(
            "/v2/{repo}/blobs/uploads/?mount={digest}&from={from}"
        ));
        let r = self
            .send(&Self::scope(repo, true), "mount", |c| c.post(&url))
            .await?;
        match r.status() {
            StatusCode::CREATED => Ok(true),
            StatusCode::ACCEPTED => {
                // The registry opened an upload session instead; close it so it does not linger.
                if let Some(loc) = r.headers().get("location").and_then(|l| l.to_str().ok()) {
                    let loc = self.absolute(loc);
                    let _ = self
                        .send(&Self::scope(repo, true), "cancel", |c| c.delete(&loc))
                        .await;
                }
                Ok(false)
            }
            _ => Err(self.error(r, &format!("mount {digest} from {from}")).await),
        }
    }

    /// Uploads a blob held in memory: one request where the registry allows it, else POST then PUT.
    pub async fn push_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        body: Bytes,
    ) -> Result<(), ClientError> {
        let scope = Self::scope(repo, true);
        let action = format!("upload of {digest}");
        if self.inner.monolithic.load(Ordering::Relaxed) != MONOLITHIC_NO {
            let url = self.url(&format!("/v2/{repo}/blobs/uploads/?digest={digest}"));
            let r = self
                .send(&scope, &action, |c| {
                    c.post(&url)
                        .header("content-type", "application/octet-stream")
                        .body(body.clone())
                })
                .await?;
            match r.status() {
                StatusCode::CREATED => {
                    self.inner
                        .monolithic
                        .store(MONOLITHIC_YES, Ordering::Relaxed);
                    return Ok(());
                }
                StatusCode::ACCEPTED => {
                    // The registry ignored the body and opened a session: finish it with a PUT and
                    // use the two-request flow from now on.
                    self.inner
                        .monolithic
                        .store(MONOLITHIC_NO, Ordering::Relaxed);
                    let loc = r
                        .headers()
                        .get("location")
                        .and_then(|l| l.to_str().ok())
                        .map(|l| self.absolute(l));
                    let loc =
                        loc.ok_or_else(|| self.broke("an upload session without a Location"))?;
                    return self
                        .finish_upload(&scope, &action, &loc, digest, body)
                        .await;
                }
                _ => return Err(self.error(r, &action).await),
            }
        }
        let url = self.url(&format!("/v2/{repo}/blobs/uploads/"));
        let r = self.send(&scope, &action, |c| c.post(&url)).await?;
        if r.status() != StatusCode::ACCEPTED {
            return Err(self.error(r, &action).await);
        }
        let loc = r
            .headers()
            .get("location")
            .and_then(|l| l.to_str().ok())
            .map(|l| self.absolute(l));
        let loc = loc.ok_or_else(|| self.broke("an upload session without a Location"))?;
        self.finish_upload(&scope, &action, &loc, digest, body)
            .await
    }

    async fn finish_upload(
        &self,
        scope: &str,
        action: &str,
        location: &str,
        digest: &Digest,
        body: Bytes,
    ) -> Result<(), ClientError> {
        let sep = if location.contains('?') { '&' } else { '?' };
        let url = format!("{location}{sep}digest={digest}");
        let r = self
            .send(scope, action, |c| {
                c.put(&url)
                    .header("content-type", "application/octet-stream")
                    .body(body.clone())
            })
            .await?;
        if r.status() == StatusCode::CREATED {
            Ok(())
        } else {
            Err(self.error(r, action).await)
        }
    }

    /// Fetches a whole blob (or a byte range) and verifies a whole blob against its digest.
    pub async fn get_blob(
        &self,
        repo: &RepoName,
        digest: &Digest,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, ClientError> {
        let bytes = self.get_blob_unverified(repo, digest, range).await?;
        if range.is_none() {
            let actual = digest.algorithm().digest_bytes(&bytes);
            if &actual != digest {
                return Err(ClientError::DigestMismatch {
                    what: format!("blob in {repo}"),
                    expected: digest.clone(),
                    actual,
                });
            }
        }
        Ok(bytes)
    }

    /// Fetches a blob or a range of it without checking its digest: the caller must verify before
    /// using a byte (the mount does, off the async executor).
    pub(crate) async fn get_blob_unverified(
        &self,
        repo: &RepoName,
        digest: &Digest,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, ClientError> {
        self.again_if_cut_off(|| self.get_blob_once(repo, digest, range))
            .await
    }

    async fn get_blob_once(
        &self,
        repo: &RepoName,
        digest: &Digest,
        range: Option<(u64, u64)>,
    ) -> Result<Bytes, ClientError> {
        let url = self.url(&format!("/v2/{repo}/blobs/{digest}"));
        let action = format!("download of {digest}");
        let r = self
            .send(&Self::scope(repo, false), &action, |c| {
                let req = c.get(&url);
                match range {
                    Some((start, end)) => req.header("range", format!("bytes={start}-{}", end - 1)),
                    None => req,
                }
            })
            .await?;
        match r.status() {
            StatusCode::OK | StatusCode::PARTIAL_CONTENT => {}
            StatusCode::NOT_FOUND => {
                return Err(ClientError::NotFound(format!("blob {digest} in {repo}")))
            }
            _ => return Err(self.error(r, &action).await),
        }
        self.collect_aligned(r).await
    }

    /// Collects a response body into memory that starts on a page boundary. Hashing misaligned
    /// memory is markedly slower on the machines measured (docs/performance.md), and the node cache
    /// writes page-aligned buffers to disk without copying them. Alignment is kept when the body
    /// is no longer than its announced length (at most 64 MiB is reserved up front).
    async fn collect_aligned(&self, r: reqwest::Response) -> Result<Bytes, ClientError> {
        const ALIGN: usize = 4096;
        const MAX_RESERVE: u64 = 64 << 20;
        let hint = r.content_length().unwrap_or(0).min(MAX_RESERVE) as usize;
        let mut buf: Vec<u8> = Vec::with_capacity(hint + ALIGN);
        let start = buf.as_ptr().align_offset(ALIGN).min(ALIGN);
        buf.resize(start, 0);
        let mut body = r.bytes_stream();
        while let Some(frame) = body.next().await {
            buf.extend_from_slice(&frame.map_err(|e| self.transport(e))?);
        }
        Ok(Bytes::from(buf).slice(start..))
    }

    /// Streams a whole blob without holding it in memory. The caller verifies the digest of what
    /// it receives before using it.
    pub async fn get_blob_stream(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<impl futures_util::Stream<Item = Result<Bytes, ClientError>>, ClientError> {
        let url = self.url(&format!("/v2/{repo}/blobs/{digest}"));
        let action = format!("download of {digest}");
        let r = self
            .send(&Self::scope(repo, false), &action, |c| c.get(&url))
            .await?;
        match r.status() {
            StatusCode::OK => {}
            StatusCode::NOT_FOUND => {
                return Err(ClientError::NotFound(format!("blob {digest} in {repo}")))
            }
            _ => return Err(self.error(r, &action).await),
        }
        let this = self.clone();
        Ok(futures_util::StreamExt::map(r.bytes_stream(), move |b| {
            b.map_err(|e| this.transport(e))
        }))
    }

    /// The size of a blob in `repo`, `None` when the registry says it is not there.
    pub async fn blob_size(
        &self,
        repo: &RepoName,
        digest: &Digest,
    ) -> Result<Option<u64>, ClientError> {
        let url = self.url(&format!("/v2/{repo}/blobs/{digest}"));
        let r = self
            .send(&Self::scope(repo, false), "blob check", |c| {
                c.request(Method::HEAD, &url)
            })
            .await?;
        match r.status() {
            // The header itself: a HEAD answer has no body, so reqwest's length is 0.
            s if s.is_success() => r
                .headers()
                .get("content-length")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse().ok())
                .map(Some)
                .ok_or_else(|| self.broke(&format!("a HEAD of {digest} without a Content-Length"))),
            StatusCode::NOT_FOUND => Ok(None),
            _ => Err(self.error(r, &format!("HEAD blob {digest}")).await),
        }
    }
}
