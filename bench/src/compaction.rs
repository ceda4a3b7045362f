//! The `compaction` benchmark: a training run's history (versions of one checkpoint, each
//! rewriting 5% of the tensors) pushed to a registry, most versions deleted and collected, on
//! SQLite + filesystem and on PostgreSQL + s3s-fs. Per backend and deletion pattern (all but every
//! fifth version, then all but the last): what the dry run predicts at several compaction
//! thresholds, then the pass itself with a pull and a push running beside it. Printed: bytes
//! stored against the bytes of the chunks live versions reference, bytes rewritten against the
//! live bytes of the packs compacted, the pass's throughput, and the concurrent pull's and push's
//! slowdown.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::backends::{start_s3, Postgres, ACCESS_KEY, BUCKET, SECRET_KEY};
use crate::checkpoint::{Case, Generator};
use crate::report::{num, si, table, Goal};
use crate::run::machine;
use crate::servers::{self, Server, WorkDir};

#[derive(Debug, Args)]
pub struct CompactionArgs {
    /// The `vial` binary.
    #[arg(long)]
    pub vial: PathBuf,
    /// The s3s-fs binary (the S3-compatible server).
    #[arg(long, default_value = ".ci/tools/bin/s3s-fs")]
    pub s3s_fs: PathBuf,
    /// Directory of PostgreSQL's server binaries (initdb, pg_ctl).
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// Checkpoint size in GiB [default: 4; 0.25 with --quick].
    #[arg(long)]
    pub gib: Option<f64>,
    /// Versions in the history.
    #[arg(long, default_value_t = 20)]
    pub versions: u32,
    /// Only the SQLite + filesystem backend.
    #[arg(long, conflicts_with = "production_only")]
    pub fs_only: bool,
    /// Only the PostgreSQL + s3s-fs backend.
    #[arg(long)]
    pub production_only: bool,
    /// Parent of the run's directory (a real disk, not tmpfs).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long)]
    pub quick: bool,
    /// Keep the run's directory (servers' logs and data) afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// Thresholds the dry run is asked about (the server's default is 10%).
const THRESHOLDS: [&str; 4] = ["5%", "10%", "25%", "50%"];

/// Goals of the issue.
const MAX_STORED_VS_LIVE: f64 = 1.10;
const MAX_REWRITTEN_VS_LIVE: f64 = 1.5;
const MAX_SLOWDOWN: f64 = 1.3;

/// How long after start a registry's janitor is left to finish its first round.
const JANITOR_SETTLES: std::time::Duration = std::time::Duration::from_secs(3);

#[derive(Debug, Default, Serialize)]
struct Prediction {
    threshold: String,
    packs: u64,
    rewritten_bytes: u64,
    pack_bytes_after: u64,
}

#[derive(Debug, Default, Serialize)]
struct Pattern {
    backend: String,
    kept: String,
    versions_kept: usize,
    /// Bytes of the distinct chunks the kept versions list.
    referenced_bytes: u64,
    /// Bytes in the blob store (files under the data directory, or s3s-fs's) before and after.
    stored_before: u64,
    stored_after: u64,
    predictions: Vec<Prediction>,
    packs_compacted: u64,
    rewritten_bytes: u64,
    compacted_live_bytes: u64,
    compacted_dead_bytes: u64,
    compact_seconds: f64,
    pass_seconds: f64,
    /// A pull and a push run together before the pass, beside it, and after it.
    pull_before: f64,
    pull_during: f64,
    pull_after: f64,
    push_before: f64,
    push_during: f64,
    push_after: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: crate::report::Machine,
    checkpoint_bytes: u64,
    versions: u32,
    push_seconds: Vec<(String, f64)>,
    patterns: Vec<Pattern>,
    goals: Vec<Goal>,
}

/// One backend under test: how to start a server on it, and where its bytes are.
struct Backend {
    name: &'static str,
    args: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// The directory whose files are the stored bytes.
    stored: PathBuf,
}

async fn vial(bin: &Path, args: &[&str]) -> Result<String> {
    let out = tokio::process::Command::new(bin)
        .args(args)
        .env("VIAL_LOG", "warn")
        .output()
        .await?;
    if !out.status.success() {
        bail!(
            "vial {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs `vial args`, returning its seconds and what it printed.
async fn timed(bin: &Path, args: &[&str]) -> Result<(f64, String)> {
    let started = Instant::now();
    let out = vial(bin, args).await?;
    Ok((started.elapsed().as_secs_f64(), out))
}

/// A pull of `live` into `pulled` and a push of `side` to `target`, together: their seconds
/// and what each printed.
async fn pull_and_push(
    vial_bin: &Path,
    live: &str,
    pulled: &Path,
    side: &Path,
    target: &str,
) -> Result<((f64, String), (f64, String))> {
    let pulled = pulled.to_str().context("path")?;
    let side = side.to_str().context("path")?;
    let (pull, push) = (["pull", live, pulled], ["push", side, target, "--json"]);
    tokio::try_join!(timed(vial_bin, &pull), timed(vial_bin, &push))
}

/// The bytes a `vial push --json` uploaded.
fn uploaded(out: &str) -> Result<u64> {
    let v: serde_json::Value = serde_json::from_str(out)?;
    v["bytes_uploaded"]
        .as_u64()
        .context("push printed no bytes_uploaded")
}

/// Starts the registry on `backend` with compaction at `threshold` and waits until it answers
/// and its janitor's first round (which purges expired deleted versions, beside which a dry run
/// would miss what the purge changes: docs/gc.md, "Left for later") is over.
async fn start(bin: &Path, dir: &Path, backend: &Backend, threshold: &str) -> Result<Server> {
    let mut args: Vec<String> = [
        "--retention",
        "0s",
        "--gc-grace",
        "0s",
        "--gc-interval",
        "0s",
        "--gc-compact-threshold",
        threshold,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(backend.args.iter().cloned());
    let mut server = servers::start_vial_with(bin, dir, &args, &backend.env)?;
    server.wait_ready("v2/").await?;
    tokio::time::sleep(JANITOR_SETTLES).await;
    Ok(server)
}

fn addr(server: &Server) -> String {
    server
        .base
        .as_str()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned()
}

/// Bytes of the distinct chunks the versions `digests` of `repo` list.
async fn referenced(server: &Server, repo: &str, digests: &[String]) -> Result<u64> {
    let client = reqwest::Client::new();
    let get = |digest: String| {
        let url = server.url(&format!("v2/{repo}/manifests/{digest}"));
        let client = client.clone();
        async move {
            let v: serde_json::Value = client
                .get(url?)
                .header(
                    "accept",
                    "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json",
                )
                .send()
                .await?
                .error_for_status()?
                .json()
                .await?;
            anyhow::Ok(v)
        }
    };
    let mut chunks: HashMap<String, u64> = HashMap::new();
    for digest in digests {
        let index = get(digest.clone()).await?;
        for child in index["manifests"].as_array().context("not an index")? {
            if child["artifactType"] != "application/vnd.vial.chunks.v1" {
                continue;
            }
            let part = get(child["digest"].as_str().context("no digest")?.to_owned()).await?;
            for l in part["layers"].as_array().context("no layers")? {
                chunks.insert(
                    l["digest"].as_str().context("no digest")?.to_owned(),
                    l["size"].as_u64().context("no size")?,
                );
            }
        }
    }
    Ok(chunks.values().sum())
}

fn field(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or(0)
}

pub async fn compaction(args: CompactionArgs) -> Result<()> {
    let gib = args.gib.unwrap_or(if args.quick { 0.25 } else { 4.0 });
    let bytes = (gib * (1u64 << 30) as f64) as u64;
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, args.keep)?;
    let dir = work.path.clone();
    println!(
        "vial-bench compaction{}",
        if args.quick { " --quick" } else { "" }
    );
    let m = machine();
    println!("date:     {}", m.date);
    println!("machine:  nproc {}, {}, {}", m.nproc, m.cpu_model, m.kernel);
    println!(
        "workload: {} versions of a {} checkpoint, each rewriting 5% of the tensors",
        args.versions,
        si(Some(bytes))
    );
    let generator = Generator::new(bytes, 4)?;

    let mut backends = vec![Backend {
        name: "SQLite + filesystem",
        args: Vec::new(),
        env: Vec::new(),
        stored: dir.join("fs").join("data"),
    }];
    let mut keep_alive = Vec::new();
    let mut pg_keep = None;
    if args.production_only {
        backends.clear();
    }
    if !args.fs_only {
        let pg = Postgres::start(&args.pg_bin, &dir.join("postgres"))
            .context("could not start PostgreSQL")?;
        let s3 = start_s3(&args.s3s_fs, &dir.join("s3"))
            .await
            .context("could not start s3s-fs")?;
        backends.push(Backend {
            name: "PostgreSQL + s3s-fs",
            args: vec![
                "--metadata-url".into(),
                pg.url(),
                "--blob-url".into(),
                format!("s3://{BUCKET}/compaction"),
            ],
            env: vec![
                (
                    "AWS_ENDPOINT_URL",
                    s3.base.as_str().trim_end_matches('/').to_owned(),
                ),
                ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
                ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
                ("AWS_REGION", "us-east-1".to_owned()),
            ],
            stored: dir.join("s3").join("data").join(BUCKET),
        });
        keep_alive.push(s3);
        pg_keep = Some(pg);
    }

    let mut results = Results {
        machine: m,
        checkpoint_bytes: bytes,
        versions: args.versions,
        push_seconds: Vec::new(),
        patterns: Vec::new(),
        goals: Vec::new(),
    };
    // Directories pushed alone before the pass and beside it: fresh random bytes each time, so
    // no push finds another's chunks.
    let side_bytes_each = (bytes / 4).max(16 << 20);
    let mut side_seed = 0u64;
    let mut side_dir = |name: &str| -> Result<PathBuf> {
        side_seed += 1;
        let d = dir.join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d)?;
        let file = 16 << 20;
        for i in 0..side_bytes_each.div_ceil(file) {
            let mut buf = vec![0u8; file as usize];
            crate::data::xorshift_fill(&mut buf, side_seed * 1000 + i);
            std::fs::write(d.join(format!("part-{i}")), &buf)?;
        }
        Ok(d)
    };
    for backend in &backends {
        let server_dir = dir.join(if backend.stored.starts_with(dir.join("fs")) {
            "fs"
        } else {
            "pgs3"
        });
        let mut server = start(&args.vial, &server_dir, backend, "10%").await?;
        let repo = "bench/run";
        let reference = format!("{}/{repo}", addr(&server));
        eprintln!(
            "vial-bench: pushing {} versions to {}",
            args.versions, backend.name
        );
        let scratch = dir.join("round-base");
        let mut digests = Vec::new();
        let mut previous: Option<PathBuf> = None;
        for round in 0..args.versions {
            let round_dir = dir.join(format!("round-{round}"));
            if round == 0 {
                generator.write(Case::Base, &scratch, &scratch)?;
                generator.write(Case::Base, &round_dir, &scratch)?;
            } else {
                generator.write(Case::Round(round), &round_dir, &scratch)?;
            }
            let started = Instant::now();
            let out = vial(
                &args.vial,
                &[
                    "push",
                    round_dir.to_str().context("path")?,
                    &reference,
                    "--json",
                ],
            )
            .await?;
            results
                .push_seconds
                .push((backend.name.to_owned(), started.elapsed().as_secs_f64()));
            let v: serde_json::Value = serde_json::from_str(&out)?;
            digests.push(v["digest"].as_str().context("no digest")?.to_owned());
            if let Some(p) = previous.replace(round_dir) {
                std::fs::remove_dir_all(p)?;
            }
        }
        if let Some(last) = previous {
            std::fs::remove_dir_all(last)?;
        }
        let n = digests.len();
        let every_fifth: Vec<usize> = (0..n).filter(|i| i % 5 == 0 || *i == n - 1).collect();
        let patterns: [(&str, Vec<usize>); 2] = [
            ("all but every fifth", every_fifth.clone()),
            ("all but the last", vec![n - 1]),
        ];
        let mut deleted = vec![false; n];
        // Bytes the side pushes stored, which are not the history's.
        let mut side_bytes = 0;
        for (kept_name, kept) in patterns {
            for (i, d) in digests.iter().enumerate() {
                if !kept.contains(&i) && !deleted[i] {
                    let at = format!("{}/{repo}@{d}", addr(&server));
                    vial(&args.vial, &["rm", &at]).await?;
                    deleted[i] = true;
                }
            }
            let kept_digests: Vec<String> = kept.iter().map(|i| digests[*i].clone()).collect();
            let mut p = Pattern {
                backend: backend.name.to_owned(),
                kept: kept_name.to_owned(),
                versions_kept: kept.len(),
                referenced_bytes: referenced(&server, repo, &kept_digests).await?,
                stored_before: servers::du(&backend.stored) - side_bytes,
                ..Pattern::default()
            };
            // What the dry run predicts at each threshold (a server restarted with it).
            for threshold in THRESHOLDS {
                server.stop_and_keep();
                server = start(&args.vial, &server_dir, backend, threshold).await?;
                let dry: serde_json::Value = serde_json::from_str(
                    &vial(&args.vial, &["gc", &addr(&server), "--dry-run", "--json"]).await?,
                )?;
                eprintln!(
                    "vial-bench: {} {kept_name} dry run at {threshold}: {dry}",
                    backend.name
                );
                p.predictions.push(Prediction {
                    threshold: threshold.to_owned(),
                    packs: field(&dry, "packs_compacted"),
                    rewritten_bytes: field(&dry, "rewritten_bytes"),
                    pack_bytes_after: field(&dry, "pack_bytes_after"),
                });
            }
            server.stop_and_keep();
            server = start(&args.vial, &server_dir, backend, "10%").await?;
            let host = addr(&server);
            let live_ref = format!("{host}/{repo}@{}", digests[n - 1]);
            // A pull and a push together without a pass, then the same two beside the pass:
            // the slowdown is the pass's, not the one client's on the other.
            let pulled = dir.join("pulled");
            let side_a = side_dir("side-a")?;
            let side_b = side_dir("side-b")?;
            let alone = format!("{host}/bench/side-{}-alone", p.kept.len());
            let ((pull_before, _), (push_before, out)) =
                pull_and_push(&args.vial, &live_ref, &pulled, &side_a, &alone).await?;
            (p.pull_before, p.push_before) = (pull_before, push_before);
            side_bytes += uploaded(&out)?;
            std::fs::remove_dir_all(&pulled)?;
            // What the dry run says right before the pass, at the threshold it runs at.
            let dry: serde_json::Value = serde_json::from_str(
                &vial(&args.vial, &["gc", &host, "--dry-run", "--json"]).await?,
            )?;
            eprintln!(
                "vial-bench: {} {} dry run before the pass: {dry}",
                backend.name, p.kept
            );
            let during = format!("{host}/bench/side-{}-during", p.kept.len());
            let clients = pull_and_push(&args.vial, &live_ref, &pulled, &side_b, &during);
            let pass = async {
                let started = Instant::now();
                let out = vial(&args.vial, &["gc", &host, "--json"]).await?;
                anyhow::Ok((started.elapsed().as_secs_f64(), out))
            };
            let (((pull_during, _), (push_during, out)), (pass_seconds, pass)) =
                tokio::try_join!(clients, pass)?;
            (p.pull_during, p.push_during, p.pass_seconds) =
                (pull_during, push_during, pass_seconds);
            let pass: serde_json::Value = serde_json::from_str(&pass)?;
            eprintln!("vial-bench: {} {} pass: {pass}", backend.name, p.kept);
            side_bytes += uploaded(&out)?;
            std::fs::remove_dir_all(&pulled)?;
            // Once more after the pass: the first pair ran with colder caches than the second,
            // so the pass is held to this one, the warmer.
            let side_c = side_dir("side-c")?;
            let after = format!("{host}/bench/side-{}-after", p.kept.len());
            let ((pull_after, _), (push_after, out)) =
                pull_and_push(&args.vial, &live_ref, &pulled, &side_c, &after).await?;
            (p.pull_after, p.push_after) = (pull_after, push_after);
            side_bytes += uploaded(&out)?;
            std::fs::remove_dir_all(&pulled)?;
            p.packs_compacted = field(&pass, "packs_compacted");
            p.rewritten_bytes = field(&pass, "rewritten_bytes");
            p.compacted_dead_bytes = field(&pass, "compacted_dead_bytes");
            p.compacted_live_bytes = p.rewritten_bytes;
            p.compact_seconds = pass["compact_seconds"].as_f64().unwrap_or(0.0);
            // The side pushes are not the history's: counted out of what is stored.
            p.stored_after = servers::du(&backend.stored) - side_bytes;
            results.patterns.push(p);
        }
        if args.keep {
            server.stop_and_keep();
        } else {
            server.stop_and_delete()?;
        }
    }
    drop(keep_alive);
    drop(pg_keep);
    print(&mut results);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    Ok(())
}

fn print(r: &mut Results) {
    let rows: Vec<Vec<String>> = r
        .patterns
        .iter()
        .flat_map(|p| {
            p.predictions.iter().map(move |d| {
                vec![
                    p.backend.clone(),
                    p.kept.clone(),
                    d.threshold.clone(),
                    d.packs.to_string(),
                    si(Some(d.rewritten_bytes)),
                    si(Some(d.pack_bytes_after)),
                ]
            })
        })
        .collect();
    table(
        "Dry run by threshold",
        &[
            "backend",
            "kept",
            "threshold",
            "packs",
            "rewrites",
            "packs after",
        ],
        &rows,
    );
    let rows: Vec<Vec<String>> = r
        .patterns
        .iter()
        .map(|p| {
            let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
            vec![
                p.backend.clone(),
                p.kept.clone(),
                si(Some(p.referenced_bytes)),
                si(Some(p.stored_before)),
                si(Some(p.stored_after)),
                num(
                    Some(ratio(p.stored_after as f64, p.referenced_bytes as f64)),
                    2,
                ),
                p.packs_compacted.to_string(),
                si(Some(p.rewritten_bytes)),
                num(
                    Some(ratio(
                        (p.rewritten_bytes + p.compacted_dead_bytes) as f64 / 1e6,
                        p.compact_seconds,
                    )),
                    0,
                ),
                format!(
                    "{} / {}",
                    num(Some(ratio(p.pull_during, p.pull_before)), 2),
                    num(Some(ratio(p.pull_during, p.pull_after)), 2)
                ),
                format!(
                    "{} / {}",
                    num(Some(ratio(p.push_during, p.push_before)), 2),
                    num(Some(ratio(p.push_during, p.push_after)), 2)
                ),
            ]
        })
        .collect();
    table(
        "The pass at the default threshold (10%)",
        &[
            "backend",
            "kept",
            "referenced",
            "stored before",
            "stored after",
            "after/referenced",
            "packs compacted",
            "rewritten",
            "MB/s of packs",
            "pull slowdown (vs before / after)",
            "push slowdown (vs before / after)",
        ],
        &rows,
    );
    for p in &r.patterns {
        let stored = p.stored_after as f64 / p.referenced_bytes.max(1) as f64;
        r.goals.push(Goal {
            goal: format!(
                "{}, {}: stored after the pass ≤ {MAX_STORED_VS_LIVE}x the chunks live versions list",
                p.backend, p.kept
            ),
            pass: Some(stored <= MAX_STORED_VS_LIVE),
            detail: format!("{stored:.3}x"),
        });
        let rewritten = p.rewritten_bytes as f64 / p.compacted_live_bytes.max(1) as f64;
        r.goals.push(Goal {
            goal: format!(
                "{}, {}: rewritten ≤ {MAX_REWRITTEN_VS_LIVE}x the live bytes of the packs compacted",
                p.backend, p.kept
            ),
            pass: (p.packs_compacted > 0).then_some(rewritten <= MAX_REWRITTEN_VS_LIVE),
            detail: format!("{rewritten:.2}x of {}", si(Some(p.compacted_live_bytes))),
        });
        for (what, during, alone) in [
            ("pull", p.pull_during, p.pull_after),
            ("push", p.push_during, p.push_after),
        ] {
            let slowdown = during / alone;
            r.goals.push(Goal {
                goal: format!(
                    "{}, {}: a {what} beside the pass ≤ {MAX_SLOWDOWN}x the same after it",
                    p.backend, p.kept
                ),
                pass: Some(slowdown <= MAX_SLOWDOWN),
                detail: format!("{slowdown:.2}x ({during:.2} s against {alone:.2} s)"),
            });
        }
    }
    crate::report::print_goal_list(&r.goals, &[]);
}
