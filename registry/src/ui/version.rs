//! One version (its files, what it shares with the version before it, its referrers; for an image
//! or artifact, its manifest and layers), and the comparison of two versions down to the tensors.

use std::collections::HashSet;

use maud::{html, Markup};
use vial_core::volume::diff::{diff_trees, file_chunks, tensor_changes, TensorChange};
use vial_core::volume::{EntryKind, Tree, VOLUME_ARTIFACT_TYPE};
use vial_core::{Digest, RepoName};

use super::data::{self, Opened};
use super::layout::{self, bytes, copyable, repo_url, short, time};
use super::request::{query_param, visible, Viewer};
use crate::error::{ApiError, ErrorCode};
use crate::service::Service;

/// Entries of a tree shown on a version's page.
const ENTRIES_SHOWN: usize = 2000;
/// Tensors listed per changed file in a comparison.
const TENSORS_SHOWN: usize = 500;
/// The largest manifest shown as JSON.
const MANIFEST_SHOWN: usize = 256 << 10;

/// Distinct chunk digests of a tree.
fn chunk_set(tree: &Tree) -> HashSet<&Digest> {
    tree.chunks.iter().map(|c| &c.digest).collect()
}

/// `/ui/r/<name>/-/v/<digest>`.
pub(super) async fn version(
    state: &Service,
    viewer: &Viewer,
    repo: &RepoName,
    digest: &Digest,
) -> Result<Markup, ApiError> {
    visible(viewer, repo)?;
    let opened = data::open(state, repo, digest).await?;
    let tags = state.tags().manifest_tags(repo, digest).await?;
    let referrers = state.manifests().referrers(repo, digest, None).await?;
    let pinned = format!("{}/{repo}@{digest}", viewer.host);
    let head = html! {
        h1 { a href=(repo_url(repo, "")) { (repo) } " @ " span.mono { (short(digest.as_str())) } }
        p { (copyable("pinned", &pinned)) }
        @if !tags.is_empty() {
            p { "Tags: " @for t in &tags { a.tag href=(repo_url(repo, &format!("tags/{t}"))) { (t) } } }
        }
    };
    let referrers_html = html! {
        h2 { "Referrers" }
        @if referrers.is_empty() { p.muted { "Nothing refers to this manifest (no seals, signatures or attestations)." } }
        @else {
            div.scroll { table {
                tr { th { "Artifact type" } th { "Digest" } th.num { "Size" } }
                @for r in &referrers {
                    tr {
                        td { (r.artifact_type.as_deref().unwrap_or(&r.media_type)) }
                        td { a.mono href=(repo_url(repo, &format!("v/{}", r.digest))) { (short(r.digest.as_str())) } }
                        td.num { (bytes(r.size)) }
                    }
                }
            } }
        }
    };
    let body = match opened {
        Opened::Volume { tree, .. } => {
            let before = state
                .manifests()
                .version_before(repo, VOLUME_ARTIFACT_TYPE, digest)
                .await?;
            let created = before.as_ref().map(|(at, _)| *at);
            let previous = before.and_then(|(_, previous)| previous);
            let shared = match &previous {
                Some(p) => match data::open(state, repo, p).await? {
                    Opened::Volume { tree: old, .. } => {
                        let have = chunk_set(&old);
                        let mut seen = HashSet::new();
                        Some(
                            tree.chunks
                                .iter()
                                .filter(|c| have.contains(&c.digest) && seen.insert(&c.digest))
                                .map(|c| c.size)
                                .sum::<u64>(),
                        )
                    }
                    Opened::Large(_) | Opened::Other(_) => None,
                },
                None => None,
            };
            let stored: u64 = tree.chunks.iter().map(|c| c.size).sum();
            html! {
                (head)
                div.panel.stats {
                    div { "Files" b { (tree.file_count()) } }
                    div { "Size" b { (bytes(tree.total_bytes())) } }
                    div { "Chunks" b { (tree.chunks.len()) } }
                    div { "Distinct chunk bytes" b { (bytes(stored)) } }
                    @if let Some(at) = created { div { "Created" b { (time(at)) } } }
                    @if let (Some(shared), Some(p)) = (shared, &previous) {
                        div {
                            "Shared with the version before"
                            b { (bytes(shared)) " (" (format!("{:.0}", 100.0 * shared as f64 / stored.max(1) as f64)) "%)" }
                            a href={(repo_url(repo, "compare")) "?a=" (p) "&b=" (digest)} { "what changed" }
                        }
                    }
                }
                h2 { "Files" }
                div.scroll { table {
                    tr { th { "Path" } th.num { "Size" } th.num { "Chunks" } }
                    @for e in tree.entries.iter().take(ENTRIES_SHOWN) {
                        tr {
                            @match &e.kind {
                                EntryKind::File { size, chunks, .. } => {
                                    td.mono { (e.path) }
                                    td.num { (bytes(*size)) }
                                    td.num { (chunks.len()) }
                                }
                                EntryKind::Dir { .. } => { td.mono { (e.path) "/" } td {} td {} }
                                EntryKind::Symlink { target } => { td.mono { (e.path) " → " (target) } td {} td {} }
                            }
                        }
                    }
                } }
                @if tree.entries.len() > ENTRIES_SHOWN {
                    p.muted { "… and " (tree.entries.len() - ENTRIES_SHOWN) " more entries (" code { "vial inspect" } " lists them all)." }
                }
                (referrers_html)
            }
        }
        Opened::Large(large) => {
            let unknown = || "?".to_owned();
            html! {
                (head)
                div.panel.stats {
                    div { "Files" b { (large.files.map_or_else(unknown, |f| f.to_string())) } }
                    div { "Size" b { (large.bytes.map_or_else(unknown, bytes)) } }
                    div { "Chunks" b { (large.chunks.map_or_else(unknown, |c| c.to_string())) } }
                    div { "Tree" b { (bytes(large.tree_bytes)) } }
                }
                p.muted {
                    "The figures are what the version's index says. Its tree is larger than this registry reads to list files ("
                    code { "--ui-max-tree" } "); " code { (format!("vial inspect {pinned}")) } " lists them all."
                }
                (referrers_html)
            }
        }
        Opened::Other(manifest) => {
            let parsed: serde_json::Value =
                serde_json::from_slice(&manifest.content).unwrap_or_default();
            let listed = parsed
                .get("layers")
                .or_else(|| parsed.get("manifests"))
                .and_then(|l| l.as_array())
                .cloned()
                .unwrap_or_default();
            let text = serde_json::to_string_pretty(&parsed).unwrap_or_default();
            html! {
                (head)
                div.panel.stats {
                    div { "Media type" b.mono { (manifest.media_type) } }
                    @if let Some(t) = parsed.get("artifactType").and_then(|t| t.as_str()) { div { "Artifact type" b.mono { (t) } } }
                    div { "Manifest size" b { (bytes(manifest.content.len() as u64)) } }
                }
                h2 { @if parsed.get("manifests").is_some() { "Manifests" } @else { "Layers" } }
                div.scroll { table {
                    tr { th { "Media type" } th { "Digest" } th.num { "Size" } th { "Title" } }
                    @for l in &listed {
                        @let d = l.get("digest").and_then(|d| d.as_str()).unwrap_or("");
                        tr {
                            td.mono { (l.get("mediaType").and_then(|m| m.as_str()).unwrap_or("")) }
                            td.mono { (short(d)) }
                            td.num { (l.get("size").and_then(|s| s.as_u64()).map(bytes).unwrap_or_default()) }
                            td { (l.pointer("/annotations/org.opencontainers.image.title").and_then(|t| t.as_str()).unwrap_or("")) }
                        }
                    }
                } }
                (referrers_html)
                h2 { "Manifest" }
                @if text.len() <= MANIFEST_SHOWN { pre { (text) } } @else { p.muted { "Too large to show." } }
            }
        }
    };
    Ok(layout::page(
        &format!("{repo}@{}", short(digest.as_str())),
        viewer,
        None,
        body,
    ))
}

/// The comparison page of two versions one of which has a tree larger than the UI reads.
fn too_large_to_compare(viewer: &Viewer, repo: &RepoName, a: &Digest, b: &Digest) -> Markup {
    let pinned = |d: &Digest| format!("{}/{repo}@{d}", viewer.host);
    let body = html! {
        h1 { a href=(repo_url(repo, "")) { (repo) } ": compare" }
        p {
            "One of these versions has a tree larger than this registry reads to compare files ("
            code { "--ui-max-tree" } "). Compare them with:"
        }
        pre { (format!("vial diff {} {}", pinned(a), pinned(b))) }
    };
    layout::page(&format!("{repo}: compare"), viewer, None, body)
}

/// `/ui/r/<name>/-/compare?a=<older>&b=<newer>`.
pub(super) async fn compare(
    state: &Service,
    viewer: &Viewer,
    repo: &RepoName,
    query: &str,
) -> Result<Markup, ApiError> {
    visible(viewer, repo)?;
    let digest = |k: &str| {
        query_param(query, k)
            .and_then(|d| Digest::parse(&d).ok())
            .ok_or_else(|| {
                ApiError::bad_request(
                    ErrorCode::DigestInvalid,
                    format!("Say which versions to compare: ?a=<digest>&b=<digest> ({k} is missing or not a digest)."),
                )
            })
    };
    let (a, b) = (digest("a")?, digest("b")?);
    let not_volume = |d: &Digest| {
        ApiError::bad_request(
            ErrorCode::Unsupported,
            format!("{d} is not a volume: only volumes are compared"),
        )
    };
    let (old, new) = match (
        data::open(state, repo, &a).await?,
        data::open(state, repo, &b).await?,
    ) {
        (Opened::Volume { tree: old }, Opened::Volume { tree: new }) => (old, new),
        (Opened::Other(_), _) => return Err(not_volume(&a)),
        (_, Opened::Other(_)) => return Err(not_volume(&b)),
        _ => return Ok(too_large_to_compare(viewer, repo, &a, &b)),
    };
    let d = diff_trees(&old, &new);
    let size_of = |tree: &Tree, path: &str| match tree.entry(path).map(|e| &e.kind) {
        Some(EntryKind::File { size, .. }) => Some(*size),
        _ => None,
    };
    // Which tensors changed, for each changed file both sides parse as safetensors.
    let mut tensors = Vec::new();
    for path in &d.changed {
        let (Some(old_size), Some(new_size)) = (size_of(&old, path), size_of(&new, path)) else {
            continue;
        };
        let before = data::tensors(state, repo, &old, path, old_size).await?;
        let after = data::tensors(state, repo, &new, path, new_size).await?;
        if let (Some(before), Some(after)) = (before, after) {
            let changes = tensor_changes(
                &before,
                &file_chunks(&old, path).unwrap_or_default(),
                &after,
                &file_chunks(&new, path).unwrap_or_default(),
            );
            tensors.push((path.clone(), after.len(), changes));
        }
    }
    let link = |x: &Digest| html! { a.mono href=(repo_url(repo, &format!("v/{x}"))) { (short(x.as_str())) } };
    let body = html! {
        h1 { a href=(repo_url(repo, "")) { (repo) } ": " (link(&a)) " → " (link(&b)) }
        div.panel.stats {
            div { "Added" b.added { (d.added.len()) } }
            div { "Removed" b.removed { (d.removed.len()) } }
            div { "Changed" b.changed { (d.changed.len()) } }
            div { "Bytes to fetch (new chunks)" b { (bytes(d.bytes_to_fetch)) } }
            div { "New chunks" b { (d.chunks_to_fetch) } }
        }
        @if d.added.is_empty() && d.removed.is_empty() && d.changed.is_empty() {
            p { "The two versions hold the same files." }
        }
        div.scroll { table {
            @for p in &d.added { tr { td.added { "+" } td.mono { (p) } } }
            @for p in &d.removed { tr { td.removed { "−" } td.mono { (p) } } }
            @for p in &d.changed { tr { td.changed { "M" } td.mono { (p) } } }
        } }
        @for (path, count, changes) in &tensors {
            h2.mono { (path) }
            p.muted { (changes.len()) " of " (count) " tensors differ (a tensor is unchanged when its chunks are)." }
            div.scroll { table {
                tr { th { "" } th { "Tensor" } th.num { "Bytes" } }
                @for c in changes.iter().take(TENSORS_SHOWN) {
                    @let (class, mark) = match c.change {
                        TensorChange::Added => ("added", "+"),
                        TensorChange::Removed => ("removed", "−"),
                        TensorChange::Changed => ("changed", "M"),
                    };
                    tr { td class=(class) { (mark) } td.mono { (c.name) } td.num { (bytes(c.bytes)) } }
                }
            } }
            @if changes.len() > TENSORS_SHOWN { p.muted { "… and " (changes.len() - TENSORS_SHOWN) " more." } }
        }
    };
    Ok(layout::page(
        &format!("{repo}: compare"),
        viewer,
        None,
        body,
    ))
}
