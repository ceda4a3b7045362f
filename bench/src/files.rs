//! The `files` benchmark: is vial at least as fast as shipping the files? A checkpoint pushed,
//! pulled and read whole through a mount with vial, against the same files shipped as plain
//! layers (one layer per file) by skopeo, the ORAS Python SDK and a minimal file-per-layer client
//! (the ceiling: monolithic uploads, parallel GETs, one stream per file), side by side against
//! one registry per backend, with wall and CPU seconds for every row. See bench/README.md.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::backends::{start_s3, Postgres, ACCESS_KEY, BUCKET, SECRET_KEY};
use crate::checkpoint::{Case, Generator};
use crate::mounted::{drop_page_cache, MountSpec, Mounted};
use crate::run::{machine, sync_disk};
use crate::servers::{self, Server, WorkDir};
use crate::{pushers, rss};

mod client;
mod report;
mod results;
pub(crate) use client::{client, manifest, ClientArgs, Layer};
use report::report;
use results::{Concurrent, Results, Row, SizeRun, GIB, HASHING};

#[derive(Debug, Args)]
pub struct FilesArgs {
    /// The `vial` binary: registry, push, pull and mount.
    #[arg(long)]
    pub vial: PathBuf,
    /// Checkpoint sizes in GiB. Default 4,8 (1 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<f64>,
    /// Safetensors shards per checkpoint.
    #[arg(long, default_value_t = 4)]
    pub shards: usize,
    /// Registry backends: `disk` (SQLite + files, the default) and `s3` (PostgreSQL + s3s-fs).
    #[arg(long, value_delimiter = ',', default_value = "disk,s3")]
    pub backends: Vec<String>,
    /// Concurrent 1 GiB `vial push`es for the registry's memory under load (0 skips).
    #[arg(long)]
    pub concurrent: Option<usize>,
    /// A python with the ORAS SDK installed (scripts/test-all makes this venv).
    #[arg(long, default_value = ".venv/bin/python")]
    pub python: PathBuf,
    /// The skopeo binary.
    #[arg(long, default_value = "skopeo")]
    pub skopeo: PathBuf,
    /// The curl binary the file-per-layer client and the unverified pull use.
    #[arg(long, default_value = "curl")]
    pub curl: PathBuf,
    /// The S3-compatible server for the `s3` backend (scripts/test-all builds it).
    #[arg(long, default_value = ".ci/tools/bin/s3s-fs")]
    pub s3s_fs: PathBuf,
    /// PostgreSQL's server binaries (initdb, postgres) for the `s3` backend.
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// Where checkpoints, registries and logs go (a fresh directory under it, removed at the end).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Also write every row and goal as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Rounds, each on a fresh registry, timing vial and the file-per-layer client again (the
    /// other first in every other round), and the file-per-layer client that hashes its files
    /// last (skopeo, ORAS and curl in the first only): each row is the median round, with the
    /// range beside it. One round's disk ratios can move by ±0.2 here.
    #[arg(long, default_value_t = 1)]
    pub repeat: usize,
    /// 1 GiB only and 4 concurrent pushes: a few minutes instead of about twenty.
    #[arg(long)]
    pub quick: bool,
    /// Leave the machine's free page reporting on: by default it is turned off for the run and
    /// the free memory written once, so no run pays the host to back memory again (bench/src/hostmem.rs).
    #[arg(long)]
    pub keep_page_reporting: bool,
}

impl FilesArgs {
    fn backends(&self) -> Backends<'_> {
        Backends {
            vial: &self.vial,
            s3s_fs: &self.s3s_fs,
            pg_bin: &self.pg_bin,
        }
    }
}

/// A registry to measure against: `vial serve` on one backend, with what it needs (the `tree`
/// benchmark measures against it too).
pub(crate) struct Registry {
    pub(crate) server: Server,
    _pg: Option<Postgres>,
    _s3: Option<Server>,
}

/// The programs a [`Registry`] runs: `vial` itself, and s3s-fs and PostgreSQL for the `s3` backend.
pub(crate) struct Backends<'a> {
    pub(crate) vial: &'a Path,
    pub(crate) s3s_fs: &'a Path,
    pub(crate) pg_bin: &'a Path,
}

impl Registry {
    /// `vial serve` on `backend`: `disk` (SQLite + files) or `s3` (PostgreSQL + s3s-fs, both
    /// started here and stopped with it).
    pub(crate) async fn start(tools: &Backends<'_>, backend: &str, dir: &Path) -> Result<Registry> {
        if backend == "disk" {
            return Ok(Registry {
                server: servers::start_vial(tools.vial, &dir.join("registry"))?,
                _pg: None,
                _s3: None,
            });
        }
        let pg = Postgres::start(tools.pg_bin, &dir.join("postgres"))?;
        let s3 = start_s3(tools.s3s_fs, &dir.join("s3")).await?;
        let env = vec![
            (
                "AWS_ENDPOINT_URL",
                s3.base.as_str().trim_end_matches('/').to_owned(),
            ),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
            ("AWS_REGION", "us-east-1".to_owned()),
        ];
        let args_ = vec![
            "--metadata-url".to_owned(),
            pg.url(),
            "--blob-url".to_owned(),
            format!("s3://{BUCKET}/files"),
        ];
        let server = servers::start_vial_with(tools.vial, &dir.join("registry"), &args_, &env)?;
        Ok(Registry {
            server,
            _pg: Some(pg),
            _s3: Some(s3),
        })
    }

    pub(crate) fn host(&self) -> Result<String> {
        pushers::host(&self.server)
    }

    async fn s3_requests(&self) -> BTreeMap<String, u64> {
        let Ok(text) = reqwest::get(
            self.server
                .url("metrics")
                .map(|u| u.to_string())
                .unwrap_or_default(),
        )
        .await
        else {
            return BTreeMap::new();
        };
        let text = text.text().await.unwrap_or_default();
        text.lines()
            .filter_map(|l| l.strip_prefix("vial_s3_requests_total{method=\""))
            .filter_map(|l| {
                let (method, rest) = l.split_once("\"}")?;
                Some((method.to_owned(), rest.trim().parse().ok()?))
            })
            .collect()
    }
}

/// Runs `program args` under `/usr/bin/time`, timing it and reading its CPU and peak memory.
fn timed(
    program: &Path,
    args: &[String],
    env: &[(&str, String)],
    log: &Path,
) -> Result<(f64, f64, f64)> {
    timed_in(program, args, env, log, None)
}

/// [`timed`], run in `cwd`.
fn timed_in(
    program: &Path,
    args: &[String],
    env: &[(&str, String)],
    log: &Path,
    cwd: Option<&Path>,
) -> Result<(f64, f64, f64)> {
    let times = log.with_extension("time");
    let mut cmd = Command::new("/usr/bin/time");
    if let Some(cwd) = cwd {
        cmd.current_dir(cwd);
    }
    let status = cmd
        .args(["-f", "%e %U %S %M", "-o"])
        .arg(&times)
        .arg(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("VIAL_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .status()
        .with_context(|| format!("could not run {}", program.display()))?;
    if !status.success() {
        bail!(
            "{} failed ({status}); see {}",
            program.display(),
            log.display()
        );
    }
    let text = std::fs::read_to_string(&times)?;
    let v: Vec<f64> = text
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    match v.as_slice() {
        [wall, user, sys, rss_kib] => Ok((*wall, user + sys, rss_kib / 1024.0)),
        _ => bail!("unreadable /usr/bin/time output {text:?}"),
    }
}

/// Times one client operation against the registry, recording everything a row holds.
async fn row(
    reg: &Registry,
    op: &str,
    client: &str,
    cold: bool,
    run: impl FnOnce() -> Result<(f64, f64, f64)>,
) -> Row {
    let mut r = Row {
        op: op.into(),
        client: client.into(),
        ..Row::default()
    };
    if cold {
        sync_disk();
        if let Err(e) = drop_page_cache() {
            r.error = Some(format!("cannot drop the page cache: {e:#}"));
            return r;
        }
    }
    let before = reg.s3_requests().await;
    let cpu_before = servers::cpu_seconds(reg.server.pid());
    match run() {
        Ok((wall, cpu, rss)) => {
            r.seconds = Some(wall);
            r.client_cpu = Some(cpu);
            r.rss_mib = Some(rss);
        }
        Err(e) => {
            eprintln!("vial-bench: {op} with {client} failed: {e:#}");
            r.error = Some(format!("{e:#}"));
        }
    }
    r.registry_cpu = servers::cpu_seconds(reg.server.pid())
        .zip(cpu_before)
        .map(|(a, b)| a - b);
    let after = reg.s3_requests().await;
    r.s3 = after
        .into_iter()
        .map(|(m, n)| {
            let d = n.saturating_sub(before.get(&m).copied().unwrap_or(0));
            (m, d)
        })
        .filter(|(_, d)| *d > 0)
        .collect();
    r
}

const ORAS_PULL: &str = r#"
import os, sys, oras.client
host, target, outdir = sys.argv[1:4]
client = oras.client.OrasClient(hostname=host, insecure=True)
client.pull(target=target, outdir=outdir)
"#;

async fn run_size(
    args: &FilesArgs,
    backend: &str,
    gib: f64,
    work: &Path,
    bench: &Path,
) -> Result<SizeRun> {
    let label = format!("{backend}-{gib}g").replace('.', "_");
    let dir = work.join(&label);
    std::fs::create_dir_all(&dir)?;
    eprintln!(
        "vial-bench: {label}: generating a {gib} GiB checkpoint in {} shards",
        args.shards
    );
    let generator = Generator::new((gib * GIB) as u64, args.shards)?;
    let ckpt = dir.join("ckpt");
    let g = generator.write(Case::Base, &ckpt, &ckpt)?;
    let names = pushers::file_names(&ckpt)?;
    let files: Vec<PathBuf> = names.iter().map(|n| ckpt.join(n)).collect();
    let digests: Vec<String> = files
        .iter()
        .map(|f| {
            std::fs::read(f).map(|b| vial_core::Algorithm::Sha256.digest_bytes(&b).to_string())
        })
        .collect::<std::io::Result<_>>()?;
    let layout = dir.join("layout");
    let mut cache = pushers::DigestCache::default();
    pushers::build_layout(&ckpt, &layout, "v1", &mut cache)?;
    let inputs = Inputs {
        args,
        backend,
        bench,
        ckpt: &ckpt,
        layout: &layout,
        names: &names,
        files: &files,
        digests: &digests,
    };
    let mut rows = Vec::new();
    let rounds = args.repeat.max(1);
    for round in 0..rounds {
        if rounds > 1 {
            eprintln!("vial-bench: {label}: round {} of {rounds}", round + 1);
        }
        rows.extend(run_round(&inputs, round, &dir.join(format!("round{round}"))).await?);
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(SizeRun {
        backend: backend.into(),
        gib,
        bytes: g.bytes,
        rows: medians(rows),
    })
}

/// What every round of one checkpoint size measures with.
struct Inputs<'a> {
    args: &'a FilesArgs,
    backend: &'a str,
    bench: &'a Path,
    ckpt: &'a Path,
    layout: &'a Path,
    names: &'a [String],
    files: &'a [PathBuf],
    digests: &'a [String],
}

/// Runs two timed operations, `first_vial` deciding which goes first; returns them in the order
/// (file-per-layer, vial) whichever ran first, so a round that swaps them is a fair repeat.
async fn pair(
    first_vial: bool,
    ceiling: impl std::future::Future<Output = Result<Row>>,
    vial: impl std::future::Future<Output = Result<Row>>,
) -> Result<[Row; 2]> {
    if first_vial {
        let v = vial.await?;
        Ok([ceiling.await?, v])
    } else {
        let c = ceiling.await?;
        Ok([c, vial.await?])
    }
}

/// One round on a fresh registry: every push is a first push. Round 0 times every client; later
/// rounds time vial and the file-per-layer client again, the other one first in odd rounds. The
/// file-per-layer client that hashes its files goes last, on a registry of its own.
async fn run_round(inputs: &Inputs<'_>, round: usize, dir: &Path) -> Result<Vec<Row>> {
    let Inputs {
        args,
        backend,
        bench,
        ckpt,
        layout,
        names,
        files,
        digests,
    } = *inputs;
    let (everyone, vial_first) = (round == 0, round % 2 == 1);
    std::fs::create_dir_all(dir)?;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    let reg = Registry::start(&args.backends(), backend, dir).await?;
    let host = reg.host()?;
    let base = format!("http://{host}");
    let mut rows = Vec::new();
    // A home of its own per round: nothing a client remembers from an earlier round helps it.
    let home = dir.join("home");
    let env = vec![
        ("HOME", home.display().to_string()),
        ("XDG_CACHE_HOME", home.join("cache").display().to_string()),
    ];
    let s = |x: &str| x.to_owned();

    // Pushes: each client into its own repository of the same registry.
    let mut client_args = vec![
        s("files-client"),
        s("push"),
        s("--base"),
        base.clone(),
        s("--repo"),
        s("files/ceiling"),
    ];
    for (f, d) in files.iter().zip(digests) {
        client_args.extend([
            s("--file"),
            f.display().to_string(),
            s("--digest"),
            d.clone(),
        ]);
    }
    let vial_push = vec![
        s("push"),
        ckpt.display().to_string(),
        format!("{host}/files/vial"),
        s("--tag"),
        s("v1"),
    ];
    rows.extend(
        pair(
            vial_first,
            async {
                Ok(row(&reg, "push", "file-per-layer", true, || {
                    timed(bench, &client_args, &[], &logs.join("ceiling-push.log"))
                })
                .await)
            },
            async {
                Ok(row(&reg, "push", "vial", true, || {
                    timed(&args.vial, &vial_push, &env, &logs.join("vial-push.log"))
                })
                .await)
            },
        )
        .await?,
    );
    if everyone {
        rows.push(
            row(&reg, "push", "skopeo", true, || {
                timed(
                    &args.skopeo,
                    &[
                        s("--insecure-policy"),
                        s("copy"),
                        s("--dest-tls-verify=false"),
                        s("--preserve-digests"),
                        format!("oci:{}:v1", layout.display()),
                        format!("docker://{host}/files/skopeo:v1"),
                    ],
                    &[],
                    &logs.join("skopeo-push.log"),
                )
            })
            .await,
        );
        let mut oras_args = vec![
            s("-c"),
            s(pushers::ORAS_SCRIPT),
            host.clone(),
            format!("{host}/files/oras:v1"),
        ];
        // Relative names, from the checkpoint directory: they become the layers' titles.
        oras_args.extend(names.iter().cloned());
        rows.push(
            row(&reg, "push", "oras-py", true, || {
                timed_in(
                    &args.python,
                    &oras_args,
                    &[],
                    &logs.join("oras-push.log"),
                    Some(ckpt),
                )
            })
            .await,
        );
    }

    // Pulls, with the registry's data cold (page cache dropped) and warm (read just before).
    let out = dir.join("out");
    let fresh = || {
        let _ = std::fs::remove_dir_all(&out);
        std::fs::create_dir_all(&out)
    };
    for (op, cold) in [("pull (cold)", true), ("pull (warm)", false)] {
        let mut pull_args = vec![
            s("files-client"),
            s("pull"),
            s("--base"),
            base.clone(),
            s("--repo"),
            s("files/ceiling"),
            s("--out"),
            out.display().to_string(),
        ];
        for (n, d) in names.iter().zip(digests) {
            pull_args.extend([s("--name"), n.clone(), s("--digest"), d.clone()]);
        }
        let vial_pull = vec![
            s("pull"),
            format!("{host}/files/vial:v1"),
            out.display().to_string(),
        ];
        rows.extend(
            pair(
                vial_first,
                async {
                    fresh()?;
                    Ok(row(&reg, op, "file-per-layer", cold, || {
                        timed(bench, &pull_args, &[], &logs.join("ceiling-pull.log"))
                    })
                    .await)
                },
                async {
                    fresh()?;
                    Ok(row(&reg, op, "vial", cold, || {
                        timed(&args.vial, &vial_pull, &env, &logs.join("vial-pull.log"))
                    })
                    .await)
                },
            )
            .await?,
        );
        if !everyone {
            continue;
        }
        fresh()?;
        // curl: the transfer alone, nothing verified (a reference, not a peer).
        let mut curl_args = vec![s("-s"), s("--parallel"), s("--parallel-max"), s("16")];
        for (n, d) in names.iter().zip(digests) {
            curl_args.extend([
                s("-o"),
                out.join(n).display().to_string(),
                format!("{base}/v2/files/ceiling/blobs/{d}"),
            ]);
        }
        rows.push(
            row(&reg, op, "curl (unverified)", cold, || {
                timed(&args.curl, &curl_args, &[], &logs.join("curl-pull.log"))
            })
            .await,
        );
        fresh()?;
        rows.push(
            row(&reg, op, "skopeo", cold, || {
                timed(
                    &args.skopeo,
                    &[
                        s("--insecure-policy"),
                        s("copy"),
                        s("--src-tls-verify=false"),
                        format!("docker://{host}/files/skopeo:v1"),
                        format!("oci:{}:v1", out.join("layout").display()),
                    ],
                    &[],
                    &logs.join("skopeo-pull.log"),
                )
            })
            .await,
        );
        fresh()?;
        rows.push(
            row(&reg, op, "oras-py", cold, || {
                timed(
                    &args.python,
                    &[
                        s("-c"),
                        s(ORAS_PULL),
                        host.clone(),
                        format!("{host}/files/oras:v1"),
                        out.display().to_string(),
                    ],
                    &[],
                    &logs.join("oras-pull.log"),
                )
            })
            .await,
        );
    }
    let _ = std::fs::remove_dir_all(&out);
    rows.push(mount_read(&reg, args, &host, names, dir, &logs).await?);
    drop(reg);
    // The next registry starts empty, and this round's data no longer needs the disk.
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path != logs {
            std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path))?;
        }
    }
    rows.push(hashing_push(inputs, dir, &logs).await?);
    std::fs::remove_dir_all(dir)?;
    Ok(rows)
}

/// The file-per-layer push of a client that starts from the files alone and must hash them, as
/// `oras push` does: on a registry of its own, so that no blob it sends is there already.
async fn hashing_push(inputs: &Inputs<'_>, dir: &Path, logs: &Path) -> Result<Row> {
    let reg = Registry::start(
        &inputs.args.backends(),
        inputs.backend,
        &dir.join("hashing"),
    )
    .await?;
    let mut client_args: Vec<String> = ["files-client", "push", "--hash", "--base"]
        .map(String::from)
        .into();
    client_args.extend([
        format!("http://{}", reg.host()?),
        "--repo".into(),
        "files/hashing".into(),
    ]);
    for f in inputs.files {
        client_args.extend(["--file".into(), f.display().to_string()]);
    }
    let log = logs.join("hashing-push.log");
    Ok(row(&reg, "push", HASHING, true, || {
        timed(inputs.bench, &client_args, &[], &log)
    })
    .await)
}

/// A cold full read through a mount: empty node cache, page cache dropped, every file read with
/// 4 MiB reads, all at once.
async fn mount_read(
    reg: &Registry,
    args: &FilesArgs,
    host: &str,
    names: &[String],
    dir: &Path,
    logs: &Path,
) -> Result<Row> {
    let mountpoint = dir.join("mnt");
    let spec = MountSpec {
        vial: args.vial.clone(),
        reference: format!("{host}/files/vial:v1"),
        cache_dir: dir.join("node-cache"),
        cache_size: "64GiB".into(),
        prefetch: "none",
        log: logs.join("mount.log"),
        extra: Vec::new(),
    };
    let mut mount_row = Row {
        op: "full read".into(),
        client: "vial mount".into(),
        ..Row::default()
    };
    match Mounted::mount(&spec, &mountpoint) {
        Ok(m) => {
            sync_disk();
            drop_page_cache()?;
            let paths: Vec<PathBuf> = names.iter().map(|n| mountpoint.join(n)).collect();
            let reg_before = servers::cpu_seconds(reg.server.pid());
            let mount_before = m.pid.and_then(servers::cpu_seconds);
            let s3_before = reg.s3_requests().await;
            let started = std::time::Instant::now();
            match m.read_files(&paths, paths.len()) {
                Ok((_, peak)) => {
                    mount_row.seconds = Some(started.elapsed().as_secs_f64());
                    mount_row.rss_mib = peak.map(|k| k as f64 / 1024.0);
                }
                Err(e) => mount_row.error = Some(format!("{e:#}")),
            }
            mount_row.client_cpu = m
                .pid
                .and_then(servers::cpu_seconds)
                .zip(mount_before)
                .map(|(a, b)| a - b);
            mount_row.registry_cpu = servers::cpu_seconds(reg.server.pid())
                .zip(reg_before)
                .map(|(a, b)| a - b);
            let s3_after = reg.s3_requests().await;
            mount_row.s3 = s3_after
                .into_iter()
                .map(|(k, n)| {
                    let d = n.saturating_sub(s3_before.get(&k).copied().unwrap_or(0));
                    (k, d)
                })
                .filter(|(_, d)| *d > 0)
                .collect();
            let _ = m.unmount();
        }
        Err(e) => mount_row.error = Some(format!("{e:#}")),
    }
    Ok(mount_row)
}

/// One row per (operation, client): the run with the median wall time (the lower middle one for
/// an even count), every run's wall seconds kept beside it. Failed runs are counted, not timed.
fn medians(rows: Vec<Row>) -> Vec<Row> {
    let mut groups: Vec<Vec<Row>> = Vec::new();
    for r in rows {
        match groups
            .iter_mut()
            .find(|g| g[0].op == r.op && g[0].client == r.client)
        {
            Some(g) => g.push(r),
            None => groups.push(vec![r]),
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            let samples: Vec<f64> = g.iter().filter_map(|r| r.seconds).collect();
            let failed = g.len() - samples.len();
            g.sort_by(|a, b| {
                let key = |r: &Row| r.seconds.unwrap_or(f64::INFINITY);
                key(a).total_cmp(&key(b))
            });
            let mut r = g.swap_remove(samples.len().saturating_sub(1) / 2);
            if failed > 0 && r.seconds.is_some() {
                r.error = Some(format!(
                    "{failed} of {} runs failed",
                    samples.len() + failed
                ));
            }
            r.samples = samples;
            r
        })
        .collect()
}

/// `n` concurrent `vial push`es of distinct 1 GiB directories; the registry's peak RSS.
async fn concurrent(args: &FilesArgs, n: usize, work: &Path) -> Result<Concurrent> {
    let dir = work.join("concurrent");
    eprintln!("vial-bench: writing {n} distinct 1 GiB checkpoints");
    for i in 0..n {
        let d = dir.join(format!("c{i}"));
        std::fs::create_dir_all(&d)?;
        crate::containerd::write_random(&d.join("weights.bin"), 1 << 30, 9000 + i as u64)?;
    }
    let server = servers::start_vial(&args.vial, &dir.join("registry"))?;
    let host = pushers::host(&server)?;
    let stop = Arc::new(AtomicBool::new(false));
    let sampler = rss::sampler(server.pid(), Arc::clone(&stop), Duration::from_millis(100));
    let started = std::time::Instant::now();
    let children: Vec<_> = (0..n)
        .map(|i| {
            Command::new(&args.vial)
                .arg("push")
                .arg(dir.join(format!("c{i}")))
                .arg(format!("{host}/concurrent/c{i}"))
                .env("HOME", dir.join("home"))
                .env("VIAL_LOG", "warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
        })
        .collect::<std::io::Result<_>>()?;
    for mut c in children {
        let status = c.wait()?;
        if !status.success() {
            bail!("a concurrent push failed ({status})");
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let (peak_kib, _) = sampler
        .join()
        .map_err(|_| anyhow::anyhow!("RSS sampler panicked"))?;
    let hwm = std::fs::read_to_string(format!("/proc/{}/status", server.pid()))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .unwrap_or(0);
    server.stop_and_delete()?;
    std::fs::remove_dir_all(&dir)?;
    Ok(Concurrent {
        pushes: n,
        seconds,
        registry_peak_rss_mib: peak_kib.max(hwm) as f64 / 1024.0,
    })
}

pub async fn files(mut args: FilesArgs) -> Result<()> {
    if args.sizes.is_empty() {
        args.sizes = if args.quick {
            vec![1.0]
        } else {
            vec![4.0, 8.0]
        };
    }
    // The clients run in other directories: make the tool paths absolute, without resolving
    // symlinks (a venv's python is a symlink, and resolving it leaves the venv).
    for tool in [&mut args.python, &mut args.s3s_fs] {
        if tool.is_relative() && tool.exists() {
            *tool = std::path::absolute(&*tool)?;
        }
    }
    let bench = std::env::current_exe().context("cannot find vial-bench itself")?;
    let _pinned = (!args.keep_page_reporting).then(crate::hostmem::Pinned::start);
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, false)?;
    let mut results = Results {
        machine: machine(),
        ..Results::default()
    };
    for backend in args.backends.clone() {
        for &gib in &args.sizes.clone() {
            match run_size(&args, &backend, gib, &work.path, &bench).await {
                Ok(r) => results.runs.push(r),
                Err(e) => eprintln!("vial-bench: {backend} {gib} GiB failed: {e:#}"),
            }
        }
    }
    let n = args.concurrent.unwrap_or(if args.quick { 4 } else { 16 });
    if n > 0 {
        match concurrent(&args, n, &work.path).await {
            Ok(c) => results.concurrent = Some(c),
            Err(e) => eprintln!("vial-bench: concurrent pushes failed: {e:#}"),
        }
    }
    report(&mut results);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}
