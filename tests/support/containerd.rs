//! A real containerd (Debian's 1.6) with its own root, state and socket under a temporary
//! directory, configured with vial's snapshotter as a proxy plugin, and that snapshotter.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use super::mount::fuse_available;
use super::{peer, vial_bin};

pub struct Containerd {
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub snapshotter_socket: PathBuf,
    pub snapshotter_root: PathBuf,
    pub cache: PathBuf,
    containerd: Child,
    snapshotter: Option<Child>,
}

fn wait_for_socket(path: &Path, what: &str) {
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

impl Containerd {
    /// Starts vial's snapshotter, then containerd. `None` (a skip) without containerd, runc or
    /// FUSE, unless VIAL_TEST_REQUIRE_ALL=1.
    pub fn start() -> Option<Containerd> {
        peer("containerd")?;
        peer("ctr")?;
        peer("containerd-shim-runc-v2")?;
        if !fuse_available() {
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("ctd")
            .tempdir_in("/tmp")
            .unwrap();
        let d = dir.path();
        let socket = d.join("containerd.sock");
        let snapshotter_socket = d.join("vial.sock");
        let config = d.join("config.toml");
        std::fs::write(
            &config,
            format!(
                // The block users are told to append: containerd 1.6 reads the proxy plugin's
                // type and address, and ignores its exports and the transfer service's table.
                "version = 2\nroot = \"{root}\"\nstate = \"{state}\"\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n[grpc]\n  address = \"{sock}\"\n{plugin}",
                root = d.join("root").display(),
                state = d.join("state").display(),
                sock = socket.display(),
                plugin = super::cri::containerd_block(&snapshotter_socket, &d.join("vial-root")),
            ),
        )
        .unwrap();
        let mut c = Containerd {
            socket: socket.clone(),
            snapshotter_socket,
            snapshotter_root: d.join("vial-root"),
            cache: d.join("vial-cache"),
            containerd: Command::new("true").spawn().unwrap(),
            snapshotter: None,
            dir,
        };
        // The snapshotter first: containerd backs off after a failed dial.
        c.start_snapshotter();
        let log = std::fs::File::create(c.dir.path().join("containerd.log")).unwrap();
        c.containerd = Command::new("containerd")
            .arg("--config")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start containerd");
        wait_for_socket(&socket, "containerd");
        // Answering means ready.
        let deadline = Instant::now() + Duration::from_secs(30);
        while !c.ctr(&["version"]).status.success() {
            assert!(Instant::now() < deadline, "containerd did not answer");
            std::thread::sleep(Duration::from_millis(100));
        }
        Some(c)
    }

    pub fn start_snapshotter(&mut self) {
        let log = std::fs::File::create(self.dir.path().join("snapshotter.log")).unwrap();
        let child = Command::new(vial_bin())
            .arg("snapshotter")
            .arg("--address")
            .arg(&self.snapshotter_socket)
            .arg("--root")
            .arg(&self.snapshotter_root)
            .arg("--cache-dir")
            .arg(&self.cache)
            .env(
                "VIAL_LOG",
                std::env::var("VIAL_TEST_SNAPSHOTTER_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start vial snapshotter");
        self.snapshotter = Some(child);
        wait_for_socket(&self.snapshotter_socket, "vial snapshotter");
    }

    /// Kills the snapshotter as a crash would; its socket file stays behind.
    pub fn kill_snapshotter(&mut self) {
        if let Some(mut child) = self.snapshotter.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.snapshotter_socket);
    }

    /// `ctr` against this containerd, in the default namespace.
    pub fn ctr(&self, args: &[&str]) -> Output {
        Command::new("ctr")
            .arg("--address")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run ctr")
    }

    /// `ctr`, panicking with its output and the daemons' logs if it fails; returns stdout.
    pub fn ctr_ok(&self, args: &[&str]) -> String {
        let out = self.ctr(args);
        assert!(
            out.status.success(),
            "ctr {args:?} failed: {}\n{}\n--- snapshotter log:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            self.snapshotter_log()
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn snapshotter_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("snapshotter.log")).unwrap_or_default()
    }
}

impl Drop for Containerd {
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
        // Whatever is still mounted under the directory (a failed test's mounts) goes lazily.
        let prefix = self.dir.path().display().to_string();
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
}

/// Writes a one-layer OCI image layout tagged `tag` with a static busybox at /bin/busybox, for
/// containers that need a shell. `None` without busybox.
pub fn busybox_layout(layout: &Path, tag: &str) -> Option<()> {
    super::oci::write_image_layout(layout, tag, &busybox_layer()?);
    Some(())
}

/// An uncompressed layer holding a static busybox at /bin/busybox. `None` without busybox.
pub fn busybox_layer() -> Option<Vec<u8>> {
    let busybox = peer("busybox")?;
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    tar.append_data(&mut header, "bin/", std::io::empty())
        .unwrap();
    let bytes = std::fs::read(&busybox).unwrap();
    let mut header = tar::Header::new_gnu();
    header.set_mode(0o755);
    header.set_size(bytes.len() as u64);
    tar.append_data(&mut header, "bin/busybox", &bytes[..])
        .unwrap();
    Some(tar.into_inner().unwrap())
}
