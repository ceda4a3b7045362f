//! `vial-bench fleet`: N cold nodes read one volume with and without the in-cluster cache tier
//! (`vial serve --upstream`), the origin behind a link throttled to stand for a remote one.
//!
//! Each node is a `vial mount` with its own empty node cache, reading every file to the end with
//! 4 MiB reads; all N start at once. Without the tier the nodes mount the origin (through the
//! throttled link); with it they mount the same origin reference with `--mirror` pointing at a
//! fresh cache whose upstream is the throttled link. Printed per N: wall time until every node has
//! read everything, CPU seconds of every process involved, and the bytes that crossed the link
//! over the volume's size.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::mounted::{self, MountSpec, Mounted};
use crate::report::{self, Goal};
use crate::servers::{self, WorkDir};

#[derive(Debug, Args)]
pub struct FleetArgs {
    /// The `vial` binary: origin, cache, pushes and mounts.
    #[arg(long)]
    pub vial: PathBuf,
    /// Volume size in MiB, in four shards.
    #[arg(long, default_value_t = 1024)]
    pub size_mib: u64,
    /// Node counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1, 4, 16])]
    pub nodes: Vec<usize>,
    /// The origin's link, MB/s (10^6 bytes).
    #[arg(long, default_value_t = 100.0)]
    pub link_mbps: f64,
    /// Parent of the run's directory (not tmpfs).
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    #[arg(long)]
    pub keep_workdir: bool,
}

/// A shared link of fixed bandwidth: every piece sent reserves its time on it.
struct Link {
    bytes_per_second: f64,
    next_free: Mutex<Instant>,
    sent: AtomicU64,
}

impl Link {
    async fn take(&self, n: usize) {
        let until = {
            let mut next = self.next_free.lock().unwrap_or_else(|e| e.into_inner());
            let start = (*next).max(Instant::now());
            *next = start + Duration::from_secs_f64(n as f64 / self.bytes_per_second);
            *next
        };
        tokio::time::sleep_until(until.into()).await;
        self.sent.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// A TCP proxy to `target` whose answers cross `link`. Returns its address.
async fn throttled_proxy(target: String, link: Arc<Link>) -> Result<String> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?.to_string();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (target, link) = (target.clone(), Arc::clone(&link));
            tokio::spawn(async move {
                let Ok(server) = TcpStream::connect(&target).await else {
                    return;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut client_read, &mut server_write).await;
                    let _ = server_write.shutdown().await;
                });
                let mut buf = vec![0u8; 64 * 1024];
                loop {
                    let n = match server_read.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    link.take(n).await;
                    if client_write.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                let _ = client_write.shutdown().await;
                up.abort();
            });
        }
    });
    Ok(addr)
}

/// One run: N nodes, with or without the tier.
struct Outcome {
    seconds: f64,
    cpu: f64,
    link_bytes: u64,
}

pub async fn fleet(args: FleetArgs) -> Result<()> {
    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = WorkDir::create(&parent, args.keep_workdir)?;
    let dir = work.path.clone();
    let origin = servers::start_vial(&args.vial, &dir.join("origin"))?;
    let origin_addr = authority(&origin.url("")?);
    let link = Arc::new(Link {
        bytes_per_second: args.link_mbps * 1e6,
        next_free: Mutex::new(Instant::now()),
        sent: AtomicU64::new(0),
    });
    let remote = throttled_proxy(origin_addr.clone(), Arc::clone(&link)).await?;

    // The volume, pushed to the origin directly (not across the link).
    let volume = dir.join("volume");
    std::fs::create_dir_all(&volume)?;
    let shard = (args.size_mib << 20) / 4;
    for i in 0..4u64 {
        let mut bytes = vec![0u8; shard as usize];
        crate::data::xorshift_fill(&mut bytes, 4000 + i);
        std::fs::write(volume.join(format!("model-{i}.safetensors")), bytes)?;
    }
    let size = shard * 4;
    let out = std::process::Command::new(&args.vial)
        .arg("push")
        .arg(&volume)
        .arg(format!("{origin_addr}/weights/fleet"))
        .args(["--tag", "v1", "--json"])
        .env("VIAL_LOG", "warn")
        .output()?;
    if !out.status.success() {
        bail!("push failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let pushed: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let pinned = pushed["reference"]
        .as_str()
        .and_then(|r| r.split_once('/'))
        .context("push printed no reference")?
        .1
        .to_owned();
    std::fs::remove_dir_all(&volume)?;
    println!(
        "fleet: a {} volume in 4 shards; origin link {} MB/s; nodes {:?}",
        report::si(Some(size)),
        args.link_mbps,
        args.nodes
    );

    let mut rows = Vec::new();
    let mut goals = Vec::new();
    for &n in &args.nodes {
        let without = run(&args, &dir, n, &remote, &pinned, None, &link, &origin, size).await?;
        let cache_dir = dir.join(format!("cache-{n}"));
        let cache = servers::start_vial_with(
            &args.vial,
            &cache_dir,
            &[
                "--upstream".into(),
                format!("http://{remote}"),
                "--cache-size".into(),
                format!("{}MiB", args.size_mib * 2),
            ],
            &[],
        )?;
        let cache_addr = authority(&cache.url("")?);
        let with = run(
            &args,
            &dir,
            n,
            &remote,
            &pinned,
            Some((&cache_addr, cache.pid())),
            &link,
            &origin,
            size,
        )
        .await?;
        cache.stop_and_delete()?;
        let speedup = without.seconds / with.seconds;
        for (mode, o) in [("origin only", &without), ("through the cache", &with)] {
            rows.push(vec![
                n.to_string(),
                mode.to_owned(),
                format!("{:.1}", o.seconds),
                format!("{:.1}", o.cpu),
                format!("{:.2}x", o.link_bytes as f64 / size as f64),
            ]);
        }
        rows.push(vec![
            n.to_string(),
            "speed-up".into(),
            format!("{speedup:.2}x"),
            String::new(),
            String::new(),
        ]);
        goals.push(Goal {
            goal: format!("{n} nodes: origin bytes <= 1.05x the volume with the tier"),
            pass: Some(with.link_bytes as f64 <= 1.05 * size as f64),
            detail: format!("{:.3}x", with.link_bytes as f64 / size as f64),
        });
        if n >= 16 {
            goals.push(Goal {
                goal: format!("{n} nodes finish >= 4x sooner with the tier"),
                pass: Some(speedup >= 4.0),
                detail: format!("{speedup:.2}x"),
            });
        }
    }
    report::table(
        "fleet: every node reads the whole volume through `vial mount` (cold node caches)",
        &["nodes", "", "wall s", "CPU s", "link bytes / volume"],
        &rows,
    );
    report::print_goal_list(
        &goals,
        &[format!(
            "all nodes share this machine's {} cores, so the fan-out is CPU-bound here",
            std::thread::available_parallelism().map_or(1, |n| n.get())
        )],
    );
    drop(origin);
    drop(work);
    Ok(())
}

/// N cold nodes mount `pinned` of the origin (through the link, or through the cache at
/// `cache`) and read every file.
#[allow(clippy::too_many_arguments)]
async fn run(
    args: &FleetArgs,
    dir: &Path,
    n: usize,
    remote: &str,
    pinned: &str,
    cache: Option<(&str, u32)>,
    link: &Link,
    origin: &servers::Server,
    size: u64,
) -> Result<Outcome> {
    let label = if cache.is_some() { "cache" } else { "origin" };
    let mut extra = vec!["--timeout".to_owned(), "1h".to_owned()];
    if let Some((addr, _)) = cache {
        extra.extend(["--mirror".to_owned(), format!("{remote}=http://{addr}")]);
    }
    let sent_before = link.sent.load(Ordering::Relaxed);
    let servers_cpu =
        |pids: &[u32]| -> f64 { pids.iter().filter_map(|p| servers::cpu_seconds(*p)).sum() };
    let mut pids = vec![origin.pid()];
    if let Some((_, pid)) = cache {
        pids.push(pid);
    }
    let cpu_before = servers_cpu(&pids);
    let specs: Vec<(MountSpec, PathBuf)> = (0..n)
        .map(|i| {
            let node = dir.join(format!("{label}-{n}-node-{i}"));
            (
                MountSpec {
                    vial: args.vial.clone(),
                    reference: format!("{remote}/{pinned}"),
                    cache_dir: node.join("cache"),
                    cache_size: format!("{}MiB", args.size_mib * 2),
                    prefetch: "none",
                    log: node.join("mount.log"),
                    extra: extra.clone(),
                },
                node.join("mnt"),
            )
        })
        .collect();
    let started = Instant::now();
    let results = tokio::task::spawn_blocking(move || {
        std::thread::scope(|s| {
            let handles: Vec<_> = specs
                .iter()
                .map(|(spec, mountpoint)| {
                    s.spawn(move || -> Result<(u64, f64)> {
                        let m = Mounted::mount(spec, mountpoint)?;
                        let files = mounted::files_under(&m.mountpoint)?;
                        let read = mounted::read_files(&files, 2)?;
                        let cpu = m.cpu_seconds().unwrap_or(0.0);
                        m.unmount()?;
                        let _ = std::fs::remove_dir_all(&spec.cache_dir);
                        Ok((read.bytes, cpu))
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap_or_else(|_| bail!("a node panicked")))
                .collect::<Vec<_>>()
        })
    })
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    let mut cpu = servers_cpu(&pids) - cpu_before;
    for r in results {
        let (bytes, node_cpu) = r?;
        if bytes != size {
            bail!("a node read {bytes} bytes of a {size}-byte volume");
        }
        cpu += node_cpu;
    }
    let link_bytes = link.sent.load(Ordering::Relaxed) - sent_before;
    println!(
        "  {n} nodes, {label}: {seconds:.1} s, {cpu:.1} CPU s, {} over the link",
        report::si(Some(link_bytes))
    );
    Ok(Outcome {
        seconds,
        cpu,
        link_bytes,
    })
}

/// `host:port` of a server's URL.
fn authority(url: &reqwest::Url) -> String {
    format!(
        "{}:{}",
        url.host_str().unwrap_or("127.0.0.1"),
        url.port_or_known_default().unwrap_or(80)
    )
}
