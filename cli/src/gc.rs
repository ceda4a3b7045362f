//! `vial gc`: ask a vial registry for a garbage collection pass now.

use anyhow::Context;
use clap::Args;

use crate::common::{block_on, count, human_bytes, print_json, RegistryArgs};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial gc localhost:5000 --dry-run   # what a pass would reclaim\n  vial gc localhost:5000\n\nThe registry also collects on its own schedule (vial serve --gc-interval, default 1h). A pass\nfirst removes deleted versions whose retention window has passed, then every blob that no\nversion (live or still restorable) references and that nobody used within the grace period\n(--gc-grace). A pass looks only at blobs that are new or lost a reference since the last one,\nand runs to the end even if this command is interrupted. Pushes, pulls and mounts go on meanwhile; docs/gc.md says why that is safe.\nWith authentication on, it needs delete access to every repository."
)]
pub struct GcArgs {
    /// The registry: host[:port]
    registry_host: String,
    /// Count what a pass would reclaim, without removing anything.
    #[arg(long)]
    dry_run: bool,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[allow(clippy::print_stdout)]
pub fn run(args: GcArgs) -> anyhow::Result<()> {
    let host = args.registry_host.trim_end_matches('/');
    let registry = args.registry.connect(host)?;
    block_on(async {
        let report = registry
            .gc(args.dry_run)
            .await
            .with_context(|| format!("garbage collection on {host} failed"))?;
        if args.json {
            return print_json(&report);
        }
        let n = |k: &str| {
            report
                .get(k)
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(0)
        };
        if args.dry_run {
            println!(
                "would reclaim {} in {} and {} (after removing {})",
                human_bytes(n("bytes")),
                count(n("blobs"), "blob"),
                count(n("packs"), "pack"),
                count(n("manifests_purged"), "expired deleted version")
            );
        } else {
            println!(
                "reclaimed {} in {} and {} ({} removed first; {} looked at)",
                human_bytes(n("bytes")),
                count(n("blobs"), "blob"),
                count(n("packs"), "pack"),
                count(n("manifests_purged"), "expired deleted version"),
                count(n("examined"), "candidate")
            );
        }
        Ok(())
    })
}
