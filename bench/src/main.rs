//! `vial-bench`: benchmarks `vial serve` side by side with CNCF Distribution (docker-registry),
//! with nginx as the ceiling for large downloads (`registry`), and `vial push` side by side with
//! the ORAS Python SDK and skopeo on model checkpoints (`push`), and `vial mount` against
//! `vial pull`, skopeo and local disk (`mount`). See bench/README.md.
#![allow(clippy::print_stdout)]

mod backends;
mod blobs;
mod ceiling;
mod checkpoint;
mod compaction;
mod containerd;
mod content;
mod cri;
mod data;
mod entries;
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

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "vial-bench", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Blob push/pull throughput, manifest latency and memory: vial vs docker-registry (and nginx).
    Registry(run::RegistryArgs),
    /// Checkpoint push: vial vs the ORAS Python SDK vs skopeo, first push and three re-pushes.
    Push(push::PushArgs),
    /// The registry on PostgreSQL + S3 and on two replicas, against SQLite + filesystem.
    Backends(backends::BackendsArgs),
    /// `vial mount`: mount time, time to first tensor, cold and warm full reads against
    /// `vial pull`, skopeo and local disk, and the mount process's memory.
    Mount(mount::MountArgs),
    /// Compaction: a training run's history with most versions deleted and collected, stored
    /// bytes against live ones, on SQLite + filesystem and PostgreSQL + s3s-fs.
    Compaction(compaction::CompactionArgs),
    /// containerd: pull to the first byte of a file, a volume through `vial snapshotter` against
    /// the same files baked into an image layer on overlayfs.
    Containerd(containerd::ContainerdArgs),
    /// containerd: what a pull of a volume leaves in the content store, by pull path (1.6, and
    /// 2.x's CRI, transfer service and client-side pull).
    ContentStore(content::ContentArgs),
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
    /// What reads a whole tree (`vial inspect`, `diff`, `versions`, the UI's version pages) with
    /// 10,000 and 1,000,000 entries.
    Entries(entries::EntriesArgs),
    /// The file-per-layer client `files` measures (run by the benchmark itself).
    #[command(hide = true)]
    FilesClient(files::ClientArgs),
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
                Command::Compaction(args) => compaction::compaction(args).await,
                Command::Containerd(args) => containerd::containerd(args).await,
                Command::ContentStore(args) => content::content_store_bench(args).await,
                Command::Files(args) => files::files(args).await,
                Command::Tree(args) => tree::tree(args).await,
                Command::Scale(args) => scale::scale(args).await,
                Command::Fleet(args) => fleet::fleet(args).await,
                Command::Follow(args) => follow::follow(args).await,
                Command::Ui(args) => ui::ui(args).await,
                Command::Entries(args) => entries::entries(args).await,
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
