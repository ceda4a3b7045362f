//! What the mount benchmark does to a `vial mount`: mounting it as a guard that unmounts on drop,
//! finding the mount process in /proc, reading its `.vial-stats`, reading files through it (or
//! from local disk) with large buffers, reading one tensor, dropping the page cache, and detaching
//! whatever a node left mounted.

use std::fs::{self, File};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::rss;
use crate::servers::{log_tail, proc_status_kib};

/// Bytes per read(2) in the full reads.
pub const READ_BUF: usize = 4 << 20;
/// The mount process is sampled this often while files are read through it.
const RSS_EVERY: Duration = Duration::from_millis(50);
/// The hidden statistics file at the root of a mount.
pub const STATS_FILE: &str = ".vial-stats";

/// `.vial-stats`, as the mount serves it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct MountStats {
    pub chunks_fetched: u64,
    pub bytes_fetched: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub evictions: u64,
    pub fetch_errors: u64,
    pub bytes_read: u64,
    pub prefetched_chunks: u64,
    pub cache_bytes: u64,
    pub cache_limit: u64,
}

/// How to mount: everything but the mountpoint.
#[derive(Debug, Clone)]
pub struct MountSpec {
    pub vial: PathBuf,
    pub reference: String,
    pub cache_dir: PathBuf,
    pub cache_size: String,
    pub prefetch: &'static str,
    pub log: PathBuf,
    /// More `vial mount` arguments (`--mirror`, `--timeout`).
    pub extra: Vec<String>,
}

/// A mounted version. Dropping it unmounts lazily and makes sure the mount process has gone.
#[derive(Debug)]
pub struct Mounted {
    vial: PathBuf,
    pub mountpoint: PathBuf,
    /// The background mount process (cmdline has `--foreground` and the mountpoint).
    pub pid: Option<u32>,
    /// Wall time of `vial mount`, process start to exit (it returns when the mount is ready).
    pub seconds: f64,
    /// When `vial mount` was started.
    pub started: Instant,
    /// What `vial mount` printed: the pinned reference.
    pub pinned: String,
    log: PathBuf,
    mounted: bool,
}

impl Mounted {
    /// `vial mount REF MOUNTPOINT --cache-dir … --cache-size … --prefetch … --log-file …`, timed.
    pub fn mount(spec: &MountSpec, mountpoint: &Path) -> Result<Mounted> {
        fs::create_dir_all(mountpoint)
            .with_context(|| format!("could not create {}", mountpoint.display()))?;
        let mp = mountpoint.canonicalize()?;
        if let Some(dir) = spec.log.parent() {
            fs::create_dir_all(dir)?;
        }
        let mut cmd = Command::new(&spec.vial);
        cmd.arg("mount")
            .arg(&spec.reference)
            .arg(&mp)
            .arg("--cache-dir")
            .arg(&spec.cache_dir)
            .args([
                "--cache-size",
                &spec.cache_size,
                "--prefetch",
                spec.prefetch,
            ])
            .arg("--log-file")
            .arg(&spec.log)
            .args(&spec.extra)
            .stdin(Stdio::null());
        let started = Instant::now();
        let out = cmd
            .output()
            .with_context(|| format!("could not run {}", spec.vial.display()))?;
        let seconds = started.elapsed().as_secs_f64();
        if !out.status.success() {
            if is_mounted(&mp) {
                lazy_unmount(&spec.vial, &mp);
            }
            bail!(
                "vial mount failed ({}): {}; end of {}:\n{}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim(),
                spec.log.display(),
                log_tail(&spec.log)
            );
        }
        let mut m = Mounted {
            vial: spec.vial.clone(),
            mountpoint: mp,
            pid: None,
            seconds,
            started,
            pinned: String::from_utf8_lossy(&out.stdout).trim().to_string(),
            log: spec.log.clone(),
            mounted: true,
        };
        m.pid = find_mount_process(&m.mountpoint);
        Ok(m)
    }

    pub fn stats(&self) -> Result<MountStats> {
        let path = self.mountpoint.join(STATS_FILE);
        let text = fs::read_to_string(&path)
            .with_context(|| format!("could not read {}", path.display()))?;
        Ok(serde_json::from_str(&text)?)
    }

    pub fn vmrss_kib(&self) -> Option<u64> {
        proc_status_kib(self.pid?, "VmRSS")
    }

    pub fn vmhwm_kib(&self) -> Option<u64> {
        proc_status_kib(self.pid?, "VmHWM")
    }

    /// User + system CPU seconds the mount process has used so far.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = fs::read_to_string(format!("/proc/{}/stat", self.pid?)).ok()?;
        // Fields after the command name (in parentheses, which may contain spaces).
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime and stime are fields 14 and 15 of the whole line: 12 and 13 after the name.
        let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        Some(ticks as f64 / clock_ticks())
    }

    /// The kernel's readahead on this mount (`/sys/class/bdi/MAJ:MIN/read_ahead_kb`), KiB.
    pub fn read_ahead_kb(&self) -> Option<u64> {
        let info = fs::read_to_string("/proc/self/mountinfo").ok()?;
        let mp = self.mountpoint.to_string_lossy();
        let dev = info.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(4) == Some(&mp.as_ref())).then(|| f.get(2).map(|d| d.to_string()))?
        })?;
        fs::read_to_string(format!("/sys/class/bdi/{dev}/read_ahead_kb"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Reads `files` (paths under the mountpoint) while sampling the mount process's VmRSS.
    pub fn read_files(&self, files: &[PathBuf], readers: usize) -> Result<(FullRead, Option<u64>)> {
        let stop = Arc::new(AtomicBool::new(false));
        let sampling = self
            .pid
            .map(|pid| rss::sampler(pid, Arc::clone(&stop), RSS_EVERY));
        let read = read_files(files, readers);
        stop.store(true, Ordering::Relaxed);
        let peak = match sampling {
            Some(h) => Some(h.join().map_err(|_| anyhow!("RSS sampler panicked"))?.0),
            None => None,
        };
        Ok((read?, peak.filter(|k| *k > 0)))
    }

    /// `vial umount MOUNTPOINT` (then `--lazy` if that fails), and waits for the mount process to
    /// exit.
    pub fn unmount(mut self) -> Result<()> {
        self.mounted = false;
        let out = Command::new(&self.vial)
            .arg("umount")
            .arg(&self.mountpoint)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            lazy_unmount(&self.vial, &self.mountpoint);
            self.finish_process();
            bail!(
                "vial umount {} failed: {}",
                self.mountpoint.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        self.finish_process();
        Ok(())
    }

    /// Waits for the mount process to exit after an unmount; SIGTERM (by pid) if it lingers.
    fn finish_process(&self) {
        let Some(pid) = self.pid else { return };
        if wait_gone(pid, Duration::from_secs(10)) {
            return;
        }
        eprintln!(
            "vial-bench: mount process {pid} still running after unmounting {}; sending SIGTERM (log {})",
            self.mountpoint.display(),
            self.log.display()
        );
        let _ = Command::new("kill")
            .arg(pid.to_string())
            .stderr(Stdio::null())
            .status();
        wait_gone(pid, Duration::from_secs(5));
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if self.mounted {
            lazy_unmount(&self.vial, &self.mountpoint);
            self.finish_process();
        }
    }
}

/// `getconf CLK_TCK`, the unit of /proc/PID/stat's times (100 if unknown).
fn clock_ticks() -> f64 {
    static TICKS: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        crate::servers::first_line(Path::new("getconf"), &["CLK_TCK"])
            .parse()
            .unwrap_or(100.0)
    })
}

/// Drops the page cache of each file alone (`dd iflag=nocache count=0`: posix_fadvise
/// DONTNEED on the whole file), leaving every other file's cached pages alone.
pub fn evict_files(files: &[PathBuf]) -> Result<()> {
    for f in files {
        let status = Command::new("dd")
            .arg(format!("if={}", f.display()))
            .args(["iflag=nocache", "count=0", "status=none"])
            .stdin(Stdio::null())
            .status()
            .context("could not run dd")?;
        if !status.success() {
            bail!("dd iflag=nocache {} failed ({status})", f.display());
        }
    }
    Ok(())
}

fn lazy_unmount(vial: &Path, mountpoint: &Path) {
    let _ = Command::new(vial)
        .args(["umount", "--lazy"])
        .arg(mountpoint)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Whether `path` is a mountpoint in /proc/mounts.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(mounts) = fs::read_to_string("/proc/mounts") else {
        return false;
    };
    let p = path.to_string_lossy();
    mounts
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(p.as_ref()))
}

/// The process whose command line has `--foreground` and the (canonical) mountpoint.
pub fn find_mount_process(mountpoint: &Path) -> Option<u32> {
    let mp = mountpoint.to_string_lossy();
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
        let has = |s: &str| args.contains(&s.as_bytes());
        (has("--foreground") && has(&mp) && has("mount") && alive(pid)).then_some(pid)
    })
}

/// Whether the process exists and is not a zombie.
fn alive(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/status")) {
        Ok(s) => !s
            .lines()
            .any(|l| l.starts_with("State:") && l.contains('Z')),
        Err(_) => false,
    }
}

fn wait_gone(pid: u32, limit: Duration) -> bool {
    let started = Instant::now();
    while alive(pid) {
        if started.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    true
}

/// One full read of a set of files.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct FullRead {
    pub bytes: u64,
    pub seconds: f64,
}

/// Reads every file to the end with [`READ_BUF`]-byte reads, `readers` files at a time (each
/// reader thread takes the next file in the list), and returns the bytes and the wall time.
pub fn read_files(files: &[PathBuf], readers: usize) -> Result<FullRead> {
    let next = AtomicUsize::new(0);
    let started = Instant::now();
    let results: Vec<Result<u64>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..readers.clamp(1, files.len().max(1)))
            .map(|_| {
                scope.spawn(|| -> Result<u64> {
                    let mut buf = vec![0u8; READ_BUF];
                    let mut total = 0u64;
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(path) = files.get(i) else {
                            return Ok(total);
                        };
                        let mut f = File::open(path)
                            .with_context(|| format!("could not open {}", path.display()))?;
                        loop {
                            let n = f
                                .read(&mut buf)
                                .with_context(|| format!("could not read {}", path.display()))?;
                            if n == 0 {
                                break;
                            }
                            total += n as u64;
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("reader thread panicked")))
            })
            .collect()
    });
    let seconds = started.elapsed().as_secs_f64();
    let mut bytes = 0;
    for r in results {
        bytes += r?;
    }
    Ok(FullRead { bytes, seconds })
}

/// Regular files under `root`, recursively, sorted, without the mount's statistics file.
pub fn files_under(root: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for e in fs::read_dir(&dir).with_context(|| format!("could not list {}", dir.display()))? {
            let e = e?;
            let kind = e.file_type()?;
            if kind.is_dir() {
                dirs.push(e.path());
            } else if kind.is_file() && e.file_name() != STATS_FILE {
                out.push(e.path());
            }
        }
    }
    out.sort();
    Ok(out)
}

/// One tensor read through a fresh mount.
#[derive(Clone, Debug, Default, Serialize)]
pub struct TensorRead {
    pub file: String,
    pub tensor: String,
    pub tensor_bytes: u64,
    pub tensor_offset: u64,
    pub file_bytes: u64,
    pub header_bytes: u64,
    /// open + 8-byte length + JSON header + parse.
    pub header_ms: f64,
    /// The tensor's bytes alone, one pread of its whole length.
    pub tensor_ms: f64,
    pub header_and_tensor_ms: f64,
    /// The bytes read match the original file's.
    pub matches_local: bool,
}

/// Parses the safetensors header of `file` (through the mount) and reads the tensor chosen by
/// [`choose_tensor`], timing each part; compares the bytes with `local`, the original file.
pub fn read_one_tensor(file: &Path, local: &Path) -> Result<TensorRead> {
    let t0 = Instant::now();
    let f = File::open(file).with_context(|| format!("could not open {}", file.display()))?;
    let size = f.metadata()?.len();
    let mut first8 = [0u8; 8];
    f.read_exact_at(&mut first8, 0)?;
    let n = vial_core::safetensors::header_len(&first8, size)?;
    let mut json = vec![0u8; usize::try_from(n)?];
    f.read_exact_at(&mut json, 8)?;
    let spans = vial_core::safetensors::parse_header(&json, size)?;
    let (name, start, end) = choose_tensor(&spans, 8 + n, size)
        .with_context(|| format!("{} has no tensors", file.display()))?;
    let t1 = Instant::now();
    let mut buf = vec![0u8; usize::try_from(end - start)?];
    f.read_exact_at(&mut buf, start)?;
    let t2 = Instant::now();
    let mut expected = vec![0u8; buf.len()];
    File::open(local)
        .with_context(|| format!("could not open {}", local.display()))?
        .read_exact_at(&mut expected, start)?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    Ok(TensorRead {
        file: file
            .file_name()
            .map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        tensor: name,
        tensor_bytes: end - start,
        tensor_offset: start,
        file_bytes: size,
        header_bytes: 8 + n,
        header_ms: ms(t1 - t0),
        tensor_ms: ms(t2 - t1),
        header_and_tensor_ms: ms(t2 - t0),
        matches_local: buf == expected,
    })
}

/// "A tensor of a few MiB from the middle of the file": among tensors of at least 1 MiB, the size
/// nearest 4 MiB (on a log scale), and of those the one whose middle is nearest the middle of the
/// file's data. Falls back to the largest tensor.
pub fn choose_tensor(
    spans: &[vial_core::safetensors::TensorSpan],
    data_start: u64,
    file_size: u64,
) -> Option<(String, u64, u64)> {
    const TARGET: f64 = (4u64 << 20) as f64;
    let len = |s: &vial_core::safetensors::TensorSpan| s.end - s.start;
    let far = |s: &vial_core::safetensors::TensorSpan| (len(s) as f64 / TARGET).ln().abs();
    let big: Vec<_> = spans.iter().filter(|s| len(s) >= 1 << 20).collect();
    let best_size = big
        .iter()
        .min_by(|a, b| far(a).total_cmp(&far(b)))
        .map(|s| len(s));
    let middle = (data_start + file_size) / 2;
    let off_middle =
        |s: &vial_core::safetensors::TensorSpan| (s.start + len(s) / 2).abs_diff(middle);
    let pick = match best_size {
        Some(size) => big
            .into_iter()
            .filter(|s| len(s) == size)
            .min_by_key(|s| off_middle(s)),
        None => spans.iter().max_by_key(|s| len(s)),
    }?;
    Some((pick.name.clone(), pick.start, pick.end))
}

/// `sync`, then `echo 3 > /proc/sys/vm/drop_caches`.
pub fn drop_page_cache() -> Result<()> {
    let _ = Command::new("sync").status();
    fs::write("/proc/sys/vm/drop_caches", "3").context("could not write /proc/sys/vm/drop_caches")
}

/// `Cached:` of /proc/meminfo, KiB.
pub fn page_cache_kib() -> Option<u64> {
    meminfo_kib("Cached:")
}

/// A field of /proc/meminfo (`"MemFree:"`, say), KiB.
pub fn meminfo_kib(field: &str) -> Option<u64> {
    let mut s = String::new();
    File::open("/proc/meminfo")
        .ok()?
        .read_to_string(&mut s)
        .ok()?;
    s.lines().find_map(|l| {
        l.strip_prefix(field)?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// Runs a command to completion, timed from spawn to exit; its stdout is returned, its stderr
/// goes to `log`.
pub fn timed(cmd: &mut Command, log: &Path) -> Result<(f64, Vec<u8>)> {
    if let Some(dir) = log.parent() {
        fs::create_dir_all(dir)?;
    }
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(File::create(log)?)
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("no_proxy", "127.0.0.1,localhost");
    let started = Instant::now();
    let out = cmd
        .output()
        .with_context(|| format!("could not run {:?}", cmd.get_program()))?;
    let seconds = started.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "{:?} failed ({}); end of {}:\n{}",
            cmd.get_program(),
            out.status,
            log.display(),
            log_tail(log)
        );
    }
    Ok((seconds, out.stdout))
}

/// Detaches whatever is mounted under `dir` (a node's snapshots and volumes).
pub(crate) fn unmount_under(dir: &Path) {
    let prefix = dir.display().to_string();
    if let Ok(mounts) = std::fs::read_to_string("/proc/mounts") {
        for target in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
            if target.starts_with(&prefix) {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(target)
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vial_core::safetensors::TensorSpan;

    fn span(name: &str, start: u64, len: u64) -> TensorSpan {
        TensorSpan {
            name: name.into(),
            start,
            end: start + len,
        }
    }

    #[test]
    fn the_tensor_is_a_few_mib_from_the_middle() {
        let mib = 1u64 << 20;
        let spans = vec![
            span("norm.0", 100, 4096),
            span("q.0", 100 + 4096, 4 * mib),
            span("mlp.0", 100 + 4096 + 4 * mib, 12 * mib),
            span("q.1", 100 + 4096 + 16 * mib, 4 * mib),
            span("q.2", 100 + 4096 + 20 * mib, 4 * mib),
            span("norm.1", 100 + 4096 + 24 * mib, 4096),
        ];
        let size = 100 + 8192 + 24 * mib;
        let (name, start, end) = choose_tensor(&spans, 100, size).unwrap();
        assert_eq!((name.as_str(), end - start), ("q.1", 4 * mib));
        // Only small tensors: the largest one.
        let small = vec![span("a", 8, 10), span("b", 18, 30)];
        assert_eq!(choose_tensor(&small, 8, 48).unwrap().0, "b");
        assert!(choose_tensor(&[], 8, 8).is_none());
    }
}
