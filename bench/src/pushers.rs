//! The three push clients of the push benchmark, each run as a child process and measured the
//! same way: wall time from spawn to exit, peak RSS sampled from /proc every 50 ms, and bytes
//! uploaded as the delta of the registry's `vial_bytes_received_total` around the run. Also builds
//! the OCI image layouts skopeo copies from.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;
use serde_json::json;
use tokio::process::Command;
use vial_core::Algorithm;

use crate::rss;
use crate::servers::{log_tail, Server};

const RSS_EVERY: Duration = Duration::from_millis(50);

/// The ORAS Python SDK push, one layer per file, run with the checkpoint as its working directory.
pub(crate) const ORAS_SCRIPT: &str = r#"
import sys
import oras.client
host, target, files = sys.argv[1], sys.argv[2], sys.argv[3:]
client = oras.client.OrasClient(hostname=host, insecure=True)
client.push(target=target, files=files)
"#;

/// One client pushing one checkpoint.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PushRun {
    pub client: String,
    pub case: String,
    /// Wall time from spawn to exit.
    pub seconds: Option<f64>,
    /// Delta of `vial_bytes_received_total`.
    pub bytes_uploaded: Option<u64>,
    /// Highest VmRSS sampled every 50 ms.
    pub peak_rss_kib: Option<u64>,
    pub rss_samples: usize,
    /// `vial push --json`'s report.
    pub report: Option<serde_json::Value>,
    /// skopeo: time to build the OCI layout (not part of `seconds`).
    pub layout_seconds: Option<f64>,
    pub error: Option<String>,
}

/// What one measured child process did.
struct Measured {
    seconds: f64,
    stdout: Vec<u8>,
    peak_rss_kib: u64,
    samples: usize,
    bytes_uploaded: u64,
}

/// The registry's `vial_bytes_received_total`.
/// Everything the registry received: blob bytes and manifest bytes, so metadata counts as upload.
pub async fn bytes_received(server: &Server) -> Result<u64> {
    Ok(counter(server, "vial_bytes_received_total").await?
        + counter(server, "vial_manifest_bytes_received_total").await?)
}

/// A counter from the registry's `/metrics`, e.g. `vial_bytes_sent_total`.
pub async fn counter(server: &Server, name: &str) -> Result<u64> {
    let client = crate::blobs::client()?;
    let text = client
        .get(server.url("metrics")?)
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("/metrics has no {name}"))
}

/// Runs `cmd` to completion against `server`, logging its stderr to `log`.
async fn measure(mut cmd: Command, server: &Server, log: &Path) -> Result<Measured> {
    let before = bytes_received(server).await?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(log)?)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost")
        .kill_on_drop(true);
    let started = Instant::now();
    let child = cmd
        .spawn()
        .with_context(|| format!("could not start {:?}", cmd.as_std().get_program()))?;
    let pid = child.id().context("child has no pid")?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampling = rss::sampler(pid, Arc::clone(&stop), RSS_EVERY);
    let output = child.wait_with_output().await;
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (peak_rss_kib, samples) = sampling
        .join()
        .map_err(|_| anyhow!("RSS sampler panicked"))?;
    let output = output?;
    if !output.status.success() {
        bail!(
            "{:?} failed ({}); end of {}:\n{}",
            cmd.as_std().get_program(),
            output.status,
            log.display(),
            log_tail(log)
        );
    }
    let after = bytes_received(server).await?;
    Ok(Measured {
        seconds,
        stdout: output.stdout,
        peak_rss_kib,
        samples,
        bytes_uploaded: after.saturating_sub(before),
    })
}

fn record(run: &mut PushRun, m: &Measured) {
    run.seconds = Some(m.seconds);
    run.bytes_uploaded = Some(m.bytes_uploaded);
    run.peak_rss_kib = Some(m.peak_rss_kib);
    run.rss_samples = m.samples;
}

pub fn host(server: &Server) -> Result<String> {
    let h = server.base.host_str().context("server URL has no host")?;
    let p = server.base.port().context("server URL has no port")?;
    Ok(format!("{h}:{p}"))
}

/// `vial push DIR HOST/REPO --tag TAG --json` with its own XDG_CACHE_HOME (for the local index).
#[allow(clippy::too_many_arguments)]
pub async fn vial(
    bin: &Path,
    server: &Server,
    dir: &Path,
    repo: &str,
    tag: &str,
    cache: &Path,
    rehash: bool,
    log: &Path,
) -> Result<PushRun> {
    let mut cmd = Command::new(bin);
    cmd.arg("push")
        .arg(dir)
        .arg(format!("{}/{repo}", host(server)?))
        .args(["--tag", tag, "--json"])
        .env("XDG_CACHE_HOME", cache)
        .env("VIAL_LOG", "warn");
    if rehash {
        cmd.arg("--rehash");
    }
    let m = measure(cmd, server, log).await?;
    let mut run = PushRun {
        client: "vial".into(),
        case: tag.into(),
        ..PushRun::default()
    };
    record(&mut run, &m);
    run.report = Some(
        serde_json::from_slice(&m.stdout)
            .with_context(|| format!("vial push printed no JSON report; see {}", log.display()))?,
    );
    Ok(run)
}

/// The ORAS Python SDK pushing every file of `dir` (relative names, sorted) as one layer each.
pub async fn oras(
    python: &Path,
    server: &Server,
    dir: &Path,
    repo: &str,
    tag: &str,
    log: &Path,
) -> Result<PushRun> {
    let host = host(server)?;
    let mut cmd = Command::new(python);
    cmd.arg("-c")
        .arg(ORAS_SCRIPT)
        .arg(&host)
        .arg(format!("{host}/{repo}:{tag}"))
        .args(file_names(dir)?)
        .current_dir(dir);
    let m = measure(cmd, server, log).await?;
    let mut run = PushRun {
        client: "oras-py".into(),
        case: tag.into(),
        ..PushRun::default()
    };
    record(&mut run, &m);
    Ok(run)
}

/// Python start-up plus `import oras.client`, the fixed cost inside every ORAS figure.
pub async fn oras_import_seconds(python: &Path) -> Result<f64> {
    let started = Instant::now();
    let status = Command::new(python)
        .args(["-c", "import oras.client"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await?;
    if !status.success() {
        bail!("{} cannot import oras.client ({status})", python.display());
    }
    Ok(started.elapsed().as_secs_f64())
}

/// `skopeo copy` of one tag of an OCI layout, keeping digests (no recompression).
pub async fn skopeo(
    bin: &Path,
    server: &Server,
    layout: &Path,
    repo: &str,
    tag: &str,
    log: &Path,
) -> Result<PushRun> {
    let mut cmd = Command::new(bin);
    cmd.args([
        "--insecure-policy",
        "copy",
        "--dest-tls-verify=false",
        "--preserve-digests",
    ])
    .arg(format!("oci:{}:{tag}", layout.display()))
    .arg(format!("docker://{}/{repo}:{tag}", host(server)?));
    let m = measure(cmd, server, log).await?;
    let mut run = PushRun {
        client: "skopeo".into(),
        case: tag.into(),
        ..PushRun::default()
    };
    record(&mut run, &m);
    Ok(run)
}

/// Regular files directly in `dir`, sorted by name.
pub fn file_names(dir: &Path) -> Result<Vec<String>> {
    let mut names = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            names.push(
                entry
                    .file_name()
                    .into_string()
                    .map_err(|n| anyhow!("file name {n:?} is not UTF-8"))?,
            );
        }
    }
    names.sort();
    Ok(names)
}

/// sha256 digests of files already hashed, by (device, inode): hard links are hashed once.
pub type DigestCache = HashMap<(u64, u64), (String, u64)>;

fn file_digest(path: &Path, cache: &mut DigestCache) -> Result<(String, u64)> {
    let meta = fs::metadata(path)?;
    if let Some(known) = cache.get(&(meta.dev(), meta.ino())) {
        return Ok(known.clone());
    }
    let mut hasher = Algorithm::Sha256.hasher();
    let mut f = File::open(path)?;
    let mut buf = vec![0u8; 8 << 20];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    let digest = hasher.finish().hex().to_string();
    let value = (digest, meta.len());
    cache.insert((meta.dev(), meta.ino()), value.clone());
    Ok(value)
}

fn put_blob(blobs: &Path, bytes: &[u8]) -> Result<(String, u64)> {
    let hex = Algorithm::Sha256.digest_bytes(bytes).hex().to_string();
    fs::write(blobs.join(&hex), bytes)?;
    Ok((hex, bytes.len() as u64))
}

/// An OCI image layout at `layout` whose image `tag` has one uncompressed layer per file of `dir`
/// (hard-linked into blobs/sha256, so nothing is copied) and a config blob. Returns the seconds
/// it took, hashing included (files already in `cache` are not hashed again).
pub fn build_layout(dir: &Path, layout: &Path, tag: &str, cache: &mut DigestCache) -> Result<f64> {
    let started = Instant::now();
    let blobs = layout.join("blobs/sha256");
    fs::create_dir_all(&blobs)?;
    fs::write(
        layout.join("oci-layout"),
        br#"{"imageLayoutVersion":"1.0.0"}"#,
    )?;
    let mut layers = Vec::new();
    let mut diff_ids = Vec::new();
    for name in file_names(dir)? {
        let path = dir.join(&name);
        let (hex, size) = file_digest(&path, cache)?;
        let blob = blobs.join(&hex);
        if !blob.exists() && fs::hard_link(&path, &blob).is_err() {
            fs::copy(&path, &blob).with_context(|| format!("could not copy {}", path.display()))?;
        }
        layers.push(json!({
            "mediaType": "application/vnd.oci.image.layer.v1.tar",
            "digest": format!("sha256:{hex}"),
            "size": size,
            "annotations": {"org.opencontainers.image.title": name},
        }));
        diff_ids.push(format!("sha256:{hex}"));
    }
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64",
        "os": "linux",
        "config": {},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))?;
    let (config_hex, config_size) = put_blob(&blobs, &config)?;
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            "digest": format!("sha256:{config_hex}"),
            "size": config_size,
        },
        "layers": layers,
    }))?;
    let (manifest_hex, manifest_size) = put_blob(&blobs, &manifest)?;
    let index = json!({
        "schemaVersion": 2,
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": format!("sha256:{manifest_hex}"),
            "size": manifest_size,
            "annotations": {"org.opencontainers.image.ref.name": tag},
        }],
    });
    fs::write(layout.join("index.json"), serde_json::to_vec(&index)?)?;
    Ok(started.elapsed().as_secs_f64())
}

/// A directory path, for messages.
pub fn show(p: &Path) -> String {
    p.display().to_string()
}

/// A program given as a path (not a bare name looked up in PATH) made absolute, so it still
/// resolves when a client runs in another working directory.
pub fn absolute_program(p: &Path) -> PathBuf {
    if p.components().count() > 1 {
        std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
    } else {
        p.to_path_buf()
    }
}

/// Replaces `to` with a copy of the directory tree `from`.
pub fn replace_dir(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        fs::remove_dir_all(to).with_context(|| format!("could not remove {}", show(to)))?;
    }
    fs::create_dir_all(to)?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            replace_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Renames `from` to `to` and back on drop, so vial always pushes the same path (its local index
/// is keyed by the directory's absolute path).
#[derive(Debug)]
pub struct Swapped {
    from: PathBuf,
    to: PathBuf,
}

impl Swapped {
    pub fn new(from: &Path, to: &Path) -> Result<Self> {
        fs::rename(from, to)
            .with_context(|| format!("could not rename {} to {}", show(from), show(to)))?;
        Ok(Swapped {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
        })
    }
}

impl Drop for Swapped {
    fn drop(&mut self) {
        let _ = fs::rename(&self.to, &self.from);
    }
}
