//! `vial rm` and `vial restore`: deleting versions reversibly, and bringing them back.

use anyhow::{bail, Context};
use clap::Args;
use vial_client::Registry;
use vial_core::{Digest, RepoName, Target};

use crate::common::{block_on, parse_reference, print_json, RegistryArgs};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial rm localhost:5000/weights/my-model@sha256:…       # one version\n  vial rm localhost:5000/weights/my-model:candidate      # the version the tag points at\n  vial rm localhost:5000/weights/my-model --all          # every version of the volume\n\nA deleted version is hidden at once (pulls and mounts of it fail, its tags are removed and\nremembered) and kept for the registry's retention window (7 days by default): `vial versions\n--deleted` lists it and `vial restore` brings it back. A version a node reports mounted is\nnot deleted without --force."
)]
pub struct RmArgs {
    /// HOST/NAME@DIGEST, HOST/NAME:TAG (the version the tag points at) or HOST/NAME with --all.
    reference: String,
    /// Delete every version of the volume.
    #[arg(long)]
    all: bool,
    /// Delete even versions that nodes report mounted.
    #[arg(long)]
    force: bool,
    /// Print what was deleted as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial versions localhost:5000/weights/my-model --deleted   # what can be restored, until when\n  vial restore localhost:5000/weights/my-model@sha256:…\n  vial restore localhost:5000/weights/my-model@sha256:… --tags   # and its tags, where still free"
)]
pub struct RestoreArgs {
    /// The deleted version: HOST/NAME@DIGEST
    reference: String,
    /// Point the tags it had when it was deleted at it again (those nobody has taken since).
    #[arg(long)]
    tags: bool,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[allow(clippy::print_stdout)]
pub fn run_rm(args: RmArgs) -> anyhow::Result<()> {
    let reference = parse_reference(&args.reference)?;
    let registry = args.registry.connect(reference.registry())?;
    let repo = reference.repo();
    block_on(async {
        let digests: Vec<Digest> = match (reference.digest(), reference.tag(), args.all) {
            (Some(d), _, false) => vec![d.clone()],
            (None, Some(_), false) => {
                let m = registry
                    .get_manifest(repo, &reference.target())
                    .await?
                    .with_context(|| format!("{reference} not found"))?;
                vec![m.digest]
            }
            (None, None, true) => {
                let versions = registry
                    .versions(repo, false)
                    .await
                    .with_context(|| format!("cannot list the versions of {reference}"))?
                    .with_context(|| {
                        format!(
                            "{} cannot list versions; delete them one by one by digest",
                            reference.registry()
                        )
                    })?;
                versions.into_iter().map(|v| v.digest).collect()
            }
            (_, _, true) => bail!("--all deletes a whole volume: give HOST/NAME without a tag or digest"),
            (None, None, false) => bail!(
                "say which version to delete (HOST/NAME@DIGEST or HOST/NAME:TAG), or pass --all to delete every version of {reference}"
            ),
        };
        let mut deleted = Vec::new();
        for digest in &digests {
            if !args.force {
                refuse_if_mounted(&registry, repo, digest, &reference).await?;
            }
            if registry.delete_manifest(repo, digest.as_str()).await? {
                if !args.json {
                    eprintln!("deleted {}", reference.pinned(digest.clone()));
                }
                deleted.push(digest.clone());
            } else if !args.all {
                bail!("{} not found", reference.pinned(digest.clone()));
            }
        }
        if args.json {
            print_json(&serde_json::json!({ "deleted": deleted }))?;
        } else if deleted.is_empty() {
            eprintln!("{reference} has no versions to delete");
        } else {
            eprintln!(
                "restorable within the registry's retention window: vial versions {} --deleted",
                reference.registry().to_owned() + "/" + repo.as_str()
            );
        }
        Ok(())
    })
}

async fn refuse_if_mounted(
    registry: &Registry,
    repo: &RepoName,
    digest: &Digest,
    reference: &vial_core::Reference,
) -> anyhow::Result<()> {
    let leases = registry.leases(repo, digest).await?.unwrap_or_default();
    if leases.is_empty() {
        return Ok(());
    }
    let holders: Vec<String> = leases
        .iter()
        .map(|l| format!("  {} (lease until {})", l.holder, l.expires_at))
        .collect();
    bail!(
        "{} is mounted on:\n{}\nunmount it there first, or pass --force to delete it anyway",
        reference.pinned(digest.clone()),
        holders.join("\n")
    )
}

#[allow(clippy::print_stdout)]
pub fn run_restore(args: RestoreArgs) -> anyhow::Result<()> {
    let reference = parse_reference(&args.reference)?;
    let Target::Digest(digest) = reference.target() else {
        bail!("restore needs the version's digest (HOST/NAME@sha256:…): `vial versions HOST/NAME --deleted` lists them");
    };
    let registry = args.registry.connect(reference.registry())?;
    block_on(async {
        let report = registry
            .restore(reference.repo(), &digest, args.tags)
            .await
            .with_context(|| format!("cannot restore {reference}"))?;
        if args.json {
            return print_json(&report);
        }
        eprintln!("restored {reference}");
        if !report.tags.is_empty() {
            eprintln!("tags pointing at it again: {}", report.tags.join(", "));
        }
        if !report.tags_moved_on.is_empty() {
            eprintln!(
                "tags left where they are now (they point at other versions): {}",
                report.tags_moved_on.join(", ")
            );
        }
        println!("{reference}");
        Ok(())
    })
}
