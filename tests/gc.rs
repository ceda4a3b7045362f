//! Online garbage collection: a pass reclaims exactly the blobs nothing references, on every
//! backend, and pushes racing passes never end with a version whose blobs are gone.

use std::collections::HashMap;
use std::path::Path;
use std::process::Output;

use crate::support::oci::pseudo_random;
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::{backend, du, Server};

pub(crate) const GC_NOW: [&str; 6] = [
    "--retention",
    "0s",
    "--gc-grace",
    "0s",
    "--gc-interval",
    "0s",
];

/// A manifest or index of `repo`, as JSON.
fn manifest(server: &Server, repo: &str, digest: &str) -> serde_json::Value {
    reqwest::blocking::Client::new()
        .get(format!("{}/v2/{repo}/manifests/{digest}", server.url()))
        .header(
            "accept",
            "application/vnd.oci.image.index.v1+json, application/vnd.oci.image.manifest.v1+json",
        )
        .send()
        .unwrap()
        .json()
        .unwrap()
}

/// Every blob (digest → size) a version's manifests reference: the index's children's config
/// and layers.
fn version_blobs(server: &Server, repo: &str, digest: &str) -> HashMap<String, u64> {
    let mut out = HashMap::new();
    for child in manifest(server, repo, digest)["manifests"]
        .as_array()
        .unwrap()
    {
        let m = manifest(server, repo, child["digest"].as_str().unwrap());
        for d in std::iter::once(&m["config"]).chain(m["layers"].as_array().unwrap()) {
            out.insert(
                d["digest"].as_str().unwrap().to_owned(),
                d["size"].as_u64().unwrap(),
            );
        }
    }
    out
}

pub(crate) fn write_files(dir: &Path, seeds: &[(&str, u64)]) {
    std::fs::create_dir_all(dir).unwrap();
    for (name, seed) in seeds {
        std::fs::write(dir.join(name), pseudo_random(1 << 20, *seed)).unwrap();
    }
}

pub(crate) fn gc(home: &Path, server: &Server, dry_run: bool) -> serde_json::Value {
    let mut args = vec!["gc", server.addr.as_str(), "--json"];
    if dry_run {
        args.push("--dry-run");
    }
    serde_json::from_str(&vial_ok(home, &args)).unwrap()
}

#[test]
fn a_pass_reclaims_exactly_the_blobs_nothing_references() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let data = dir.path().join("data");
    let server = Server::start_on(&data, &GC_NOW);
    let volume = format!("{}/gc/m", server.addr);
    write_files(&h.join("base"), &[("a.bin", 1)]);
    write_files(&h.join("v1"), &[("a.bin", 1), ("b.bin", 2)]);
    write_files(&h.join("v2"), &[("a.bin", 1), ("b.bin", 3)]);
    // The shared chunk goes first, so each version's one new chunk is stored as a blob of its
    // own: a chunk that shares a pack with live ones is collected without freeing bytes (its
    // pack goes when its last chunk does), which would make the byte count below depend on how
    // the push grouped chunks.
    push_json(h, &h.join("base"), &volume, &["--tag", "base"]);
    let p1 = push_json(h, &h.join("v1"), &volume, &[])["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    let p2 = push_json(h, &h.join("v2"), &volume, &["--tag", "v2"])["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    let d1 = p1.rsplit_once('@').unwrap().1;
    let d2 = p2.rsplit_once('@').unwrap().1;
    let b1 = version_blobs(&server, "gc/m", d1);
    let b2 = version_blobs(&server, "gc/m", d2);
    let only_v1: HashMap<&String, &u64> = b1.iter().filter(|(d, _)| !b2.contains_key(*d)).collect();
    assert!(
        !only_v1.is_empty() && only_v1.len() < b1.len(),
        "the versions share some blobs"
    );

    // Nothing is unreferenced yet: a pass reclaims nothing.
    assert_eq!(gc(h, &server, true)["blobs"], 0);
    assert_eq!(gc(h, &server, false)["blobs"], 0);

    vial_ok(h, &["rm", &p1]);
    let report = gc(h, &server, false);
    assert_eq!(report["manifests_purged"], 1, "{report}");
    assert_eq!(
        report["blobs"].as_u64().unwrap(),
        only_v1.len() as u64,
        "{report}"
    );
    assert_eq!(
        report["bytes"].as_u64().unwrap(),
        only_v1.values().copied().sum::<u64>(),
        "{report}"
    );
    assert_eq!(
        gc(h, &server, true)["blobs"],
        0,
        "a second pass finds nothing left"
    );

    let http = reqwest::blocking::Client::new();
    for d in only_v1.keys() {
        let r = http
            .get(format!("{}/v2/gc/m/blobs/{d}", server.url()))
            .send()
            .unwrap();
        assert_eq!(r.status(), 404, "{d} was reclaimed");
        if !backend().1 {
            let hex = d.strip_prefix("sha256:").unwrap();
            assert!(
                !data.join("blobs/sha256").join(&hex[..2]).join(hex).exists(),
                "{d}'s file is gone"
            );
        }
    }
    let out = h.join("out");
    vial_ok(h, &["pull", &format!("{volume}:v2"), out.to_str().unwrap()]);
    assert_eq!(
        std::fs::read(out.join("b.bin")).unwrap(),
        pseudo_random(1 << 20, 3)
    );
    let metrics = reqwest::blocking::get(format!("{}/metrics", server.url()))
        .unwrap()
        .text()
        .unwrap();
    let line = format!("vial_gc_reclaimed_bytes_total {}", report["bytes"]);
    assert!(
        metrics.lines().any(|l| l == line),
        "metrics count reclaimed bytes: {metrics}"
    );
}

/// How `vial push` reports the registry refusing a manifest whose blobs a collection removed after
/// the push was told they were there.
const MANIFEST_REFUSED: &str =
    "MANIFEST_BLOB_UNKNOWN manifest references blobs the repository does not hold";
/// What the registry logs when a collection removed an upload's bytes before its row committed
/// (`commit_blob`); the client sees a 500 and retries the upload.
const BYTES_VANISHED: &str = "vanished before it was recorded";

#[test]
fn pushes_racing_collections_never_leave_a_version_whose_blobs_are_gone() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let log = dir.path().join("server.log");
    let server = Server::start_logging(&dir.path().join("data"), &GC_NOW, "warn", &log);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut committed = Vec::new();
    let (mut refused, mut reclaimed) = (0, 0);
    // Iterations where the push and the collection overlapped: the push was refused, an upload's
    // bytes vanished under it, or the pass removed some of the version's blobs while the push
    // found others still there. Without one, the property below was checked of orderings only.
    let mut overlaps = Vec::new();
    let vanished_so_far = || {
        std::fs::read_to_string(&log)
            .unwrap()
            .matches(BYTES_VANISHED)
            .count()
    };
    // At least 16 rounds, and more (up to 64) until the race has been hit at least twice.
    for i in 0..64u64 {
        if i >= 16 && overlaps.len() >= 2 {
            break;
        }
        let vanished_before = vanished_so_far();
        // A version whose chunks become unreferenced once it is deleted...
        let src = h.join(format!("src-{i}"));
        write_files(&src, &[("a.bin", 100 + i), ("b.bin", 200 + i)]);
        let first = push_json(h, &src, &format!("{}/race/a", server.addr), &[])["reference"]
            .as_str()
            .unwrap()
            .to_owned();
        vial_ok(h, &["rm", &first]);
        // ...pushed again elsewhere (the registry says it already holds the chunks) while a
        // collection removes them.
        // A push reaches its presence check some 15-30 ms after it starts. Even iterations start
        // the collection first and the push up to 30 ms later, odd ones the other way round, so
        // the collection both wins and loses at every stage of a push.
        let delay = std::time::Duration::from_millis(rand() % 30);
        let push_first = i % 2 == 1;
        let pusher = {
            let (h, src, target) = (h.clone(), src.clone(), format!("{}/race/b{i}", server.addr));
            std::thread::spawn(move || -> Output {
                if !push_first {
                    std::thread::sleep(delay);
                }
                vial(&h, &["push", src.to_str().unwrap(), &target, "--json"])
            })
        };
        if push_first {
            std::thread::sleep(delay);
        }
        let pass = gc(h, &server, false)["blobs"].as_u64().unwrap();
        reclaimed += pass;
        let out = pusher.join().unwrap();
        if out.status.success() {
            // A version that was committed must read back whole.
            let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let reused = report["chunks_reused"].as_u64().unwrap();
            if (pass > 0 && reused > 0) || vanished_so_far() > vanished_before {
                overlaps.push(format!(
                    "{i}: pass removed {pass} blobs, push reused {reused} chunks"
                ));
            }
            let pinned = report["reference"].as_str().unwrap().to_owned();
            assert_reads_back(h, &pinned, &src, &format!("back-{i}"));
            committed.push((pinned, src));
        } else {
            // The only acceptable failure: the registry refused a manifest whose blobs it no
            // longer holds. (An upload whose bytes a pass removed under it is answered with a 500
            // the client retries; the log check below holds every 500 to being that.)
            refused += 1;
            overlaps.push(format!("{i}: push refused"));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                stderr.contains(MANIFEST_REFUSED),
                "iteration {i}: unexpected failure: {stderr}"
            );
            // A refused push published nothing: the version (the same content as `first`, so
            // the same digest) is not in its repository.
            let digest = first.rsplit_once('@').unwrap().1;
            let r = reqwest::blocking::Client::new()
                .head(format!("{}/v2/race/b{i}/manifests/{digest}", server.url()))
                .send()
                .unwrap();
            assert_eq!(
                r.status(),
                404,
                "iteration {i}: a refused push left its version behind"
            );
        }
    }
    // Once every collection has run, and one more, every committed version still reads back.
    reclaimed += gc(h, &server, false)["blobs"].as_u64().unwrap();
    for (n, (pinned, src)) in committed.iter().enumerate() {
        assert_reads_back(h, pinned, src, &format!("final-{n}"));
    }
    // The registry failed no request but for bytes a collection removed under an upload.
    let log = std::fs::read_to_string(&log).unwrap();
    let failures: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("storage failure") || l.contains("ERROR"))
        .collect();
    let vanished = failures
        .iter()
        .filter(|l| l.contains(BYTES_VANISHED))
        .count();
    assert_eq!(
        vanished,
        failures.len(),
        "internal errors other than a removed upload: {failures:#?}"
    );
    eprintln!(
        "{} pushes committed, {refused} refused by a racing collection, {vanished} uploads retried after one, {reclaimed} blobs reclaimed; overlaps: {overlaps:#?}",
        committed.len()
    );
    assert!(
        overlaps.len() >= 2,
        "in {} rounds the push and the collection overlapped {} times: the race was not run",
        committed.len() + refused,
        overlaps.len()
    );
    assert!(
        !committed.is_empty(),
        "no push committed: the property holds of nothing"
    );
    assert!(
        reclaimed > 0,
        "the collections must actually have removed blobs for the race to mean anything"
    );
}

/// Pulls `pinned` into a fresh directory and compares every file with `src`.
pub(crate) fn assert_reads_back(h: &Path, pinned: &str, src: &Path, name: &str) {
    let back = h.join(name);
    let pull = vial(h, &["pull", pinned, back.to_str().unwrap()]);
    assert!(
        pull.status.success(),
        "{pinned} was committed but does not pull: {}",
        String::from_utf8_lossy(&pull.stderr)
    );
    assert_same_tree(src, &back);
}

/// The dry run right after versions are deleted reports what the pass then reclaims, packs
/// included; and a pass looks only at what changed since the last one, never at every blob.
#[test]
fn a_dry_run_predicts_the_pass_and_a_pass_looks_only_at_what_changed() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let server = Server::start_on(&dir.path().join("data"), &GC_NOW);
    let volume = format!("{}/gc/packs", server.addr);
    let write = |name: &str, seed: u64, len: usize| {
        let d = h.join(name);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("w.bin"), pseudo_random(len, seed)).unwrap();
        d
    };
    // 8 MiB of new chunks: one pack each.
    let old = push_json(h, &write("old", 11, 8 << 20), &volume, &[]);
    let old_chunks = old["chunks_uploaded"].as_u64().unwrap();
    let old = old["reference"].as_str().unwrap().to_owned();
    let kept = push_json(h, &write("kept", 12, 8 << 20), &volume, &["--tag", "kept"]);
    let kept_chunks = kept["chunks_uploaded"].as_u64().unwrap();
    assert!(
        old_chunks > 1 && kept_chunks > 1,
        "{old_chunks} and {kept_chunks} chunks"
    );

    let first = gc(h, &server, false);
    assert_eq!(first["blobs"], 0, "{first}");
    assert!(
        first["examined"].as_u64().unwrap() >= old_chunks + kept_chunks,
        "the first pass looks at the new chunks: {first}"
    );
    let idle = gc(h, &server, false);
    assert_eq!(idle["examined"], 0, "nothing changed since: {idle}");

    vial_ok(h, &["rm", &old]);
    let dry = gc(h, &server, true);
    let real = gc(h, &server, false);
    assert_eq!(dry["manifests_purged"], 1, "{dry}");
    assert_eq!(real["manifests_purged"], 1, "{real}");
    assert!(dry["blobs"].as_u64().unwrap() >= old_chunks, "{dry}");
    assert!(dry["packs"].as_u64().unwrap() >= 1, "{dry}");
    assert!(dry["bytes"].as_u64().unwrap() >= 8 << 20, "{dry}");
    for key in ["blobs", "packs", "bytes"] {
        assert_eq!(dry[key], real[key], "{key}: dry run {dry}, pass {real}");
    }
    let after = gc(h, &server, true);
    assert_eq!(
        (after["blobs"].as_u64(), after["packs"].as_u64()),
        (Some(0), Some(0)),
        "{after}"
    );
    assert_eq!(gc(h, &server, false)["examined"], 0);

    // One new 1 MiB file: the next pass looks at its chunk (and its pack, if any) and little else.
    let more = write("more", 13, 8 << 20);
    std::fs::write(more.join("x.bin"), pseudo_random(1 << 20, 14)).unwrap();
    let pushed = push_json(h, &more, &volume, &["--tag", "kept"]);
    let new = pushed["chunks_uploaded"].as_u64().unwrap();
    let pass = gc(h, &server, false);
    let examined = pass["examined"].as_u64().unwrap();
    assert!(
        examined >= new && examined <= new + 4,
        "{new} new chunks, {examined} candidates looked at: {pass}"
    );
    let back = h.join("back");
    vial_ok(
        h,
        &["pull", &format!("{volume}:kept"), back.to_str().unwrap()],
    );
    assert_same_tree(&more, &back);
}

/// On PostgreSQL, collection needs the index on `repository_blobs (blob_id)`: if it is missing
/// (dropped by hand, or a failed concurrent rebuild), a pass is refused with a message that says
/// how to build it without holding writes (docs/gc.md), instead of running for hours.
#[test]
fn collection_on_postgresql_waits_for_its_index_and_says_how_to_build_it() {
    let Some(pg) = crate::support::postgres::PgCluster::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let url = pg.database("gcindex");
    let mut args = vec!["--metadata-url", url.as_str()];
    args.extend_from_slice(&GC_NOW);
    let server = Server::start_on(&dir.path().join("blobs"), &args);
    write_files(&h.join("v"), &[("a.bin", 5)]);
    push_json(
        h,
        &h.join("v"),
        &format!("{}/gc/idx", server.addr),
        &["--tag", "v"],
    );
    crate::support::postgres::psql(&url, "DROP INDEX repository_blobs_by_blob");

    let out = vial(h, &["gc", server.addr.as_str()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a pass ran without its index");
    assert!(
        stderr.contains("UNAVAILABLE")
            && stderr.contains("CREATE INDEX CONCURRENTLY repository_blobs_by_blob"),
        "{stderr}"
    );
    crate::support::postgres::psql(
        &url,
        "CREATE INDEX CONCURRENTLY repository_blobs_by_blob ON repository_blobs (blob_id)",
    );
    let report = gc(h, &server, false);
    assert_eq!(report["blobs"], 0, "{report}");
}

/// A pass asked for over HTTP is a job: `vial gc --detach` queues it and returns, the pass runs to
/// the end with nobody waiting, and `vial gc --job` (or the API) follows it to its report.
#[test]
fn a_pass_runs_as_a_job_that_needs_no_one_waiting() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let server = Server::start_on(&dir.path().join("data"), &GC_NOW);
    let volume = format!("{}/gc/job", server.addr);
    write_files(&h.join("base"), &[("a.bin", 21)]);
    write_files(&h.join("v1"), &[("a.bin", 21), ("b.bin", 22)]);
    write_files(&h.join("v2"), &[("a.bin", 21), ("b.bin", 23)]);
    // The shared chunk first, so v1's own chunk does not share a pack with live ones (see
    // above) and its bytes go with it.
    push_json(h, &h.join("base"), &volume, &["--tag", "base"]);
    let p1 = push_json(h, &h.join("v1"), &volume, &[])["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    push_json(h, &h.join("v2"), &volume, &["--tag", "v2"]);
    // Everything pushed so far was a candidate once; a pass settles it.
    gc(h, &server, false);
    vial_ok(h, &["rm", &p1]);

    let queued: serde_json::Value =
        serde_json::from_str(&vial_ok(h, &["gc", &server.addr, "--detach", "--json"])).unwrap();
    let id = queued["id"].as_str().expect("a job id").to_owned();
    assert!(
        ["queued", "running", "done"].contains(&queued["state"].as_str().unwrap()),
        "{queued}"
    );

    // Nobody follows it: it still runs to the end.
    let http = reqwest::blocking::Client::new();
    let job = loop {
        let job: serde_json::Value = http
            .get(format!("{}/v2/_vial/gc/{id}?wait=10", server.url()))
            .send()
            .unwrap()
            .json()
            .unwrap();
        if job["state"] == "done" || job["state"] == "failed" {
            break job;
        }
    };
    assert_eq!(job["state"], "done", "{job}");
    let report = &job["report"];
    assert_eq!(report["manifests_purged"], 1, "{job}");
    assert!(report["blobs"].as_u64().unwrap() >= 1, "{job}");
    assert!(report["bytes"].as_u64().unwrap() >= 1 << 20, "{job}");

    // `vial gc --job` prints the finished pass's report.
    let followed: serde_json::Value =
        serde_json::from_str(&vial_ok(h, &["gc", &server.addr, "--job", &id, "--json"])).unwrap();
    assert_eq!(&followed, report);
    let text = vial_ok(h, &["gc", &server.addr, "--job", &id]);
    assert!(text.starts_with("reclaimed "), "{text}");

    // A job id the registry never gave out is a clear error, not a report of nothing.
    let unknown = vial(h, &["gc", &server.addr, "--job", "no-such-pass"]);
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(!unknown.status.success(), "{stderr}");
    assert!(
        stderr.contains("garbage collection job no-such-pass") && stderr.contains("not found"),
        "{stderr}"
    );

    // The jobs page shows the pass over every repository.
    let page = http
        .get(format!("{}/ui/jobs", server.url()))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        page.contains("every repository") && page.contains(&format!("{} blobs", report["blobs"])),
        "{page}"
    );
}

/// The bytes of the chunks version `old` has and `new` has not.
pub(crate) fn bytes_only_in(server: &Server, repo: &str, old: &str, new: &str) -> u64 {
    let new_chunks = version_chunks(server, repo, new);
    version_chunks(server, repo, old)
        .iter()
        .filter(|(d, _)| !new_chunks.contains_key(*d))
        .map(|(_, size)| size)
        .sum()
}

/// The chunks (digest → size) of a version: the layers of its part manifests.
pub(crate) fn version_chunks(server: &Server, repo: &str, digest: &str) -> HashMap<String, u64> {
    manifest(server, repo, digest)["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["artifactType"] == "application/vnd.vial.chunks.v1")
        .flat_map(|m| {
            let part = manifest(server, repo, m["digest"].as_str().unwrap());
            part["layers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|l| {
                    (
                        l["digest"].as_str().unwrap().to_owned(),
                        l["size"].as_u64().unwrap(),
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// A pack keeps its bytes while any chunk in it lives: after a version that shared a pack with
/// the next one is collected, the dry run says how many dead bytes the packs hold (exactly the
/// chunks only that version had), before the pass and after it, and the pass leaves what it said.
#[test]
fn the_dry_run_counts_the_dead_bytes_packs_keep_and_the_pass_leaves_them_as_said() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let data = dir.path().join("data");
    // Compaction off: the dead bytes stay where they are (tests/compaction.rs turns it on).
    let mut args = GC_NOW.to_vec();
    args.extend(["--gc-compact-bytes", "0"]);
    let server = Server::start_on(&data, &args);
    let volume = format!("{}/gc/dead", server.addr);
    // Four files in one pack; the next version rewrites one of them.
    let src = h.join("src");
    write_files(&src, &[("a", 1), ("b", 2), ("c", 3), ("d", 4)]);
    let old = push_json(h, &src, &volume, &[])["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    write_files(&src, &[("d", 5)]);
    let new = push_json(h, &src, &volume, &["--tag", "kept"])["reference"]
        .as_str()
        .unwrap()
        .to_owned();
    let digest = |r: &str| r.rsplit_once('@').unwrap().1.to_owned();
    let only_old = bytes_only_in(&server, "gc/dead", &digest(&old), &digest(&new));
    assert!(
        only_old >= 1 << 20,
        "the rewritten file's chunks: {only_old}"
    );

    vial_ok(h, &["rm", &old]);
    let dry = gc(h, &server, true);
    let n = |v: &serde_json::Value, k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"));
    assert_eq!(
        n(&dry, "pack_dead_bytes"),
        0,
        "every chunk is listed yet: {dry}"
    );
    assert_eq!(
        n(&dry, "pack_dead_bytes_after"),
        only_old,
        "the old version's own chunks stay in the pack it shares: {dry}"
    );
    assert_eq!(n(&dry, "packs"), 0, "no pack empties: {dry}");
    let pass = gc(h, &server, false);
    assert_eq!(pass["blobs"], dry["blobs"], "{pass}");
    let after = gc(h, &server, true);
    assert_eq!(
        n(&after, "pack_bytes"),
        n(&dry, "pack_bytes_after"),
        "{after}"
    );
    assert_eq!(
        n(&after, "pack_dead_bytes"),
        n(&dry, "pack_dead_bytes_after"),
        "{after}"
    );
    // On disk, the packs are the bytes counted.
    if !backend().1 {
        let on_disk: u64 = du(&data.join("packs"));
        assert_eq!(on_disk, n(&after, "pack_bytes"), "{after}");
    }
    let text = vial_ok(h, &["gc", &server.addr, "--dry-run"]);
    assert!(text.contains("chunks nothing references"), "{text}");
    // The web UI's storage page shows the same dead bytes.
    let page = reqwest::blocking::get(format!("{}/ui/storage", server.url()))
        .unwrap()
        .text()
        .unwrap();
    let dead = vial_core::human_bytes(n(&after, "pack_dead_bytes"));
    assert!(
        page.contains(&format!("Dead bytes in packs<b>{dead}</b>")),
        "{dead} missing: {page}"
    );
    let back = h.join("back");
    vial_ok(
        h,
        &["pull", &format!("{volume}:kept"), back.to_str().unwrap()],
    );
    assert_same_tree(&src, &back);
}
