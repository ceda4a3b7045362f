//! The file-per-layer ceiling client the `files` benchmark times against vial: each file one
//! monolithic blob upload, each pulled back on its own stream.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;

/// The file-per-layer ceiling client: `push` uploads each file as one monolithic blob (digest known
/// up front, as skopeo knows it from an OCI layout), `pull` GETs each and checks its digest as it
/// writes, every file on its own stream at once.
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
}

pub async fn client(args: ClientArgs) -> Result<()> {
    use futures_util::StreamExt;
    let http = reqwest::Client::builder().no_proxy().build()?;
    let mut tasks = Vec::new();
    match args.action.as_str() {
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
