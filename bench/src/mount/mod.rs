//! The `mount` benchmark: for each volume size, a safetensors checkpoint pushed to one fresh
//! `vial serve` (with vial, and with skopeo to a second repository), then, side by side in one run:
//! mount time, time to first tensor, cold full reads through `vial mount` against `vial pull` and
//! `skopeo copy`, warm reads against local disk, and the mount process's memory.
//! See bench/README.md.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::checkpoint::{Case, Generator};
use crate::mounted::{self, FullRead, MountSpec, MountStats, Mounted};
use crate::pushers::{self, DigestCache};
use crate::report::{self, num};
use crate::run::{machine, sync_disk};
use crate::servers::{self, Server};

mod results;
mod tables;
use results::*;
use tables::{evaluate, notes, print_tables};

#[derive(Debug, Args)]
pub struct MountArgs {
    /// The `vial` binary: it serves the registry, pushes, pulls and mounts.
    #[arg(long)]
    pub vial: PathBuf,
    /// Volume sizes in GiB of tensors, comma-separated. Default 1,8 (0.25,0.5 with --quick).
    #[arg(long, value_delimiter = ',')]
    pub sizes: Vec<f64>,
    /// Safetensors shards for each size, comma-separated. Default 1,4 for 1,8 GiB (1,2 with
    /// --quick); for other sizes, size/2 rounded up.
    #[arg(long, value_delimiter = ',')]
    pub shards: Vec<usize>,
    /// Files read at once in the full reads: each reader thread reads whole files, one after
    /// another, with 4 MiB read(2) calls.
    #[arg(long, default_value_t = 2)]
    pub readers: usize,
    /// Mounts timed per size (fresh cache each; the median is reported).
    #[arg(long, default_value_t = 5)]
    pub mount_runs: usize,
    /// `--cache-size` of every mount (bigger than the largest volume, so nothing is evicted).
    #[arg(long, default_value = "20GiB")]
    pub cache_size: String,
    #[arg(long, default_value = "skopeo")]
    pub skopeo: PathBuf,
    /// Parent of the run's directory (checkpoints, registry data, caches; not tmpfs).
    /// Default: $TMPDIR, /var/tmp or the current directory, whichever is first not on tmpfs.
    #[arg(long)]
    pub workdir: Option<PathBuf>,
    /// Write all figures to this file as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Smoke run of under a minute: 0.25 and 0.5 GiB.
    #[arg(long)]
    pub quick: bool,
    /// Keep the run's directory (checkpoints, registry data, caches, logs).
    #[arg(long)]
    pub keep: bool,
    /// Leave the machine's free page reporting on (see `vial-bench files --help`).
    #[arg(long)]
    pub keep_page_reporting: bool,
}

/// Runs `f` on this thread, letting the runtime move its other tasks elsewhere meanwhile.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Sizes and their shard counts.
fn plan(args: &MountArgs) -> Result<Vec<(f64, usize)>> {
    let (sizes, shards) = if args.sizes.is_empty() {
        if args.quick {
            (vec![0.25, 0.5], vec![1, 2])
        } else {
            (vec![1.0, 8.0], vec![1, 4])
        }
    } else {
        (args.sizes.clone(), Vec::new())
    };
    let shards = if args.shards.is_empty() {
        if shards.is_empty() {
            sizes
                .iter()
                .map(|s| ((s / 2.0).ceil() as usize).max(1))
                .collect()
        } else {
            shards
        }
    } else {
        args.shards.clone()
    };
    if shards.len() != sizes.len() {
        bail!(
            "--shards gives {} counts for {} sizes",
            shards.len(),
            sizes.len()
        );
    }
    for s in &sizes {
        if !s.is_finite() || *s <= 0.0 {
            bail!("sizes must be positive, got {s}");
        }
    }
    Ok(sizes.into_iter().zip(shards).collect())
}

pub async fn mount(mut args: MountArgs) -> Result<()> {
    for program in [&mut args.vial, &mut args.skopeo] {
        *program = pushers::absolute_program(program);
    }
    let plan = plan(&args)?;
    let _pinned = (!args.keep_page_reporting).then(crate::hostmem::Pinned::start);
    let mut r = MountResults {
        machine: machine(),
        quick: args.quick,
        readers: args.readers.max(1),
        read_buf_bytes: mounted::READ_BUF,
        cache_size: args.cache_size.clone(),
        ..MountResults::default()
    };
    r.versions = Versions {
        vial: servers::first_line(&args.vial, &["--version"]),
        skopeo: servers::first_line(&args.skopeo, &["--version"]),
        fusermount3: servers::first_line(Path::new("fusermount3"), &["--version"]),
    };
    let m = &r.machine;
    println!(
        "vial-bench mount{}",
        if args.quick {
            " --quick (smoke run: small sizes, not for publishing)"
        } else {
            ""
        }
    );
    println!("date:     {}", m.date);
    println!("machine:  nproc {}, {}, {}", m.nproc, m.cpu_model, m.kernel);
    let v = &r.versions;
    println!("tools:    {} | {} | {}", v.vial, v.skopeo, v.fusermount3);

    // Can the page cache be dropped? Try once, and keep the evidence.
    r.drop_caches.cached_kib_before = mounted::page_cache_kib();
    match mounted::drop_page_cache() {
        Ok(()) => r.drop_caches.permitted = true,
        Err(e) => r.drop_caches.error = Some(format!("{e:#}")),
    }
    r.drop_caches.cached_kib_after = mounted::page_cache_kib();
    let d = &r.drop_caches;
    let kib = |k: Option<u64>| num(k.map(|k| k as f64 / 1024.0), 0);
    println!(
        "drop_caches: {} (page cache {} MiB before the first drop, {} MiB after)",
        if d.permitted {
            "permitted: `sync; echo 3 > /proc/sys/vm/drop_caches` before every cold measurement"
        } else {
            "NOT permitted: \"cold\" rows may be served from the page cache"
        },
        kib(d.cached_kib_before),
        kib(d.cached_kib_after),
    );
    println!(
        "reads:    {} file(s) at a time, {} MiB read(2) calls, every file to its end",
        r.readers,
        mounted::READ_BUF >> 20
    );

    let parent = args.workdir.clone().unwrap_or_else(servers::default_parent);
    let work = servers::WorkDir::create(&parent, args.keep)?;
    r.workdir_fs = servers::fs_type(&work.path).unwrap_or_else(|| "unknown".into());
    r.workdir = work.path.display().to_string();
    println!("workdir:  {} ({})", work.path.display(), r.workdir_fs);
    if matches!(r.workdir_fs.as_str(), "tmpfs" | "ramfs") {
        r.notes.push(format!(
            "workdir is on {}: disk figures are really memory figures",
            r.workdir_fs
        ));
    }
    // Checkpoint + registry chunks + skopeo's whole-file blobs + one chunk cache + one copy.
    let largest = plan.iter().map(|(s, _)| *s).fold(0.0, f64::max);
    let total: f64 = plan.iter().map(|(s, _)| *s).sum();
    let need = 5.0 * if args.keep { total } else { largest } * GIB + GIB;
    if let Some(free) = servers::available_bytes(&work.path) {
        if (free as f64) < need {
            bail!(
                "{} has {:.1} GiB free; this run needs about {:.1} GiB",
                work.path.display(),
                free as f64 / GIB,
                need / GIB
            );
        }
    }

    for (size, shards) in plan {
        let dir = work.path.join(format!("{size}gib"));
        let mut run = SizeRun {
            size_gib: size,
            shards,
            ..SizeRun::default()
        };
        if let Err(e) = run_size(&args, &r, &dir, &mut run).await {
            eprintln!("vial-bench: {} failed: {e:#}", size_label(size));
            run.errors.push(format!("{e:#}"));
        }
        if !args.keep {
            let _ = std::fs::remove_dir_all(&dir);
        }
        r.sizes.push(run);
    }

    print_tables(&r);
    r.goals = evaluate(&r);
    notes(&mut r);
    report::print_goal_list(&r.goals, &r.notes);
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_vec_pretty(&r)?)
            .with_context(|| format!("could not write {}", path.display()))?;
        println!("\nfigures written to {}", path.display());
    }
    if args.keep {
        println!("kept {}", work.path.display());
    }
    Ok(())
}

/// Everything a size's measurements share.
struct Ctx<'a> {
    args: &'a MountArgs,
    drop_ok: bool,
    readers: usize,
    dir: &'a Path,
    logs: PathBuf,
    server: &'a Server,
    reference: String,
    local_files: Vec<PathBuf>,
    bytes: u64,
}

impl Ctx<'_> {
    /// Drops the page cache if that is permitted; whether it was dropped.
    fn cold(&self) -> bool {
        self.drop_ok && mounted::drop_page_cache().is_ok()
    }

    fn spec(&self, cache: &str, prefetch: &'static str, log: &str) -> MountSpec {
        MountSpec {
            vial: self.args.vial.clone(),
            reference: self.reference.clone(),
            cache_dir: self.dir.join("caches").join(cache),
            cache_size: self.args.cache_size.clone(),
            prefetch,
            log: self.logs.join(format!("mount-{log}.log")),
            extra: Vec::new(),
        }
    }

    fn mountpoint(&self, name: &str) -> PathBuf {
        self.dir.join("mnt").join(name)
    }

    async fn sent(&self) -> Option<u64> {
        pushers::counter(self.server, "vial_bytes_sent_total")
            .await
            .ok()
    }

    fn row(&self, key: &str, label: &str) -> ReadRow {
        ReadRow {
            key: key.into(),
            label: label.into(),
            ..ReadRow::default()
        }
    }

    /// Fills a row's read figures and checks the byte count.
    fn record_read(&self, row: &mut ReadRow, read: &FullRead) {
        row.read_seconds = Some(read.seconds);
        row.bytes_read = Some(read.bytes);
        if read.bytes != self.bytes {
            row.error = Some(format!(
                "read {} bytes, the volume has {}",
                read.bytes, self.bytes
            ));
        }
    }

    fn finish(&self, row: &mut ReadRow) {
        row.mb_s = row.seconds.map(|s| self.bytes as f64 / s.max(1e-9) / 1e6);
    }

    fn remove_cache(&self, name: &str) {
        if !self.args.keep {
            let _ = std::fs::remove_dir_all(self.dir.join("caches").join(name));
        }
    }
}

fn fail(what: &str, errors: &mut Vec<String>, e: &anyhow::Error) {
    eprintln!("vial-bench: {what} failed: {e:#}");
    errors.push(format!("{what}: {e:#}"));
}

async fn run_size(args: &MountArgs, r: &MountResults, dir: &Path, run: &mut SizeRun) -> Result<()> {
    let label = size_label(run.size_gib);
    eprintln!("vial-bench: {label}: generating the checkpoint...");
    let generator = Generator::new((run.size_gib * GIB) as u64, run.shards)?;
    let s = &generator.shape;
    println!(
        "\n{label}: hidden {}, intermediate {}, {} layers, vocab {}, {} bf16 tensors = {:.2} GiB in {} shard(s)",
        s.hidden,
        s.intermediate,
        s.layers,
        s.vocab,
        s.tensors,
        s.tensor_bytes as f64 / GIB,
        run.shards
    );
    run.model = Some(s.clone());
    let ckpt = dir.join("ckpt");
    let g = blocking(|| generator.write(Case::Base, &ckpt, &ckpt))?;
    run.files = g.files;
    run.bytes = g.bytes;
    run.generate_seconds = g.seconds;
    let local_files: Vec<PathBuf> = pushers::file_names(&ckpt)?
        .into_iter()
        .map(|n| ckpt.join(n))
        .collect();

    let server = servers::start_vial(&args.vial, &dir.join("registry"))?;
    let logs = dir.join("logs");
    std::fs::create_dir_all(&logs)?;
    sync_disk();
    eprintln!("vial-bench: {label}: vial push, skopeo copy to the registry...");
    let push = pushers::vial(
        &args.vial,
        &server,
        &ckpt,
        REPO,
        TAG,
        &dir.join("xdg"),
        false,
        &logs.join("push-vial.log"),
    )
    .await
    .context("vial push")?;
    run.pinned = push
        .report
        .as_ref()
        .and_then(|v| v.get("reference")?.as_str().map(str::to_owned));
    run.push = Some(push);
    let layout = dir.join("layout");
    let skopeo_push = async {
        let mut digests = DigestCache::new();
        blocking(|| pushers::build_layout(&ckpt, &layout, TAG, &mut digests))?;
        pushers::skopeo(
            &args.skopeo,
            &server,
            &layout,
            SKOPEO_REPO,
            TAG,
            &logs.join("push-skopeo.log"),
        )
        .await
    };
    match skopeo_push.await {
        Ok(p) => run.skopeo_push = Some(p),
        Err(e) => fail("skopeo push", &mut run.errors, &e),
    }
    let _ = std::fs::remove_dir_all(&layout);
    let host = pushers::host(&server)?;
    run.reference = format!("{host}/{REPO}:{TAG}");

    let cx = Ctx {
        args,
        drop_ok: r.drop_caches.permitted,
        readers: r.readers,
        dir,
        logs,
        server: &server,
        reference: run.reference.clone(),
        local_files,
        bytes: run.bytes,
    };

    eprintln!("vial-bench: {label}: mount time...");
    if let Err(e) = mount_times(&cx, run) {
        fail("mount time", &mut run.errors, &e);
    }
    eprintln!("vial-bench: {label}: time to first tensor...");
    match first_tensor(&cx, run).await {
        Ok(t) => run.first_tensor = Some(t),
        Err(e) => fail("first tensor", &mut run.errors, &e),
    }
    eprintln!("vial-bench: {label}: reads through vial mount (prefetch none), then warm...");
    if let Err(e) = mount_reads(&cx, run).await {
        fail("reads through the mount", &mut run.errors, &e);
    }
    eprintln!("vial-bench: {label}: read through vial mount --prefetch all...");
    let row = prefetch_all(&cx, run).await;
    run.reads.push(row);
    eprintln!("vial-bench: {label}: vial pull...");
    run.reads.push(pull(&cx).await);
    eprintln!("vial-bench: {label}: skopeo copy...");
    run.reads.push(skopeo_copy(&cx).await);
    eprintln!("vial-bench: {label}: local disk...");
    local_reads(&cx, run);
    drop(cx);
    if args.keep {
        drop(server);
    } else {
        server.stop_and_delete()?;
    }
    Ok(())
}

/// `--mount-runs` mounts, each on a fresh empty cache, timed to ready and to `ls -lR` done, after
/// one untimed mount.
fn mount_times(cx: &Ctx, run: &mut SizeRun) -> Result<()> {
    // One untimed mount first, so the vial binary is in the page cache and the registry warm.
    let m = Mounted::mount(
        &cx.spec("warm-up", "none", "warm-up"),
        &cx.mountpoint("warm-up"),
    )?;
    m.unmount()?;
    cx.remove_cache("warm-up");
    for i in 0..cx.args.mount_runs.max(1) {
        let name = format!("time-{i}");
        let m = Mounted::mount(&cx.spec(&name, "none", &name), &cx.mountpoint(&name))?;
        let ls = Command::new("ls")
            .arg("-lR")
            .arg(&m.mountpoint)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let mount_ls_ms = m.started.elapsed().as_secs_f64() * 1000.0;
        if !ls?.success() {
            bail!("ls -lR {} failed", m.mountpoint.display());
        }
        run.mounted_reference = Some(m.pinned.clone());
        run.mounts.push(MountTime {
            mount_ms: m.seconds * 1000.0,
            mount_ls_ms,
            rss_kib: m.vmrss_kib(),
        });
        m.unmount()?;
        cx.remove_cache(&name);
    }
    let ms: Vec<f64> = run.mounts.iter().map(|m| m.mount_ms).collect();
    let ls: Vec<f64> = run.mounts.iter().map(|m| m.mount_ls_ms).collect();
    run.mount_ms_median = median(&ms);
    run.mount_ls_ms_median = median(&ls);
    Ok(())
}

/// A fresh mount on an empty cache; the header of the last shard, then one tensor of a few MiB
/// from its middle.
async fn first_tensor(cx: &Ctx<'_>, run: &mut SizeRun) -> Result<FirstTensor> {
    let shard = cx
        .local_files
        .iter()
        .rfind(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .context("the checkpoint has no .safetensors file")?
        .clone();
    let name = shard.file_name().context("shard has no name")?.to_owned();
    let dropped = cx.cold();
    let before = cx.sent().await;
    let m = Mounted::mount(
        &cx.spec("first-tensor", "none", "first-tensor"),
        &cx.mountpoint("first-tensor"),
    )?;
    let after_mount = m.vmrss_kib();
    let read = blocking(|| mounted::read_one_tensor(&m.mountpoint.join(&name), &shard));
    let mount_to_tensor_ms = m.started.elapsed().as_secs_f64() * 1000.0;
    let read = read?;
    // Readahead behind the tensor may still be arriving: let it land before reading the counters.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let stats = m.stats().ok();
    let after = cx.sent().await;
    run.rss.push(RssRow {
        phase: "first tensor (fresh mount, empty cache)".into(),
        after_mount_kib: after_mount,
        peak_kib: None,
        hwm_kib: m.vmhwm_kib(),
    });
    let mount_ms = m.seconds * 1000.0;
    m.unmount()?;
    cx.remove_cache("first-tensor");
    if !read.matches_local {
        bail!(
            "tensor {} read through the mount differs from the original file",
            read.tensor
        );
    }
    Ok(FirstTensor {
        mount_ms,
        read,
        mount_to_tensor_ms,
        stats,
        registry_bytes_sent: after.zip(before).map(|(a, b)| a.saturating_sub(b)),
        page_cache_dropped: dropped,
    })
}

/// Reads every file through `m` into `row` (bytes, read seconds, `.vial-stats` and the deltas
/// against `before`, the mount process's CPU time) and returns the memory figures.
fn read_through(
    cx: &Ctx,
    m: &Mounted,
    row: &mut ReadRow,
    before: Option<&MountStats>,
) -> Result<(Option<u64>, Option<u64>)> {
    let files = mounted::files_under(&m.mountpoint)?;
    let cpu = m.cpu_seconds();
    let (read, peak) = blocking(|| m.read_files(&files, cx.readers))?;
    row.mount_cpu_seconds = m.cpu_seconds().zip(cpu).map(|(a, b)| a - b);
    cx.record_read(row, &read);
    row.stats = m.stats().ok();
    if let Some(now) = &row.stats {
        row.fetched = Some(now.bytes_fetched - before.map_or(0, |b| b.bytes_fetched));
        row.daemon_bytes_read = Some(now.bytes_read - before.map_or(0, |b| b.bytes_read));
    }
    Ok((peak, m.vmhwm_kib()))
}

/// Cold read (prefetch none) on a fresh mount; the same mount again (page cache, best of 3); the
/// same mount with its files evicted from the page cache (FUSE and the node cache, chunks already
/// verified); a new mount on the now warm node cache; and (if the page cache can be dropped) a
/// new mount on the node cache with the page cache dropped.
async fn mount_reads(cx: &Ctx<'_>, run: &mut SizeRun) -> Result<()> {
    let cache = "cold";
    // 1. Cold, prefetch none.
    let mut row = cx.row(
        MOUNT_NONE,
        "vial mount --prefetch none (mount + read, empty cache)",
    );
    row.page_cache_dropped = cx.cold();
    let before = cx.sent().await;
    let m = Mounted::mount(&cx.spec(cache, "none", "cold"), &cx.mountpoint("cold"))?;
    run.read_ahead_kb = m.read_ahead_kb();
    let after_mount = m.vmrss_kib();
    let (peak, hwm) = read_through(cx, &m, &mut row, None)?;
    row.seconds = Some(m.started.elapsed().as_secs_f64());
    row.mount_seconds = Some(m.seconds);
    row.registry_bytes_sent = cx
        .sent()
        .await
        .zip(before)
        .map(|(a, b)| a.saturating_sub(b));
    cx.finish(&mut row);
    run.rss.push(RssRow {
        phase: "cold read, prefetch none".into(),
        after_mount_kib: after_mount,
        peak_kib: peak,
        hwm_kib: hwm,
    });
    let mut last = row.stats.clone();
    run.reads.push(row);

    // 2. The same mount again: the kernel's page cache (FOPEN_KEEP_CACHE). Best of 3.
    let mut best: Option<ReadRow> = None;
    let mut peak_all = None;
    for _ in 0..3 {
        let mut row = cx.row(PAGE_CACHE, "same mount, read again (page cache; best of 3)");
        let (peak, _) = read_through(cx, &m, &mut row, last.as_ref())?;
        peak_all = peak_all.max(peak);
        row.seconds = row.read_seconds;
        last = row.stats.clone();
        cx.finish(&mut row);
        if best.as_ref().is_none_or(|b| b.seconds > row.seconds) {
            best = Some(row);
        }
    }
    run.reads.extend(best);
    run.rss.push(RssRow {
        phase: "same mount, reads 2-4 (page cache)".into(),
        after_mount_kib: None,
        peak_kib: peak_all,
        hwm_kib: m.vmhwm_kib(),
    });

    // 3. The same mount, its files evicted from the page cache: every read goes to the daemon,
    // whose chunks are verified and whose chunk files are still in the page cache.
    let mut row = cx.row(
        DAEMON,
        "same mount, its pages evicted (FUSE reads, chunks verified)",
    );
    blocking(|| mounted::evict_files(&mounted::files_under(&m.mountpoint)?))?;
    let (peak, hwm) = read_through(cx, &m, &mut row, last.as_ref())?;
    row.seconds = row.read_seconds;
    cx.finish(&mut row);
    run.rss.push(RssRow {
        phase: "same mount, pages evicted (FUSE reads)".into(),
        after_mount_kib: None,
        peak_kib: peak,
        hwm_kib: hwm,
    });
    run.reads.push(row);
    m.unmount()?;

    // 4. A new mount of the same version on the warm node cache.
    let phases = [
        (
            NODE_CACHE,
            "new mount, warm node cache (read only)",
            "new mount, warm node cache",
            false,
        ),
        (
            NODE_CACHE_DROPPED,
            "new mount, node cache, page cache dropped (read only)",
            "new mount, node cache, page cache dropped",
            true,
        ),
    ];
    for (key, label, phase, drop_first) in phases {
        if drop_first && !cx.drop_ok {
            continue;
        }
        let mut row = cx.row(key, label);
        row.page_cache_dropped = drop_first && cx.cold();
        let m = Mounted::mount(&cx.spec(cache, "none", key), &cx.mountpoint(key))?;
        if !drop_first {
            run.mount_warm_cache_ms = Some(m.seconds * 1000.0);
        }
        let after_mount = m.vmrss_kib();
        let (peak, hwm) = read_through(cx, &m, &mut row, None)?;
        row.seconds = row.read_seconds;
        row.mount_seconds = Some(m.seconds);
        cx.finish(&mut row);
        run.rss.push(RssRow {
            phase: phase.into(),
            after_mount_kib: after_mount,
            peak_kib: peak,
            hwm_kib: hwm,
        });
        run.reads.push(row);
        m.unmount()?;
    }
    cx.remove_cache(cache);
    Ok(())
}

async fn prefetch_all(cx: &Ctx<'_>, run: &mut SizeRun) -> ReadRow {
    let mut row = cx.row(
        MOUNT_ALL,
        "vial mount --prefetch all (mount + read, empty cache)",
    );
    let result = async {
        row.page_cache_dropped = cx.cold();
        let before = cx.sent().await;
        let m = Mounted::mount(&cx.spec("all", "all", "all"), &cx.mountpoint("all"))?;
        let after_mount = m.vmrss_kib();
        let (peak, hwm) = read_through(cx, &m, &mut row, None)?;
        row.seconds = Some(m.started.elapsed().as_secs_f64());
        row.mount_seconds = Some(m.seconds);
        row.registry_bytes_sent = cx
            .sent()
            .await
            .zip(before)
            .map(|(a, b)| a.saturating_sub(b));
        run.rss.push(RssRow {
            phase: "cold read, prefetch all".into(),
            after_mount_kib: after_mount,
            peak_kib: peak,
            hwm_kib: hwm,
        });
        m.unmount()
    }
    .await;
    cx.remove_cache("all");
    if let Err(e) = result {
        fail("read with --prefetch all", &mut run.errors, &e);
        row.error = Some(format!("{e:#}"));
    }
    cx.finish(&mut row);
    row
}

async fn pull(cx: &Ctx<'_>) -> ReadRow {
    let mut row = cx.row(PULL, "vial pull (into an empty directory)");
    let dest = cx.dir.join("pulled");
    let result = async {
        row.page_cache_dropped = cx.cold();
        let before = cx.sent().await;
        let mut cmd = Command::new(&cx.args.vial);
        cmd.arg("pull")
            .arg(&cx.reference)
            .arg(&dest)
            .arg("--json")
            .env("VIAL_LOG", "warn");
        let (seconds, stdout) = blocking(|| mounted::timed(&mut cmd, &cx.logs.join("pull.log")))?;
        row.seconds = Some(seconds);
        row.registry_bytes_sent = cx
            .sent()
            .await
            .zip(before)
            .map(|(a, b)| a.saturating_sub(b));
        let report: serde_json::Value =
            serde_json::from_slice(&stdout).context("vial pull printed no JSON report")?;
        row.fetched = report.get("bytes_downloaded").and_then(|v| v.as_u64());
        row.bytes_read = report.get("bytes").and_then(|v| v.as_u64());
        row.report = Some(report);
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        eprintln!("vial-bench: vial pull failed: {e:#}");
        row.error = Some(format!("{e:#}"));
    }
    let _ = std::fs::remove_dir_all(&dest);
    cx.finish(&mut row);
    row
}

async fn skopeo_copy(cx: &Ctx<'_>) -> ReadRow {
    let mut row = cx.row(SKOPEO, "skopeo copy (to an oci: layout)");
    let dest = cx.dir.join("skopeo-copy");
    let result = async {
        row.page_cache_dropped = cx.cold();
        let before = cx.sent().await;
        let host = pushers::host(cx.server)?;
        let mut cmd = Command::new(&cx.args.skopeo);
        cmd.args([
            "--insecure-policy",
            "copy",
            "--src-tls-verify=false",
            "--preserve-digests",
        ])
        .arg(format!("docker://{host}/{SKOPEO_REPO}:{TAG}"))
        .arg(format!("oci:{}:{TAG}", dest.display()));
        let (seconds, _) = blocking(|| mounted::timed(&mut cmd, &cx.logs.join("skopeo-copy.log")))?;
        row.seconds = Some(seconds);
        row.registry_bytes_sent = cx
            .sent()
            .await
            .zip(before)
            .map(|(a, b)| a.saturating_sub(b));
        row.fetched = row.registry_bytes_sent;
        anyhow::Ok(())
    }
    .await;
    if let Err(e) = result {
        eprintln!("vial-bench: skopeo copy failed: {e:#}");
        row.error = Some(format!("{e:#}"));
    }
    let _ = std::fs::remove_dir_all(&dest);
    cx.finish(&mut row);
    row
}

/// The original files: cold (page cache dropped, if permitted) and warm (second of two reads).
fn local_reads(cx: &Ctx, run: &mut SizeRun) {
    if cx.drop_ok {
        let mut row = cx.row(LOCAL_COLD, "local disk, page cache dropped");
        row.page_cache_dropped = cx.cold();
        match blocking(|| mounted::read_files(&cx.local_files, cx.readers)) {
            Ok(read) => {
                row.seconds = Some(read.seconds);
                cx.record_read(&mut row, &read);
            }
            Err(e) => row.error = Some(format!("{e:#}")),
        }
        cx.finish(&mut row);
        run.reads.push(row);
    }
    let mut row = cx.row(LOCAL_WARM, "local disk, page cache warm (best of 3)");
    let reads = blocking(|| {
        mounted::read_files(&cx.local_files, cx.readers)?;
        let mut best: Option<FullRead> = None;
        for _ in 0..3 {
            let r = mounted::read_files(&cx.local_files, cx.readers)?;
            if best.is_none_or(|b| b.seconds > r.seconds) {
                best = Some(r);
            }
        }
        best.context("no read")
    });
    match reads {
        Ok(read) => {
            row.seconds = Some(read.seconds);
            cx.record_read(&mut row, &read);
        }
        Err(e) => row.error = Some(format!("{e:#}")),
    }
    cx.finish(&mut row);
    run.reads.push(row);
}
#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        args: MountArgs,
    }

    fn plan_of(argv: &[&str]) -> Result<Vec<(f64, usize)>> {
        let cli = Cli::try_parse_from(["x", "--vial", "v"].iter().chain(argv))?;
        plan(&cli.args)
    }

    #[test]
    fn sizes_and_shards() {
        assert_eq!(plan_of(&[]).unwrap(), [(1.0, 1), (8.0, 4)]);
        assert_eq!(plan_of(&["--quick"]).unwrap(), [(0.25, 1), (0.5, 2)]);
        assert_eq!(
            plan_of(&["--sizes", "2,5,0.5"]).unwrap(),
            [(2.0, 1), (5.0, 3), (0.5, 1)]
        );
        assert_eq!(
            plan_of(&["--sizes", "1,2", "--shards", "2,2"]).unwrap(),
            [(1.0, 2), (2.0, 2)]
        );
        assert!(plan_of(&["--sizes", "1,2", "--shards", "2"]).is_err());
        assert!(plan_of(&["--sizes", "0"]).is_err());
    }
}
