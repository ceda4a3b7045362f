//! The `vial` command line: argument parsing, logging set-up and error reporting around the
//! subcommands, each in its own module.

mod serve;

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

#[derive(Debug, Subcommand)]
enum Command {
    /// Run an OCI registry that stores volumes (embedded SQLite + local files by default).
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(&cli.log, cli.log_format);
    let result = match cli.command {
        Command::Serve(args) => serve::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("vial: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(filter: &str, format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_new(filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}
