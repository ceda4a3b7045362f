//! containerd (Debian's 1.6, started here with its own root, state and socket) with vial's
//! snapshotter as a proxy plugin: ordinary images pull and run through it, a volume pulled with
//! `vial containerd pull` is mounted lazily and read byte for byte from a container, removing the
//! image releases the mount, and a restarted snapshotter keeps serving.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::containerd::{busybox_layout, Containerd};
use crate::support::oci::pseudo_random;
use crate::support::vial::{assert_same_tree, vial_ok};
use crate::support::{peer, run, Server};

fn is_mounted(path: &str) -> bool {
    std::fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(path))
}

/// The ids of the mounts at `path`, bottom to top (/proc/self/mountinfo: id first, mount point fifth).
fn mount_ids(path: &str) -> Vec<u64> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter(|l| l.split(' ').nth(4) == Some(path))
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect()
}

/// Whether nothing is mounted at `path` any more, or what is mounted there is a FUSE mount whose
/// daemon is gone (ENOTCONN). Listing the directory asks the daemon; a stat might be answered from
/// cached attributes.
fn mount_gone_or_dead(path: &str) -> bool {
    mount_ids(path).is_empty()
        || std::fs::read_dir(path).is_err_and(|e| e.raw_os_error() == Some(ENOTCONN))
}

/// What a FUSE mount answers once its daemon is gone (Linux's errno).
const ENOTCONN: i32 = 107;

fn stats(mountpoint: &str) -> serde_json::Value {
    let path = Path::new(mountpoint).join(vial_snapshotter::stats_file_name());
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// `sha256sum`-style lines for the files, as busybox prints them.
fn sums(root: &Path, files: &[&str], prefix: &str) -> String {
    files
        .iter()
        .map(|f| {
            let bytes = std::fs::read(root.join(f)).unwrap();
            format!(
                "{}  {prefix}/{f}\n",
                vial_core::Algorithm::Sha256.digest_bytes(&bytes).hex()
            )
        })
        .collect()
}

/// The block containerd's configuration needs is printed for the flags given, as valid TOML with
/// absolute paths (containerd resolves neither against the snapshotter's directory), and the
/// snapshotter exits without serving.
#[test]
fn the_snapshotter_prints_the_containerd_block_for_its_flags() {
    let dir = tempfile::tempdir().unwrap();
    let text = run(Command::new(crate::support::vial_bin())
        .current_dir(dir.path())
        .args(["snapshotter", "--print-containerd-config"])
        .args(["--address", "run/vial.sock", "--root", "snap shots"]));
    let parsed: toml::Value = toml::from_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let vial = &parsed["proxy_plugins"]["vial"];
    let root = dir.path().canonicalize().unwrap();
    assert_eq!(vial["type"].as_str(), Some("snapshot"));
    assert_eq!(
        vial["address"].as_str(),
        Some(root.join("run/vial.sock").to_str().unwrap())
    );
    assert_eq!(
        vial["exports"]["root"].as_str(),
        Some(root.join("snap shots").to_str().unwrap())
    );
    assert_eq!(
        vial["exports"]["enable_remote_snapshot_annotations"].as_str(),
        Some("true")
    );
    assert!(
        !dir.path().join("snap shots").exists() && !dir.path().join("run").exists(),
        "printing the block opened the snapshotter"
    );
}

#[test]
fn volumes_mount_lazily_in_containerd_and_ordinary_images_still_run() {
    let Some(skopeo) = peer("skopeo") else { return };
    let Some(mut ctd) = Containerd::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let server = Server::start();

    // containerd lists the proxy plugin, and it is up.
    let plugins = ctd.ctr_ok(&["plugins", "ls"]);
    assert!(
        plugins
            .lines()
            .any(|l| l.contains("io.containerd.snapshotter.v1")
                && l.contains("vial")
                && l.trim_end().ends_with("ok")),
        "{plugins}"
    );

    // An ordinary image, pulled by ctr itself through the snapshotter, runs.
    let layout = dir.path().join("busybox");
    if busybox_layout(&layout, "1").is_none() {
        return;
    }
    let image = format!("{}/images/busybox:1", server.addr);
    run(Command::new(&skopeo)
        .args(["copy", "--dest-tls-verify=false"])
        .arg(format!("oci:{}:1", layout.display()))
        .arg(format!("docker://{image}")));
    ctd.ctr_ok(&[
        "images",
        "pull",
        "--plain-http",
        "--snapshotter",
        "vial",
        &image,
    ]);
    let out = ctd.ctr_ok(&[
        "run",
        "--rm",
        "--snapshotter",
        "vial",
        &image,
        "hello",
        "/bin/busybox",
        "echo",
        "hello from vial",
    ]);
    assert_eq!(out.trim(), "hello from vial");
    // The same image through `vial containerd pull`, into another namespace: its layer is
    // downloaded and applied by containerd's differ, and it runs.
    let address = ctd.socket.to_str().unwrap().to_owned();
    let report: serde_json::Value = serde_json::from_str(&vial_ok(
        &home,
        &[
            "containerd",
            "pull",
            &image,
            "--address",
            &address,
            "--namespace",
            "other",
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(report["volume"], false, "{report}");
    assert_eq!(report["layers_unpacked"], 1);
    let out = ctd.ctr_ok(&[
        "--namespace",
        "other",
        "run",
        "--rm",
        "--snapshotter",
        "vial",
        &image,
        "hello2",
        "/bin/busybox",
        "echo",
        "pulled by vial",
    ]);
    assert_eq!(out.trim(), "pulled by vial");

    // A volume: pulled lazily, nothing of it fetched until read.
    let local = dir.path().join("weights");
    let files = ["model.safetensors", "config.json", "nested/tokenizer.json"];
    std::fs::create_dir_all(local.join("nested")).unwrap();
    std::fs::write(local.join(files[0]), pseudo_random(6 << 20, 61)).unwrap();
    std::fs::write(local.join(files[1]), br#"{"hidden": 8}"#).unwrap();
    std::fs::write(local.join(files[2]), b"{\"vocab\": {}}").unwrap();
    let volume = format!("{}/weights/tiny:v1", server.addr);
    vial_ok(&home, &["push", local.to_str().unwrap(), &volume]);
    let report: serde_json::Value = serde_json::from_str(&vial_ok(
        &home,
        &[
            "containerd",
            "pull",
            &volume,
            "--address",
            &address,
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(report["volume"], true, "{report}");
    assert_eq!(report["layers_unpacked"], 0);
    let mountpoint = report["mountpoint"].as_str().unwrap().to_owned();
    let chain = report["chain_id"].as_str().unwrap().to_owned();
    assert!(is_mounted(&mountpoint), "{mountpoint} is not mounted");
    assert_eq!(
        stats(&mountpoint)["chunks_fetched"],
        0,
        "a pull fetches no chunk"
    );
    let images = ctd.ctr_ok(&["images", "ls", "-q"]);
    assert!(images.lines().any(|l| l == volume), "{images}");
    let snapshots = ctd.ctr_ok(&["snapshots", "--snapshotter", "vial", "ls"]);
    assert!(snapshots.contains(&chain), "{snapshots}");

    // A container reads every file through a bind mount of the volume, byte for byte.
    let mount = format!("type=bind,src={mountpoint},dst=/mnt/weights,options=rbind:ro");
    let mut args = vec![
        "run",
        "--rm",
        "--snapshotter",
        "vial",
        "--mount",
        &mount,
        &image,
        "reader",
        "/bin/busybox",
        "sha256sum",
    ];
    let paths: Vec<String> = files.iter().map(|f| format!("/mnt/weights/{f}")).collect();
    args.extend(paths.iter().map(String::as_str));
    let out = ctd.ctr_ok(&args);
    assert_eq!(out, sums(&local, &files, "/mnt/weights"));
    assert!(stats(&mountpoint)["chunks_fetched"].as_u64().unwrap() > 0);
    // So does a view of the snapshot, as `ctr snapshots view` mounts it.
    let view = ctd.ctr_ok(&[
        "snapshots",
        "--snapshotter",
        "vial",
        "view",
        "--mounts",
        "weights-view",
        &chain,
    ]);
    assert!(
        view.contains(&mountpoint),
        "a view binds the volume's mount: {view}"
    );
    assert_same_tree(&local, Path::new(&mountpoint));
    // (ctr made the view under a lease of its own: containerd removes it with the lease.)

    // Killed and started again, the snapshotter mounts the volume again and serves as before. The
    // killed one's mount must be gone or dead first, or "mounted again" would prove nothing.
    // (Mount ids are reused, so the new mount is told from the old one by the old one being dead.)
    assert_eq!(mount_ids(&mountpoint).len(), 1, "one mount at {mountpoint}");
    ctd.kill_snapshotter();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !mount_gone_or_dead(&mountpoint) {
        assert!(
            Instant::now() < deadline,
            "the killed snapshotter's mount of {mountpoint} still answers"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    ctd.start_snapshotter();
    let mounts = mount_ids(&mountpoint);
    assert_eq!(
        mounts.len(),
        1,
        "the restarted snapshotter mounts the volume again, once, where the dead mount was: {mounts:?}"
    );
    assert!(
        std::fs::read_dir(&mountpoint).is_ok(),
        "the mount at {mountpoint} answers"
    );
    // containerd redials the proxy plugin with a backoff of its own.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ctd
        .ctr(&["snapshots", "--snapshotter", "vial", "ls"])
        .status
        .success()
    {
        assert!(
            Instant::now() < deadline,
            "containerd never reached the restarted snapshotter"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_same_tree(&local, Path::new(&mountpoint));
    let out = ctd.ctr_ok(&args);
    assert_eq!(out, sums(&local, &files, "/mnt/weights"));

    // Removing the image releases the mount.
    ctd.ctr_ok(&["images", "rm", "--sync", &volume]);
    let deadline = Instant::now() + Duration::from_secs(20);
    while is_mounted(&mountpoint) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !is_mounted(&mountpoint),
        "removing the image unmounts the volume\nsnapshots:\n{}\nleases:\n{}\ncontent:\n{}\nlog:\n{}",
        ctd.ctr_ok(&["snapshots", "--snapshotter", "vial", "ls"]),
        ctd.ctr_ok(&["leases", "ls"]),
        ctd.ctr_ok(&["content", "ls"]),
        ctd.snapshotter_log(),
    );
    let snapshots = ctd.ctr_ok(&["snapshots", "--snapshotter", "vial", "ls"]);
    assert!(!snapshots.contains(&chain), "{snapshots}");
}
