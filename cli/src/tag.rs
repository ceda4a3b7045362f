//! `vial tag set|ls|rm`: the only mutable part of a volume.

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use vial_client::push;
use vial_core::{Tag, Target};

use crate::common::{block_on, parse_reference, print_json, RegistryArgs};
use crate::push::parse_expect;

#[derive(Debug, Args)]
pub struct TagArgs {
    #[command(subcommand)]
    command: TagCommand,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Subcommand)]
enum TagCommand {
    /// Point TAG at a version: `vial tag set host/name@sha256:… prod [--expect sha256:…]`.
    Set {
        /// The version, by digest (or by another tag, resolved now).
        reference: String,
        tag: String,
        /// Only move the tag if it currently points at this digest (`none`: only if it does not exist).
        #[arg(long)]
        expect: Option<String>,
        /// The tag stops resolving at this time (RFC 3339, e.g. 2026-12-31T00:00:00Z) or after
        /// this long (e.g. 24h, 7d); vial registries remove it then.
        #[arg(long, value_name = "TIME|DURATION")]
        expires_at: Option<String>,
    },
    /// Every move of a tag: when, by whom, from which digest to which.
    History {
        /// The volume: host/name
        reference: String,
        tag: String,
        #[arg(long)]
        json: bool,
    },
    /// List the tags of a volume and the digest each points at.
    Ls {
        reference: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove a tag (the version stays): `vial tag rm host/name:tag`.
    Rm { reference: String },
}

#[allow(clippy::print_stdout)]
pub fn run(args: TagArgs) -> anyhow::Result<()> {
    match args.command {
        TagCommand::Set {
            reference,
            tag,
            expect,
            expires_at,
        } => {
            let reference = parse_reference(&reference)?;
            let tag = Tag::parse(&tag).with_context(|| format!("invalid tag {tag:?}"))?;
            let expect = parse_expect(expect.as_deref())?;
            let expires_at = expires_at.as_deref().map(parse_expiry).transpose()?;
            let registry = args.registry.connect(reference.registry())?;
            block_on(async {
                let digest = match reference.digest() {
                    Some(d) => d.clone(),
                    None => {
                        registry
                            .get_manifest(reference.repo(), &reference.target())
                            .await?
                            .with_context(|| format!("{reference} not found"))?
                            .digest
                    }
                };
                push::tag_version(
                    &registry,
                    reference.repo(),
                    &digest,
                    &tag,
                    expect.as_ref().map(Option::as_ref),
                    expires_at.as_deref(),
                )
                .await
                .with_context(|| format!("could not point {tag} at {digest}"))?;
                eprintln!("{} now points at {digest}", reference.with_tag(tag.clone()));
                if let Some(at) = &expires_at {
                    eprintln!("it expires at {at}");
                }
                println!("{}", reference.pinned(digest));
                Ok(())
            })
        }
        TagCommand::Ls { reference, json } => {
            let reference = parse_reference(&reference)?;
            let registry = args.registry.connect(reference.registry())?;
            block_on(async {
                let tags = registry
                    .tags(reference.repo())
                    .await
                    .with_context(|| format!("cannot list tags of {reference}"))?;
                let mut rows = Vec::new();
                for t in tags {
                    let Ok(tag) = Tag::parse(&t) else { continue };
                    let digest = registry
                        .get_manifest(reference.repo(), &Target::Tag(tag))
                        .await?
                        .map(|m| m.digest.to_string())
                        .unwrap_or_default();
                    rows.push(serde_json::json!({ "tag": t, "digest": digest }));
                }
                if json {
                    print_json(&rows)?;
                } else {
                    for r in &rows {
                        println!(
                            "{:<24} {}",
                            r["tag"].as_str().unwrap_or(""),
                            r["digest"].as_str().unwrap_or("")
                        );
                    }
                }
                Ok(())
            })
        }
        TagCommand::History {
            reference,
            tag,
            json,
        } => {
            let reference = parse_reference(&reference)?;
            let tag = Tag::parse(&tag).with_context(|| format!("invalid tag {tag:?}"))?;
            let registry = args.registry.connect(reference.registry())?;
            block_on(async {
                let history = registry
                    .tag_history(reference.repo(), &tag)
                    .await
                    .with_context(|| format!("cannot read the history of {tag}"))?
                    .with_context(|| format!("{} keeps no tag history", reference.registry()))?;
                if json {
                    return print_json(&history);
                }
                println!(
                    "{:<20}  {:<16}  {:<12}  {:<71}  TO",
                    "WHEN", "WHY", "BY", "FROM"
                );
                let short = |d: &Option<vial_core::Digest>| {
                    d.as_ref().map_or("-".to_owned(), |d| d.to_string())
                };
                for e in &history {
                    println!(
                        "{:<20}  {:<16}  {:<12}  {:<71}  {}",
                        e.at,
                        e.reason,
                        e.by.as_deref().unwrap_or("-"),
                        short(&e.from),
                        short(&e.to)
                    );
                }
                Ok(())
            })
        }
        TagCommand::Rm { reference } => {
            let reference = parse_reference(&reference)?;
            let Some(tag) = reference.tag() else {
                bail!("give the tag to remove: host/name:tag")
            };
            let registry = args.registry.connect(reference.registry())?;
            block_on(async {
                if !registry
                    .delete_manifest(reference.repo(), tag.as_str())
                    .await?
                {
                    bail!("tag {tag} does not exist in {}", reference.repo());
                }
                eprintln!("removed tag {reference}");
                Ok(())
            })
        }
    }
}

/// `--expires-at`: an RFC 3339 time, or a duration from now.
fn parse_expiry(s: &str) -> anyhow::Result<String> {
    if let Ok(d) = humantime::parse_duration(s) {
        return Ok(humantime::format_rfc3339_seconds(std::time::SystemTime::now() + d).to_string());
    }
    humantime::parse_rfc3339_weak(s)
        .map(|t| humantime::format_rfc3339_seconds(t).to_string())
        .with_context(|| format!("--expires-at {s:?} is neither an RFC 3339 time nor a duration"))
}
