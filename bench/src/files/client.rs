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
    /// Push every regular file under this directory (hashing each), titled by its path below it.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Push (with `--hash`): once the files are uploaded, tag a manifest listing each as a layer
    /// titled by its name, as `oras push` does. Pull: read that manifest and fetch each layer to
    /// OUT/TITLE.
    #[arg(long)]
    pub tag: Option<String>,
    /// With `--tag`: files in flight at once.
    #[arg(long, default_value_t = 16)]
    pub jobs: usize,
}

/// The OCI image manifest's media type.
const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
/// The empty config `{}` every manifest of [`manifest`] points at, as ORAS pushes it.
const EMPTY_CONFIG: &[u8] = b"{}";
const TITLE: &str = "org.opencontainers.image.title";

/// One file as a layer of a [`manifest`].
#[derive(Debug)]
pub(crate) struct Layer {
    pub digest: String,
    pub size: u64,
    pub title: String,
}

/// The manifest a tagged push puts: the empty config and one uncompressed layer per file, each
/// titled by its name (what `oras push` of a list of files makes).
pub(crate) fn manifest(layers: &[Layer]) -> Result<Vec<u8>> {
    let empty = vial_core::Algorithm::Sha256.digest_bytes(EMPTY_CONFIG);
    let layers: Vec<serde_json::Value> = layers
        .iter()
        .map(|l| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": l.digest,
                "size": l.size,
                "annotations": { TITLE: l.title },
            })
        })
        .collect();
    Ok(serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "artifactType": "application/vnd.unknown.artifact.v1",
        "config": {
            "mediaType": "application/vnd.oci.empty.v1+json",
            "digest": empty.to_string(),
            "size": EMPTY_CONFIG.len(),
        },
        "layers": layers,
    }))?)
}

pub async fn client(args: ClientArgs) -> Result<()> {
    let http = reqwest::Client::builder().no_proxy().build()?;
    let mut tasks = Vec::new();
    match (args.action.as_str(), &args.tag) {
        ("push", Some(tag)) if args.hash || args.dir.is_some() => {
            return push_tagged(&http, &args, tag).await;
        }
        ("pull", Some(tag)) => return pull_tagged(&http, &args, tag).await,
        (_, Some(_)) => bail!("--tag needs a push with --hash or --dir, or a pull"),
        ("push", None) if args.hash => {
            for file in &args.file {
                let (http, base, repo) = (http.clone(), args.base.clone(), args.repo.clone());
                let file = file.clone();
                tasks.push(tokio::spawn(async move {
                    push_hashing(&http, &base, &repo, &file).await.map(|_| ())
                }));
            }
        }
        ("push", None) => {
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
        ("pull", None) => {
            let out = args.out.clone().context("--out is needed to pull")?;
            for (name, digest) in args.name.iter().zip(&args.digest) {
                let url = format!("{}/v2/{}/blobs/{digest}", args.base, args.repo);
                let (http, path) = (http.clone(), out.join(name));
                let expected = vial_core::Digest::parse(digest)?;
                tasks.push(tokio::spawn(async move {
                    fetch(&http, url, path, expected).await
                }));
            }
        }
        (other, None) => bail!("unknown action {other:?}: push or pull"),
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// GETs one blob to `path`, hashing and writing it off the executor as it arrives; fails if it
/// does not match `expected`.
async fn fetch(
    http: &reqwest::Client,
    url: String,
    path: PathBuf,
    expected: vial_core::Digest,
) -> Result<()> {
    use futures_util::StreamExt;
    let r = http.get(url).send().await?.error_for_status()?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<bytes::Bytes>(8);
    let writer = tokio::task::spawn_blocking(move || -> Result<()> {
        use std::io::Write;
        let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(&path)?);
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
    writer.await?
}

/// The files a tagged push sends, with their titles: every regular file under `--dir` (its path
/// below it, so the tree comes back on pull), else each `--file` (its name).
fn tagged_files(args: &ClientArgs) -> Result<Vec<(PathBuf, String)>> {
    let titled = |p: PathBuf, title: Option<&std::ffi::OsStr>| -> Result<(PathBuf, String)> {
        let title = title
            .and_then(|t| t.to_str())
            .with_context(|| format!("{} has no UTF-8 title", p.display()))?
            .to_owned();
        Ok((p, title))
    };
    match &args.dir {
        Some(dir) => crate::mounted::files_under(dir)?
            .into_iter()
            .map(|p| {
                let rel = p.strip_prefix(dir).map(|r| r.as_os_str().to_owned()).ok();
                titled(p, rel.as_deref())
            })
            .collect(),
        None => args
            .file
            .iter()
            .map(|p| titled(p.clone(), p.file_name()))
            .collect(),
    }
}

/// Uploads the empty config and every file (hashing each as it streams, `--jobs` at once), then
/// tags the [`manifest`] listing them.
async fn push_tagged(http: &reqwest::Client, args: &ClientArgs, tag: &str) -> Result<()> {
    let config = vial_core::Algorithm::Sha256.digest_bytes(EMPTY_CONFIG);
    let r = http
        .post(format!(
            "{}/v2/{}/blobs/uploads/?digest={config}",
            args.base, args.repo
        ))
        .header("content-type", "application/octet-stream")
        .body(EMPTY_CONFIG)
        .send()
        .await?;
    if r.status() != 201 {
        bail!("uploading the empty config answered {}", r.status());
    }
    let jobs = Arc::new(tokio::sync::Semaphore::new(args.jobs.max(1)));
    let mut tasks = Vec::new();
    for (path, title) in tagged_files(args)? {
        // Taken before the task starts, so no more than `--jobs` files are open at once.
        let permit = Arc::clone(&jobs).acquire_owned().await?;
        let (http, base, repo) = (http.clone(), args.base.clone(), args.repo.clone());
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let (digest, size) = push_hashing(&http, &base, &repo, &path).await?;
            Ok::<_, anyhow::Error>(Layer {
                digest: digest.to_string(),
                size,
                title,
            })
        }));
    }
    let mut layers = Vec::with_capacity(tasks.len());
    for t in tasks {
        layers.push(t.await??);
    }
    let r = http
        .put(format!("{}/v2/{}/manifests/{tag}", args.base, args.repo))
        .header("content-type", MANIFEST)
        .body(manifest(&layers)?)
        .send()
        .await?;
    if r.status() != 201 {
        let status = r.status();
        bail!("the manifest answered {status}: {}", r.text().await?);
    }
    Ok(())
}

/// Reads the manifest `tag` and fetches each layer to OUT/TITLE, `--jobs` at once.
async fn pull_tagged(http: &reqwest::Client, args: &ClientArgs, tag: &str) -> Result<()> {
    let out = args.out.clone().context("--out is needed to pull")?;
    let m: serde_json::Value = http
        .get(format!("{}/v2/{}/manifests/{tag}", args.base, args.repo))
        .header("accept", MANIFEST)
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let layers = m["layers"]
        .as_array()
        .context("the manifest has no layers")?;
    let jobs = Arc::new(tokio::sync::Semaphore::new(args.jobs.max(1)));
    let mut tasks = Vec::new();
    for layer in layers {
        let (Some(digest), Some(title)) = (
            layer["digest"].as_str(),
            layer["annotations"][TITLE].as_str(),
        ) else {
            bail!("a layer without a digest or a title: {layer}");
        };
        // A title names a file below OUT, never one outside it.
        if !Path::new(title)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)))
        {
            bail!("a layer title that leaves the directory: {title:?}");
        }
        let path = out.join(title);
        if let Some(parent) = path.parent() {
            tokio::fs::create_dir_all(parent).await?;
        }
        let expected = vial_core::Digest::parse(digest)?;
        let url = format!("{}/v2/{}/blobs/{digest}", args.base, args.repo);
        let permit = Arc::clone(&jobs).acquire_owned().await?;
        let http = http.clone();
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            fetch(&http, url, path, expected).await
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(())
}

/// Uploads a file whose digest is not known yet: open an upload session, stream the file in one
/// PATCH while hashing it, close the session with the digest.
async fn push_hashing(
    http: &reqwest::Client,
    base: &str,
    repo: &str,
    path: &Path,
) -> Result<(vial_core::Digest, u64)> {
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
        // A poisoned lock leaves the digest short, and the registry refuses the upload.
        if let (Ok(b), Ok(mut h)) = (&b, h.lock()) {
            if let Some(h) = h.as_mut() {
                h.update(b);
            }
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
        .map_err(|_| anyhow::anyhow!("the hasher's lock was poisoned"))?
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
    Ok((digest, len))
}
