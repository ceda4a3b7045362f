//! The `content-store` benchmark: what a pull of a volume leaves in containerd's content store,
//! by pull path, side by side in one run: containerd 1.6 with `vial containerd pull`, and
//! containerd 2.x's CRI (kubelet's path), its transfer service (`ctr images pull`, which nerdctl
//! uses too) and its client-side pull (`ctr images pull --local`). A lazy volume leaves kilobytes
//! (its index, one image manifest and its config); a path that downloads the volume leaves all
//! of it. Needs root, containerd 1.6, containerd 2.x (`scripts/fetch-unstable`) and FUSE.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;

use crate::containerd::{write_random, Node};
use crate::cri::CriNode;
use crate::report::{num, si, table};
use crate::run::machine;
use crate::servers::{self, run, Server, WorkDir};

#[derive(Debug, Args)]
pub struct ContentArgs {
    /// The `vial` binary: registry, push, snapshotter and `vial containerd pull`.
    #[arg(long)]
    pub vial: PathBuf,
    /// The directory of containerd 2.x's binaries (`scripts/fetch-unstable` puts them in
    /// .ci/tools/containerd2/bin).
    #[arg(long, value_name = "BIN_DIR")]
    pub cri: PathBuf,
    /// Volume size in GiB [default: 8; 0.25 with --quick].
    #[arg(long)]
    pub gib: Option<f64>,
    /// Files in the volume.
    #[arg(long, default_value_t = 4)]
    pub files: usize,
    /// Parent of the run's directory (not tmpfs). Default as for the other benches.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    #[arg(long)]
    pub json: Option<PathBuf>,
    #[arg(long)]
    pub quick: bool,
    #[arg(long)]
    pub keep: bool,
}

/// One pull path's figures.
#[derive(Debug, Serialize)]
struct PathResult {
    path: &'static str,
    /// Bytes under containerd's content store after the pull.
    content_bytes: Option<u64>,
    /// Bytes the registry sent for the pull.
    bytes_sent: Option<u64>,
    /// Whether the volume was mounted lazily by vial's snapshotter.
    mounted: Option<bool>,
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Results {
    machine: crate::report::Machine,
    volume_bytes: u64,
    paths: Vec<PathResult>,
}

fn content_store(node_dir: &Path) -> u64 {
    servers::du(&node_dir.join("root/io.containerd.content.v1.content"))
}

fn mounted_under(dir: &Path) -> bool {
    let prefix = dir.display().to_string();
    std::fs::read_to_string("/proc/mounts").is_ok_and(|m| {
        m.lines()
            .filter(|l| l.contains("fuse"))
            .filter_map(|l| l.split(' ').nth(1))
            .any(|t| t.starts_with(&prefix))
    })
}

async fn sent(server: &Server) -> Option<u64> {
    crate::pushers::counter(server, "vial_bytes_sent_total")
        .await
        .ok()
}

/// What a node holds after a pull: its content store's bytes and whether a volume is mounted.
type Figures = (u64, bool);

fn figures(dir: &Path) -> Figures {
    (content_store(dir), mounted_under(dir))
}

/// Pulls `volume` one way on a fresh node in `dir`, and measures the node before it goes (a
/// failed pull is measured too: what it fetched before failing is in the store).
async fn pull(
    args: &ContentArgs,
    path: &str,
    dir: &Path,
    volume: &str,
    host: &str,
) -> Result<(Result<()>, Figures)> {
    Ok(match path {
        "1.6" => {
            let node = Node::start(&args.vial, dir)?;
            let result = run(Command::new(&args.vial)
                .args(["containerd", "pull", volume, "--address"])
                .arg(&node.socket)
                .env("VIAL_LOG", "warn"))
            .map(|_| ());
            (result, figures(dir))
        }
        "cri" => {
            let node = CriNode::start(&args.vial, &args.cri, dir, "vial", host)?;
            let result = node.pull(volume).await;
            (result, figures(dir))
        }
        _ => {
            let node = CriNode::start(&args.vial, &args.cri, dir, "vial", host)?;
            let mut pull = vec!["images", "pull", "--plain-http", "--snapshotter", "vial"];
            if path == "local" {
                pull.push("--local");
            }
            pull.push(volume);
            let result = node.ctr(&pull).map(|_| ());
            (result, figures(dir))
        }
    })
}

async fn measure(
    args: &ContentArgs,
    server: &Server,
    work: &Path,
    (path, label): (&'static str, &'static str),
    volume: &str,
) -> PathResult {
    let dir = work.join(format!("node-{path}"));
    let host = server.base.authority().to_owned();
    let before = sent(server).await;
    eprintln!("vial-bench: {label}");
    let outcome = pull(args, path, &dir, volume, &host).await;
    let bytes_sent = sent(server).await.zip(before).map(|(a, b)| a - b);
    let (result, figures) = match outcome {
        Ok((result, figures)) => (result, Some(figures)),
        Err(e) => (Err(e), None),
    };
    PathResult {
        path: label,
        content_bytes: figures.map(|f| f.0),
        mounted: figures.map(|f| f.1),
        bytes_sent,
        error: result.err().map(|e| format!("{e:#}")),
    }
}

/// The end of an error's last line (a failed `ctr` prints its whole command first), for the table;
/// `--json` keeps all of it.
fn brief(error: &str) -> String {
    let last = error.lines().last().unwrap_or_default().trim();
    let chars: Vec<char> = last.chars().collect();
    let start = chars.len().saturating_sub(90);
    let tail: String = chars[start..].iter().collect();
    if start > 0 {
        format!("…{tail}")
    } else {
        tail
    }
}

pub async fn content_store_bench(args: ContentArgs) -> Result<()> {
    let gib = args.gib.unwrap_or(if args.quick { 0.25 } else { 8.0 });
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, args.keep)?;
    let server = servers::start_vial(&args.vial, &work.path.join("registry"))?;
    let files = work.path.join("files");
    std::fs::create_dir_all(&files)?;
    let each = (gib * (1u64 << 30) as f64) as u64 / args.files as u64;
    eprintln!("vial-bench: writing {} files of {each} bytes", args.files);
    for i in 0..args.files {
        write_random(
            &files.join(format!("shard-{i:02}.bin")),
            each,
            7000 + i as u64,
        )?;
    }
    let volume = format!("{}/bench/content:v1", server.base.authority());
    eprintln!("vial-bench: pushing {volume}");
    run(Command::new(&args.vial)
        .arg("push")
        .arg(&files)
        .arg(&volume)
        .env("HOME", &work.path)
        .env("VIAL_LOG", "warn"))
    .context("pushing the volume")?;
    std::fs::remove_dir_all(&files)?;
    let mut results = Results {
        machine: machine(),
        volume_bytes: each * args.files as u64,
        paths: Vec::new(),
    };
    for path in [
        ("1.6", "containerd 1.6, vial containerd pull"),
        ("cri", "containerd 2.x, CRI PullImage"),
        (
            "transfer",
            "containerd 2.x, ctr images pull (transfer service)",
        ),
        ("local", "containerd 2.x, ctr images pull --local"),
    ] {
        results
            .paths
            .push(measure(&args, &server, &work.path, path, &volume).await);
    }
    let rows: Vec<Vec<String>> = results
        .paths
        .iter()
        .map(|p| {
            vec![
                p.path.to_owned(),
                si(p.content_bytes),
                num(
                    p.content_bytes
                        .map(|b| b as f64 * 100.0 / results.volume_bytes as f64),
                    4,
                ),
                si(p.bytes_sent),
                match p.mounted {
                    Some(true) => "yes".into(),
                    Some(false) => "no".into(),
                    None => "-".into(),
                },
                p.error.as_deref().map(brief).unwrap_or_default(),
            ]
        })
        .collect();
    table(
        &format!(
            "containerd's content store after pulling a {} volume",
            si(Some(results.volume_bytes))
        ),
        &[
            "pull path",
            "content store",
            "% of volume",
            "registry sent (blobs)",
            "lazy mount",
            "error",
        ],
        &rows,
    );
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&results)?)?;
    }
    drop(server);
    Ok(())
}
