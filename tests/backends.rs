//! The registry on PostgreSQL: the conformance suite, client round trips, two replicas over one
//! database, and the database going away mid-push.

use std::time::Duration;

use crate::support::oci::pseudo_random;
use crate::support::postgres::PgCluster;
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::{push_blob, push_manifest, Server};

fn serve_on(pg: &PgCluster, db: &str, data: &std::path::Path) -> Server {
    let url = pg.database(db);
    Server::start_on(data, &["--metadata-url", &url])
}

#[test]
fn postgres_backend_passes_every_conformance_check() {
    let Some(pg) = PgCluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_on(&pg, "conformance", &dir.path().join("blobs"));
    crate::support::conformance::assert_all_pass(
        &crate::support::conformance::run(&server.url()),
        "PostgreSQL + filesystem",
    );
}

#[test]
fn two_replicas_over_one_database_behave_as_one_registry() {
    let Some(pg) = PgCluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = pg.database("replicas");
    let blobs = dir.path().join("blobs");
    let a = Server::start_on(&blobs, &["--metadata-url", &url]);
    let b = Server::start_on(&blobs, &["--metadata-url", &url]);
    replicas_behave_as_one(&a, &b, dir.path());
}

/// Push through one replica and pull through the other, split a chunked upload across them, and
/// race 50 tag moves over both.
pub fn replicas_behave_as_one(a: &Server, b: &Server, dir: &std::path::Path) {
    // Push a volume through one replica, pull it through the other.
    let home = dir.join("home");
    let src = home.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("w.bin"), pseudo_random(9 << 20, 4)).unwrap();
    push_json(
        &home,
        &src,
        &format!("{}/weights/replicated", a.addr),
        &["--tag", "v1"],
    );
    let out = home.join("out");
    vial_ok(
        &home,
        &[
            "pull",
            &format!("{}/weights/replicated:v1", b.addr),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &out);

    // A chunked upload started on one replica and finished on the other.
    let c = reqwest::blocking::Client::new();
    let data = pseudo_random(3 << 20, 6);
    let start = c
        .post(format!("{}/v2/split/blobs/uploads/", a.url()))
        .send()
        .unwrap();
    let path = start.headers()["location"].to_str().unwrap().to_owned();
    let r = c
        .patch(format!("{}{path}", a.url()))
        .header("content-range", format!("0-{}", (1 << 20) - 1))
        .body(data[..1 << 20].to_vec())
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    let r = c.get(format!("{}{path}", b.url())).send().unwrap();
    assert_eq!(
        r.headers()["range"],
        format!("0-{}", (1 << 20) - 1),
        "the other replica sees the session"
    );
    let digest = vial_core::Algorithm::Sha256.digest_bytes(&data);
    let r = c
        .put(format!("{}{path}?digest={digest}", b.url()))
        .body(data[1 << 20..].to_vec())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap_or_default());
    assert_eq!(
        c.get(format!("{}/v2/split/blobs/{digest}", a.url()))
            .send()
            .unwrap()
            .bytes()
            .unwrap()
            .as_ref(),
        data.as_slice()
    );

    // 50 compare-and-swap tag moves racing across both replicas: every winner saw the tag where it
    // expected it, so the winners form one chain and the tag ends on the last winner's manifest.
    let layer = push_blob(&c, &a.url(), "race", b"layer");
    let (first, _) = push_manifest(&c, &a.url(), "race", "t", &[(layer.clone(), 5)]);
    let manifests: Vec<(vial_core::Digest, Vec<u8>)> = (0..50)
        .map(|i| {
            let body = serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2,
                "mediaType": vial_core::media::OCI_MANIFEST,
                "config": {"mediaType": vial_core::media::OCI_EMPTY, "digest": vial_core::media::OCI_EMPTY_DIGEST, "size": 2},
                "layers": [{"mediaType": "application/octet-stream", "digest": layer, "size": 5}],
                "annotations": {"n": i.to_string()},
            }))
            .unwrap();
            (vial_core::Algorithm::Sha256.digest_bytes(&body), body)
        })
        .collect();
    let handles: Vec<_> = manifests
        .into_iter()
        .enumerate()
        .map(|(i, (digest, body))| {
            let base = if i % 2 == 0 { a.url() } else { b.url() };
            let first = first.clone();
            std::thread::spawn(move || {
                let c = reqwest::blocking::Client::new();
                let mut expected = first;
                for _ in 0..20 {
                    let r = c
                        .put(format!("{base}/v2/race/manifests/t"))
                        .header("content-type", vial_core::media::OCI_MANIFEST)
                        .header("if-match", format!("\"{expected}\""))
                        .body(body.clone())
                        .send()
                        .unwrap();
                    match r.status().as_u16() {
                        201 => return Some((expected, digest)),
                        412 => {
                            let v: serde_json::Value = r.json().unwrap();
                            expected = vial_core::Digest::parse(
                                v["errors"][0]["detail"]["current"].as_str().unwrap(),
                            )
                            .unwrap();
                        }
                        s => panic!("unexpected status {s}"),
                    }
                }
                None
            })
        })
        .collect();
    let wins: Vec<(vial_core::Digest, vial_core::Digest)> = handles
        .into_iter()
        .filter_map(|h| h.join().unwrap())
        .collect();
    assert!(!wins.is_empty());
    // Follow the chain of moves from the first manifest: each win moved the tag from where the
    // previous one left it, so the chain visits every win exactly once.
    let mut at = first.clone();
    let mut steps = 0;
    while let Some((_, to)) = wins.iter().find(|(from, _)| *from == at) {
        at = to.clone();
        steps += 1;
    }
    assert_eq!(
        steps,
        wins.len(),
        "some moves were lost: the wins do not form one chain"
    );
    let final_digest = c
        .head(format!("{}/v2/race/manifests/t", b.url()))
        .send()
        .unwrap()
        .headers()["docker-content-digest"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(final_digest, at.to_string());
}

#[test]
fn pushes_fail_with_503_while_postgres_is_down_and_succeed_after() {
    let Some(pg) = PgCluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let server = serve_on(&pg, "outage", &dir.path().join("blobs"));
    let c = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    let before = push_blob(&c, &server.url(), "outage", b"before the outage");

    pg.stop();
    let data = pseudo_random(1 << 20, 77);
    let digest = vial_core::Algorithm::Sha256.digest_bytes(&data);
    let r = c
        .post(format!(
            "{}/v2/outage/blobs/uploads/?digest={digest}",
            server.url()
        ))
        .body(data.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), 503, "a push while the database is down");
    let body: serde_json::Value = r.json().unwrap();
    assert_eq!(body["errors"][0]["code"], "UNAVAILABLE");
    let r = c
        .get(format!("{}/v2/outage/blobs/{before}", server.url()))
        .send()
        .unwrap();
    assert_eq!(
        r.status(),
        503,
        "reads fail clearly too, not with a 404 that would lie"
    );
    assert_eq!(
        c.get(format!("{}/readyz", server.url()))
            .send()
            .unwrap()
            .status(),
        503
    );

    pg.start_again();
    // The pool reconnects by itself: wait until reads work again.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = c
            .get(format!("{}/v2/outage/blobs/{before}", server.url()))
            .send()
            .unwrap();
        if r.status() == 200 {
            assert_eq!(r.bytes().unwrap().as_ref(), b"before the outage");
            break;
        }
        assert_eq!(r.status(), 503, "while the pool reconnects");
        assert!(
            std::time::Instant::now() < deadline,
            "the registry did not recover: {}",
            r.status()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        c.get(format!("{}/readyz", server.url()))
            .send()
            .unwrap()
            .status(),
        200
    );
    // Nothing of the failed push is visible.
    let r = c
        .head(format!("{}/v2/outage/blobs/{digest}", server.url()))
        .send()
        .unwrap();
    assert_eq!(
        r.status(),
        404,
        "the push refused during the outage left a blob"
    );
    // The same push now succeeds and reads back whole.
    let r = c
        .post(format!(
            "{}/v2/outage/blobs/uploads/?digest={digest}",
            server.url()
        ))
        .body(data.clone())
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "the same push once the database is back");
    let r = c
        .get(format!("{}/v2/outage/blobs/{digest}", server.url()))
        .send()
        .unwrap();
    assert!(r.bytes().unwrap().as_ref() == data.as_slice());
    let home = dir.path().join("home");
    let src = home.join("src");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("after.bin"), pseudo_random(100_000, 1)).unwrap();
    push_json(&home, &src, &format!("{}/weights/after", server.addr), &[]);
    assert!(vial(
        &home,
        &["versions", &format!("{}/weights/after", server.addr)]
    )
    .status
    .success());
}

#[test]
fn a_tag_watch_on_one_replica_hears_moves_made_on_another_even_after_the_database_restarts() {
    let Some(pg) = PgCluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let url = pg.database("watch");
    let blobs = dir.path().join("blobs");
    let a = Server::start_on(&blobs, &["--metadata-url", &url]);
    let b = Server::start_on(&blobs, &["--metadata-url", &url]);
    let home = dir.path().join("home");
    let push = |seed: u64| {
        let src = home.join(format!("src-{seed}"));
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("w.bin"), pseudo_random(1 << 20, seed)).unwrap();
        let out = push_json(
            &home,
            &src,
            &format!("{}/weights/watched", b.addr),
            &["--tag", "prod"],
        );
        out["digest"].as_str().unwrap().to_owned()
    };
    // Asks replica `a` to answer once the tag leaves `since`.
    let watch = |since: &str| {
        let url = format!(
            "{}/v2/weights/watched/_vial/tags/prod?since={since}&wait=60",
            a.url()
        );
        std::thread::spawn(move || {
            reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(120))
                .build()
                .unwrap()
                .get(url)
                .send()
                .unwrap()
                .text()
                .unwrap()
        })
    };
    let waiting = |n: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let text = reqwest::blocking::get(format!("{}/metrics", a.url()))
                .unwrap()
                .text()
                .unwrap();
            let now: u64 = text
                .lines()
                .find_map(|l| l.strip_prefix("vial_tag_watch_waiting ")?.parse().ok())
                .unwrap_or(0);
            if now >= n {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "no watcher arrived");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let d1 = push(1);
    let answer = watch(&d1);
    waiting(1);
    let d2 = push(2);
    assert!(
        answer.join().unwrap().contains(&d2),
        "replica a missed b's move"
    );

    // The database restarts under a waiting watcher: its listener connects again and the next
    // move made on the other replica still reaches it.
    let answer = watch(&d2);
    waiting(1);
    pg.stop();
    pg.start_again();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let d3 = loop {
        // Pushes fail until the pools have reconnected.
        let src = home.join("src-3");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::write(src.join("w.bin"), pseudo_random(1 << 20, 3)).unwrap();
        let out = vial(
            &home,
            &[
                "push",
                src.to_str().unwrap(),
                &format!("{}/weights/watched", b.addr),
                "--tag",
                "prod",
                "--json",
            ],
        );
        if out.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            break v["digest"].as_str().unwrap().to_owned();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "pushes never recovered"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        answer.join().unwrap().contains(&d3),
        "after the restart, replica a missed b's move"
    );
}
