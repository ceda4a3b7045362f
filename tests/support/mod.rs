//! Helpers shared by the integration tests: starting `vial serve` and peer servers on free ports, and
//! finding the peer tools the tests drive.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod browser;
pub mod conformance;
pub mod containerd;
pub mod cri;
pub mod hub;
pub mod model;
pub mod mount;
pub mod oci;
pub mod packs;
pub mod postgres;
pub mod proxy;
pub mod s3;
pub mod vial;

/// The `vial` binary built for this test run.
pub fn vial_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_vial"))
}

/// Whether tests that need a missing peer must fail instead of skipping (set in CI).
pub fn require_all() -> bool {
    std::env::var("VIAL_TEST_REQUIRE_ALL").is_ok_and(|v| v == "1")
}

/// Finds a peer program. Without it the calling test is skipped, or fails under
/// VIAL_TEST_REQUIRE_ALL=1, so CI can never pass by skipping.
pub fn peer(program: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(program))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            !require_all(),
            "{program} is required (VIAL_TEST_REQUIRE_ALL=1) but not on PATH"
        );
        eprintln!("SKIP: {program} not found on PATH");
    }
    found
}

/// The Python interpreter of the repository's virtualenv with the ORAS SDK, if set up.
pub fn oras_python() -> Option<PathBuf> {
    let python = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    let ok = python.is_file()
        && Command::new(&python)
            .args(["-c", "import oras.client"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if !ok {
        assert!(
            !require_all(),
            "the ORAS Python SDK is required (VIAL_TEST_REQUIRE_ALL=1): run .ci/run or create .venv with `pip install oras`"
        );
        eprintln!("SKIP: .venv with the oras package not found");
        return None;
    }
    Some(python)
}

/// A `vial serve` process on a free loopback port, stopped with SIGTERM when dropped.
#[derive(Debug)]
pub struct Server {
    child: Child,
    pub addr: String,
    pub data: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Server {
    /// Starts a registry with a fresh data directory.
    pub fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut s = Server::start_on(&data, &[]);
        s._dir = Some(dir);
        s
    }

    /// Starts a registry on an existing data directory, with extra `vial serve` arguments. Unless
    /// the arguments name the stores, they are the ones `VIAL_TEST_BACKEND` picks (see
    /// [`matrix_args`]), so the whole suite can run against each backend combination.
    pub fn start_on(data: &Path, extra: &[&str]) -> Server {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(matrix_args(data, extra));
        Server::start_with(data, &args, &matrix_env())
    }

    /// Starts a registry like [`Server::start_on`], with extra environment.
    pub fn start_on_with_env(
        data: &Path,
        extra: &[&str],
        env: &[(&'static str, String)],
    ) -> Server {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(matrix_args(data, extra));
        let mut env = env.to_vec();
        env.extend(matrix_env());
        Server::spawn(data, &args, &env, None, None)
    }

    /// Starts a registry with exactly these arguments and extra environment.
    pub fn start_with(data: &Path, args: &[String], env: &[(&'static str, String)]) -> Server {
        Server::spawn(data, args, env, None, None)
    }

    /// Starts a registry like [`Server::start_on`] whose log, at `level`, goes to `log`.
    pub fn start_logging(data: &Path, extra: &[&str], level: &str, log: &Path) -> Server {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(matrix_args(data, extra));
        Server::spawn(data, &args, &matrix_env(), Some((level, log)), None)
    }

    /// Starts a registry like [`Server::start_on`] that may hold at most `nofile` open files.
    pub fn start_limited(data: &Path, extra: &[&str], nofile: u32) -> Server {
        let mut args: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        args.extend(matrix_args(data, extra));
        Server::spawn(data, &args, &matrix_env(), None, Some(nofile))
    }

    fn spawn(
        data: &Path,
        args: &[String],
        env: &[(&'static str, String)],
        log: Option<(&str, &Path)>,
        nofile: Option<u32>,
    ) -> Server {
        let mut command = match nofile {
            Some(n) => limited(n),
            None => Command::new(vial_bin()),
        };
        command.arg("serve");
        if !args.iter().any(|a| a == "--addr") {
            command.args(["--addr", "127.0.0.1:0"]);
        }
        let mut child = command
            .arg("--data")
            .arg(data)
            .args(args)
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            // VIAL_TEST_SERVER_LOG=debug shows what the servers of a failing test did.
            .env(
                "VIAL_LOG",
                log.map(|(level, _)| level.to_owned()).unwrap_or_else(|| {
                    std::env::var("VIAL_TEST_SERVER_LOG").unwrap_or_else(|_| "warn".into())
                }),
            )
            .stdout(Stdio::piped())
            .stderr(match log {
                Some((_, path)) => Stdio::from(std::fs::File::create(path).unwrap()),
                None => Stdio::inherit(),
            })
            .spawn()
            .expect("start vial serve");
        // The server prints its bound address once it listens: no polling, no sleeping.
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let addr = line
            .trim()
            .rsplit("://")
            .next()
            .filter(|a| a.contains(':'))
            .unwrap_or_else(|| panic!("unexpected first line from vial serve: {line:?}"))
            .to_owned();
        Server {
            child,
            addr,
            data: data.to_owned(),
            _dir: None,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL: the process gets no chance to clean up.
    pub fn kill_hard(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM, then wait for a clean exit; returns the exit status.
    pub fn stop(mut self) -> std::process::ExitStatus {
        signal(self.child.id(), "TERM");
        wait_timeout(&mut self.child, Duration::from_secs(20))
            .expect("vial serve did not stop on SIGTERM")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            signal(self.child.id(), "TERM");
            if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }
}

/// Bytes of the files under `dir`, recursively (0 if it is not there).
pub fn du(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
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

/// A metric of `server` (`name` with its labels, if any), which must be shown: one that is missing
/// (renamed, say) fails the test instead of reading as 0.
pub fn metric(server: &Server, name: &str) -> u64 {
    let text = reqwest::blocking::get(format!("{}/metrics", server.url()))
        .unwrap()
        .text()
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics"))
}

pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status();
}

pub fn wait_timeout(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        if Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command that runs `vial` with at most `nofile` open files (soft and hard limit), as a user
/// under `ulimit -n` would: the shell sets the limit and then becomes `vial`, same process.
pub fn limited(nofile: u32) -> Command {
    let mut command = Command::new("sh");
    command
        .args(["-c", r#"ulimit -n "$0" && exec "$@""#])
        .arg(nofile.to_string())
        .arg(vial_bin());
    command
}

/// The backend combination the suite runs against: `VIAL_TEST_BACKEND` is `sqlite+fs` (the
/// default), `postgres+fs`, `sqlite+s3` or `postgres+s3`. The servers come from the environment
/// `scripts/test-all` sets up: `VIAL_TEST_POSTGRES_URL` (a superuser URL without a database) and
/// `VIAL_TEST_S3_ENDPOINT` with the bucket `VIAL_TEST_S3_BUCKET` and the usual AWS variables.
pub fn backend() -> (bool, bool) {
    let name = std::env::var("VIAL_TEST_BACKEND").unwrap_or_else(|_| "sqlite+fs".into());
    match name.as_str() {
        "sqlite+fs" => (false, false),
        "postgres+fs" => (true, false),
        "sqlite+s3" => (false, true),
        "postgres+s3" => (true, true),
        other => panic!("unknown VIAL_TEST_BACKEND {other:?}"),
    }
}

/// `--metadata-url` and `--blob-url` for a server on `data` under the selected backends, unless
/// `extra` already names them. The same data directory always gets the same database and prefix
/// (remembered in a file beside it), so a test can restart a server on its old state.
fn matrix_args(data: &Path, extra: &[&str]) -> Vec<String> {
    let (postgres, s3) = backend();
    let memo = data.with_extension("backend");
    if let Ok(saved) = std::fs::read_to_string(&memo) {
        return saved.lines().map(str::to_owned).collect();
    }
    let id = format!("t{}", uuid::Uuid::new_v4().simple())[..13].to_owned();
    let mut args = Vec::new();
    if postgres && !extra.contains(&"--metadata-url") {
        let base = std::env::var("VIAL_TEST_POSTGRES_URL")
            .expect("VIAL_TEST_BACKEND uses postgres but VIAL_TEST_POSTGRES_URL is not set");
        let url = postgres::create_database(&base, &id);
        args.extend(["--metadata-url".to_owned(), url]);
    }
    if s3 && !extra.contains(&"--blob-url") {
        let bucket = std::env::var("VIAL_TEST_S3_BUCKET")
            .expect("VIAL_TEST_BACKEND uses s3 but VIAL_TEST_S3_BUCKET is not set");
        args.extend(["--blob-url".to_owned(), format!("s3://{bucket}/{id}")]);
    }
    if !args.is_empty() {
        if let Some(parent) = memo.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        std::fs::write(&memo, args.join("\n")).unwrap();
    }
    args
}

/// Where the backend matrix keeps the blobs of a server started on `data` when `VIAL_TEST_BACKEND`
/// uses S3: the shared bucket and the server's key prefix (ending in `/`). `None` on the filesystem.
pub fn matrix_bucket(data: &Path) -> Option<(s3::Bucket, String)> {
    if !backend().1 {
        return None;
    }
    let saved = std::fs::read_to_string(data.with_extension("backend"))
        .expect("a server was started on this data directory under the S3 backend");
    let mut lines = saved.lines();
    lines.find(|l| *l == "--blob-url");
    let url = lines
        .next()
        .expect("--blob-url is remembered with its value");
    let (bucket, prefix) = url
        .strip_prefix("s3://")
        .and_then(|rest| rest.split_once('/'))
        .unwrap_or_else(|| panic!("unexpected blob URL {url:?}"));
    let endpoint = std::env::var("VIAL_TEST_S3_ENDPOINT")
        .expect("VIAL_TEST_BACKEND uses s3 but VIAL_TEST_S3_ENDPOINT is not set");
    Some((s3::Bucket::new(&endpoint, bucket), format!("{prefix}/")))
}

/// The PostgreSQL database the backend matrix gave a server started on `data`, when
/// `VIAL_TEST_BACKEND` uses PostgreSQL. `None` on SQLite.
pub fn matrix_database(data: &Path) -> Option<String> {
    if !backend().0 {
        return None;
    }
    let saved = std::fs::read_to_string(data.with_extension("backend"))
        .expect("a server was started on this data directory under the PostgreSQL backend");
    let mut lines = saved.lines();
    lines.find(|l| *l == "--metadata-url");
    Some(
        lines
            .next()
            .expect("--metadata-url is remembered with its value")
            .to_owned(),
    )
}

/// Asserts that `server` opened none of the stores it was given by the backend matrix: what a
/// cache tier must do, whose content lives in its cache directory (docs/cache.md). It says so in
/// its metrics, and nothing of a store exists: no `DATA/metadata.db`, `DATA/blobs` or
/// `DATA/packs`; nothing under the server's S3 prefix; no table in its PostgreSQL database
/// (opening the store would have run the migrations).
pub fn assert_no_stores_opened(server: &Server) {
    let metrics = reqwest::blocking::get(format!("{}/metrics", server.url()))
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("vial_backend_info{metadata=\"none\",blobs=\"none\",")),
        "{} does not say it runs on no store:\n{metrics}",
        server.addr
    );
    for name in ["metadata.db", "blobs", "packs"] {
        let path = server.data.join(name);
        assert!(
            !path.exists(),
            "{} opened a store: {} exists",
            server.addr,
            path.display()
        );
    }
    if let Some((bucket, prefix)) = matrix_bucket(&server.data) {
        let keys = bucket.keys(&prefix);
        assert!(
            keys.is_empty(),
            "{} wrote to its S3 prefix: {keys:?}",
            server.addr
        );
    }
    if let Some(url) = matrix_database(&server.data) {
        let tables = postgres::psql_value(
            &url,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'",
        );
        assert_eq!(tables, "0", "{} opened its database", server.addr);
    }
}

/// The AWS environment for the shared S3 server of the backend matrix.
fn matrix_env() -> Vec<(&'static str, String)> {
    match std::env::var("VIAL_TEST_S3_ENDPOINT") {
        Ok(endpoint) if backend().1 => s3::aws_env(&endpoint),
        _ => Vec::new(),
    }
}

/// A free loopback port for a peer server that cannot be told to pick one itself.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Polls a peer's URL until it answers (peers like docker-registry print nothing machine-readable).
pub fn wait_http(url: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let client = reqwest::blocking::Client::new();
    while Instant::now() < deadline {
        if client.get(url).send().is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{url} did not answer within {timeout:?}");
}

/// Debian's `docker-registry` (CNCF Distribution 2.8) on a free port, killed when dropped.
pub struct DockerRegistry {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl DockerRegistry {
    pub fn start() -> Option<DockerRegistry> {
        let bin = peer("docker-registry")?;
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let config = dir.path().join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem: {{rootdirectory: {}}}\n  delete: {{enabled: true}}\nhttp: {{addr: 127.0.0.1:{port}}}\n",
                dir.path().join("data").display()
            ),
        )
        .unwrap();
        let child = Command::new(bin)
            .arg("serve")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start docker-registry");
        let addr = format!("127.0.0.1:{port}");
        wait_http(&format!("http://{addr}/v2/"), Duration::from_secs(20));
        Some(DockerRegistry {
            child,
            addr,
            _dir: dir,
        })
    }
}

impl Drop for DockerRegistry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a command, panicking with its output if it fails.
pub fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("could not run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed with {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Pushes a blob monolithically and returns its digest.
pub fn push_blob(
    client: &reqwest::blocking::Client,
    base: &str,
    repo: &str,
    bytes: &[u8],
) -> vial_core::Digest {
    let digest = vial_core::Algorithm::Sha256.digest_bytes(bytes);
    let resp = client
        .post(format!("{base}/v2/{repo}/blobs/uploads/?digest={digest}"))
        .header("content-type", "application/octet-stream")
        .body(bytes.to_vec())
        .send()
        .unwrap();
    assert_eq!(
        resp.status(),
        201,
        "push of {digest} to {repo}: {}",
        resp.text().unwrap_or_default()
    );
    digest
}

/// Pushes an image manifest over the given layers (config = the OCI empty blob, pushed here).
pub fn push_manifest(
    client: &reqwest::blocking::Client,
    base: &str,
    repo: &str,
    reference: &str,
    layers: &[(vial_core::Digest, usize)],
) -> (vial_core::Digest, Vec<u8>) {
    push_blob(client, base, repo, b"{}");
    let layers: Vec<_> = layers
        .iter()
        .map(|(d, size)| serde_json::json!({"mediaType": "application/octet-stream", "digest": d, "size": size}))
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": vial_core::media::OCI_MANIFEST,
        "config": {"mediaType": vial_core::media::OCI_EMPTY, "digest": vial_core::media::OCI_EMPTY_DIGEST, "size": 2},
        "layers": layers,
    }))
    .unwrap();
    let resp = client
        .put(format!("{base}/v2/{repo}/manifests/{reference}"))
        .header("content-type", vial_core::media::OCI_MANIFEST)
        .body(body.clone())
        .send()
        .unwrap();
    assert_eq!(
        resp.status(),
        201,
        "manifest push: {}",
        resp.text().unwrap_or_default()
    );
    (vial_core::Algorithm::Sha256.digest_bytes(&body), body)
}
