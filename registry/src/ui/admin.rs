//! Sync, seal and garbage collection jobs with their progress, and what storage holds against what versions reference.

use maud::{html, Markup};
use vial_core::volume::VOLUME_ARTIFACT_TYPE;
use vial_core::RepoName;

use super::layout::{self, bytes, repo_url, short, time};
use super::request::Viewer;
use crate::error::ApiError;
use crate::seal::SEAL_JOB;
use crate::service::gc::GC_JOB;
use crate::service::Service;
use crate::storage::{Job, JobState};
use crate::sync::SYNC_JOB;

/// Jobs listed on the jobs page, and per repository.
const JOBS_SHOWN: u32 = 100;
/// How often a page with a job in progress reloads itself.
const REFRESH_SECONDS: u32 = 2;

/// How far a job has come, from its progress record: `files-done/files-total, bytes`.
fn progress(job: &Job) -> String {
    let Some(p) = job
        .progress
        .as_deref()
        .and_then(|p| serde_json::from_str::<serde_json::Value>(p).ok())
    else {
        return String::new();
    };
    let n = |k: &str| p.get(k).and_then(|v| v.as_u64());
    if job.kind == GC_JOB {
        return gc_summary(&p);
    }
    match (
        n("files-done"),
        n("files-total"),
        n("bytes-done"),
        n("bytes-total"),
    ) {
        (Some(fd), Some(ft), Some(bd), Some(bt)) => format!(
            "{fd}/{ft} files, {} of {}{}",
            bytes(bd),
            bytes(bt),
            if bt > 0 {
                format!(" ({:.0}%)", 100.0 * bd as f64 / bt as f64)
            } else {
                String::new()
            }
        ),
        _ => String::new(),
    }
}

/// What a garbage collection pass reclaimed, from its report (or its progress so far).
fn gc_summary(report: &serde_json::Value) -> String {
    let n = |k: &str| report.get(k).and_then(|v| v.as_u64()).unwrap_or(0);
    format!(
        "{} blobs and {} packs, {}; {} candidates looked at",
        n("blobs"),
        n("packs"),
        bytes(n("bytes")),
        n("examined")
    )
}

fn state_class(state: JobState) -> &'static str {
    match state {
        JobState::Done => "added",
        JobState::Failed => "removed",
        _ => "changed",
    }
}

fn jobs_table(jobs: &[Job], with_repository: bool) -> Markup {
    html! {
        div.scroll { table {
            tr {
                th { "Kind" } @if with_repository { th { "Repository" } } th { "What" } th { "State" }
                th { "Progress" } th.wide { "Updated" } th { "Result" }
            }
            @for j in jobs {
                tr {
                    td { (j.kind) }
                    @if with_repository { td { @match &j.repository {
                        Some(r) => a href=(repo_url(r, "")) { (r) },
                        None => span.muted { "every repository" },
                    } } }
                    td.mono { (if j.kind == SEAL_JOB { short(&j.target) } else { j.target.clone() }) }
                    td class=(state_class(j.state)) { (j.state.as_str()) }
                    td { (progress(j)) }
                    td.wide { (time(j.updated_at)) }
                    td {
                        @match (&j.result, &j.repository) {
                            (Some(r), _) if j.kind == GC_JOB => {
                                (serde_json::from_str(r).map(|v| gc_summary(&v)).unwrap_or_default())
                            }
                            (Some(r), Some(repo)) => a.mono href=(repo_url(repo, &format!("v/{r}"))) { (short(r)) },
                            _ => {}
                        }
                        @if let Some(e) = &j.error { span.error { (e) } }
                    }
                }
            }
        } }
    }
}

fn running(jobs: &[Job]) -> bool {
    jobs.iter()
        .any(|j| matches!(j.state, JobState::Queued | JobState::Running))
}

/// The jobs of one repository, for its page.
pub(super) async fn repository_jobs(state: &Service, repo: &RepoName) -> Result<Markup, ApiError> {
    let mut jobs = state
        .job_rows()
        .list_jobs(SYNC_JOB, repo, JOBS_SHOWN)
        .await?;
    jobs.extend(
        state
            .job_rows()
            .list_jobs(SEAL_JOB, repo, JOBS_SHOWN)
            .await?,
    );
    jobs.sort_by_key(|j| std::cmp::Reverse(j.updated_at));
    Ok(html! {
        @if !jobs.is_empty() {
            h2 { "Jobs" }
            (jobs_table(&jobs, false))
            @if running(&jobs) { p.muted { "In progress: " a href="/ui/jobs" { "follow it live" } "." } }
        }
    })
}

/// `/ui/jobs`: recent jobs of the repositories the viewer may see (and garbage collection passes,
/// to those who see everything); the page reloads itself while one is in progress.
pub(super) async fn jobs(state: &Service, viewer: &Viewer) -> Result<Markup, ApiError> {
    let jobs: Vec<Job> = state
        .job_rows()
        .recent_jobs(JOBS_SHOWN * 4)
        .await?
        .into_iter()
        .filter(|j| match &j.repository {
            Some(repo) => viewer.may_pull(repo.as_str()),
            None => viewer.sees_everything(),
        })
        .take(JOBS_SHOWN as usize)
        .collect();
    let live = running(&jobs);
    let body = html! {
        h1 { "Jobs" }
        @if jobs.is_empty() { p.muted { "No sync, seal or garbage collection jobs to show." } }
        @else {
            @if live { p.muted { "Jobs are running: this page refreshes every " (REFRESH_SECONDS) " s." } }
            (jobs_table(&jobs, true))
        }
    };
    Ok(layout::page(
        "Jobs",
        viewer,
        live.then_some(REFRESH_SECONDS),
        body,
    ))
}

/// `/ui/storage`: distinct bytes stored against the bytes every live version's files add up to,
/// and the garbage collector's last pass. Registry-wide figures: shown only to a viewer who may
/// pull from every repository.
pub(super) async fn storage(state: &Service, viewer: &Viewer) -> Result<Markup, ApiError> {
    if !viewer.sees_everything() {
        let body = html! {
            h1 { "Storage" }
            p.muted { "Registry-wide figures are shown to those who may pull from every repository." }
        };
        return Ok(layout::page("Storage", viewer, None, body));
    }
    let (blob_count, stored) = state.blob_rows().stored_totals().await?;
    let packs = state.pack_state().await?;
    let (in_packs, dead_in_packs) = (packs.bytes, packs.dead);
    let compactable = packs.compactable;
    let live = state
        .manifests()
        .version_totals(None, VOLUME_ARTIFACT_TYPE)
        .await?;
    let (versions, referenced) = (live.versions, live.bytes);
    let last_gc = state.gc_metrics.last();
    let body = html! {
        h1 { "Storage" }
        div.panel.stats {
            div { "Distinct blob bytes stored" b { (bytes(stored)) } }
            div { "Blobs" b { (blob_count) } }
            div { "Files of every live version" b { (bytes(referenced)) } }
            div { "Live versions" b { (versions) } }
            div { "Dedup ratio" b { @if stored > 0 { (format!("{:.2}×", referenced as f64 / stored as f64)) } @else { "–" } } }
        }
        p.muted {
            "Blobs are counted once however many versions and repositories use them. Deleted "
            "versions still restorable keep their blobs until their window passes; garbage "
            "collection then reclaims what nothing references."
        }
        h2 { "Packs" }
        div.panel.stats {
            div { "Bytes in packs" b { (bytes(in_packs)) } }
            div { "Dead bytes in packs" b { (bytes(dead_in_packs)) } }
            div { "Dead share" b { @if in_packs > 0 { (format!("{:.1}%", dead_in_packs as f64 * 100.0 / in_packs as f64)) } @else { "–" } } }
            div { "Packs to compact" b { (compactable.packs) } }
            div { "Compaction rewrites" b { (bytes(compactable.live)) } }
            div { "Compaction frees" b { (bytes(compactable.dead)) } }
        }
        p.muted {
            "A push stores its new chunks together in packs. Chunks collected beside live ones "
            "stay on disk as dead bytes until the pack's dead share reaches "
            (format!("{:.0}%", state.config.gc_compact_threshold * 100.0))
            "; then a pass rewrites its live chunks into a new pack and the old one goes. "
            "vial gc --dry-run shows what the next pass does."
        }
        h2 { "Garbage collection" }
        @match last_gc {
            Some((at, report)) => {
                div.panel.stats {
                    div { "Last pass" b { (time(at)) } }
                    div { "Blobs reclaimed" b { (report.blobs) } }
                    div { "Bytes reclaimed" b { (bytes(report.bytes)) } }
                    div { "Versions purged" b { (report.manifests_purged) } }
                    div { "Packs compacted" b { (report.packs_compacted) } }
                    div { "Bytes rewritten" b { (bytes(report.rewritten_bytes)) } }
                    div { "Took" b { (format!("{:.2} s", report.seconds)) } }
                }
            }
            None => p.muted { "No pass has run since this server started (every " (humantime::format_duration(state.config.gc_interval)) ")." },
        }
    };
    Ok(layout::page("Storage", viewer, None, body))
}
