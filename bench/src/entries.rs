//! `vial-bench entries`: what reads a whole version's tree, as the tree grows to a million
//! entries (issue #48): `vial inspect`, `vial diff`, `vial versions`, the web UI's version and
//! comparison pages, and the tree blob itself.
//!
//! Each size is a volume of that many small files (64 distinct bytes each, 1,000 to a directory)
//! pushed twice to `vial serve` on its embedded default: the second version rewrites ten files
//! and adds one. Every command runs with a HOME of its own, so nothing the client keeps locally
//! helps it; the pages are fetched on loopback, request to last byte.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::report::{self, median, num, table, Goal};
use crate::servers::{self, WorkDir};

/// The CLI commands' goal at the largest size: an answer a person waits for, not a job.
const MAX_COMMAND_SECONDS: f64 = 2.0;
/// The pages' goal at the largest size.
const MAX_PAGE_SECONDS: f64 = 1.0;
/// Small files to a directory.
const PER_DIR: usize = 1000;
/// Bytes of each file.
const FILE_BYTES: usize = 64;

#[derive(Debug, Args)]
pub struct EntriesArgs {
    /// The `vial` binary.
    #[arg(long)]
    pub vial: PathBuf,
    /// Files in the volume, one run each (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = [10_000usize, 1_000_000])]
    pub entries: Vec<usize>,
    /// Times each command and page is run; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Parent of the run's directory.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// The registry's `--ui-max-tree` (its default, 64MiB, when not given): above it the UI
    /// shows a version from its index instead of reading its tree.
    #[arg(long)]
    pub ui_max_tree: Option<String>,
    /// Keep the run's directory (sources, registry data, logs) afterwards.
    #[arg(long)]
    pub keep: bool,
}

/// One size's figures.
struct Size {
    entries: usize,
    push_seconds: f64,
    tree_bytes: u64,
    /// (what, median seconds or why it failed), in [`OPS`] order.
    seconds: Vec<(&'static str, Result<f64, String>)>,
    registry_rss_mib: Option<f64>,
    /// Whether the UI showed the version from its index, its tree being over `--ui-max-tree`.
    ui_from_index: bool,
}

/// What is timed: CLI commands, then pages.
const OPS: [&str; 5] = [
    "vial inspect",
    "vial diff",
    "vial versions",
    "UI: a version",
    "UI: compare two versions",
];

pub async fn entries(args: EntriesArgs) -> Result<()> {
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, args.keep)?;
    let mut sizes = Vec::new();
    for &n in &args.entries {
        sizes.push(one_size(&args, &work.path.join(n.to_string()), n).await?);
    }
    let mut header = vec!["".to_owned()];
    header.extend(sizes.iter().map(|s| format!("{} entries", s.entries)));
    let header: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut rows = vec![
        row("push (setup)", &sizes, |s| num(Some(s.push_seconds), 2)),
        row("tree blob (MB)", &sizes, |s| {
            num(Some(s.tree_bytes as f64 / 1e6), 1)
        }),
    ];
    for (i, op) in OPS.iter().enumerate() {
        rows.push(row(&format!("{op} (s)"), &sizes, |s| {
            match &s.seconds[i].1 {
                Ok(secs) => num(Some(*secs), 3),
                Err(_) => "failed".to_owned(),
            }
        }));
    }
    rows.push(row("UI pages read the whole tree", &sizes, |s| {
        if s.ui_from_index {
            "no: over --ui-max-tree".to_owned()
        } else {
            "yes".to_owned()
        }
    }));
    rows.push(row("registry peak RSS (MiB)", &sizes, |s| {
        num(s.registry_rss_mib, 0)
    }));
    table("Reading a whole tree (medians)", &header, &rows);

    let mut goals = Vec::new();
    if let Some(largest) = sizes.iter().max_by_key(|s| s.entries) {
        for (op, secs) in &largest.seconds {
            let max = if op.starts_with("UI") {
                MAX_PAGE_SECONDS
            } else {
                MAX_COMMAND_SECONDS
            };
            let goal = format!("{op} with {} entries under {max} s", largest.entries);
            goals.push(match secs {
                Ok(secs) => Goal {
                    goal,
                    pass: Some(*secs < max),
                    detail: format!("{secs:.3} s"),
                },
                Err(why) => Goal {
                    goal,
                    pass: Some(false),
                    detail: why.clone(),
                },
            });
        }
    }
    report::print_goal_list(&goals, &[]);
    Ok(())
}

fn row(name: &str, sizes: &[Size], cell: impl Fn(&Size) -> String) -> Vec<String> {
    let mut r = vec![name.to_owned()];
    r.extend(sizes.iter().map(cell));
    r
}

/// One volume of `n` files: written, pushed twice, then each command and page timed.
async fn one_size(args: &EntriesArgs, dir: &Path, n: usize) -> Result<Size> {
    let serve: Vec<String> = match &args.ui_max_tree {
        Some(max) => vec!["--ui-max-tree".into(), max.clone()],
        None => Vec::new(),
    };
    let registry = servers::start_vial_with(&args.vial, &dir.join("registry"), &serve, &[])?;
    let base = registry.url("")?.as_str().trim_end_matches('/').to_owned();
    let host = base.trim_start_matches("http://").to_owned();
    let volume = format!("{host}/entries/n{n}");
    let src = dir.join("src");
    let started = Instant::now();
    write_tree(&src, n)?;
    println!(
        "entries: {n} files written in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let (a, push_seconds) = push(args, dir, &src, &volume, "a")?;
    println!("entries: first push of {n} files in {push_seconds:.1} s");
    for i in (0..n).step_by((n / 10).max(1)).take(10) {
        std::fs::write(file_path(&src, i), content(i + n))?;
    }
    std::fs::write(src.join("added.bin"), content(2 * n))?;
    let (b, _) = push(args, dir, &src, &volume, "b")?;

    let http = reqwest::Client::new();
    let tree_bytes = tree_blob_size(&http, &base, &format!("entries/n{n}"), &b).await?;
    let pinned = |d: &str| format!("{volume}@{d}");
    let commands: [(&str, Vec<String>); 3] = [
        (
            "vial inspect",
            vec!["inspect".into(), pinned(&b), "--json".into()],
        ),
        (
            "vial diff",
            vec!["diff".into(), pinned(&a), pinned(&b), "--json".into()],
        ),
        (
            "vial versions",
            vec!["versions".into(), volume.clone(), "--json".into()],
        ),
    ];
    let mut seconds = Vec::new();
    for (op, argv) in &commands {
        let mut runs = Vec::new();
        let mut failed = None;
        for r in 0..args.runs {
            let home = dir.join(format!("home-{}-{r}", op.replace(' ', "-")));
            let t = Instant::now();
            if let Err(e) = vial(&args.vial, &home, argv) {
                failed = Some(format!("{e:#}"));
                break;
            }
            runs.push(t.elapsed().as_secs_f64());
        }
        seconds.push(done(n, op, runs, failed));
    }
    let repo = format!("entries/n{n}");
    let pages = [
        ("UI: a version", format!("/ui/r/{repo}/-/v/{b}")),
        (
            "UI: compare two versions",
            format!("/ui/r/{repo}/-/compare?a={a}&b={b}"),
        ),
    ];
    let mut ui_from_index = false;
    for (op, path) in &pages {
        let mut runs = Vec::new();
        let mut failed = None;
        for _ in 0..args.runs {
            let t = Instant::now();
            let r = http.get(format!("{base}{path}")).send().await?;
            let status = r.status();
            let body = r.bytes().await?;
            if !status.is_success() {
                failed = Some(format!("{status}: {}", page_error(&body)));
                break;
            }
            ui_from_index |= String::from_utf8_lossy(&body).contains("--ui-max-tree");
            runs.push(t.elapsed().as_secs_f64());
        }
        seconds.push(done(n, op, runs, failed));
    }
    let registry_rss_mib =
        servers::proc_status_kib(registry.pid(), "VmHWM").map(|k| k as f64 / 1024.0);
    registry.stop_and_delete()?;
    std::fs::remove_dir_all(&src)?;
    Ok(Size {
        entries: n,
        push_seconds,
        tree_bytes,
        seconds,
        registry_rss_mib,
        ui_from_index,
    })
}

/// One command's or page's outcome, printed as it comes: the median, or why it failed.
fn done(
    n: usize,
    op: &'static str,
    runs: Vec<f64>,
    failed: Option<String>,
) -> (&'static str, Result<f64, String>) {
    let outcome = match failed {
        Some(why) => Err(why),
        None => median(&runs).ok_or_else(|| "no run".to_owned()),
    };
    match &outcome {
        Ok(secs) => println!("entries: {n}: {op}: {secs:.3} s"),
        Err(why) => println!("entries: {n}: {op} failed: {why}"),
    }
    (op, outcome)
}

/// The message of a UI error page (its `p.error`), or the start of the body.
fn page_error(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split_once("<p class=\"error\">")
        .and_then(|(_, rest)| rest.split_once("</p>"))
        .map_or_else(
            || text.chars().take(200).collect(),
            |(msg, _)| msg.to_owned(),
        )
}

/// File `i` of the tree: `DDDD/IIIIIII.bin`, [`PER_DIR`] to a directory.
fn file_path(root: &Path, i: usize) -> PathBuf {
    root.join(format!("{:04}", i / PER_DIR))
        .join(format!("{i:07}.bin"))
}

/// Distinct bytes for file `i` (the number repeated): nothing deduplicates.
fn content(i: usize) -> Vec<u8> {
    let mut bytes = format!("{i:016}").repeat(FILE_BYTES / 16).into_bytes();
    bytes.truncate(FILE_BYTES);
    bytes
}

fn write_tree(root: &Path, n: usize) -> Result<()> {
    for i in 0..n {
        if i % PER_DIR == 0 {
            std::fs::create_dir_all(file_path(root, i).parent().context("no parent")?)?;
        }
        std::fs::write(file_path(root, i), content(i))?;
    }
    Ok(())
}

/// Pushes `src` with `--tag tag`; the version's digest and the push's seconds.
fn push(
    args: &EntriesArgs,
    dir: &Path,
    src: &Path,
    volume: &str,
    tag: &str,
) -> Result<(String, f64)> {
    let t = Instant::now();
    let out = vial(
        &args.vial,
        &dir.join(format!("home-push-{tag}")),
        &[
            "push".into(),
            src.display().to_string(),
            volume.to_owned(),
            "--tag".into(),
            tag.into(),
            "--json".into(),
        ],
    )?;
    let secs = t.elapsed().as_secs_f64();
    let pushed: serde_json::Value = serde_json::from_str(&out)?;
    let digest = pushed["digest"]
        .as_str()
        .context("push printed no digest")?;
    Ok((digest.to_owned(), secs))
}

/// `vial ARGS` with HOME (and the cache under it) at `home`; its stdout.
fn vial(bin: &Path, home: &Path, argv: &[String]) -> Result<String> {
    std::fs::create_dir_all(home)?;
    let out = Command::new(bin)
        .args(argv)
        .env("HOME", home)
        .env("XDG_CACHE_HOME", home.join("cache"))
        .env("VIAL_LOG", "warn")
        .output()
        .with_context(|| format!("could not run {}", bin.display()))?;
    if !out.status.success() {
        bail!(
            "vial {} failed: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8(out.stdout)?)
}

/// The size of a version's tree blob, named by its index's annotation.
async fn tree_blob_size(
    http: &reqwest::Client,
    base: &str,
    repo: &str,
    digest: &str,
) -> Result<u64> {
    let index: serde_json::Value = http
        .get(format!("{base}/v2/{repo}/manifests/{digest}"))
        .header("accept", "application/vnd.oci.image.index.v1+json")
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    let tree = index["annotations"]["dev.vial.volume.tree"]
        .as_str()
        .context("the index names no tree blob")?;
    let head = http
        .head(format!("{base}/v2/{repo}/blobs/{tree}"))
        .send()
        .await?
        .error_for_status()?;
    head.headers()
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .context("the tree blob's HEAD has no length")
}
