//! `vial mount`, `vial umount` and the `mount.vial` helper for mount(8) and /etc/fstab.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use vial_client::volume;
use vial_snapshotter::{MountOptions, Prefetch};

use crate::common::{count, human_bytes, parse_reference, RegistryArgs};

#[derive(Debug, Args)]
#[command(
    after_help = "Examples:\n  vial mount localhost:5000/weights/my-model:prod /mnt/weights/my-model\n  vial mount localhost:5000/weights/my-model@sha256:… /mnt/m --cache-size 20GiB --prefetch all\n  vial mount localhost:5000/indexes/wiki:prod /mnt/wiki --prefetch 'shards/*.idx' --prefetch tokenizer\n  vial mount --stats /mnt/m\n  vial mount --follow localhost:5000/weights/my-model:prod /mnt/m   # reads /mnt/m/current/…\n  vial umount /mnt/m\n\nA tag is resolved once, at mount: the mount serves that version until it is unmounted.\nWith --follow the mount tracks the tag instead: MNT/current -> sha256-<hex>/ moves with it,\nfetching only the chunks the node cache lacks; a loader that resolves current once reads one\nversion to the end, and each switch prints a line (digest, bytes fetched, seconds).\nFrom /etc/fstab (with mount.vial linked to vial in /sbin):\n  localhost:5000/weights/m:prod  /mnt/m  vial  cache-size=20GiB,prefetch=all  0 0"
)]
pub struct MountArgs {
    /// Version to mount: host[:port]/name:tag or host[:port]/name@sha256:…
    #[arg(required_unless_present = "stats")]
    reference: Option<String>,
    /// Empty directory to mount it on.
    #[arg(required_unless_present = "stats")]
    mountpoint: Option<PathBuf>,
    /// Node chunk cache directory, shared by every mount on the node.
    #[arg(long, env = "VIAL_CACHE_DIR")]
    cache_dir: Option<PathBuf>,
    /// Bound on the chunk cache, e.g. 500MiB, 20GiB.
    #[arg(long, env = "VIAL_CACHE_SIZE", default_value = "10GiB", value_parser = parse_size)]
    cache_size: u64,
    /// What to stream into the cache in the background, in bulk: `all` (the whole volume), or a
    /// path, a directory or a glob (`*`, `?`, `**`), e.g. `tokenizer` or `index/**/*.bin`; give
    /// it again for more. `none` (the default) fetches only what is read, reading ahead of
    /// sequential readers and of programs that walk the tree's files in order.
    #[arg(long, default_value = "none", value_name = "all|none|PATTERN")]
    prefetch: Vec<String>,
    /// Downloads in flight at once for reads and read-ahead (each a bulk read of up to 8 MiB of
    /// chunks). Raise it for a registry far away; on a near one, more in flight only delays the
    /// chunks readers are waiting for.
    #[arg(long, default_value_t = vial_snapshotter::mount::DOWNLOADS, value_parser = clap::value_parser!(u32).range(1..=256))]
    downloads: u32,
    /// How long one chunk may take (retries included) before a read fails with EIO, e.g. 30s.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Follow the tag: the mount shows `current`, a symlink to the directory of the version the
    /// tag points at (`sha256-<hex>/`), switched the moment the tag moves. Files already open
    /// keep reading their version.
    #[arg(long)]
    follow: bool,
    /// With --follow: how long a version that is no longer current, and has no file open, stays
    /// visible before it is dropped.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, requires = "follow")]
    follow_grace: Duration,
    /// With --follow: print one JSON object per switch instead of text.
    #[arg(long, requires = "follow")]
    json: bool,
    /// Stay in the foreground instead of returning once the mount is ready.
    #[arg(long)]
    foreground: bool,
    /// Log file of a background mount (default: next to the cache, under logs/).
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Print the statistics of the mount at this path and exit.
    #[arg(long, value_name = "MOUNTPOINT", conflicts_with_all = ["reference", "mountpoint"])]
    stats: Option<PathBuf>,
    /// Print what a child mount prints when it is ready (internal: used by the background mode).
    #[arg(long, hide = true)]
    announce_ready: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Debug, Args)]
pub struct UmountArgs {
    mountpoint: PathBuf,
    /// Detach now even if files are open; the mount goes away when the last one is closed.
    #[arg(long)]
    lazy: bool,
}

/// Sizes like `500MiB`, `20GiB`, `1.5G`, `1000000`.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let n: f64 = number.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" => 1000,
        "kib" => 1 << 10,
        "m" | "mb" => 1000 * 1000,
        "mib" => 1 << 20,
        "g" | "gb" => 1000 * 1000 * 1000,
        "gib" => 1 << 30,
        "t" | "tb" => 1000u64.pow(4),
        "tib" => 1 << 40,
        other => return Err(format!("unknown size unit {other:?} in {s:?}")),
    };
    Ok((n * mult as f64) as u64)
}

/// `$XDG_CACHE_HOME/vial/cache`, else `~/.cache/vial/cache`, else `/var/cache/vial`.
pub fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("vial/cache");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache/vial/cache"),
        None => PathBuf::from("/var/cache/vial"),
    }
}

#[allow(clippy::print_stdout)]
pub fn run(args: MountArgs) -> anyhow::Result<()> {
    if let Some(mp) = &args.stats {
        let path = mp.join(vial_snapshotter::stats_file_name());
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{} is not a vial mount (no {})",
                mp.display(),
                path.display()
            )
        })?;
        let s: vial_snapshotter::stats::Snapshot =
            serde_json::from_str(&text).context("unreadable mount statistics")?;
        println!("{}", s.reference);
        println!(
            "fetched   {} in {} ({} prefetched)",
            human_bytes(s.bytes_fetched),
            count(s.chunks_fetched, "chunk"),
            s.prefetched_chunks
        );
        println!("read      {}", human_bytes(s.bytes_read));
        println!(
            "cache     {} hits, {} misses, {} evictions, {} of {} used",
            s.cache_hits,
            s.cache_misses,
            s.evictions,
            human_bytes(s.cache_bytes),
            human_bytes(s.cache_limit)
        );
        println!("errors    {}", s.fetch_errors);
        println!("fetching  {} now", s.fetches_in_flight);
        return Ok(());
    }
    let (Some(reference), Some(mountpoint)) = (args.reference.clone(), args.mountpoint.clone())
    else {
        bail!("give a reference and a mountpoint");
    };
    let reference = parse_reference(&reference)?;
    let mountpoint = std::fs::canonicalize(&mountpoint)
        .ok()
        .filter(|m| m.is_dir())
        .with_context(|| {
            format!(
                "mountpoint {} does not exist or is not a directory",
                mountpoint.display()
            )
        })?;
    // Said before anything is fetched or started in the background, in the words that fix it.
    Prefetch::from_args(&args.prefetch).map_err(anyhow::Error::msg)?;
    vial_snapshotter::mount::fuse_ready()?;
    let cache_dir = args.cache_dir.clone().unwrap_or_else(default_cache_dir);
    if !args.foreground {
        return spawn_background(&args, &cache_dir, &mountpoint);
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let registry = args.registry.connect(reference.registry())?;
    if args.follow {
        return run_follow(&args, &runtime, registry, reference, cache_dir, &mountpoint);
    }
    let version = runtime
        .block_on(volume::open(
            &registry,
            reference.repo(),
            &reference.target(),
        ))
        .with_context(|| format!("cannot open {reference}"))?;
    let pinned = reference.pinned(version.digest.clone());
    let options = mount_options(&args, cache_dir);
    let files = version.tree.file_count();
    let bytes = version.tree.total_bytes();
    let mut mounted = vial_snapshotter::mount::mount(
        runtime.handle(),
        registry,
        reference.repo().clone(),
        version,
        format!("vial:{pinned}"),
        &mountpoint,
        &options,
    )
    .with_context(|| format!("cannot mount {reference}"))?;
    runtime.block_on(mounted.lease_taken());
    let guard = crate::mount_guard::Guard::start(&mountpoint);
    tracing::info!(%pinned, mountpoint = %mountpoint.display(), files, bytes, "mounted");
    if args.announce_ready {
        println!("ready {pinned}");
    } else {
        eprintln!(
            "mounted {pinned} at {} ({}, {})",
            mountpoint.display(),
            count(files as u64, "file"),
            human_bytes(bytes)
        );
        println!("{pinned}");
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot listen for SIGTERM")?;
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    if mounted.try_wait().is_some() {
                        tracing::info!(mountpoint = %mountpoint.display(), "unmounted");
                        return Ok::<_, anyhow::Error>(());
                    }
                }
            }
        }
        tracing::info!(mountpoint = %mountpoint.display(), "signal received, unmounting");
        mounted.unmount();
        Ok(())
    })?;
    let _ = mounted.wait();
    mounted.close();
    if let Some(guard) = guard {
        guard.release();
    }
    runtime.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}

fn mount_options(args: &MountArgs, cache_dir: PathBuf) -> MountOptions {
    MountOptions {
        cache_dir,
        cache_size: args.cache_size,
        // Checked before the mount started.
        prefetch: Prefetch::from_args(&args.prefetch).unwrap_or(Prefetch::None),
        timeout: args.timeout,
        parallel: args.downloads as usize,
    }
}

/// How often a following mount looks for versions to drop.
const DROP_CHECK: Duration = Duration::from_secs(2);

/// `vial mount --follow`, in the foreground: mounts the tag's version, then switches `current`
/// each time the tag moves, until unmounted or signalled.
#[allow(clippy::print_stdout)]
fn run_follow(
    args: &MountArgs,
    runtime: &tokio::runtime::Runtime,
    registry: vial_client::Registry,
    reference: vial_core::Reference,
    cache_dir: PathBuf,
    mountpoint: &Path,
) -> anyhow::Result<()> {
    use crate::follow::{say, say_removed};
    let Some(tag) = reference.tag().cloned() else {
        bail!("--follow follows a tag: give host/name:tag, not a digest");
    };
    let repo = reference.repo().clone();
    let mut follower =
        vial_client::follow::TagFollower::new(registry.clone(), repo.clone(), tag.clone());
    let first = runtime
        .block_on(follower.next())
        .with_context(|| format!("cannot follow {reference}"))?
        .with_context(|| format!("{reference} does not exist: nothing to mount yet"))?;
    let version = runtime
        .block_on(volume::open(
            &registry,
            &repo,
            &vial_core::Target::Digest(first.clone()),
        ))
        .with_context(|| format!("cannot open {reference}"))?;
    let pinned = reference.pinned(first.clone());
    let (mut mounted, follow) = vial_snapshotter::mount::mount_following(
        runtime.handle(),
        registry.clone(),
        repo.clone(),
        version,
        format!("vial:{reference}"),
        format!("vial:{pinned}"),
        mountpoint,
        &mount_options(args, cache_dir),
    )
    .with_context(|| format!("cannot mount {reference}"))?;
    runtime.block_on(mounted.lease_taken());
    let guard = crate::mount_guard::Guard::start(mountpoint);
    tracing::info!(%pinned, mountpoint = %mountpoint.display(), "mounted, following the tag");
    if args.announce_ready {
        println!("ready {pinned}");
    } else {
        eprintln!(
            "mounted {pinned} at {}/current, following {reference}",
            mountpoint.display()
        );
    }
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let json = args.json;
    let grace = args.follow_grace;
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("cannot listen for SIGTERM")?;
        let mut tick = tokio::time::interval(DROP_CHECK);
        // The follower runs on its own task so the ticks do not cut its long polls short.
        let (moves_tx, mut moves) = tokio::sync::mpsc::channel(1);
        let watcher = tokio::spawn(async move {
            loop {
                let moved = follower.next().await;
                let failed = moved.is_err();
                if moves_tx.send(moved).await.is_err() || failed {
                    return;
                }
            }
        });
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = term.recv() => break,
                _ = tick.tick() => {
                    if mounted.try_wait().is_some() {
                        tracing::info!(mountpoint = %mountpoint.display(), "unmounted");
                        return Ok::<_, anyhow::Error>(());
                    }
                    for name in follow.drop_retired(grace) {
                        tracing::info!(version = name, "dropped a version no longer current and no longer open");
                    }
                }
                Some(moved) = moves.recv() => {
                    let seen = std::time::Instant::now();
                    let Some(digest) = moved? else {
                        say_removed(json, &reference, follow.current().as_ref());
                        continue;
                    };
                    if Some(&digest) == follow.current().as_ref() {
                        continue;
                    }
                    // A version that cannot be opened now is tried again at the next move or
                    // when the registry answers; the mount keeps serving `current` meanwhile.
                    let version = match volume::open(&registry, &repo, &vial_core::Target::Digest(digest.clone())).await {
                        Ok(v) => v,
                        Err(e) => {
                            tracing::warn!(%digest, error = %vial_core::error_chain(&e), "cannot open the version the tag moved to; keeping current");
                            continue;
                        }
                    };
                    let source = format!("vial:{}", reference.pinned(digest.clone()));
                    let switch = follow.switch(version, source, seen).await;
                    let mut value = serde_json::to_value(&switch).unwrap_or_default();
                    value["event"] = "switch".into();
                    value["reference"] = reference.pinned(digest.clone()).to_string().into();
                    let text = format!(
                        "switched {}/current to {} ({}, fetched {}; {:.2} s)",
                        mountpoint.display(),
                        reference.pinned(digest),
                        if switch.was_kept { "still shown" } else { "new" },
                        human_bytes(switch.bytes_fetched),
                        switch.seconds
                    );
                    say(json, value, &text);
                }
            }
        }
        watcher.abort();
        tracing::info!(mountpoint = %mountpoint.display(), "signal received, unmounting");
        mounted.unmount();
        Ok(())
    })?;
    let _ = mounted.wait();
    mounted.close();
    if let Some(guard) = guard {
        guard.release();
    }
    Ok(())
}

/// Starts the same command with `--foreground` as a detached process and returns once it reports
/// that the mount is ready, printing the pinned reference.
#[allow(clippy::print_stdout)]
fn spawn_background(args: &MountArgs, cache_dir: &Path, mountpoint: &Path) -> anyhow::Result<()> {
    let log = args.log_file.clone().unwrap_or_else(|| {
        let key =
            vial_core::Algorithm::Sha256.digest_bytes(mountpoint.to_string_lossy().as_bytes());
        cache_dir
            .join("logs")
            .join(format!("mount-{}.log", &key.hex()[..16]))
    });
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let log_file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let exe = std::env::current_exe().context("cannot find the vial executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("mount")
        .arg(args.reference.as_deref().unwrap_or_default())
        .arg(mountpoint)
        .arg("--foreground")
        .arg("--announce-ready")
        .arg("--cache-dir")
        .arg(cache_dir)
        .arg("--cache-size")
        .arg(args.cache_size.to_string())
        .args(
            args.prefetch
                .iter()
                .flat_map(|p| ["--prefetch", p.as_str()]),
        )
        .arg("--downloads")
        .arg(args.downloads.to_string())
        .arg("--timeout")
        .arg(humantime::format_duration(args.timeout).to_string());
    if args.follow {
        cmd.arg("--follow")
            .arg("--follow-grace")
            .arg(humantime::format_duration(args.follow_grace).to_string());
    }
    if args.registry.plain_http {
        cmd.arg("--plain-http");
    }
    for m in &args.registry.mirror {
        cmd.arg("--mirror").arg(format!("{}={}", m.origin, m.url));
    }
    // Its own process group, so a terminal's hangup or Ctrl-C does not take the mount down.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log_file)
        .spawn()
        .context("cannot start the mount process")?;
    let stdout = child
        .stdout
        .take()
        .context("no stdout from the mount process")?;
    let mut line = String::new();
    BufReader::new(stdout)
        .read_line(&mut line)
        .context("mount process failed")?;
    match line.trim().strip_prefix("ready ") {
        Some(pinned) => {
            eprintln!(
                "mounted {pinned} at {} (pid {}, log {})",
                mountpoint.display(),
                child.id(),
                log.display()
            );
            println!("{pinned}");
            Ok(())
        }
        None => {
            let _ = child.wait();
            let log_text = std::fs::read_to_string(&log).unwrap_or_default();
            let last = log_text
                .lines()
                .rev()
                .find(|l| l.contains("error"))
                .unwrap_or(log_text.trim());
            // The child's own "vial: error:" prefix is ours to print, once.
            bail!("{}", last.trim().trim_start_matches("vial: error:").trim())
        }
    }
}

pub fn run_umount(args: UmountArgs) -> anyhow::Result<()> {
    let mp = &args.mountpoint;
    let Err(last_error) = vial_snapshotter::mount::unmount_path(mp, args.lazy) else {
        eprintln!("unmounted {}", mp.display());
        return Ok(());
    };
    if last_error.contains("busy") {
        bail!(
            "{} is busy: files are open on it (close them, or use `vial umount --lazy`)",
            mp.display()
        );
    }
    bail!("cannot unmount {}: {last_error}", mp.display())
}

/// `mount.vial SOURCE MOUNTPOINT [-o opt,opt=value]`, as mount(8) calls it: turned into the
/// equivalent `vial mount` arguments.
pub fn helper_args(argv: &[String]) -> anyhow::Result<Vec<String>> {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut it = argv.iter().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.extend(
                it.next()
                    .map(|o| o.split(',').map(str::to_owned).collect::<Vec<_>>())
                    .unwrap_or_default(),
            ),
            // mount(8) passes these; a read-only network filesystem has nothing to do with them.
            "-n" | "-s" | "-f" | "-v" => {}
            _ => positional.push(a.clone()),
        }
    }
    let [source, mountpoint] = positional.as_slice() else {
        bail!("usage: mount.vial REFERENCE MOUNTPOINT [-o options]");
    };
    let mut out = vec![
        "vial".to_owned(),
        "mount".to_owned(),
        source.clone(),
        mountpoint.clone(),
    ];
    for o in options {
        match o.split_once('=') {
            Some((k @ ("cache-size" | "cache-dir" | "prefetch" | "timeout" | "log-file"), v)) => {
                out.push(format!("--{k}"));
                out.push(v.to_owned());
            }
            None if o == "plain-http" => out.push("--plain-http".into()),
            // Generic options mount(8) adds (ro, defaults, noauto, _netdev, …).
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("500MiB"), Ok(500 << 20));
        assert_eq!(parse_size("20GiB"), Ok(20 << 30));
        assert_eq!(parse_size("1.5G"), Ok(1_500_000_000));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("12 parsecs").is_err());
        assert!(parse_size("GiB").is_err());
    }

    #[test]
    fn fstab_options_become_flags() {
        let argv: Vec<String> = [
            "mount.vial",
            "h:5000/a:v1",
            "/mnt/a",
            "-o",
            "rw,cache-size=1GiB,prefetch=all,plain-http",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            helper_args(&argv).unwrap(),
            [
                "vial",
                "mount",
                "h:5000/a:v1",
                "/mnt/a",
                "--cache-size",
                "1GiB",
                "--prefetch",
                "all",
                "--plain-http"
            ]
        );
    }
}
