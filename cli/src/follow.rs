//! `vial pull --follow`: keep a directory on the version a tag points at, switching the moment it
//! moves, and what both follow modes print per switch.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use vial_client::follow::{FollowDir, Switch, TagFollower};
use vial_client::progress::Silent;
use vial_client::pull::PullOptions;
use vial_client::Registry;
use vial_core::{Digest, Reference};

use crate::common::human_bytes;

/// What `vial pull --follow` was asked to do.
pub struct PullFollow {
    pub reference: Reference,
    pub dir: PathBuf,
    pub keep: usize,
    pub exec: Option<String>,
    pub json: bool,
    pub options: PullOptions,
}

/// The longest pause between attempts at a switch that keeps failing.
const RETRY_MAX: Duration = Duration::from_secs(30);

/// Prints one line about a follower's state on stdout (text for a person, or one JSON object per
/// line), and logs it where the log is elsewhere (a service's stdout and journal), so that the
/// log tells the story too; never twice into one terminal or file. A stdout nobody reads any more
/// (a background mount's) is not an error.
pub fn say(json: bool, value: serde_json::Value, text: &str) {
    use std::io::{IsTerminal, Write};
    if !std::io::stdout().is_terminal() && !stdout_is_stderr() {
        tracing::info!("{text}");
    }
    let mut out = std::io::stdout().lock();
    let _ = if json {
        writeln!(out, "{value}")
    } else {
        writeln!(out, "{text}")
    };
    let _ = out.flush();
}

/// Whether stdout and stderr (where the log goes) are one file or pipe: `>log 2>&1`.
fn stdout_is_stderr() -> bool {
    match (
        std::fs::read_link("/proc/self/fd/1"),
        std::fs::read_link("/proc/self/fd/2"),
    ) {
        (Ok(out), Ok(err)) => out == err,
        _ => false,
    }
}

/// The line printed for a switch.
pub fn say_switch(json: bool, reference: &Reference, switch: &Switch) {
    let pinned = Digest::parse(&switch.digest)
        .map(|d| reference.pinned(d).to_string())
        .unwrap_or_else(|_| switch.digest.clone());
    let mut value = serde_json::to_value(switch).unwrap_or_default();
    value["event"] = "switch".into();
    value["reference"] = pinned.clone().into();
    let text = if switch.was_kept {
        format!(
            "switched to {pinned} (kept on disk: nothing fetched; {:.2} s)",
            switch.seconds
        )
    } else {
        format!(
            "switched to {pinned} (fetched {}, reused {}; {:.2} s)",
            human_bytes(switch.bytes_fetched),
            human_bytes(switch.bytes_reused),
            switch.seconds
        )
    };
    say(json, value, &text);
}

/// The line printed when the tag is gone.
pub fn say_removed(json: bool, reference: &Reference, current: Option<&Digest>) {
    let keeping = current.map(Digest::to_string);
    let text = match &keeping {
        Some(d) => format!("{reference} no longer exists; keeping {d} until the tag comes back"),
        None => format!("{reference} does not exist yet; waiting for it"),
    };
    say(
        json,
        serde_json::json!({ "event": "tag-removed", "reference": reference.to_string(), "current": keeping }),
        &text,
    );
}

/// Runs until SIGTERM or Ctrl-C.
pub async fn pull_follow(registry: Registry, args: PullFollow) -> anyhow::Result<()> {
    let Some(tag) = args.reference.tag().cloned() else {
        bail!("--follow follows a tag: give host/name:tag, not a digest");
    };
    let dir = FollowDir::open(&args.dir)?;
    let repo = args.reference.repo().clone();
    let mut follower = TagFollower::new(registry.clone(), repo.clone(), tag);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot listen for SIGTERM")?;
    let mut first = true;
    // The version to switch to, once the tag has been seen to point at one we are not on.
    let mut pending: Option<(Digest, Instant)> = None;
    let mut delay = Duration::from_millis(500);
    loop {
        if let Some((digest, seen)) = pending.clone() {
            let switched = tokio::select! {
                r = dir.switch_to(&registry, &repo, &digest, &args.options, Arc::new(Silent), seen) => r,
                _ = tokio::signal::ctrl_c() => return stopped(&dir),
                _ = term.recv() => return stopped(&dir),
            };
            match switched {
                Ok(switch) => {
                    delay = Duration::from_millis(500);
                    say_switch(args.json, &args.reference, &switch);
                    if let Some(cmd) = &args.exec {
                        run_exec(cmd, &args.reference, &switch, &args.dir).await;
                    }
                    for gone in dir.prune(args.keep) {
                        tracing::info!(digest = %gone, "removed a version beyond --keep");
                    }
                }
                Err(e) if first && !e.is_transient() => {
                    return Err(anyhow::anyhow!(vial_core::error_chain(&e)))
                        .with_context(|| format!("cannot pull {}", args.reference));
                }
                Err(e) => {
                    tracing::warn!(%digest, error = %vial_core::error_chain(&e), retry_in = ?delay, "switch failed; trying again");
                    // Try again after a pause, or sooner if the tag moves meanwhile.
                    tokio::select! {
                        () = tokio::time::sleep(delay) => {}
                        moved = follower.next() => pending = next_pending(&dir, moved?, &args),
                        _ = tokio::signal::ctrl_c() => return stopped(&dir),
                        _ = term.recv() => return stopped(&dir),
                    }
                    delay = (delay * 2).min(RETRY_MAX);
                    continue;
                }
            }
            first = false;
        }
        let moved = tokio::select! {
            m = follower.next() => m,
            _ = tokio::signal::ctrl_c() => return stopped(&dir),
            _ = term.recv() => return stopped(&dir),
        };
        let state = match moved {
            Ok(state) => state,
            Err(e) => {
                return Err(anyhow::anyhow!(vial_core::error_chain(&e)))
                    .with_context(|| format!("cannot follow {}", args.reference))
            }
        };
        if first
            && state
                .as_ref()
                .is_some_and(|d| Some(d) == dir.current().as_ref())
        {
            say(
                args.json,
                serde_json::json!({ "event": "current", "digest": dir.current().map(|d| d.to_string()) }),
                &format!(
                    "{} is current; following {}",
                    dir_display(&args.dir),
                    args.reference
                ),
            );
            first = false;
        }
        pending = next_pending(&dir, state, &args);
    }
}

/// What to switch to after the tag was seen at `state`.
fn next_pending(
    dir: &FollowDir,
    state: Option<Digest>,
    args: &PullFollow,
) -> Option<(Digest, Instant)> {
    match state {
        None => {
            say_removed(args.json, &args.reference, dir.current().as_ref());
            None
        }
        Some(d) if Some(&d) == dir.current().as_ref() => None,
        Some(d) => Some((d, Instant::now())),
    }
}

fn dir_display(dir: &Path) -> String {
    dir.join("current").display().to_string()
}

fn stopped(dir: &FollowDir) -> anyhow::Result<()> {
    tracing::info!(current = ?dir.current().map(|d| d.to_string()), "signal received, stopped following");
    Ok(())
}

/// Runs `--exec` after a switch, with the new version in its environment. Its output goes to our
/// stderr, so stdout stays one line per switch; a command that fails is reported, and following
/// goes on.
async fn run_exec(cmd: &str, reference: &Reference, switch: &Switch, root: &Path) {
    let pinned = Digest::parse(&switch.digest)
        .map(|d| reference.pinned(d).to_string())
        .unwrap_or_default();
    let stderr = {
        use std::os::fd::AsFd;
        std::io::stderr()
            .as_fd()
            .try_clone_to_owned()
            .map(std::process::Stdio::from)
            .unwrap_or_else(|_| std::process::Stdio::inherit())
    };
    let status = tokio::process::Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .env("VIAL_DIGEST", &switch.digest)
        .env("VIAL_REFERENCE", &pinned)
        .env("VIAL_PATH", &switch.path)
        .env("VIAL_CURRENT", root.join("current"))
        .env(
            "VIAL_PREVIOUS_DIGEST",
            switch.previous.as_deref().unwrap_or(""),
        )
        .stdin(std::process::Stdio::null())
        .stdout(stderr)
        .status()
        .await;
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => tracing::warn!(command = cmd, status = %s, "--exec command failed"),
        Err(e) => tracing::warn!(command = cmd, error = %e, "cannot run the --exec command"),
    }
}
