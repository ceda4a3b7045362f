//! How the `tree` benchmark runs a client: with the open-file limit at [`NOFILE`] (soft and hard,
//! so the client cannot raise it), timed by `/usr/bin/time` (whose `wait4` gives the CPU seconds
//! and the peak RSS), while a thread counts the descriptors the process holds in /proc.

use std::fs::{self, File};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde::Serialize;

use crate::servers::log_tail;

/// The open-file limit every client runs with: what a default Linux session gives a program.
pub const NOFILE: usize = 1024;
/// How often the descriptors of a watched process are counted.
const EVERY: Duration = Duration::from_millis(20);
/// What a program that runs out of descriptors says (EMFILE), in a log.
const EMFILE: [&str; 2] = ["Too many open files", "os error 24"];

/// The `sh -c` script that lowers the limit and becomes the program (`$0`, with its arguments).
pub fn limit_script() -> String {
    format!("ulimit -n {NOFILE} && exec \"$0\" \"$@\"")
}

/// What one client process took, or several run one after the other.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct Run {
    pub seconds: f64,
    /// User + system CPU seconds.
    pub cpu: f64,
    pub rss_mib: f64,
    /// The most descriptors the process was seen holding.
    pub fds: usize,
    /// Its log says it ran out of descriptors (it may have retried and succeeded).
    pub emfile: bool,
}

impl Run {
    /// This run, then `next` (tar, then the push): times add up, peaks are the higher one's.
    pub fn then(self, next: Run) -> Run {
        Run {
            seconds: self.seconds + next.seconds,
            cpu: self.cpu + next.cpu,
            rss_mib: self.rss_mib.max(next.rss_mib),
            fds: self.fds.max(next.fds),
            emfile: self.emfile || next.emfile,
        }
    }
}

/// Whether a log says its program ran out of descriptors.
pub fn log_says_emfile(log: &Path) -> bool {
    fs::read_to_string(log).is_ok_and(|text| EMFILE.iter().any(|e| text.contains(e)))
}

/// Runs `program args` as `sh -c 'ulimit -n 1024 && exec "$0" "$@"' program args` under
/// `/usr/bin/time`, its stderr to `log`, counting its descriptors while it runs.
pub fn limited(program: &Path, args: &[String], env: &[(&str, String)], log: &Path) -> Result<Run> {
    let times = log.with_extension("time");
    let mut cmd = Command::new("/usr/bin/time");
    cmd.args(["-f", "%U %S %M", "-o"])
        .arg(&times)
        .args(["sh", "-c", &limit_script()])
        .arg(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("VIAL_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(File::create(log)?);
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("could not run {}", program.display()))?;
    // time's only child is the shell, which becomes the program.
    let watch = Watch::start(Target::ChildOf(child.id()));
    let status = child.wait()?;
    let seconds = started.elapsed().as_secs_f64();
    let fds = watch.stop()?;
    if !status.success() {
        bail!(
            "{} failed ({status}); end of {}:\n{}",
            program.display(),
            log.display(),
            log_tail(log)
        );
    }
    let text = fs::read_to_string(&times)?;
    // On failure time writes a line before the figures; the figures are the last line.
    let v: Vec<f64> = text
        .lines()
        .last()
        .unwrap_or("")
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let [user, sys, rss_kib] = v.as_slice() else {
        bail!("unreadable /usr/bin/time output {text:?}");
    };
    Ok(Run {
        seconds,
        cpu: user + sys,
        rss_mib: rss_kib / 1024.0,
        fds,
        emfile: log_says_emfile(log),
    })
}

/// The process a [`Watch`] counts the descriptors of.
#[derive(Clone, Copy, Debug)]
pub enum Target {
    Pid(u32),
    /// The child of this process, once it has one (found by its parent pid in /proc).
    ChildOf(u32),
}

/// A thread counting the entries of /proc/PID/fd every [`EVERY`] until stopped; it keeps the
/// highest count. Dropping it stops the thread.
#[derive(Debug)]
pub struct Watch {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<usize>>,
}

impl Watch {
    pub fn start(target: Target) -> Watch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut pid = match target {
                Target::Pid(pid) => Some(pid),
                Target::ChildOf(_) => None,
            };
            let mut most = 0;
            loop {
                if let (None, Target::ChildOf(parent)) = (pid, target) {
                    pid = child_of(parent);
                }
                if let Some(pid) = pid {
                    most = most.max(fd_count(pid));
                }
                if flag.load(Ordering::Relaxed) {
                    return most;
                }
                std::thread::sleep(EVERY);
            }
        });
        Watch {
            stop,
            thread: Some(thread),
        }
    }

    /// The most descriptors seen.
    pub fn stop(mut self) -> Result<usize> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .context("the descriptor watch was stopped twice")?
            .join()
            .map_err(|_| anyhow!("the descriptor watch panicked"))
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Open descriptors of `pid` (0 once it has gone).
fn fd_count(pid: u32) -> usize {
    fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A child of `parent`, from the parent pid field of /proc/PID/stat.
fn child_of(parent: u32) -> Option<u32> {
    fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == parent).then_some(pid)
    })
}
