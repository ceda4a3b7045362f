//! The file-per-layer clients the `files` benchmark times against vial: each file one blob
//! upload (monolithic when the digests are known, streamed and hashed on the way when not), each
//! pulled back on its own stream.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use clap::Args;

/// The file-per-layer ceiling client: `push` uploads each file as one monolithic blob (digest known
/// up front, as skopeo knows it from an OCI layout), `pull` GETs each and checks its digest as it
/// writes, every file on its own stream at once. `push --hash` is the same client starting from
/// the files alone, as `oras push` does; where `oras push` hashes each file in a pass of its own
/// before it uploads it, this one hashes each file while it streams it (one upload session per
/// file, the whole body in one PATCH, the digest in the closing PUT), so each byte is read once.
#[derive(Debug, Args)]
pub struct ClientArgs {
    /// `push` or `pull`.
    pub action: String,
    #[arg(long)]
    pub base: String,
    #[arg(long)]
    pub repo: String,
    #[arg(long)]
    pub file: Vec<PathBuf>,
    #[arg(long)]
    pub name: Vec<String>,
    #[arg(long)]
    pub digest: Vec<String>,
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Push without `--digest`: hash each file while sending it.
    #[arg(long)]
    pub hash: bool,
}

pub async fn client(args: ClientArgs) -> Result<()> {
    use futures_util::StreamExt;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let mut tasks = Vec::new();
    match args.action.as_str() {
        "push" if args.hash => {
            for file in &args.file {
                let (http, base, repo) = (http.clone(), args.base.clone(), args.repo.clone());
                let file = file.clone();
                tasks.push(tokio::spawn(async move {
                    push_hashing(&http, &base, &repo, &file).await
                }));
            }
        }
        "push" => {
            for (file, digest) in args.file.iter().zip(&args.digest) {
                let url = format!(
                    "{}/v2/{}/blobs/uploads/?digest={digest}",
                    args.base, args.repo
                );
                let file = tokio::fs::File::open(file).await?;
                let len = file.metadata().await?.len();
                let body = reqwest::Body::wrap_stream(tokio_util::io::ReaderStream::with_capacity(
                    file,
                    1 << 20,
                ));
                let http = http.clone();
                tasks.push(tokio::spawn(async move {
                    let r = http
                        .post(url)
                        .header("content-type", "application/octet-stream")
                        .header("content-length", len)
                        .body(body)
                        .send()
                        .await?;
                    if r.status() != 201 {
                        bail!("upload answered {}", r.status());
                    }
                    Ok(())
                }));
            }
        }
        "pull" => {
            let out = args.out.clone().context("--out is needed to pull")?;
            for (name, digest) in args.name.iter().zip(&args.digest) {
                let url = format!("{}/v2/{}/blobs/{digest}", args.base, args.repo);
                let path = out.join(name);
                let expected = vial_core::Digest::parse(digest)?;
                let http = http.clone();
                tasks.push(tokio::spawn(async move {
                    let r = http.get(url).send().await?.error_for_status()?;
                    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
                    // Hash and write off the executor, as they arrive.
                    let writer = tokio::task::spawn_blocking(move || -> Result<()> {
                        use std::io::Write;
                        let mut f = std::io::BufWriter::with_capacity(
                            1 << 20,
                            std::fs::File::create(&path)?,
                        );
                        let mut h = expected.algorithm().hasher();
                        while let Some(b) = rx.blocking_recv() {
                            h.update(&b);
                            f.write_all(&b)?;
                        }
                        f.flush()?;
                        if h.finish() != expected {
                            bail!("{} does not match its digest", path.display());
                        }
                        Ok(())
                    });
                    let mut stream = r.bytes_stream();
                    while let Some(b) = stream.next().await {
                        if tx.send(b?).await.is_err() {
                            break;
                        }
                    }
                    drop(tx);
                    writer.await??;
                    Ok(())
                }));
            }
        }
        other => bail!("unknown action {other:?}: push or pull"),
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Uploads a file whose digest is not known yet: open an upload session, stream the file in one
/// PATCH while hashing it, close the session with the digest.
async fn push_hashing(http: &reqwest::Client, base: &str, repo: &str, path: &Path) -> Result<()> {
    use futures_util::StreamExt;
    // A Location may be relative to the request's URL.
    let location = |r: &reqwest::Response| -> Result<reqwest::Url> {
        let l = r
            .headers()
            .get("location")
            .context("upload answered without a Location")?
            .to_str()?;
        Ok(r.url().join(l)?)
    };
    let r = http
        .post(format!("{base}/v2/{repo}/blobs/uploads/"))
        .send()
        .await?;
    if r.status() != 202 {
        bail!("starting an upload answered {}", r.status());
    }
    let session = location(&r)?;
    let file = tokio::fs::File::open(path).await?;
    let len = file.metadata().await?.len();
    let hasher = Arc::new(Mutex::new(Some(vial_core::Algorithm::Sha256.hasher())));
    let h = Arc::clone(&hasher);
    let body = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20).map(move |b| {
        if let (Ok(b), Some(h)) = (&b, h.lock().expect("hasher lock").as_mut()) {
            h.update(b);
        }
        b
    });
    let mut patch = http
        .patch(session)
        .header("content-type", "application/octet-stream")
        .header("content-length", len);
    if len > 0 {
        patch = patch.header("content-range", format!("0-{}", len - 1));
    }
    let r = patch.body(reqwest::Body::wrap_stream(body)).send().await?;
    if r.status() != 202 {
        bail!("uploading {} answered {}", path.display(), r.status());
    }
    let mut session = location(&r)?;
    let digest = hasher
        .lock()
        .expect("hasher lock")
        .take()
        .context("the file was hashed twice")?
        .finish();
    session
        .query_pairs_mut()
        .append_pair("digest", &digest.to_string());
    let r = http.put(session).header("content-length", 0).send().await?;
    if r.status() != 201 {
        bail!(
            "closing the upload of {} answered {}",
            path.display(),
            r.status()
        );
    }
    Ok(())
}
