//! Metadata at fleet scale: a PostgreSQL metadata store grown synthetically to N blob rows, shaped
//! as vial's pushes write them (volumes of versions, each version an index over one part manifest
//! listing its chunks, 5% of the chunks new per version), then the request paths that must stay
//! flat in N measured through the HTTP API, and a collection pass after deleting 5% of versions.
//!
//! The rows are bulk-inserted with SQL for speed, with PostgreSQL's constraint triggers off during
//! the load (`session_replication_role = replica`); they are generated to satisfy every
//! constraint, and the candidate table is seeded as migration 6 seeds it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::backends::Postgres;
use crate::report::{self, median, num, table, Goal};
use crate::servers;

/// Issue #22's goal for collection: a pass collects at least this many blobs a second, whatever
/// the store's size.
const MIN_BLOBS_PER_SECOND: f64 = 10_000.0;
/// Issue #22's goal for the presence check of 4,096 digests, in milliseconds; the issue asks it of
/// a store of 1e7 blobs, and the bench judges it at every size it ran, naming the size.
const MAX_PRESENCE_MS: f64 = 100.0;

#[derive(Debug, Args)]
pub struct ScaleArgs {
    /// The `vial` binary to benchmark.
    #[arg(long)]
    pub vial: PathBuf,
    /// Blob rows to grow the store to, one run each (comma-separated: 100000,1000000,10000000).
    #[arg(long, value_delimiter = ',', default_values_t = [100_000u64, 1_000_000])]
    pub blobs: Vec<u64>,
    /// Versions per volume.
    #[arg(long, default_value_t = 100)]
    pub versions: u64,
    /// Chunks each version lists.
    #[arg(long, default_value_t = 1000)]
    pub chunks: u64,
    /// New chunks per version (the rest are the previous version's).
    #[arg(long, default_value_t = 50)]
    pub new_per_version: u64,
    /// PostgreSQL's server binaries (initdb, pg_ctl).
    #[arg(long, default_value = "/usr/lib/postgresql/15/bin")]
    pub pg_bin: PathBuf,
    /// Parent of the run's directory (a real disk: 1e6 blobs take about 5 GB).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Write all figures to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Log every statement of the GC dry run and pass after the deletions and print where their
    /// database time went, by statement (slows them a little).
    #[arg(long)]
    pub statement_log: bool,
    /// Leave the last size's PostgreSQL running with its data, to examine plans afterwards
    /// (its URL is printed; stop it with `pg_ctl -D DIR/pg stop`).
    #[arg(long)]
    pub keep: bool,
}

#[derive(Debug, Default, Serialize)]
struct Run {
    blobs: u64,
    volumes: u64,
    references: u64,
    load_seconds: f64,
    presence_4096_ms: Option<f64>,
    manifest_put_1000_ms: Option<f64>,
    head_p50_ms: Option<f64>,
    head_p99_ms: Option<f64>,
    versions_listing_ms: Option<f64>,
    first_pass_seconds: f64,
    first_pass_examined: u64,
    versions_deleted: u64,
    dry_run_seconds: f64,
    dry_run_blobs: u64,
    pass_seconds: f64,
    purge_seconds: f64,
    pass_blobs: u64,
    pass_examined: u64,
    blobs_per_second: f64,
    table_mb: Vec<(String, f64)>,
}

fn digest(text: &str) -> String {
    vial_core::Algorithm::Sha256
        .digest_bytes(text.as_bytes())
        .to_string()
}

fn psql(url: &str, sql: &str) -> Result<String> {
    let out = Command::new("psql")
        .args(["-d", url, "-v", "ON_ERROR_STOP=1", "-At", "-c", sql])
        .stdin(Stdio::null())
        .output()?;
    if !out.status.success() {
        bail!("psql: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// The SQL that grows an empty (migrated) store to `volumes` volumes.
fn load_sql(args: &ScaleArgs, volumes: u64) -> String {
    let (k, c, n) = (args.versions, args.chunks, args.new_per_version);
    let per_volume = c + (k - 1) * n;
    let volume_type = vial_core::volume::VOLUME_ARTIFACT_TYPE;
    format!(
        "SET session_replication_role = replica;
         INSERT INTO repositories (name, created_at)
           SELECT 'scale/v' || v, 0 FROM generate_series(0, {last_volume}) v;
         CREATE TEMP TABLE chunk AS
           SELECT r.id AS rid, v, i, row_number() OVER () AS bid,
                  'sha256:' || encode(sha256(convert_to('scale ' || v || ' ' || i, 'UTF8')), 'hex') AS digest
             FROM generate_series(0, {last_volume}) v
             JOIN repositories r ON r.name = 'scale/v' || v
            CROSS JOIN generate_series(0, {last_chunk}) i;
         INSERT INTO blobs (id, digest, size, created_at, touched_at) SELECT bid, digest, 1048576, 0, 0 FROM chunk;
         SELECT setval(pg_get_serial_sequence('blobs', 'id'), (SELECT max(id) FROM blobs));
         INSERT INTO repository_blobs (repository_id, blob_id, created_at) SELECT rid, bid, 0 FROM chunk;
         INSERT INTO gc_candidates (blob_id) SELECT bid FROM chunk;
         CREATE TEMP TABLE version AS
           SELECT r.id AS rid, v, k, 2 * row_number() OVER () AS pid,
                  'sha256:' || encode(sha256(convert_to('index ' || v || ' ' || k, 'UTF8')), 'hex') AS idx,
                  'sha256:' || encode(sha256(convert_to('part ' || v || ' ' || k, 'UTF8')), 'hex') AS part
             FROM generate_series(0, {last_volume}) v
             JOIN repositories r ON r.name = 'scale/v' || v
            CROSS JOIN generate_series(0, {last_version}) k;
         INSERT INTO manifests (id, repository_id, digest, media_type, artifact_type, size, content, created_at)
           SELECT pid - 1, rid, idx, 'application/vnd.oci.image.index.v1+json', '{volume_type}', 2, convert_to('{{}}', 'UTF8'), k FROM version
           UNION ALL
           SELECT pid, rid, part, 'application/vnd.oci.image.manifest.v1+json', NULL, 2, convert_to('{{}}', 'UTF8'), k FROM version;
         SELECT setval(pg_get_serial_sequence('manifests', 'id'), (SELECT max(id) FROM manifests));
         INSERT INTO manifest_references (repository_id, manifest_digest, target_digest, is_manifest)
           SELECT rid, idx, part, true FROM version;
         INSERT INTO manifest_blobs (manifest_id, blob_id)
           SELECT ver.pid, c.bid
             FROM version ver JOIN chunk c ON c.v = ver.v AND c.i >= ver.k * {n} AND c.i < ver.k * {n} + {c};
         INSERT INTO tags (repository_id, name, manifest_digest, updated_at)
           SELECT rid, 'latest', idx, 0 FROM version WHERE k = {last_version};
         SET session_replication_role = DEFAULT;
         ANALYZE;",
        last_volume = volumes - 1,
        last_chunk = per_volume - 1,
        last_version = k - 1,
    )
}

async fn timed<F, T>(f: F) -> Result<(f64, T)>
where
    F: std::future::Future<Output = Result<T>>,
{
    let t = Instant::now();
    let v = f.await?;
    Ok((t.elapsed().as_secs_f64() * 1000.0, v))
}

async fn run_size(args: &ScaleArgs, target: u64, work: &Path) -> Result<Run> {
    let per_volume = args.chunks + (args.versions - 1) * args.new_per_version;
    let volumes = target.div_ceil(per_volume).max(2);
    let dir = work.join(format!("scale-{target}"));
    std::fs::create_dir_all(&dir)?;
    let pg = Postgres::start(&args.pg_bin, &dir)?;
    let url = pg.url();
    // Deleted versions go at the next pass; the schedule is off, so passes run when asked. The
    // janitor, which also purges deleted versions past retention, runs only at start: left on its
    // ten-minute tick it purged them during the dry run in some runs and not in others, so the
    // pass that followed had the purge to do or not.
    let serve_args: Vec<String> = [
        "--metadata-url",
        &url,
        "--retention",
        "0s",
        "--gc-interval",
        "0s",
        "--janitor-interval",
        "100days",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let server = servers::start_vial_with(&args.vial, &dir.join("vial"), &serve_args, &[])?;
    let base = server.url("")?.to_string();
    let base = base.trim_end_matches('/').to_owned();
    let http = reqwest::Client::builder().no_proxy().build()?;
    http.get(format!("{base}/v2/"))
        .send()
        .await
        .context("vial does not answer")?;

    let mut run = Run {
        volumes,
        ..Run::default()
    };
    eprintln!("vial-bench: scale: loading {volumes} volumes of {per_volume} blobs");
    let t = Instant::now();
    psql(&url, &load_sql(args, volumes))?;
    run.load_seconds = t.elapsed().as_secs_f64();
    run.blobs = psql(&url, "SELECT count(*) FROM blobs")?.parse()?;
    run.references = psql(
        &url,
        "SELECT (SELECT count(*) FROM manifest_blobs) + (SELECT count(*) FROM manifest_references)",
    )?
    .parse()?;

    let chunk = |v: u64, i: u64| digest(&format!("scale {v} {i}"));
    // Presence check of 4,096 digests of one volume: the first call touches them all, the later
    // ones find them touched.
    let asked: Vec<String> = (0..4096).map(|i| chunk(0, i)).collect();
    let body = serde_json::json!({ "digests": asked });
    let mut ms = Vec::new();
    for _ in 0..5 {
        let (t, r) = timed(async {
            Ok(http
                .post(format!("{base}/v2/scale/v0/_vial/blobs/present"))
                .json(&body)
                .send()
                .await?)
        })
        .await?;
        if !r.status().is_success() {
            bail!("presence check answered {}", r.status());
        }
        ms.push(t);
    }
    run.presence_4096_ms = median(&ms);

    // A manifest of 1,000 layers the repository holds.
    let layer = |i: u64| serde_json::json!({"mediaType": "application/octet-stream", "digest": chunk(1, i), "size": 1048576});
    ms.clear();
    for n in 0..5u64 {
        let manifest = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": chunk(1, 0), "size": 1048576},
            "layers": (0..1000).map(layer).collect::<Vec<_>>(),
            "annotations": {"run": n.to_string()},
        });
        let (t, r) = timed(async {
            Ok(http
                .put(format!("{base}/v2/scale/v1/manifests/put-{n}"))
                .header("content-type", "application/vnd.oci.image.manifest.v1+json")
                .body(serde_json::to_vec(&manifest)?)
                .send()
                .await?)
        })
        .await?;
        if r.status() != 201 {
            bail!("manifest PUT answered {}: {}", r.status(), r.text().await?);
        }
        ms.push(t);
    }
    run.manifest_put_1000_ms = median(&ms);

    // Blob HEADs spread over every volume.
    ms.clear();
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let (v, i) = (x % volumes, (x >> 20) % per_volume);
        let (t, r) = timed(async {
            Ok(http
                .head(format!("{base}/v2/scale/v{v}/blobs/{}", chunk(v, i)))
                .send()
                .await?)
        })
        .await?;
        if r.status() != 200 {
            bail!("blob HEAD answered {}", r.status());
        }
        ms.push(t);
    }
    ms.sort_by(f64::total_cmp);
    run.head_p50_ms = ms.get(ms.len() / 2).copied();
    run.head_p99_ms = ms.get(ms.len() * 99 / 100).copied();

    ms.clear();
    for _ in 0..5 {
        let (t, r) = timed(async {
            Ok(http
                .get(format!("{base}/v2/scale/v2/_vial/versions"))
                .send()
                .await?)
        })
        .await?;
        if r.status() != 200 {
            bail!("versions listing answered {}", r.status());
        }
        ms.push(t);
    }
    run.versions_listing_ms = median(&ms);

    let gc = |dry: bool| {
        let http = http.clone();
        let url = format!("{base}/v2/_vial/gc?dry-run={dry}&wait=30");
        let base = base.clone();
        async move {
            let t = Instant::now();
            let r = http.post(url).send().await?;
            if !r.status().is_success() {
                bail!("gc answered {}: {}", r.status(), r.text().await?);
            }
            let mut body: serde_json::Value = r.json().await?;
            if dry {
                return Ok((t.elapsed().as_secs_f64(), body));
            }
            // A real pass is a job: follow it to the end.
            while !matches!(body["state"].as_str(), Some("done" | "failed")) {
                let id = body["id"].as_str().unwrap_or_default();
                let status = format!("{base}/v2/_vial/gc/{id}?wait=30");
                body = http
                    .get(status)
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
            }
            if body["state"] != "done" {
                bail!("the gc pass failed: {}", body["error"]);
            }
            Ok::<_, anyhow::Error>((t.elapsed().as_secs_f64(), body["report"].clone()))
        }
    };
    let count = |r: &serde_json::Value, k: &str| r[k].as_u64().unwrap_or(0);
    // The first pass after the load looks at every seeded candidate once, as after migration 6.
    let (secs, first) = gc(false).await?;
    run.first_pass_seconds = secs;
    run.first_pass_examined = count(&first, "examined");

    // Delete the oldest 5% of every volume's versions.
    let per = (args.versions / 20).max(1);
    for v in 0..volumes {
        for k in 0..per {
            let idx = digest(&format!("index {v} {k}"));
            let r = http
                .delete(format!("{base}/v2/scale/v{v}/manifests/{idx}"))
                .send()
                .await?;
            if r.status() != 202 {
                bail!("DELETE answered {}", r.status());
            }
            run.versions_deleted += 1;
        }
    }
    // The statement log, when asked for, covers the dry run and the pass, one summary each.
    let log = dir.join("pg.log");
    let log_size = || std::fs::metadata(&log).map(|m| m.len()).unwrap_or(0);
    if args.statement_log {
        psql(&url, "ALTER SYSTEM SET log_min_duration_statement = 0")?;
        psql(&url, "SELECT pg_reload_conf()")?;
    }
    let logged_from = log_size();
    let (secs, dry) = gc(true).await?;
    if args.statement_log {
        print_statement_log("the dry run", &log, logged_from, secs)?;
    }
    run.dry_run_seconds = secs;
    run.dry_run_blobs = count(&dry, "blobs");
    let logged_from = log_size();
    let (secs, pass) = gc(false).await?;
    if args.statement_log {
        psql(&url, "ALTER SYSTEM RESET log_min_duration_statement")?;
        psql(&url, "SELECT pg_reload_conf()")?;
        print_statement_log("the pass", &log, logged_from, secs)?;
    }
    run.pass_seconds = secs;
    run.pass_blobs = count(&pass, "blobs");
    run.pass_examined = count(&pass, "examined");
    run.purge_seconds = pass["purge_seconds"].as_f64().unwrap_or(0.0);
    run.blobs_per_second = run.pass_blobs as f64 / secs;

    for t in [
        "blobs",
        "repository_blobs",
        "manifest_blobs",
        "manifest_references",
        "manifests",
        "gc_candidates",
    ] {
        let bytes: f64 = psql(&url, &format!("SELECT pg_total_relation_size('{t}')"))?.parse()?;
        run.table_mb.push((t.to_owned(), bytes / 1e6));
    }
    server.stop_and_delete()?;
    if args.keep && Some(&target) == args.blobs.last() {
        eprintln!("vial-bench: scale: kept {} at {url}", dir.display());
        std::mem::forget(pg);
    } else {
        drop(pg);
        std::fs::remove_dir_all(&dir)?;
    }
    Ok(run)
}

/// Sums the statement durations PostgreSQL logged in `log` after byte `from`, by statement
/// (its first words, numbers and values elided), and prints the 12 that took longest.
fn print_statement_log(what: &str, log: &Path, from: u64, seconds: f64) -> Result<()> {
    let text = std::fs::read(log)?;
    let text = String::from_utf8_lossy(&text[(from as usize).min(text.len())..]).into_owned();
    let mut by_statement: std::collections::HashMap<String, (f64, u64)> = Default::default();
    let mut total = 0.0;
    for line in text.lines() {
        let Some(rest) = line.split("duration: ").nth(1) else {
            continue;
        };
        let Some((ms, statement)) = rest.split_once(" ms") else {
            continue;
        };
        let Ok(ms) = ms.parse::<f64>() else { continue };
        // "  parse <unnamed>: SELECT ..." / "  execute s3/p1: ..." / "  statement: ..."
        let statement = statement.trim();
        let (step, sql) = statement.split_once(": ").unwrap_or(("", statement));
        let step = step.split_whitespace().next().unwrap_or("");
        let sql: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        let key = format!("{step:8} {}", sql.chars().take(110).collect::<String>());
        let e = by_statement.entry(key).or_default();
        e.0 += ms;
        e.1 += 1;
        total += ms;
    }
    let mut rows: Vec<_> = by_statement.into_iter().collect();
    rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
    eprintln!(
        "vial-bench: scale: {what} took {seconds:.2} s, {:.2} s of it in logged statements:",
        total / 1000.0
    );
    for (statement, (ms, n)) in rows.iter().take(12) {
        eprintln!("  {:9.1} ms {n:7}x  {statement}", ms);
    }
    Ok(())
}

pub async fn scale(args: ScaleArgs) -> Result<()> {
    if args.versions < 2 || args.chunks == 0 || args.new_per_version == 0 {
        bail!("--versions must be at least 2, --chunks and --new-per-version at least 1");
    }
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = servers::WorkDir::create(&parent, args.keep)?;
    let mut runs = Vec::new();
    for &n in &args.blobs {
        runs.push(run_size(&args, n, &work.path).await?);
    }
    let ms = |v: Option<f64>| num(v, 1);
    let mut rows = vec![
        vec!["blob rows".to_owned()],
        vec!["reference rows (blobs and child manifests)".to_owned()],
        vec!["load (s)".to_owned()],
        vec!["presence check, 4,096 digests (ms)".to_owned()],
        vec!["manifest PUT, 1,000 layers (ms)".to_owned()],
        vec!["blob HEAD p50 / p99 (ms)".to_owned()],
        vec!["versions listing (ms)".to_owned()],
        vec!["first pass after the load: s / candidates".to_owned()],
        vec!["versions deleted".to_owned()],
        vec!["GC dry run: s / blobs".to_owned()],
        vec!["GC pass: s / blobs / candidates".to_owned()],
        vec!["of which purging the deleted versions (s)".to_owned()],
        vec!["GC pass: blobs per second".to_owned()],
    ];
    for r in &runs {
        let cells = [
            r.blobs.to_string(),
            r.references.to_string(),
            format!("{:.0}", r.load_seconds),
            ms(r.presence_4096_ms),
            ms(r.manifest_put_1000_ms),
            format!("{} / {}", ms(r.head_p50_ms), ms(r.head_p99_ms)),
            ms(r.versions_listing_ms),
            format!("{:.2} / {}", r.first_pass_seconds, r.first_pass_examined),
            r.versions_deleted.to_string(),
            format!("{:.2} / {}", r.dry_run_seconds, r.dry_run_blobs),
            format!(
                "{:.2} / {} / {}",
                r.pass_seconds, r.pass_blobs, r.pass_examined
            ),
            format!("{:.2}", r.purge_seconds),
            format!("{:.0}", r.blobs_per_second),
        ];
        for (row, cell) in rows.iter_mut().zip(cells) {
            row.push(cell);
        }
    }
    for t in [
        "blobs",
        "repository_blobs",
        "manifest_blobs",
        "manifest_references",
        "manifests",
        "gc_candidates",
    ] {
        let mut row = vec![format!("{t} with indexes (MB)")];
        for r in &runs {
            let mb = r.table_mb.iter().find(|(n, _)| n == t).map(|(_, mb)| *mb);
            row.push(num(mb, 0));
        }
        rows.push(row);
    }
    let mut header = vec!["PostgreSQL metadata store".to_owned()];
    header.extend(args.blobs.iter().map(|n| format!("{n} blobs")));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    table(
        &format!(
            "metadata at scale: volumes of {} versions x {} chunks, {} new per version",
            args.versions, args.chunks, args.new_per_version
        ),
        &header,
        &rows,
    );
    // The third goal, request paths flat or logarithmic in N, has no bound the bench could
    // check without inventing one: the table above is its evidence, judged by reading it.
    report::print_goal_list(&evaluate(&runs), &[]);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&runs)?)?;
    }
    Ok(())
}

/// Issue #22's two goals with a number, at each size that ran.
fn evaluate(runs: &[Run]) -> Vec<Goal> {
    let mut goals = Vec::new();
    for r in runs {
        goals.push(Goal {
            goal: format!(
                "{} blobs: presence check of 4,096 digests < {MAX_PRESENCE_MS} ms",
                r.blobs
            ),
            pass: r.presence_4096_ms.map(|ms| ms < MAX_PRESENCE_MS),
            detail: format!("{} ms, median of 5", num(r.presence_4096_ms, 1)),
        });
    }
    for r in runs {
        let rate = Some(r.blobs_per_second).filter(|x| x.is_finite());
        goals.push(Goal {
            goal: format!(
                "{} blobs: GC pass >= {MIN_BLOBS_PER_SECOND} blobs per second",
                r.blobs
            ),
            pass: rate.map(|x| x >= MIN_BLOBS_PER_SECOND),
            detail: format!(
                "{} ({} blobs in {:.2} s)",
                num(rate, 0),
                r.pass_blobs,
                r.pass_seconds
            ),
        });
    }
    goals
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(blobs: u64, presence_ms: f64, pass_blobs: u64, pass_seconds: f64) -> Run {
        Run {
            blobs,
            presence_4096_ms: Some(presence_ms),
            pass_blobs,
            pass_seconds,
            blobs_per_second: pass_blobs as f64 / pass_seconds,
            ..Run::default()
        }
    }

    #[test]
    fn goals_pass_and_miss_by_the_measured_figures() {
        // The 2026-12-04 afternoon's last runs: 12,553 and 9,782 blobs/s, 34.7 and 52.4 ms.
        let goals = evaluate(&[
            run(100_000, 34.7, 3_750, 0.2987),
            run(10_000_000, 52.4, 419_750, 42.91),
        ]);
        let verdicts: Vec<Option<bool>> = goals.iter().map(|g| g.pass).collect();
        assert_eq!(
            verdicts,
            [Some(true), Some(true), Some(true), Some(false)],
            "{goals:?}"
        );
        // The 2026-12-03 evening's 1e7 presence check.
        let goals = evaluate(&[run(10_000_000, 114.1, 419_750, 104.0)]);
        assert_eq!(goals[0].pass, Some(false), "{goals:?}");
    }

    #[test]
    fn a_measurement_that_failed_has_no_verdict() {
        let mut r = run(100_000, 0.0, 0, 0.0);
        r.presence_4096_ms = None;
        let goals = evaluate(&[r]);
        assert!(goals.iter().all(|g| g.pass.is_none()), "{goals:?}");
    }
}
