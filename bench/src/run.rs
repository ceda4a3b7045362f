//! The `registry` benchmark run: payloads, servers, the five measured sections, and the report.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;

use crate::data::{self, Blob, SharedBody};
use crate::report::{self, median, CurlPull, Pair, Results, Throughput};
use crate::servers::{self, Server};
use crate::{blobs, manifests, rss};

#[derive(Debug, Args)]
pub struct RegistryArgs {
    /// The `vial` binary to benchmark.
    #[arg(long)]
    pub vial: PathBuf,
    /// The peer registry binary (CNCF Distribution 2.x).
    #[arg(long, default_value = "docker-registry")]
    pub peer: PathBuf,
    /// nginx, the ceiling for the large download.
    #[arg(long, default_value = "/usr/sbin/nginx")]
    pub nginx: PathBuf,
    /// curl, for the large download.
    #[arg(long, default_value = "curl")]
    pub curl: PathBuf,
    /// Shrink everything for a smoke run of under a minute.
    #[arg(long)]
    pub quick: bool,
    /// Clients pushing a large blob each at once while vial's RSS is sampled; 0 skips.
    /// Default 16 (2 with --quick).
    #[arg(long)]
    pub rss_clients: Option<usize>,
    /// Run the concurrent-push memory test against the peer as well.
    #[arg(long)]
    pub rss_peer: bool,
    /// Write all figures to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Parent of the run's directory (server data lives there; must be a real disk, not tmpfs).
    /// Default: $TMPDIR, /var/tmp or the current directory, whichever is first not on tmpfs.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Keep the run's directory (with the servers' data and logs) instead of deleting it.
    #[arg(long)]
    pub keep_workdir: bool,
}

/// A size class of blobs: how many, how big, and how many clients move them at once.
#[derive(Debug, Clone)]
pub struct Class {
    pub label: String,
    pub size: usize,
    pub count: usize,
    pub concurrency: usize,
}

#[derive(Debug)]
pub struct Plan {
    pub classes: Vec<Class>,
    pub pull_runs: usize,
    pub manifest_clients: usize,
    pub manifest_per_client: usize,
    pub rss_clients: usize,
}

impl Plan {
    fn new(args: &RegistryArgs) -> Self {
        let class = |mib: usize, count, concurrency| Class {
            label: if mib >= 1024 {
                format!("{} GiB", mib / 1024)
            } else {
                format!("{mib} MiB")
            },
            size: mib << 20,
            count,
            concurrency,
        };
        let (classes, per_client, rss) = if args.quick {
            (
                vec![class(1, 16, 4), class(16, 4, 2), class(128, 2, 1)],
                10,
                2,
            )
        } else {
            (
                vec![class(1, 64, 4), class(64, 8, 2), class(1024, 2, 1)],
                50,
                16,
            )
        };
        Plan {
            classes,
            pull_runs: 3,
            manifest_clients: 32,
            manifest_per_client: per_client,
            rss_clients: args.rss_clients.unwrap_or(rss),
        }
    }
}

/// Records a measurement, or warns and leaves it empty when it failed.
fn keep<T>(what: &str, result: Result<T>) -> Option<T> {
    result
        .map_err(|e| eprintln!("vial-bench: {what} failed: {e:#}"))
        .ok()
}

fn slot<T>(pair: &mut Pair<T>, side: usize) -> &mut Option<T> {
    if side == 0 {
        &mut pair.vial
    } else {
        &mut pair.peer
    }
}

/// Flushes dirty pages so one server's writes are not paid for during the next one's timing.
pub fn sync_disk() {
    let _ = std::process::Command::new("sync").status();
}

pub fn machine() -> report::Machine {
    let cpu = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpu
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split(':').nth(1));
    report::Machine {
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model: model.unwrap_or("unknown").trim().to_string(),
        date: servers::first_line(Path::new("date"), &["-u", "+%Y-%m-%d %H:%M:%S UTC"]),
        kernel: servers::first_line(Path::new("uname"), &["-sr"]),
    }
}

pub async fn registry(args: RegistryArgs) -> Result<()> {
    let plan = Plan::new(&args);
    let peer_name = args
        .peer
        .file_name()
        .map_or("peer".into(), |n| n.to_string_lossy().to_string());
    let mut r = Results {
        machine: machine(),
        quick: args.quick,
        ..Results::default()
    };
    r.versions = report::Versions {
        vial: servers::first_line(&args.vial, &["--version"]),
        peer: servers::first_line(&args.peer, &["--version"]),
        nginx: servers::first_line(&args.nginx, &["-v"]),
        curl: servers::first_line(&args.curl, &["--version"])
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" "),
    };
    let m = &r.machine;
    println!(
        "vial-bench registry{}",
        if args.quick {
            " --quick (smoke run: small sizes, not for publishing)"
        } else {
            ""
        }
    );
    println!("date:     {}", m.date);
    println!("machine:  nproc {}, {}, {}", m.nproc, m.cpu_model, m.kernel);
    let v = &r.versions;
    println!(
        "servers:  {} | {} | {} | {}",
        v.vial, v.peer, v.nginx, v.curl
    );

    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = servers::WorkDir::create(&parent, args.keep_workdir)?;
    let fs = servers::fs_type(&work.path).unwrap_or_else(|| "unknown".into());
    r.workdir = work.path.display().to_string();
    println!("workdir:  {} ({fs})", work.path.display());
    if matches!(fs.as_str(), "tmpfs" | "ramfs") {
        r.notes.push(format!(
            "workdir is on {fs}: disk figures are really memory figures"
        ));
    }

    eprintln!("vial-bench: generating and hashing payloads...");
    let started = Instant::now();
    let classes = plan.classes.clone();
    let (sets, layer) = tokio::task::spawn_blocking(move || {
        let sets: Vec<Arc<[Blob]>> = classes
            .iter()
            .enumerate()
            .map(|(k, c)| data::make_blobs(k as u64 + 1, c.size, c.count).into())
            .collect();
        (sets, data::make_blobs(99, 4096, 1))
    })
    .await?;
    let layer = layer.into_iter().next().context("no layer blob")?;
    let large_class = plan.classes.last().context("no size classes")?;
    let large = sets
        .last()
        .and_then(|s| s.first())
        .context("no large blob")?
        .clone();
    eprintln!(
        "vial-bench: payloads ready in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let vial = servers::start_vial(&args.vial, &work.path.join("vial"))?;
    let peer = servers::start_peer(&args.peer, &work.path.join("peer")).await?;
    let nginx = servers::start_nginx(&args.nginx, &work.path.join("nginx"), &large.data).await?;
    let targets: [&Server; 2] = [&vial, &peer];

    for (c, blobs) in plan.classes.iter().zip(&sets) {
        let mut row = Throughput {
            label: c.label.clone(),
            blob_bytes: c.size as u64,
            blobs: c.count,
            concurrency: c.concurrency,
            runs: Pair::default(),
            mb_s: Pair::default(),
        };
        for (side, srv) in targets.iter().enumerate() {
            sync_disk();
            eprintln!("vial-bench: push {} x {} to {}", c.count, c.label, srv.name);
            let repo = format!("bench/blobs-{}", c.size >> 20);
            let mbs = keep(
                "push",
                blobs::push_all(std::slice::from_ref(&srv.base), &repo, blobs, c.concurrency).await,
            );
            *slot(&mut row.mb_s, side) = mbs;
            *slot(&mut row.runs, side) = Some(mbs.into_iter().collect());
        }
        r.push.push(row);
    }

    for (c, blobs) in plan.classes.iter().zip(&sets) {
        let mut runs: [Vec<f64>; 2] = Default::default();
        for run in 0..plan.pull_runs {
            for (side, srv) in targets.iter().enumerate() {
                eprintln!(
                    "vial-bench: pull {} x {} from {} (run {})",
                    c.count,
                    c.label,
                    srv.name,
                    run + 1
                );
                let repo = format!("bench/blobs-{}", c.size >> 20);
                runs[side].extend(keep(
                    "pull",
                    blobs::pull_all(std::slice::from_ref(&srv.base), &repo, blobs, c.concurrency)
                        .await,
                ));
            }
        }
        let [vial_runs, peer_runs] = runs;
        r.pull.push(Throughput {
            label: c.label.clone(),
            blob_bytes: c.size as u64,
            blobs: c.count,
            concurrency: c.concurrency,
            mb_s: Pair {
                vial: median(&vial_runs),
                peer: median(&peer_runs),
            },
            runs: Pair {
                vial: Some(vial_runs),
                peer: Some(peer_runs),
            },
        });
    }

    let mut curl = CurlPull {
        blob_bytes: large.len(),
        ..CurlPull::default()
    };
    let large_repo = format!("bench/blobs-{}", large_class.size >> 20);
    let blob_path = format!("v2/{large_repo}/blobs/{}", large.digest);
    let mut curl_runs: [Vec<f64>; 3] = Default::default();
    for run in 0..plan.pull_runs {
        for (i, (srv, path)) in [
            (&vial, blob_path.as_str()),
            (&peer, blob_path.as_str()),
            (&nginx, "blob.bin"),
        ]
        .into_iter()
        .enumerate()
        {
            eprintln!(
                "vial-bench: curl {} from {} (run {})",
                large_class.label,
                srv.name,
                run + 1
            );
            let fetched = match srv.url(path) {
                Ok(url) => blobs::curl_fetch(&args.curl, &url, large.len()).await,
                Err(e) => Err(e),
            };
            curl_runs[i].extend(keep("curl", fetched));
        }
    }
    let [cv, cp, cn] = curl_runs;
    curl.mb_s = Pair {
        vial: median(&cv),
        peer: median(&cp),
    };
    curl.nginx_mb_s = median(&cn);
    curl.runs = Pair {
        vial: Some(cv),
        peer: Some(cp),
    };
    curl.nginx_runs = cn;
    r.curl_pull = curl;
    drop(nginx);

    r.manifests.clients = plan.manifest_clients;
    r.manifests.per_client = plan.manifest_per_client;
    for (side, srv) in targets.iter().enumerate() {
        eprintln!("vial-bench: manifests on {}", srv.name);
        let repo = "bench/manifests";
        let measured = async {
            manifests::prepare(&srv.base, repo, &layer).await?;
            manifests::measure(
                std::slice::from_ref(&srv.base),
                repo,
                &layer,
                plan.manifest_clients,
                plan.manifest_per_client,
            )
            .await
        };
        *slot(&mut r.manifests.latency, side) = keep("manifests", measured.await);
    }

    r.peak_rss_kib = Pair {
        vial: servers::proc_status_kib(vial.pid(), "VmHWM"),
        peer: servers::proc_status_kib(peer.pid(), "VmHWM"),
    };
    // The concurrent-push test gets fresh servers, so VmHWM covers only that test.
    vial.stop_and_delete()?;
    peer.stop_and_delete()?;
    if plan.rss_clients > 0 {
        let head = large.data.slice(..large.data.len() - 8);
        let shared = tokio::task::spawn_blocking(move || SharedBody::new(head)).await?;
        drop(sets);
        let n = plan.rss_clients;
        let need = shared.len() * n as u64 + (1 << 30);
        for is_peer in [false, true].into_iter().filter(|p| !p || args.rss_peer) {
            if servers::available_bytes(&work.path).is_some_and(|free| free < need) {
                r.notes.push(format!(
                    "skipped the {n}-client push: under {} GiB free",
                    need >> 30
                ));
                break;
            }
            let dir = work
                .path
                .join(if is_peer { "peer-rss" } else { "vial-rss" });
            let srv = if is_peer {
                servers::start_peer(&args.peer, &dir).await?
            } else {
                servers::start_vial(&args.vial, &dir)?
            };
            eprintln!(
                "vial-bench: {n} clients pushing {} each to {}",
                large_class.label, srv.name
            );
            r.rss_push.extend(keep(
                "concurrent push",
                rss::run(&srv, "bench/rss", &shared, n).await,
            ));
            srv.stop_and_delete()?;
        }
    }

    report::print_tables(&r, &peer_name, &large_class.label);
    report::evaluate(&mut r, &large_class.label);
    report::print_goals(&r);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&r)?)
            .with_context(|| format!("could not write {}", path.display()))?;
        println!("\nfigures written to {}", path.display());
    }
    Ok(())
}
