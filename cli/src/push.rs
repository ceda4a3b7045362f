//! `vial push` and `vial pull`.

use std::io::IsTerminal;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use vial_client::pull::{self, PullOptions};
use vial_client::push::{self, PushOptions, SealTag};
use vial_core::{Digest, Tag};

use crate::common::{
    block_on, count, human_bytes, parse_reference, print_json, Bars, RegistryArgs,
};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial push ./checkpoints/step-4000 localhost:5000/weights/my-model --tag candidate\n  vial push ./ckpt localhost:5000/weights/my-model:prod --expect sha256:… --json\n\nThe last line printed is the pinned reference (host/name@sha256:…) to put in deployment configs."
)]
pub struct PushArgs {
    /// Directory to publish.
    dir: PathBuf,
    /// Volume to publish it to: host[:port]/name (a :tag here is the same as --tag).
    reference: String,
    /// Tag to point at the new version once it is sealed (repeatable).
    #[arg(long = "tag", short = 't')]
    tags: Vec<String>,
    /// Move the tags only if they currently point at this digest (`none`: only if they do not exist).
    #[arg(long)]
    expect: Option<String>,
    /// Read and hash every file, even those the local index says are unchanged.
    #[arg(long)]
    rehash: bool,
    /// Print a JSON summary instead of text.
    #[arg(long)]
    json: bool,
    /// Chunk uploads in flight at once.
    #[arg(long, default_value_t = 16)]
    uploads: usize,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial pull localhost:5000/weights/my-model@sha256:… ./model\n  vial pull localhost:5000/weights/my-model:prod ./model --json\n  vial pull localhost:5000/weights/my-model:prod ./model --fsync\n  vial pull --follow localhost:5000/weights/my-model:prod /srv/model --exec 'curl -X POST localhost:8000/reload'\n\nAn interrupted pull resumes: run it again and only what is missing or wrong is downloaded.\nWithout --fsync the files are in the page cache when pull returns, as after curl -o: a power\nloss right after could lose them, and running the pull again checks every chunk on disk.\n\nWith --follow, DIR/current is a symlink to DIR/versions/sha256-<hex>/, a complete and verified\ncopy of the version the tag points at. When the tag moves, the new version is built beside the\nold one (unchanged files hard-linked, unchanged chunks copied, only the rest downloaded), then\ncurrent is switched in one rename: a reader that resolves current once reads one version to the\nend. --exec runs after each switch with VIAL_DIGEST, VIAL_REFERENCE, VIAL_PATH (the version's\ndirectory), VIAL_CURRENT and VIAL_PREVIOUS_DIGEST set. One line per switch is printed (a JSON\nobject with --json). Killed at any moment, it resumes where it was; SIGTERM stops it."
)]
pub struct PullArgs {
    /// Version to download: host[:port]/name:tag or host[:port]/name@sha256:…
    reference: String,
    /// Directory to write it to (created if missing).
    dir: PathBuf,
    /// Downloads in flight at once (each a run of up to 16 MiB of chunks).
    #[arg(long, default_value_t = 8)]
    downloads: usize,
    /// Make every file durable on disk (fsync) before pull returns (with --follow: before each
    /// switch).
    #[arg(long)]
    fsync: bool,
    /// Keep following the tag: switch DIR/current to each version it moves to, fetching only
    /// what changed. Runs until SIGTERM or Ctrl-C.
    #[arg(long)]
    follow: bool,
    /// With --follow: versions to keep on disk, the current one included (older ones are removed
    /// after each switch; a tag moved back to a kept version switches without fetching).
    #[arg(long, default_value_t = 2, requires = "follow", value_parser = clap::value_parser!(u64).range(1..))]
    keep: u64,
    /// With --follow: a shell command to run after each switch.
    #[arg(long, requires = "follow", value_name = "CMD")]
    exec: Option<String>,
    /// Print a JSON summary instead of text (with --follow: one JSON object per line).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// `--expect` as the client takes it: `None` (no condition), `Some(None)` (tag must not exist).
pub fn parse_expect(expect: Option<&str>) -> anyhow::Result<Option<Option<Digest>>> {
    Ok(match expect {
        None => None,
        Some("none") => Some(None),
        Some(d) => Some(Some(
            Digest::parse(d).with_context(|| format!("invalid --expect digest {d:?}"))?,
        )),
    })
}

#[allow(clippy::print_stdout)]
pub fn run_push(args: PushArgs) -> anyhow::Result<()> {
    let reference = parse_reference(&args.reference)?;
    if reference.digest().is_some() {
        bail!("push creates a new version: give host/name or host/name:tag, not a digest");
    }
    let mut tags: Vec<Tag> = args
        .tags
        .iter()
        .map(|t| Tag::parse(t).with_context(|| format!("invalid tag {t:?}")))
        .collect::<Result<_, _>>()?;
    if let Some(t) = reference.tag() {
        tags.insert(0, t.clone());
    }
    let expect = parse_expect(args.expect.as_deref())?;
    if expect.is_some() && tags.is_empty() {
        bail!("--expect needs a tag to move (--tag)");
    }
    if !args.dir.is_dir() {
        bail!("{} is not a directory", args.dir.display());
    }
    let registry = args.registry.connect(reference.registry())?;
    let mut options = PushOptions::for_dir(&args.dir);
    options.rehash = args.rehash;
    options.uploads = args.uploads;
    // The first tag seals the version in the same request; the others follow.
    options.seal_tag = tags.first().map(|tag| SealTag {
        tag: tag.clone(),
        expect: expect.clone(),
    });
    let bars = Bars::new(
        "hashed",
        "uploaded",
        std::io::stderr().is_terminal() && !args.json,
    );
    block_on(async {
        let push::Pushed {
            layout,
            report,
            tag: sealed_tag,
        } = push::push(
            &registry,
            reference.repo(),
            &args.dir,
            &options,
            bars.clone(),
        )
        .await
        .with_context(|| format!("push of {} to {} failed", args.dir.display(), reference))?;
        bars.finish();
        let not_moved = |tag: &Tag| {
            format!(
                "version {} is sealed, but tag {tag} was not moved",
                layout.index.digest
            )
        };
        if let Some(first) = tags.first() {
            sealed_tag.with_context(|| not_moved(first))?;
        }
        for tag in tags.iter().skip(1) {
            push::tag_version(
                &registry,
                reference.repo(),
                &layout.index.digest,
                tag,
                expect.as_ref().map(Option::as_ref),
                None,
            )
            .await
            .with_context(|| not_moved(tag))?;
        }
        let pinned = reference.pinned(layout.index.digest.clone());
        if args.json {
            let mut v = serde_json::to_value(&report)?;
            v["reference"] = pinned.to_string().into();
            v["tags"] = tags
                .iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .into();
            print_json(&v)?;
        } else {
            // Only what happened: a first push has no unchanged files to speak of.
            let mut done = format!(
                "uploaded {} ({})",
                count(report.chunks_uploaded, "chunk"),
                human_bytes(report.bytes_uploaded)
            );
            if report.chunks_reused > 0 {
                done.push_str(&format!(
                    ", {} already in the registry",
                    report.chunks_reused
                ));
            }
            if report.files_unchanged > 0 {
                done.push_str(&format!(
                    ", {} unchanged since the last push",
                    count(report.files_unchanged, "file")
                ));
            }
            eprintln!(
                "sealed {}, {} in {}: {done}; {:.1}s",
                count(report.files, "file"),
                human_bytes(report.bytes),
                count(report.chunks, "chunk"),
                report.seconds
            );
            for tag in &tags {
                eprintln!("tagged {}", reference.with_tag(tag.clone()));
            }
            println!("{pinned}");
        }
        Ok(())
    })
}

#[allow(clippy::print_stdout)]
pub fn run_pull(args: PullArgs) -> anyhow::Result<()> {
    let reference = parse_reference(&args.reference)?;
    let registry = args.registry.connect(reference.registry())?;
    let bars = Bars::new(
        "verified",
        "downloaded",
        std::io::stderr().is_terminal() && !args.json,
    );
    let options = PullOptions {
        runs: args.downloads,
        fsync: args.fsync,
        seeds: Vec::new(),
    };
    if args.follow {
        let follow = crate::follow::PullFollow {
            reference,
            dir: args.dir,
            keep: args.keep as usize,
            exec: args.exec,
            json: args.json,
            options,
        };
        return block_on(crate::follow::pull_follow(registry, follow));
    }
    block_on(async {
        let report = pull::pull(
            &registry,
            reference.repo(),
            &reference.target(),
            &args.dir,
            &options,
            bars.clone(),
        )
        .await
        .with_context(|| format!("pull of {reference} into {} failed", args.dir.display()))?;
        bars.finish();
        let pinned = reference.pinned(Digest::parse(&report.digest)?);
        if args.json {
            let mut v = serde_json::to_value(&report)?;
            v["reference"] = pinned.to_string().into();
            print_json(&v)?;
        } else {
            eprintln!(
                "pulled {}, {}: downloaded {} ({}), {} already on disk; {:.1}s",
                count(report.files, "file"),
                human_bytes(report.bytes),
                human_bytes(report.bytes_downloaded),
                count(report.chunks_downloaded, "chunk"),
                human_bytes(report.bytes_already_present),
                report.seconds
            );
            println!("{pinned}");
        }
        Ok(())
    })
}
