//! Starts the servers under test (vial, docker-registry, nginx) on free loopback ports, each in
//! its own directory, kills them on drop, and reads their memory use from /proc.

use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use reqwest::Url;

const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running server process. Dropping it kills the process and waits for it.
#[derive(Debug)]
pub struct Server {
    pub name: &'static str,
    pub base: Url,
    pub dir: PathBuf,
    child: Child,
}

impl Server {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self, path: &str) -> Result<Url> {
        Ok(self.base.join(path)?)
    }

    /// Kills the process (if still running) and deletes its directory, data included.
    pub fn stop_and_delete(mut self) -> Result<()> {
        self.kill();
        fs::remove_dir_all(&self.dir)
            .with_context(|| format!("could not delete {}", self.dir.display()))
    }

    /// Kills the process (if still running) and keeps its directory, to start again on it.
    pub fn stop_and_keep(mut self) {
        self.kill();
    }

    fn kill(&mut self) {
        // Errors mean the process has already exited and been reaped.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn failure(&mut self, what: &str) -> anyhow::Error {
        let status = match self.child.try_wait() {
            Ok(Some(status)) => format!(" ({status})"),
            _ => String::new(),
        };
        let log = self.dir.join("stderr.log");
        anyhow!(
            "{} {what}{status}; end of {}:\n{}",
            self.name,
            log.display(),
            log_tail(&log)
        )
    }

    /// Polls `path` until the server answers anything over HTTP.
    pub async fn wait_ready(&mut self, path: &str) -> Result<()> {
        let client = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(2))
            .build()?;
        let url = self.url(path)?;
        let started = Instant::now();
        loop {
            if client.get(url.clone()).send().await.is_ok() {
                return Ok(());
            }
            if matches!(self.child.try_wait(), Ok(Some(_))) {
                return Err(self.failure("exited during startup"));
            }
            if started.elapsed() > START_TIMEOUT {
                return Err(self.failure("did not answer within 30 s"));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

pub fn log_tail(path: &Path) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map_or(0, |m| m.len());
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(2000)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    s
}

pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

pub fn spawn(name: &'static str, cmd: &mut Command, dir: &Path, base: Url) -> Result<Server> {
    let log = File::create(dir.join("stderr.log"))?;
    let child = cmd
        .stdin(Stdio::null())
        .stderr(log)
        .spawn()
        .with_context(|| format!("could not start {name} ({:?})", cmd.get_program()))?;
    Ok(Server {
        name,
        base,
        dir: dir.to_path_buf(),
        child,
    })
}

/// `vial serve --addr 127.0.0.1:0 --data DIR/data`, reading the address from its stdout line.
pub fn start_vial(bin: &Path, dir: &Path) -> Result<Server> {
    start_vial_with(bin, dir, &[], &[])
}

/// `vial serve` with extra arguments (other backends) and environment (S3 credentials).
pub fn start_vial_with(
    bin: &Path,
    dir: &Path,
    args: &[String],
    env: &[(&str, String)],
) -> Result<Server> {
    fs::create_dir_all(dir)?;
    let mut cmd = Command::new(bin);
    cmd.args(["serve", "--addr", "127.0.0.1:0", "--data"])
        .arg(dir.join("data"))
        // No background seals of what the benches push (skopeo's layouts carry file titles, so
        // they are file artifacts): they would compete with what is being timed.
        .args(["--seal-on-push", "false"])
        .args(args)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("VIAL_LOG", "warn")
        .stdout(Stdio::piped());
    let mut server = spawn("vial", &mut cmd, dir, Url::parse("http://127.0.0.1/")?)?;
    let stdout = server.child.stdout.take().context("vial has no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        let _ = tx.send(reader.read_line(&mut line).map(|_| line));
        // Keep draining so the process never blocks on a full pipe.
        let _ = std::io::copy(&mut reader, &mut std::io::sink());
    });
    let line = match rx.recv_timeout(START_TIMEOUT) {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => return Err(server.failure(&format!("stdout unreadable: {e}"))),
        Err(_) => return Err(server.failure("printed no address within 30 s")),
    };
    let Some(addr) = line.trim().strip_prefix("vial registry listening on ") else {
        return Err(server.failure(&format!("printed an unexpected line {line:?}")));
    };
    server.base = Url::parse(&format!("{addr}/"))?;
    Ok(server)
}

/// CNCF Distribution with filesystem storage and deletes enabled. The in-memory blob descriptor
/// cache is on, as in the configuration that upstream and Debian ship.
pub async fn start_peer(bin: &Path, dir: &Path) -> Result<Server> {
    fs::create_dir_all(dir)?;
    let port = free_port()?;
    let config = dir.join("config.yml");
    fs::write(
        &config,
        format!(
            "version: 0.1\nlog: {{level: error}}\nstorage:\n  cache: {{blobdescriptor: inmemory}}\n  \
             filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: true}}\nhttp: {{addr: 127.0.0.1:{port}}}\n",
            dir.join("data").display()
        ),
    )?;
    let mut cmd = Command::new(bin);
    cmd.arg("serve").arg(&config).stdout(Stdio::null());
    let base = Url::parse(&format!("http://127.0.0.1:{port}/"))?;
    let mut server = spawn("docker-registry", &mut cmd, dir, base)?;
    server.wait_ready("v2/").await?;
    Ok(server)
}

/// nginx with sendfile serving `content` from DIR/www/blob.bin: the ceiling for a plain download.
pub async fn start_nginx(bin: &Path, dir: &Path, content: &[u8]) -> Result<Server> {
    let www = dir.join("www");
    let tmp = dir.join("tmp");
    fs::create_dir_all(&www)?;
    fs::create_dir_all(&tmp)?;
    fs::write(www.join("blob.bin"), content)?;
    let port = free_port()?;
    let d = dir.display();
    let temps: String = ["client_body", "proxy", "fastcgi", "uwsgi", "scgi"]
        .iter()
        .map(|t| format!("{t}_temp_path {d}/tmp/{t}; "))
        .collect();
    let conf = dir.join("nginx.conf");
    fs::write(
        &conf,
        format!(
            "daemon off; master_process off; worker_processes 1; error_log {d}/err.log; pid {d}/nginx.pid;\n\
             events {{}}\nhttp {{ sendfile on; access_log off; {temps}\n  \
             server {{ listen 127.0.0.1:{port}; root {d}/www; }} }}\n"
        ),
    )?;
    let mut cmd = Command::new(bin);
    cmd.arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(dir)
        .arg("-e")
        .arg(dir.join("err.log"))
        .stdout(Stdio::null());
    let base = Url::parse(&format!("http://127.0.0.1:{port}/"))?;
    let mut server = spawn("nginx", &mut cmd, dir, base)?;
    server.wait_ready("blob.bin").await?;
    Ok(server)
}

/// A `kB` field of /proc/PID/status (VmRSS, VmHWM), in KiB.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().trim_end_matches("kB").trim().parse().ok()
    })
}

/// The first line a command prints (stdout, else stderr), for version strings.
pub fn first_line(program: &Path, args: &[&str]) -> String {
    match Command::new(program).args(args).output() {
        Ok(out) => {
            let text = if out.stdout.is_empty() {
                out.stderr
            } else {
                out.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(e) => format!("unavailable ({e})"),
    }
}

/// The filesystem type of the mount holding `path`, from /proc/mounts.
pub fn fs_type(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, mount, kind) = (f.next()?, f.next()?, f.next()?);
            path.starts_with(mount)
                .then(|| (mount.len(), kind.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, kind)| kind)
}

/// Bytes available to us on the filesystem holding `path` (from `df`).
pub fn available_bytes(path: &Path) -> Option<u64> {
    let out = Command::new("df")
        .args(["-B1", "--output=avail"])
        .arg(path)
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)?
        .trim()
        .parse()
        .ok()
}

/// The first of $TMPDIR (or /tmp), /var/tmp and the current directory that is on a real disk:
/// a tmpfs would hold the registries' data in memory and skew both speed and memory figures.
pub fn default_parent() -> PathBuf {
    let candidates = [
        std::env::temp_dir(),
        PathBuf::from("/var/tmp"),
        std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
    ];
    candidates
        .iter()
        .find(|p| p.is_dir() && !matches!(fs_type(p).as_deref(), Some("tmpfs" | "ramfs")))
        .unwrap_or(&candidates[2])
        .clone()
}

/// The run's own directory; removed on drop unless kept. Declare it before the servers so they
/// are dropped (killed) first.
#[derive(Debug)]
pub struct WorkDir {
    pub path: PathBuf,
    keep: bool,
}

impl WorkDir {
    pub fn create(parent: &Path, keep: bool) -> Result<Self> {
        let path = parent.join(format!("vial-bench-{}", uuid::Uuid::new_v4().simple()));
        fs::create_dir_all(&path)
            .with_context(|| format!("could not create {}", path.display()))?;
        if !path.is_dir() {
            bail!("{} is not a directory", path.display());
        }
        Ok(WorkDir { path, keep })
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if !self.keep {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// User + system CPU seconds of a process so far.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let ticks: f64 = fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0)
}

/// Runs `cmd` to the end; its stdout, or an error with its stderr if it failed.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Bytes of the files under `dir`, recursively (0 if it is not there).
pub fn du(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => du(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}
