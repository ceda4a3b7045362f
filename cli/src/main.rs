//! The `vial` command line: argument parsing, logging set-up and error reporting around the
//! subcommands, each in its own module.

mod common;
mod containerd;
mod copy;
mod follow;
mod gc;
mod info;
mod lifecycle;
mod login;
mod mount;
mod mount_guard;
mod push;
mod seal;
mod serve;
mod sync;
mod tag;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// vial ships model data the way images ship code: publish once, get a digest, mount it anywhere.
#[derive(Debug, Parser)]
#[command(name = "vial", version, about, long_about = None, propagate_version = true)]
struct Cli {
    /// Log filter, e.g. `info`, `debug` or `vial_registry=debug` (also read from VIAL_LOG).
    #[arg(long, global = true, env = "VIAL_LOG", default_value = "info")]
    log: String,

    /// Log format.
    #[arg(long, global = true, env = "VIAL_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,

    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

// Parsed once per run: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Subcommand)]
enum Command {
    /// Run an OCI registry that stores volumes (embedded SQLite + local files by default).
    Serve(serve::ServeArgs),
    /// Publish a directory as a new sealed version; prints the pinned reference.
    Push(push::PushArgs),
    /// Download a version into a directory (parallel, verified, resumable).
    Pull(push::PullArgs),
    /// Copy a version (or any artifact) to another repository or registry, digest unchanged.
    Copy(copy::CopyArgs),
    /// Seal a file artifact pushed by another tool (oras push, ModelPack) into a vial volume.
    Seal(seal::SealArgs),
    /// Point, list and remove tags.
    Tag(tag::TagArgs),
    /// List the sealed versions of a volume: digest, size, files, tags, creation time.
    Versions(info::VersionsArgs),
    /// List the volumes of a registry or namespace.
    Ls(info::LsArgs),
    /// Show a version's files, sizes and chunk counts.
    Inspect(info::InspectArgs),
    /// Compare two versions: files added, removed, changed, and bytes to fetch.
    Diff(info::DiffArgs),
    /// Delete versions (reversible for the registry's retention window).
    Rm(lifecycle::RmArgs),
    /// Bring back a deleted version, optionally with its tags.
    Restore(lifecycle::RestoreArgs),
    /// Ask a vial registry for a garbage collection pass now (administrators).
    Gc(gc::GcArgs),
    /// Have the registry copy a bucket, another registry's artifact or a Hugging Face Hub
    /// repository into a sealed version (a durable job).
    Sync(sync::SyncArgs),
    /// Save credentials for a registry in the Docker config file.
    Login(login::LoginArgs),
    /// Mount a version read-only, lazily: files appear at once, bytes stream in as they are read.
    Mount(mount::MountArgs),
    /// Unmount a volume mounted with `vial mount`.
    Umount(mount::UmountArgs),
    /// Watches a mount process and detaches its mount if the process dies (started by
    /// `vial mount`, not by hand).
    #[command(hide = true)]
    MountGuard(mount_guard::GuardArgs),
    /// Serve containerd's snapshotter API: volumes mounted lazily at container start.
    Snapshotter(containerd::SnapshotterArgs),
    /// Work with containerd: pull a volume through vial's snapshotter.
    Containerd(containerd::ContainerdArgs),
}

fn main() -> ExitCode {
    // Called as mount.vial by mount(8): translate its calling convention.
    let argv: Vec<String> = std::env::args().collect();
    let invoked_as = argv
        .first()
        .and_then(|a| std::path::Path::new(a).file_name())
        .and_then(|n| n.to_str())
        .unwrap_or("");
    let cli = if invoked_as == "mount.vial" {
        match mount::helper_args(&argv) {
            Ok(args) => Cli::parse_from(args),
            Err(e) => {
                eprintln!("mount.vial: {e:#}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        Cli::parse()
    };
    init_logging(&cli.log, cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
        Command::Push(args) => push::run_push(args),
        Command::Pull(args) => push::run_pull(args),
        Command::Copy(args) => copy::run(args),
        Command::Seal(args) => seal::run(args),
        Command::Tag(args) => tag::run(args),
        Command::Versions(args) => info::run_versions(args),
        Command::Ls(args) => info::run_ls(args),
        Command::Inspect(args) => info::run_inspect(args),
        Command::Diff(args) => info::run_diff(args),
        Command::Rm(args) => lifecycle::run_rm(args),
        Command::Restore(args) => lifecycle::run_restore(args),
        Command::Gc(args) => gc::run(args),
        Command::Sync(args) => sync::run(args),
        Command::Login(args) => login::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Umount(args) => mount::run_umount(args),
        Command::MountGuard(args) => mount_guard::run(args),
        Command::Snapshotter(args) => containerd::run_snapshotter(args),
        Command::Containerd(args) => containerd::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader of our output went away (`| head`): stop quietly, as a shell tool does.
        Err(e) if common::is_broken_pipe(&e) => ExitCode::from(141),
        Err(e) => {
            eprintln!("vial: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // Colours only for a person at a terminal, never into a file or a pipe.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
