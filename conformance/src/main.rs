//! The `vial-conformance` command: runs the suite against a registry and prints one line per check.

#![allow(clippy::print_stdout)]

use std::process::ExitCode;

use clap::Parser;
use vial_conformance::{default_namespace, run, Config, StrictFailures};

/// Check a registry against the OCI Distribution Specification v1.1.
#[derive(Debug, Parser)]
#[command(name = "vial-conformance", version)]
struct Args {
    /// Registry base URL, e.g. http://127.0.0.1:5000.
    #[arg(env = "VIAL_CONFORMANCE_URL")]
    base_url: String,

    /// Repository prefix for everything the suite pushes (default: conformance/<random>).
    #[arg(long)]
    namespace: Option<String>,

    /// Namespace for the source repository of the cross-repository mount checks.
    #[arg(long)]
    cross_mount_namespace: Option<String>,

    /// Leave out a check: an id, a dot-separated prefix (push.chunked) or a glob ending in '*'.
    #[arg(long = "skip", value_name = "ID")]
    skip: Vec<String>,

    /// Print the report as JSON instead of lines.
    #[arg(long)]
    json: bool,

    /// Also exit non-zero when a check ended in a warning (a tolerated alternative is not what
    /// the check requires) or was skipped (optional features count as required), except checks
    /// excluded with --skip.
    #[arg(long)]
    strict: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let config = Config {
        base_url: args.base_url,
        namespace: args.namespace.unwrap_or_else(default_namespace),
        cross_mount_namespace: args.cross_mount_namespace,
        skip: args.skip,
    };
    let report = run(&config).await;
    if args.json {
        let body = serde_json::json!({
            "base_url": config.base_url,
            "namespace": config.namespace,
            "passed": report.passed(),
            "failed": report.failed(),
            "warnings": report.warnings(),
            "skipped": report.skipped(),
            "results": report.results,
        });
        match serde_json::to_string_pretty(&body) {
            Ok(text) => println!("{text}"),
            Err(e) => eprintln!("cannot serialise the report: {e}"),
        }
        eprintln!("{}", report.summary());
    } else {
        for result in &report.results {
            println!("{result}");
        }
        println!("{}", report.summary());
    }
    let strict = if args.strict {
        report.strict_failures()
    } else {
        StrictFailures::default()
    };
    if !strict.is_empty() {
        eprintln!("{strict}");
    }
    if report.failed() > 0 || !strict.is_empty() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
