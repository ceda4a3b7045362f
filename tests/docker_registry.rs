//! Debian's docker-registry (CNCF Distribution 2.8): copies with vial both ways, and volumes
//! pushed, pulled and mounted through it without any vial extension.

use std::io::Read;
use std::process::Command;

use crate::support::mount::{fuse_available, Mount};
use crate::support::vial::{assert_same_tree, vial_ok};
use crate::support::{oci, peer, run, DockerRegistry, Server};

#[test]
fn skopeo_copies_between_vial_and_docker_registry_keeping_digests() {
    let Some(skopeo) = peer("skopeo") else { return };
    let Some(peer_registry) = DockerRegistry::start() else {
        return;
    };
    let vial = Server::start();
    let work = tempfile::tempdir().unwrap();
    let layout = work.path().join("layout");
    let manifest = oci::write_layout(&layout, "v1", &[2 << 20, 12345], 7);
    let skopeo = || {
        let mut c = Command::new(&skopeo);
        c.args([
            "--insecure-policy",
            "copy",
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            "--preserve-digests",
        ]);
        c
    };

    let on_peer = format!("docker://{}/models/a:v1", peer_registry.addr);
    let on_vial = format!("docker://{}/mirror/models/a:v1", vial.addr);
    let back_on_peer = format!("docker://{}/models/back:v1", peer_registry.addr);
    run(skopeo()
        .arg(format!("oci:{}:v1", layout.display()))
        .arg(&on_peer));
    run(skopeo().arg(&on_peer).arg(&on_vial));
    run(skopeo().arg(&on_vial).arg(&back_on_peer));

    for reference in [&on_vial, &back_on_peer] {
        let raw = run(Command::new(peer("skopeo").unwrap()).args([
            "--insecure-policy",
            "inspect",
            "--tls-verify=false",
            "--raw",
            reference,
        ]));
        assert_eq!(
            vial_core::Algorithm::Sha256.digest_bytes(raw.as_bytes()),
            manifest,
            "{reference}"
        );
    }
}

#[test]
fn a_volume_pushed_to_docker_registry_pulls_and_mounts_without_vial_extensions() {
    let Some(peer_registry) = DockerRegistry::start() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Large enough for a sequential reader's read-ahead: runs that plain OCI registries serve a
    // chunk per request.
    let data = oci::pseudo_random(40 << 20, 31);
    std::fs::write(src.join("weights.bin"), &data).unwrap();
    std::fs::write(src.join("config.json"), b"{\"layers\": 2}").unwrap();
    let reference = format!("{}/models/plain:v1", peer_registry.addr);
    vial_ok(
        home.path(),
        &[
            "push",
            src.to_str().unwrap(),
            &format!("{}/models/plain", peer_registry.addr),
            "--tag",
            "v1",
        ],
    );
    let out = home.path().join("out");
    vial_ok(home.path(), &["pull", &reference, out.to_str().unwrap()]);
    assert_same_tree(&src, &out);

    if !fuse_available() {
        return;
    }
    let m = Mount::new(home.path(), &reference, "mnt", &[]);
    let mut f = std::fs::File::open(m.path.join("weights.bin")).unwrap();
    let mut read = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        read.extend_from_slice(&buf[..n]);
    }
    assert!(read == data, "the mount read back other bytes");
    assert!(m.stats()["prefetched_chunks"].as_u64().unwrap() > 0);
}
