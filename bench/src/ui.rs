//! `vial-bench ui`: the web UI's pages with 10,000 versions in one volume. One real volume is
//! pushed, then N more versions of it are committed over the Distribution API (its index again
//! with one more annotation, so a new digest over the same tree and parts, as a re-push that
//! changed nothing but metadata would make), a few tagged; then each page is fetched repeatedly
//! and its server time (request to last byte, on loopback) reported.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use futures_util::StreamExt;

use crate::report::{self, Goal};
use crate::servers::{self, WorkDir};

#[derive(Debug, Args)]
pub struct UiArgs {
    /// The `vial` binary.
    #[arg(long)]
    pub vial: PathBuf,
    /// Versions in the volume.
    #[arg(long, default_value_t = 10_000)]
    pub versions: usize,
    /// Fetches of each page.
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Metadata stores to run on, in turn: sqlite (the embedded default), postgres (a cluster
    /// the bench starts, as root).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres")]
    pub backends: Vec<String>,
    /// PostgreSQL's server binaries.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// Parent of the run's directory.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
}

const INDEX: &str = "application/vnd.oci.image.index.v1+json";

pub async fn ui(args: UiArgs) -> Result<()> {
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, false)?;
    let mut goals = Vec::new();
    for backend in &args.backends {
        let dir = work.path.join(backend);
        std::fs::create_dir_all(&dir)?;
        let (worst, _pg) = match backend.as_str() {
            "sqlite" => (one_backend(&args, backend, &dir, &[]).await?, None),
            "postgres" => {
                let pg = crate::backends::Postgres::start(&args.pg_bin, &dir)?;
                let serve = ["--metadata-url".to_owned(), pg.url()];
                (one_backend(&args, backend, &dir, &serve).await?, Some(pg))
            }
            other => bail!("unknown backend {other:?}: sqlite or postgres"),
        };
        goals.push(Goal {
            goal: format!(
                "{backend}: every page under 100 ms with {} versions in a volume",
                args.versions + 1
            ),
            pass: Some(worst < 100.0),
            detail: format!("worst p99 {worst:.1} ms"),
        });
    }
    report::print_goal_list(&goals, &[]);
    drop(work);
    Ok(())
}

/// One registry on `backend`: the versions committed, each page timed; the worst p99 (ms).
async fn one_backend(
    args: &UiArgs,
    backend: &str,
    dir: &std::path::Path,
    serve: &[String],
) -> Result<f64> {
    let registry = servers::start_vial_with(&args.vial, &dir.join("registry"), serve, &[])?;
    let work = dir;
    let base = registry.url("")?.as_str().trim_end_matches('/').to_owned();
    let host = base.trim_start_matches("http://").to_owned();
    // One real volume: two shards of noise and a config.
    let src = work.join("src");
    std::fs::create_dir_all(&src)?;
    for i in 0..2u64 {
        let mut bytes = vec![0u8; 8 << 20];
        crate::data::xorshift_fill(&mut bytes, 70 + i);
        std::fs::write(src.join(format!("model-{i}.safetensors")), bytes)?;
    }
    std::fs::write(src.join("config.json"), b"{}")?;
    let out = tokio::process::Command::new(&args.vial)
        .arg("push")
        .arg(&src)
        .arg(format!("{host}/weights/many"))
        .args(["--tag", "base", "--json"])
        .env("VIAL_LOG", "warn")
        .output()
        .await?;
    if !out.status.success() {
        bail!("push failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let first = pushed["digest"].as_str().context("no digest")?.to_owned();
    let http = reqwest::Client::new();
    let index: serde_json::Value = http
        .get(format!("{base}/v2/weights/many/manifests/{first}"))
        .header("accept", INDEX)
        .send()
        .await?
        .json()
        .await?;

    // N more versions: the same index with a numbered annotation.
    let started = Instant::now();
    let made = futures_util::stream::iter(0..args.versions)
        .map(|i| {
            let (http, base, mut index) = (http.clone(), base.clone(), index.clone());
            async move {
                index["annotations"]["dev.vial.bench.version"] = i.to_string().into();
                let body = serde_json::to_vec(&index)?;
                let reference = if i % 1000 == 0 {
                    format!("v{i}")
                } else {
                    format!("sha256:{}", sha256_hex(&body))
                };
                let r = http
                    .put(format!("{base}/v2/weights/many/manifests/{reference}"))
                    .header("content-type", INDEX)
                    .body(body)
                    .send()
                    .await?;
                if !r.status().is_success() {
                    bail!("version {i}: {}", r.status());
                }
                Ok::<_, anyhow::Error>(
                    r.headers()
                        .get("docker-content-digest")
                        .and_then(|d| d.to_str().ok())
                        .unwrap_or_default()
                        .to_owned(),
                )
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<_>>()
        .await;
    let digests: Vec<String> = made.into_iter().collect::<Result<_>>()?;
    println!(
        "ui ({backend}): {} versions of one volume committed in {:.1} s",
        args.versions + 1,
        started.elapsed().as_secs_f64()
    );
    let some = digests
        .get(digests.len() / 2)
        .cloned()
        .unwrap_or(first.clone());
    let pages = [
        ("volumes", "/ui/".to_owned()),
        ("a volume, first page", "/ui/r/weights/many".to_owned()),
        (
            "a volume, last page",
            format!("/ui/r/weights/many?page={}", args.versions / 50),
        ),
        ("a version", format!("/ui/r/weights/many/-/v/{some}")),
        (
            "compare two versions",
            format!("/ui/r/weights/many/-/compare?a={first}&b={some}"),
        ),
        (
            "a tag's history",
            "/ui/r/weights/many/-/tags/base".to_owned(),
        ),
        ("jobs", "/ui/jobs".to_owned()),
        ("storage", "/ui/storage".to_owned()),
    ];
    let mut rows = Vec::new();
    let mut worst = 0f64;
    for (name, path) in &pages {
        let mut times = Vec::new();
        for _ in 0..args.runs {
            let t = Instant::now();
            let r = http.get(format!("{base}{path}")).send().await?;
            let status = r.status();
            let body = r.bytes().await?;
            if !status.is_success() {
                bail!("{path}: {status}: {}", String::from_utf8_lossy(&body));
            }
            times.push(t.elapsed().as_secs_f64() * 1000.0);
        }
        times.sort_by(f64::total_cmp);
        let p50 = times[times.len() / 2];
        let p99 = times[((times.len() - 1) as f64 * 0.99) as usize];
        worst = worst.max(p99);
        rows.push(vec![
            (*name).to_owned(),
            format!("{p50:.1}"),
            format!("{p99:.1}"),
        ]);
    }
    report::table(
        &format!(
            "ui ({backend}): server time per page with {} versions in the volume (ms, {} fetches each)",
            args.versions + 1,
            args.runs
        ),
        &["page", "p50", "p99"],
        &rows,
    );
    drop(registry);
    Ok(worst)
}

fn sha256_hex(bytes: &[u8]) -> String {
    vial_core::Algorithm::Sha256
        .digest_bytes(bytes)
        .hex()
        .to_owned()
}
