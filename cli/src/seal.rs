//! `vial seal`: have the registry turn a file artifact another tool pushed into a vial volume.

use anyhow::Context;
use clap::Args;
use vial_core::{Digest, Target};

use crate::common::{block_on, count, human_bytes, parse_reference, print_json, RegistryArgs};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  oras push localhost:5000/weights/llama:v1 model.safetensors config.json\n  vial seal localhost:5000/weights/llama:v1\n  vial mount localhost:5000/weights/llama:v1 /mnt/llama   # finds the sealed volume itself\n\nA vial registry seals file artifacts on push by default (vial serve --seal-on-push); this command\nasks for a seal now (again, if one failed), waits for it and prints the volume's pinned reference.\nThe artifact is left as it is: the volume is attached to it as a referrer (`oras discover` lists it)."
)]
pub struct SealArgs {
    /// The artifact: HOST/NAME:TAG or HOST/NAME@sha256:…
    reference: String,

    /// Queue the seal and return at once instead of waiting for the volume.
    #[arg(long)]
    no_wait: bool,

    /// Print a JSON summary on stdout instead of the pinned reference.
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    registry: RegistryArgs,
}

#[allow(clippy::print_stdout)]
pub fn run(args: SealArgs) -> anyhow::Result<()> {
    let reference = parse_reference(&args.reference)?;
    let registry = args.registry.connect(reference.registry())?;
    block_on(async {
        let repo = reference.repo();
        let artifact: Digest = match reference.target() {
            Target::Digest(d) => d,
            target @ Target::Tag(_) => {
                registry
                    .get_manifest(repo, &target)
                    .await?
                    .with_context(|| format!("{reference} not found"))?
                    .digest
            }
        };
        if args.no_wait {
            let status = registry
                .seal(repo, &artifact, true, std::time::Duration::ZERO)
                .await?
                .with_context(|| format!("{} cannot seal artifacts", reference.registry()))?;
            if args.json {
                print_json(&status)?;
            } else {
                println!("{}", status.state);
            }
            return Ok(());
        }
        let version = vial_client::volume::open(&registry, repo, &reference.target())
            .await
            .with_context(|| format!("seal of {reference} failed"))?;
        let Some(from) = &version.sealed_from else {
            anyhow::bail!("{reference} is already a vial volume; there is nothing to seal");
        };
        let pinned = reference.pinned(version.digest.clone());
        if args.json {
            print_json(&serde_json::json!({
                "artifact": from,
                "volume": version.digest,
                "reference": pinned.to_string(),
                "files": version.tree.file_count(),
                "bytes": version.tree.total_bytes(),
                "chunks": version.tree.chunks.len(),
            }))?;
        } else {
            // The artifact's reference goes to stderr and says what it is, so that the one line
            // on stdout, the volume's pinned reference, is the result.
            eprintln!(
                "artifact {} sealed into a volume ({}, {}, {}); the volume's pinned reference:",
                reference.pinned(from.clone()),
                count(version.tree.file_count() as u64, "file"),
                human_bytes(version.tree.total_bytes()),
                count(version.tree.chunks.len() as u64, "chunk")
            );
            println!("{pinned}");
        }
        Ok(())
    })
}
