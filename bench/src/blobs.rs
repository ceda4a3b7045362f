//! Blob push and pull throughput: the two-request upload docker and skopeo use (POST, then PUT
//! with the whole body), streamed GETs with a client-side byte count, and curl downloads.

use std::future::Future;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE, LOCATION};
use reqwest::{Client, StatusCode, Url};
use tokio::task::JoinSet;

use crate::data::Blob;

/// One HTTP client (its own connection pool), never going through a proxy.
pub fn client() -> Result<Client> {
    Ok(Client::builder()
        .no_proxy()
        .connect_timeout(Duration::from_secs(10))
        .build()?)
}

/// Megabytes (10^6 bytes) per second.
pub fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / elapsed.as_secs_f64().max(1e-9) / 1e6
}

/// POST /v2/REPO/blobs/uploads/, then PUT the body to the returned location with ?digest=.
pub async fn push(
    client: &Client,
    base: &Url,
    repo: &str,
    digest: &str,
    body: reqwest::Body,
    len: u64,
) -> Result<()> {
    let start = base.join(&format!("v2/{repo}/blobs/uploads/"))?;
    let resp = client.post(start).header(CONTENT_LENGTH, 0).send().await?;
    let status = resp.status();
    let location = resp
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let text = resp.text().await.unwrap_or_default();
    if status != StatusCode::ACCEPTED {
        bail!("POST upload in {repo}: {status}: {text}");
    }
    let location = location.context("202 without a Location header")?;
    let mut url = base.join(&location)?;
    url.query_pairs_mut().append_pair("digest", digest);
    let resp = client
        .put(url)
        .header(CONTENT_TYPE, "application/octet-stream")
        .header(CONTENT_LENGTH, len)
        .body(body)
        .send()
        .await?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if status != StatusCode::CREATED {
        bail!("PUT upload of {digest}: {status}: {text}");
    }
    Ok(())
}

/// GET a blob, streaming the body and checking only how many bytes arrived.
pub async fn pull(client: &Client, base: &Url, repo: &str, blob: &Blob) -> Result<()> {
    let url = base.join(&format!("v2/{repo}/blobs/{}", blob.digest))?;
    let mut resp = client.get(url).send().await?;
    if resp.status() != StatusCode::OK {
        bail!("GET blob {}: {}", blob.digest, resp.status());
    }
    let mut got = 0u64;
    while let Some(chunk) = resp.chunk().await? {
        got += chunk.len() as u64;
    }
    if got != blob.len() {
        bail!(
            "GET blob {}: {got} bytes, expected {}",
            blob.digest,
            blob.len()
        );
    }
    Ok(())
}

/// Runs `op` once per blob with `concurrency` clients taking blobs from a shared queue; returns
/// MB/s over the wall time of the whole batch. `op` gets the client's number, so clients can be
/// spread over several replicas.
async fn batch<F, Fut>(blobs: &Arc<[Blob]>, concurrency: usize, op: F) -> Result<f64>
where
    F: Fn(Client, usize, Blob) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<()>> + Send + 'static,
{
    let total: u64 = blobs.iter().map(Blob::len).sum();
    let next = Arc::new(AtomicUsize::new(0));
    let clients = (0..concurrency.max(1))
        .map(|_| client())
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    let mut workers = JoinSet::new();
    for (n, client) in clients.into_iter().enumerate() {
        let (blobs, next, op) = (Arc::clone(blobs), Arc::clone(&next), op.clone());
        workers.spawn(async move {
            while let Some(blob) = blobs.get(next.fetch_add(1, Ordering::Relaxed)) {
                op(client.clone(), n, blob.clone()).await?;
            }
            Ok::<(), anyhow::Error>(())
        });
    }
    while let Some(done) = workers.join_next().await {
        done??;
    }
    Ok(mb_per_s(total, started.elapsed()))
}

/// Pushes every blob; client `n` talks to `bases[n % bases.len()]`.
pub async fn push_all(
    bases: &[Url],
    repo: &str,
    blobs: &Arc<[Blob]>,
    concurrency: usize,
) -> Result<f64> {
    let (bases, repo): (Arc<[Url]>, String) = (bases.into(), repo.to_string());
    batch(blobs, concurrency, move |client, n, blob| {
        let (base, repo) = (bases[n % bases.len()].clone(), repo.clone());
        async move {
            let len = blob.len();
            push(&client, &base, &repo, &blob.digest, blob.data.into(), len).await
        }
    })
    .await
}

/// Pulls every blob; client `n` talks to `bases[n % bases.len()]`.
pub async fn pull_all(
    bases: &[Url],
    repo: &str,
    blobs: &Arc<[Blob]>,
    concurrency: usize,
) -> Result<f64> {
    let (bases, repo): (Arc<[Url]>, String) = (bases.into(), repo.to_string());
    batch(blobs, concurrency, move |client, n, blob| {
        let (base, repo) = (bases[n % bases.len()].clone(), repo.clone());
        async move { pull(&client, &base, &repo, &blob).await }
    })
    .await
}

/// `curl -s -o /dev/null -w '%{size_download} %{time_total}' URL`, as MB/s.
pub async fn curl_fetch(curl: &Path, url: &Url, expect: u64) -> Result<f64> {
    let out = tokio::process::Command::new(curl)
        .args(["-s", "--noproxy", "*", "-o", "/dev/null"])
        .args(["-w", "%{http_code} %{size_download} %{time_total}"])
        .arg(url.as_str())
        .output()
        .await
        .with_context(|| format!("could not run {}", curl.display()))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let fields: Vec<&str> = text.split_whitespace().collect();
    let [code, size, time] = fields[..] else {
        bail!("unexpected curl output {text:?}");
    };
    let (size, time): (u64, f64) = (size.parse()?, time.parse()?);
    if code != "200" || size != expect {
        bail!("curl {url}: HTTP {code}, {size} bytes, expected {expect}");
    }
    Ok(size as f64 / time.max(1e-9) / 1e6)
}
