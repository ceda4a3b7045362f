//! The version lifecycle: soft delete, restore within the retention window (per namespace),
//! removal for good after it, whole-volume deletion, and leases that keep a mounted version from
//! being deleted by accident.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::support::mount::{fuse_available, Mount};
use crate::support::oci::pseudo_random;
use crate::support::vial::{lease_holders, push_json, vial, vial_ok};
use crate::support::Server;

/// Pushes a small volume to `reference` with `tags`; returns the pinned reference.
fn push(home: &Path, name: &str, reference: &str, seed: u64, tags: &[&str]) -> String {
    let src = home.join(name);
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("weights.bin"), pseudo_random(300_000, seed)).unwrap();
    let mut extra = Vec::new();
    for t in tags {
        extra.extend(["--tag", t]);
    }
    push_json(home, &src, reference, &extra)["reference"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn digest_of(pinned: &str) -> &str {
    pinned.rsplit_once('@').unwrap().1
}

fn json(home: &Path, args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&vial_ok(home, args)).unwrap()
}

fn digests(versions: &serde_json::Value) -> Vec<&str> {
    versions
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["digest"].as_str().unwrap())
        .collect()
}

/// Polls `done` until it holds. The deadline is generous: it only catches an effect that never
/// comes, never one that comes late.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "waited a minute for {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Fails with a message containing `needle`.
fn fails_with(home: &Path, args: &[&str], needle: &str) {
    let out = vial(home, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        stderr.contains(needle),
        "{args:?}: expected {needle:?} in: {stderr}"
    );
}

#[test]
fn a_deleted_version_is_hidden_listed_and_restored_with_or_without_its_tags() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let volume = format!("{}/weights/life", server.addr);
    let v1 = push(h, "one", &volume, 1, &["v1", "prod"]);
    let v2 = push(h, "two", &volume, 2, &["v2"]);

    vial_ok(h, &["rm", &v1]);
    // Hidden at once: pulls fail, saying it was deleted and can be restored; its tags are gone,
    // versions no longer lists it.
    fails_with(
        h,
        &["pull", &v1, h.join("out").to_str().unwrap()],
        "was deleted at",
    );
    fails_with(
        h,
        &["pull", &v1, h.join("out").to_str().unwrap()],
        "`vial restore` brings it back until",
    );
    fails_with(
        h,
        &[
            "pull",
            &format!("{volume}:prod"),
            h.join("out").to_str().unwrap(),
        ],
        &format!(
            "weights/life:prod, version {}, was deleted at",
            digest_of(&v1)
        ),
    );
    assert_eq!(
        digests(&json(h, &["versions", &volume, "--json"])),
        vec![digest_of(&v2)]
    );
    let deleted = json(h, &["versions", &volume, "--deleted", "--json"]);
    assert_eq!(digests(&deleted), vec![digest_of(&v1)]);
    assert_eq!(deleted[0]["tags"], serde_json::json!(["prod", "v1"]));
    assert!(deleted[0]["restorable_until"].is_string(), "{deleted}");
    // Deleting it again finds nothing to delete.
    fails_with(h, &["rm", &v1], "not found");

    // Meanwhile prod moves on; a restore with tags takes back only what is still free.
    vial_ok(h, &["tag", "set", &v2, "prod"]);
    let restored = json(h, &["restore", &v1, "--tags", "--json"]);
    assert_eq!(restored["tags"], serde_json::json!(["v1"]));
    assert_eq!(restored["tags_moved_on"], serde_json::json!(["prod"]));
    let resolve = |tag: &str| {
        json(h, &["inspect", &format!("{volume}:{tag}"), "--json"])["reference"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert_eq!(resolve("v1"), v1);
    assert_eq!(resolve("prod"), v2);
    vial_ok(h, &["pull", &v1, h.join("back").to_str().unwrap()]);
    assert_eq!(
        std::fs::read(h.join("back/weights.bin")).unwrap(),
        pseudo_random(300_000, 1)
    );
    fails_with(h, &["restore", &v1], "no deleted manifest");

    // Without --tags, a restore brings back the version only.
    vial_ok(h, &["rm", &format!("{volume}:v1")]);
    let restored = json(h, &["restore", &v1, "--json"]);
    assert_eq!(restored["tags"], serde_json::json!([]));
    fails_with(h, &["inspect", &format!("{volume}:v1")], "not found");
    vial_ok(h, &["inspect", &v1]);

    // Pushing a deleted version's content again publishes it again.
    vial_ok(h, &["rm", &v2]);
    let again = push(h, "two", &volume, 2, &["v2"]);
    assert_eq!(again, v2);
    assert_eq!(resolve("v2"), v2);
}

#[test]
fn retention_windows_apply_per_namespace_and_expired_versions_are_removed_for_good() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let h = &dir.path().join("home");
    let log = dir.path().join("server.log");
    let server = Server::start_logging(
        &data,
        &[
            "--retention",
            "0s",
            "--namespace-retention",
            "keep=1h",
            "--janitor-interval",
            "1s",
        ],
        "info",
        &log,
    );
    let kept = push(h, "a", &format!("{}/keep/m", server.addr), 1, &["v1"]);
    let gone = push(h, "b", &format!("{}/scratch/m", server.addr), 2, &["v1"]);
    vial_ok(h, &["rm", &kept]);
    vial_ok(h, &["rm", &gone]);
    assert_eq!(
        digests(&json(
            h,
            &[
                "versions",
                &format!("{}/scratch/m", server.addr),
                "--deleted",
                "--json"
            ]
        )),
        Vec::<&str>::new(),
        "past a 0s window nothing is restorable"
    );
    fails_with(h, &["restore", &gone], "retention window");
    // The janitor runs every second. Past a 0s window a removed version and one still waiting
    // for it look the same through the API, so its own word says when it has removed it.
    wait_for("the janitor to remove the expired version", || {
        std::fs::read_to_string(&log).unwrap().lines().any(|l| {
            l.contains("deleted manifest removed for good") && l.contains(digest_of(&gone))
        })
    });
    assert!(server.stop().success());

    // With a long window everywhere, what the janitor removed stays removed; the rest restores.
    let server = Server::start_on(&data, &["--retention", "1h"]);
    let kept = kept.replace(&kept[..kept.find('/').unwrap()], &server.addr);
    let gone = gone.replace(&gone[..gone.find('/').unwrap()], &server.addr);
    vial_ok(h, &["restore", &kept]);
    fails_with(h, &["restore", &gone], "no deleted manifest");
}

#[test]
fn deleting_a_volume_deletes_every_version() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let volume = format!("{}/weights/whole", server.addr);
    let v1 = push(h, "one", &volume, 1, &["a"]);
    let v2 = push(h, "two", &volume, 2, &["b"]);
    fails_with(h, &["rm", &volume], "--all");
    let out = json(h, &["rm", &volume, "--all", "--json"]);
    let mut deleted: Vec<&str> = out["deleted"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_str().unwrap())
        .collect();
    deleted.sort();
    let mut expected = vec![digest_of(&v1), digest_of(&v2)];
    expected.sort();
    assert_eq!(deleted, expected);
    assert_eq!(
        digests(&json(h, &["versions", &volume, "--json"])),
        Vec::<&str>::new()
    );
    assert_eq!(
        json(h, &["versions", &volume, "--deleted", "--json"])
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

#[test]
fn a_version_a_node_reports_mounted_is_not_deleted_without_force() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let volume = format!("{}/weights/leased", server.addr);
    let v1 = push(h, "one", &volume, 1, &["v1"]);

    // A lease taken over the API, as any node's mount or snapshotter does.
    let (name, digest) = v1.split_once('/').unwrap().1.rsplit_once('@').unwrap();
    let http = reqwest::blocking::Client::new();
    let r = http
        .put(format!("{}/v2/{name}/_vial/leases/{digest}", server.url()))
        .body(r#"{"holder": "node-7:/mnt/weights", "ttl_seconds": 600}"#)
        .send()
        .unwrap();
    assert_eq!(r.status(), 204);
    fails_with(h, &["rm", &v1], "node-7:/mnt/weights");
    vial_ok(h, &["inspect", &v1]);
    vial_ok(h, &["rm", &v1, "--force"]);
    vial_ok(h, &["restore", &v1, "--tags"]);
    let r = http
        .delete(format!("{}/v2/{name}/_vial/leases/{digest}", server.url()))
        .body(r#"{"holder": "node-7:/mnt/weights"}"#)
        .send()
        .unwrap();
    assert_eq!(r.status(), 204);
    assert!(lease_holders(&server, &v1).is_empty());

    if !fuse_available() {
        eprintln!("SKIP mount half: no FUSE here");
        return;
    }
    // `vial mount` holds a lease for as long as it is mounted, from before it reports ready: a
    // `vial rm` right after the mount returns is refused (it used to slip through for 2 s).
    let mount = Mount::new(h, &format!("{volume}:v1"), "mnt", &[]);
    fails_with(h, &["rm", &v1], mount.path.to_str().unwrap());
    let holders = lease_holders(&server, &v1);
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert!(
        holders[0].ends_with(mount.path.to_str().unwrap()),
        "{holders:?}"
    );
    fails_with(h, &["rm", &v1], mount.path.to_str().unwrap());
    vial_ok(h, &["umount", mount.path.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while !lease_holders(&server, &v1).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the mount's lease outlived the mount"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    vial_ok(h, &["rm", &v1]);
}

const TAG_RULES: &str = r#"
[[tag-rules]]
namespace = "w"
tags = ["v*"]
immutable = true

[[tag-rules]]
namespace = "w/prod"
tags = ["prod"]
require-expect = true

[[tag-rules]]
namespace = "w/locked"
tags = ["*"]
users = ["alice"]
"#;

#[test]
fn tags_keep_their_history_obey_protection_rules_and_expire() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let config = dir.path().join("vial.toml");
    std::fs::write(&config, TAG_RULES).unwrap();
    let server = Server::start_on(
        &dir.path().join("data"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--janitor-interval",
            "1s",
        ],
    );
    let a = &server.addr;

    // Immutable release tags: created once, then never moved or removed.
    let m = format!("{a}/w/m");
    let p1 = push(h, "one", &m, 1, &["v1"]);
    let p2 = push(h, "two", &m, 2, &[]);
    fails_with(h, &["tag", "set", &p2, "v1"], "immutable");
    vial_ok(h, &["tag", "set", &p1, "v1"]);
    fails_with(h, &["tag", "rm", &format!("{m}:v1")], "immutable");
    fails_with(h, &["rm", &p1], "immutable");
    vial_ok(h, &["tag", "set", &p2, "latest"]);

    // A protected tag moves only with --expect.
    let prod = format!("{a}/w/prod/m");
    let p3 = push(h, "three", &prod, 3, &[]);
    let p4 = push(h, "four", &prod, 4, &[]);
    fails_with(h, &["tag", "set", &p3, "prod"], "--expect");
    vial_ok(h, &["tag", "set", &p3, "prod", "--expect", "none"]);
    fails_with(h, &["tag", "set", &p4, "prod"], "--expect");
    vial_ok(h, &["tag", "set", &p4, "prod", "--expect", digest_of(&p3)]);
    vial_ok(h, &["tag", "rm", &format!("{prod}:prod")]);
    let history = json(h, &["tag", "history", &prod, "prod", "--json"]);
    let moves: Vec<(&str, Option<&str>, Option<&str>)> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["reason"].as_str().unwrap(),
                e["from"].as_str(),
                e["to"].as_str(),
            )
        })
        .collect();
    assert_eq!(
        moves,
        vec![
            ("tag", None, Some(digest_of(&p3))),
            ("tag", Some(digest_of(&p3)), Some(digest_of(&p4))),
            ("delete", Some(digest_of(&p4)), None),
        ]
    );

    // Only the named users may move tags here (nobody is signed in with authentication off).
    let locked = format!("{a}/w/locked/m");
    let p5 = push(h, "five", &locked, 5, &[]);
    fails_with(h, &["tag", "set", &p5, "any"], "may only be moved by alice");

    // An expiring tag resolves until its time, then it is gone, and the history says why.
    vial_ok(h, &["tag", "set", &p2, "trial", "--expires-at", "2s"]);
    vial_ok(h, &["inspect", &format!("{m}:trial")]);
    let history = |h: &Path| -> Vec<String> {
        json(h, &["tag", "history", &m, "trial", "--json"])
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["reason"].as_str().unwrap().to_owned())
            .collect()
    };
    wait_for("the janitor to remove the expired tag", || {
        history(h).contains(&"expired".to_owned())
    });
    fails_with(h, &["inspect", &format!("{m}:trial")], "not found");
    let tags = json(h, &["tag", "ls", &m, "--json"]);
    let names: Vec<&str> = tags
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tag"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["latest", "v1"]);
    assert_eq!(history(h), vec!["tag", "expired"]);
}
