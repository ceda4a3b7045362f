//! Compaction: a pass rewrites the live chunks of packs whose dead share passed the threshold
//! into new packs and removes the old ones, as the dry run said, on every backend; while pushes
//! reuse the chunks it moves, pulls and mounts read them, and when the registry is killed in the
//! middle of it.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::gc::{assert_reads_back, bytes_only_in, gc, version_chunks, write_files, GC_NOW};
use crate::support::mount::{fuse_available, Mount};
use crate::support::vial::{assert_same_tree, push_json, vial, vial_ok};
use crate::support::{backend, du, metric, Server};

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k}: {v}"))
}

fn digest(reference: &str) -> String {
    reference.rsplit_once('@').unwrap().1.to_owned()
}

/// Pushes `src` to `volume`, returns the pinned reference.
fn push(h: &Path, src: &Path, volume: &str, extra: &[&str]) -> String {
    push_json(h, src, volume, extra)["reference"]
        .as_str()
        .unwrap()
        .to_owned()
}

/// A version of eight 1 MiB files (one pack), then one that rewrites two of them (a quarter of
/// the pack dead once the first is deleted and collected). Returns the source directory, the
/// first and second versions, and the bytes of the chunks only the first one has.
fn two_versions(
    h: &Path,
    server: &Server,
    repo: &str,
    seed: u64,
) -> (std::path::PathBuf, String, String, u64) {
    let volume = format!("{}/{repo}", server.addr);
    let src = h.join(format!("src-{}", repo.replace('/', "-")));
    let files: Vec<(String, u64)> = (0..8).map(|i| (format!("f{i}"), seed * 100 + i)).collect();
    let files: Vec<(&str, u64)> = files.iter().map(|(f, s)| (f.as_str(), *s)).collect();
    write_files(&src, &files);
    let old = push(h, &src, &volume, &[]);
    write_files(&src, &[("f6", seed * 100 + 50), ("f7", seed * 100 + 51)]);
    let new = push(h, &src, &volume, &["--tag", "kept"]);
    let only_old = bytes_only_in(server, repo, &digest(&old), &digest(&new));
    assert!(
        only_old >= 2 << 20,
        "the rewritten files' chunks: {only_old}"
    );
    (src, old, new, only_old)
}

/// The dry run says which packs a pass compacts, what it rewrites and what it frees; the pass
/// does exactly that (one PUT per new pack on S3), the metrics and the storage page agree, the
/// packs on disk are the bytes counted, and the kept version pulls byte for byte.
#[test]
fn a_pass_compacts_the_packs_the_dry_run_names_and_frees_their_dead_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let data = dir.path().join("data");
    let server = Server::start_on(&data, &GC_NOW);
    let (src, old, new, only_old) = two_versions(h, &server, "compact/one", 1);
    let old_chunks = version_chunks(&server, "compact/one", &digest(&old));
    let new_chunks = version_chunks(&server, "compact/one", &digest(&new));
    // The first version's pack keeps the chunks the second one lists too.
    let shared: u64 = old_chunks
        .iter()
        .filter(|(d, _)| new_chunks.contains_key(*d))
        .map(|(_, size)| size)
        .sum();
    assert_eq!(metric(&server, "vial_pack_dead_bytes"), 0);
    assert_eq!(metric(&server, "vial_gc_compactable_packs"), 0);

    vial_ok(h, &["rm", &old]);
    let dry = gc(h, &server, true);
    assert_eq!(n(&dry, "packs_compacted"), 1, "{dry}");
    assert_eq!(n(&dry, "rewritten_bytes"), shared, "{dry}");
    assert_eq!(n(&dry, "compacted_dead_bytes"), only_old, "{dry}");
    assert_eq!(n(&dry, "pack_dead_bytes_after"), 0, "{dry}");
    assert_eq!(
        n(&dry, "pack_bytes_after"),
        n(&dry, "pack_bytes") - only_old,
        "{dry}"
    );
    let puts = |s: &Server| metric(s, "vial_s3_requests_total{method=\"PUT\"}");
    let puts_before = backend().1.then(|| puts(&server));

    let pass = gc(h, &server, false);
    for k in [
        "blobs",
        "packs_compacted",
        "rewritten_bytes",
        "compacted_dead_bytes",
    ] {
        assert_eq!(pass[k], dry[k], "{k}: {pass} against {dry}");
    }
    // With no grace period the compacted pack goes in the same pass: its bytes are reclaimed,
    // and the live ones were written again.
    assert_eq!(n(&pass, "packs"), n(&dry, "packs") + 1, "{pass}");
    assert_eq!(
        n(&pass, "bytes"),
        n(&dry, "bytes") + only_old + shared,
        "{pass}"
    );
    if let Some(before) = puts_before {
        assert_eq!(puts(&server) - before, 1, "one PUT for the one new pack");
    }
    let after = gc(h, &server, true);
    assert_eq!(n(&after, "pack_dead_bytes"), 0, "{after}");
    assert_eq!(
        n(&after, "pack_bytes"),
        n(&dry, "pack_bytes_after"),
        "{after}"
    );
    assert_eq!(
        n(&after, "packs_compacted"),
        0,
        "nothing left to compact: {after}"
    );
    if !backend().1 {
        assert_eq!(du(&data.join("packs")), n(&after, "pack_bytes"), "{after}");
    }
    assert_eq!(metric(&server, "vial_gc_compacted_packs_total"), 1);
    assert_eq!(metric(&server, "vial_gc_rewritten_bytes_total"), shared);
    assert_eq!(metric(&server, "vial_pack_dead_bytes"), 0);
    assert_eq!(metric(&server, "vial_pack_bytes"), n(&after, "pack_bytes"));
    let page = reqwest::blocking::get(format!("{}/ui/storage", server.url()))
        .unwrap()
        .text()
        .unwrap();
    assert!(page.contains("Packs compacted<b>1</b>"), "{page}");
    let text = vial_ok(h, &["gc", &server.addr, "--dry-run"]);
    assert!(text.contains("would compact 0 packs"), "{text}");
    assert_reads_back(h, &new, &src, "back");
}

/// Pushes that find the chunks a pass is moving (and link them into another repository) and
/// pulls of the version that lists them, while the pass compacts: every push succeeds and every
/// version reads back byte for byte, then and after the old packs are gone.
#[test]
fn pushes_and_pulls_racing_compaction_read_every_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let server = Server::start_on(&dir.path().join("data"), &GC_NOW);
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rand = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (mut compacted, mut pushed) = (0, Vec::new());
    for i in 0..8u64 {
        let repo = format!("compact/race{i}");
        let (src, old, new, _) = two_versions(h, &server, &repo, 10 + i);
        vial_ok(h, &["rm", &old]);
        // The push's presence check comes 15-30 ms after it starts, the compaction a few ms
        // after the pass does: start one or the other first, up to 40 ms apart.
        let delay = Duration::from_millis(rand() % 40);
        let push_first = i % 2 == 1;
        let copy = format!("{}/compact/copy{i}", server.addr);
        let pusher = {
            let (h, src) = (h.to_path_buf(), src.clone());
            std::thread::spawn(move || {
                if !push_first {
                    std::thread::sleep(delay);
                }
                vial(&h, &["push", src.to_str().unwrap(), &copy, "--json"])
            })
        };
        let puller = {
            let (h, new) = (h.to_path_buf(), new.clone());
            let back = h.join(format!("during-{i}"));
            std::thread::spawn(move || {
                std::thread::sleep(delay / 2);
                vial(&h, &["pull", &new, back.to_str().unwrap()])
            })
        };
        if push_first {
            std::thread::sleep(delay);
        }
        compacted += n(&gc(h, &server, false), "packs_compacted");
        let out = pusher.join().unwrap();
        assert!(
            out.status.success(),
            "round {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert!(n(&report, "chunks_reused") > 0, "round {i}: {report}");
        let pulled = puller.join().unwrap();
        assert!(
            pulled.status.success(),
            "round {i}: {}",
            String::from_utf8_lossy(&pulled.stderr)
        );
        assert_same_tree(&src, &h.join(format!("during-{i}")));
        let copied = report["reference"].as_str().unwrap().to_owned();
        assert_reads_back(h, &copied, &src, &format!("copy-{i}"));
        pushed.push((new, copied, src));
    }
    assert!(compacted >= 8, "every round compacts a pack: {compacted}");
    // Once more, with every old pack gone.
    gc(h, &server, false);
    for (i, (new, copied, src)) in pushed.iter().enumerate() {
        assert_reads_back(h, new, src, &format!("final-new-{i}"));
        assert_reads_back(h, copied, src, &format!("final-copy-{i}"));
    }
}

/// A mount that read some of a version before its chunks moved reads the rest, and reads again
/// what the kernel dropped, from where they are now.
#[test]
fn a_mount_reads_chunks_compaction_moved() {
    if !fuse_available() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let server = Server::start_on(&dir.path().join("data"), &GC_NOW);
    let (src, old, _new, _) = two_versions(h, &server, "compact/mounted", 30);
    let reference = format!("{}/compact/mounted:kept", server.addr);
    let m = Mount::new(h, &reference, "mnt", &[]);
    assert_eq!(
        std::fs::read(m.path.join("f0")).unwrap(),
        std::fs::read(src.join("f0")).unwrap()
    );
    vial_ok(h, &["rm", &old]);
    let pass = gc(h, &server, false);
    assert_eq!(n(&pass, "packs_compacted"), 1, "{pass}");
    for i in 0..8 {
        let name = format!("f{i}");
        assert_eq!(
            std::fs::read(m.path.join(&name)).unwrap(),
            std::fs::read(src.join(&name)).unwrap(),
            "{name} through the mount"
        );
    }
    vial_ok(h, &["umount", m.path.to_str().unwrap()]);
}

/// The registry killed (SIGKILL) while it compacts, at a different moment each round, restarts
/// with every live version whole; the pass run again finishes the job, the packs then hold no
/// dead bytes and nothing counted twice, and what a dead pass left half-written is removed.
#[test]
fn sigkill_in_the_middle_of_compaction_loses_no_live_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let h = &dir.path().join("home");
    let data = dir.path().join("data");
    let log = dir.path().join("server.log");
    let mut args = GC_NOW.to_vec();
    // A pass the killed registry was running is its job's: the restarted one takes it over once
    // its lease (1 s here) lapses.
    args.extend([
        "--upload-ttl",
        "1s",
        "--janitor-interval",
        "1s",
        "--job-lease",
        "1s",
    ]);
    let volume = "compact/killed";
    let src = h.join("src");
    // Big enough that compacting it takes a while: 24 files of 1 MiB.
    let files: Vec<(String, u64)> = (0..24).map(|i| (format!("f{i:02}"), 1000 + i)).collect();
    let files: Vec<(&str, u64)> = files.iter().map(|(f, s)| (f.as_str(), *s)).collect();
    write_files(&src, &files);
    let mut live: Option<String> = None;
    let delays = [0u64, 5, 20, 60];
    let mut killed_while_compacting = 0;
    for (round, delay) in delays.iter().enumerate() {
        let server = Server::start_logging(&data, &args, "info", &log);
        if let Some(live) = &live {
            let live = format!("{}/{volume}@{live}", server.addr);
            assert_reads_back(h, &live, &src, &format!("restarted-{round}"));
            // The interrupted pass, taken over and run to the end (`vial gc` joins it).
            gc(h, &server, false);
        }
        // A new version that rewrites four files, the one before it deleted. Each round's four
        // come from the pack the rounds before compacted into (never all of it, which would
        // leave it to be collected whole, not compacted).
        let rewrite: Vec<(String, u64)> = (0..24usize)
            .filter(|i| i % 3 == round % 3 && (i / 3) % 2 == (round / 3) % 2)
            .map(|i| (format!("f{i:02}"), 5000 + round as u64 * 100 + i as u64))
            .collect();
        let rewrite: Vec<(&str, u64)> = rewrite.iter().map(|(f, s)| (f.as_str(), *s)).collect();
        write_files(&src, &rewrite);
        let pinned = push(
            h,
            &src,
            &format!("{}/{volume}", server.addr),
            &["--tag", "live"],
        );
        if let Some(before) = live.replace(digest(&pinned)) {
            vial_ok(h, &["rm", &format!("{}/{volume}@{before}", server.addr)]);
        }
        if round == 0 {
            // The first version has nothing to compact yet.
            server.stop();
            continue;
        }
        let started = std::fs::read_to_string(&log)
            .unwrap()
            .matches("compacting packs")
            .count();
        vial_ok(h, &["gc", &server.addr, "--detach"]);
        // Killed a moment after a pack begins to be written.
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::fs::read_to_string(&log)
            .unwrap()
            .matches("compacting packs")
            .count()
            == started
        {
            assert!(
                Instant::now() < deadline,
                "round {round}: no compaction began"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(*delay));
        let log_now = std::fs::read_to_string(&log).unwrap();
        if log_now.matches("packs compacted").count() < log_now.matches("compacting packs").count()
        {
            killed_while_compacting += 1;
        }
        server.kill_hard();
    }
    let server = Server::start_logging(&data, &args, "info", &log);
    let live = format!("{}/{volume}@{}", server.addr, live.unwrap());
    assert_reads_back(h, &live, &src, "after-kills");
    // The pass run again compacts what is left; a pack a dead pass half wrote goes with the
    // janitor (its row was never committed).
    let pass = gc(h, &server, false);
    eprintln!("killed {killed_while_compacting} times while a pack was being written; then {pass}");
    std::thread::sleep(Duration::from_secs(3));
    let after = gc(h, &server, true);
    assert_eq!(n(&after, "pack_dead_bytes"), 0, "{after}");
    // Nothing counted twice: the live bytes the packs hold are the chunks the live version lists
    // (each once), and on disk the packs are what is counted.
    let chunks: HashMap<String, u64> = version_chunks(&server, volume, &digest(&live));
    let listed: u64 = chunks.values().sum();
    assert_eq!(n(&after, "pack_bytes"), listed, "{after}");
    if !backend().1 {
        assert_eq!(du(&data.join("packs")), listed, "{after}");
    }
    assert_reads_back(h, &live, &src, "final");
    assert!(
        killed_while_compacting >= 1,
        "no kill landed while a pack was being written"
    );
}
