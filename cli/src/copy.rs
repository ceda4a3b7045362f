//! `vial copy SRC DST`: a version (or any artifact) from one repository or registry to another,
//! digest unchanged, sending only what the destination lacks.

use anyhow::{bail, Context};
use clap::Args;
use vial_client::copy::{copy, Endpoints};

use std::io::IsTerminal;

use crate::common::{
    block_on, count, human_bytes, parse_reference, print_json, Bars, RegistryArgs,
};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial copy localhost:5000/weights/qwen:prod registry.internal/weights/qwen\n  vial copy localhost:5000/weights/qwen@sha256:3f1c… backup.internal/weights/qwen:2026-11-29\n\nThe destination gets the source's tag unless DST names one. Chunks the destination already\nholds are not sent; within one registry the rest are mounted, not copied."
)]
pub struct CopyArgs {
    /// What to copy: HOST/NAME:TAG or HOST/NAME@DIGEST.
    source: String,
    /// Where to: HOST/NAME, or HOST/NAME:TAG to tag it there.
    destination: String,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[allow(clippy::print_stdout)]
pub fn run(args: CopyArgs) -> anyhow::Result<()> {
    let src = parse_reference(&args.source)?;
    let dst = parse_reference(&args.destination)?;
    if dst.digest().is_some() {
        bail!("the destination {dst} names a digest; give HOST/NAME or HOST/NAME:TAG (the digest stays the source's)");
    }
    let tags: Vec<_> = dst.tag().or(src.tag()).cloned().into_iter().collect();
    let from = args.registry.connect(src.registry())?;
    let to = args.registry.connect(dst.registry())?;
    let bar = Bars::new(
        "checked",
        "copied",
        !args.json && std::io::stderr().is_terminal(),
    );
    block_on(async {
        let report = copy(
            Endpoints {
                src: &from,
                src_repo: src.repo(),
                dst: &to,
                dst_repo: dst.repo(),
            },
            &src.target(),
            &tags,
            bar.as_ref(),
        )
        .await
        .with_context(|| format!("copy of {src} to {dst} failed"))?;
        bar.finish();
        if args.json {
            return print_json(&report);
        }
        // Within one vial registry the existence check itself links what the destination
        // lacks (a bulk mount), so those blobs show up as already there, not as mounted.
        let mut moved = format!(
            "copied {} and {} ({})",
            count(report.manifests, "manifest"),
            count(report.blobs_copied, "blob"),
            human_bytes(report.bytes_copied)
        );
        if report.blobs_present > 0 {
            moved.push_str(&format!(
                "; {} already there or linked within the registry",
                count(report.blobs_present, "blob")
            ));
        }
        if report.blobs_mounted > 0 {
            moved.push_str(&format!(
                "; {} mounted from the source repository",
                count(report.blobs_mounted, "blob")
            ));
        }
        eprintln!("{moved}, in {:.1} s", report.seconds);
        let pinned = format!("{}/{}@{}", dst.registry(), dst.repo(), report.digest);
        println!("{pinned}");
        Ok(())
    })
}
