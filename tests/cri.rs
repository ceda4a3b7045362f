//! Kubernetes for real: containerd 2.x's CRI plugin, driven the way kubelet drives it, pulls a
//! volume lazily through vial's snapshotter and mounts it into a container as an image volume
//! (`volumes: - image: {reference: …}`); removing the pod and the image releases the mount. A node
//! whose containerd unpacks with an ordinary snapshotter refuses the volume cleanly.

use std::path::Path;
use std::process::Command;

use k8s_cri::v1::*;

use crate::support::containerd::busybox_layer;
use crate::support::cri::Cri;
use crate::support::model::{bert_like, write_safetensors};
use crate::support::oci::{pseudo_random, write_image_layout_running};
use crate::support::vial::{lease_holders, push_json, vial, vial_ok};
use crate::support::{du, peer, run, Server};

/// The bytes `ctr snapshots usage` reports for snapshot `key` (it prints them as "25.3 MiB").
fn snapshot_usage(cri: &Cri, key: &str) -> f64 {
    let out = cri.ctr_ok(&["snapshots", "--snapshotter", "vial", "usage", key]);
    let line = out
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no usage of {key}: {out}"));
    let fields: Vec<&str> = line.split_whitespace().collect();
    let unit = match fields.get(2) {
        Some(&"B") => 1.0,
        Some(&"KiB") => 1024.0,
        Some(&"MiB") => 1024.0 * 1024.0,
        Some(&"GiB") => 1024.0 * 1024.0 * 1024.0,
        other => panic!("unexpected unit {other:?}: {out}"),
    };
    fields[1].parse::<f64>().unwrap() * unit
}

/// Waits until the volume whose tree is `tree` is released after its image was removed: its
/// snapshot gone from `namespace` and vial's mount of it gone (and `also` true). containerd
/// removes an image's snapshots in the garbage collection that follows the removal: this waits
/// for the state, not for a time.
fn wait_until_released(cri: &Cri, namespace: &str, tree: &str, also: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let snapshots = cri.ctr_ok_in(namespace, &["snapshots", "--snapshotter", "vial", "ls"]);
        let mounts = volume_mounts(&cri.snapshotter_root);
        if !snapshots.contains(tree) && mounts.is_empty() && also() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the volume is still there after its image was removed: {snapshots}\n{mounts:?}\n{}",
            cri.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// FUSE mounts of vial volumes under `root`.
fn volume_mounts(root: &Path) -> Vec<String> {
    let prefix = root.display().to_string();
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .filter(|l| {
            l.contains("fuse") && l.split(' ').nth(1).is_some_and(|t| t.starts_with(&prefix))
        })
        .map(str::to_owned)
        .collect()
}

/// The digest of the tree layer of a volume's image-shaped manifest: the chain ID of its
/// snapshot.
fn tree_layer(server: &Server, repo: &str, tag: &str) -> String {
    let c = reqwest::blocking::Client::new();
    let get = |reference: &str| -> serde_json::Value {
        c.get(format!("{}/v2/{repo}/manifests/{reference}", server.url()))
            .header(
                "accept",
                format!(
                    "{}, {}",
                    vial_core::media::OCI_INDEX,
                    vial_core::media::OCI_MANIFEST
                ),
            )
            .send()
            .unwrap()
            .json()
            .unwrap()
    };
    let index = get(tag);
    let image = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["platform"]["architecture"] == "amd64")
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_owned();
    let manifest = get(&image);
    let layer = &manifest["layers"][0];
    assert_eq!(
        layer["mediaType"],
        vial_core::volume::IMAGE_LAYER_MEDIA_TYPE,
        "a layer type containerd 2.x unpacks"
    );
    layer["digest"].as_str().unwrap().to_owned()
}

/// Pushes a busybox image (with `entrypoint`, for a sandbox) to `reference` with skopeo.
fn push_busybox(skopeo: &Path, dir: &Path, reference: &str, entrypoint: &[&str]) -> Option<()> {
    let layout = dir.join(reference.replace(['/', ':'], "_"));
    write_image_layout_running(&layout, "1", &busybox_layer()?, entrypoint);
    run(Command::new(skopeo)
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:1", layout.display()))
        .arg(format!("docker://{reference}")));
    Some(())
}

fn pod_config(name: &str, logs: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.into(),
            uid: format!("{name}-uid"),
            namespace: "default".into(),
            attempt: 0,
        }),
        // Host network, so no CNI is needed; then the hostname must stay unset (runc cannot set
        // one without a UTS namespace of the pod's own).
        log_directory: logs.display().to_string(),
        linux: Some(LinuxPodSandboxConfig {
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(NamespaceOption {
                    network: NamespaceMode::Node as i32,
                    pid: NamespaceMode::Container as i32,
                    ipc: NamespaceMode::Pod as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[test]
fn a_volume_mounts_lazily_as_a_kubernetes_image_volume_on_containerd_2() {
    let Some(skopeo) = peer("skopeo") else { return };
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let src = dir.path().join("model");
    std::fs::create_dir_all(src.join("tokenizer")).unwrap();
    std::fs::write(src.join("config.json"), br#"{"hidden_size": 64}"#).unwrap();
    std::fs::write(src.join("tokenizer/vocab.txt"), b"a\nb\nc\n").unwrap();
    std::fs::write(src.join("weights.bin"), pseudo_random(24 << 20, 7)).unwrap();
    write_safetensors(&src.join("model.safetensors"), &bert_like(2, 3));
    let files = [
        "config.json",
        "tokenizer/vocab.txt",
        "weights.bin",
        "model.safetensors",
    ];
    let volume = format!("{}/weights/cri:v1", server.addr);
    let pinned = push_json(
        &home,
        &src,
        &format!("{}/weights/cri", server.addr),
        &["--tag", "v1"],
    )["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    let tree = tree_layer(&server, "weights/cri", "v1");
    let pause = format!("{}/k8s/pause:1", server.addr);
    let app = format!("{}/images/busybox:1", server.addr);
    if push_busybox(
        &skopeo,
        dir.path(),
        &pause,
        &["/bin/busybox", "sleep", "2147483647"],
    )
    .is_none()
        || push_busybox(&skopeo, dir.path(), &app, &[]).is_none()
    {
        return;
    }
    let Some(cri) = Cri::start("vial", &server.addr, &pause) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let (mut rt, mut im) = cri.clients().await;
        let spec = |image: &str| ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        };
        let pull = |image: String| {
            let mut im = im.clone();
            async move {
                im.pull_image(PullImageRequest {
                    image: Some(ImageSpec {
                        image,
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .await
            }
        };

        // PullImage of the volume: the snapshotter is asked, mounts it lazily, downloads nothing.
        let pulled = pull(volume.clone())
            .await
            .unwrap_or_else(|e| panic!("PullImage of the volume: {e}\n{}", cri.log()));
        assert!(!pulled.get_ref().image_ref.is_empty());
        let mounts = volume_mounts(&cri.snapshotter_root);
        assert_eq!(mounts.len(), 1, "one lazy mount: {mounts:?}\n{}", cri.log());
        let cached = du(&cri.cache);
        assert!(
            cached < 1 << 20,
            "the pull fetched {cached} bytes of a 25 MiB volume: not lazy"
        );

        // The image filesystem, as kubelet's eviction manager and image garbage collection ask
        // for it: vial's is the snapshotter's root (the block `vial snapshotter
        // --print-containerd-config` prints exports it), and every one reported exists.
        let fs = im
            .clone()
            .image_fs_info(ImageFsInfoRequest {})
            .await
            .unwrap_or_else(|e| panic!("ImageFsInfo: {e}\n{}", cri.log()))
            .into_inner();
        let mountpoints: Vec<String> = fs
            .image_filesystems
            .iter()
            .filter_map(|f| f.fs_id.as_ref().map(|id| id.mountpoint.clone()))
            .collect();
        for mountpoint in &mountpoints {
            assert!(
                Path::new(mountpoint).is_dir(),
                "ImageFsInfo names {mountpoint}, which does not exist: kubelet cannot stat it"
            );
        }
        let root = cri.snapshotter_root.to_string_lossy().into_owned();
        assert!(
            mountpoints.contains(&root),
            "ImageFsInfo does not name the snapshotter's root {root}: {mountpoints:?}"
        );
        let snapshots = cri.ctr_ok(&["snapshots", "--snapshotter", "vial", "ls"]);
        assert!(snapshots.contains(&tree), "{snapshots}");

        // A pod (host network, pause image from the registry) with a container that mounts the
        // volume as an image volume, and reads every file.
        pull(app.clone()).await.unwrap();
        let logs = cri.dir.path().join("pod-logs");
        std::fs::create_dir_all(&logs).unwrap();
        let pod_cfg = pod_config("reader", &logs);
        let pod = rt
            .run_pod_sandbox(RunPodSandboxRequest {
                config: Some(pod_cfg.clone()),
                runtime_handler: String::new(),
            })
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e}\n{}", cri.log()))
            .into_inner()
            .pod_sandbox_id;
        let container = rt
            .create_container(CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(ContainerConfig {
                    metadata: Some(ContainerMetadata {
                        name: "reader".into(),
                        attempt: 0,
                    }),
                    image: Some(spec(&app)),
                    command: vec!["/bin/busybox".into(), "sleep".into(), "3600".into()],
                    log_path: "reader.log".into(),
                    mounts: vec![Mount {
                        container_path: "/mnt/model".into(),
                        image: Some(spec(&volume)),
                        readonly: true,
                        ..Default::default()
                    }],
                    linux: Some(LinuxContainerConfig::default()),
                    ..Default::default()
                }),
                sandbox_config: Some(pod_cfg),
            })
            .await
            .unwrap_or_else(|e| panic!("CreateContainer with an image volume: {e}\n{}", cri.log()))
            .into_inner()
            .container_id;
        rt.start_container(StartContainerRequest {
            container_id: container.clone(),
        })
        .await
        .unwrap();
        let mut cmd = vec!["/bin/busybox".to_owned(), "sha256sum".to_owned()];
        cmd.extend(files.iter().map(|f| format!("/mnt/model/{f}")));
        let exec = rt
            .exec_sync(ExecSyncRequest {
                container_id: container.clone(),
                cmd,
                timeout: 60,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            exec.exit_code,
            0,
            "{}",
            String::from_utf8_lossy(&exec.stderr)
        );
        let expected: String = files
            .iter()
            .map(|f| {
                let bytes = std::fs::read(src.join(f)).unwrap();
                format!(
                    "{}  /mnt/model/{f}\n",
                    vial_core::Algorithm::Sha256.digest_bytes(&bytes).hex()
                )
            })
            .collect();
        assert_eq!(String::from_utf8_lossy(&exec.stdout), expected);

        // What the volume holds on the node now is what the container read, in the node cache,
        // and the snapshotter reports it as the snapshot's usage.
        let cached = du(&cri.cache) as f64;
        let usage = snapshot_usage(&cri, &tree);
        assert!(
            cached > 24.0 * 1024.0 * 1024.0 && (usage - cached).abs() < cached * 0.02,
            "the volume's snapshot reports {usage} bytes; the node cache holds {cached}"
        );

        // While the pod runs, the node holds a lease on the version, so it cannot be deleted
        // from under the container.
        let holders = lease_holders(&server, &pinned);
        assert!(
            !holders.is_empty(),
            "no lease on {pinned} while a pod reads it\n{}",
            cri.log()
        );
        let refused = vial(&home, &["rm", &volume]);
        assert!(
            !refused.status.success(),
            "a version a running pod mounts was deleted"
        );
        let stderr = String::from_utf8_lossy(&refused.stderr);
        assert!(
            holders.iter().any(|h| stderr.contains(h.as_str())),
            "the refusal names the holder {holders:?}: {stderr}"
        );

        // Stop and remove the pod, then the image: the volume is unmounted, its snapshot gone.
        rt.stop_container(StopContainerRequest {
            container_id: container.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
        rt.remove_container(RemoveContainerRequest {
            container_id: container,
        })
        .await
        .unwrap();
        rt.stop_pod_sandbox(StopPodSandboxRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
        rt.remove_pod_sandbox(RemovePodSandboxRequest {
            pod_sandbox_id: pod,
        })
        .await
        .unwrap();
        im.remove_image(RemoveImageRequest {
            image: Some(spec(&volume)),
        })
        .await
        .unwrap();
        // The lease goes with the mount.
        wait_until_released(&cri, "k8s.io", &tree, || {
            lease_holders(&server, &pinned).is_empty()
        });
        // Removing the image (as kubelet's image garbage collection does) released the volume's
        // chunks from the node cache: the disk is free again.
        let cached = du(&cri.cache);
        assert!(
            cached < 1 << 20,
            "the node cache still holds {cached} bytes of the removed volume"
        );
    });
    // The lease went with the mount: the version can be deleted now.
    vial_ok(&home, &["rm", &volume]);
}

/// Pushes a volume of a small `config.json` and a `weights.bin` of `len` pseudo-random bytes as
/// `REPO:v1` (the files under `dir/model`); returns its reference.
fn push_weights(server: &Server, dir: &Path, repo: &str, len: usize) -> String {
    let src = dir.join("model");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("config.json"), br#"{"hidden_size": 64}"#).unwrap();
    std::fs::write(src.join("weights.bin"), pseudo_random(len, len as u64)).unwrap();
    let target = format!("{}/{repo}", server.addr);
    push_json(&dir.join("home"), &src, &target, &["--tag", "v1"]);
    format!("{target}:v1")
}

/// Bytes in containerd's content store: what a pull downloaded.
fn content_store(cri: &Cri) -> u64 {
    du(&cri.dir.path().join("root/io.containerd.content.v1.content"))
}

#[test]
fn a_volume_pulled_through_containerds_transfer_service_stays_lazy_beside_an_ordinary_image() {
    let Some(skopeo) = peer("skopeo") else { return };
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let volume = push_weights(&server, dir.path(), "weights/transfer", 24 << 20);
    let tree = tree_layer(&server, "weights/transfer", "v1");
    let app = format!("{}/images/busybox:1", server.addr);
    if push_busybox(&skopeo, dir.path(), &app, &["/bin/busybox", "true"]).is_none() {
        return;
    }
    let Some(cri) = Cri::start("vial", &server.addr, &app) else {
        return;
    };

    // `ctr images pull` on containerd 2.x goes through the transfer service, as nerdctl does (in a
    // namespace of its own, as nerdctl's: the CRI's keeps extra records of every image).
    let pull = ["images", "pull", "--plain-http", "--snapshotter", "vial"];
    cri.ctr_ok_in("default", &[&pull[..], &[&volume]].concat());
    let stored = content_store(&cri);
    assert!(
        stored < 1 << 20,
        "containerd's content store holds {stored} bytes after a transfer-service pull of a 24 MiB \
         volume: it downloaded the volume\n{}",
        cri.log()
    );
    assert_eq!(
        volume_mounts(&cri.snapshotter_root).len(),
        1,
        "the volume is mounted\n{}",
        cri.log()
    );
    let cached = du(&cri.cache);
    assert!(
        cached < 1 << 20,
        "the pull fetched {cached} bytes: not lazy"
    );
    let snapshots = cri.ctr_ok_in("default", &["snapshots", "--snapshotter", "vial", "ls"]);
    assert!(snapshots.contains(&tree), "{snapshots}");

    // An ordinary image pulled the same way still unpacks through vial, and runs.
    cri.ctr_ok_in("default", &[&pull[..], &[&app]].concat());
    let said = cri.ctr_ok_in(
        "default",
        &[
            "run",
            "--rm",
            "--snapshotter",
            "vial",
            "--net-host",
            &app,
            "transfer-check",
            "/bin/busybox",
            "echo",
            "unpacked",
        ],
    );
    assert_eq!(said.trim(), "unpacked");

    // Removing the volume's image unmounts it and drops its snapshot.
    cri.ctr_ok_in("default", &["images", "rm", "--sync", &volume]);
    wait_until_released(&cri, "default", &tree, || true);
}

#[test]
fn a_node_without_the_vial_snapshotter_refuses_a_volume_and_unpacks_nothing() {
    let Some(skopeo) = peer("skopeo") else { return };
    let server = Server::start();
    let dir = tempfile::tempdir().unwrap();
    let volume = push_weights(&server, dir.path(), "weights/plain", 3 << 20);
    let pause = format!("{}/k8s/pause:1", server.addr);
    if push_busybox(
        &skopeo,
        dir.path(),
        &pause,
        &["/bin/busybox", "sleep", "2147483647"],
    )
    .is_none()
    {
        return;
    }
    let Some(cri) = Cri::start("overlayfs", &server.addr, &pause) else {
        return;
    };
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let err = runtime.block_on(async {
        let (_, mut im) = cri.clients().await;
        im.pull_image(PullImageRequest {
            image: Some(ImageSpec {
                image: volume.clone(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect_err("an ordinary snapshotter cannot unpack a volume")
    });
    let message = err.message().to_owned();
    assert!(
        message.contains("vial.tree"),
        "the failure names the volume's layer type: {message}"
    );
    let snapshots = cri.ctr_ok(&["snapshots", "--snapshotter", "overlayfs", "ls"]);
    assert_eq!(
        snapshots.lines().skip(1).count(),
        0,
        "nothing half-unpacked is left: {snapshots}"
    );
}
