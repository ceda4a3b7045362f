//! Throwaway S3-compatible servers for tests: s3s-fs (which checks SigV4 signatures) for everything,
//! and moto where s3s-fs lacks a call (ListMultipartUploads).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::{free_port, require_all, wait_http};

pub const ACCESS_KEY: &str = "vial-test-access";
pub const SECRET_KEY: &str = "vial-test-secret-not-for-logs";
pub const BUCKET: &str = "vial-test";

/// The s3s-fs binary: `VIAL_TEST_S3FS`, else the one `scripts/test-all` installs under `.ci/tools`.
fn s3s_fs_bin() -> Option<PathBuf> {
    let path = std::env::var_os("VIAL_TEST_S3FS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/tools/bin/s3s-fs"));
    if path.is_file() {
        return Some(path);
    }
    assert!(
        !require_all(),
        "s3s-fs is required (VIAL_TEST_REQUIRE_ALL=1) but {} is missing",
        path.display()
    );
    eprintln!("SKIP: s3s-fs not installed (cargo install s3s-fs@0.14.1 --features binary --root .ci/tools)");
    None
}

/// An s3s-fs server on a free port with one bucket, stopped on drop.
pub struct S3Server {
    dir: tempfile::TempDir,
    pub port: u16,
    child: Option<Child>,
}

impl S3Server {
    pub fn start() -> Option<S3Server> {
        let bin = s3s_fs_bin()?;
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("data").join(BUCKET)).unwrap();
        let mut server = S3Server {
            dir,
            port: free_port(),
            child: None,
        };
        server.spawn(&bin);
        Some(server)
    }

    fn spawn(&mut self, bin: &Path) {
        let log = std::fs::File::create(self.dir.path().join("s3.log")).unwrap();
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(self.dir.path().join("data"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start s3s-fs");
        self.child = Some(child);
        // Any HTTP answer (an unsigned request gets 403) means it is listening.
        wait_http(&self.endpoint(), Duration::from_secs(20));
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The blob URL for `vial serve`, in its own prefix of the bucket.
    pub fn blob_url(&self, prefix: &str) -> String {
        format!("s3://{BUCKET}/{prefix}")
    }

    /// Where s3s-fs keeps the objects under `prefix`, to look at what the registry left behind.
    pub fn objects_dir(&self, prefix: &str) -> PathBuf {
        self.dir.path().join("data").join(BUCKET).join(prefix)
    }

    /// A bucket's directory: s3s-fs serves the files under it as the bucket's objects, so a
    /// test can fill a source bucket by writing files.
    pub fn bucket_dir(&self, bucket: &str) -> PathBuf {
        let dir = self.dir.path().join("data").join(bucket);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The environment `vial serve` needs to reach this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        aws_env(&self.endpoint())
    }

    /// Kills the server, as an outage would.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port and data.
    pub fn start_again(&mut self) {
        let bin = s3s_fs_bin().expect("s3s-fs was there a moment ago");
        self.spawn(&bin);
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

pub fn aws_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ENDPOINT_URL", endpoint.to_owned()),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY.to_owned()),
        ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.to_owned()),
        ("AWS_REGION", "us-east-1".to_owned()),
        // Never the developer's own profile or instance credentials.
        ("AWS_CONFIG_FILE", "/dev/null".to_owned()),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null".to_owned()),
        ("AWS_EC2_METADATA_DISABLED", "true".to_owned()),
    ]
}

/// A moto server (the widest S3 API coverage, but it accepts any signature), stopped on drop.
pub struct Moto {
    child: Child,
    pub port: u16,
}

impl Moto {
    pub fn start() -> Option<Moto> {
        let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/moto_server");
        if !bin.is_file() {
            assert!(
                !require_all(),
                "moto is required (VIAL_TEST_REQUIRE_ALL=1) but {} is missing",
                bin.display()
            );
            eprintln!("SKIP: moto not installed in .venv");
            return None;
        }
        let port = free_port();
        let child = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let moto = Moto { child, port };
        wait_http(&moto.endpoint(), Duration::from_secs(60));
        let r = reqwest::blocking::Client::new()
            .put(format!("{}/{BUCKET}", moto.endpoint()))
            .send()
            .unwrap();
        assert!(r.status().is_success(), "moto CreateBucket: {}", r.status());
        Some(moto)
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Keys of the multipart uploads in progress in the bucket.
    pub fn multipart_uploads(&self) -> Vec<String> {
        let xml = reqwest::blocking::get(format!("{}/{BUCKET}?uploads", self.endpoint()))
            .unwrap()
            .text()
            .unwrap();
        xml.split("<Key>")
            .skip(1)
            .filter_map(|s| s.split("</Key>").next())
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
