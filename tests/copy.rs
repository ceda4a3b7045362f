//! Copies and tag moves: `vial copy` between vial and Debian's docker-registry with digests kept
//! and only missing chunks sent; tag moves the way `crane tag`/`oras tag` and `skopeo copy` do them.

use std::path::Path;
use std::process::Command;

use crate::support::oci::pseudo_random;
use crate::support::vial::{assert_same_tree, push_json, vial_ok};
use crate::support::{oci, peer, run, DockerRegistry, Server};

fn copy_json(home: &Path, src: &str, dst: &str) -> serde_json::Value {
    serde_json::from_str(&vial_ok(home, &["copy", src, dst, "--json"])).expect("copy --json")
}

#[test]
fn vial_copy_moves_versions_between_registries_sending_only_what_is_missing() {
    let Some(distribution) = DockerRegistry::start() else {
        return;
    };
    let a = Server::start();
    let b = Server::start();
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let src = work.path().join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("weights.bin"), pseudo_random(24 << 20, 1)).unwrap();
    std::fs::write(src.join("sub/config.json"), b"{\"layers\": 4}").unwrap();
    let v1 = push_json(
        &home,
        &src,
        &format!("{}/weights/m", a.addr),
        &["--tag", "v1"],
    );
    let v1_digest = v1["digest"].as_str().unwrap().to_owned();

    // vial -> Distribution: everything is sent, the digest is kept.
    let to_peer = copy_json(
        &home,
        &format!("{}/weights/m:v1", a.addr),
        &format!("{}/weights/m", distribution.addr),
    );
    assert_eq!(to_peer["digest"], v1_digest.as_str());
    assert_eq!(to_peer["blobs_copied"], to_peer["blobs"]);
    assert!(to_peer["bytes_copied"].as_u64().unwrap() >= 24 << 20);

    // Distribution -> another vial, under another name and tag; then pull it and compare.
    let to_b = copy_json(
        &home,
        &format!("{}/weights/m:v1", distribution.addr),
        &format!("{}/mirror/m:stable", b.addr),
    );
    assert_eq!(to_b["digest"], v1_digest.as_str());
    let out = work.path().join("out");
    vial_ok(
        &home,
        &[
            "pull",
            &format!("{}/mirror/m:stable", b.addr),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &out);

    // The next version changes 1 MiB in the middle: copying it sends about that, not 24 MiB.
    let mut weights = std::fs::read(src.join("weights.bin")).unwrap();
    weights[12 << 20..13 << 20].copy_from_slice(&pseudo_random(1 << 20, 2));
    std::fs::write(src.join("weights.bin"), &weights).unwrap();
    let v2 = push_json(
        &home,
        &src,
        &format!("{}/weights/m", a.addr),
        &["--tag", "v2"],
    );
    for dst in [
        format!("{}/weights/m", distribution.addr),
        format!("{}/mirror/m", b.addr),
    ] {
        let report = copy_json(&home, &format!("{}/weights/m:v2", a.addr), &dst);
        assert_eq!(report["digest"], v2["digest"]);
        assert!(report["blobs_present"].as_u64().unwrap() > 0, "{report}");
        assert!(
            report["bytes_copied"].as_u64().unwrap() < 12 << 20,
            "only the changed chunks travel: {report}"
        );
    }

    // Within one registry nothing travels: vial links the blobs it already holds.
    let local = copy_json(
        &home,
        &format!("{}/weights/m@{v1_digest}", a.addr),
        &format!("{}/team/m:v1", a.addr),
    );
    assert_eq!(local["digest"], v1_digest.as_str());
    assert_eq!(local["bytes_copied"], 0);
    assert_eq!(
        local["blobs_present"].as_u64().unwrap() + local["blobs_mounted"].as_u64().unwrap(),
        local["blobs"].as_u64().unwrap()
    );
    // Within Distribution, which has no such extension, they are mounted across repositories.
    let mounted = copy_json(
        &home,
        &format!("{}/weights/m:v1", distribution.addr),
        &format!("{}/team/m", distribution.addr),
    );
    assert_eq!(mounted["bytes_copied"], 0);
    assert_eq!(mounted["blobs_mounted"], mounted["blobs"]);

    // A source that does not exist is a clear error.
    let out = crate::support::vial::vial(
        &home,
        &[
            "copy",
            &format!("{}/weights/nothing:v9", a.addr),
            &format!("{}/x/y", b.addr),
        ],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn tag_moves_keep_digests_and_upload_nothing() {
    let server = Server::start();
    let base = server.url();
    let c = reqwest::blocking::Client::new();
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("w.bin"), pseudo_random(5 << 20, 3)).unwrap();
    let pushed = push_json(
        &home,
        &src,
        &format!("{}/weights/t", server.addr),
        &["--tag", "v1"],
    );
    let digest = pushed["digest"].as_str().unwrap().to_owned();
    let received = |c: &reqwest::blocking::Client| {
        let metrics = c
            .get(format!("{base}/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        metrics
            .lines()
            .find_map(|l| l.strip_prefix("vial_bytes_received_total "))
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    let before = received(&c);

    // `crane tag` / `oras tag`: GET the manifest's bytes, PUT them back under the new tag.
    let r = c
        .get(format!("{base}/v2/weights/t/manifests/v1"))
        .header("accept", vial_core::media::OCI_INDEX)
        .send()
        .unwrap();
    let media_type = r.headers()["content-type"].to_str().unwrap().to_owned();
    let bytes = r.bytes().unwrap();
    let r = c
        .put(format!("{base}/v2/weights/t/manifests/prod"))
        .header("content-type", media_type)
        .body(bytes)
        .send()
        .unwrap();
    assert_eq!(r.status(), 201);
    assert_eq!(r.headers()["docker-content-digest"], digest.as_str());
    assert_eq!(received(&c), before, "a tag move uploads no blob");
    let r = c
        .head(format!("{base}/v2/weights/t/manifests/prod"))
        .send()
        .unwrap();
    assert_eq!(r.headers()["docker-content-digest"], digest.as_str());

    // skopeo copy between two tags of one image manifest keeps its digest.
    let Some(skopeo) = peer("skopeo") else { return };
    let layout = work.path().join("layout");
    let manifest = oci::write_layout(&layout, "v1", &[1 << 20], 4);
    let skopeo_copy = |from: &str, to: &str| {
        run(Command::new(&skopeo)
            .args(["--insecure-policy", "copy", "--src-tls-verify=false"])
            .args(["--dest-tls-verify=false", "--preserve-digests", from, to]));
    };
    skopeo_copy(
        &format!("oci:{}:v1", layout.display()),
        &format!("docker://{}/images/x:v1", server.addr),
    );
    skopeo_copy(
        &format!("docker://{}/images/x:v1", server.addr),
        &format!("docker://{}/images/x:v2", server.addr),
    );
    let r = c
        .head(format!("{base}/v2/images/x/manifests/v2"))
        .header("accept", vial_core::media::OCI_MANIFEST)
        .send()
        .unwrap();
    assert_eq!(r.headers()["docker-content-digest"], manifest.as_str());
}

#[test]
fn copy_progress_accounts_for_every_byte_that_travels() {
    use std::sync::atomic::{AtomicU64, Ordering};
    use vial_client::progress::{Event, Progress};

    #[derive(Default)]
    struct Count {
        total: AtomicU64,
        needed: AtomicU64,
        transferred: AtomicU64,
    }
    impl Progress for Count {
        fn event(&self, event: Event) {
            match event {
                Event::Scanned { bytes, .. } => self.total.fetch_add(bytes, Ordering::Relaxed),
                Event::Needed(n) => self.needed.fetch_add(n, Ordering::Relaxed),
                Event::Transferred(n) => self.transferred.fetch_add(n, Ordering::Relaxed),
                Event::Hashed(_) => 0,
            };
        }
    }

    let (a, b) = (Server::start(), Server::start());
    let work = tempfile::tempdir().unwrap();
    let home = work.path().join("home");
    let src = work.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("w.bin"), pseudo_random(6 << 20, 8)).unwrap();
    let pushed = push_json(
        &home,
        &src,
        &format!("{}/weights/p", a.addr),
        &["--tag", "v1"],
    );

    let count = Count::default();
    let options = vial_client::RegistryOptions::default();
    let (from, to) = (
        vial_client::Registry::new(&a.addr, &options).unwrap(),
        vial_client::Registry::new(&b.addr, &options).unwrap(),
    );
    let repo = vial_core::RepoName::parse("weights/p").unwrap();
    let report = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(vial_client::copy::copy(
            vial_client::copy::Endpoints {
                src: &from,
                src_repo: &repo,
                dst: &to,
                dst_repo: &repo,
            },
            &vial_core::Target::Tag(vial_core::Tag::parse("v1").unwrap()),
            &[],
            &count,
        ))
        .unwrap();
    assert_eq!(report.digest, pushed["digest"].as_str().unwrap());
    let needed = count.needed.load(Ordering::Relaxed);
    assert_eq!(needed, count.transferred.load(Ordering::Relaxed));
    assert_eq!(needed, report.bytes_copied);
    assert!(count.total.load(Ordering::Relaxed) >= 6 << 20);
}
