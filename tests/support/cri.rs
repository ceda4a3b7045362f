//! containerd 2.x with its CRI plugin on, driven the way kubelet drives it (the CRI v1 gRPC API,
//! through the `k8s-cri` crate), with vial's snapshotter as the image snapshotter. containerd 2.x
//! comes from Debian's unstable suite, unpacked into .ci/tools by `scripts/fetch-unstable`;
//! its containers run with Debian 12's runc.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use tonic::transport::{Channel, Endpoint, Uri};

use super::mount::fuse_available;
use super::{peer, require_all, run, vial_bin};

/// The unpacked containerd 2.x, or `None` (a skip; a failure under VIAL_TEST_REQUIRE_ALL=1).
pub fn containerd2_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/tools/containerd2/bin");
    if dir.join("containerd").is_file() {
        return Some(dir);
    }
    assert!(
        !require_all(),
        "containerd 2.x is required (VIAL_TEST_REQUIRE_ALL=1) but {} is missing: run scripts/fetch-unstable",
        dir.display()
    );
    eprintln!("SKIP: containerd 2.x not in .ci/tools (scripts/fetch-unstable)");
    None
}

/// The `[proxy_plugins.vial]` block, as `vial snapshotter --print-containerd-config` prints it
/// for these flags: the tests run containerd with what users are told to write.
pub fn containerd_block(address: &Path, root: &Path) -> String {
    run(Command::new(vial_bin())
        .args(["snapshotter", "--print-containerd-config", "--address"])
        .arg(address)
        .arg("--root")
        .arg(root))
}

/// Waits (at most 30 s) until `what` has created `path`, a socket or a file.
pub fn wait_for(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        assert!(
            Instant::now() < deadline,
            "{what} did not create {}",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A containerd 2.x with CRI, its own root, state and sockets under a temporary directory.
pub struct Cri {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub bin: PathBuf,
    /// The vial snapshotter's root and node cache, when CRI uses vial.
    pub snapshotter_root: PathBuf,
    pub cache: PathBuf,
    containerd: Child,
    snapshotter: Option<Child>,
}

impl Cri {
    /// Starts containerd 2.x whose CRI image service unpacks with `snapshotter` ("vial", started
    /// here first, or "overlayfs"), pulling over plain HTTP from `registry` (host:port), with
    /// `sandbox_image` as the pod sandbox ("pause") image. Host-network pods need no CNI.
    pub fn start(snapshotter: &str, registry: &str, sandbox_image: &str) -> Option<Cri> {
        let bin = containerd2_dir()?;
        let runc = peer("runc").or_else(|| {
            let sbin = PathBuf::from("/usr/sbin/runc");
            sbin.is_file().then_some(sbin)
        })?;
        if !fuse_available() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("cri")
            .tempdir_in("/tmp")
            .unwrap();
        let d = dir.path();
        let socket = d.join("containerd.sock");
        let hosts = d.join("certs.d").join(registry);
        std::fs::create_dir_all(&hosts).unwrap();
        std::fs::write(
            hosts.join("hosts.toml"),
            format!(
                "server = \"http://{registry}\"\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
            ),
        )
        .unwrap();
        // The version-3 form containerd 2.x reads (docs/containerd.md explains each key), with
        // vial's block appended, as users are told to append it.
        let config = format!(
            r#"version = 3
root = "{root}"
state = "{state}"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[plugins]
  [plugins.'io.containerd.cri.v1.images']
    snapshotter = "{snapshotter}"
    disable_snapshot_annotations = false
    use_local_image_pull = true
    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = "{sandbox_image}"
    [plugins.'io.containerd.cri.v1.images'.registry]
      config_path = "{certs}"
  [plugins.'io.containerd.cri.v1.runtime']
    restrict_oom_score_adj = true
    [plugins.'io.containerd.cri.v1.runtime'.cni]
      bin_dirs = ["{d}/no-cni"]
      conf_dir = "{d}/no-cni"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{shim}"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
  [plugins.'io.containerd.grpc.v1.cri']
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
  [plugins.'io.containerd.internal.v1.opt']
    path = "{d}/opt"
  [plugins.'io.containerd.nri.v1.nri']
    disable = true
{plugin}"#,
            root = d.join("root").display(),
            state = d.join("state").display(),
            sock = socket.display(),
            plugin = containerd_block(&d.join("vial.sock"), &d.join("vial-root")),
            certs = d.join("certs.d").display(),
            shim = bin.join("containerd-shim-runc-v2").display(),
            runc = runc.display(),
            d = d.display(),
        );
        std::fs::write(d.join("config.toml"), config).unwrap();
        let mut cri = Cri {
            socket: socket.clone(),
            snapshotter_root: d.join("vial-root"),
            cache: d.join("vial-cache"),
            containerd: Command::new("true").spawn().unwrap(),
            snapshotter: None,
            bin: bin.clone(),
            dir,
        };
        if snapshotter == "vial" {
            // The snapshotter first: containerd dials it lazily, but sooner is simpler.
            let log = std::fs::File::create(cri.dir.path().join("snapshotter.log")).unwrap();
            let child = Command::new(vial_bin())
                .arg("snapshotter")
                .arg("--address")
                .arg(cri.dir.path().join("vial.sock"))
                .arg("--root")
                .arg(&cri.snapshotter_root)
                .arg("--cache-dir")
                .arg(&cri.cache)
                .env("VIAL_LOG", "info")
                .stdout(Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start vial snapshotter");
            cri.snapshotter = Some(child);
            wait_for(&cri.dir.path().join("vial.sock"), "vial snapshotter");
        }
        let log = std::fs::File::create(cri.dir.path().join("containerd.log")).unwrap();
        // The 2.x shim and ctr come first on PATH, ahead of Debian's 1.6 ones.
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        cri.containerd = Command::new(bin.join("containerd"))
            .arg("--config")
            .arg(cri.dir.path().join("config.toml"))
            .env("PATH", path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start containerd 2.x");
        wait_for(&socket, "containerd 2.x");
        Some(cri)
    }

    /// CRI clients over the socket, once containerd answers.
    pub async fn clients(&self) -> (RuntimeServiceClient<Channel>, ImageServiceClient<Channel>) {
        let path = self.socket.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let path = path.clone();
            let channel = Endpoint::try_from("http://[::]")
                .unwrap()
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await;
            if let Ok(channel) = channel {
                let mut runtime = RuntimeServiceClient::new(channel.clone());
                let version = runtime
                    .version(k8s_cri::v1::VersionRequest::default())
                    .await;
                if version.is_ok() {
                    return (runtime, ImageServiceClient::new(channel));
                }
            }
            assert!(
                Instant::now() < deadline,
                "containerd 2.x did not answer CRI:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `ctr` 2.x against this containerd, in CRI's namespace.
    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        self.ctr_in("k8s.io", args)
    }

    /// `ctr ARGS` in a containerd namespace of its own (`k8s.io` is the CRI's, where the CRI
    /// keeps its own records of every image).
    pub fn ctr_in(&self, namespace: &str, args: &[&str]) -> std::process::Output {
        Command::new(self.bin.join("ctr"))
            .arg("--address")
            .arg(&self.socket)
            .args(["--namespace", namespace])
            .args(args)
            .output()
            .expect("run ctr")
    }

    /// `ctr ARGS`, failing the test with its stderr and the logs if it fails; returns stdout. A
    /// failed `ctr` lists nothing, which must never read as "nothing is there".
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        self.ctr_ok_in("k8s.io", args)
    }

    /// [`Cri::ctr_ok`] in another namespace.
    pub fn ctr_ok_in(&self, namespace: &str, args: &[&str]) -> String {
        let out = self.ctr_in(namespace, args);
        assert!(
            out.status.success(),
            "ctr {args:?} failed: {}\n{}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn log(&self) -> String {
        let read =
            |name: &str| std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
        format!(
            "--- containerd log (tail):\n{}\n--- snapshotter log (tail):\n{}",
            tail(&read("containerd.log"), 40),
            tail(&read("snapshotter.log"), 40)
        )
    }
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Cri {
    fn drop(&mut self) {
        let _ = self.containerd.kill();
        let _ = self.containerd.wait();
        if let Some(child) = &self.snapshotter {
            super::signal(child.id(), "TERM");
        }
        if let Some(mut child) = self.snapshotter.take() {
            if super::wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
        // Shims and their containers outlive containerd: end them, then whatever is mounted.
        let prefix = self.dir.path().display().to_string();
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", &prefix])
            .stderr(Stdio::null())
            .status();
        if let Ok(mounts) = std::fs::read_to_string("/proc/mounts") {
            let mut targets: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(1))
                .filter(|t| t.starts_with(&prefix))
                .collect();
            // Deepest first.
            targets.sort_by_key(|t| std::cmp::Reverse(t.len()));
            for target in targets {
                let _ = Command::new("umount")
                    .arg("-l")
                    .arg(target)
                    .stderr(Stdio::null())
                    .status();
            }
        }
    }
}
