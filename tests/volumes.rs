//! Sealed volumes end to end: push, re-push, pull, tags, versions, diff, determinism, interruption,
//! hostile input, and pushing to a registry without vial's extensions.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use crate::support::model::{bert_like, write_safetensors};
use crate::support::oci::pseudo_random;
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::{DockerRegistry, Server};

/// A tree with everything a checkpoint directory may hold.
fn write_tree(root: &Path) {
    let deep = root.join("a/b/c/d/e/f/g");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::create_dir_all(root.join("empty/dir")).unwrap();
    std::fs::write(deep.join("deep.txt"), b"deep").unwrap();
    std::fs::write(root.join("zero.bin"), b"").unwrap();
    std::fs::write(root.join("big.bin"), pseudo_random(20 << 20, 1)).unwrap();
    std::fs::write(root.join("ünïcödé 名前.json"), br#"{"ok": true}"#).unwrap();
    std::fs::write(root.join("run.sh"), b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(root.join("run.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::symlink("big.bin", root.join("latest")).unwrap();
    std::os::unix::fs::symlink("../../../../zero.bin", deep.join("up")).unwrap();
    write_safetensors(&root.join("model.safetensors"), &bert_like(2, 5));
}

#[test]
fn push_then_pull_recreates_the_tree_exactly() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    write_tree(&src);
    let reference = format!("{}/weights/round-trip", server.addr);
    let report = push_json(home.path(), &src, &reference, &["--tag", "v1"]);
    let pinned = report["reference"].as_str().unwrap().to_owned();
    assert!(pinned.starts_with(&format!("{reference}@sha256:")));
    assert_eq!(report["files"], 6);

    for target in [pinned.clone(), format!("{reference}:v1")] {
        let out = home.path().join(format!("out-{}", target.len()));
        let last = vial_ok(home.path(), &["pull", &target, out.to_str().unwrap()]);
        assert_eq!(last.trim(), pinned, "pull prints the pinned reference");
        assert_same_tree(&src, &out);
    }
}

/// Tensors of exactly 4 MiB: each is one segment whose chunks keep one of `vial push`'s 16 read
/// buffers (they fill half of one, so they are not copied out). The registry already has the
/// file's header chunk, so the new chunks are tensors only, and 16 of them make exactly one full
/// pack. That pack is the last one cut, so it waits for more chunks, but the hashers need a 17th
/// buffer: they stall while nothing is being uploaded, whatever the timing. The push must send
/// that pack early (it logs so) and finish, and the version must come back whole.
#[test]
fn a_push_whose_pack_holds_every_read_buffer_sends_it_early_and_completes() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    let tensors: Vec<crate::support::model::TensorSpec> = (0..40)
        .map(|i| (format!("layer.{i}.weight"), 2 << 20, i as u64))
        .collect();
    let model = src.join("model.safetensors");
    crate::support::model::write_safetensors(&model, &tensors);
    // The header segment (length prefix and JSON, which ends where the first tensor starts) is
    // one small chunk; pushed first as a file of its own, it is the same chunk.
    let bytes = std::fs::read(&model).unwrap();
    let json_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let headers = home.path().join("header");
    std::fs::create_dir_all(&headers).unwrap();
    std::fs::write(headers.join("header.bin"), &bytes[..8 + json_len]).unwrap();
    drop(bytes);
    let reference = format!("{}/weights/mid-sized", server.addr);
    push_json(home.path(), &headers, &reference, &["--tag", "header"]);
    let mut child = std::process::Command::new(crate::support::vial_bin())
        .args(["push", src.to_str().unwrap(), &reference, "--tag", "v1"])
        .env("HOME", home.path())
        .env("XDG_CACHE_HOME", home.path().join("cache"))
        .env("VIAL_LOG", "vial_client=debug")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = crate::support::wait_timeout(&mut child, std::time::Duration::from_secs(120));
    if status.is_none() {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        status.is_some_and(|s| s.success()),
        "push stalled or failed: {stderr}"
    );
    assert!(
        stderr.contains("sending a pack before it is full"),
        "the test data no longer starves the hashers: {stderr}"
    );
    let pulled = home.path().join("out");
    vial_ok(
        home.path(),
        &["pull", &format!("{reference}:v1"), pulled.to_str().unwrap()],
    );
    assert_same_tree(&src, &pulled);
}

#[test]
fn the_same_content_gives_the_same_digest_whatever_the_order_and_mtimes() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let (a, b) = (home.path().join("a"), home.path().join("b"));
    write_tree(&a);
    // Same content written in another order at every level, with other mtimes and a different
    // umask-like mode.
    std::fs::create_dir_all(&b).unwrap();
    write_safetensors(&b.join("model.safetensors"), &bert_like(2, 5));
    copy_in_reverse(&a, &b);
    std::fs::set_permissions(b.join("big.bin"), std::fs::Permissions::from_mode(0o600)).unwrap();
    set_mtimes(&a, 1_000_000_000);
    set_mtimes(&b, 1_500_000_000);
    assert_ne!(
        std::fs::metadata(a.join("a/b/c/d/e/f/g/deep.txt"))
            .unwrap()
            .modified()
            .unwrap(),
        std::fs::metadata(b.join("a/b/c/d/e/f/g/deep.txt"))
            .unwrap()
            .modified()
            .unwrap()
    );
    assert_same_tree(&a, &b);
    let reference = format!("{}/weights/determinism", server.addr);
    let ra = push_json(home.path(), &a, &reference, &[]);
    let rb = push_json(home.path(), &b, &reference, &[]);
    assert_eq!(ra["digest"], rb["digest"]);
}

/// Recreates what is under `from` under `to`, each directory's entries in reverse name order,
/// without keeping mtimes; entries `to` already has are left alone.
fn copy_in_reverse(from: &Path, to: &Path) {
    let mut names: Vec<_> = std::fs::read_dir(from)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    names.reverse();
    for n in names {
        let (src, dst) = (from.join(&n), to.join(&n));
        if std::fs::symlink_metadata(&dst).is_ok() {
            continue;
        }
        let meta = std::fs::symlink_metadata(&src).unwrap();
        if meta.file_type().is_symlink() {
            std::os::unix::fs::symlink(std::fs::read_link(&src).unwrap(), &dst).unwrap();
        } else if meta.is_dir() {
            std::fs::create_dir(&dst).unwrap();
            copy_in_reverse(&src, &dst);
        } else {
            std::fs::write(&dst, std::fs::read(&src).unwrap()).unwrap();
            std::fs::set_permissions(&dst, meta.permissions()).unwrap();
        }
    }
}

/// Gives every entry under `root` (symlinks themselves too) its own mtime, counting up from `base`
/// seconds since the epoch.
fn set_mtimes(root: &Path, base: u64) {
    let mut paths = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                stack.push(p.clone());
            }
            paths.push(p);
        }
    }
    paths.sort();
    for (i, p) in paths.iter().enumerate() {
        crate::support::run(
            std::process::Command::new("touch")
                .arg("-h")
                .arg("-d")
                .arg(format!("@{}", base + i as u64 * 7))
                .arg(p),
        );
    }
}

#[test]
fn a_fine_tune_re_push_uploads_only_the_changed_tensors() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("ckpt");
    std::fs::create_dir_all(&dir).unwrap();
    let mut tensors = bert_like(6, 1);
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    std::fs::write(dir.join("config.json"), b"{\"layers\": 6}").unwrap();
    // Files modified within a second of the local index being written are re-read (they could have
    // changed within one clock tick); date these back so the index can vouch for them.
    backdate(&dir);
    let reference = format!("{}/weights/finetune", server.addr);
    let first = push_json(home.path(), &dir, &reference, &["--tag", "step-1"]);
    assert_eq!(first["bytes_uploaded"], first["bytes"]);

    // Unchanged: nothing is read again (local index) and nothing is uploaded.
    let same = push_json(home.path(), &dir, &reference, &[]);
    assert_eq!(same["digest"], first["digest"]);
    assert_eq!(same["bytes_uploaded"], 0);
    assert_eq!(
        same["bytes_read"], 0,
        "unchanged files must not be read again"
    );

    // Rewrite 3 of 25 tensors, including two small norms.
    let mut changed = 0u64;
    for i in [1usize, 2, 7] {
        tensors[i].2 += 1000;
        changed += tensors[i].1 as u64 * 2;
    }
    write_safetensors(&dir.join("model.safetensors"), &tensors);
    let next = push_json(home.path(), &dir, &reference, &["--tag", "step-2"]);
    let uploaded = next["bytes_uploaded"].as_u64().unwrap();
    assert!(
        uploaded >= changed,
        "uploaded {uploaded} < changed {changed}"
    );
    assert!(
        uploaded as f64 <= changed as f64 * 1.25 + 4096.0,
        "re-push uploaded {uploaded} bytes for {changed} changed bytes"
    );

    // --rehash reads everything but still uploads nothing new.
    let rehash = push_json(home.path(), &dir, &reference, &["--rehash"]);
    assert_eq!(rehash["digest"], next["digest"]);
    assert_eq!(rehash["bytes_uploaded"], 0);
    assert!(rehash["bytes_read"].as_u64().unwrap() > 0);

    let versions = vial_ok(home.path(), &["versions", &reference, "--json"]);
    let versions: serde_json::Value = serde_json::from_str(&versions).unwrap();
    assert_eq!(versions.as_array().unwrap().len(), 2);
    let diff = vial_ok(
        home.path(),
        &[
            "diff",
            &format!("{reference}:step-1"),
            &format!("{reference}:step-2"),
            "--json",
        ],
    );
    let diff: serde_json::Value = serde_json::from_str(&diff).unwrap();
    assert_eq!(
        diff["diff"]["changed"],
        serde_json::json!(["model.safetensors"])
    );
    assert!(diff["diff"]["bytes_to_fetch"].as_u64().unwrap() <= uploaded);
}

fn backdate(dir: &Path) {
    let status = std::process::Command::new("find")
        .arg(dir)
        .args([
            "-type",
            "f",
            "-exec",
            "touch",
            "-m",
            "-d",
            "10 seconds ago",
            "{}",
            "+",
        ])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn tag_moves_are_compare_and_swap() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let reference = format!("{}/weights/cas", server.addr);
    let mut digests = Vec::new();
    for i in 0..6u64 {
        let dir = home.path().join(format!("v{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("w.bin"), pseudo_random(1000, i)).unwrap();
        digests.push(
            push_json(home.path(), &dir, &reference, &[])["digest"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    vial_ok(
        home.path(),
        &[
            "tag",
            "set",
            &format!("{reference}@{}", digests[0]),
            "prod",
            "--expect",
            "none",
        ],
    );
    // Five writers race to move prod from digests[0]: exactly one may win.
    let handles: Vec<_> = (1..6)
        .map(|i| {
            let (home, reference, target, expect) = (
                home.path().to_owned(),
                reference.clone(),
                digests[i].clone(),
                digests[0].clone(),
            );
            std::thread::spawn(move || {
                vial(
                    &home,
                    &[
                        "tag",
                        "set",
                        &format!("{reference}@{target}"),
                        "prod",
                        "--expect",
                        &expect,
                    ],
                )
            })
        })
        .collect();
    let outputs: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    let winners = outputs.iter().filter(|o| o.status.success()).count();
    assert_eq!(winners, 1, "exactly one compare-and-swap must win");
    for o in outputs.iter().filter(|o| !o.status.success()) {
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("tag prod moved"),
            "loser's error should say the tag moved: {err}"
        );
    }
    let again = vial(
        home.path(),
        &[
            "tag",
            "set",
            &format!("{reference}@{}", digests[1]),
            "prod",
            "--expect",
            "none",
        ],
    );
    assert!(
        !again.status.success(),
        "--expect none must refuse an existing tag"
    );
}

#[test]
fn a_push_whose_tag_moved_meanwhile_seals_the_version_and_leaves_the_tag() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let reference = format!("{}/weights/cas-push", server.addr);
    let dir = home.path().join("v");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("w.bin"), pseudo_random(5000, 1)).unwrap();
    let first = push_json(home.path(), &dir, &reference, &["--tag", "prod"]);
    let first = first["digest"].as_str().unwrap().to_owned();

    // The pusher believes prod is still at some other version: the tag must not move, but the
    // version it sealed is there, by digest, and the error says so.
    std::fs::write(dir.join("w.bin"), pseudo_random(5000, 2)).unwrap();
    let stale = format!("sha256:{}", "0".repeat(64));
    let out = vial(
        home.path(),
        &[
            "push",
            dir.to_str().unwrap(),
            &reference,
            "--tag",
            "prod",
            "--expect",
            &stale,
        ],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("is sealed, but tag prod was not moved") && err.contains("tag prod moved"),
        "{err}"
    );
    let sealed = err
        .split("version ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .unwrap()
        .to_owned();
    assert_ne!(sealed, first);
    let inspect = vial_ok(
        home.path(),
        &["inspect", &format!("{reference}@{sealed}"), "--json"],
    );
    assert!(inspect.contains("w.bin"), "{inspect}");
    let tags = vial_ok(home.path(), &["tag", "ls", &reference, "--json"]);
    assert!(tags.contains(&first) && !tags.contains(&sealed), "{tags}");

    // With the right expectation, the same push moves it: one request seals and tags.
    let moved = push_json(
        home.path(),
        &dir,
        &reference,
        &["--tag", "prod", "--expect", &first],
    );
    assert_eq!(moved["digest"].as_str().unwrap(), sealed);
    let tags = vial_ok(home.path(), &["tag", "ls", &reference, "--json"]);
    assert!(tags.contains(&sealed) && !tags.contains(&first), "{tags}");
}

#[test]
fn an_interrupted_push_publishes_nothing_and_the_next_push_sends_only_the_rest() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let dir = home.path().join("big");
    std::fs::create_dir_all(&dir).unwrap();
    for i in 0..6u64 {
        std::fs::write(
            dir.join(format!("shard-{i}.bin")),
            pseudo_random(64 << 20, 40 + i),
        )
        .unwrap();
    }
    let total = 6 * (64u64 << 20);
    let reference = format!("{}/weights/interrupted", server.addr);
    let mut child = std::process::Command::new(crate::support::vial_bin())
        .args([
            "push",
            dir.to_str().unwrap(),
            &reference,
            "--tag",
            "latest",
            "--uploads",
            "2",
        ])
        .env("HOME", home.path())
        .env("XDG_CACHE_HOME", home.path().join("cache"))
        .env("DOCKER_CONFIG", home.path().join("docker"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Kill the client once the registry has committed some of the data (a pack), not all of it:
    // what was committed stays, what was in flight is sent again.
    let metrics = format!("{}/metrics", server.url());
    let client = reqwest::blocking::Client::new();
    let counter = |text: &str, name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let received = loop {
        let text = client.get(&metrics).send().unwrap().text().unwrap();
        let committed = counter(&text, "vial_packs_stored_total ");
        if committed > 0 || std::time::Instant::now() > deadline {
            break counter(&text, "vial_bytes_received_total ");
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        received > 0 && received < total,
        "the kill must land mid-upload (received {received} of {total})"
    );

    let tags = client
        .get(format!("{}/v2/weights/interrupted/tags/list", server.url()))
        .send()
        .unwrap();
    let tags: serde_json::Value = tags.json().unwrap();
    assert!(
        tags["tags"].as_array().is_none_or(|t| t.is_empty()),
        "nothing may be published: {tags}"
    );

    let report = push_json(home.path(), &dir, &reference, &["--tag", "latest"]);
    let uploaded = report["bytes_uploaded"].as_u64().unwrap();
    assert!(uploaded < total, "the second push re-sent everything");
    assert!(report["bytes_reused"].as_u64().unwrap() > 0);
    let out = home.path().join("out");
    vial_ok(
        home.path(),
        &[
            "pull",
            &format!("{reference}:latest"),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&dir, &out);
}

#[test]
fn push_and_pull_work_against_a_registry_without_vial_extensions() {
    let Some(peer) = DockerRegistry::start() else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    write_tree(&src);
    let reference = format!("{}/weights/on-distribution", peer.addr);
    let first = push_json(home.path(), &src, &reference, &["--tag", "v1"]);
    let again = push_json(home.path(), &src, &reference, &["--tag", "v1", "--rehash"]);
    assert_eq!(again["digest"], first["digest"]);
    assert_eq!(
        again["bytes_uploaded"], 0,
        "HEAD checks must find every chunk"
    );
    let out = home.path().join("out");
    vial_ok(
        home.path(),
        &["pull", &format!("{reference}:v1"), out.to_str().unwrap()],
    );
    assert_same_tree(&src, &out);
    let versions = vial(home.path(), &["versions", &reference]);
    assert!(!versions.status.success());
    assert!(String::from_utf8_lossy(&versions.stderr).contains("vial tag ls"));
}

#[test]
fn cli_errors_are_clear() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "pull".into(),
                format!("{}/no/such:v1", server.addr),
                "x".into(),
            ],
            "not found",
        ),
        (
            vec!["inspect".into(), format!("{}/no/such:v1", server.addr)],
            "not found",
        ),
        (
            vec!["pull".into(), "127.0.0.1:1/a/b:v1".into(), "x".into()],
            "unreachable",
        ),
        (
            vec!["pull".into(), "weights/model:v1".into(), "x".into()],
            "no registry host",
        ),
        (
            vec![
                "push".into(),
                "/definitely/not/here".into(),
                format!("{}/a", server.addr),
            ],
            "is not a directory",
        ),
        (
            vec![
                "tag".into(),
                "set".into(),
                format!("{}/a@sha256:{}", server.addr, "0".repeat(64)),
                "prod".into(),
            ],
            "not found",
        ),
    ];
    for (args, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = vial(home.path(), &args);
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(expected),
            "{args:?}: expected {expected:?} in: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    }
}

#[test]
fn corrupt_or_failing_downloads_are_detected_and_nothing_wrong_is_kept() {
    use crate::support::proxy::{Fault, Proxy};
    let server = Server::start();
    let proxy = Proxy::start(&server.addr);
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Larger than the largest chunk, so that half of it holds whole chunks.
    let size = 16 << 20;
    std::fs::write(src.join("w.bin"), pseudo_random(size, 9)).unwrap();
    let pinned = push_json(
        home.path(),
        &src,
        &format!("{}/weights/faulty", server.addr),
        &[],
    )["reference"]
        .as_str()
        .unwrap()
        .replace(&server.addr, &proxy.addr);
    let out = home.path().join("out");

    proxy.set(Fault::Corrupt);
    let bad = vial(home.path(), &["pull", &pinned, out.to_str().unwrap()]);
    assert!(
        !bad.status.success(),
        "a corrupt download must fail the pull"
    );
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(err.contains("digest mismatch"), "{err}");
    assert!(
        !out.join("w.bin").exists(),
        "no file may appear under its final name with wrong bytes"
    );

    proxy.set(Fault::Truncate);
    assert!(
        !vial(home.path(), &["pull", &pinned, out.to_str().unwrap()])
            .status
            .success()
    );
    assert!(!out.join("w.bin").exists());

    // An interrupted pull left the first half of the file in its part file. Two 503s are retried;
    // the same command then completes, resuming what it had.
    let original = std::fs::read(src.join("w.bin")).unwrap();
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join(".w.bin.vial-part"), &original[..size / 2]).unwrap();
    let pull_json = || -> serde_json::Value {
        serde_json::from_str(&vial_ok(
            home.path(),
            &["pull", &pinned, out.to_str().unwrap(), "--json"],
        ))
        .unwrap()
    };
    proxy.take_answered();
    proxy.set(Fault::Unavailable(2));
    let resumed = pull_json();
    assert_eq!(std::fs::read(out.join("w.bin")).unwrap(), original);
    let gets = proxy.take_answered();
    assert_eq!(
        proxy.fault(),
        Fault::Unavailable(0),
        "the pull never met the injected 503s"
    );
    assert_eq!(
        gets.iter().filter(|g| g.status == 503).count(),
        2,
        "{gets:?}"
    );
    let present = resumed["bytes_already_present"].as_u64().unwrap();
    let downloaded = resumed["bytes_downloaded"].as_u64().unwrap();
    assert!(
        present > 0 && present <= size as u64 / 2,
        "the chunks in the part file were kept: {resumed}"
    );
    assert_eq!(present + downloaded, size as u64, "{resumed}");

    // A pull with everything on disk fetches no chunk, only what opening the version takes: the
    // rest of what the resumed pull fetched were its chunks, each once, exactly the missing bytes.
    let complete = pull_json();
    assert_eq!(complete["chunks_downloaded"], 0, "{complete}");
    let opening: std::collections::HashSet<String> = proxy
        .take_answered()
        .into_iter()
        .flat_map(|g| g.digests)
        .collect();
    // Chunk downloads: bulk reads of several, or single blob GETs; never the opening's blobs.
    let chunks: Vec<_> = gets
        .iter()
        .filter(|g| g.status == 200 && !g.digests.iter().any(|d| opening.contains(d)))
        .collect();
    let fetched: Vec<&str> = chunks
        .iter()
        .flat_map(|g| g.digests.iter().map(String::as_str))
        .collect();
    assert_eq!(
        fetched.len() as u64,
        resumed["chunks_downloaded"].as_u64().unwrap(),
        "{gets:?}"
    );
    let distinct: std::collections::HashSet<&str> = fetched.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        fetched.len(),
        "a chunk was fetched twice: {gets:?}"
    );
    assert_eq!(
        chunks.iter().map(|g| g.bytes as u64).sum::<u64>(),
        downloaded,
        "{gets:?}"
    );
}

#[test]
fn a_malicious_tree_is_refused_and_nothing_is_written_outside() {
    use vial_core::volume::{build_layout, ChunkingInfo, Entry, EntryKind, Tree};
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let client = reqwest::blocking::Client::new();
    // A tree that tries to escape the destination, pushed by hand (vial push would never write it).
    let tree = Tree {
        format: vial_core::volume::FORMAT_VERSION,
        chunking: ChunkingInfo::v1(vial_core::chunking::DEFAULT_PARAMS),
        chunks: Vec::new(),
        entries: vec![Entry {
            path: "../escaped.txt".to_owned(),
            kind: EntryKind::File {
                mode: 0o644,
                size: 0,
                chunks: Vec::new(),
            },
        }],
    };
    let layout = build_layout(&tree);
    let base = server.url();
    let repo = "weights/evil";
    crate::support::push_blob(&client, &base, repo, b"{}");
    for blob in layout.blobs() {
        crate::support::push_blob(&client, &base, repo, &blob.bytes);
    }
    let manifests = layout
        .child_manifests()
        .map(|m| (m, vial_core::media::OCI_MANIFEST))
        .chain([(&layout.index, vial_core::media::OCI_INDEX)]);
    for (m, ty) in manifests {
        let r = client
            .put(format!("{base}/v2/{repo}/manifests/{}", m.digest))
            .header("content-type", ty)
            .body(m.bytes.clone())
            .send()
            .unwrap();
        assert_eq!(r.status(), 201);
    }
    let out = home.path().join("sub/out");
    let result = vial(
        home.path(),
        &[
            "pull",
            &format!("{}/{repo}@{}", server.addr, layout.index.digest),
            out.to_str().unwrap(),
        ],
    );
    assert!(!result.status.success());
    let err = String::from_utf8_lossy(&result.stderr);
    assert!(err.contains("invalid path"), "{err}");
    assert!(!home.path().join("sub/escaped.txt").exists());
}

#[test]
fn pushing_the_same_checkpoint_to_another_repository_uploads_nothing() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    write_tree(&src);
    let first = push_json(
        home.path(),
        &src,
        &format!("{}/team-a/model", server.addr),
        &[],
    );
    assert!(first["bytes_uploaded"].as_u64().unwrap() > 0);
    // The registry links what it already holds into the new repository (a bulk cross-repository
    // mount): no chunk travels again, and the copy is a complete, pullable version.
    let second = push_json(
        home.path(),
        &src,
        &format!("{}/team-b/model", server.addr),
        &["--rehash"],
    );
    assert_eq!(second["digest"], first["digest"]);
    assert_eq!(second["bytes_uploaded"], 0);
    assert_eq!(second["chunks_reused"], second["chunks"]);
    let out = home.path().join("out");
    vial_ok(
        home.path(),
        &[
            "pull",
            &format!(
                "{}/team-b/model@{}",
                server.addr,
                second["digest"].as_str().unwrap()
            ),
            out.to_str().unwrap(),
        ],
    );
    assert_same_tree(&src, &out);
}

#[test]
fn push_and_copy_summaries_say_only_what_happened_in_plain_counts() {
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let h = home.path();
    let src = h.join("one");
    std::fs::create_dir_all(&src).unwrap();
    std::fs::write(src.join("only.bin"), pseudo_random(1000, 3)).unwrap();
    let reference = format!("{}/weights/words", server.addr);
    let out = vial(
        h,
        &["push", src.to_str().unwrap(), &reference, "--tag", "v1"],
    );
    assert!(out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("sealed 1 file,"), "{said}");
    assert!(said.contains(" in 1 chunk:"), "{said}");
    assert!(
        !said.contains("unchanged"),
        "a first push has nothing unchanged: {said}"
    );
    assert!(
        !said.contains("1 chunks") && !said.contains("1 files"),
        "{said}"
    );
    // A copy within one registry: the presence check links the blobs, nothing is mounted.
    let out = vial(
        h,
        &[
            "copy",
            &format!("{reference}:v1"),
            &format!("{}/weights/words-copy", server.addr),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("manifests and 0 blobs (0 B)"), "{said}");
    assert!(said.contains("linked within the registry"), "{said}");
    assert!(!said.contains("0 mounted"), "{said}");
}

/// A listing piped into a reader that stops early (`vial inspect … | head`) ends quietly with the
/// shell's code for a broken pipe, not a panic; and the whole listing, read to the end, names
/// every file once.
#[test]
fn a_listing_whose_reader_stops_early_ends_quietly() {
    use std::io::Read;
    let server = Server::start();
    let home = tempfile::tempdir().unwrap();
    let src = home.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // Some 200 KB of listing: more than a pipe holds, so the writer meets the closed end.
    for i in 0..5000 {
        std::fs::write(src.join(format!("file-{i:05}.txt")), i.to_string()).unwrap();
    }
    let pushed = push_json(
        home.path(),
        &src,
        &format!("{}/many/files", server.addr),
        &[],
    );
    let reference = pushed["reference"].as_str().unwrap();
    for json in [false, true] {
        let mut args = vec!["inspect", reference];
        if json {
            args.push("--json");
        }
        let mut child = std::process::Command::new(crate::support::vial_bin())
            .args(&args)
            .env("HOME", home.path())
            .env("VIAL_LOG", "warn")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 100];
        stdout.read_exact(&mut first).unwrap();
        drop(stdout);
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(141), "json {json}: {stderr}");
        assert!(stderr.is_empty(), "json {json}: {stderr}");
    }
    let listing = vial_ok(home.path(), &["inspect", reference]);
    for i in 0..5000 {
        assert_eq!(
            listing.matches(&format!("file-{i:05}.txt\n")).count(),
            1,
            "file-{i:05}.txt"
        );
    }
}
