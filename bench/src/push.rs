//! The `push` benchmark: a model-like checkpoint and three next versions of it, pushed by vial,
//! the ORAS Python SDK and skopeo to one fresh `vial serve`, with the machine's hashing ceiling.
//! See bench/README.md.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use crate::ceiling::{self, Ceiling};
use crate::checkpoint::{self, Case, Generated, Generator, Shape};
use crate::pushers::{self, DigestCache, PushRun, Swapped};
use crate::report::{self, num, ratio, si, table, times, Goal, Machine};
use crate::run::{machine, sync_disk};
use crate::servers;

const GIB: f64 = (1u64 << 30) as f64;
const MIB: f64 = (1u64 << 20) as f64;
/// The ceiling is measured on this much checkpoint data held in memory.
const CEILING_BYTES: u64 = 1 << 30;
/// Generated files are backdated this far so vial's local index trusts them.
const BACKDATE_SECS: u64 = 10;
const CLIENTS: [&str; 3] = ["vial", "oras-py", "skopeo"];

#[derive(Debug, Args)]
pub struct PushArgs {
    /// The `vial` binary: it serves the registry and is the client under test.
    #[arg(long)]
    pub vial: PathBuf,
    /// Checkpoint size in GiB (tensor bytes). Default 4 (0.25 with --quick).
    #[arg(long)]
    pub size_gib: Option<f64>,
    /// Safetensors shards. Default 4 (2 with --quick).
    #[arg(long)]
    pub shards: Option<usize>,
    /// Parent of the run's directory (checkpoints, layouts, registry data; not tmpfs).
    /// Default: $TMPDIR, /var/tmp or the current directory, whichever is first not on tmpfs.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Write all figures to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Smoke run of under a minute: 256 MiB in 2 shards.
    #[arg(long)]
    pub quick: bool,
    /// Keep the run's directory (checkpoints, layouts, registry data, logs).
    #[arg(long)]
    pub keep: bool,
    /// Python with the ORAS SDK (`import oras.client`).
    #[arg(long, default_value = ".venv/bin/python")]
    pub python: PathBuf,
    #[arg(long, default_value = "skopeo")]
    pub skopeo: PathBuf,
    /// Pass --rehash to vial push: read every file, ignoring the local index.
    #[arg(long)]
    pub rehash: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Versions {
    pub vial: String,
    pub skopeo: String,
    pub oras_py: String,
    pub python: String,
}

#[derive(Debug, Serialize)]
pub struct LayoutBuild {
    pub case: String,
    pub seconds: f64,
}

/// One line of the main table: a case pushed by a client.
#[derive(Debug, Serialize)]
pub struct Row {
    pub case: String,
    pub client: String,
    pub seconds: Option<f64>,
    /// Checkpoint bytes / seconds, 10^6 bytes per second.
    pub mb_s: Option<f64>,
    pub bytes_uploaded: Option<u64>,
    pub bytes_changed: u64,
    pub uploaded_per_changed: Option<f64>,
    pub peak_rss_kib: Option<u64>,
}

/// One seal: the registry reading an ORAS push back, chunking and hashing it, and committing the
/// volume.
#[derive(Debug, Serialize)]
pub struct Seal {
    pub case: String,
    pub seconds: f64,
    /// Checkpoint bytes / seconds, 10^6 bytes per second.
    pub mb_s: f64,
    /// Layer bytes the registry read (layers sealed before are reused, not read).
    pub bytes_read: u64,
    /// Bytes read / seconds.
    pub read_mb_s: f64,
}

#[derive(Debug, Default, Serialize)]
pub struct PushResults {
    pub machine: Machine,
    pub versions: Versions,
    pub quick: bool,
    pub workdir: String,
    pub workdir_fs: String,
    pub model: Option<Shape>,
    pub shards: usize,
    pub checkpoints: Vec<Generated>,
    /// vial pushed with its local index (files unchanged since the last push are not read).
    pub vial_index_fast_path: bool,
    pub layouts: Vec<LayoutBuild>,
    pub ceiling: Option<Ceiling>,
    /// Python start-up plus `import oras.client`, included in every ORAS time.
    pub oras_import_seconds: Option<f64>,
    pub runs: Vec<PushRun>,
    pub rows: Vec<Row>,
    /// The registry sealing each ORAS SDK push into a volume (`vial seal`, timed by the client).
    pub seals: Vec<Seal>,
    pub notes: Vec<String>,
    pub goals: Vec<Goal>,
}

fn warn<T>(what: &str, r: Result<T>) -> Option<T> {
    r.map_err(|e| eprintln!("vial-bench: {what} failed: {e:#}"))
        .ok()
}

fn failed_run(client: &str, case: Case, e: &anyhow::Error) -> PushRun {
    eprintln!("vial-bench: {client} push of {} failed: {e:#}", case.tag());
    PushRun {
        client: client.into(),
        case: case.tag().into(),
        error: Some(format!("{e:#}")),
        ..PushRun::default()
    }
}

pub async fn push(mut args: PushArgs) -> Result<()> {
    for program in [&mut args.vial, &mut args.python, &mut args.skopeo] {
        *program = pushers::absolute_program(program);
    }
    let size_gib = args.size_gib.unwrap_or(if args.quick { 0.25 } else { 4.0 });
    let shards = args.shards.unwrap_or(if args.quick { 2 } else { 4 });
    if size_gib.is_nan() || size_gib <= 0.0 {
        bail!("--size-gib must be positive");
    }
    let mut r = PushResults {
        machine: machine(),
        quick: args.quick,
        shards,
        vial_index_fast_path: !args.rehash,
        ..PushResults::default()
    };
    r.versions = Versions {
        vial: servers::first_line(&args.vial, &["--version"]),
        skopeo: servers::first_line(&args.skopeo, &["--version"]),
        oras_py: servers::first_line(
            &args.python,
            &[
                "-c",
                "import oras.version as v; print('oras-py', v.__version__)",
            ],
        ),
        python: servers::first_line(&args.python, &["--version"]),
    };
    let m = &r.machine;
    println!(
        "vial-bench push{}",
        if args.quick {
            " --quick (smoke run: small sizes, not for publishing)"
        } else {
            ""
        }
    );
    println!("date:     {}", m.date);
    println!("machine:  nproc {}, {}, {}", m.nproc, m.cpu_model, m.kernel);
    let v = &r.versions;
    println!(
        "clients:  {} | {} ({}) | {}",
        v.vial, v.oras_py, v.python, v.skopeo
    );

    let generator = Generator::new((size_gib * GIB) as u64, shards)?;
    let s = &generator.shape;
    println!(
        "model:    hidden {}, intermediate {}, {} layers, vocab {}, {} bf16 tensors = {:.2} GiB in {} shards",
        s.hidden,
        s.intermediate,
        s.layers,
        s.vocab,
        s.tensors,
        s.tensor_bytes as f64 / GIB,
        shards
    );
    r.model = Some(s.clone());

    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = servers::WorkDir::create(&parent, args.keep)?;
    r.workdir_fs = servers::fs_type(&work.path).unwrap_or_else(|| "unknown".into());
    r.workdir = work.path.display().to_string();
    println!("workdir:  {} ({})", work.path.display(), r.workdir_fs);
    if matches!(r.workdir_fs.as_str(), "tmpfs" | "ramfs") {
        r.notes.push(format!(
            "workdir is on {}: disk figures are really memory figures",
            r.workdir_fs
        ));
    }
    // Checkpoints (differing files only; the rest are hard links), vial's chunks, and the
    // whole-file blobs ORAS and skopeo push (the blob store is content-addressed, so shared).
    let summaries: Vec<Generated> = Case::ALL
        .iter()
        .map(|c| generator.summary(*c))
        .collect::<Result<_>>()?;
    let unique: u64 = summaries.iter().map(|g| g.bytes_differing).sum();
    let need = 3 * unique + (1 << 30);
    if let Some(free) = servers::available_bytes(&work.path) {
        if free < need {
            bail!(
                "{} has {:.1} GiB free; this run needs about {:.1} GiB",
                work.path.display(),
                free as f64 / GIB,
                need as f64 / GIB
            );
        }
    }

    let ckpt = work.path.join("ckpt");
    let dir_of = |c: Case| ckpt.join(c.tag());
    eprintln!("vial-bench: generating checkpoints...");
    for case in Case::ALL {
        let g = generator.write(case, &dir_of(case), &dir_of(Case::Base))?;
        eprintln!(
            "vial-bench: {} written in {:.1} s ({} of {} files differ from the base)",
            case.tag(),
            g.seconds,
            g.files_differing,
            g.files
        );
        r.checkpoints.push(g);
    }
    print_checkpoints(&r.checkpoints);

    // Layouts first: hard-linking a file changes its ctime, which vial's index checks, so every
    // link is made before the first push. Then the mtimes go back so the index trusts them.
    let mut digests = DigestCache::new();
    for case in Case::ALL {
        let layout = work.path.join("layouts").join(case.tag());
        let secs = pushers::build_layout(&dir_of(case), &layout, case.tag(), &mut digests)
            .with_context(|| format!("could not build the OCI layout of {}", case.tag()))?;
        r.layouts.push(LayoutBuild {
            case: case.tag().into(),
            seconds: secs,
        });
    }
    if !args.rehash {
        for case in Case::ALL {
            checkpoint::backdate(&dir_of(case), BACKDATE_SECS)?;
        }
    }

    eprintln!("vial-bench: measuring the hashing ceiling...");
    let base_dir = dir_of(Case::Base);
    let shard_files: Vec<PathBuf> = pushers::file_names(&base_dir)?
        .into_iter()
        .filter(|n| n.ends_with(".safetensors"))
        .map(|n| base_dir.join(n))
        .collect();
    let refs: Vec<&Path> = shard_files.iter().map(PathBuf::as_path).collect();
    r.ceiling = warn(
        "ceiling",
        tokio::task::block_in_place(|| ceiling::measure_files(&refs, CEILING_BYTES)),
    );
    r.oras_import_seconds = warn(
        "python import",
        pushers::oras_import_seconds(&args.python).await,
    );

    // Seals of the ORAS pushes are timed on their own below (every bench server runs without
    // seal-on-push), not left to run in the background while the next client is being timed.
    let server = servers::start_vial(&args.vial, &work.path.join("registry"))?;
    let cache = work.path.join("cache");
    let cache_after_base = work.path.join("cache-after-base");
    let logs = work.path.join("logs");
    std::fs::create_dir_all(&logs)?;
    let model = work.path.join("model");
    for case in Case::ALL {
        let tag = case.tag();
        sync_disk();
        eprintln!("vial-bench: vial push {tag}");
        let log = logs.join(format!("vial-{tag}.log"));
        let run = async {
            // Each re-push starts from the local index as the base push left it, as if the
            // directory had been pushed as the base and then changed by this case alone.
            if case == Case::Base {
                std::fs::create_dir_all(&cache)?;
            } else if !args.rehash {
                pushers::replace_dir(&cache_after_base, &cache)?;
            }
            let _swap = Swapped::new(&dir_of(case), &model)?;
            pushers::vial(
                &args.vial,
                &server,
                &model,
                "bench/vial",
                tag,
                &cache,
                args.rehash,
                &log,
            )
            .await
        };
        r.runs
            .push(run.await.unwrap_or_else(|e| failed_run("vial", case, &e)));
        if case == Case::Base && !args.rehash {
            pushers::replace_dir(&cache, &cache_after_base)?;
        }

        sync_disk();
        eprintln!("vial-bench: ORAS SDK push {tag}");
        let log = logs.join(format!("oras-{tag}.log"));
        let run = pushers::oras(
            &args.python,
            &server,
            &dir_of(case),
            "bench/oras",
            tag,
            &log,
        )
        .await;
        r.runs
            .push(run.unwrap_or_else(|e| failed_run("oras-py", case, &e)));

        sync_disk();
        eprintln!("vial-bench: skopeo copy {tag}");
        let log = logs.join(format!("skopeo-{tag}.log"));
        let layout = work.path.join("layouts").join(tag);
        let run = pushers::skopeo(&args.skopeo, &server, &layout, "bench/skopeo", tag, &log).await;
        let mut run = run.unwrap_or_else(|e| failed_run("skopeo", case, &e));
        run.layout_seconds = r.layouts.iter().find(|l| l.case == tag).map(|l| l.seconds);
        r.runs.push(run);
    }
    for case in Case::ALL {
        sync_disk();
        eprintln!("vial-bench: vial seal of the ORAS SDK's {}", case.tag());
        let reference = format!("{}/bench/oras:{}", pushers::host(&server)?, case.tag());
        let read_before = pushers::counter(&server, "vial_seal_bytes_read_total").await?;
        let started = std::time::Instant::now();
        let out = tokio::process::Command::new(&args.vial)
            .args(["seal", &reference, "--json"])
            .env("VIAL_LOG", "warn")
            .output()
            .await?;
        let seconds = started.elapsed().as_secs_f64();
        let bytes_read =
            pushers::counter(&server, "vial_seal_bytes_read_total").await? - read_before;
        if out.status.success() {
            let bytes = r
                .checkpoints
                .iter()
                .find(|g| g.case == case.tag())
                .map_or(0, |g| g.bytes);
            r.seals.push(Seal {
                case: case.tag().into(),
                seconds,
                mb_s: bytes as f64 / seconds.max(1e-9) / 1e6,
                bytes_read,
                read_mb_s: bytes_read as f64 / seconds.max(1e-9) / 1e6,
            });
        } else {
            eprintln!(
                "vial-bench: seal of {reference} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }
    drop(server);

    r.rows = rows(&r);
    print_tables(&r);
    r.goals = evaluate(&r);
    notes(&mut r);
    report::print_goal_list(&r.goals, &r.notes);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&r)?)
            .with_context(|| format!("could not write {}", path.display()))?;
        println!("\nfigures written to {}", path.display());
    }
    if args.keep {
        println!("kept {}", work.path.display());
    }
    Ok(())
}

fn print_checkpoints(gens: &[Generated]) {
    let rows: Vec<Vec<String>> = gens
        .iter()
        .map(|g| {
            vec![
                g.description.clone(),
                si(Some(g.bytes)),
                format!("{} of {}", g.files_differing, g.files),
                si(Some(g.bytes_differing)),
                g.changed_tensors.to_string(),
                si(Some(g.changed_tensor_bytes)),
                si(Some(g.changed_header_bytes)),
                si(Some(g.changed_other_bytes)),
                si(Some(g.changed_bytes)),
            ]
        })
        .collect();
    table(
        "Checkpoints (changed = rewritten/added tensors + changed safetensors headers incl. the \
         8-byte length + changed JSON files; for the base, everything)",
        &[
            "case",
            "bytes",
            "files differing",
            "their bytes",
            "tensors changed",
            "tensor bytes",
            "header bytes",
            "json bytes",
            "changed",
        ],
        &rows,
    );
}

fn run_of<'a>(r: &'a PushResults, client: &str, case: &str) -> Option<&'a PushRun> {
    r.runs.iter().find(|x| x.client == client && x.case == case)
}

fn rows(r: &PushResults) -> Vec<Row> {
    let mut out = Vec::new();
    for g in &r.checkpoints {
        for client in CLIENTS {
            let run = run_of(r, client, &g.case);
            let seconds = run.and_then(|x| x.seconds);
            let uploaded = run.and_then(|x| x.bytes_uploaded);
            out.push(Row {
                case: g.case.clone(),
                client: client.into(),
                seconds,
                mb_s: seconds.map(|s| g.bytes as f64 / s.max(1e-9) / 1e6),
                bytes_uploaded: uploaded,
                bytes_changed: g.changed_bytes,
                uploaded_per_changed: ratio(
                    uploaded.map(|u| u as f64),
                    Some(g.changed_bytes as f64),
                ),
                peak_rss_kib: run.and_then(|x| x.peak_rss_kib),
            });
        }
    }
    out
}

fn print_tables(r: &PushResults) {
    let label = |tag: &str| {
        r.checkpoints
            .iter()
            .find(|g| g.case == tag)
            .map_or(tag.to_string(), |g| g.description.clone())
    };
    let rows: Vec<Vec<String>> = r
        .rows
        .iter()
        .map(|x| {
            vec![
                label(&x.case),
                x.client.clone(),
                num(x.seconds, 2),
                num(x.mb_s, 1),
                si(x.bytes_uploaded),
                si(Some(x.bytes_changed)),
                times(x.uploaded_per_changed),
                num(x.peak_rss_kib.map(|k| k as f64 * 1024.0 / MIB), 1),
            ]
        })
        .collect();
    table(
        "Push to one vial serve (seconds = client start to exit; MB/s = checkpoint bytes / seconds; \
         uploaded = delta of vial_bytes_received_total + vial_manifest_bytes_received_total: blobs and manifests)",
        &[
            "case",
            "client",
            "seconds",
            "MB/s",
            "uploaded",
            "changed",
            "uploaded/changed",
            "peak RSS MiB",
        ],
        &rows,
    );

    let vial_rows: Vec<Vec<String>> = r
        .runs
        .iter()
        .filter(|x| x.client == "vial")
        .map(|x| {
            let f = |k: &str| {
                x.report
                    .as_ref()
                    .and_then(|v| v.get(k))
                    .map_or("n/a".into(), |v| v.to_string())
            };
            let b = |k: &str| si(x.report.as_ref().and_then(|v| v.get(k)?.as_u64()));
            let chunk_bytes = x
                .report
                .as_ref()
                .and_then(|v| v.get("bytes_uploaded")?.as_u64());
            let other = x
                .bytes_uploaded
                .zip(chunk_bytes)
                .map(|(r, c)| r.saturating_sub(c));
            vec![
                label(&x.case),
                f("chunks"),
                f("chunks_uploaded"),
                b("bytes_uploaded"),
                f("chunks_reused"),
                f("files_unchanged"),
                b("bytes_read"),
                si(x.bytes_uploaded),
                si(other),
            ]
        })
        .collect();
    table(
        &format!(
            "vial push --json reports ({})",
            if r.vial_index_fast_path {
                "local index as the base push left it; files unchanged since the base are not read"
            } else {
                "--rehash: every file read"
            }
        ),
        &[
            "case",
            "chunks",
            "uploaded",
            "bytes uploaded",
            "reused",
            "files unchanged",
            "bytes read",
            "registry received",
            "received - chunk bytes",
        ],
        &vial_rows,
    );

    let layouts: Vec<String> = r
        .layouts
        .iter()
        .map(|l| format!("{} {:.2} s", l.case, l.seconds))
        .collect();
    println!(
        "  skopeo's OCI layout builds (sha256 of new files + hard links; not in its seconds): {}",
        layouts.join(", ")
    );
    if let Some(s) = r.oras_import_seconds {
        println!("  python start-up + import oras.client (inside every ORAS time): {s:.2} s");
    }

    if let Some(c) = &r.ceiling {
        table(
            &format!(
                "Ceiling in process on {:.0} MiB of checkpoint data in memory (GB/s = 10^9 bytes/s; \
                 FastCDC with format v1 parameters, mean chunk {:.2} MiB)",
                c.bytes as f64 / MIB,
                c.mean_chunk_bytes / MIB
            ),
            &["", "1 thread", "2 threads"],
            &[
                vec![
                    "SHA-256".into(),
                    format!("{:.2}", c.sha256_1t_gb_s),
                    format!("{:.2}", c.sha256_2t_gb_s),
                ],
                vec![
                    "FastCDC cuts only: vial's lanes".into(),
                    format!("{:.2}", c.cdc_1t_gb_s),
                    String::new(),
                ],
                vec![
                    "FastCDC cuts only: the fastcdc crate".into(),
                    format!(
                        "{:.2} (vial {:.2}x)",
                        c.cdc_crate_1t_gb_s,
                        c.cdc_1t_gb_s / c.cdc_crate_1t_gb_s.max(1e-9)
                    ),
                    String::new(),
                ],
                vec![
                    "FastCDC + SHA-256".into(),
                    format!("{:.2}", c.cdc_sha256_1t_gb_s),
                    format!("{:.2}", c.cdc_sha256_2t_gb_s),
                ],
            ],
        );
    }

    if !r.seals.is_empty() {
        // The registry seals on one thread: compare with the one-thread chunk-and-hash ceiling.
        let ceiling = r.ceiling.as_ref().map(|c| c.cdc_sha256_1t_gb_s * 1e3);
        let rows: Vec<Vec<String>> = r
            .seals
            .iter()
            .map(|x| {
                vec![
                    label(&x.case),
                    format!("{:.2}", x.seconds),
                    format!("{:.1}", x.mb_s),
                    si(Some(x.bytes_read)),
                    format!("{:.1}", x.read_mb_s),
                    ceiling.map_or("n/a".into(), |c| format!("{:.0}%", 100.0 * x.read_mb_s / c)),
                ]
            })
            .collect();
        table(
            "vial seal of each ORAS SDK push (the registry reads back the layers no earlier seal \
             read, chunks and hashes them on one thread, and commits the volume; seconds from the \
             client's seal request to the volume's reference; MB/s = checkpoint bytes / seconds)",
            &[
                "case",
                "seconds",
                "MB/s",
                "layer bytes read",
                "read MB/s",
                "read / 1-thread FastCDC + SHA-256",
            ],
            &rows,
        );
    }
}

fn goal(goals: &mut Vec<Goal>, name: String, pass: Option<bool>, detail: String) {
    goals.push(Goal {
        goal: name,
        pass,
        detail,
    });
}

fn evaluate(r: &PushResults) -> Vec<Goal> {
    let mut g = Vec::new();
    let row =
        |client: &str, case: &str| r.rows.iter().find(|x| x.client == client && x.case == case);
    for case in [Case::Rewrite5, Case::AddTensor] {
        let x = row("vial", case.tag()).and_then(|x| x.uploaded_per_changed);
        goal(
            &mut g,
            format!("{}: vial uploads <= 1.1x changed bytes", case.label()),
            x.map(|x| x <= 1.1),
            times(x),
        );
    }
    let (vs, os) = (
        row("vial", "base").and_then(|x| x.seconds),
        row("oras-py", "base").and_then(|x| x.seconds),
    );
    let x = ratio(os, vs);
    goal(
        &mut g,
        "first push >= 2x faster than the ORAS SDK".into(),
        x.map(|x| x >= 2.0),
        format!("{} ({} s vs {} s)", times(x), num(vs, 2), num(os, 2)),
    );
    let vial_mb_s = row("vial", "base").and_then(|x| x.mb_s);
    let ceiling = r.ceiling.as_ref().map(|c| c.cdc_sha256_2t_gb_s * 1000.0);
    let x = ratio(vial_mb_s, ceiling);
    goal(
        &mut g,
        "vial first push >= 70% of the 2-thread FastCDC+SHA-256 ceiling".into(),
        x.map(|x| x >= 0.7),
        format!(
            "{}% ({} MB/s vs {} MB/s)",
            num(x.map(|x| x * 100.0), 0),
            num(vial_mb_s, 1),
            num(ceiling, 1)
        ),
    );
    let rss: Vec<u64> = r
        .runs
        .iter()
        .filter(|x| x.client == "vial")
        .filter_map(|x| x.peak_rss_kib)
        .collect();
    let worst = rss.iter().max().map(|k| *k as f64 * 1024.0 / MIB);
    goal(
        &mut g,
        "vial client peak RSS < 512 MiB (every push, sampled every 50 ms)".into(),
        worst
            .filter(|_| rss.len() == Case::ALL.len())
            .map(|w| w < 512.0),
        format!("{} MiB", num(worst, 1)),
    );
    g
}

fn notes(r: &mut PushResults) {
    let mut n = Vec::new();
    n.push(
        "every client's files were just written or read, so they come from the page cache".into(),
    );
    n.push(if r.vial_index_fast_path {
        "vial pushes every version from the same path with mtimes backdated 10 s, and its local \
         index is reset to its state after the base push before each re-push: files unchanged \
         since the base are not read"
            .into()
    } else {
        "vial pushes with --rehash: every file is read and hashed".into()
    });
    n.push(
        "ORAS hashes every file and skips those the repository already holds; skopeo's layouts \
         were hashed beforehand (layout build times above)"
            .into(),
    );
    for run in &r.runs {
        if let Some(e) = &run.error {
            n.push(format!(
                "{} {} failed: {}",
                run.client,
                run.case,
                e.lines().next().unwrap_or("")
            ));
        }
        let claimed = run
            .report
            .as_ref()
            .and_then(|v| v.get("bytes_uploaded")?.as_u64());
        if let (Some(c), Some(m)) = (claimed, run.bytes_uploaded) {
            if m > c + c / 20 + (1 << 20) {
                n.push(format!(
                    "vial {}: the registry received {} but vial reports {} uploaded",
                    run.case,
                    si(Some(m)),
                    si(Some(c))
                ));
            }
        }
    }
    r.notes.extend(n);
}
