//! The volumes a visitor may see (by namespace, with search), one repository's versions and tags,
//! and a tag's history.

use std::collections::{BTreeMap, HashMap};

use maud::{html, Markup};
use vial_core::volume::{ANNOTATION_BYTES, ANNOTATION_FILES, VOLUME_ARTIFACT_TYPE};
use vial_core::{RepoName, Tag};

use super::layout::{self, bytes, copyable, repo_url, short, time};
use super::request::{page_number, query_param, visible, Viewer};
use crate::error::{ApiError, ErrorCode};
use crate::service::Service;
use crate::storage::Window;

/// Repositories on one page of the home page.
const REPOS_PER_PAGE: usize = 100;
/// Versions on one page of a repository.
const VERSIONS_PER_PAGE: usize = 50;
/// The newest versions the compare form offers.
const COMPARE_CHOICES: Window = Window {
    offset: 0,
    limit: 500,
};
/// The most recently deleted versions listed.
const DELETED_SHOWN: Window = Window {
    offset: 0,
    limit: 200,
};
/// Tags listed on a repository's page.
const TAGS_SHOWN: u32 = 200;

/// Every repository name `viewer` may see, in order, matching `q` if given.
async fn visible_repositories(
    state: &Service,
    viewer: &Viewer,
    q: Option<&str>,
) -> Result<Vec<String>, ApiError> {
    let mut out = Vec::new();
    let mut last: Option<String> = None;
    loop {
        let page = state
            .manifests()
            .list_repositories(last.as_deref(), 1000)
            .await?;
        last = page.items.last().cloned();
        out.extend(
            page.items
                .into_iter()
                .filter(|name| q.is_none_or(|q| name.contains(q)) && viewer.may_pull(name)),
        );
        if !page.more {
            return Ok(out);
        }
    }
}

/// `/ui/`: namespaces and their repositories.
pub(super) async fn home(
    state: &Service,
    viewer: &Viewer,
    query: &str,
) -> Result<Markup, ApiError> {
    let q = query_param(query, "q").filter(|q| !q.trim().is_empty());
    let page = page_number(query);
    let names = visible_repositories(state, viewer, q.as_deref()).await?;
    let shown: Vec<&String> = names
        .iter()
        .skip(page * REPOS_PER_PAGE)
        .take(REPOS_PER_PAGE)
        .collect();
    let mut by_namespace: BTreeMap<&str, Vec<(&str, u64)>> = BTreeMap::new();
    for name in &shown {
        let versions = match RepoName::parse(name) {
            Ok(repo) => {
                state
                    .manifests()
                    .version_totals(Some(&repo), VOLUME_ARTIFACT_TYPE)
                    .await?
                    .versions
            }
            Err(_) => 0,
        };
        let namespace = name.split_once('/').map_or("", |(ns, _)| ns);
        by_namespace
            .entry(namespace)
            .or_default()
            .push((name.as_str(), versions));
    }
    let more = names.len() > (page + 1) * REPOS_PER_PAGE;
    let base = match &q {
        Some(q) => format!(
            "/ui/?q={}",
            form_urlencoded::byte_serialize(q.as_bytes()).collect::<String>()
        ),
        None => "/ui/".to_owned(),
    };
    let body = html! {
        h1 { "Volumes" }
        form.inline method="get" action="/ui/" {
            input type="search" name="q" placeholder="Search repositories" value=[q.as_deref()];
            button type="submit" { "Search" }
        }
        @if names.is_empty() {
            p.muted { @if q.is_some() { "No repository matches." } @else { "Nothing to show yet: push a volume with " code { "vial push" } "." } }
        }
        @for (namespace, repos) in &by_namespace {
            h2 { @if namespace.is_empty() { "(no namespace)" } @else { (namespace) } }
            div.scroll { table {
                tr { th { "Repository" } th.num { "Versions" } }
                @for (name, versions) in repos {
                    tr {
                        td { a href={"/ui/r/" (name)} { (name) } }
                        td.num { @if *versions > 0 { (versions) } @else { span.muted { "images, artifacts" } } }
                    }
                }
            } }
        }
        (layout::pager(&base, page, more))
    };
    Ok(layout::page("Volumes", viewer, None, body))
}

/// Where each digest was first pushed under one of `tags`, and by whom: from the tag histories.
async fn pushers(
    state: &Service,
    repo: &RepoName,
    tags: &[String],
) -> Result<HashMap<String, String>, ApiError> {
    let mut by: HashMap<String, String> = HashMap::new();
    for tag in tags {
        let Ok(tag) = Tag::parse(tag) else { continue };
        for event in state
            .tags()
            .tag_history(repo, &tag)
            .await?
            .unwrap_or_default()
        {
            if let (Some(to), Some(actor)) = (&event.to, &event.actor) {
                by.entry(to.to_string()).or_insert_with(|| actor.clone());
            }
        }
    }
    Ok(by)
}

/// `/ui/r/<name>`: a repository's versions (for a volume), tags, and a way to compare versions.
pub(super) async fn repository(
    state: &Service,
    viewer: &Viewer,
    repo: &RepoName,
    query: &str,
) -> Result<Markup, ApiError> {
    visible(viewer, repo)?;
    let unknown = || ApiError::not_found(ErrorCode::NameUnknown, "unknown repository");
    let page = page_number(query);
    let window = Window {
        offset: (page * VERSIONS_PER_PAGE) as u64,
        limit: VERSIONS_PER_PAGE as u32,
    };
    let shown = state
        .manifests()
        .list_versions(repo, VOLUME_ARTIFACT_TYPE, false, window)
        .await?
        .ok_or_else(unknown)?;
    let total = state
        .manifests()
        .version_totals(Some(repo), VOLUME_ARTIFACT_TYPE)
        .await?
        .versions as usize;
    // The compare form offers the newest versions; any other pair is a URL away.
    let choices = match page {
        0 if total <= VERSIONS_PER_PAGE => shown.clone(),
        _ => state
            .manifests()
            .list_versions(repo, VOLUME_ARTIFACT_TYPE, false, COMPARE_CHOICES)
            .await?
            .unwrap_or_default(),
    };
    let deleted = state
        .manifests()
        .list_versions(repo, VOLUME_ARTIFACT_TYPE, true, DELETED_SHOWN)
        .await?
        .unwrap_or_default();
    let tags = state
        .tags()
        .list_tags(repo, None, TAGS_SHOWN)
        .await?
        .map(|p| p.items)
        .unwrap_or_default();
    let mut tag_targets = Vec::new();
    for t in &tags {
        if let Ok(tag) = Tag::parse(t) {
            if let Some(d) = state.tags().tag_target(repo, &tag).await? {
                tag_targets.push((t.clone(), d));
            }
        }
    }
    let pushed_by = pushers(state, repo, &tags).await?;
    let retention = state.config.retention_for(repo.as_str()).as_millis() as i64;
    let now = crate::storage::now_millis();
    let deleted: Vec<_> = deleted
        .iter()
        .filter(|d| d.deleted_at.is_some_and(|at| at + retention > now))
        .collect();
    let host = &viewer.host;
    let body = html! {
        h1 { (repo) }
        p { "Pull or mount: " (copyable("ref", &format!("{host}/{repo}"))) }
        @if total > 0 {
            h2 { "Versions (" (total) ")" }
            div.scroll { table {
                tr {
                    th { "Version" } th.num { "Size" } th.num.wide { "Files" } th { "Tags" }
                    th.wide { "Created" } th.wide { "Pushed by" }
                }
                @for (i, v) in shown.iter().enumerate() {
                    @let annotation = |k: &str| v.annotations.as_ref().and_then(|a| a.get(k)).cloned();
                    @let digest = v.digest.to_string();
                    tr {
                        td {
                            a.mono href=(repo_url(repo, &format!("v/{digest}"))) { (short(&digest)) }
                            span hidden id={"pin" (i)} { (host) "/" (repo) "@" (digest) }
                            button.copy type="button" data-copy={"pin" (i)} title="Copy the pinned reference" { "copy" }
                        }
                        td.num { (annotation(ANNOTATION_BYTES).and_then(|b| b.parse().ok()).map(bytes).unwrap_or_default()) }
                        td.num.wide { (annotation(ANNOTATION_FILES).unwrap_or_default()) }
                        td { @for t in &v.tags { a.tag href=(repo_url(repo, &format!("tags/{t}"))) { (t) } } }
                        td.wide { (time(v.created_at)) }
                        td.wide { (pushed_by.get(&digest).map(String::as_str).unwrap_or("")) }
                    }
                }
            } }
            (layout::pager(&repo_url(repo, ""), page, total > (page + 1) * VERSIONS_PER_PAGE))
            @if total > 1 {
                h2 { "Compare two versions" }
                form.inline method="get" action=(repo_url(repo, "compare")) {
                    select name="a" aria-label="older version" {
                        @for (i, v) in choices.iter().enumerate() {
                            option value=(v.digest.to_string()) selected[i == 1] { (short(v.digest.as_str())) " " (v.tags.join(" ")) }
                        }
                    }
                    "→"
                    select name="b" aria-label="newer version" {
                        @for (i, v) in choices.iter().enumerate() {
                            option value=(v.digest.to_string()) selected[i == 0] { (short(v.digest.as_str())) " " (v.tags.join(" ")) }
                        }
                    }
                    button type="submit" { "Compare" }
                }
            }
        }
        @if !deleted.is_empty() {
            h2 { "Deleted versions" }
            div.scroll { table {
                tr { th { "Version" } th.wide { "Deleted" } th.wide { "By" } th { "Restorable until" } th { "Tags it had" } }
                @for d in &deleted {
                    tr {
                        td.mono { (short(d.digest.as_str())) }
                        td.wide { (d.deleted_at.map(time).unwrap_or_default()) }
                        td.wide { (d.deleted_by.as_deref().unwrap_or("")) }
                        td { (d.deleted_at.map(|at| time(at + retention)).unwrap_or_default()) }
                        td { @for t in &d.tags { span.tag { (t) } } }
                    }
                }
            } }
        }
        h2 { "Tags" }
        @if tag_targets.is_empty() { p.muted { "No tags." } }
        @else {
            div.scroll { table {
                tr { th { "Tag" } th { "Points at" } }
                @for (t, d) in &tag_targets {
                    tr {
                        td { a href=(repo_url(repo, &format!("tags/{t}"))) { (t) } }
                        td { a.mono href=(repo_url(repo, &format!("v/{d}"))) { (short(d.as_str())) } }
                    }
                }
            } }
        }
        (super::admin::repository_jobs(state, repo).await?)
    };
    Ok(layout::page(repo.as_str(), viewer, None, body))
}

/// `/ui/r/<name>/-/tags/<tag>`: every move of a tag.
pub(super) async fn tag_history(
    state: &Service,
    viewer: &Viewer,
    repo: &RepoName,
    tag: &Tag,
) -> Result<Markup, ApiError> {
    visible(viewer, repo)?;
    let events = state
        .tags()
        .tag_history(repo, tag)
        .await?
        .ok_or_else(|| ApiError::not_found(ErrorCode::NameUnknown, "unknown repository"))?;
    let link = |d: &Option<vial_core::Digest>| match d {
        Some(d) => {
            html! { a.mono href=(repo_url(repo, &format!("v/{d}"))) { (short(d.as_str())) } }
        }
        None => html! { span.muted { "(none)" } },
    };
    let body = html! {
        h1 { a href=(repo_url(repo, "")) { (repo) } ":" (tag) }
        @if events.is_empty() { p.muted { "This tag has never been set." } }
        @else {
            div.scroll { table {
                tr { th { "When" } th { "By" } th { "From" } th { "To" } th { "Why" } }
                @for e in events.iter().rev() {
                    tr {
                        td { (time(e.at)) }
                        td { (e.actor.as_deref().unwrap_or("")) }
                        td { (link(&e.from)) }
                        td { (link(&e.to)) }
                        td { (e.reason) }
                    }
                }
            } }
        }
    };
    Ok(layout::page(&format!("{repo}:{tag}"), viewer, None, body))
}
