//! Sources made of files: an S3 bucket prefix and a Hugging Face Hub repository. Each lists its
//! files with a version per file (an ETag, a content hash), and opens one for reading.

use std::pin::Pin;
use std::time::Duration;

use futures_util::TryStreamExt;
use tokio::io::AsyncRead;
use tokio_util::io::StreamReader;

use super::spec::SyncError;
use crate::config::{Secret, SyncSource};

/// A file of the source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// The path in the volume: the key or file name relative to the source.
    pub path: String,
    pub size: u64,
    /// Which copy of the file this is; a file whose version changed is copied again.
    pub version: String,
    /// Where to read it: the object key, or the download URL at the listed commit.
    location: String,
}

pub type Reader = Pin<Box<dyn AsyncRead + Send>>;

pub enum Remote {
    S3(S3Source),
    /// The Hub source and the revision the job asked for.
    Hub(HubSource, String),
}

impl Remote {
    /// The files, and the revision they were listed at (for a source that has revisions).
    /// `pinned` is the revision an earlier attempt listed.
    pub async fn list(
        &self,
        pinned: Option<&str>,
    ) -> Result<(Option<String>, Vec<RemoteFile>), SyncError> {
        match self {
            Remote::S3(s3) => Ok((None, s3.list().await?)),
            Remote::Hub(hub, revision) => {
                let (sha, files) = hub.list(pinned.unwrap_or(revision)).await?;
                Ok((Some(sha), files))
            }
        }
    }

    pub async fn open(&self, file: &RemoteFile) -> Result<Reader, SyncError> {
        match self {
            Remote::S3(s3) => s3.open(file).await,
            Remote::Hub(hub, _) => hub.open(file).await,
        }
    }
}

fn reveal(secret: &Option<Secret>, what: &str) -> Result<Option<String>, SyncError> {
    secret
        .as_ref()
        .map(|s| {
            s.reveal()
                .map_err(|e| SyncError::Invalid(format!("the sync source's {what}: {e}")))
        })
        .transpose()
}

/// Objects under a prefix of a bucket.
pub struct S3Source {
    client: aws_sdk_s3::Client,
    bucket: String,
    /// The key prefix, with a trailing `/` unless empty.
    prefix: String,
}

impl S3Source {
    /// A client for the bucket: endpoint, region and credentials from the sync source's entry,
    /// and the registry's own AWS environment for whatever the entry leaves out.
    pub async fn connect(
        entry: &SyncSource,
        bucket: &str,
        prefix: &str,
    ) -> Result<S3Source, SyncError> {
        let key_id = reveal(&entry.access_key_id, "access-key-id")?;
        let secret = reveal(&entry.secret_access_key, "secret-access-key")?;
        let credentials = match (key_id, secret) {
            (Some(id), Some(secret)) => Some(aws_sdk_s3::config::Credentials::new(
                id,
                secret,
                None,
                None,
                "vial-sync-source",
            )),
            (None, None) => None,
            _ => {
                return Err(SyncError::Invalid(
                    "the sync source names only one of access-key-id and secret-access-key".into(),
                ))
            }
        };
        let client = crate::storage::s3::client(&crate::storage::s3::ClientSettings {
            endpoint: entry.endpoint.as_deref(),
            region: entry.region.as_deref(),
            path_style: entry.path_style,
            credentials,
            read_timeout: Duration::from_secs(60),
            count_requests: None,
        })
        .await;
        let mut prefix = prefix.trim_matches('/').to_owned();
        if !prefix.is_empty() {
            prefix.push('/');
        }
        Ok(S3Source {
            client,
            bucket: bucket.to_owned(),
            prefix,
        })
    }

    async fn list(&self) -> Result<Vec<RemoteFile>, SyncError> {
        let mut files = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&self.prefix)
                .set_continuation_token(token.take())
                .send()
                .await
                .map_err(|e| {
                    s3_error(&format!("listing s3://{}/{}", self.bucket, self.prefix), e)
                })?;
            for object in page.contents() {
                let Some(key) = object.key() else { continue };
                let Some(path) = key.strip_prefix(&self.prefix) else {
                    continue;
                };
                // Folder markers some tools create: the tree has its directories already.
                if path.is_empty() || path.ends_with('/') {
                    continue;
                }
                let size = u64::try_from(object.size().unwrap_or(0)).unwrap_or(0);
                let version = object
                    .e_tag()
                    .map(str::to_owned)
                    .or_else(|| object.last_modified().map(|t| t.to_string()))
                    .unwrap_or_default();
                files.push(RemoteFile {
                    path: path.to_owned(),
                    size,
                    version: format!("{version}/{size}"),
                    location: key.to_owned(),
                });
            }
            match page.next_continuation_token() {
                Some(next) if page.is_truncated() == Some(true) => token = Some(next.to_owned()),
                _ => break,
            }
        }
        Ok(files)
    }

    async fn open(&self, file: &RemoteFile) -> Result<Reader, SyncError> {
        let mut request = self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&file.location);
        // Read the object that was listed: one replaced since fails, and the next attempt lists
        // it again.
        if let Some((etag, _)) = file.version.rsplit_once('/') {
            if etag.starts_with('"') {
                request = request.if_match(etag);
            }
        }
        let object = request.send().await.map_err(|e| {
            s3_error(
                &format!("reading s3://{}/{}", self.bucket, file.location),
                e,
            )
        })?;
        Ok(Box::pin(object.body.into_async_read()))
    }
}

fn s3_error<E, R>(context: &str, e: aws_sdk_s3::error::SdkError<E, R>) -> SyncError
where
    E: std::error::Error + aws_sdk_s3::error::ProvideErrorMetadata + Send + Sync + 'static,
    R: std::fmt::Debug,
{
    use aws_sdk_s3::error::{DisplayErrorContext, SdkError};
    // What the blob store retries, and an object replaced since it was listed (the conditional
    // read's 412): the next attempt lists it again.
    let transient = crate::storage::s3::is_transient(&e)
        || matches!(&e, SdkError::ServiceError(s) if s.err().code() == Some("PreconditionFailed"));
    SyncError::source(format!("{context}: {}", DisplayErrorContext(&e)), transient)
}

/// A Hugging Face Hub repository (or a mirror of the Hub's HTTP API).
pub struct HubSource {
    http: reqwest::Client,
    endpoint: String,
    /// `models` or `datasets`.
    kind: &'static str,
    repo: String,
    token: Option<String>,
}

/// The Hub's answer to `GET /api/{kind}/{repo}/revision/{revision}?blobs=true`.
#[derive(serde::Deserialize)]
struct HubRevision {
    #[serde(default)]
    sha: Option<String>,
    #[serde(default)]
    siblings: Vec<HubFile>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct HubFile {
    rfilename: String,
    #[serde(default)]
    size: Option<u64>,
    #[serde(default)]
    blob_id: Option<String>,
    #[serde(default)]
    lfs: Option<HubLfs>,
}

#[derive(serde::Deserialize)]
struct HubLfs {
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    size: Option<u64>,
}

impl HubSource {
    pub fn new(entry: &SyncSource, kind: &'static str, repo: &str) -> Result<HubSource, SyncError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .read_timeout(Duration::from_secs(60))
            .user_agent(concat!("vial/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| SyncError::Invalid(format!("cannot build an HTTP client: {e}")))?;
        Ok(HubSource {
            http,
            endpoint: entry
                .endpoint
                .clone()
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .to_owned(),
            kind,
            repo: repo.to_owned(),
            token: reveal(&entry.token, "token")?,
        })
    }

    fn get(&self, url: &str) -> reqwest::RequestBuilder {
        let request = self.http.get(url);
        match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        }
    }

    /// Files at `revision`, and the commit it resolved to.
    async fn list(&self, revision: &str) -> Result<(String, Vec<RemoteFile>), SyncError> {
        let url = format!(
            "{}/api/{}/{}/revision/{}?blobs=true",
            self.endpoint,
            self.kind,
            self.repo,
            encode(revision)
        );
        let what = format!("{} {}@{revision}", self.kind, self.repo);
        let response = self
            .get(&url)
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| SyncError::source(format!("asking the Hub for {what}: {e}"), true))?;
        let response = check(response, &what)?;
        let listing: HubRevision = response
            .json()
            .await
            .map_err(|e| SyncError::source(format!("the Hub's listing of {what}: {e}"), true))?;
        let sha = listing.sha.unwrap_or_else(|| revision.to_owned());
        let mut files = Vec::with_capacity(listing.siblings.len());
        for f in listing.siblings {
            let size = match f.size.or_else(|| f.lfs.as_ref().and_then(|l| l.size)) {
                Some(size) => size,
                None => self.size_of(&sha, &f.rfilename).await?,
            };
            let version = f
                .lfs
                .and_then(|l| l.sha256)
                .or(f.blob_id)
                .unwrap_or_else(|| sha.clone());
            files.push(RemoteFile {
                location: self.file_url(&sha, &f.rfilename),
                path: f.rfilename,
                size,
                version,
            });
        }
        Ok((sha, files))
    }

    fn file_url(&self, revision: &str, path: &str) -> String {
        let prefix = if self.kind == "datasets" {
            "datasets/"
        } else {
            ""
        };
        let path: Vec<String> = path.split('/').map(encode).collect();
        format!(
            "{}/{prefix}{}/resolve/{}/{}",
            self.endpoint,
            self.repo,
            encode(revision),
            path.join("/")
        )
    }

    /// The size of a file the listing gave none for: what a HEAD of its download says.
    async fn size_of(&self, revision: &str, path: &str) -> Result<u64, SyncError> {
        let url = self.file_url(revision, path);
        let request = self.http.head(&url);
        let request = match &self.token {
            Some(token) => request.bearer_auth(token),
            None => request,
        };
        let response = request
            .timeout(Duration::from_secs(60))
            .send()
            .await
            .map_err(|e| {
                SyncError::source(format!("asking the Hub for the size of {path}: {e}"), true)
            })?;
        let response = check(response, path)?;
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u64>().ok())
        };
        header("x-linked-size")
            .or_else(|| header("content-length"))
            .ok_or_else(|| SyncError::source(format!("the Hub gave no size for {path}"), false))
    }

    async fn open(&self, file: &RemoteFile) -> Result<Reader, SyncError> {
        // The listing's URL names the commit it resolved: every file comes from one revision.
        let response = self
            .get(&file.location)
            .send()
            .await
            .map_err(|e| SyncError::source(format!("downloading {}: {e}", file.path), true))?;
        let response = check(response, &file.path)?;
        let stream = response.bytes_stream().map_err(std::io::Error::other);
        Ok(Box::pin(StreamReader::new(stream)))
    }
}

/// Turns a Hub response into an error that says what to do about it.
fn check(response: reqwest::Response, what: &str) -> Result<reqwest::Response, SyncError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let code = status.as_u16();
    Err(match code {
        401 | 403 => SyncError::Invalid(format!(
            "the Hub refused {what} ({status}): a private or gated repository needs a token in the registry's [[sync-sources]] entry"
        )),
        404 => SyncError::Invalid(format!("the Hub has no {what} ({status})")),
        _ => SyncError::source(
            format!("the Hub answered {status} for {what}"),
            code >= 500 || code == 429,
        ),
    })
}

/// Percent-encodes a URL path segment.
fn encode(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for b in segment.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_segments_are_percent_encoded() {
        assert_eq!(encode("model-00001.safetensors"), "model-00001.safetensors");
        assert_eq!(encode("refs/pr/1"), "refs%2Fpr%2F1");
        assert_eq!(encode("a b+ü"), "a%20b%2B%C3%BC");
    }
}
