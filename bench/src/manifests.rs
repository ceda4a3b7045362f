//! Manifest PUT and GET latency under concurrent clients: each client PUTs distinct small OCI
//! image manifests by tag (all referencing one empty config and one layer), then GETs them back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;
use reqwest::header::{ACCEPT, CONTENT_TYPE};
use reqwest::{StatusCode, Url};
use serde::Serialize;
use serde_json::json;
use tokio::task::JoinSet;

use crate::blobs;
use crate::data::Blob;

const MANIFEST_TYPE: &str = "application/vnd.oci.image.manifest.v1+json";
const EMPTY_TYPE: &str = "application/vnd.oci.empty.v1+json";
const EMPTY_DIGEST: &str =
    "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a";

/// Latency percentiles in milliseconds.
#[derive(Clone, Debug, Serialize)]
pub struct Latency {
    pub put_p50_ms: f64,
    pub put_p99_ms: f64,
    pub get_p50_ms: f64,
    pub get_p99_ms: f64,
    pub puts: usize,
    pub gets: usize,
    pub wall_s: f64,
}

/// Nearest-rank percentile of sorted samples, in ms.
fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_secs_f64() * 1e3
}

/// Pushes the empty config `{}` and the layer the manifests reference.
pub async fn prepare(base: &Url, repo: &str, layer: &Blob) -> Result<()> {
    let client = blobs::client()?;
    let config = Bytes::from_static(b"{}");
    blobs::push(&client, base, repo, EMPTY_DIGEST, config.into(), 2).await?;
    let len = layer.len();
    blobs::push(
        &client,
        base,
        repo,
        &layer.digest,
        layer.data.clone().into(),
        len,
    )
    .await
}

fn manifest(layer: &Blob, client: usize, index: usize) -> Result<Bytes> {
    let m = json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": EMPTY_TYPE, "digest": EMPTY_DIGEST, "size": 2},
        "layers": [{
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": layer.digest,
            "size": layer.len(),
        }],
        "annotations": {
            "org.example.vial-bench.client": client.to_string(),
            "org.example.vial-bench.index": index.to_string(),
        },
    });
    Ok(Bytes::from(serde_json::to_vec(&m)?))
}

/// One client: `per_client` PUTs by tag, then a GET of each tag (body compared byte for byte).
async fn one_client(
    base: Url,
    repo: Arc<str>,
    manifests: Vec<(String, Bytes)>,
) -> Result<(Vec<Duration>, Vec<Duration>)> {
    let client = blobs::client()?;
    let mut puts = Vec::with_capacity(manifests.len());
    let mut gets = Vec::with_capacity(manifests.len());
    for (tag, body) in &manifests {
        let url = base.join(&format!("v2/{repo}/manifests/{tag}"))?;
        let started = Instant::now();
        let resp = client
            .put(url)
            .header(CONTENT_TYPE, MANIFEST_TYPE)
            .body(body.clone())
            .send()
            .await?;
        let status = resp.status();
        let text = resp.text().await?;
        puts.push(started.elapsed());
        if status != StatusCode::CREATED {
            bail!("PUT manifest {tag}: {status}: {text}");
        }
    }
    for (tag, body) in &manifests {
        let url = base.join(&format!("v2/{repo}/manifests/{tag}"))?;
        let started = Instant::now();
        let resp = client.get(url).header(ACCEPT, MANIFEST_TYPE).send().await?;
        let status = resp.status();
        let got = resp.bytes().await?;
        gets.push(started.elapsed());
        if status != StatusCode::OK || got != *body {
            bail!(
                "GET manifest {tag}: {status}, body differs: {}",
                got != *body
            );
        }
    }
    Ok((puts, gets))
}

/// `clients` concurrent clients, each doing `per_client` PUTs then `per_client` GETs; client `c`
/// talks to `bases[c % bases.len()]`.
pub async fn measure(
    bases: &[Url],
    repo: &str,
    layer: &Blob,
    clients: usize,
    per_client: usize,
) -> Result<Latency> {
    // Build every manifest before the clock starts.
    let mut work = Vec::with_capacity(clients);
    for c in 0..clients {
        let ms = (0..per_client)
            .map(|i| Ok((format!("c{c}-{i}"), manifest(layer, c, i)?)))
            .collect::<Result<Vec<_>>>()?;
        work.push(ms);
    }
    let repo: Arc<str> = Arc::from(repo);
    let started = Instant::now();
    let mut tasks = JoinSet::new();
    for (c, ms) in work.into_iter().enumerate() {
        let base = bases[c % bases.len()].clone();
        tasks.spawn(one_client(base, Arc::clone(&repo), ms));
    }
    let (mut puts, mut gets) = (Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        let (p, g) = done??;
        puts.extend(p);
        gets.extend(g);
    }
    let wall_s = started.elapsed().as_secs_f64();
    puts.sort();
    gets.sort();
    Ok(Latency {
        put_p50_ms: percentile(&puts, 50.0),
        put_p99_ms: percentile(&puts, 99.0),
        get_p50_ms: percentile(&gets, 50.0),
        get_p99_ms: percentile(&gets, 99.0),
        puts: puts.len(),
        gets: gets.len(),
        wall_s,
    })
}
