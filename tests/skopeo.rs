//! skopeo copies OCI layouts into vial and back out, with digests preserved.

use std::process::Command;

use crate::support::{oci, peer, run, Server};

fn skopeo() -> Option<Command> {
    let bin = peer("skopeo")?;
    let mut cmd = Command::new(bin);
    cmd.arg("--insecure-policy");
    Some(cmd)
}

#[test]
fn skopeo_copies_a_layout_in_and_out_with_digests_preserved() {
    let Some(_) = skopeo() else { return };
    let server = Server::start();
    let work = tempfile::tempdir().unwrap();
    let src = work.path().join("src");
    let manifest = oci::write_layout(&src, "v1", &[1 << 20, 3 * (1 << 20) + 17, 0, 4096], 1);
    let remote = format!("docker://{}/skopeo/round-trip:v1", server.addr);

    run(skopeo()
        .unwrap()
        .args(["copy", "--dest-tls-verify=false", "--preserve-digests"])
        .arg(format!("oci:{}:v1", src.display()))
        .arg(&remote));

    let raw = run(skopeo()
        .unwrap()
        .args(["inspect", "--tls-verify=false", "--raw", &remote]));
    let pushed = vial_core::Algorithm::Sha256.digest_bytes(raw.as_bytes());
    assert_eq!(
        pushed, manifest,
        "the manifest must keep its digest through vial"
    );

    let dst = work.path().join("dst");
    run(skopeo()
        .unwrap()
        .args([
            "copy",
            "--src-tls-verify=false",
            "--preserve-digests",
            &remote,
        ])
        .arg(format!("oci:{}:v1", dst.display())));
    for entry in std::fs::read_dir(src.join("blobs/sha256")).unwrap() {
        let entry = entry.unwrap();
        let copied = std::fs::read(dst.join("blobs/sha256").join(entry.file_name()))
            .unwrap_or_else(|_| panic!("blob {:?} missing after the copy back", entry.file_name()));
        assert_eq!(copied, std::fs::read(entry.path()).unwrap());
    }

    let tags = run(skopeo()
        .unwrap()
        .args(["list-tags", "--tls-verify=false"])
        .arg(format!("docker://{}/skopeo/round-trip", server.addr)));
    let tags: serde_json::Value = serde_json::from_str(&tags).unwrap();
    assert_eq!(tags["Tags"], serde_json::json!(["v1"]));

    let by_digest = format!("docker://{}/skopeo/round-trip@{manifest}", server.addr);
    run(skopeo()
        .unwrap()
        .args(["delete", "--tls-verify=false", &by_digest]));
    let gone = skopeo()
        .unwrap()
        .args(["inspect", "--tls-verify=false", "--raw", &by_digest])
        .output()
        .unwrap();
    assert!(
        !gone.status.success(),
        "a deleted manifest must not be served"
    );
}
