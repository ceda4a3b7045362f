//! The `backends` benchmark: the same registry workload on the embedded default (SQLite +
//! filesystem), on PostgreSQL + S3 (s3s-fs), and on two PostgreSQL + S3 replicas side by side.
//! Push and pull throughput and manifest latency, printed as ratios against the embedded default.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use reqwest::Url;
use serde::Serialize;

use crate::data::{self, Blob};
use crate::manifests::{self, Latency};
use crate::report::{num, ratio, times, Goal};
use crate::run::{machine, sync_disk};
use crate::servers::{self, Server, WorkDir};
use crate::{blobs, report};

#[derive(Debug, Args)]
pub struct BackendsArgs {
    /// The `vial` binary to benchmark.
    #[arg(long)]
    pub vial: PathBuf,
    /// The s3s-fs binary (the S3-compatible server).
    #[arg(long, default_value = ".ci/tools/bin/s3s-fs")]
    pub s3s_fs: PathBuf,
    /// Directory of PostgreSQL's server binaries (initdb, pg_ctl).
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// Shrink everything for a smoke run.
    #[arg(long)]
    pub quick: bool,
    /// Concurrent clients of the manifest latency test.
    #[arg(long, default_value_t = 64)]
    pub manifest_clients: usize,
    /// Parent of the run's directory (must be a real disk, not tmpfs).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Write all figures to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// The goal for the production backends: throughput within 70% of the embedded default's,
/// read as each of the four throughput figures at least this fraction of the default's.
const MIN_THROUGHPUT_VS_DEFAULT: f64 = 0.7;
/// The goal for manifest reads under load: GET p99 below this, in milliseconds, with the
/// manifest test's concurrent clients (64 by default).
const MAX_MANIFEST_GET_P99_MS: f64 = 20.0;

pub(crate) const ACCESS_KEY: &str = "vial-bench";
pub(crate) const SECRET_KEY: &str = "vial-bench-secret";
pub(crate) const BUCKET: &str = "vial-bench";

/// A throwaway PostgreSQL cluster, stopped on drop.
pub(crate) struct Postgres {
    bin: PathBuf,
    data: PathBuf,
    port: u16,
}

impl Postgres {
    pub(crate) fn start(bin: &Path, dir: &Path) -> Result<Postgres> {
        let data = dir.join("pg");
        std::fs::create_dir_all(&data)?;
        let chown = Command::new("chown")
            .arg("postgres:postgres")
            .arg(dir)
            .arg(&data)
            .status()?;
        if !chown.success() {
            bail!("chown of {} failed (run as root)", data.display());
        }
        let as_postgres = |program: &str| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(bin.join(program));
            c
        };
        let out = as_postgres("initdb")
            .arg("-D")
            .arg(&data)
            .args([
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ])
            .output()?;
        if !out.status.success() {
            bail!("initdb: {}", String::from_utf8_lossy(&out.stderr));
        }
        let port = servers::free_port()?;
        // Durable commits as in production: fsync stays on.
        let opts = format!(
            "-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories={} -c max_connections=300",
            data.display()
        );
        let out = as_postgres("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.join("pg.log"))
            .args(["-w", "-t", "30", "-o", &opts, "start"])
            .output()?;
        if !out.status.success() {
            bail!("pg_ctl start: {}", String::from_utf8_lossy(&out.stderr));
        }
        let pg = Postgres {
            bin: bin.to_path_buf(),
            data,
            port,
        };
        let created = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", "postgres"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", "CREATE DATABASE vial"])
            .stdout(Stdio::null())
            .status()?;
        if !created.success() {
            bail!("CREATE DATABASE failed");
        }
        Ok(pg)
    }

    pub(crate) fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/vial", self.port)
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(self.bin.join("pg_ctl"))
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "fast", "-w", "stop"])
            .output();
    }
}

pub(crate) async fn start_s3(bin: &Path, dir: &Path) -> Result<Server> {
    std::fs::create_dir_all(dir.join("data").join(BUCKET))?;
    let port = servers::free_port()?;
    let mut cmd = Command::new(bin);
    cmd.args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
        .arg(dir.join("data"))
        .stdout(Stdio::null());
    let base = Url::parse(&format!("http://127.0.0.1:{port}/"))?;
    let mut server = servers::spawn("s3s-fs", &mut cmd, dir, base)?;
    server.wait_ready("").await?;
    Ok(server)
}

/// One `vial serve` of a setup: its extra arguments and environment.
type Replica<'a> = (Vec<String>, Vec<(&'a str, String)>);

#[derive(Debug, Default, Serialize)]
struct Setup {
    name: String,
    push_small_mb_s: Option<f64>,
    push_large_mb_s: Option<f64>,
    pull_small_mb_s: Option<f64>,
    pull_large_mb_s: Option<f64>,
    manifests: Option<Latency>,
}

/// The S3 server on its own: the same blobs put and got straight from the bench with the AWS SDK
/// and the same concurrency, the ceiling for any registry in front of it.
async fn s3_ceiling(endpoint: &str, small: &Arc<[Blob]>, large: &Arc<[Blob]>) -> Result<Ceiling> {
    use aws_sdk_s3::primitives::ByteStream;
    let shared = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_s3::config::Credentials::new(
            ACCESS_KEY, SECRET_KEY, None, None, "bench",
        ))
        .load()
        .await;
    let config = aws_sdk_s3::config::Builder::from(&shared)
        .force_path_style(true)
        .request_checksum_calculation(aws_sdk_s3::config::RequestChecksumCalculation::WhenRequired)
        .response_checksum_validation(aws_sdk_s3::config::ResponseChecksumValidation::WhenRequired)
        .build();
    let client = aws_sdk_s3::Client::from_conf(config);
    let run = |blobs: Arc<[Blob]>, concurrency: usize, get: bool, multipart: bool| {
        let client = client.clone();
        async move {
            let total: u64 = blobs.iter().map(Blob::len).sum();
            let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
            let started = Instant::now();
            let mut tasks = tokio::task::JoinSet::new();
            for _ in 0..concurrency {
                let (client, blobs, next) = (client.clone(), Arc::clone(&blobs), Arc::clone(&next));
                tasks.spawn(async move {
                    while let Some(blob) =
                        blobs.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
                    {
                        let key = format!("ceiling/{}", blob.digest);
                        if get {
                            let out = client.get_object().bucket(BUCKET).key(&key).send().await?;
                            let bytes = out.body.collect().await?.into_bytes();
                            if bytes.len() as u64 != blob.len() {
                                bail!("short GET of {key}");
                            }
                        } else if multipart {
                            put_multipart(&client, &key, &blob.data).await?;
                        } else {
                            client
                                .put_object()
                                .bucket(BUCKET)
                                .key(&key)
                                .body(ByteStream::from(blob.data.clone()))
                                .send()
                                .await?;
                        }
                    }
                    Ok::<(), anyhow::Error>(())
                });
            }
            while let Some(done) = tasks.join_next().await {
                done??;
            }
            Ok::<f64, anyhow::Error>(blobs::mb_per_s(total, started.elapsed()))
        }
    };
    sync_disk();
    let put_small = run(Arc::clone(small), 8, false, false).await?;
    let put_large = run(Arc::clone(large), 4, false, false).await?;
    sync_disk();
    let put_large_multipart = run(Arc::clone(large), 4, false, true).await?;
    sync_disk();
    let get_small = run(Arc::clone(small), 8, true, false).await?;
    let get_large = run(Arc::clone(large), 4, true, false).await?;
    Ok(Ceiling {
        put_small,
        put_large,
        put_large_multipart,
        get_small,
        get_large,
    })
}

struct Ceiling {
    put_small: f64,
    put_large: f64,
    /// Large blobs as a registry must send them when it publishes only after verifying: a
    /// multipart upload of 16 MiB parts, completed at the end.
    put_large_multipart: f64,
    get_small: f64,
    get_large: f64,
}

async fn put_multipart(client: &aws_sdk_s3::Client, key: &str, data: &bytes::Bytes) -> Result<()> {
    use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
    let upload = client
        .create_multipart_upload()
        .bucket(BUCKET)
        .key(key)
        .send()
        .await?;
    let id = upload.upload_id().context("no upload id")?;
    let mut parts = Vec::new();
    for (i, chunk) in data.chunks(16 << 20).enumerate() {
        let n = i as i32 + 1;
        let out = client
            .upload_part()
            .bucket(BUCKET)
            .key(key)
            .upload_id(id)
            .part_number(n)
            .body(data.slice_ref(chunk).into())
            .send()
            .await?;
        parts.push(
            CompletedPart::builder()
                .part_number(n)
                .set_e_tag(out.e_tag().map(str::to_owned))
                .build(),
        );
    }
    client
        .complete_multipart_upload()
        .bucket(BUCKET)
        .key(key)
        .upload_id(id)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(parts))
                .build(),
        )
        .send()
        .await?;
    Ok(())
}

#[derive(Debug, Serialize)]
struct Results {
    machine: report::Machine,
    small: String,
    large: String,
    manifest_clients: usize,
    setups: Vec<Setup>,
    goals: Vec<Goal>,
}

fn keep<T>(what: &str, result: Result<T>) -> Option<T> {
    result
        .map_err(|e| eprintln!("vial-bench: {what} failed: {e:#}"))
        .ok()
}

pub async fn backends(args: BackendsArgs) -> Result<()> {
    let (small_n, large_n, large_mib, per_client) = if args.quick {
        (64, 4, 16, 5)
    } else {
        (256, 8, 64, 20)
    };
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, false)?;
    println!(
        "vial-bench backends{}",
        if args.quick { " --quick" } else { "" }
    );
    let m = machine();
    println!("date:     {}", m.date);
    println!("machine:  nproc {}, {}, {}", m.nproc, m.cpu_model, m.kernel);
    println!(
        "workload: push+pull {small_n} x 1 MiB (8 clients), {large_n} x {large_mib} MiB (4 clients); manifests: {} clients x {per_client} PUT+GET",
        args.manifest_clients
    );

    eprintln!("vial-bench: generating payloads...");
    let (small, large, layer) = tokio::task::spawn_blocking(move || {
        (
            Arc::<[Blob]>::from(data::make_blobs(11, 1 << 20, small_n)),
            Arc::<[Blob]>::from(data::make_blobs(12, large_mib << 20, large_n)),
            data::make_blobs(13, 4096, 1),
        )
    })
    .await?;
    let layer = layer.into_iter().next().context("no layer")?;

    let pg = Postgres::start(&args.pg_bin, &work.path.join("postgres"))
        .context("could not start PostgreSQL")?;
    let s3 = start_s3(&args.s3s_fs, &work.path.join("s3"))
        .await
        .context("could not start s3s-fs")?;
    let s3_env = vec![
        (
            "AWS_ENDPOINT_URL",
            s3.base.as_str().trim_end_matches('/').to_owned(),
        ),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
    ];
    let production = |prefix: &str| {
        vec![
            "--metadata-url".to_owned(),
            pg.url(),
            "--blob-url".to_owned(),
            format!("s3://{BUCKET}/{prefix}"),
        ]
    };

    let mut results = Results {
        machine: m,
        small: format!("{small_n} x 1 MiB"),
        large: format!("{large_n} x {large_mib} MiB"),
        manifest_clients: args.manifest_clients,
        setups: Vec::new(),
        goals: Vec::new(),
    };
    let only = |flag: &str, value: String| vec![flag.to_owned(), value];
    let setups: [(&str, Vec<Replica>); 5] = [
        ("SQLite + filesystem", vec![(Vec::new(), Vec::new())]),
        (
            "PostgreSQL + filesystem",
            vec![(only("--metadata-url", pg.url()), Vec::new())],
        ),
        (
            "SQLite + S3",
            vec![(
                only("--blob-url", format!("s3://{BUCKET}/sqlite")),
                s3_env.clone(),
            )],
        ),
        ("PostgreSQL + S3", vec![(production("one"), s3_env.clone())]),
        (
            "PostgreSQL + S3, 2 replicas",
            vec![
                (production("two"), s3_env.clone()),
                (production("two"), s3_env.clone()),
            ],
        ),
    ];
    for (i, (name, replicas)) in setups.iter().enumerate() {
        let mut servers = Vec::new();
        for (r, (extra, env)) in replicas.iter().enumerate() {
            let dir = work.path.join(format!("vial-{i}-{r}"));
            servers.push(servers::start_vial_with(&args.vial, &dir, extra, env)?);
        }
        let bases: Vec<Url> = servers.iter().map(|s| s.base.clone()).collect();
        let mut setup = Setup {
            name: name.to_string(),
            ..Setup::default()
        };
        let repo = format!("bench/setup-{i}");
        sync_disk();
        eprintln!("vial-bench: {name}: push");
        setup.push_small_mb_s = keep("push", blobs::push_all(&bases, &repo, &small, 8).await);
        setup.push_large_mb_s = keep("push", blobs::push_all(&bases, &repo, &large, 4).await);
        sync_disk();
        eprintln!("vial-bench: {name}: pull");
        setup.pull_small_mb_s = keep("pull", blobs::pull_all(&bases, &repo, &small, 8).await);
        setup.pull_large_mb_s = keep("pull", blobs::pull_all(&bases, &repo, &large, 4).await);
        eprintln!("vial-bench: {name}: manifests");
        let started = Instant::now();
        setup.manifests = keep(
            "manifests",
            async {
                manifests::prepare(&bases[0], &repo, &layer).await?;
                manifests::measure(&bases, &repo, &layer, args.manifest_clients, per_client).await
            }
            .await,
        );
        eprintln!(
            "vial-bench: {name}: done in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        results.setups.push(setup);
        drop(servers);
    }
    eprintln!("vial-bench: s3s-fs on its own");
    let endpoint = s3.base.as_str().trim_end_matches('/').to_owned();
    if let Some(c) = keep("S3 ceiling", s3_ceiling(&endpoint, &small, &large).await) {
        results.setups.push(Setup {
            name: "(s3s-fs alone, no registry)".into(),
            push_small_mb_s: Some(c.put_small),
            push_large_mb_s: Some(c.put_large),
            pull_small_mb_s: Some(c.get_small),
            pull_large_mb_s: Some(c.get_large),
            manifests: None,
        });
        results.setups.push(Setup {
            name: "(s3s-fs alone, multipart)".into(),
            push_large_mb_s: Some(c.put_large_multipart),
            ..Setup::default()
        });
    }
    drop(s3);
    drop(pg);

    print_table(&results);
    results.goals = evaluate(&results);
    report::print_goal_list(&results.goals, &[]);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)
            .with_context(|| format!("could not write {}", path.display()))?;
        println!("\nfigures written to {}", path.display());
    }
    Ok(())
}

fn print_table(r: &Results) {
    let base = &r.setups[0];
    let cell = |v: Option<f64>, b: Option<f64>| match (v, b) {
        (Some(v), Some(b)) if b > 0.0 => format!("{v:>8.0} MB/s {:>5.2}x", v / b),
        (Some(v), _) => format!("{v:>8.0} MB/s      "),
        _ => format!("{:>19}", "-"),
    };
    println!();
    println!(
        "{:<30} {:>19} {:>19} {:>19} {:>19} {:>9} {:>9}",
        "setup",
        format!("push {}", r.small),
        format!("push {}", r.large),
        format!("pull {}", r.small),
        format!("pull {}", r.large),
        "GET p50",
        "GET p99"
    );
    for s in &r.setups {
        let (p50, p99) = s
            .manifests
            .as_ref()
            .map_or((f64::NAN, f64::NAN), |l| (l.get_p50_ms, l.get_p99_ms));
        println!(
            "{:<30} {} {} {} {} {:>6.1} ms {:>6.1} ms",
            s.name,
            cell(s.push_small_mb_s, base.push_small_mb_s),
            cell(s.push_large_mb_s, base.push_large_mb_s),
            cell(s.pull_small_mb_s, base.pull_small_mb_s),
            cell(s.pull_large_mb_s, base.pull_large_mb_s),
            p50,
            p99
        );
    }
    println!(
        "(ratios are against SQLite + filesystem; manifest latencies with {} concurrent clients)",
        r.manifest_clients
    );
    let named = |n: &str| r.setups.iter().find(|s| s.name == n);
    if let (Some(one), Some(two)) = (
        named("PostgreSQL + S3"),
        named("PostgreSQL + S3, 2 replicas"),
    ) {
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
            _ => "n/a".into(),
        };
        println!(
            "2 replicas vs 1: push {} / {}, pull {} / {}",
            ratio(two.push_small_mb_s, one.push_small_mb_s),
            ratio(two.push_large_mb_s, one.push_large_mb_s),
            ratio(two.pull_small_mb_s, one.pull_small_mb_s),
            ratio(two.pull_large_mb_s, one.pull_large_mb_s),
        );
    }
}

/// The goals for every registry setup: throughput against the embedded default (the first
/// setup), and manifest GET p99 under load.
fn evaluate(r: &Results) -> Vec<Goal> {
    let mut goals = Vec::new();
    let Some(base) = r.setups.first() else {
        return goals;
    };
    // The setups in brackets are s3s-fs on its own, not a registry.
    for (i, s) in r
        .setups
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.name.starts_with('('))
    {
        if i > 0 {
            let figures = [
                ratio(s.push_small_mb_s, base.push_small_mb_s),
                ratio(s.push_large_mb_s, base.push_large_mb_s),
                ratio(s.pull_small_mb_s, base.pull_small_mb_s),
                ratio(s.pull_large_mb_s, base.pull_large_mb_s),
            ];
            // No verdict when a figure is missing: the worst of the others may not be the worst.
            let worst = figures
                .iter()
                .copied()
                .collect::<Option<Vec<f64>>>()
                .map(|v| v.into_iter().fold(f64::INFINITY, f64::min));
            let all: Vec<String> = figures.iter().map(|&x| times(x)).collect();
            goals.push(Goal {
                goal: format!(
                    "{}: every throughput >= {MIN_THROUGHPUT_VS_DEFAULT}x the embedded default's",
                    s.name
                ),
                pass: worst.map(|w| w >= MIN_THROUGHPUT_VS_DEFAULT),
                detail: format!(
                    "worst {} (push, push, pull, pull: {})",
                    times(worst),
                    all.join(", ")
                ),
            });
        }
        let p99 = s.manifests.as_ref().map(|l| l.get_p99_ms);
        goals.push(Goal {
            goal: format!(
                "{}: manifest GET p99 < {MAX_MANIFEST_GET_P99_MS} ms with {} clients",
                s.name, r.manifest_clients
            ),
            pass: p99.map(|p| p < MAX_MANIFEST_GET_P99_MS),
            detail: format!("{} ms", num(p99, 1)),
        });
    }
    goals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn setup(name: &str, mb_s: [f64; 4], get_p99_ms: f64) -> Setup {
        Setup {
            name: name.into(),
            push_small_mb_s: Some(mb_s[0]),
            push_large_mb_s: Some(mb_s[1]),
            pull_small_mb_s: Some(mb_s[2]),
            pull_large_mb_s: Some(mb_s[3]),
            manifests: Some(Latency {
                put_p50_ms: 1.0,
                put_p99_ms: 1.0,
                get_p50_ms: 1.0,
                get_p99_ms,
                puts: 1,
                gets: 1,
                wall_s: 1.0,
            }),
        }
    }

    #[test]
    fn goals_pass_and_miss_by_the_measured_figures() {
        // The 2026-11-29 run's figures.
        let r = Results {
            machine: report::Machine::default(),
            small: String::new(),
            large: String::new(),
            manifest_clients: 64,
            setups: vec![
                setup("SQLite + filesystem", [264.0, 705.0, 1683.0, 2471.0], 2.4),
                setup(
                    "PostgreSQL + filesystem",
                    [285.0, 727.0, 1445.0, 2538.0],
                    10.5,
                ),
                setup(
                    "PostgreSQL + S3, 2 replicas",
                    [77.0, 121.0, 145.0, 241.0],
                    23.6,
                ),
                Setup {
                    name: "(s3s-fs alone, multipart)".into(),
                    push_large_mb_s: Some(168.0),
                    ..Setup::default()
                },
            ],
            goals: Vec::new(),
        };
        let verdicts: Vec<(String, Option<bool>)> =
            evaluate(&r).into_iter().map(|g| (g.goal, g.pass)).collect();
        let pass = |name: &str| {
            verdicts
                .iter()
                .find(|(g, _)| g.starts_with(name))
                .and_then(|(_, p)| *p)
        };
        assert_eq!(verdicts.len(), 5, "{verdicts:?}");
        assert_eq!(pass("SQLite + filesystem: manifest"), Some(true));
        assert_eq!(
            pass("PostgreSQL + filesystem: every throughput"),
            Some(true)
        );
        assert_eq!(pass("PostgreSQL + filesystem: manifest"), Some(true));
        assert_eq!(
            pass("PostgreSQL + S3, 2 replicas: every throughput"),
            Some(false)
        );
        assert_eq!(pass("PostgreSQL + S3, 2 replicas: manifest"), Some(false));
    }
}
