//! Copies between vial and Debian's docker-registry (CNCF Distribution 2.8), both ways.

use std::process::Command;

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
