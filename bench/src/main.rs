//! `vial-bench`: benchmarks `vial serve` side by side with CNCF Distribution (docker-registry),
//! with nginx as the ceiling for large downloads (`registry`), and `vial push` side by side with
//! the ORAS Python SDK and skopeo on model checkpoints (`push`), and `vial mount` against
//! `vial pull`, skopeo and local disk (`mount`). See bench/README.md.
#![allow(clippy::print_stdout)]

mod backends;
mod blobs;
mod ceiling;
mod checkpoint;
mod containerd;
mod cri;
mod data;
mod files;
mod fleet;
mod follow;
mod hostmem;
mod manifests;
mod mount;
mod mounted;
mod push;
mod pushers;
mod report;
mod rss;
mod run;
mod scale;
mod servers;
mod tree;
mod ui;

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "vial-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Blob push/pull throughput, manifest latency and memory: vial vs docker-registry (and nginx).
    Registry(RegistryArgs),
    /// Checkpoint push: vial vs the ORAS Python SDK vs skopeo, first push and three re-pushes.
    Push(push::PushArgs),
    /// The registry on PostgreSQL + S3 and on two replicas, against SQLite + filesystem.
    Backends(backends::BackendsArgs),
    /// `vial mount`: mount time, time to first tensor, cold and warm full reads against
    /// `vial pull`, skopeo and local disk, and the mount process's memory.
    Mount(mount::MountArgs),
    /// containerd: pull to the first byte of a file, a volume through `vial snapshotter` against
    /// the same files baked into an image layer on overlayfs.
    Containerd(containerd::ContainerdArgs),
    /// Is vial at least as fast as shipping the files? Push, pull and a full read through a mount
    /// against skopeo, the ORAS Python SDK and a file-per-layer client, per backend.
    Files(files::FilesArgs),
    /// Directories of any shape: 10,000 and 100,000 small files and a mixed volume, pushed,
    /// pulled and read through a mount against a tarball layer and a layer per file, every client
    /// with the open-file limit at 1024.
    Tree(tree::TreeArgs),
    /// Metadata at fleet scale: a PostgreSQL store grown to 1e5 and 1e6 blob rows, request
    /// latencies and a collection pass after deleting 5% of versions.
    Scale(scale::ScaleArgs),
    /// The cache tier: 1, 4 and 16 cold nodes read one volume with and without
    /// `vial serve --upstream`, the origin behind a throttled link.
    Fleet(fleet::FleetArgs),
    /// A trainer loop publishing a checkpoint every few seconds while `vial pull --follow` and
    /// `vial mount --follow` nodes follow its tag: switch latency and bytes fetched per round.
    Follow(follow::FollowArgs),
    /// The web UI: each page's server time with 10,000 versions in one volume.
    Ui(ui::UiArgs),
    /// The file-per-layer client `files` measures (run by the benchmark itself).
    #[command(hide = true)]
    FilesClient(files::ClientArgs),
}

#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// The `vial` binary to benchmark.
    #[arg(long)]
    pub vial: PathBuf,
    /// The peer registry binary (CNCF Distribution 2.x).
    #[arg(long, default_value = "docker-registry")]
    pub peer: PathBuf,
    /// nginx, the ceiling for the large download.
    #[arg(long, default_value = "/usr/sbin/nginx")]
    pub nginx: PathBuf,
    /// curl, for the large download.
    #[arg(long, default_value = "curl")]
    pub curl: PathBuf,
    /// Shrink everything for a smoke run of under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Clients pushing a large blob each at once while vial's RSS is sampled; 0 skips.
    /// Default 16 (2 with --quick).
    #[arg(long)]
    pub rss_clients: Option<usize>,
    /// Run the concurrent-push memory test against the peer as well.
    #[arg(long)]
    pub rss_peer: bool,
    /// Write all figures to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Parent of the run's directory (server data lives there; must be a real disk, not tmpfs).
    /// Default: $TMPDIR, /var/tmp or the current directory, whichever is first not on tmpfs.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Keep the run's directory (with the servers' data and logs) instead of deleting it.
    #[arg(long)]
    pub keep_workdir: bool,
}

/// A size class of blobs: how many, how big, and how many clients move them at once.
#[derive(Debug, Clone)]
pub struct Class {
    pub label: String,
    pub size: usize,
    pub count: usize,
    pub concurrency: usize,
}

#[derive(Debug)]
pub struct Plan {
    pub classes: Vec<Class>,
    pub pull_runs: usize,
    pub manifest_clients: usize,
    pub manifest_per_client: usize,
    pub rss_clients: usize,
}

impl Plan {
    fn new(args: &RegistryArgs) -> Self {
        let class = |mib: usize, count, concurrency| Class {
            label: if mib >= 1024 {
                format!("{} GiB", mib / 1024)
            } else {
                format!("{mib} MiB")
            },
            size: mib << 20,
            count,
            concurrency,
        };
        let (classes, per_client, rss) = if args.quick {
            (
                vec![class(1, 16, 4), class(16, 4, 2), class(128, 2, 1)],
                10,
                2,
            )
        } else {
            (
                vec![class(1, 64, 4), class(64, 8, 2), class(1024, 2, 1)],
                50,
                16,
            )
        };
        Plan {
            classes,
            pull_runs: 3,
            manifest_clients: 32,
            manifest_per_client: per_client,
            rss_clients: args.rss_clients.unwrap_or(rss),
        }
    }
}

fn main() -> Result<()> {
    let Cli { command } = Cli::parse();
    let runtime = tokio::runtime::Runtime::new().context("could not start the async runtime")?;
    runtime.block_on(async {
        let work = async {
            match command {
                Command::Registry(args) => run::registry(args).await,
                Command::Push(args) => push::push(args).await,
                Command::Mount(args) => mount::mount(args).await,
                Command::Backends(args) => backends::backends(args).await,
                Command::Containerd(args) => containerd::containerd(args).await,
                Command::Files(args) => files::files(args).await,
                Command::Tree(args) => tree::tree(args).await,
                Command::Scale(args) => scale::scale(args).await,
                Command::Fleet(args) => fleet::fleet(args).await,
                Command::Follow(args) => follow::follow(args).await,
                Command::Ui(args) => ui::ui(args).await,
                Command::FilesClient(args) => files::client(args).await,
            }
        };
        tokio::select! {
            result = work => result,
            // Dropping the run on Ctrl-C kills the servers and clients and removes the work directory.
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    })
}
