//! A containerd 2.x node with its CRI plugin, for the `containerd --cri` rows: images pulled the
//! way kubelet pulls them (CRI `PullImage`), through vial's snapshotter or containerd's overlayfs.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::{ImageSpec, PullImageRequest};
use tonic::transport::{Endpoint, Uri};

/// containerd 2.x (and, for `snapshotter = "vial"`, vial's snapshotter) in `dir`; killed on drop.
pub struct CriNode {
    pub dir: PathBuf,
    socket: PathBuf,
    /// containerd 2.x's binaries.
    bin: PathBuf,
    containerd: Child,
    snapshotter: Option<Child>,
}

impl CriNode {
    /// `bin` holds containerd 2.x and its runc shim (`scripts/fetch-unstable`); images come
    /// from `registry` over plain HTTP.
    pub fn start(
        vial: &Path,
        bin: &Path,
        dir: &Path,
        snapshotter: &str,
        registry: &str,
    ) -> Result<CriNode> {
        std::fs::create_dir_all(dir.join("certs.d").join(registry))?;
        std::fs::write(
            dir.join("certs.d").join(registry).join("hosts.toml"),
            format!("server = \"http://{registry}\"\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"),
        )?;
        let socket = dir.join("containerd.sock");
        let vial_socket = dir.join("vial.sock");
        let mut node = CriNode {
            dir: dir.to_owned(),
            socket: socket.clone(),
            bin: bin.to_owned(),
            containerd: Command::new("true").spawn()?,
            snapshotter: None,
        };
        if snapshotter == "vial" {
            node.snapshotter = Some(
                Command::new(vial)
                    .arg("snapshotter")
                    .arg("--address")
                    .arg(&vial_socket)
                    .arg("--root")
                    .arg(dir.join("vial-root"))
                    .arg("--cache-dir")
                    .arg(dir.join("vial-cache"))
                    .args(["--cache-size", "64GiB"])
                    .env("VIAL_LOG", "warn")
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(dir.join("snapshotter.log"))?)
                    .spawn()
                    .context("cannot start vial snapshotter")?,
            );
            wait_for(&vial_socket)?;
        }
        // vial's block last, as `vial snapshotter --print-containerd-config` prints it.
        let block = crate::servers::run(
            Command::new(vial)
                .args(["snapshotter", "--print-containerd-config", "--address"])
                .arg(&vial_socket)
                .arg("--root")
                .arg(dir.join("vial-root")),
        )?;
        let config = format!(
            "version = 3\nroot = \"{root}\"\nstate = \"{state}\"\n[grpc]\n  address = \"{sock}\"\n[ttrpc]\n  address = \"{sock}.ttrpc\"\n\
             [plugins]\n  [plugins.'io.containerd.cri.v1.images']\n    snapshotter = \"{snapshotter}\"\n    disable_snapshot_annotations = false\n    use_local_image_pull = true\n\
             \x20   [plugins.'io.containerd.cri.v1.images'.registry]\n      config_path = \"{certs}\"\n\
             \x20 [plugins.'io.containerd.cri.v1.runtime']\n    restrict_oom_score_adj = true\n\
             \x20 [plugins.'io.containerd.grpc.v1.cri']\n    stream_server_address = \"127.0.0.1\"\n    stream_server_port = \"0\"\n\
             \x20 [plugins.'io.containerd.internal.v1.opt']\n    path = \"{d}/opt\"\n  [plugins.'io.containerd.nri.v1.nri']\n    disable = true\n{block}",
            root = dir.join("root").display(),
            state = dir.join("state").display(),
            sock = socket.display(),
            certs = dir.join("certs.d").display(),
            d = dir.display(),
        );
        std::fs::write(dir.join("config.toml"), config)?;
        node.containerd = Command::new(bin.join("containerd"))
            .arg("--config")
            .arg(dir.join("config.toml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("containerd.log"))?)
            .spawn()
            .context("cannot start containerd 2.x")?;
        wait_for(&socket)?;
        Ok(node)
    }

    /// CRI `PullImage` of `image`, as kubelet asks for it; retries while containerd starts.
    pub async fn pull(&self, image: &str) -> Result<()> {
        let path = self.socket.clone();
        let deadline = Instant::now() + Duration::from_secs(30);
        let channel = loop {
            let path = path.clone();
            let connected = Endpoint::try_from("http://[::]")?
                .connect_with_connector(tower::service_fn(move |_: Uri| {
                    let path = path.clone();
                    async move {
                        Ok::<_, std::io::Error>(TokioIo::new(
                            tokio::net::UnixStream::connect(path).await?,
                        ))
                    }
                }))
                .await;
            match connected {
                Ok(channel) => break channel,
                Err(e) if Instant::now() > deadline => bail!("containerd 2.x: {e}"),
                Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            }
        };
        let mut images = ImageServiceClient::new(channel);
        let request = || PullImageRequest {
            image: Some(ImageSpec {
                image: image.to_owned(),
                ..Default::default()
            }),
            ..Default::default()
        };
        loop {
            match images.pull_image(request()).await {
                Ok(_) => return Ok(()),
                // The CRI service registers a moment after the socket appears.
                Err(e) if e.code() == tonic::Code::Unimplemented && Instant::now() < deadline => {
                    tokio::time::sleep(Duration::from_millis(100)).await
                }
                Err(e) => bail!("CRI PullImage of {image}: {}", e.message()),
            }
        }
    }

    /// `ctr ARGS` against this node (containerd 2.x's `ctr`, which pulls through the transfer
    /// service unless given `--local`).
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        crate::servers::run(
            Command::new(self.bin.join("ctr"))
                .arg("--address")
                .arg(&self.socket)
                .args(args),
        )
    }

    /// Where the vial snapshotter mounted the (only) volume.
    pub fn volume_mountpoint(&self) -> Option<PathBuf> {
        let prefix = self.dir.join("vial-root").display().to_string();
        std::fs::read_to_string("/proc/mounts")
            .ok()?
            .lines()
            .filter(|l| l.contains("fuse"))
            .filter_map(|l| l.split(' ').nth(1))
            .find(|t| t.starts_with(&prefix))
            .map(PathBuf::from)
    }
}

fn wait_for(path: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !path.exists() {
        if Instant::now() > deadline {
            bail!("{} did not appear", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

impl Drop for CriNode {
    fn drop(&mut self) {
        let _ = self.containerd.kill();
        let _ = self.containerd.wait();
        if let Some(mut s) = self.snapshotter.take() {
            let _ = s.kill();
            let _ = s.wait();
        }
        crate::mounted::unmount_under(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
