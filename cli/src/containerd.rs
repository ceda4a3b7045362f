//! `vial snapshotter` (containerd's proxy snapshotter) and `vial containerd pull`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use vial_snapshotter::containerd::config::containerd_block;
use vial_snapshotter::containerd::pull::{host_architecture, pull, PullOptions};
use vial_snapshotter::containerd::{serve, SnapshotterOptions, VialSnapshotter};
use vial_snapshotter::{MountOptions, Prefetch};

use crate::common::{block_on, parse_reference, print_json, RegistryArgs};
use crate::mount::{default_cache_dir, parse_size};

#[derive(Debug, Args)]
#[command(
    after_help = "containerd's config (version 2, or version 3 for containerd 2.x) needs the block\n`vial snapshotter --print-containerd-config` prints for the same --address and --root:\n  [proxy_plugins]\n    [proxy_plugins.vial]\n      type = \"snapshot\"\n      address = \"/run/vial/snapshotter.sock\"\n      [proxy_plugins.vial.exports]\n        root = \"/var/lib/vial/snapshotter\"\n        enable_remote_snapshot_annotations = \"true\"\n  [[plugins.\"io.containerd.transfer.v1.local\".unpack_config]]  (for vial, then overlayfs)\nThe exports (containerd 2.x) give kubelet an image filesystem it can stat and nerdctl's pulls\nthe labels of a volume's layers; the unpack_config entries let containerd 2.x's transfer service\n(`ctr images pull`, nerdctl) unpack with vial.\nFor Kubernetes on containerd 2.x, also [plugins.'io.containerd.cri.v1.images'] snapshotter = \"vial\" and\ndisable_snapshot_annotations = false (docs/containerd.md).\n\nThen pull volumes with `vial containerd pull REF` (nothing is downloaded: the volume is mounted\nlazily when containerd unpacks it) and run containers with `ctr run --snapshotter vial`. Ordinary\nimages work through it too (overlayfs). Mounts share the node chunk cache with `vial mount`.\nOn SIGTERM the volumes are unmounted; their snapshots stay and are mounted again at the next start."
)]
pub struct SnapshotterArgs {
    /// The unix socket containerd's proxy plugin dials.
    #[arg(long, default_value = "/run/vial/snapshotter.sock")]
    address: PathBuf,
    /// Where snapshots (and their record) live.
    #[arg(long, default_value = "/var/lib/vial/snapshotter")]
    root: PathBuf,
    /// Node chunk cache directory, shared with `vial mount`.
    #[arg(long, env = "VIAL_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Bound on the chunk cache, e.g. 500MiB, 20GiB.
    #[arg(long, env = "VIAL_CACHE_SIZE", default_value = "10GiB", value_parser = parse_size)]
    cache_size: u64,
    /// How long one chunk may take (retries included) before a read fails with EIO.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: std::time::Duration,
    /// Print what containerd's configuration needs for these flags, then exit without serving:
    /// the `[proxy_plugins.vial]` block (the socket, and the exports kubelet and nerdctl read) and
    /// the transfer service's `unpack_config` entries (containerd 2.x's `ctr images pull`, nerdctl).
    #[arg(long)]
    print_containerd_config: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct ContainerdArgs {
    #[command(subcommand)]
    command: ContainerdCommand,
}

#[derive(Debug, Subcommand)]
enum ContainerdCommand {
    /// Pull a volume (or any image) into containerd through a snapshotter, lazily for volumes.
    Pull(PullArgs),
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial containerd pull localhost:5000/weights/llama:v1\n  ctr run --rm --snapshotter vial \\\n      --mount type=bind,src=$(vial containerd pull localhost:5000/weights/llama:v1 --print-mountpoint),dst=/mnt/weights,options=rbind:ro \\\n      docker.io/library/python:3 job python serve.py /mnt/weights\n\n`ctr image pull` passes the snapshotter no labels, so it cannot tell a volume's layer from an\nordinary one; this command passes them (as stargz's `ctr-remote image rpull` does). The image\nrecord it leaves is an ordinary containerd image: `ctr image ls`, `ctr image rm` (which releases\nthe mount) and `ctr run --snapshotter vial` work on it."
)]
struct PullArgs {
    /// The volume or image: HOST/NAME:TAG or HOST/NAME@sha256:…
    reference: String,
    /// containerd's socket.
    #[arg(long, default_value = "/run/containerd/containerd.sock")]
    address: PathBuf,
    /// containerd namespace.
    #[arg(long, default_value = "default", env = "CONTAINERD_NAMESPACE")]
    namespace: String,
    /// The snapshotter, as containerd's config names it.
    #[arg(long, default_value = "vial")]
    snapshotter: String,
    /// Print only where the volume is mounted on the node (for `ctr run --mount`).
    #[arg(long)]
    print_mountpoint: bool,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[allow(clippy::print_stdout)]
pub fn run_snapshotter(args: SnapshotterArgs) -> anyhow::Result<()> {
    if args.print_containerd_config {
        // containerd resolves neither path against the snapshotter's directory.
        let address = std::path::absolute(&args.address).context("the --address path")?;
        let root = std::path::absolute(&args.root).context("the --root path")?;
        print!("{}", containerd_block(&address, &root));
        return Ok(());
    }
    let options = SnapshotterOptions {
        root: args.root.clone(),
        mount: MountOptions {
            cache_dir: args.cache_dir.clone().unwrap_or_else(default_cache_dir),
            cache_size: args.cache_size,
            prefetch: Prefetch::None,
            timeout: args.timeout,
            parallel: vial_snapshotter::mount::DOWNLOADS as usize,
        },
        registry: args.registry.options(),
    };
    block_on(async move {
        let snapshotter = VialSnapshotter::open(options)
            .await
            .with_context(|| format!("cannot open the snapshotter root {}", args.root.display()))?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot listen for SIGTERM")?;
        let shutdown = async move {
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                _ = tokio::signal::ctrl_c() => tracing::info!("interrupted, shutting down"),
            }
        };
        tracing::info!(address = %args.address.display(), root = %args.root.display(), "snapshotter listening");
        serve(Arc::clone(&snapshotter), &args.address, shutdown)
            .await
            .map_err(|e| anyhow::anyhow!("snapshotter failed: {e}"))?;
        let s = Arc::clone(&snapshotter);
        tokio::task::spawn_blocking(move || s.unmount_all())
            .await
            .context("unmounting volumes")?;
        let _ = std::fs::remove_file(&args.address);
        tracing::info!("snapshotter stopped");
        Ok(())
    })
}

#[allow(clippy::print_stdout)]
pub fn run(args: ContainerdArgs) -> anyhow::Result<()> {
    let ContainerdCommand::Pull(args) = args.command;
    let reference = parse_reference(&args.reference)?;
    let registry = args.registry.connect(reference.registry())?;
    block_on(async {
        let options = PullOptions {
            address: &args.address,
            namespace: &args.namespace,
            snapshotter: &args.snapshotter,
            architecture: host_architecture(),
        };
        let report = pull(&registry, &reference, &options)
            .await
            .map_err(|e| anyhow::anyhow!(vial_core::error_chain(&e)))
            .with_context(|| format!("cannot pull {reference} into containerd"))?;
        if args.json {
            return print_json(&report);
        }
        if args.print_mountpoint {
            let mountpoint = report
                .mountpoint
                .as_deref()
                .with_context(|| format!("{reference} is not a volume: it has no mountpoint"))?;
            println!("{mountpoint}");
            return Ok(());
        }
        if report.volume {
            eprintln!(
                "pulled volume {} ({}) lazily: snapshot {} mounted at {}",
                report.image,
                report.digest,
                report.chain_id,
                report.mountpoint.as_deref().unwrap_or("?")
            );
        } else {
            eprintln!(
                "pulled {} ({}): {} layers unpacked",
                report.image, report.digest, report.layers_unpacked
            );
        }
        println!("{}", report.image);
        Ok(())
    })
}
