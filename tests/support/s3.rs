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

/// A bucket on an S3 server that checks signatures (s3s-fs), read with SigV4-signed requests made
/// here: enough to list what a registry left in its prefix and read it back, with no S3 SDK.
pub struct Bucket {
    pub endpoint: String,
    pub name: String,
    http: reqwest::blocking::Client,
}

impl Bucket {
    pub fn new(endpoint: &str, name: &str) -> Bucket {
        Bucket {
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            name: name.to_owned(),
            http: reqwest::blocking::Client::new(),
        }
    }

    /// Every key under `prefix` (ListObjectsV2, following continuation tokens).
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let mut keys = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut query = vec![("list-type", "2".to_owned()), ("prefix", prefix.to_owned())];
            if let Some(t) = &token {
                query.push(("continuation-token", t.clone()));
            }
            let xml = self.get(&format!("/{}", self.name), &mut query);
            let xml = String::from_utf8(xml).unwrap();
            keys.extend(xml_values(&xml, "Key"));
            token = xml_values(&xml, "NextContinuationToken").into_iter().next();
            if xml_values(&xml, "IsTruncated").first().map(String::as_str) != Some("true") {
                return keys;
            }
            assert!(
                token.is_some(),
                "a truncated listing without a token: {xml}"
            );
        }
    }

    /// The bytes of `key`.
    pub fn object(&self, key: &str) -> Vec<u8> {
        self.get(&format!("/{}/{key}", self.name), &mut Vec::new())
    }

    fn get(&self, path: &str, query: &mut [(&str, String)]) -> Vec<u8> {
        let (amz_date, date) = amz_now();
        let host = self
            .endpoint
            .split_once("://")
            .map_or(self.endpoint.as_str(), |(_, h)| h)
            .to_owned();
        query.sort();
        let query = query
            .iter()
            .map(|(k, v)| format!("{}={}", uri_encode(k, true), uri_encode(v, true)))
            .collect::<Vec<_>>()
            .join("&");
        let path = uri_encode(path, false);
        let payload = sha256_hex(b"");
        let canonical = format!(
            "GET\n{path}\n{query}\nhost:{host}\nx-amz-content-sha256:{payload}\nx-amz-date:{amz_date}\n\nhost;x-amz-content-sha256;x-amz-date\n{payload}"
        );
        let scope = format!("{date}/us-east-1/s3/aws4_request");
        let to_sign = format!(
            "AWS4-HMAC-SHA256\n{amz_date}\n{scope}\n{}",
            sha256_hex(canonical.as_bytes())
        );
        let mut key = hmac_sha256(format!("AWS4{SECRET_KEY}").as_bytes(), date.as_bytes());
        for part in ["us-east-1", "s3", "aws4_request"] {
            key = hmac_sha256(&key, part.as_bytes());
        }
        let signature = hex(&hmac_sha256(&key, to_sign.as_bytes()));
        let url = if query.is_empty() {
            format!("{}{path}", self.endpoint)
        } else {
            format!("{}{path}?{query}", self.endpoint)
        };
        let r = self
            .http
            .get(&url)
            .header("x-amz-date", &amz_date)
            .header("x-amz-content-sha256", &payload)
            .header(
                "authorization",
                format!("AWS4-HMAC-SHA256 Credential={ACCESS_KEY}/{scope}, SignedHeaders=host;x-amz-content-sha256;x-amz-date, Signature={signature}"),
            )
            .send()
            .unwrap();
        let status = r.status();
        let body = r.bytes().unwrap().to_vec();
        assert!(
            status.is_success(),
            "GET {url}: {status}: {}",
            String::from_utf8_lossy(&body)
        );
        body
    }
}

/// The text of every `<tag>` element, unescaped.
fn xml_values(xml: &str, tag: &str) -> Vec<String> {
    let (open, close) = (format!("<{tag}>"), format!("</{tag}>"));
    xml.split(open.as_str())
        .skip(1)
        .filter_map(|s| s.split(close.as_str()).next())
        .map(|v| {
            v.replace("&lt;", "<")
                .replace("&gt;", ">")
                .replace("&quot;", "\"")
                .replace("&apos;", "'")
                .replace("&amp;", "&")
        })
        .collect()
}

/// SigV4's URI encoding: everything but unreserved characters, and `/` too in query values.
fn uri_encode(s: &str, slash: bool) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            b'/' if !slash => "/".to_owned(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    let digest = vial_core::Algorithm::Sha256.digest_bytes(bytes);
    (0..32)
        .map(|i| u8::from_str_radix(&digest.hex()[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex(&sha256(bytes))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// HMAC-SHA256 (RFC 2104) over the SHA-256 the format crate already has.
fn hmac_sha256(key: &[u8], message: &[u8]) -> Vec<u8> {
    let mut block = if key.len() > 64 {
        sha256(key)
    } else {
        key.to_vec()
    };
    block.resize(64, 0);
    let inner: Vec<u8> = block
        .iter()
        .map(|b| b ^ 0x36)
        .chain(message.iter().copied())
        .collect();
    let outer: Vec<u8> = block
        .iter()
        .map(|b| b ^ 0x5c)
        .chain(sha256(&inner))
        .collect();
    sha256(&outer)
}

/// The request time as SigV4 writes it (`20240102T030405Z`) and its date (`20240102`).
fn amz_now() -> (String, String) {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Days since 1970-01-01 to a civil date (Howard Hinnant's days_from_civil, inverted).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let date = format!("{year:04}{month:02}{day:02}");
    let time = format!("{:02}{:02}{:02}", rest / 3600, rest % 3600 / 60, rest % 60);
    (format!("{date}T{time}Z"), date)
}
