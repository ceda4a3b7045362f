//! `vial serve`: run the registry until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use vial_registry::config::DEFAULT_MAX_MANIFEST_SIZE;
use vial_registry::{BlobBackend, Config, MetadataBackend};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial serve                               # 127.0.0.1:5000, data in ./vial-data\n  vial serve --addr 0.0.0.0:5000 --data /srv/vial\n  vial serve --metadata-url postgres://vial:PASSWORD@db/vial --blob-url file:///srv/blobs"
)]
pub struct ServeArgs {
    /// Address to listen on. Use port 0 to pick a free port (the chosen address is printed).
    #[arg(long, env = "VIAL_ADDR", default_value = "127.0.0.1:5000")]
    addr: SocketAddr,

    /// Directory for the embedded metadata database and blob files.
    #[arg(long, env = "VIAL_DATA", default_value = "./vial-data")]
    data: PathBuf,

    /// Metadata store: sqlite://PATH (default: DATA/metadata.db) or postgres://USER:PASSWORD@HOST/DB.
    #[arg(long, env = "VIAL_METADATA_URL", hide_env_values = true)]
    metadata_url: Option<String>,

    /// Blob store: file://PATH (default: the --data directory).
    #[arg(long, env = "VIAL_BLOB_URL")]
    blob_url: Option<String>,

    /// Largest manifest accepted, in bytes.
    #[arg(long, env = "VIAL_MAX_MANIFEST_SIZE", default_value_t = DEFAULT_MAX_MANIFEST_SIZE)]
    max_manifest_size: u64,
}

pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("could not start the async runtime")?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("could not listen on {}", args.addr))?;
        let local = listener.local_addr().context("listener has no address")?;
        // One line on stdout with the bound address, so scripts and tests that pass port 0 can find
        // the server without polling.
        #[allow(clippy::print_stdout)]
        {
            println!("vial registry listening on http://{local}");
        }
        let mut config = Config::embedded(&args.data);
        config.max_manifest_size = args.max_manifest_size;
        if let Some(url) = &args.metadata_url {
            config.metadata = MetadataBackend::from_url(url)?;
        }
        if let Some(url) = &args.blob_url {
            config.blobs = BlobBackend::from_url(url)?;
        }
        tracing::info!(metadata = ?config.metadata, blobs = ?config.blobs, "opening storage");
        vial_registry::serve(config, listener, shutdown_signal())
            .await
            .context("registry failed")
    })
}

/// Completes on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for SIGINT");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        () = term => tracing::info!("SIGTERM received, shutting down"),
    }
}
