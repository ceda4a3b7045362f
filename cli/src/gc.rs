//! `vial gc`: ask a vial registry for a garbage collection pass now, and follow it to the end.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use vial_client::{GcJob, Registry};

use crate::common::{block_on, count, human_bytes, print_json, RegistryArgs};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial gc localhost:5000 --dry-run   # what a pass would reclaim\n  vial gc localhost:5000             # a pass now, followed to the end\n  vial gc localhost:5000 --detach    # queue it, print its job id\n  vial gc localhost:5000 --job ID    # follow a pass queued earlier\n\nThe registry also collects on its own schedule (vial serve --gc-interval, default 1h). A pass\nfirst removes deleted versions whose retention window has passed, then every blob that no\nversion (live or still restorable) references and that nobody used within the grace period\n(--gc-grace). A pass looks only at blobs that are new or lost a reference since the last one.\nIt runs as a job on the registry: it goes on to the end if this command is interrupted, and\nasking again while one is queued or running follows that one. Pushes, pulls and mounts go on\nmeanwhile; docs/gc.md says why that is safe.\nWith authentication on, it needs delete access to every repository."
)]
pub struct GcArgs {
    /// The registry: host[:port]
    registry_host: String,
    /// Count what a pass would reclaim, without removing anything.
    #[arg(long, conflicts_with_all = ["detach", "job"])]
    dry_run: bool,
    /// Queue the pass and print its job id without waiting for it.
    #[arg(long, conflicts_with = "job")]
    detach: bool,
    /// Follow the pass with this job id (printed by --detach) instead of asking for a new one.
    #[arg(long, value_name = "ID")]
    job: Option<String>,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// How long one status request waits for the pass to finish.
const WAIT: Duration = Duration::from_secs(10);

#[allow(clippy::print_stdout)]
pub fn run(args: GcArgs) -> anyhow::Result<()> {
    let host = args.registry_host.trim_end_matches('/');
    let registry = args.registry.connect(host)?;
    let failed = || format!("garbage collection on {host} failed");
    block_on(async {
        if args.dry_run {
            let report = registry.gc(true).await.with_context(failed)?;
            if args.json {
                return print_json(&report);
            }
            let n = |k: &str| number(&report, k);
            println!(
                "would reclaim {} in {} and {} (after removing {})",
                human_bytes(n("bytes")),
                count(n("blobs"), "blob"),
                count(n("packs"), "pack"),
                count(n("manifests_purged"), "expired deleted version")
            );
            if report.get("pack_bytes").is_some() {
                println!(
                    "packs hold {}, {} of it chunks nothing references",
                    human_bytes(n("pack_bytes")),
                    human_bytes(n("pack_dead_bytes")),
                );
                println!(
                    "would compact {}: rewrite {} of live chunks and free {}",
                    count(n("packs_compacted"), "pack"),
                    human_bytes(n("rewritten_bytes")),
                    human_bytes(n("compacted_dead_bytes")),
                );
                println!(
                    "packs would then hold {}, {} of it dead (compacted packs go once the grace \
                     period since the move has passed)",
                    human_bytes(n("pack_bytes_after")),
                    human_bytes(n("pack_dead_bytes_after")),
                );
            }
            return Ok(());
        }
        let job = match &args.job {
            Some(id) => registry.gc_status(id, Duration::ZERO).await,
            None if args.detach => registry.gc_start(Duration::ZERO).await,
            None => registry.gc_start(WAIT).await,
        }
        .with_context(failed)?;
        if args.detach {
            if args.json {
                return print_json(&job);
            }
            eprintln!(
                "garbage collection pass {} is {}; follow it with:",
                job.id, job.state
            );
            eprintln!("  vial gc {host} --job {}", job.id);
            println!("{}", job.id);
            return Ok(());
        }
        let job = follow(&registry, job).await.with_context(failed)?;
        let report = job.outcome().with_context(failed)?;
        if args.json {
            return print_json(&report);
        }
        let n = |k: &str| number(&report, k);
        println!(
            "reclaimed {} in {} and {} ({} removed first; {} looked at; {:.1} s)",
            human_bytes(n("bytes")),
            count(n("blobs"), "blob"),
            count(n("packs"), "pack"),
            count(n("manifests_purged"), "expired deleted version"),
            count(n("examined"), "candidate"),
            report
                .get("seconds")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0)
        );
        if n("packs_compacted") > 0 {
            println!(
                "compacted {}: rewrote {} of live chunks, {} dead go with them",
                count(n("packs_compacted"), "pack"),
                human_bytes(n("rewritten_bytes")),
                human_bytes(n("compacted_dead_bytes")),
            );
        }
        Ok(())
    })
}

fn number(report: &serde_json::Value, key: &str) -> u64 {
    report
        .get(key)
        .and_then(serde_json::Value::as_u64)
        .unwrap_or(0)
}

/// Follows a pass until it finishes, showing on a terminal what it has reclaimed so far.
async fn follow(registry: &Registry, mut job: GcJob) -> Result<GcJob, vial_client::ClientError> {
    use std::io::IsTerminal;
    let bar = if std::io::stderr().is_terminal() {
        ProgressBar::new_spinner()
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} gc {elapsed:>4} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    while !job.finished() {
        let so_far = job.report.as_ref();
        let n = |k: &str| so_far.map_or(0, |r| number(r, k));
        bar.set_message(format!(
            "{}: {} expired versions removed, {} blobs ({}) reclaimed, {} candidates looked at, {} packs compacted",
            job.state,
            n("manifests_purged"),
            n("blobs"),
            human_bytes(n("bytes")),
            n("examined"),
            n("packs_compacted")
        ));
        job = registry.gc_status(&job.id, WAIT).await?;
    }
    bar.finish_and_clear();
    Ok(job)
}
