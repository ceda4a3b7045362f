//! `vial-bench follow`: a trainer loop publishing a checkpoint every `--interval` seconds, 5% of
//! its tensors rewritten each round, while `vial pull --follow` and `vial mount --follow` nodes
//! follow the tag on the same machine.
//!
//! Each round the trainer writes the next checkpoint, pushes it under the followed tag at the
//! round's start, and the bench notes when each follower prints its switch line. Printed: the time
//! from the push's end to each follower's switch (p50, p99, max, over every follower and round),
//! and the chunk bytes each follower fetched per round over the bytes the round changed. Mount
//! followers run with `--prefetch all`, so their switch includes fetching the new chunks into the
//! node cache (a switched mount reads at cache speed) and its line reports those bytes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::checkpoint::{Case, Generator};
use crate::report::{self, Goal};
use crate::servers::{self, WorkDir};

#[derive(Debug, Args)]
pub struct FollowArgs {
    /// The `vial` binary: registry, pushes and followers.
    #[arg(long)]
    pub vial: PathBuf,
    /// Checkpoint size in MiB, in four shards.
    #[arg(long, default_value_t = 2048)]
    pub size_mib: u64,
    /// Rounds of the trainer loop.
    #[arg(long, default_value_t = 10)]
    pub rounds: u32,
    /// Seconds between the starts of two pushes.
    #[arg(long, default_value_t = 20)]
    pub interval: u64,
    /// `vial pull --follow` followers.
    #[arg(long, default_value_t = 4)]
    pub pulls: usize,
    /// `vial mount --follow` followers.
    #[arg(long, default_value_t = 4)]
    pub mounts: usize,
    /// Parent of the run's directory (not tmpfs).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    #[arg(long)]
    pub keep_workdir: bool,
}

/// How long a round waits for every follower before it calls the run failed.
const ROUND_TIMEOUT: Duration = Duration::from_secs(300);

/// One follower's report of one switch.
struct Switch {
    follower: usize,
    at: Instant,
    bytes_fetched: u64,
}

struct Follower {
    child: tokio::process::Child,
    mount: bool,
}

/// Starts `vial ARGS` and forwards each JSON line of its stdout (with when it came) to `tx`.
fn spawn_follower(
    vial: &Path,
    args: &[String],
    home: &Path,
    id: usize,
    mount: bool,
    tx: tokio::sync::mpsc::UnboundedSender<(usize, Instant, serde_json::Value)>,
) -> Result<Follower> {
    std::fs::create_dir_all(home)?;
    let log = std::fs::File::create(home.join("follower.log"))?;
    let mut child = tokio::process::Command::new(vial)
        .args(args)
        .env("HOME", home)
        .env("VIAL_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a follower")?;
    let stdout = child.stdout.take().context("follower has no stdout")?;
    tokio::spawn(async move {
        let mut lines = BufReader::new(stdout).lines();
        while let Ok(Some(line)) = lines.next_line().await {
            let at = Instant::now();
            let value = match line.strip_prefix("ready ") {
                Some(r) => serde_json::json!({ "event": "ready", "reference": r }),
                None => serde_json::from_str(&line).unwrap_or(serde_json::Value::Null),
            };
            if tx.send((id, at, value)).is_err() {
                return;
            }
        }
    });
    Ok(Follower { child, mount })
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

async fn push(vial: &Path, dir: &Path, reference: &str) -> Result<String> {
    let out = tokio::process::Command::new(vial)
        .arg("push")
        .arg(dir)
        .arg(reference)
        .arg("--json")
        .env("VIAL_LOG", "warn")
        .output()
        .await?;
    if !out.status.success() {
        bail!("push failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    v["digest"]
        .as_str()
        .map(str::to_owned)
        .context("push printed no digest")
}

pub async fn follow(args: FollowArgs) -> Result<()> {
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, args.keep_workdir)?;
    let dir = work.path.clone();
    let registry = servers::start_vial(&args.vial, &dir.join("registry"))?;
    let addr = registry
        .url("")?
        .as_str()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let reference = format!("{addr}/weights/trainer:latest");
    let generator = Generator::new(args.size_mib << 20, 4)?;
    let base = dir.join("round-0");
    let g = generator.write(Case::Base, &base, &base)?;
    let d0 = push(&args.vial, &base, &reference).await?;
    println!(
        "follow: a {} checkpoint in 4 shards ({} tensors), {} rounds every {} s, {} pull and {} mount followers",
        report::si(Some(g.bytes)),
        generator.shape.tensors,
        args.rounds,
        args.interval,
        args.pulls,
        args.mounts
    );

    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut followers = Vec::new();
    let cache_size = format!("{}MiB", args.size_mib * 3);
    for i in 0..args.pulls + args.mounts {
        let home = dir.join(format!("follower-{i}"));
        let mount = i >= args.pulls;
        let target = home.join(if mount { "mnt" } else { "model" });
        let a: Vec<String> = if mount {
            std::fs::create_dir_all(&target)?;
            vec![
                "mount".into(),
                "--follow".into(),
                reference.clone(),
                target.display().to_string(),
                "--foreground".into(),
                "--announce-ready".into(),
                "--json".into(),
                "--prefetch".into(),
                "all".into(),
                "--cache-size".into(),
                cache_size.clone(),
                "--cache-dir".into(),
                home.join("node-cache").display().to_string(),
                "--timeout".into(),
                "10m".into(),
            ]
        } else {
            vec![
                "pull".into(),
                "--follow".into(),
                reference.clone(),
                target.display().to_string(),
                "--json".into(),
            ]
        };
        followers.push((
            spawn_follower(&args.vial, &a, &home, i, mount, tx.clone())?,
            target,
        ));
    }
    // Every follower on the first version: pulls have switched to it, mounts are ready and have
    // the whole version in their node cache (read once, as a loader would at start).
    let mut ready = vec![false; followers.len()];
    let deadline = Instant::now() + ROUND_TIMEOUT;
    while ready.iter().any(|r| !r) {
        let (id, _, v) = tokio::time::timeout_at(deadline.into(), rx.recv())
            .await
            .context("followers did not start")?
            .context("followers exited")?;
        let first = v["event"] == "ready" || (v["event"] == "switch" && v["digest"] == d0.as_str());
        if first {
            ready[id] = true;
        }
    }
    for (f, target) in &followers {
        if f.mount {
            let files = crate::mounted::files_under(&target.join("current"))?;
            crate::mounted::read_files(&files, 2)?;
        }
    }
    std::fs::remove_dir_all(&base)?;

    let mut latencies = Vec::new();
    let mut by_kind: Vec<(bool, f64)> = Vec::new();
    let mut ratios: Vec<(bool, f64)> = Vec::new();
    let mut push_seconds = Vec::new();
    let mut next_start = Instant::now();
    let mut previous_dir: Option<PathBuf> = None;
    for round in 1..=args.rounds {
        let round_dir = dir.join(format!("round-{round}"));
        // The trainer writes its checkpoint (files the round leaves alone are hard links).
        let scratch = dir.join("round-base");
        if round == 1 {
            generator.write(Case::Base, &scratch, &scratch)?;
        }
        generator.write(Case::Round(round), &round_dir, &scratch)?;
        let changed = generator.round_changed_bytes(round);
        tokio::time::sleep_until(next_start.into()).await;
        next_start = Instant::now() + Duration::from_secs(args.interval);
        let started = Instant::now();
        let digest = push(&args.vial, &round_dir, &reference).await?;
        let pushed = Instant::now();
        push_seconds.push((pushed - started).as_secs_f64());
        let mut seen: Vec<Option<Switch>> = (0..followers.len()).map(|_| None).collect();
        let deadline = pushed + ROUND_TIMEOUT;
        while seen.iter().any(Option::is_none) {
            let (id, at, v) = tokio::time::timeout_at(deadline.into(), rx.recv())
                .await
                .with_context(|| format!("round {round}: not every follower switched"))?
                .context("followers exited")?;
            if v["event"] == "switch" && v["digest"] == digest.as_str() {
                seen[id] = Some(Switch {
                    follower: id,
                    at,
                    bytes_fetched: v["bytes_fetched"].as_u64().unwrap_or(0),
                });
            }
        }
        let mut worst = 0f64;
        for s in seen.into_iter().flatten() {
            let latency = s.at.saturating_duration_since(pushed).as_secs_f64();
            worst = worst.max(latency);
            let mount = followers[s.follower].0.mount;
            latencies.push(latency);
            by_kind.push((mount, latency));
            ratios.push((mount, s.bytes_fetched as f64 / changed as f64));
        }
        println!(
            "round {round}: {} changed, pushed in {:.2} s, every follower switched {:.2} s after",
            report::si(Some(changed)),
            (pushed - started).as_secs_f64(),
            worst
        );
        if let Some(old) = previous_dir.replace(round_dir) {
            std::fs::remove_dir_all(old)?;
        }
    }

    latencies.sort_by(f64::total_cmp);
    let kind_ratios = |mount: bool| {
        let v: Vec<f64> = ratios
            .iter()
            .filter(|(m, _)| *m == mount)
            .map(|(_, r)| *r)
            .collect();
        let max = v.iter().copied().fold(0.0, f64::max);
        let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
        (mean, max)
    };
    let ratio_cell = |(mean, max): (f64, f64), n: usize| {
        if n == 0 {
            "-".to_owned()
        } else {
            format!("{mean:.3}x ({max:.3}x)")
        }
    };
    let (pull_mean, pull_max) = kind_ratios(false);
    let (mount_mean, mount_max) = kind_ratios(true);
    let p50 = percentile(&latencies, 0.5);
    let p99 = percentile(&latencies, 0.99);
    let kind_latency = |mount: bool| {
        let mut v: Vec<f64> = by_kind
            .iter()
            .filter(|(m, _)| *m == mount)
            .map(|(_, l)| *l)
            .collect();
        v.sort_by(f64::total_cmp);
        if v.is_empty() {
            return "-".to_owned();
        }
        format!("{:.2} / {:.2} s", percentile(&v, 0.5), percentile(&v, 0.99))
    };
    report::table(
        "follow: time from the push's end to each follower's switch, and bytes fetched per round",
        &["", "value"],
        &[
            vec!["switch p50".into(), format!("{p50:.2} s")],
            vec!["switch p99".into(), format!("{p99:.2} s")],
            vec![
                "pull followers: switch p50 / p99".into(),
                kind_latency(false),
            ],
            vec![
                "mount followers: switch p50 / p99".into(),
                kind_latency(true),
            ],
            vec![
                "switch max".into(),
                format!("{:.2} s", latencies.last().copied().unwrap_or(f64::NAN)),
            ],
            vec![
                "push, median".into(),
                format!("{:.2} s", report::median(&push_seconds).unwrap_or(f64::NAN)),
            ],
            vec![
                "pull followers: fetched / changed, mean (max)".into(),
                ratio_cell((pull_mean, pull_max), args.pulls),
            ],
            vec![
                "mount followers: fetched / changed, mean (max)".into(),
                ratio_cell((mount_mean, mount_max), args.mounts),
            ],
        ],
    );
    let worst_ratio = pull_max.max(if args.mounts > 0 { mount_max } else { 0.0 });
    report::print_goal_list(
        &[
            Goal {
                goal: "every follower switched, p99 < 3 s after the push".into(),
                pass: Some(p99 < 3.0),
                detail: format!("p99 {p99:.2} s over {} switches", latencies.len()),
            },
            Goal {
                goal: "bytes fetched per follower per round <= 1.1x the changed bytes".into(),
                pass: Some(worst_ratio <= 1.1),
                detail: format!("worst {worst_ratio:.3}x"),
            },
        ],
        &[format!(
            "the registry, the trainer's push and all {} followers share this machine's {} cores and the disk under {} ({})",
            followers.len(),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            dir.display(),
            servers::fs_type(&dir).unwrap_or_else(|| "?".into())
        )],
    );
    for (mut f, target) in followers {
        if f.mount {
            let _ = std::process::Command::new(&args.vial)
                .args(["umount", "--lazy"])
                .arg(&target)
                .status();
        }
        let _ = f.child.kill().await;
    }
    drop(registry);
    drop(work);
    Ok(())
}
