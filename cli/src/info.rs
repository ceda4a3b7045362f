//! Read-only views: `vial versions`, `vial ls`, `vial inspect`, `vial diff`.

use std::io::Write;

use anyhow::{bail, Context};
use clap::Args;
use serde::Serialize;
use vial_client::volume;
use vial_core::volume::{EntryKind, Tree, ANNOTATION_BYTES, ANNOTATION_FILES};

use crate::common::{
    block_on, count, human_bytes, parse_reference, print_json, stdout, RegistryArgs,
};

#[derive(Debug, Args)]
pub struct VersionsArgs {
    /// The volume: host[:port]/name
    reference: String,
    /// List deleted versions that `vial restore` can still bring back, with the tags they had
    /// and until when.
    #[arg(long)]
    deleted: bool,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct LsArgs {
    /// A registry, or a namespace in it: host[:port][/namespace]
    location: String,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    /// The version: host[:port]/name:tag or host[:port]/name@sha256:…
    reference: String,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct DiffArgs {
    /// The version a node already holds.
    from: String,
    /// The version it moves to.
    to: String,
    /// Print the result as JSON, for scripts, instead of text.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[allow(clippy::print_stdout)]
pub fn run_versions(args: VersionsArgs) -> anyhow::Result<()> {
    let reference = parse_reference(&args.reference)?;
    let registry = args.registry.connect(reference.registry())?;
    block_on(async {
        let versions = match registry.versions(reference.repo(), args.deleted).await.with_context(|| format!("cannot list versions of {reference}"))? {
            Some(v) => v,
            None => bail!("{} does not have vial's versions extension; `vial tag ls` lists tagged versions on any registry", reference.registry()),
        };
        if args.json {
            return print_json(&versions);
        }
        if versions.is_empty() {
            eprintln!(
                "{}",
                if args.deleted {
                    format!("{reference} has no deleted versions that can still be restored")
                } else {
                    format!("{reference} has no versions")
                }
            );
            return Ok(());
        }
        if args.deleted {
            println!(
                "{:<71}  {:<20}  {:<20}  {:<12}  TAGS IT HAD",
                "DIGEST", "DELETED", "RESTORABLE UNTIL", "BY"
            );
            for v in &versions {
                println!(
                    "{:<71}  {:<20}  {:<20}  {:<12}  {}",
                    v.digest,
                    v.deleted_at.as_deref().unwrap_or(""),
                    v.restorable_until.as_deref().unwrap_or(""),
                    v.deleted_by.as_deref().unwrap_or("-"),
                    v.tags.join(",")
                );
            }
            return Ok(());
        }
        println!(
            "{:<71}  {:>10}  {:>6}  {:<20}  TAGS",
            "DIGEST", "SIZE", "FILES", "CREATED"
        );
        for v in &versions {
            let ann = |k: &str| {
                v.annotations
                    .as_ref()
                    .and_then(|a| a.get(k))
                    .cloned()
                    .unwrap_or_default()
            };
            let size = ann(ANNOTATION_BYTES)
                .parse::<u64>()
                .map(human_bytes)
                .unwrap_or_default();
            println!(
                "{:<71}  {:>10}  {:>6}  {:<20}  {}",
                v.digest,
                size,
                ann(ANNOTATION_FILES),
                v.created_at,
                v.tags.join(",")
            );
        }
        Ok(())
    })
}

#[allow(clippy::print_stdout)]
pub fn run_ls(args: LsArgs) -> anyhow::Result<()> {
    let (host, namespace) = args
        .location
        .split_once('/')
        .unwrap_or((&args.location, ""));
    let namespace = namespace.trim_end_matches('/');
    let registry = args.registry.connect(host)?;
    block_on(async {
        let repos = registry
            .catalog()
            .await
            .with_context(|| format!("cannot list volumes on {host}"))?;
        let prefix = if namespace.is_empty() {
            String::new()
        } else {
            format!("{namespace}/")
        };
        let names: Vec<String> = repos
            .into_iter()
            .filter(|r| r.starts_with(&prefix))
            .map(|r| format!("{host}/{r}"))
            .collect();
        if args.json {
            print_json(&names)
        } else {
            for n in &names {
                println!("{n}");
            }
            Ok(())
        }
    })
}

/// One entry of `vial inspect --json`, keys sorted.
#[derive(Serialize)]
struct FileRow<'a> {
    chunks: usize,
    path: &'a str,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    target: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'static str,
}

/// `vial inspect --json`, keys sorted.
#[derive(Serialize)]
struct Inspected<'a> {
    bytes: u64,
    chunking: serde_json::Value,
    chunks: usize,
    digest: &'a vial_core::Digest,
    entries: Vec<FileRow<'a>>,
    files: usize,
    reference: String,
}

/// `vial diff --json`, keys sorted (as `json!` gave them before), written without a copy of
/// the paths.
#[derive(Serialize)]
struct Diffed<'a> {
    diff: DiffRows<'a>,
    from: String,
    to: String,
}

#[derive(Serialize)]
struct DiffRows<'a> {
    added: &'a [String],
    bytes_to_fetch: u64,
    changed: &'a [String],
    chunks_to_fetch: usize,
    removed: &'a [String],
}

fn rows(tree: &Tree) -> Vec<FileRow<'_>> {
    tree.entries
        .iter()
        .map(|e| match &e.kind {
            EntryKind::File { size, chunks, .. } => FileRow {
                path: &e.path,
                kind: "file",
                size: *size,
                chunks: chunks.len(),
                target: None,
            },
            EntryKind::Dir { .. } => FileRow {
                path: &e.path,
                kind: "dir",
                size: 0,
                chunks: 0,
                target: None,
            },
            EntryKind::Symlink { target } => FileRow {
                path: &e.path,
                kind: "symlink",
                size: 0,
                chunks: 0,
                target: Some(target),
            },
        })
        .collect()
}

#[allow(clippy::print_stdout)]
pub fn run_inspect(args: InspectArgs) -> anyhow::Result<()> {
    let reference = parse_reference(&args.reference)?;
    let registry = args.registry.connect(reference.registry())?;
    block_on(async {
        let v = volume::open(&registry, reference.repo(), &reference.target())
            .await
            .with_context(|| format!("cannot open {reference}"))?;
        let pinned = reference.pinned(v.digest.clone());
        if args.json {
            // Keys in the order `json!` gave them before (sorted), so scripts see the same text.
            return print_json(&Inspected {
                bytes: v.tree.total_bytes(),
                chunking: serde_json::to_value(&v.tree.chunking)?,
                chunks: v.tree.chunks.len(),
                digest: &v.digest,
                entries: rows(&v.tree),
                files: v.tree.file_count(),
                reference: pinned.to_string(),
            });
        }
        let mut out = stdout();
        writeln!(out, "{pinned}")?;
        writeln!(
            out,
            "{}, {}, {} ({})",
            count(v.tree.file_count() as u64, "file"),
            human_bytes(v.tree.total_bytes()),
            count(v.tree.chunks.len() as u64, "unique chunk"),
            v.tree.chunking.algorithm
        )?;
        for r in rows(&v.tree) {
            match r.kind {
                "file" => writeln!(
                    out,
                    "{:>10}  {:>13}  {}",
                    human_bytes(r.size),
                    count(r.chunks as u64, "chunk"),
                    r.path
                )?,
                "dir" => writeln!(out, "{:>10}  {:>13}  {}/", "-", "", r.path)?,
                _ => writeln!(
                    out,
                    "{:>10}  {:>13}  {} -> {}",
                    "-",
                    "",
                    r.path,
                    r.target.unwrap_or("")
                )?,
            }
        }
        out.flush()?;
        Ok(())
    })
}

#[allow(clippy::print_stdout)]
pub fn run_diff(args: DiffArgs) -> anyhow::Result<()> {
    let a = parse_reference(&args.from)?;
    let b = parse_reference(&args.to)?;
    let registry_a = args.registry.connect(a.registry())?;
    let registry_b = args.registry.connect(b.registry())?;
    block_on(async {
        // Both at once: each is a few round trips and, for a large tree, a parse.
        let (ta, tb) = (a.target(), b.target());
        let (va, vb) = tokio::join!(
            volume::open(&registry_a, a.repo(), &ta),
            volume::open(&registry_b, b.repo(), &tb),
        );
        let va = va.with_context(|| format!("cannot open {a}"))?;
        let vb = vb.with_context(|| format!("cannot open {b}"))?;
        let d = vial_core::volume::diff::diff_trees(&va.tree, &vb.tree);
        if args.json {
            return print_json(&Diffed {
                diff: DiffRows {
                    added: &d.added,
                    bytes_to_fetch: d.bytes_to_fetch,
                    changed: &d.changed,
                    chunks_to_fetch: d.chunks_to_fetch,
                    removed: &d.removed,
                },
                from: a.pinned(va.digest.clone()).to_string(),
                to: b.pinned(vb.digest.clone()).to_string(),
            });
        }
        let mut out = stdout();
        for p in &d.added {
            writeln!(out, "+ {p}")?;
        }
        for p in &d.removed {
            writeln!(out, "- {p}")?;
        }
        for p in &d.changed {
            writeln!(out, "M {p}")?;
        }
        writeln!(
            out,
            "{} added, {} removed, {} changed; a node holding the first version fetches {} in {}",
            d.added.len(),
            d.removed.len(),
            d.changed.len(),
            human_bytes(d.bytes_to_fetch),
            count(d.chunks_to_fetch as u64, "chunk")
        )?;
        out.flush()?;
        Ok(())
    })
}
